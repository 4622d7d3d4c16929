#![no_main]
//! A model file (`peregrine predict --model`).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let p = peregrine_fuzz::file("model.safetensors", data);
    let _ = peregrine::fuzzing::model_file(&p);
});
