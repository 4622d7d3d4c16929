use std::path::{Path, PathBuf};

use super::*;
use crate::data::gen::{self, DenseSpec, RatingsSpec};
use crate::data::{libsvm, split};

fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-std-{name}-")).tempdir().expect("scratch dir")
}

fn libsvm_file(d: &Path, name: &str, text: &str, features: Option<u64>) -> PathBuf {
    let t = d.join(format!("{name}.txt"));
    std::fs::write(&t, text).expect("write");
    let p = d.join(format!("{name}.pgd"));
    libsvm::convert(&t, &p, features).expect("convert");
    p
}

/// Each column's mean and population standard deviation (implicit zeros counted).
fn moments(d: &Dataset) -> Vec<(f64, f64)> {
    let cols = d.header().cols as usize;
    let n = d.rows() as f64;
    let mut full = vec![vec![0f64; cols]; d.rows()];
    match d.kind() {
        Kind::Dense => {
            let x = d.dense().expect("dense");
            for (r, row) in x.features.chunks_exact(cols).enumerate() {
                full[r] = row.iter().map(|&v| f64::from(v)).collect();
            }
        }
        _ => {
            let x = d.sparse().expect("sparse");
            for (r, f) in full.iter_mut().enumerate() {
                for k in x.row_ptr[r] as usize..x.row_ptr[r + 1] as usize {
                    f[x.indices[k] as usize] = f64::from(x.values[k]);
                }
            }
        }
    }
    (0..cols)
        .map(|j| {
            let m = full.iter().map(|r| r[j]).sum::<f64>() / n;
            (m, (full.iter().map(|r| (r[j] - m).powi(2)).sum::<f64>() / n).sqrt())
        })
        .collect()
}

#[test]
fn dense_columns_get_mean_zero_and_unit_deviation_and_other_files_the_training_statistics() {
    let t = dir("dense");
    let d = t.path();
    let (raw, other) = (d.join("raw.pgd"), d.join("other.pgd"));
    gen::dense(&DenseSpec { rows: 500, cols: 7, classes: 3, noise: 0.1, seed: 4 }, &raw).expect("gen");
    gen::dense(&DenseSpec { rows: 50, cols: 7, classes: 3, noise: 0.1, seed: 5 }, &other).expect("gen");
    let s = Scaling::fit(&Dataset::open(&raw).expect("open")).expect("fit");
    let before = moments(&Dataset::open(&raw).expect("open"));
    for (j, &(m, sd)) in before.iter().enumerate() {
        assert!(
            (f64::from(s.shift[j]) - m).abs() < 1e-5 && (f64::from(s.mult[j]) * sd - 1.0).abs() < 1e-5,
            "{j}"
        );
    }
    let out = d.join("std.pgd");
    apply(&raw, &s, &out).expect("apply");
    let o = Dataset::open(&out).expect("open");
    o.verify().expect("valid");
    for (m, sd) in moments(&o) {
        assert!(m.abs() < 1e-5 && (sd - 1.0).abs() < 1e-4, "mean {m} sd {sd}");
    }
    assert_eq!(Scaling::recorded(&o).expect("recorded"), s);
    // Another file gets the training file's statistics, not its own.
    let out2 = d.join("other.std.pgd");
    apply(&other, &Scaling::recorded(&o).expect("recorded"), &out2).expect("apply");
    let (a, b) = (Dataset::open(&other).expect("open"), Dataset::open(&out2).expect("open"));
    let (a, b) = (a.dense().expect("dense"), b.dense().expect("dense"));
    for (i, (&x, &y)) in a.features.iter().zip(b.features).enumerate() {
        assert_eq!(y, (x - s.shift[i % 7]) * s.mult[i % 7]);
    }
    assert_eq!(a.labels, b.labels);
    let opened = Dataset::open(&out2).expect("open");
    assert!(opened.summary(true).contains("standardized: 7 features centred, 7 scaled"));
    assert!(opened.summary(false).contains("standardized (the scaling is recorded)"), "O(1): no counts");
}

#[test]
fn sparse_files_keep_their_zeros_and_centre_only_features_every_row_stores() {
    let t = dir("sparse");
    let d = t.path();
    // Feature 1 in every row (dense), 2 and 3 in some (one-hot like), 4 never.
    let train = libsvm_file(d, "train", "+1 1:10 2:1\n-1 1:20 3:1\n+1 1:30 2:1 3:1\n-1 1:40\n", Some(4));
    let s = Scaling::fit(&Dataset::open(&train).expect("open")).expect("fit");
    assert_eq!(s.shift, vec![25.0, 0.0, 0.0, 0.0]);
    let sd1 = (125.0f64).sqrt();
    let sd2 = 0.5; // values 1,0,1,0: mean 1/2, deviation 1/2
    assert!((f64::from(s.mult[0]) - 1.0 / sd1).abs() < 1e-6);
    assert!((f64::from(s.mult[1]) - 1.0 / sd2).abs() < 1e-6);
    assert_eq!(s.mult[3], 1.0, "a feature never present keeps multiplier 1");
    // A test file converted apart: fewer features, a row without the dense feature.
    let test = libsvm_file(d, "test", "+1 2:1\n-1 1:25 2:1\n", None);
    let out = d.join("test.std.pgd");
    let c = apply(&test, &s, &out).expect("apply");
    assert_eq!((c.rows, c.cols, c.nnz), (2, 4, 4));
    let o = Dataset::open(&out).expect("open");
    o.verify().expect("valid");
    let x = o.sparse().expect("sparse");
    assert_eq!(x.row_ptr, &[0, 2, 4]);
    assert_eq!(x.indices, &[0, 1, 0, 1]);
    assert_eq!(
        x.values[0],
        (0.0 - 25.0) * s.mult[0],
        "the missing dense feature is inserted as a zero, centred"
    );
    assert_eq!(x.values[1], s.mult[1], "a one-hot feature is scaled, not centred");
    assert_eq!(x.values[2], 0.0, "25 is the mean");
    assert_eq!(x.labels, &[1.0, 0.0]);
    // The training file standardized has mean 0 in the dense feature and unit deviations.
    let out = d.join("train.std.pgd");
    apply(&train, &s, &out).expect("apply");
    let m = moments(&Dataset::open(&out).expect("open"));
    assert!(m[0].0.abs() < 1e-6 && (m[0].1 - 1.0).abs() < 1e-6);
    assert!((m[1].1 - 1.0).abs() < 1e-6 && m[1].0 > 0.5, "not centred: {:?}", m[1]);
}

#[test]
fn mismatched_standardized_and_ratings_files_are_errors_and_leave_nothing() {
    let t = dir("bad");
    let d = t.path();
    let train = libsvm_file(d, "train", "+1 1:1 2:3\n-1 1:2\n", None);
    let wide = libsvm_file(d, "wide", "+1 5:1\n", None);
    let s = Scaling::fit(&Dataset::open(&train).expect("open")).expect("fit");
    let out = d.join("out.pgd");
    let e = apply(&wide, &s, &out).expect_err("too many features");
    assert!(
        e.to_string().contains("has 5 features, the scaling 2") && e.to_string().contains("--features"),
        "{e}"
    );
    assert!(!out.exists());
    let e = Scaling::recorded(&Dataset::open(&train).expect("open")).expect_err("no record");
    assert!(e.to_string().contains("no scaling record"), "{e}");
    let std = d.join("std.pgd");
    apply(&train, &s, &std).expect("apply");
    let e = Scaling::fit(&Dataset::open(&std).expect("open")).expect_err("twice");
    assert!(e.to_string().contains("standardized already"), "{e}");
    assert!(apply(&std, &s, &out).expect_err("twice").to_string().contains("standardized already"));
    let r = d.join("r.pgd");
    gen::ratings(&RatingsSpec { rows: 10, users: 3, items: 3, rank: 2, noise: 0.1, seed: 1 }, &r)
        .expect("gen");
    assert!(Scaling::fit(&Dataset::open(&r).expect("open"))
        .expect_err("ratings")
        .to_string()
        .contains("ratings"));
    let mut names: Vec<_> =
        std::fs::read_dir(d).expect("list").map(|e| e.expect("entry").file_name()).collect();
    names.sort();
    assert_eq!(names, ["r.pgd", "std.pgd", "train.pgd", "train.txt", "wide.pgd", "wide.txt"]);
}

#[test]
fn a_split_keeps_the_scaling_record() {
    let t = dir("split");
    let d = t.path();
    let raw = d.join("raw.pgd");
    gen::dense(&DenseSpec { rows: 100, cols: 3, classes: 2, noise: 0.1, seed: 4 }, &raw).expect("gen");
    let s = Scaling::fit(&Dataset::open(&raw).expect("open")).expect("fit");
    let std = d.join("std.pgd");
    apply(&raw, &s, &std).expect("apply");
    let (a, b) = (d.join("a.pgd"), d.join("b.pgd"));
    split::split(&std, &a, &b, 0.2, 1).expect("split");
    for p in [a, b] {
        let o = Dataset::open(&p).expect("open");
        o.verify().expect("valid");
        assert_eq!(Scaling::recorded(&o).expect("recorded"), s);
    }
}

/// The section bytes of `d` (everything after the header but the scaling record).
fn sections(d: &Dataset) -> Vec<Vec<u8>> {
    match d.kind() {
        Kind::Dense => {
            let x = d.dense().expect("dense");
            vec![bytemuck::cast_slice(x.features).to_vec(), bytemuck::cast_slice(x.labels).to_vec()]
        }
        _ => {
            let x = d.sparse().expect("sparse");
            vec![
                bytemuck::cast_slice(x.row_ptr).to_vec(),
                bytemuck::cast_slice(x.indices).to_vec(),
                bytemuck::cast_slice(x.values).to_vec(),
                bytemuck::cast_slice(x.labels).to_vec(),
            ]
        }
    }
}

#[test]
fn in_memory_standardization_holds_what_the_written_file_holds() {
    let t = dir("memory");
    let d = t.path();
    let raw = d.join("raw.pgd");
    gen::dense(&DenseSpec { rows: 300, cols: 5, classes: 3, noise: 0.1, seed: 9 }, &raw).expect("gen");
    let train = libsvm_file(d, "train", "+1 1:10 2:1\n-1 1:20 3:1\n+1 1:30 2:1 3:1\n-1 1:40\n", Some(4));
    let test = libsvm_file(d, "test", "+1 2:1\n-1 1:25 2:1\n", None);
    for (fit_on, input) in [(&raw, &raw), (&train, &train), (&train, &test)] {
        let s = Scaling::fit(&Dataset::open(fit_on).expect("open")).expect("fit");
        let out = d.join("written.pgd");
        apply(input, &s, &out).expect("apply");
        let written = Dataset::open(&out).expect("open");
        let memory = standardized(&Dataset::open(input).expect("open"), &s, false).expect("in memory");
        memory.verify().expect("a sound dataset, checksums included");
        assert!(!memory.is_mapped() && memory.scaling().is_none());
        assert_eq!(memory.header().cols, written.header().cols);
        assert_eq!(sections(&memory), sections(&written), "{}", input.display());
    }
    let e = standardized(
        &Dataset::open(&d.join("written.pgd")).expect("open"),
        &Scaling::fit(&Dataset::open(&train).expect("open")).expect("fit"),
        false,
    )
    .expect_err("a standardized file");
    assert!(e.to_string().contains("standardized already"), "{e}");
}

#[test]
fn sums_over_shards_add_up_to_the_whole_files_statistics() {
    let t = dir("shards");
    let raw = t.path().join("raw.pgd");
    gen::dense(&DenseSpec { rows: 301, cols: 6, classes: 2, noise: 0.1, seed: 3 }, &raw).expect("gen");
    let ds = Dataset::open(&raw).expect("open");
    let whole = Scaling::fit(&ds).expect("fit");
    let parts: Vec<_> = (0..3).map(|r| crate::data::shard(301, r, 3)).collect();
    let mut total = Sums::of(&ds, 0..0).expect("sums");
    for p in &parts {
        let s = Sums::of(&ds, p.clone()).expect("sums");
        for (a, b) in
            [(&mut total.count, &s.count), (&mut total.sum, &s.sum), (&mut total.squares, &s.squares)]
        {
            a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }
    let mean = total.means(301);
    let mut sq = vec![0f64; 6];
    for p in &parts {
        sq.iter_mut().zip(deviations(&ds, p.clone(), &mean).expect("sq")).for_each(|(a, b)| *a += b);
    }
    let sharded = Scaling::from_moments(301, &total.count, &mean, &sq);
    for j in 0..6 {
        assert!((sharded.shift[j] - whole.shift[j]).abs() <= 1e-6 * whole.shift[j].abs().max(1.0));
        assert!((sharded.mult[j] - whole.mult[j]).abs() <= 1e-6 * whole.mult[j].abs());
    }
}
