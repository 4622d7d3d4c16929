#![no_main]
//! NumPy .npy features and labels converted to a dataset.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::npy;

fuzz_target!(|data: &[u8]| {
    let (features, labels) = peregrine_fuzz::two(data);
    let features = peregrine_fuzz::file("x.npy", features);
    let labels = peregrine_fuzz::file("y.npy", labels);
    let out = peregrine_fuzz::output();
    peregrine_fuzz::check_output(npy::convert(&features, &labels, &out), &out);
});
