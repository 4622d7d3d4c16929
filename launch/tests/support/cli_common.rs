//! Running the `peregrine` binary from the CLI test files (`cli.rs`, `data.rs`, `train.rs`,
//! `predict.rs`, `resume.rs`, `experiment.rs`): the helpers they share. Each file uses some of them.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub fn peregrine(args: &[&str]) -> Output {
    peregrine_in(Path::new("."), args)
}

/// `peregrine` run in directory `dir` (where it would write `runs/`).
pub fn peregrine_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).current_dir(dir).output().expect("run peregrine")
}

/// `peregrine train` on one rank from the configuration the run in `run` resolved, with `extra`
/// flags, into the run directory `into`: it must succeed.
pub fn runs_again(run: &Path, extra: &[&str], into: &Path) {
    let (config, into) = (run.join("config.toml"), into.to_string_lossy());
    let head = ["train", "--ranks", "1", "--config", &config.to_string_lossy()];
    let out = peregrine(&[&head[..], extra, &["-q", "--run-dir", &into]].concat());
    assert!(out.status.success(), "{:?}", text(&out));
}

pub fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A scratch directory, removed when the test ends (passed or failed).
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-cli-{name}-")).tempdir().expect("scratch dir")
}

/// A small generated sparse dataset for the training commands.
pub fn train_data(dir: &std::path::Path) -> String {
    let data = dir.join("sparse.pgd");
    let out =
        peregrine(&["data", "gen", "sparse", &data.to_string_lossy(), "--rows", "4000", "--features", "300"]);
    assert!(out.status.success(), "{:?}", text(&out));
    data.to_string_lossy().into_owned()
}

/// Runs `peregrine args`, expecting success; its standard output and error.
pub fn ok(args: &[&str]) -> (String, String) {
    let out = peregrine(args);
    let t = text(&out);
    assert!(out.status.success(), "peregrine {args:?}:\n{}\n{}", t.0, t.1);
    t
}

/// The final evaluation's loss and metric in a run directory's summary.
pub fn final_eval(run: &Path) -> (f64, f64) {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).expect("summary"))
            .expect("json");
    let e = s["evals"].as_array().and_then(|e| e.last()).expect("an evaluation").clone();
    (e["loss"].as_f64().expect("loss"), e["metric"].as_f64().expect("metric"))
}

/// `predict`'s "loss L, metric M" line.
pub fn predicted(stderr: &str) -> (f64, f64) {
    let tail = stderr.rsplit(": loss ").next().expect("a loss");
    let mut it = tail.split([',', ' ']).filter(|w| !w.is_empty());
    let loss = it.next().and_then(|w| w.parse().ok()).expect("loss");
    let metric = it.nth(1).and_then(|w| w.trim().parse().ok()).expect("metric");
    (loss, metric)
}

/// `train` of LR on `data` into `run`: `iterations` of batches of 512 in chunks of 64, a
/// checkpoint every 100, quiet, then `extra` (the runs the failure tests cut short).
pub fn lr_train(data: &str, run: &str, iterations: &str, extra: &[&str]) -> Vec<String> {
    let base = ["train", "--model", "lr", "--data", data, "--iterations", iterations, "--batch", "512"];
    let more = ["--chunk", "64", "--checkpoint-every", "100", "--run-dir", run, "--quiet"];
    base.iter().chain(&more).chain(extra).map(|a| (*a).to_owned()).collect()
}

/// [`lr_train`] started (not awaited).
pub fn spawn_train(data: &str, run: &str, iterations: &str, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(lr_train(data, run, iterations, extra))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start peregrine")
}

/// Waits (at most a minute) until `path` exists.
pub fn wait_for_file(path: &Path) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(start.elapsed().as_secs() < 60, "no {} written", path.display());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill");
    assert!(ok.success(), "kill {sig} {pid}");
}

// Hostile inputs and faults: no panic, hang or death by signal; a message naming what and where.

/// Section `i`'s (offset, bytes) in a dataset file's header.
pub fn section(bytes: &[u8], i: usize) -> (usize, usize) {
    let at = 56 + 16 * i;
    let word = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes")) as usize;
    (word(at), word(at + 8))
}

/// A generated dataset large enough that training maps it for a while, and a run on it that
/// goes on until stopped.
pub fn long_run(d: &Path, extra: &[&str]) -> (std::path::PathBuf, std::process::Child) {
    let data = d.join("big.pgd");
    let s = data.to_str().expect("utf-8");
    ok(&["data", "gen", "sparse", s, "--rows", "100000", "--features", "5000", "--nnz-per-row", "20"]);
    let run = d.join("run");
    let child = spawn_train(s, run.to_str().expect("utf-8"), "100000000", extra);
    wait_for_file(&run.join("metrics").join("rank-1.jsonl"));
    (data, child)
}

/// Waits for `child` at most `limit`; its output and how long it took.
pub fn finish_within(
    child: std::process::Child,
    limit: std::time::Duration,
) -> (Output, std::time::Duration) {
    let started = std::time::Instant::now();
    let pid = child.id();
    // Kills the child only if it is still running at the limit: told it ended otherwise, so that
    // it never signals a process ID that was reused since.
    let (ended, ends) = std::sync::mpsc::channel::<()>();
    let watcher = std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = ends.recv_timeout(limit) {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    });
    let out = child.wait_with_output().expect("wait");
    let took = started.elapsed();
    drop(ended);
    watcher.join().expect("watcher");
    assert!(took < limit, "still running after {limit:?}: killed");
    (out, took)
}

/// Overwrites part of the indices of a mapped dataset in place with indices far beyond its
/// features: the kernels index out of bounds on a compute thread.
pub fn scribble_indices(data: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let head = std::fs::read(data).expect("read")[..192].to_vec();
    let (at, len) = section(&head, 1);
    let mut f = std::fs::OpenOptions::new().write(true).open(data).expect("open");
    f.seek(SeekFrom::Start((at + len / 2) as u64)).expect("seek");
    f.write_all(&[0xff; 1 << 16]).expect("write");
}
