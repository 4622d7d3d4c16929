#![no_main]
//! Bag-of-words text (UCI docword when the first byte is even, LDA-C when odd) converted to a
//! dataset of word counts, and LDA built on what converted.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::bow;

fuzz_target!(|data: &[u8]| {
    let Some((&first, text)) = data.split_first() else { return };
    let format = if first % 2 == 0 { bow::Format::Docword } else { bow::Format::Ldac };
    let input = peregrine_fuzz::file("in.txt", text);
    let out = peregrine_fuzz::output();
    let r = bow::convert(&input, &out, format, None);
    let converted = r.is_ok();
    peregrine_fuzz::check_output(r, &out);
    if converted {
        // A corpus that converts builds a model or is refused with a message, never a panic.
        let _ = peregrine_core::model::lda::Lda::new(&out, None, 3, 0.1, 0.01);
    }
});
