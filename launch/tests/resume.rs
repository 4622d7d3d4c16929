//! Stopping and resuming `peregrine train`: a killed run resumes from its last checkpoint, a
//! signal stops it at one, the watchdog, timed checkpoints, exit 75 when the stop cannot be
//! reached, and checkpoints that are refused.

use std::path::Path;
use std::process::Command;

#[path = "support/cli_common.rs"]
mod common;
use common::{finish_within, ok, peregrine, scratch, signal, spawn_train, text, wait_for_file};

#[path = "support/models.rs"]
mod models;
use models::model_distance;

#[path = "support/checkpoints.rs"]
mod checkpoints;

#[test]
fn a_killed_run_resumes_from_its_last_checkpoint_with_any_rank_count() {
    let t = scratch("resume");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
    let train = |run: &str, ranks: &str| {
        let r = s(run);
        let args =
            ["train", "--model", "lr", "--data", &s("d.pgd"), "--iterations", "3000", "--batch", "512"];
        let more =
            ["--chunk", "64", "--checkpoint-every", "100", "--ranks", ranks, "--run-dir", &r, "--quiet"];
        Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).args(more).spawn().expect("start peregrine")
    };
    let status = train("full", "2").wait().expect("wait");
    assert!(status.success());
    for ranks in ["2", "1"] {
        let run = format!("cut-{ranks}");
        // SIGKILL (every rank: they are threads of this process) once a checkpoint is there.
        let mut child = train(&run, "2");
        let ckpt = d.join(&run).join("checkpoint.safetensors");
        let start = std::time::Instant::now();
        while !ckpt.exists() {
            assert!(start.elapsed().as_secs() < 60, "no checkpoint written");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert!(!d.join(&run).join("summary.json").exists(), "the run finished before it was killed");
        let out = peregrine(&[
            "train",
            "--model",
            "lr",
            "--data",
            &s("d.pgd"),
            "--iterations",
            "3000",
            "--batch",
            "512",
            "--chunk",
            "64",
            "--checkpoint-every",
            "100",
            "--ranks",
            ranks,
            "--run-dir",
            &s(&run),
            "--quiet",
        ]);
        let (_, stderr) = text(&out);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("resuming from iteration"), "{stderr}");
        let dist = model_distance(&d.join("full/model.safetensors"), &d.join(&run).join("model.safetensors"));
        // Two ranks: only the order of sums differs; one rank: as the cross-rank tests.
        let tolerance = if ranks == "2" { 1e-5 } else { 1e-4 };
        assert!(dist <= tolerance, "resumed on {ranks} ranks: {dist:e} from the uninterrupted model");
        let summary = std::fs::read_to_string(d.join(&run).join("summary.json")).expect("summary");
        assert!(summary.contains("\"iterations\": 3000"), "{summary}");
        // Rank 0's metrics: every iteration once, in order (the killed part after the checkpoint
        // and any line cut short are dropped before the resumed run appends).
        let metrics = std::fs::read_to_string(d.join(&run).join("metrics/rank-0.jsonl")).expect("metrics");
        let iters: Vec<u64> = metrics
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("a whole JSON line")["iter"]
                    .as_u64()
                    .expect("iter")
            })
            .collect();
        assert!(
            iters.iter().copied().eq(0..3000),
            "{} lines, first {:?}",
            iters.len(),
            &iters[..5.min(iters.len())]
        );
    }
    // A finished run is not overwritten; --force starts again; another configuration's
    // checkpoint is refused.
    let again = |run: &str, extra: &[&str]| {
        let args = [
            "train",
            "--model",
            "lr",
            "--data",
            &s("d.pgd"),
            "--iterations",
            "300",
            "--ranks",
            "1",
            "--run-dir",
            run,
            "-q",
        ];
        peregrine(&[&args[..], extra].concat())
    };
    let out = again(&s("full"), &["--batch", "512", "--chunk", "64"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(
        text(&out).1.contains("holds a finished run") && text(&out).1.contains("--force"),
        "{:?}",
        text(&out)
    );
    let out = again(&s("full"), &["--force"]);
    assert!(out.status.success(), "{:?}", text(&out));
    std::fs::remove_file(d.join("full/summary.json")).expect("unfinish");
    let out = again(&s("full"), &["--lr", "0.5"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("checkpoint of another configuration"), "{:?}", text(&out));
}

#[test]
fn a_signal_stops_training_at_a_checkpoint_and_the_rerun_resumes() {
    let t = scratch("signal");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
    let args = |run: &str| {
        [
            "train",
            "--model",
            "lr",
            "--data",
            &s("d.pgd"),
            "--iterations",
            "4000",
            "--batch",
            "512",
            "--chunk",
            "64",
            "--scheme",
            "ssp:2",
            "--ranks",
            "3",
            "--run-dir",
            &s(run),
            "--quiet",
        ]
        .map(str::to_owned)
    };
    let child = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(args("run"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start");
    let metrics = d.join("run/metrics/rank-0.jsonl");
    let start = std::time::Instant::now();
    while std::fs::read_to_string(&metrics).map_or(0, |m| m.lines().count()) < 100 {
        assert!(start.elapsed().as_secs() < 60, "no progress");
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let status = Command::new("kill").args(["-USR1", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(
        stderr.contains("stopped on a signal; state saved in") && stderr.contains("checkpoint.safetensors"),
        "{stderr}"
    );
    assert!(!d.join("run/summary.json").exists());
    let out = peregrine(&args("run").iter().map(String::as_str).collect::<Vec<_>>());
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resuming from iteration"), "{stderr}");
    let summary = std::fs::read_to_string(d.join("run/summary.json")).expect("summary");
    assert!(summary.contains("\"iterations\": 4000"), "{summary}");
}

#[test]
fn the_watchdog_ends_a_job_whose_rank_stops_progressing_and_names_the_rank() {
    let t = scratch("watchdog");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
    // Rank 1 of 3 computes at a ten-millionth of its speed: one chunk takes hours.
    let started = std::time::Instant::now();
    let child = spawn_train(
        &s("d.pgd"),
        &s("r"),
        "3000",
        &["--ranks", "3", "--straggler", "persistent:rank=1,speed=1e-7", "--watchdog", "1.5"],
    );
    let out = child.wait_with_output().expect("wait");
    let took = started.elapsed();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(took.as_secs() < 30, "ended after {took:?}");
    assert!(stderr.contains("watchdog: rank") && stderr.contains("no progress for"), "{stderr}");
    // Either rank 1's own watchdog (stuck computing) or another rank's (waiting for it) spoke.
    assert!(
        stderr.contains("rank 1 itself looks stuck") || stderr.contains("rank 1 looks stuck"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().filter(|l| l.contains("watchdog:")).count(), 1, "{stderr}");
    // A limit that is not a number of seconds is refused before anything starts.
    for bad in ["-1", "nan", "inf"] {
        let flag = format!("--watchdog={bad}");
        let out = peregrine(&["train", "--model", "lr", "--data", &s("d.pgd"), &flag]);
        assert_eq!(out.status.code(), Some(2), "--watchdog {bad}: {:?}", text(&out));
        assert!(text(&out).1.contains("--watchdog must be 0 or more seconds"), "{:?}", text(&out));
    }
}

#[test]
fn a_job_stopped_whole_and_continued_goes_on_without_the_watchdog_firing() {
    let t = scratch("suspend");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
    let child = spawn_train(&s("d.pgd"), &s("r"), "1000000", &["--ranks", "2", "--watchdog", "1"]);
    wait_for_file(&d.join("r/checkpoint.safetensors"));
    // As `scontrol suspend` does: every rank stopped (here one process), for longer than the
    // watchdog's limit, then continued.
    signal(child.id(), "-STOP");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    signal(child.id(), "-CONT");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // Still training: stopped on request at the next checkpoint instead.
    signal(child.id(), "-USR1");
    let out = child.wait_with_output().expect("wait");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(!stderr.contains("watchdog"), "{stderr}");
}

#[test]
fn timed_checkpoints_are_taken_and_a_changed_interval_still_resumes() {
    let t = scratch("timed");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
    let train = |extra: &[&str]| {
        let base =
            ["train", "--model", "lr", "--data", &s("d.pgd"), "--iterations", "3000", "--run-dir", &s("r")];
        peregrine(&[&base[..], &["--ranks", "2", "--checkpoint-every", "0", "-q"], extra].concat())
    };
    let out = train(&["--checkpoint-seconds", "0.05"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("r/summary.json")).expect("summary"))
            .expect("json");
    let taken = summary["checkpoints"].as_u64().expect("checkpoints");
    let train_s = summary["train_seconds"].as_f64().expect("train_seconds");
    // Never more often than asked; and about as often (each comes an agreement and a checkpoint
    // after its time: on a loaded machine tens of milliseconds).
    let asked = train_s / 0.05;
    assert!(
        taken as f64 <= asked + 1.0 && taken as f64 >= 0.3 * asked && taken >= 3,
        "{taken} in {train_s} s"
    );
    // The interval is not part of what a run computes: a run resumed with another is not refused.
    std::fs::remove_file(d.join("r/summary.json")).expect("rm summary");
    let out = train(&["--checkpoint-seconds", "10", "--watchdog", "100"]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(text(&out).1.contains("resuming from iteration"), "{:?}", text(&out));
}

#[test]
fn a_rank_that_cannot_reach_the_stop_exits_75_even_without_the_watchdog() {
    let t = scratch("stop-deadline");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
    // Rank 1 computes at a ten-millionth of its speed: it never reaches a checkpoint.
    let extra = ["--ranks", "3", "--straggler", "persistent:rank=1,speed=1e-7", "--watchdog", "0"];
    let child = spawn_train(&s("d.pgd"), &s("r"), "3000", &extra);
    wait_for_file(&d.join("r").join("metrics").join("rank-1.jsonl"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    signal(child.id(), "-TERM");
    let (out, took) = finish_within(child, std::time::Duration::from_secs(60));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    // The watchdog's 15 s once asked to stop, and the exit.
    assert!(took.as_secs_f64() < 30.0, "{took:?}");
    assert!(
        stderr.contains("once asked to stop") && stderr.contains("the last checkpoint stands"),
        "{stderr}"
    );
}

/// A checkpoint says how its parameter vector is ordered where that is not each block as named
/// (the MLP's layers' weights a row per input; MF's rows by strata bands); one that does not
/// (written before that order) is refused with a message naming both orders instead of being
/// read as another model.
#[test]
fn a_checkpoint_of_another_parameter_order_is_refused() {
    let t = scratch("order");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "400", "--features", "6", "--classes", "3"]);
    ok(&["data", "gen", "ratings", &s("r.pgd"), "--ratings", "5000", "--users", "60", "--items", "50"]);
    // The MLP's weights `in x out`; MF's rows by strata bands (4 x 4 blocks of 64 ratings fit).
    let mlp = ["--model", "mlp", "--hidden", "5", "--data", &s("d.pgd")].map(str::to_owned);
    let mf = ["--model", "mf", "--k", "4", "--data", &s("r.pgd"), "--batch", "256", "--chunk", "64"]
        .map(str::to_owned);
    for (model, order) in [(&mlp[..], "weights in x out"), (&mf[..], "rows by strata bands")] {
        let run = s(&format!("run-{}", model[1]));
        let mut args: Vec<&str> = vec!["train"];
        args.extend(model.iter().map(String::as_str));
        args.extend([
            "--iterations",
            "10",
            "--checkpoint-every",
            "5",
            "--ranks",
            "2",
            "--run-dir",
            &run,
            "-q",
        ]);
        ok(&args);
        let checkpoint = Path::new(&run).join("checkpoint.safetensors");
        let summary = Path::new(&run).join("summary.json");
        std::fs::remove_file(&summary).expect("unfinish");
        let (_, stderr) = ok(&args);
        assert!(stderr.contains("resuming from iteration"), "{order}: {stderr}");
        // The same checkpoint without its order, as a version that ordered each block as named
        // wrote it.
        std::fs::remove_file(&summary).expect("unfinish");
        checkpoints::reseal(&checkpoint, |meta, _| {
            assert_eq!(meta.remove("param_order").as_deref(), Some(order));
        });
        let out = peregrine(&args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{order}: {stderr}");
        assert!(
            stderr.contains("checkpoint.safetensors")
                && stderr.contains("ordered each block as named")
                && stderr.contains(&format!("`{order}`"))
                && stderr.contains("--force"),
            "{stderr}"
        );
    }
}
