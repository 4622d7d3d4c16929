#![no_main]
//! A training configuration file (`peregrine train --config`), read and resolved.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = peregrine_fuzz::file("train.toml", data);
    let _ = peregrine::fuzzing::train_config(&p);
});
