//! `peregrine train --standardize`: raw-scale features standardized on the fly, the scaling
//! recorded for `predict` and kept by a resume, and the bad inputs around it.

use std::path::Path;
use std::process::{Command, Output};

fn peregrine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).output().expect("run peregrine")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn ok(args: &[&str]) -> Output {
    let out = peregrine(args);
    assert!(out.status.success(), "{args:?}: {:?}", text(&out));
    out
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-scaling-{name}-")).tempdir().expect("scratch dir")
}

/// A deterministic stream of numbers, roughly standard normal (a sum of uniforms).
struct Noise(u64);

impl Noise {
    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        (0..12).map(|_| self.uniform()).sum::<f64>() - 6.0
    }
}

/// Raw-scale features (pixels, amounts in thousands) of 8 columns, 3 classes from a linear
/// model: `rows` lines of CSV, label last.
fn raw_csv(rows: usize, seed: u64) -> String {
    let scale = [255.0, 1000.0, 0.5, 255.0, 2000.0, 1.0, 80.0, 300.0];
    let mut w = Noise(7);
    let model: Vec<Vec<f64>> = (0..3).map(|_| (0..8).map(|_| w.normal()).collect()).collect();
    let mut n = Noise(seed);
    let mut out = String::new();
    for _ in 0..rows {
        let z: Vec<f64> = (0..8).map(|_| n.normal()).collect();
        let score: Vec<f64> = model
            .iter()
            .map(|m| m.iter().zip(&z).map(|(a, b)| a * b).sum::<f64>() + 0.3 * n.normal())
            .collect();
        let label = (0..3).fold(0, |b, c| if score[c] > score[b] { c } else { b });
        for (x, s) in z.iter().zip(scale) {
            out += &format!("{:.3},", x * s + s);
        }
        out += &format!("{label}\n");
    }
    out
}

/// The raw training and test files in `d` (`train.pgd`, `test.pgd`), and the same standardized
/// by `data standardize` (`train.std.pgd`, `test.std.pgd`).
fn raw_and_standardized(d: &Path) -> impl Fn(&str) -> String + '_ {
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    for (name, rows, seed) in [("train", 2000, 1), ("test", 500, 2)] {
        std::fs::write(d.join(format!("{name}.csv")), raw_csv(rows, seed)).expect("csv");
        ok(&["data", "convert", "csv", &s(&format!("{name}.csv")), &s(&format!("{name}.pgd"))]);
    }
    ok(&["data", "standardize", &s("train.pgd"), &s("train.std.pgd")]);
    ok(&["data", "standardize", &s("test.pgd"), &s("test.std.pgd"), "--like", &s("train.std.pgd")]);
    s
}

/// `predict`'s test loss and the predictions' CSV lines.
fn predict(model: &str, data: &str, out: &str) -> (f64, Vec<Vec<f64>>) {
    let o = ok(&["predict", "--model", model, "--data", data, "--out", out]);
    let stderr = text(&o).1;
    let loss = stderr
        .split("loss ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no loss in {stderr}"));
    let rows = std::fs::read_to_string(out)
        .expect("predictions")
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(|v| v.parse().expect("number")).collect())
        .collect();
    (loss, rows)
}

fn same_predictions(a: &[Vec<f64>], b: &[Vec<f64>]) {
    assert_eq!(a.len(), b.len());
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        for (p, q) in x.iter().zip(y) {
            assert!((p - q).abs() <= 1e-5, "row {r}: {x:?} against {y:?}");
        }
    }
}

#[test]
fn raw_scale_features_train_by_default_as_well_as_standardized_ones_and_predict_from_raw_data() {
    let t = scratch("default");
    let s = raw_and_standardized(t.path());
    let train = |data: &str, run: &str, extra: &[&str]| {
        let base = ["train", "--model", "softmax", "--data", data, "--run-dir", run, "-q"];
        peregrine(&[&base[..], extra].concat())
    };
    // Default flags, two ranks: standardized on the fly, said so.
    let out = train(&s("train.pgd"), &s("raw"), &["--ranks", "2"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(text(&out).1.contains("standardizing the features on the fly"), "{:?}", text(&out));
    let out = train(&s("train.std.pgd"), &s("std"), &["--ranks", "2"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(!text(&out).1.contains("on the fly"), "a standardized file is left alone: {:?}", text(&out));
    let (raw, _) = predict(&s("raw"), &s("test.pgd"), &s("raw.csv"));
    let (std, _) = predict(&s("std"), &s("test.std.pgd"), &s("std.csv"));
    assert!(raw <= 1.05 * std, "raw data standardized on the fly: test loss {raw}, standardized file {std}");
    // Left raw, the same model does worse.
    let out = train(&s("train.pgd"), &s("off"), &["--ranks", "2", "--standardize", "off"]);
    let (stdout, stderr) = text(&out);
    if out.status.success() {
        let (off, _) = predict(&s("off"), &s("test.pgd"), &s("off.csv"));
        assert!(off > 1.03 * raw || stderr.contains("far from unit scale"), "off: {off}, on the fly {raw}");
    } else {
        assert!(stderr.contains("far from unit scale"), "{stdout}{stderr}");
    }
    // One rank, one thread: the statistics are those of `data standardize`, and the model
    // predicts the raw test file as the standardized pipeline predicts the standardized one.
    let one = ["--ranks", "1", "--threads", "1", "--iterations", "200"];
    ok(&[
        &["train", "--model", "softmax", "--data", &s("train.pgd"), "--run-dir", &s("raw1"), "-q"][..],
        &one,
    ]
    .concat());
    ok(&[
        &["train", "--model", "softmax", "--data", &s("train.std.pgd"), "--run-dir", &s("std1"), "-q"][..],
        &one,
    ]
    .concat());
    let (_, a) = predict(&s("raw1"), &s("test.pgd"), &s("raw1.csv"));
    let (_, b) = predict(&s("std1"), &s("test.std.pgd"), &s("std1.csv"));
    same_predictions(&a, &b);
    // Its scaling is bit for bit the file's: the file standardized alike is taken as it is.
    let (_, c) = predict(&s("raw1"), &s("test.std.pgd"), &s("c.csv"));
    same_predictions(&c, &b);
}

#[test]
fn an_mlp_on_raw_scale_features_learns_and_left_raw_names_the_scale() {
    let t = scratch("mlp");
    let s = raw_and_standardized(t.path());
    let base = ["train", "--model", "mlp", "--hidden", "16", "--data", &s("train.pgd"), "-q", "--ranks", "2"];
    ok(&[&base[..], &["--run-dir", &s("auto")]].concat());
    let (loss, rows) = predict(&s("auto"), &s("test.pgd"), &s("auto.csv"));
    let right = rows.iter().filter(|r| r[0] == r[r.len() - 1]).count();
    assert!(loss < 0.4 && right * 10 >= rows.len() * 8, "loss {loss}, {right} of {} right", rows.len());
    let out = peregrine(&[&base[..], &["--run-dir", &s("off"), "--standardize", "off"]].concat());
    let (stdout, stderr) = text(&out);
    if !out.status.success() || stderr.contains("warning") {
        assert!(
            stderr.contains("far from unit scale") && stderr.contains("--standardize off"),
            "{stdout}{stderr}"
        );
    } else {
        let (off, _) = predict(&s("off"), &s("test.pgd"), &s("off.csv"));
        assert!(off > 1.1 * loss, "off: {off}, auto {loss}");
    }
}

#[test]
fn a_resumed_run_keeps_the_scaling() {
    let t = scratch("resume");
    let s = raw_and_standardized(t.path());
    let args = [
        "train",
        "--model",
        "softmax",
        "--data",
        &s("train.pgd"),
        "--ranks",
        "2",
        "--iterations",
        "200",
        "--checkpoint-every",
        "100",
        "-q",
        "--run-dir",
        &s("run"),
    ];
    ok(&args);
    let (_, before) = predict(&s("run"), &s("test.pgd"), &s("before.csv"));
    std::fs::remove_file(t.path().join("run/summary.json")).expect("unfinish");
    let out = ok(&args);
    assert!(text(&out).1.contains("resuming from iteration"), "{:?}", text(&out));
    let (_, after) = predict(&s("run"), &s("test.pgd"), &s("after.csv"));
    same_predictions(&before, &after);
    let config = std::fs::read_to_string(t.path().join("run/config.toml")).expect("config");
    assert!(config.contains("standardize = \"auto\""), "{config}");
}

#[test]
fn bad_inputs_are_clear_errors_that_write_nothing() {
    let t = scratch("bad");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    // Not for models without features: a usage error, no run directory.
    ok(&["data", "gen", "ratings", &s("r.pgd"), "--users", "50", "--items", "40", "--ratings", "500"]);
    for model in ["mf", "lda", "synthetic"] {
        let out = peregrine(&[
            "train",
            "--model",
            model,
            "--data",
            &s("r.pgd"),
            "--standardize",
            "on",
            "--run-dir",
            &s(model),
        ]);
        assert_eq!(out.status.code(), Some(2), "{model}: {:?}", text(&out));
        assert!(
            text(&out).1.contains("--standardize is for the models that read features"),
            "{:?}",
            text(&out)
        );
        assert!(!d.join(model).exists());
    }
    let out =
        peregrine(&["train", "--model", "softmax", "--data", &s("r.pgd"), "--standardize", "sometimes"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    ok(&["data", "gen", "sparse", &s("sp.pgd"), "--rows", "200", "--features", "50"]);
    let out = peregrine(&[
        "train",
        "--model",
        "lr",
        "--data",
        &s("sp.pgd"),
        "--hash-bits",
        "8",
        "--standardize",
        "on",
        "--run-dir",
        &s("h"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("not for hashed features"), "{:?}", text(&out));
    assert!(!d.join("h").exists());
    // A constant column keeps its scale: not an error, and the others are standardized.
    let mut csv = String::new();
    for i in 0..200 {
        csv += &format!("{},7,{},{}\n", (i * 37 % 255) as f64, (i * 11 % 1000) as f64, i % 2);
    }
    std::fs::write(d.join("c.csv"), &csv).expect("csv");
    ok(&["data", "convert", "csv", &s("c.csv"), &s("c.pgd")]);
    let out = ok(&[
        "train",
        "--model",
        "softmax",
        "--data",
        &s("c.pgd"),
        "--standardize",
        "on",
        "--iterations",
        "50",
        "-q",
        "--run-dir",
        &s("c"),
    ]);
    assert!(text(&out).1.contains("3 centred, 2 scaled"), "{:?}", text(&out));
}
