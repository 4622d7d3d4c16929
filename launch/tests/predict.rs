//! `peregrine predict` on the models training writes: every model predicts what it was evaluated
//! at, standardized data, the files and data it refuses, and Python reading the exported model.

use std::path::Path;
use std::process::Command;

#[path = "support/cli_common.rs"]
mod common;
use common::{final_eval, ok, peregrine, predicted, scratch, section, text};

#[path = "support/models.rs"]
mod models;
use models::safetensors_f32;

#[test]
fn every_model_is_written_at_the_end_of_training_and_predicts_what_it_was_evaluated_at() {
    let t = scratch("predict");
    let d = t.path();
    let s = |p: &Path| p.to_str().expect("utf-8").to_owned();
    let (sparse, dense, ratings) = (s(&d.join("s.pgd")), s(&d.join("d.pgd")), s(&d.join("r.pgd")));
    ok(&["data", "gen", "sparse", &sparse, "--rows", "3000", "--features", "200"]);
    ok(&["data", "gen", "dense", &dense, "--rows", "2000", "--features", "12", "--classes", "3"]);
    ok(&["data", "gen", "ratings", &ratings, "--ratings", "5000", "--users", "60", "--items", "50"]);
    for (model, data, extra, header, width) in [
        ("lr", &sparse, &[][..], "probability,label", 2),
        ("softmax", &dense, &[][..], "class,p0,p1,p2,label", 5),
        ("mlp", &dense, &["--hidden", "16,8"][..], "class,p0,p1,p2,label", 5),
        ("mf", &ratings, &["--k", "4"][..], "prediction,user,item,rating", 4),
    ] {
        let run = d.join(format!("run-{model}"));
        let mut args =
            vec!["train", "--model", model, "--data", data, "--epochs", "2", "--ranks", "2", "--quiet"];
        args.extend_from_slice(extra);
        let r = s(&run);
        args.extend(["--run-dir", &r]);
        ok(&args);
        assert!(run.join("model.safetensors").is_file(), "{model}: no model file");
        let csv = d.join(format!("{model}.csv"));
        // The run directory or the file itself.
        let (_, stderr) = ok(&["predict", "--model", &r, "--data", data, "--out", &s(&csv)]);
        let (loss, metric) = predicted(&stderr);
        let (want_loss, want_metric) = final_eval(&run);
        assert!(
            (loss - want_loss).abs() <= 1e-4 * want_loss.max(1.0),
            "{model}: predict loss {loss} vs training's {want_loss}"
        );
        assert!((metric - want_metric).abs() <= 1e-3, "{model}: {metric} vs {want_metric}");
        let text = std::fs::read_to_string(&csv).expect("predictions");
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(header), "{model}");
        let rows: Vec<&str> = lines.collect();
        let want_rows = if model == "mf" {
            5000
        } else if model == "lr" {
            3000
        } else {
            2000
        };
        assert_eq!(rows.len(), want_rows, "{model}");
        for row in &rows {
            let v: Vec<f64> = row.split(',').map(|x| x.parse().expect("a number")).collect();
            assert_eq!(v.len(), width, "{model}: {row}");
            if model == "softmax" || model == "mlp" {
                let p = &v[1..4];
                assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-4, "{model}: {row}");
                let best = (0..3).fold(0, |b, i| if p[i] > p[b] { i } else { b });
                assert_eq!(v[0] as usize, best, "{model}: {row}");
            }
            if model == "lr" {
                assert!((0.0..=1.0).contains(&v[0]), "{row}");
            }
        }
        let file =
            ok(&["predict", "--model", &s(&run.join("model.safetensors")), "--data", data, "-o", "-"]).0;
        assert_eq!(file, text, "{model}: standard output and file differ");
    }
    // The model file is a safetensors file: 8-byte header length, JSON header with the shapes and
    // the metadata that rebuilds the model.
    let bytes = std::fs::read(d.join("run-mlp/model.safetensors")).expect("model");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json header");
    assert_eq!(header["layers.0.weight"]["shape"], serde_json::json!([16, 12]));
    assert_eq!(header["layers.2.bias"]["shape"], serde_json::json!([3]));
    assert_eq!(header["layers.1.weight"]["dtype"], "F32");
    assert_eq!(header["__metadata__"]["model"], "mlp");
    assert_eq!(header["__metadata__"]["hidden"], "16,8");
    assert_eq!(header["__metadata__"]["format"], "peregrine-model");
}

#[test]
fn standardized_training_data_needs_standardized_data_to_predict() {
    let t = scratch("standardize");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    std::fs::write(d.join("train.txt"), "+1 1:100 2:1\n-1 1:200\n+1 1:150 2:1\n-1 1:250 3:1\n".repeat(50))
        .expect("write");
    std::fs::write(d.join("test.txt"), "+1 1:120 2:1\n-1 1:240\n").expect("write");
    ok(&["data", "convert", "libsvm", &s("train.txt"), &s("train.pgd")]);
    ok(&["data", "convert", "libsvm", &s("test.txt"), &s("test.pgd")]);
    let (stdout, _) = ok(&["data", "standardize", &s("train.pgd"), &s("train.std.pgd")]);
    assert!(stdout.contains("3 features (1 centred)"), "{stdout}");
    // The test file has 2 features; standardized like the training file it gets 3.
    ok(&["data", "standardize", &s("test.pgd"), &s("test.std.pgd"), "--like", &s("train.std.pgd")]);
    let (info, _) = ok(&["data", "info", &s("test.std.pgd"), "--verify"]);
    assert!(
        info.contains("features 3") && info.contains("standardized: 1 features centred, 3 scaled"),
        "{info}"
    );
    let run = s("run");
    ok(&[
        "train",
        "--model",
        "lr",
        "--data",
        &s("train.std.pgd"),
        "--iterations",
        "20",
        "--ranks",
        "1",
        "--run-dir",
        &run,
        "--quiet",
    ]);
    ok(&["predict", "--model", &run, "--data", &s("test.std.pgd"), "-o", &s("p.csv")]);
    for (data, says) in
        [(s("test.pgd"), "trained on standardized data"), (s("train.pgd"), "peregrine data standardize")]
    {
        let out = peregrine(&["predict", "--model", &run, "--data", &data, "-o", &s("bad.csv")]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says) && stderr.contains("train.std.pgd"), "{stderr}");
        let left: Vec<_> = std::fs::read_dir(d)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("bad."))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
    // Standardizing twice, or by a file without a record, is refused.
    let out = peregrine(&["data", "standardize", &s("train.std.pgd"), &s("x.pgd")]);
    assert!(text(&out).1.contains("standardized already"), "{:?}", text(&out));
    let out = peregrine(&["data", "standardize", &s("test.pgd"), &s("x.pgd"), "--like", &s("train.pgd")]);
    assert!(text(&out).1.contains("no scaling record"), "{:?}", text(&out));
    assert!(!d.join("x.pgd").exists());
}

#[test]
fn predict_refuses_mismatched_data_and_other_files() {
    let t = scratch("predict-bad");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "500", "--features", "6", "--classes", "3"]);
    ok(&["data", "gen", "dense", &s("wide.pgd"), "--rows", "50", "--features", "7", "--classes", "3"]);
    ok(&["data", "gen", "sparse", &s("s.pgd"), "--rows", "500", "--features", "40"]);
    ok(&["data", "gen", "sparse", &s("s-wide.pgd"), "--rows", "50", "--features", "50"]);
    ok(&[
        "train",
        "--model",
        "softmax",
        "--data",
        &s("d.pgd"),
        "--iterations",
        "5",
        "--ranks",
        "1",
        "--run-dir",
        &s("sm"),
        "--quiet",
    ]);
    ok(&[
        "train",
        "--model",
        "lr",
        "--data",
        &s("s.pgd"),
        "--iterations",
        "5",
        "--ranks",
        "1",
        "--run-dir",
        &s("lr"),
        "--quiet",
    ]);
    std::fs::write(d.join("junk.safetensors"), b"not a model").expect("write");
    // An MF model whose rows end with one adaptive-rate value (as before libmf's two groups).
    ok(&["data", "gen", "ratings", &s("r.pgd"), "--ratings", "2000", "--users", "50", "--items", "40"]);
    ok(&[
        "train",
        "--model",
        "mf",
        "--data",
        &s("r.pgd"),
        "--iterations",
        "3",
        "--ranks",
        "1",
        "--run-dir",
        &s("mf"),
        "--quiet",
    ]);
    let mut old = std::fs::read(d.join("mf/model.safetensors")).expect("read");
    let n = u64::from_le_bytes(old[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&old[8..8 + n]).expect("header");
    let at = 8 + n + header["row_state"]["data_offsets"][0].as_u64().expect("row_state") as usize;
    assert_eq!(old[at..at + 4], 2.0f32.to_le_bytes(), "rows end with two G's");
    old[at..at + 4].copy_from_slice(&1.0f32.to_le_bytes());
    std::fs::write(d.join("old-mf.safetensors"), old).expect("write");
    let mut flipped = std::fs::read(d.join("s.pgd")).expect("read");
    let at = section(&flipped, 2).0 + 4;
    flipped[at] ^= 1;
    std::fs::write(d.join("flipped.pgd"), flipped).expect("write");
    for (model, data, says) in [
        ("lr", "flipped.pgd", "data checksum mismatch"),
        ("sm", "wide.pgd", "shape [3, 6], the data needs [3, 7]"),
        ("sm", "s.pgd", "this model needs"),
        ("lr", "s-wide.pgd", "convert it with --features 40"),
        ("junk.safetensors", "d.pgd", "not a safetensors file"),
        ("old-mf.safetensors", "r.pgd", "rows end with 1 adaptive-rate values (`row_state`)"),
        ("nowhere", "d.pgd", "reading"),
        ("sm", "nowhere.pgd", "nowhere.pgd"),
    ] {
        let out = peregrine(&["predict", "--model", &s(model), "--data", &s(data), "-o", &s("p.csv")]);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{model} {data}: {stderr}");
        assert!(stderr.contains(says), "{model} {data}: {stderr}");
        assert!(!d.join("p.csv").exists(), "{model} {data}: half-written predictions");
    }
    // A narrower sparse file (converted without --features) is fine: its features are the model's first.
    ok(&["data", "gen", "sparse", &s("s-narrow.pgd"), "--rows", "50", "--features", "30"]);
    ok(&["predict", "--model", &s("lr"), "--data", &s("s-narrow.pgd"), "-o", &s("p.csv")]);
}

#[test]
fn python_reads_the_exported_model() {
    let t = scratch("python");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "500", "--features", "6", "--classes", "3"]);
    ok(&[
        "train",
        "--model",
        "mlp",
        "--hidden",
        "5",
        "--data",
        &s("d.pgd"),
        "--iterations",
        "5",
        "--ranks",
        "1",
        "--run-dir",
        &s("run"),
        "--npy",
        "-q",
    ]);
    let ours = safetensors_f32(&d.join("run/model.safetensors"));
    // Python's standard library only: the header-parsing reader the format's documentation gives.
    let script = r#"
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__")
assert meta["format"] == "peregrine-model" and meta["model"] == "mlp" and meta["hidden"] == "5", meta
for name in sorted(h):
    t = h[name]
    lo, hi = t["data_offsets"]
    v = struct.unpack("<%df" % ((hi - lo) // 4), b[8 + n + lo:8 + n + hi])
    print(name, "x".join(map(str, t["shape"])), "%.6f" % sum(v))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(d.join("run/model.safetensors"))
        .output()
        .expect("python3");
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let shapes = ["layers.0.bias 5", "layers.0.weight 5x6", "layers.1.bias 3", "layers.1.weight 3x5"];
    for (line, (shape, (name, v))) in stdout.lines().zip(shapes.iter().zip(&ours)) {
        assert!(line.starts_with(shape) && line.starts_with(name.as_str()), "{line} vs {shape}");
        let sum: f32 = line.rsplit(' ').next().and_then(|x| x.parse().ok()).expect("sum");
        assert!((sum - v.iter().sum::<f32>()).abs() < 1e-4, "{line}");
    }
    assert_eq!(stdout.lines().count(), 4, "{stdout}");
    // The same tensors as NumPy files (--npy), read with a header-parsing reader of the format
    // (numpy.lib.format's layout: magic, version, header length, a Python dict, the data).
    let script = r#"
import ast, glob, json, os, struct, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.npy"))):
    b = open(path, "rb").read()
    assert b[:8] == b"\x93NUMPY\x01\x00", b[:8]
    n = struct.unpack("<H", b[8:10])[0]
    assert (10 + n) % 64 == 0, n
    h = ast.literal_eval(b[10:10 + n].decode("latin1"))
    assert h["descr"] == "<f4" and not h["fortran_order"], h
    count = 1
    for s in h["shape"]:
        count *= s
    v = struct.unpack("<%df" % count, b[10 + n:])
    print(os.path.basename(path)[:-4], "x".join(map(str, h["shape"])), "%.6f" % sum(v))
print(json.load(open(os.path.join(sys.argv[1], "meta.json")))["model"])
"#;
    let out =
        Command::new("python3").arg("-c").arg(script).arg(d.join("run/model")).output().expect("python3");
    let (npy, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(npy.lines().collect::<Vec<_>>(), [&stdout.lines().collect::<Vec<_>>()[..], &["mlp"]].concat());
}
