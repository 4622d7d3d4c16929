#![no_main]
//! Ratings text (MovieLens and other separators, optional header) converted to a dataset.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::ratings;

fuzz_target!(|data: &[u8]| {
    let input = peregrine_fuzz::file("in.ratings", data);
    let out = peregrine_fuzz::output();
    peregrine_fuzz::check_output(ratings::convert(&input, &out), &out);
});
