//! A run and its directory: one run at a time in a directory, a resume on the same data only
//! (whatever its path) naming the keys that differ, `--force` and a fresh start leaving nothing of
//! the earlier run, and, under `mpirun`, ranks that would run different jobs refused at start.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_peregrine"))
}

fn peregrine_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(exe()).args(args).current_dir(dir).output().expect("run peregrine")
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
    tempfile::Builder::new().prefix(&format!("peregrine-runs-{name}-")).tempdir().expect("scratch dir")
}

/// A small sparse dataset `name` in `dir`, generated with `seed`.
fn sparse(dir: &Path, name: &str, seed: &str) {
    ok(dir, &["data", "gen", "sparse", name, "--rows", "2000", "--features", "50", "--seed", seed]);
}

const TRAIN: [&str; 10] =
    ["train", "--model", "lr", "--ranks", "2", "-q", "--iterations", "40", "--checkpoint-every", "10"];

fn names(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .map(|e| e.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    n.sort();
    n
}

#[test]
fn a_second_run_into_a_run_directory_is_refused_at_once_naming_the_first() {
    let d_tmp = scratch("lock");
    let d = d_tmp.path();
    sparse(d, "d.pgd", "1");
    // A run that lasts: synthetic chunks of 5 ms, 4 a rank an iteration, 2,000 iterations.
    let long = [
        "train",
        "--model",
        "synthetic",
        "--chunk-cost",
        "5ms",
        "--data",
        "d.pgd",
        "--ranks",
        "2",
        "--batch",
        "512",
        "--chunk",
        "64",
        "--iterations",
        "2000",
        "-q",
        "--run-dir",
        "run",
    ];
    let mut first = Command::new(exe()).args(long).current_dir(d).spawn().expect("first run");
    let lock = d.join("run/.lock");
    let start = Instant::now();
    while !std::fs::read_to_string(&lock).is_ok_and(|t| t.contains("pid=")) {
        assert!(start.elapsed() < Duration::from_secs(30), "the first run took no lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    let refused_at = Instant::now();
    let second = peregrine_in(d, &long);
    let took = refused_at.elapsed();
    let still_running = first.try_wait().expect("try_wait").is_none();
    let _ = first.kill();
    let _ = first.wait();
    assert!(still_running, "the first run ended before the second was tried");
    assert_eq!(second.status.code(), Some(2), "{}", text(&second));
    let msg = text(&second);
    assert!(msg.contains(&format!("run is in use by another run (process {} on ", first.id())), "{msg}");
    assert!(took < Duration::from_secs(10), "refused after {took:?}");
    // Once the first is gone (killed: the kernel dropped its lock), the directory is free again.
    let mut again: Vec<&str> = long.to_vec();
    let at = again.iter().position(|a| *a == "2000").expect("iterations");
    again[at] = "3";
    again.push("--force");
    ok(d, &again);
}

#[test]
fn a_resume_compares_the_datas_identity_not_its_path_and_names_the_keys_that_differ() {
    let d_tmp = scratch("resume");
    let d = d_tmp.path();
    sparse(d, "d.pgd", "1");
    sparse(d, "other.pgd", "2");
    let run = |cwd: &Path, data: &str, extra: &[&str]| {
        let run_dir = d.join("run");
        let args: Vec<&str> = TRAIN
            .iter()
            .copied()
            .chain(["--data", data, "--run-dir", run_dir.to_str().expect("utf-8")])
            .chain(extra.iter().copied())
            .collect();
        peregrine_in(cwd, &args)
    };
    let first = run(d, "d.pgd", &[]);
    assert!(first.status.success(), "{}", text(&first));
    // A run stopped after its last checkpoint (as a killed one would be), to be resumed.
    std::fs::remove_file(d.join("run/summary.json")).expect("summary");

    // Another file at the same path: refused, naming the data.
    std::fs::rename(d.join("d.pgd"), d.join("d.orig.pgd")).expect("rename");
    std::fs::copy(d.join("other.pgd"), d.join("d.pgd")).expect("copy");
    let other = run(d, "d.pgd", &[]);
    assert_eq!(other.status.code(), Some(2), "{}", text(&other));
    assert!(text(&other).contains("`data` is another dataset (then "), "{}", text(&other));
    std::fs::rename(d.join("d.orig.pgd"), d.join("d.pgd")).expect("rename back");

    // Another configuration: refused, naming each key with its values.
    let changed = run(d, "d.pgd", &["--lr", "0.25", "--seed", "9"]);
    assert_eq!(changed.status.code(), Some(2), "{}", text(&changed));
    let msg = text(&changed);
    assert!(msg.contains("is 0.25 now") && msg.contains("`seed` was 1, is 9 now"), "{msg}");
    assert!(!msg.contains("`batch`"), "{msg}");

    // The same file by another path, from another directory: resumed.
    let elsewhere = scratch("resume-cwd");
    let absolute = d.join("d.pgd");
    let resumed = run(elsewhere.path(), absolute.to_str().expect("utf-8"), &[]);
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert!(text(&resumed).contains("resuming from iteration"), "{}", text(&resumed));
}

#[test]
fn force_and_a_fresh_start_leave_nothing_of_the_earlier_run_but_other_files() {
    let d_tmp = scratch("force");
    let d = d_tmp.path();
    sparse(d, "d.pgd", "1");
    let run = |ranks: &str, extra: &[&str]| {
        let base =
            ["train", "--model", "lr", "--data", "d.pgd", "--iterations", "20", "-q", "--run-dir", "run"];
        let args: Vec<&str> =
            base.iter().copied().chain(["--ranks", ranks]).chain(extra.iter().copied()).collect();
        ok(d, &args)
    };
    run("4", &["--trace", "--npy"]);
    assert_eq!(names(&d.join("run/metrics")).len(), 4);
    assert!(d.join("run/trace.json").exists() && d.join("run/model").is_dir());
    std::fs::write(d.join("run/notes.txt"), "mine").expect("write");
    run("2", &["--force"]);
    assert_eq!(names(&d.join("run/metrics")), ["rank-0.jsonl", "rank-1.jsonl"]);
    assert!(!d.join("run/trace.json").exists() && !d.join("run/model").exists());
    assert_eq!(std::fs::read_to_string(d.join("run/notes.txt")).expect("kept"), "mine");

    // A run stopped before its first checkpoint (metrics of 3 ranks, no checkpoint, no summary):
    // the next run starts afresh, without the stopped run's metrics.
    for f in ["summary.json", "checkpoint.safetensors", "checkpoint.prev.safetensors"] {
        let _ = std::fs::remove_file(d.join("run").join(f));
    }
    std::fs::write(d.join("run/metrics/rank-2.jsonl"), "{\"iter\":0}\n").expect("write");
    run("2", &[]);
    assert_eq!(names(&d.join("run/metrics")), ["rank-0.jsonl", "rank-1.jsonl"]);
}

#[test]
fn a_batch_larger_than_the_data_is_recorded_as_it_runs() {
    let d_tmp = scratch("batch");
    let d = d_tmp.path();
    sparse(d, "d.pgd", "1");
    let out = ok(
        d,
        &[
            "train",
            "--model",
            "lr",
            "--data",
            "d.pgd",
            "--ranks",
            "2",
            "--iterations",
            "3",
            "-q",
            "--batch",
            "5000",
            "--run-dir",
            "run",
        ],
    );
    assert!(text(&out).contains("--batch 5000 is more than the 2000 training rows"), "{}", text(&out));
    let config = std::fs::read_to_string(d.join("run/config.toml")).expect("config");
    assert!(config.lines().any(|l| l == "batch = 2000"), "{config}");
}

#[cfg(feature = "mpi")]
mod mpi {
    use super::*;

    /// `mpirun -n 1 peregrine A : -n 1 peregrine B` (an MPMD launch: each rank its own command
    /// line), with the environment OpenMPI needs here.
    fn mpmd(dir: &Path, a: &[String], b: &[String]) -> (Output, Duration) {
        let reference = peregrine_tests::mpirun_command(1, exe(), &[]);
        let mut cmd = Command::new(reference.get_program());
        for (k, v) in reference.get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        cmd.arg("-n").arg("1").arg(exe()).args(a).arg(":").arg("-n").arg("1").arg(exe()).args(b);
        let start = Instant::now();
        let out = cmd.current_dir(dir).output().expect("mpirun");
        (out, start.elapsed())
    }

    #[test]
    fn ranks_that_would_run_different_jobs_are_refused_at_start_naming_the_key_and_the_ranks() {
        let d_tmp = scratch("mpmd");
        let d = d_tmp.path();
        sparse(d, "d.pgd", "1");
        sparse(d, "e.pgd", "2");
        let base = |run: &str| -> Vec<String> {
            ["train", "--model", "lr", "--data", "d.pgd", "--iterations", "30", "-q", "--run-dir", run]
                .iter()
                .map(|s| (*s).to_owned())
                .collect()
        };
        let with = |run: &str, extra: &[&str]| -> Vec<String> {
            let mut a = base(run);
            a.extend(extra.iter().map(|s| (*s).to_owned()));
            a
        };
        let cases: [(&str, Vec<String>, Vec<String>); 8] = [
            ("lr", with("r1", &["--lr", "0.5"]), with("r1", &["--lr", "0.25"])),
            ("seed", with("r2", &["--seed", "1"]), with("r2", &["--seed", "2"])),
            ("optimizer", with("r3", &["--optimizer", "sgd"]), with("r3", &["--optimizer", "adam"])),
            ("scheme", with("r4", &["--scheme", "bsp"]), with("r4", &["--scheme", "ssp:2"])),
            ("batch", with("r5", &["--batch", "128"]), with("r5", &["--batch", "256"])),
            ("iterations", base("r6"), {
                let mut b = base("r6");
                b[6] = "31".into();
                b
            }),
            ("run directory", base("r7a"), base("r7b")),
            ("data", base("r8"), {
                let mut b = base("r8");
                b[4] = "e.pgd".into();
                b
            }),
        ];
        for (key, a, b) in cases {
            let (out, took) = mpmd(d, &a, &b);
            let msg = text(&out);
            assert_eq!(out.status.code(), Some(2), "{key}: {msg}");
            assert!(took < Duration::from_secs(20), "{key}: refused after {took:?}");
            assert!(msg.contains("the ranks do not run the same job"), "{key}: {msg}");
            // A line names the key (with the keys hashed into its slot, if any) and each rank's value.
            let named = msg.lines().any(|l| {
                l.strip_prefix("  ")
                    .and_then(|l| l.split(": ").next())
                    .is_some_and(|names| names.split(", ").any(|n| n == key))
            });
            assert!(named && msg.contains(" on rank 0; ") && msg.contains(" on rank 1"), "{key}: {msg}");
        }
        // Nothing was written: no run directory of any refused job.
        for run in ["r1", "r2", "r3", "r4", "r5", "r6", "r7a", "r7b", "r8"] {
            assert!(!d.join(run).exists(), "{run} was left behind");
        }
        // The same job on both: it runs.
        let (out, _) = mpmd(d, &with("same", &[]), &with("same", &[]));
        assert!(out.status.success(), "{}", text(&out));
    }

    /// A checkpoint that only one rank sees (run directories on node-local disks) is a
    /// difference, not a deadlock.
    #[test]
    fn ranks_that_see_different_checkpoints_are_refused() {
        let d_tmp = scratch("mpmd-ckpt");
        let d = d_tmp.path();
        sparse(d, "d.pgd", "1");
        let args = |run: &str| -> Vec<String> {
            [
                "train",
                "--model",
                "lr",
                "--data",
                "d.pgd",
                "--iterations",
                "30",
                "--checkpoint-every",
                "10",
                "-q",
            ]
            .iter()
            .map(|s| (*s).to_owned())
            .chain(["--run-dir".to_owned(), run.to_owned()])
            .collect()
        };
        ok(d, &args("a").iter().map(String::as_str).chain(["--ranks", "1"]).collect::<Vec<_>>());
        std::fs::remove_file(d.join("a/summary.json")).expect("summary");
        // Rank 0's run directory holds a checkpoint, rank 1's none (as if each were on its
        // node's own disk): besides the directories, the checkpoints differ.
        std::fs::create_dir(d.join("b")).expect("mkdir");
        let (out, _) = mpmd(d, &args("a"), &args("b"));
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains("  checkpoint: "), "{}", text(&out));
    }
}
