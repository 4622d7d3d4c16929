#![no_main]
//! MNIST IDX images and labels (plain or gzipped) converted to a dataset.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::idx;

fuzz_target!(|data: &[u8]| {
    let (images, labels) = peregrine_fuzz::two(data);
    let images = peregrine_fuzz::file("images.idx", images);
    let labels = peregrine_fuzz::file("labels.idx", labels);
    let out = peregrine_fuzz::output();
    peregrine_fuzz::check_output(idx::convert(&images, &labels, &out), &out);
});
