#![no_main]
//! CSV (header and label column detected, quoted fields) converted to a dataset, dense and as
//! sparse rows.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::{csv, sparsify};

fuzz_target!(|data: &[u8]| {
    let input = peregrine_fuzz::file("in.csv", data);
    let out = peregrine_fuzz::output();
    let r = csv::convert(&input, &out, &csv::CsvOptions::default());
    let converted = r.is_ok();
    peregrine_fuzz::check_output(r, &out);
    if converted {
        let sparse = peregrine_fuzz::scratch().join("sparse.pgd");
        let _ = std::fs::remove_file(&sparse);
        let r = sparsify::sparsify(&out, &sparse);
        peregrine_fuzz::check_output(r, &sparse);
    }
});
