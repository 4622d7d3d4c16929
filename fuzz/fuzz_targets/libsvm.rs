#![no_main]
//! LIBSVM/SVMlight text (plain or gzipped) converted to a dataset.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::libsvm;

fuzz_target!(|data: &[u8]| {
    let input = peregrine_fuzz::file("in.libsvm", data);
    let out = peregrine_fuzz::output();
    peregrine_fuzz::check_output(libsvm::convert(&input, &out, None), &out);
});
