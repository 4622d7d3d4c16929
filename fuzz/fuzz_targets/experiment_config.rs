#![no_main]
//! An experiment configuration file (`peregrine experiment`), read and checked.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = peregrine_fuzz::file("experiment.toml", data);
    let _ = peregrine::fuzzing::experiment_config(&p);
});
