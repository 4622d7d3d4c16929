#![no_main]
//! A run directory's checkpoint (safetensors with the state, the configuration and a checksum).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = peregrine_fuzz::scratch().join("run");
    std::fs::create_dir_all(&dir).expect("run dir");
    std::fs::write(dir.join("checkpoint.safetensors"), data).expect("write");
    let _ = peregrine::fuzzing::checkpoint(&dir);
});
