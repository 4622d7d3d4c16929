//! The `peregrine` binary as a user runs it: help, bad arguments, the conformance suite and the
//! benchmarks on local ranks, and the commands under `mpirun` when built with `--features mpi`.
//! Each command's own tests on local threads are in `data.rs`, `train.rs`, `predict.rs`,
//! `resume.rs` and `experiment.rs`.

use std::process::Command;

#[path = "support/cli_common.rs"]
mod common;
#[cfg(feature = "mpi")]
use common::{finish_within, lr_train, scribble_indices, section, signal, train_data, wait_for_file};
use common::{ok, peregrine, scratch, text};

#[cfg(feature = "mpi")]
#[path = "support/models.rs"]
mod models;
#[cfg(feature = "mpi")]
use models::model_distance;

#[test]
fn help_lists_the_commands() {
    let out = peregrine(&["--help"]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    for word in ["conformance", "bench", "mpirun -n 4 peregrine conformance"] {
        assert!(stdout.contains(word), "--help lacks `{word}`:\n{stdout}");
    }
}

#[test]
fn conformance_passes_on_local_ranks() {
    let out = peregrine(&["conformance", "--ranks", "3", "--tickets", "2000"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("conformance: all cases passed on 3 ranks (local)"), "{stdout}");
    let cases = peregrine_transport::conformance::CASES.len();
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok ")).count(), cases, "{stdout}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["conformance", "--ranks", "0"][..],
        &["conformance", "--backend", "tcp"],
        &["bench", "rma", "--min-size", "12"],
        &["bench", "rma", "--max-size", "4G"],
        &["bench", "rma", "--trials", "0"],
    ] {
        let out = peregrine(args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("error:"), "{args:?}: {stderr}");
    }
    let out = peregrine(&["bench", "rma", "--backend", "local", "--min-size", "64", "--max-size", "8"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("--min-size 64 is larger than --max-size 8"));
}

#[test]
fn a_reader_that_closes_the_output_ends_the_job_quietly() {
    // `peregrine bench rma | head -1`: the reader goes away after the first line, and the next
    // print fails (Rust ignores SIGPIPE). The job ends with the status of a tool that SIGPIPE
    // ended, without calling it a bug. (The run takes half a second: it is still printing when
    // the reader goes.)
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["bench", "rma", "--backend", "local", "--max-size", "1K", "--trials", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run peregrine");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("a first line");
    assert!(first.starts_with("# peregrine bench rma"), "{first}");
    let out = child.wait_with_output().expect("wait");
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[cfg(not(feature = "mpi"))]
#[test]
fn asking_for_mpi_without_the_feature_names_the_feature() {
    let out = peregrine(&["conformance", "--backend", "mpi"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr.contains("rebuild with `--features mpi`"), "{stderr}");
    // Started by an MPI launcher, `--backend auto` asks for MPI too.
    let out = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["conformance"])
        .env("PMIX_RANK", "0")
        .output()
        .expect("run peregrine");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("rebuild with `--features mpi`"), "{:?}", text(&out));
}

/// The start-up check against a CPU that lacks AVX2 and FMA (the feature set injected): the
/// binary stops before anything else, naming them, with exit 132; with every feature it was
/// compiled for, it runs.
#[cfg(target_arch = "x86_64")]
#[test]
fn a_cpu_without_the_compiled_instruction_set_is_named_at_start() {
    let run = |features: &str| {
        Command::new(env!("CARGO_BIN_EXE_peregrine"))
            .args(["train", "--model", "lr", "--data", "/nonexistent.pgd"])
            .env("PEREGRINE_ASSUME_CPU_FEATURES", features)
            .output()
            .expect("run peregrine")
    };
    use peregrine_kernels::cpu;
    let compiled: Vec<&str> = cpu::features().iter().filter(|f| f.compiled).map(|f| f.name).collect();
    // The test binary is built with the same flags as `peregrine` (x86-64-v3 unless overridden).
    assert!(compiled.contains(&"avx2") && compiled.contains(&"fma"), "{compiled:?}");
    let below_v3 = ["sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cmpxchg16b", "avx"];
    let lacking: Vec<&str> = compiled.iter().copied().filter(|f| !below_v3.contains(f)).collect();
    let out = run(&below_v3.join(","));
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(132), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    let expected = format!("peregrine: error: this binary was compiled for {}", cpu::compiled_level());
    assert!(
        stderr.starts_with(&expected)
            && stderr.contains(&format!("this CPU lacks {}:", lacking.join(", ")))
            && stderr.contains("target-cpu=native"),
        "{stderr}"
    );
    // Everything the build needs: the check passes and the command runs (and fails on its data).
    let out = run(&compiled.join(","));
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("/nonexistent.pgd"), "{:?}", text(&out));
}

#[test]
fn rma_bench_prints_every_operation_on_local_ranks() {
    let out = peregrine(&[
        "bench",
        "rma",
        "--backend",
        "local",
        "--max-size",
        "64",
        "--iters",
        "200",
        "--trials",
        "1",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    for op in ["get", "put", "accumulate", "fetch_add"] {
        assert!(stdout.lines().any(|l| l.starts_with(op)), "no `{op}` line:\n{stdout}");
    }
    // 4 latency lines + 3 operations x sizes 8..64 (4 sizes).
    let rows = stdout.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(rows, 4 + 3 * 4, "{stdout}");
}

#[cfg(feature = "mpi")]
mod mpi {
    use peregrine_tests::{assert_success, mpirun_command, mpirun_n};
    use std::path::Path;

    #[test]
    fn a_rank_killed_ends_the_job_and_the_rerun_resumes_from_the_last_checkpoint() {
        let d_tmp = super::scratch("mpi-kill");
        let d = d_tmp.path();
        let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
        super::ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
        let args = |run: &str| super::lr_train(&s("d.pgd"), &s(run), "3000", &[]);
        fn strs(a: &[String]) -> Vec<&str> {
            a.iter().map(String::as_str).collect()
        }
        let full = mpirun_n(2, exe(), &strs(&args("full")));
        assert_success("mpirun -n 2 peregrine train", &full);
        let child = spawn_mpirun(&args("cut"));
        let ckpt = d.join("cut/checkpoint.safetensors");
        let start = std::time::Instant::now();
        while !ckpt.exists() {
            assert!(start.elapsed().as_secs() < 120, "no checkpoint written");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        // SIGKILL one rank (a process whose command line names this run directory).
        let pids = std::process::Command::new("pgrep").args(["-f", &s("cut")]).output().expect("pgrep");
        let pids: Vec<String> =
            String::from_utf8_lossy(&pids.stdout).split_whitespace().map(str::to_owned).collect();
        let victim = pids.iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "peregrine")
        });
        let victim = victim.unwrap_or_else(|| panic!("no rank among {pids:?}"));
        let killed = std::time::Instant::now();
        assert!(std::process::Command::new("kill").args(["-9", victim]).status().expect("kill").success());
        let out = child.wait_with_output().expect("wait");
        let ended = killed.elapsed();
        // The launcher names the process and the signal (OpenMPI on standard error: "process
        // rank 1 ... exited on signal 9"; MPICH on standard output, by PID: "PID 123 RUNNING AT
        // ... Killed (signal 9)").
        let stderr = all_output(&out);
        assert!(!out.status.success());
        assert!(ended.as_secs() <= 10, "the job ended {ended:?} after a rank was killed");
        let lower = stderr.to_lowercase();
        assert!((lower.contains("rank") || lower.contains("pid")) && lower.contains("signal 9"), "{stderr}");
        assert!(!d.join("cut/summary.json").exists(), "the run finished before it was killed");
        let again = mpirun_n(2, exe(), &strs(&args("cut")));
        assert_success("mpirun -n 2 peregrine train (resumed)", &again);
        assert!(String::from_utf8_lossy(&again.stderr).contains("resuming from iteration"));
        let dist = super::model_distance(&d.join("full/model.safetensors"), &d.join("cut/model.safetensors"));
        assert!(dist <= 1e-5, "{dist:e} from the uninterrupted model");
    }

    /// `peregrine train` under OpenMPI's UCX one-sided component (TCP transport, as between nodes
    /// without RDMA): BSP gives the model the default components (`sm,pt2pt`) give, and meta.json
    /// records which components each rank used and why.
    #[test]
    fn training_over_ucx_gives_the_model_of_the_default_components() {
        let d_tmp = super::scratch("mpi-ucx");
        let d = d_tmp.path();
        let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
        super::ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "4000", "--features", "300"]);
        let args = |run: &str| super::lr_train(&s("d.pgd"), &s(run), "200", &["--scheme", "bsp"]);
        let default_args = args("default");
        let argv: Vec<&str> = default_args.iter().map(String::as_str).collect();
        let mut cmd = mpirun_command(2, exe(), &argv);
        cmd.env_remove("OMPI_MCA_osc");
        assert_success("mpirun -n 2 peregrine train (default components)", &cmd.output().expect("mpirun"));
        let ucx_args = args("ucx");
        let argv: Vec<&str> = ucx_args.iter().map(String::as_str).collect();
        let mut cmd = mpirun_command(2, exe(), &argv);
        let out = peregrine_tests::with_ucx(&mut cmd, "tcp,self").output().expect("mpirun");
        assert_success("UCX_TLS=tcp,self mpirun -n 2 peregrine train", &out);
        let dist =
            super::model_distance(&d.join("default/model.safetensors"), &d.join("ucx/model.safetensors"));
        assert!(
            f64::from(dist) <= peregrine_tests::training::BSP_TOLERANCE,
            "{dist:e} between the components' models"
        );
        let meta = |run: &str| std::fs::read_to_string(d.join(run).join("meta.json")).expect("meta.json");
        let (default, ucx) = (meta("default"), meta("ucx"));
        let components = |m: &str| m.matches("\"mpi_components\"").count();
        // The components are OpenMPI's (MPICH ignores OMPI_* variables; its leg checks the model).
        if default.contains("\"mpi_library\": \"Open MPI") {
            assert_eq!((components(&default), components(&ucx)), (2, 2), "one per rank:\n{default}\n{ucx}");
            assert!(default.contains("osc=sm,pt2pt (no RDMA device on this host)"), "{default}");
            assert!(ucx.contains("osc=ucx (OMPI_MCA_osc set by the user)"), "{ucx}");
        } else {
            assert_eq!((components(&default), components(&ucx)), (0, 0), "{default}\n{ucx}");
            assert!(default.contains("\"mpi_library\": \"MPICH"), "{default}");
        }
        assert!(
            default.contains("\"rdma_devices\": []") && default.contains("\"simd\": \"compiled for"),
            "{default}"
        );
    }

    /// The PID of MPI rank `rank` among the `peregrine` processes whose command line has `pattern`
    /// (OpenMPI sets `OMPI_COMM_WORLD_RANK`, MPICH's Hydra `PMI_RANK`).
    fn rank_pid(pattern: &str, rank: usize) -> u32 {
        let start = std::time::Instant::now();
        loop {
            let out = std::process::Command::new("pgrep").args(["-f", pattern]).output().expect("pgrep");
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
                let env = String::from_utf8_lossy(&env);
                let is = |v: &str| env.split('\0').any(|kv| kv == format!("{v}={rank}"));
                if comm.trim() == "peregrine" && (is("OMPI_COMM_WORLD_RANK") || is("PMI_RANK")) {
                    return pid.parse().expect("pid");
                }
            }
            assert!(start.elapsed().as_secs() < 30, "no process of rank {rank} matching {pattern}");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn a_stopped_rank_is_named_by_the_watchdog_and_the_rerun_resumes() {
        let d_tmp = super::scratch("mpi-watchdog");
        let d = d_tmp.path();
        let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
        super::ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"]);
        let args = super::lr_train(&s("d.pgd"), &s("stopped"), "3000", &["--watchdog", "3"]);
        let child = spawn_mpirun(&args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        super::wait_for_file(&d.join("stopped/checkpoint.safetensors"));
        // Rank 1 stops (SIGSTOP: alive, holding its share of the windows, never answering).
        let victim = rank_pid(&s("stopped"), 1);
        super::signal(victim, "-STOP");
        let stopped = std::time::Instant::now();
        let out = child.wait_with_output().expect("wait");
        let ended = stopped.elapsed();
        // Whatever is left of the victim (the launcher may have sent it a signal it cannot take
        // while stopped).
        let _ = std::process::Command::new("kill").args(["-CONT", &victim.to_string()]).output();
        let _ = std::process::Command::new("kill").args(["-KILL", &victim.to_string()]).output();
        let all = all_output(&out);
        assert!(!out.status.success(), "{all}");
        assert!(ended.as_secs() <= 3 + 10, "the job ended {ended:?} after rank 1 stopped:\n{all}");
        assert!(all.contains("watchdog: rank 0 of 2 made no progress"), "{all}");
        assert!(all.contains("rank 1 looks stuck"), "{all}");
        assert!(!d.join("stopped/summary.json").exists(), "the run finished before rank 1 stopped");
        let again = mpirun_n(2, exe(), &args);
        assert_success("mpirun -n 2 peregrine train (resumed after the watchdog)", &again);
        assert!(String::from_utf8_lossy(&again.stderr).contains("resuming from iteration"));
    }

    fn exe() -> &'static Path {
        Path::new(env!("CARGO_BIN_EXE_peregrine"))
    }

    /// `long_run` (support/cli_common.rs) under `mpirun -n 2`.
    fn long_run(d: &Path) -> (std::path::PathBuf, std::process::Child) {
        let data = d.join("big.pgd");
        let s = data.to_str().expect("utf-8");
        super::ok(&[
            "data",
            "gen",
            "sparse",
            s,
            "--rows",
            "100000",
            "--features",
            "5000",
            "--nnz-per-row",
            "20",
        ]);
        let run = d.join("run");
        let child = spawn_mpirun(&super::lr_train(
            s,
            run.to_str().expect("utf-8"),
            "100000000",
            // Read through the file's mapping (not a copy in memory), which the tests change.
            &["--watchdog", "0", "--huge-pages", "off"],
        ));
        super::wait_for_file(&run.join("metrics").join("rank-1.jsonl"));
        (data, child)
    }

    /// `peregrine args` under `mpirun -n 2`, started with its output piped (not awaited).
    fn spawn_mpirun(args: &[String]) -> std::process::Child {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        mpirun_command(2, exe(), &args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("mpirun")
    }

    /// Standard output then standard error.
    fn all_output(out: &std::process::Output) -> String {
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    }

    #[test]
    fn a_dataset_truncated_under_mpirun_is_an_error_naming_it() {
        let t = super::scratch("mpi-truncated");
        let (data, child) = long_run(t.path());
        let len = std::fs::metadata(&data).expect("stat").len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&data)
            .expect("open")
            .set_len(len / 2)
            .expect("truncate");
        let (out, took) = super::finish_within(child, std::time::Duration::from_secs(60));
        let all = all_output(&out);
        assert!(!out.status.success(), "{all}");
        assert!(took.as_secs() < 20, "{took:?}: {all}");
        // Seen by a compute thread's read of the mapping, or, where a checkpoint comes first, by
        // the checkpoint's look at the dataset it records: either names the file and the cut.
        assert!(
            all.contains("big.pgd shrank while this run had it mapped") || all.contains("big.pgd: truncated"),
            "{all}"
        );
    }

    #[test]
    fn a_panic_on_a_compute_thread_under_mpirun_aborts_the_job_naming_rank_and_thread() {
        let t = super::scratch("mpi-panic");
        let (data, child) = long_run(t.path());
        super::scribble_indices(&data);
        let (out, took) = super::finish_within(child, std::time::Duration::from_secs(60));
        let all = all_output(&out);
        assert!(!out.status.success(), "{all}");
        assert!(took.as_secs() < 20, "{took:?}: {all}");
        assert!(all.contains(", compute thread") && all.contains("modified in place"), "{all}");
        assert!(all.contains("rank 0, compute") || all.contains("rank 1, compute"), "{all}");
    }

    #[test]
    fn a_corrupt_dataset_under_mpirun_is_refused_by_the_rank_that_reads_it() {
        let t = super::scratch("mpi-corrupt");
        let d = t.path();
        let p = d.join("g.pgd");
        super::ok(&[
            "data",
            "gen",
            "sparse",
            p.to_str().expect("utf-8"),
            "--rows",
            "4000",
            "--features",
            "300",
        ]);
        let mut bytes = std::fs::read(&p).expect("read");
        let (at, len) = super::section(&bytes, 1);
        bytes[at + len * 3 / 4 / 4 * 4 + 3] = 0x7f; // rank 1's rows
        std::fs::write(&p, bytes).expect("write");
        let run = d.join("run");
        let args = super::lr_train(p.to_str().expect("utf-8"), run.to_str().expect("utf-8"), "20", &[]);
        let out = mpirun_n(2, exe(), &args.iter().map(String::as_str).collect::<Vec<_>>());
        let all = all_output(&out);
        assert!(!out.status.success(), "{all}");
        assert!(all.contains("rank 1: ") && all.contains("corrupt"), "{all}");
        assert!(!all.contains("panicked"), "{all}");
        assert!(!run.exists(), "nothing written");
    }

    #[test]
    fn conformance_under_mpirun() {
        let out = mpirun_n(2, exe(), &["conformance", "--tickets", "5000"]);
        assert_success("mpirun -n 2 peregrine conformance", &out);
        assert!(String::from_utf8_lossy(&out.stdout).contains("all cases passed on 2 ranks (mpi)"));
    }

    #[test]
    fn rma_bench_under_mpirun_reports_raw_mpi() {
        let out =
            mpirun_n(2, exe(), &["bench", "rma", "--max-size", "1K", "--iters", "1000", "--trials", "1"]);
        assert_success("mpirun -n 2 peregrine bench rma", &out);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let get = stdout.lines().find(|l| l.starts_with("get ")).expect("a get line");
        assert!(!get.contains(" - "), "no raw-MPI figure in `{get}`");
    }

    #[test]
    fn train_under_mpirun() {
        let d_tmp = super::scratch("train-mpi");
        let d = d_tmp.path();
        let data = super::train_data(d);
        for scheme in peregrine_tests::SCHEMES {
            // A run directory of its own: one holding a finished run is refused.
            let run = d.join(format!("run-{}", scheme.replace(':', "")));
            let out = mpirun_n(
                2,
                exe(),
                &[
                    "train",
                    "--model",
                    "lr",
                    "--data",
                    &data,
                    "--epochs",
                    "2",
                    "--batch",
                    "400",
                    "--chunk",
                    "25",
                    "--straggler",
                    "persistent:rank=1,speed=0.5",
                    "--scheme",
                    scheme,
                    "--run-dir",
                    &run.to_string_lossy(),
                ],
            );
            assert_success(&format!("mpirun -n 2 peregrine train --scheme {scheme}"), &out);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.contains(&format!("lr | {scheme} | 2 ranks")), "{stdout}");
            assert!(run.join("metrics/rank-1.jsonl").exists());
        }
    }

    #[test]
    fn an_error_on_every_rank_exits_non_zero_without_hanging() {
        let out = mpirun_n(2, exe(), &["conformance", "--ranks", "2"]);
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("under MPI the launcher sets it"));
    }
}

#[test]
fn bench_roofline_measures_the_fma_peak_and_the_triad() {
    let (out, _) = ok(&[
        "bench",
        "roofline",
        "--threads",
        "2",
        "--seconds",
        "0.02",
        "--elems",
        "65536",
        "--reps",
        "2",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    for k in ["fma_gflops_1", "fma_gflops", "triad_gbs"] {
        let x = v[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {out}"));
        assert!(x.is_finite() && x > 0.0, "{k} = {x}: {out}");
    }
    assert_eq!(v["threads"], 2, "{out}");
    // Where this process may run on two CPUs: the line between them, and the block handed
    // between them both ways at once.
    if v["line_round_trip_ns"].is_null() {
        assert!(v["handoff_read_gbs"].is_null(), "{out}");
    } else {
        assert_eq!(v["handoff_bytes"], peregrine_kernels::roofline::HANDOFF_BYTES, "{out}");
        for k in ["line_round_trip_ns", "handoff_copy_gbs", "handoff_read_gbs", "handoff_local_gbs"] {
            let x = v[k].as_f64().unwrap_or_else(|| panic!("{k} missing: {out}"));
            assert!(x.is_finite() && x > 0.0, "{k} = {x}: {out}");
        }
    }
    assert!(v["simd"].as_str().is_some_and(|s| s.starts_with("compiled for")), "{out}");
    // The peak is the MLP products' instructions'; where those are AVX-512, the build's own
    // f32x8 peak beside it.
    let isa = peregrine_kernels::cpu::Isa::best();
    assert_eq!(v["isa"], isa.name(), "{out}");
    assert!(
        v["vector"].as_str().is_some_and(|s| s.starts_with(&format!("f32 x {} lanes", isa.lanes()))),
        "{out}"
    );
    let narrow = v["f32x8_fma_gflops"].as_f64();
    match isa {
        peregrine_kernels::cpu::Isa::F32x8 => assert!(narrow.is_none(), "{out}"),
        peregrine_kernels::cpu::Isa::Avx512 => assert!(narrow.is_some_and(|x| x > 0.0), "{out}"),
    }
    let (shown, _) =
        ok(&["bench", "roofline", "--threads", "1", "--seconds", "0.02", "--elems", "4096", "--reps", "1"]);
    assert!(shown.contains("FMA peak") && shown.contains("STREAM triad"), "{shown}");
    for bad in [["--seconds", "0"], ["--elems", "5"], ["--threads", "0"]] {
        let out = peregrine(&[&["bench", "roofline"][..], &bad[..]].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out).1);
    }
}

#[test]
fn bench_roofline_plots_the_roof_and_each_workload_and_refuses_bad_points() {
    let t = scratch("roofline");
    let stem = t.path().join("roof");
    let stem_s = stem.to_string_lossy().into_owned();
    // The roof as given (nothing measured), two workloads on it; a trailing .png is dropped.
    let png = format!("{stem_s}.png");
    let (_, err) = ok(&[
        "bench",
        "roofline",
        "--roof",
        "300,25",
        "--plot",
        &png,
        "--point",
        "softmax=10,16.4",
        "--point=MF k=40=0.58,2.1",
    ]);
    assert!(err.contains("2 workloads"), "{err}");
    for ext in ["png", "svg"] {
        let f = t.path().join(format!("roof.{ext}"));
        assert!(std::fs::metadata(&f).is_ok_and(|m| m.len() > 1000), "{} missing or empty", f.display());
    }
    let svg = std::fs::read_to_string(t.path().join("roof.svg")).expect("svg");
    // Each point labelled with its share of its roof: softmax at 10 FLOP/B is under the 250 GFLOP/s
    // of memory (16.4 is 7 %), MF at 0.58 under 14.5 (2.1 is 14 %).
    assert!(
        svg.contains("softmax (7 % of roof)") && svg.contains("MF k=40 (14 % of roof)"),
        "labels: {svg:.400}"
    );
    assert!(svg.contains("FMA peak 300.0 GFLOP/s"), "roof label");
    // Without --roof the roof is measured first, then drawn.
    let (shown, _) = ok(&[
        "bench",
        "roofline",
        "--threads",
        "1",
        "--seconds",
        "0.02",
        "--elems",
        "4096",
        "--reps",
        "1",
        "--plot",
        &stem_s,
    ]);
    assert!(shown.contains("FMA peak"), "{shown}");
    // A plot whose SVG cannot be written leaves no PNG either; a path naming no file, or in a
    // folder that does not exist, is refused before anything is measured.
    let fifo = t.path().join("pipe");
    assert!(Command::new("mkfifo").arg(t.path().join("pipe.svg")).status().expect("mkfifo").success());
    let fifo_s = fifo.to_string_lossy().into_owned();
    let out = peregrine(&["bench", "roofline", "--roof", "300,25", "--plot", &fifo_s]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("--plot") && text(&out).1.contains("FIFO"), "{:?}", text(&out));
    assert!(!t.path().join("pipe.png").exists());
    let dir_only = format!("{}/", t.path().display());
    let missing = t.path().join("no/such/roof").to_string_lossy().into_owned();
    for (plot, why) in [(dir_only.as_str(), "names no file"), (missing.as_str(), "does not exist")] {
        let out = peregrine(&["bench", "roofline", "--plot", plot]);
        assert_eq!(out.status.code(), Some(2), "{plot}: {:?}", text(&out));
        assert!(text(&out).1.contains(why), "{plot}: {:?}", text(&out));
    }
    for bad in [
        &["--plot", &stem_s, "--point", "x=0,1"][..],
        &["--plot", &stem_s, "--point", "x=1,-2"],
        &["--plot", &stem_s, "--point", "=1,2"],
        &["--plot", &stem_s, "--point", "x=1"],
        &["--plot", &stem_s, "--roof", "300"],
        &["--plot", &stem_s, "--roof", "300,nan"],
        &["--point", "x=1,2"],
    ] {
        let out = peregrine(&[&["bench", "roofline"][..], bad].concat());
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out).1);
    }
}
