//! `peregrine data` (convert, gen, info) and the datasets training refuses: bad data, CSV
//! conversion, datasets whose bytes contradict their header, a dataset truncated under a run.

use std::path::Path;
use std::process::Output;

#[path = "support/cli_common.rs"]
mod common;
use common::{finish_within, long_run, ok, peregrine, peregrine_in, scratch, section, text};

#[test]
fn data_convert_info_and_gen() {
    let d_tmp = scratch("data");
    let d = d_tmp.path();
    let input = d.join("in.svm");
    std::fs::write(&input, "+1 1:0.5 4:1\n-1 2:2\n").expect("write");
    let out = d.join("in.pgd");
    let s = |p: &std::path::Path| p.to_str().expect("utf8 path").to_owned();
    let o = peregrine(&["data", "convert", "libsvm", &s(&input), &s(&out)]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("2 rows, 4 columns, 3 values"), "{:?}", text(&o));
    let o = peregrine(&["data", "info", "--verify", &s(&out)]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("rows 2  features 4  nonzeros 3"), "{:?}", text(&o));

    let gen = d.join("gen.pgd");
    let o = peregrine(&[
        "data",
        "gen",
        "ratings",
        &s(&gen),
        "--ratings",
        "1000",
        "--users",
        "20",
        "--items",
        "30",
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = peregrine(&["data", "info", "--verify", &s(&gen)]);
    assert!(text(&o).0.contains("ratings 1000  users 20  items 30"), "{:?}", text(&o));

    // CSV: the label column and the classes named; the result trains.
    let csv = d.join("in.csv");
    let rows: String =
        (0..200).map(|i| format!("{},{},{}\n", i % 7, (i * 3) % 5, ["low", "high"][i % 2])).collect();
    std::fs::write(&csv, format!("x1,x2,outcome\n{rows}")).expect("write");
    let dense = d.join("csv.pgd");
    let o = peregrine(&["data", "convert", "csv", &s(&csv), &s(&dense), "--label", "outcome"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o).0.contains("200 rows, 2 feature columns")
            && text(&o).0.contains("label column 3 (`outcome`); classes 0=`high`, 1=`low`"),
        "{:?}",
        text(&o)
    );
    let o = peregrine(&[
        "train",
        "--ranks",
        "1",
        "--model",
        "softmax",
        "--data",
        &s(&dense),
        "--iterations",
        "3",
        "-q",
        "--run-dir",
        &s(&d.join("csv-run")),
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    for (bad, says) in [
        (&["--delimiter", "ab"][..], "--delimiter must be one character"),
        (&["--label", "0"][..], "numbers columns from 1"),
    ] {
        let o = peregrine(&[&["data", "convert", "csv", &s(&csv), &s(&d.join("x.pgd"))][..], bad].concat());
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {:?}", text(&o));
        assert!(text(&o).1.contains(says), "{:?}", text(&o));
    }
    assert!(!d.join("x.pgd").exists());
}

#[test]
fn bad_data_is_a_clear_error_and_leaves_nothing_behind() {
    let d_tmp = scratch("bad-data");
    let d = d_tmp.path();
    let input = d.join("bad.svm");
    std::fs::write(&input, "+1 1:1\n-1 3:1 2:1\n").expect("write");
    let out = d.join("bad.pgd");
    let s = |p: &std::path::Path| p.to_str().expect("utf8 path").to_owned();
    let o = peregrine(&["data", "convert", "libsvm", &s(&input), &s(&out)]);
    assert_eq!(o.status.code(), Some(1));
    let (_, stderr) = text(&o);
    assert!(stderr.contains(&format!("{}:2:8: expected an index above 3", input.display())), "{stderr}");
    assert_eq!(std::fs::read_dir(d).expect("list").count(), 1, "only the input is left");

    let o = peregrine(&["data", "info", &s(&input)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("not a Peregrine dataset"), "{:?}", text(&o));
    let o = peregrine(&["data", "info", &s(&d.join("missing.pgd"))]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("missing.pgd: opening"), "{:?}", text(&o));
}

#[test]
fn two_class_csv_converts_to_sparse_rows_for_logistic_regression() {
    let t = scratch("csv-sparse");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    std::fs::write(
        d.join("two.csv"),
        format!("x,z,y\n{}", "1,0,yes\n0,2.5,no\n3,4,yes\n0,0,no\n".repeat(25)),
    )
    .expect("write");
    std::fs::write(d.join("three.csv"), "x,y\n1,a\n2,b\n3,c\n").expect("write");
    let (stdout, _) = ok(&["data", "convert", "csv", &s("two.csv"), &s("two.pgd"), "--sparse"]);
    assert!(stdout.contains("(sparse, class 1 positive)") && stdout.contains("1=`yes`"), "{stdout}");
    let (info, _) = ok(&["data", "info", &s("two.pgd"), "--verify"]);
    // Zeros are not stored: 1 + 1 + 2 + 0 per four rows.
    assert!(
        info.contains("sparse binary-labelled")
            && info.contains("nonzeros 100 ")
            && info.contains("positive 50.0%"),
        "{info}"
    );
    ok(&[
        "train",
        "--model",
        "lr",
        "--data",
        &s("two.pgd"),
        "--iterations",
        "5",
        "--ranks",
        "1",
        "--run-dir",
        &s("run"),
        "--quiet",
    ]);
    let out = peregrine(&["data", "convert", "csv", &s("three.csv"), &s("three.pgd"), "--sparse"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("three.csv: 3 classes") && stderr.contains("needs two"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(d).expect("list").map(|e| e.expect("entry").file_name()).collect();
    assert!(!left.iter().any(|n| n.to_string_lossy().starts_with("three.pgd")), "{left:?}");
}

/// Writes `bytes` with `cols` replaced and the header checksum recomputed: a valid header over
/// data that contradicts it.
fn with_cols(bytes: &[u8], cols: u64) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[24..32].copy_from_slice(&cols.to_le_bytes());
    let crc = crc32fast::hash(&b[..156]);
    b[156..160].copy_from_slice(&crc.to_le_bytes());
    b
}

/// `peregrine train` (2 local ranks) on `data`, in `cwd`, with the default run directory.
fn train_on(cwd: &Path, data: &Path) -> Output {
    let data = data.to_str().expect("utf-8");
    peregrine_in(cwd, &["train", "--model", "lr", "--data", data, "--iterations", "20", "--ranks", "2"])
}

#[test]
fn datasets_whose_bytes_contradict_their_header_are_refused_before_training() {
    let t = scratch("corrupt-data");
    let d = t.path();
    ok(&[
        "data",
        "gen",
        "sparse",
        d.join("g.pgd").to_str().expect("utf-8"),
        "--rows",
        "4000",
        "--features",
        "300",
    ]);
    let good = std::fs::read(d.join("g.pgd")).expect("read");
    let (idx_at, idx_len) = section(&good, 1);
    let (val_at, val_len) = section(&good, 2);
    let mut flipped_index = good.clone();
    flipped_index[idx_at + idx_len * 3 / 4 / 4 * 4 + 3] = 0x7f; // in rank 1's half of the rows
    let mut flipped_value = good.clone();
    flipped_value[val_at + val_len / 3 / 4 * 4] ^= 1; // a value's lowest bit: still a valid float
                                                      // Converted data (no generating model, whose size the column count fixes).
    let rows: String = (0..400).map(|r| format!("{} {}:1 {}:2\n", r % 2, 1 + r % 7, 8 + r % 40)).collect();
    std::fs::write(d.join("c.svm"), rows).expect("write");
    ok(&[
        "data",
        "convert",
        "libsvm",
        d.join("c.svm").to_str().expect("utf-8"),
        d.join("c.pgd").to_str().expect("utf-8"),
    ]);
    let converted = std::fs::read(d.join("c.pgd")).expect("read");
    let cases: [(&str, Vec<u8>, &[&str]); 4] = [
        ("cols0.pgd", with_cols(&converted, 0), &["rank 0", "beyond 0 features", "corrupt"]),
        ("cols1.pgd", with_cols(&converted, 1), &["rank 0", "beyond 1 features", "corrupt"]),
        ("index.pgd", flipped_index, &["rank 1", "index.pgd: row", "corrupt"]),
        ("value.pgd", flipped_value, &["value.pgd", "data checksum mismatch"]),
    ];
    for (name, bytes, expected) in cases {
        let p = d.join(name);
        std::fs::write(&p, bytes).expect("write");
        let cwd = scratch("corrupt-data-cwd");
        let out = train_on(cwd.path(), &p);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        for e in expected {
            assert!(stderr.contains(e), "{name}: expected `{e}` in {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        assert!(!cwd.path().join("runs").exists(), "{name}: a run directory was left");
        // `data info` stays O(1); --verify finds it.
        let out = peregrine(&["data", "info", "--verify", p.to_str().expect("utf-8")]);
        assert_eq!(out.status.code(), Some(1), "{name}: {}", text(&out).1);
    }
}

#[test]
fn a_dataset_truncated_under_a_run_is_an_error_naming_it_not_a_bus_error() {
    let t = scratch("truncated");
    let (data, child) = long_run(t.path(), &["--ranks", "2", "--huge-pages", "off"]);
    let len = std::fs::metadata(&data).expect("stat").len();
    std::fs::OpenOptions::new().write(true).open(&data).expect("open").set_len(len / 2).expect("truncate");
    let (out, _) = finish_within(child, std::time::Duration::from_secs(60));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("big.pgd shrank while this run had it mapped"), "{stderr}");
}
