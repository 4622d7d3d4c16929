//! Early stopping (`train --early-stop N`) and the best evaluated model: on a problem that
//! overfits (150 training rows of 200 noisy features, no L2), the run stops before its iterations
//! once the evaluation loss has not improved for N evaluations, model.safetensors holds the model
//! of the best evaluation (as `predict` measures it), a resumed run ends as an uninterrupted one,
//! and bad settings are refused before anything is written.

use std::path::Path;
use std::process::{Command, Output};

#[path = "support/models.rs"]
mod models;

fn peregrine_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).current_dir(dir).output().expect("run peregrine")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = peregrine_in(dir, args);
    assert!(out.status.success(), "peregrine {args:?}: {}", text(&out));
    out
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-early-stop-{name}-")).tempdir().expect("scratch dir")
}

/// `tr.pgd` and `te.pgd` in `dir`: 300 rows of 200 features and 3 classes with label noise,
/// split in halves. Softmax without L2 fits the 150 training rows and the held-out loss, after
/// falling for some 35 iterations, rises.
fn overfitting(dir: &Path) {
    let args = ["data", "gen", "dense", "all.pgd", "--rows", "300", "--features", "200", "--classes", "3"];
    ok(dir, &[&args[..], &["--noise", "0.2"]].concat());
    ok(dir, &["data", "split", "all.pgd", "--train", "tr.pgd", "--test", "te.pgd", "--test-fraction", "0.5"]);
}

/// Trains softmax on [`overfitting`]'s data into `run` (2 ranks, an evaluation every 5 of 300
/// iterations, a checkpoint every 10), with `extra` flags.
fn train(dir: &Path, run: &str, extra: &[&str]) -> Output {
    let args = [
        "train",
        "--model",
        "softmax",
        "--data",
        "tr.pgd",
        "--l2",
        "0",
        "--lr",
        "0.003",
        "--lr-decay",
        "0",
        "--batch",
        "32",
        "--chunk",
        "16",
        "--iterations",
        "300",
        "--eval-every",
        "5",
        "--checkpoint-every",
        "10",
        "--ranks",
        "2",
        "--run-dir",
        run,
    ];
    peregrine_in(dir, &[&args[..], extra].concat())
}

fn summary(run: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(run.join("summary.json")).expect("summary.json");
    serde_json::from_str(&text).expect("summary json")
}

/// The evaluation losses of a summary, with their iterations.
fn evals(s: &serde_json::Value) -> Vec<(u64, f64)> {
    let evals = s["evals"].as_array().expect("evals");
    evals.iter().map(|e| (e["iter"].as_u64().expect("iter"), e["loss"].as_f64().expect("loss"))).collect()
}

/// The metadata of `run`'s model.safetensors.
fn model_meta(run: &Path) -> serde_json::Value {
    file_meta(&run.join("model.safetensors"))
}

/// A safetensors file's metadata.
fn file_meta(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).expect("model");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    header["__metadata__"].clone()
}

fn meta_f64(meta: &serde_json::Value, key: &str) -> f64 {
    meta[key].as_str().unwrap_or_else(|| panic!("no {key} in {meta}")).parse().expect("a number")
}

/// The loss `peregrine predict` measures with `run`'s model on the evaluation set (printed to 4
/// places).
fn predicted_loss(dir: &Path, run: &str) -> f64 {
    let out = ok(dir, &["predict", "--model", run, "--data", "te.pgd", "--out", "predictions.csv"]);
    let t = text(&out);
    let at = t.find("loss ").unwrap_or_else(|| panic!("no loss in {t}")) + 5;
    t[at..].split(',').next().expect("figure").trim().parse().unwrap_or_else(|_| panic!("{t}"))
}

#[test]
fn early_stopping_ends_an_overfitting_run_and_the_model_is_the_best_evaluated() {
    let t = scratch("stop");
    let d = t.path();
    overfitting(d);
    let out = train(d, "run", &["--eval", "te.pgd", "--early-stop", "3"]);
    assert!(out.status.success(), "{}", text(&out));
    let s = summary(&d.join("run"));
    let e = evals(&s);
    let (best_at, best) = e.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).expect("evaluations");
    let stopped = s["stopped_early"].as_u64().unwrap_or_else(|| panic!("not stopped early: {s}"));
    // Stopped well before its 300 iterations, at the third evaluation after the best, each of
    // them no better; the last evaluation (the final one, of the model it ended with) is worse.
    assert!(s["iterations"].as_u64().expect("iterations") < 100, "{s}");
    assert_eq!(stopped, best_at + 15, "{e:?}");
    assert!(e.iter().filter(|p| p.0 > best_at).all(|p| p.1 >= best), "{e:?}");
    let last = e.last().expect("last").1;
    assert!(last > best, "{e:?}");
    assert_eq!(s["best"]["iter"].as_u64(), Some(best_at), "{s}");
    assert_eq!(s["early_stop"].as_u64(), Some(3), "{s}");
    // The saved model is the best evaluation's: its metadata and predict say so.
    let meta = model_meta(&d.join("run"));
    assert_eq!(meta["best_iteration"].as_str(), Some(best_at.to_string().as_str()), "{meta}");
    // (serde_json reads a float to within a unit in the last place.)
    assert!((meta_f64(&meta, "eval_loss") - best).abs() <= 1e-12, "{meta}: best {best}");
    assert_eq!(meta_f64(&meta, "stopped_early_at"), stopped as f64, "{meta}");
    let predicted = predicted_loss(d, "run");
    assert!((predicted - best).abs() <= 5e-5, "predict: {predicted}, best evaluation {best}");
    assert!(predicted < last - 1e-3, "predict: {predicted}, last evaluation {last}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains(&format!(
            "early stopping: no improvement in 3 evaluations, stopped after the evaluation at iteration {stopped}"
        )) && printed.contains(&format!("model.safetensors: the best evaluated model, iteration {best_at}")),
        "{printed}"
    );

    // Without early stopping the run goes on to the end, and the model is still the best one.
    let out = train(d, "full", &["--eval", "te.pgd", "--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    let s = summary(&d.join("full"));
    assert_eq!(s["iterations"].as_u64(), Some(300), "{s}");
    assert!(s["stopped_early"].is_null(), "{s}");
    let e = evals(&s);
    let (full_best_at, full_best) = e.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)).expect("evals");
    let meta = model_meta(&d.join("full"));
    assert_eq!(meta["best_iteration"].as_str(), Some(full_best_at.to_string().as_str()), "{meta}");
    let predicted = predicted_loss(d, "full");
    assert!((predicted - full_best).abs() <= 5e-5, "predict: {predicted}, best evaluation {full_best}");
    assert!(predicted < e.last().expect("last").1 - 1e-2, "{predicted} against {e:?}");

    // Without an evaluation set (the evaluations on the training set), the last model, as
    // before: no best model is named.
    let out = train(d, "train-only", &["--quiet"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(summary(&d.join("train-only"))["best"].is_null());
    assert!(model_meta(&d.join("train-only"))["best_iteration"].is_null());
}

#[test]
fn a_resumed_run_stops_where_an_uninterrupted_one_did_with_the_same_best_model() {
    let t = scratch("resume");
    let d = t.path();
    overfitting(d);
    let flags = ["--eval", "te.pgd", "--early-stop", "3", "--quiet"];
    let out = train(d, "run", &flags);
    assert!(out.status.success(), "{}", text(&out));
    let whole = summary(&d.join("run"));
    let best_at = whole["best"]["iter"].as_u64().expect("best");
    std::fs::copy(d.join("run/model.safetensors"), d.join("uninterrupted.safetensors")).expect("copy");
    // As a run killed after its last checkpoint: no summary, the model of that checkpoint.
    std::fs::remove_file(d.join("run/summary.json")).expect("summary");
    std::fs::remove_file(d.join("run/model.safetensors")).expect("model");
    let out = train(d, "run", &flags);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    let from: u64 = said
        .split("resuming from iteration ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not resumed: {said}"));
    // The best evaluation came before the checkpoint: only the checkpoint can have carried it.
    assert!(from > best_at, "resumed from {from}, best at {best_at}");
    let resumed = summary(&d.join("run"));
    assert_eq!(resumed["stopped_early"], whole["stopped_early"], "{resumed}");
    assert_eq!(resumed["best"]["iter"].as_u64(), Some(best_at), "{resumed}");
    let (then, now) = (file_meta(&d.join("uninterrupted.safetensors")), model_meta(&d.join("run")));
    for key in ["best_iteration", "stopped_early_at"] {
        assert_eq!(now[key], then[key], "{key}: {now} against {then}");
    }
    // The best evaluation's figures come back from the checkpoint's JSON (read to within a unit
    // in the last place).
    let loss = |m: &serde_json::Value| meta_f64(m, "eval_loss");
    assert!((loss(&now) - loss(&then)).abs() <= 1e-12, "{now} against {then}");
    let dist = models::model_distance(&d.join("uninterrupted.safetensors"), &d.join("run/model.safetensors"));
    assert_eq!(dist, 0.0, "the resumed run's best model differs from the uninterrupted run's");
}

#[test]
fn early_stopping_without_held_out_data_or_with_a_count_of_0_is_refused_and_nothing_written() {
    let t = scratch("bad");
    let d = t.path();
    overfitting(d);
    std::fs::write(d.join("zero.toml"), "early-stop = 0\n").expect("toml");
    let cases: [(&[&str], &str); 3] = [
        (&["--eval", "te.pgd", "--early-stop", "0"], "--early-stop must be at least 1"),
        (&["--early-stop", "3"], "--early-stop needs held-out data to judge by: give --eval FILE"),
        (&["--eval", "te.pgd", "--config", "zero.toml"], "--early-stop must be at least 1"),
    ];
    for (flags, expected) in cases {
        let out = train(d, "run", flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", text(&out));
        assert!(text(&out).contains(expected), "{flags:?}: {}", text(&out));
        assert!(!d.join("run").exists(), "{flags:?}: a run directory was written");
    }
}

#[test]
fn under_early_stopping_the_evaluations_are_every_epoch_by_default() {
    let t = scratch("every-epoch");
    let d = t.path();
    overfitting(d);
    // 150 training rows in batches of 32: an epoch is 5 iterations. Of 300 iterations, without
    // early stopping an evaluation every 30 (about 10 a run); with it, every epoch.
    let run = |name: &str, extra: &[&str]| {
        let args = [
            "train",
            "--model",
            "softmax",
            "--data",
            "tr.pgd",
            "--eval",
            "te.pgd",
            "--batch",
            "32",
            "--chunk",
            "16",
            "--iterations",
            "300",
            "--ranks",
            "2",
            "--quiet",
            "--run-dir",
            name,
        ];
        ok(d, &[&args[..], extra].concat());
        let config = std::fs::read_to_string(d.join(name).join("config.toml")).expect("config.toml");
        let line = config.lines().find(|l| l.starts_with("eval-every = ")).expect("eval-every").to_owned();
        (line, evals(&summary(&d.join(name)))[0].0)
    };
    assert_eq!(run("plain", &[]), ("eval-every = 30".to_owned(), 30));
    assert_eq!(run("stopping", &["--early-stop", "100"]), ("eval-every = 5".to_owned(), 5));
}
