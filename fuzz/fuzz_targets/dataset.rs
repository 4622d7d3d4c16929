#![no_main]
//! A dataset file: open (header), then every check the training and `data info --verify` make.

use libfuzzer_sys::fuzz_target;
use peregrine_kernels::data::{combine_crcs, shard, Dataset};

fuzz_target!(|data: &[u8]| {
    let p = peregrine_fuzz::file("in.pgd", data);
    let Ok(ds) = Dataset::open(&p) else { return };
    let _ = ds.summary(false);
    let _ = ds.verify();
    let rows = ds.rows();
    for world in [1, 3] {
        let parts: Vec<(u32, u64)> = (0..world).map(|r| ds.crc_part(r, world)).collect();
        let _ = ds.check_crc(combine_crcs(&parts));
        for r in 0..world {
            let _ = ds.check_rows(shard(rows, r, world));
        }
    }
    // What training then reads: rows that passed the checks must be safe to use.
    if ds.verify().is_ok() {
        if let Ok(s) = ds.sparse() {
            let all = s.rows(0..s.len());
            assert!(all.indices.iter().all(|&i| (i as usize) < all.cols));
        }
        if let Ok(d) = ds.dense() {
            let _ = d.rows(0..d.len());
        }
        if let Ok(t) = ds.ratings() {
            let _ = t.rows(0..t.len());
        }
        let _ = ds.truth();
        let _ = ds.scaling();
        let _ = ds.summary(true);
    }
});
