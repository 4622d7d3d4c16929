//! The `peregrine` binary as a user runs it: help, bad input, and the commands end to end (local
//! threads always; `mpirun` when built with `--features mpi`).

use std::path::Path;
use std::process::{Command, Output};

#[path = "support/trace_check.rs"]
mod trace_check;

#[path = "support/models.rs"]
mod models;
use models::{model_distance, safetensors_f32};

#[path = "support/checkpoints.rs"]
mod checkpoints;

fn peregrine(args: &[&str]) -> Output {
    peregrine_in(Path::new("."), args)
}

/// `peregrine` run in directory `dir` (where it would write `runs/`).
fn peregrine_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).current_dir(dir).output().expect("run peregrine")
}

/// `peregrine train` on one rank from the configuration the run in `run` resolved, with `extra`
/// flags, into the run directory `into`: it must succeed.
fn runs_again(run: &Path, extra: &[&str], into: &Path) {
    let (config, into) = (run.join("config.toml"), into.to_string_lossy());
    let head = ["train", "--ranks", "1", "--config", &config.to_string_lossy()];
    let out = peregrine(&[&head[..], extra, &["-q", "--run-dir", &into]].concat());
    assert!(out.status.success(), "{:?}", text(&out));
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

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

    /// [`super::long_run`] under `mpirun -n 2`.
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
        assert!(all.contains("big.pgd shrank while this run had it mapped"), "{all}");
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

/// A scratch directory, removed when the test ends (passed or failed).
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-cli-{name}-")).tempdir().expect("scratch dir")
}

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

/// A small generated sparse dataset for the training commands.
fn train_data(dir: &std::path::Path) -> String {
    let data = dir.join("sparse.pgd");
    let out =
        peregrine(&["data", "gen", "sparse", &data.to_string_lossy(), "--rows", "4000", "--features", "300"]);
    assert!(out.status.success(), "{:?}", text(&out));
    data.to_string_lossy().into_owned()
}

#[test]
fn train_writes_its_run_directory() {
    let d_tmp = scratch("train-run");
    let d = d_tmp.path();
    let data = train_data(d);
    let run = d.join("run");
    let out = peregrine(&[
        "train",
        "--ranks",
        "2",
        "--model",
        "lr",
        "--data",
        &data,
        "--epochs",
        "3",
        "--batch",
        "500",
        "--chunk",
        "50",
        "--lr",
        "1",
        "--straggler",
        "slow-worker:p=0.5",
        "--target-loss",
        "0.0001",
        "--run-dir",
        &run.to_string_lossy(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("lr | bsp | 2 ranks | 24 iterations"), "{stdout}");
    assert!(stdout.contains("did not reach loss <= 0.0001"), "{stdout}");
    // Standard error is not a terminal here: no progress bar.
    assert!(!stderr.contains('\r'), "{stderr:?}");
    for f in ["config.toml", "meta.json", "summary.json", "metrics/rank-0.jsonl", "metrics/rank-1.jsonl"] {
        assert!(run.join(f).exists(), "{f} missing");
    }
    let lines = std::fs::read_to_string(run.join("metrics/rank-1.jsonl")).expect("metrics");
    assert_eq!(lines.lines().count(), 24);
    for key in ["\"compute\"", "\"comm\"", "\"wait\"", "\"own\"", "\"taken\"", "\"threads\"", "\"loss\""] {
        assert!(lines.lines().all(|l| l.contains(key)), "{key} missing: {lines}");
    }
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    assert!(config.contains("model = \"lr\"") && config.contains("iterations = 24"), "{config}");
    assert!(config.contains("intercept = true"), "LR has an intercept by default: {config}");
    // The resolved configuration runs again as a config file.
    runs_again(&run, &[], &d.join("again"));
    // Without the intercept: one parameter less, and the choice recorded.
    let lr_on_1 = |data: &str, extra: &[&str]| {
        peregrine(&[&["train", "--ranks", "1", "--model", "lr", "--data", data][..], extra].concat())
    };
    let none = d.join("none");
    let out = lr_on_1(&data, &["--iterations", "2", "--no-intercept", "--run-dir", &none.to_string_lossy()]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(text(&out).0.contains("lr | bsp | 1 rank | 2 iterations"), "{:?}", text(&out));
    let config = std::fs::read_to_string(none.join("config.toml")).expect("config");
    assert!(config.contains("intercept = false"), "{config}");
    // Only LR's own keys: no factor rank or hidden layers of other models. L2 defaults to
    // 1 / training rows.
    let rows = 4000.0f32;
    assert!(config.lines().any(|l| l == format!("l2 = {}", 1.0 / rows)), "{config}");
    for other in ["k =", "hidden ="] {
        assert!(!config.lines().any(|l| l.starts_with(other)), "{other} in an LR run's config:\n{config}");
    }
    // L1 selects FTRL; the resolved optimizer and schedule are recorded and run again.
    let l1 = d.join("l1");
    let out =
        lr_on_1(&data, &["--iterations", "4", "--l1", "0.01", "-q", "--run-dir", &l1.to_string_lossy()]);
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(l1.join("config.toml")).expect("config");
    for line in ["optimizer = \"ftrl\"", "l1 = 0.01", "lr = 1.0", "warmup = 0"] {
        assert!(config.lines().any(|l| l == line), "{line} missing:\n{config}");
    }
    runs_again(&l1, &["--optimizer", "ftrl"], &d.join("l1-again"));
    let adam = d.join("adam");
    let out = lr_on_1(
        &data,
        &[
            "--iterations",
            "4",
            "--optimizer",
            "adam",
            "--lr-decay",
            "cosine",
            "--warmup",
            "2",
            "-q",
            "--run-dir",
            &adam.to_string_lossy(),
        ],
    );
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(adam.join("config.toml")).expect("config");
    for line in ["optimizer = \"adam\"", "lr-decay = \"cosine\"", "warmup = 2"] {
        assert!(config.lines().any(|l| l == line), "{line} missing:\n{config}");
    }
    // An evaluation set with more features than the training set: the fix named.
    let scratch_run = d.join("refused").to_string_lossy().into_owned();
    let wide = d.join("wide.svm");
    std::fs::write(&wide, "+1 1:1 400:1\n-1 2:1\n").expect("write");
    let wide_pgd = d.join("wide.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&["data", "convert", "libsvm", &wide.to_string_lossy(), &wide_pgd]).status.success());
    let out = lr_on_1(&data, &["--eval", &wide_pgd, "-q", "--run-dir", &scratch_run]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("--features N"), "{:?}", text(&out));
    // A text file given as a dataset: told to convert it.
    let out = lr_on_1(&wide.to_string_lossy(), &["-q", "--run-dir", &scratch_run]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("peregrine data convert libsvm"), "{:?}", text(&out));
}

#[test]
fn train_config_file_errors_name_file_line_and_column() {
    let d_tmp = scratch("train-config");
    let d = d_tmp.path();
    let data = train_data(d);
    let cfg = d.join("bad.toml");
    std::fs::write(&cfg, format!("model = \"lr\"\ndata = \"{data}\"\nbatchsize = 64\n")).expect("write");
    let out = peregrine(&["train", "--config", &cfg.to_string_lossy()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad.toml:3:1") && stderr.contains("unknown field `batchsize`"), "{stderr}");
    std::fs::write(&cfg, "model = \"svm\"\n").expect("write");
    let (_, stderr) = text(&peregrine(&["train", "--config", &cfg.to_string_lossy()]));
    assert!(stderr.contains("bad.toml:1:9") && stderr.contains("unknown variant `svm`"), "{stderr}");
    // Scheme names are parsed where they are read.
    std::fs::write(&cfg, "model = \"lr\"\nscheme = \"ssp:soon\"\n").expect("write");
    let (_, stderr) = text(&peregrine(&["train", "--config", &cfg.to_string_lossy()]));
    assert!(stderr.contains("bad.toml:2:10") && stderr.contains("whole number"), "{stderr}");
    // A relative data path is relative to the file.
    std::fs::write(&cfg, "model = \"lr\"\ndata = \"sparse.pgd\"\niterations = 2\n").expect("write");
    let out = peregrine(&[
        "train",
        "--ranks",
        "1",
        "-q",
        "--config",
        &cfg.to_string_lossy(),
        "--run-dir",
        &d.join("rel").to_string_lossy(),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
}

#[test]
fn train_bad_input_is_a_clear_error() {
    let d_tmp = scratch("train-bad");
    let d = d_tmp.path();
    let data = train_data(d);
    let cases: &[(&[&str], i32, &str)] = &[
        (&["train", "--data", &data], 2, "no model"),
        (&["train", "--model", "lr"], 2, "no training data"),
        (&["train", "--model", "lr", "--data", &data, "--scheme", "ssp:x"], 2, "whole number"),
        (
            &["train", "--model", "lr", "--data", &data, "--straggler", "persistent:rank=0,speed=1.5"],
            2,
            "must be in (0, 1]",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--straggler", "tortoise"],
            2,
            "unknown straggler pattern",
        ),
        (
            &[
                "train",
                "--model",
                "lr",
                "--data",
                &data,
                "--straggler",
                "persistent:rank=7,speed=0.5",
                "--ranks",
                "2",
            ],
            2,
            "rank 7 does not exist",
        ),
        (&["train", "--model", "lr", "--data", &data, "--lr=-1"], 2, "learning rate must be positive"),
        (&["train", "--model", "lr", "--data", &data, "--chunk", "0"], 2, "must be at least 1"),
        (&["train", "--model", "softmax", "--data", &data], 1, "this model needs dense multiclass data"),
        (&["train", "--model", "lr", "--data", "/nonexistent.pgd"], 1, "/nonexistent.pgd"),
        (
            &["train", "--model", "lr", "--data", &data, "--epochs", "1", "--iterations", "3"],
            2,
            "cannot be used with",
        ),
        // Schemes that cannot run in the world they are given: refused before anything starts.
        (
            &["train", "--model", "lr", "--data", &data, "--ranks", "2", "--scheme", "backup:2"],
            2,
            "scheme `backup:2` cannot run with 2 ranks",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--ranks", "1", "--scheme", "backup:1"],
            2,
            "at most 0",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--scheme", "falcon:slack:-1"],
            2,
            "must be a whole number",
        ),
        (&["train", "--model", "lr", "--data", &data, "--scheme", "speculative:3"], 2, "unknown scheme"),
        (&["train", "--model", "lr", "--data", &data, "--grain", "0"], 2, "grain must be at least 1, got 0"),
        (
            &["train", "--model", "lr", "--data", &data, "--steal-fraction", "0"],
            2,
            "steal fraction must be in (0, 1]",
        ),
        (&["train", "--model", "lr", "--data", &data, "--batch", "0"], 2, "must be at least 1"),
        (
            &["train", "--model", "lr", "--data", &data, "--iterations", "0"],
            2,
            "iterations must be at least 1",
        ),
        (&["train", "--model", "lr", "--data", &data, "--threads", "100000"], 2, "at most 1024"),
        (
            &["train", "--model", "lr", "--data", &data, "--optimizer", "rmsprop"],
            2,
            "unknown optimizer `rmsprop`",
        ),
        (&["train", "--model", "lr", "--data", &data, "--optimizer", "momentum:1.5"], 2, "must be in [0, 1)"),
        (
            &["train", "--model", "mf", "--data", &data, "--optimizer", "adam"],
            2,
            "mf runs SGD over each rating",
        ),
        (&["train", "--model", "mlp", "--data", &data, "--l1", "0.1"], 2, "--l1 is for --model lr"),
        (
            &["train", "--model", "softmax", "--data", &data, "--split", "units"],
            2,
            "--split units is for --model mlp",
        ),
        (
            &["train", "--model", "mlp", "--data", &data, "--split", "units", "--hidden", "8,4"],
            2,
            "one hidden layer, not 2 (8,4)",
        ),
        (
            &["train", "--model", "mlp", "--data", &data, "--split", "columns"],
            2,
            "possible values: rows, units",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--l1", "0.1", "--optimizer", "adam"],
            2,
            "FTRL-Proximal",
        ),
        (&["train", "--model", "lr", "--data", &data, "--l1=-1"], 2, "--l1 must be 0 or more"),
        (
            &["train", "--model", "lr", "--data", &data, "--optimizer", "ftrl", "--warmup", "10"],
            2,
            "takes a constant learning rate",
        ),
        (&["train", "--model", "lr", "--data", &data, "--lr-decay", "fast"], 2, "or `cosine`"),
    ];
    let d_tmp = scratch("train-bad-cwd");
    let d = d_tmp.path();
    for (args, code, what) in cases {
        let out = peregrine_in(d, args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(what), "{args:?}: expected `{what}` in {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // Refused before anything is written: no run directory.
        assert!(!d.join("runs").exists(), "{args:?} left a run directory");
    }
}

#[test]
fn train_divergence_is_an_error() {
    let d_tmp = scratch("train-div");
    let d = d_tmp.path();
    let data = d.join("ratings.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&[
        "data",
        "gen",
        "ratings",
        &data,
        "--ratings",
        "5000",
        "--users",
        "100",
        "--items",
        "80"
    ])
    .status
    .success());
    let out = peregrine(&[
        "train",
        "--ranks",
        "1",
        "--model",
        "mf",
        "--data",
        &data,
        "--lr",
        "50",
        "--iterations",
        "5",
        "-q",
        "--run-dir",
        &d.join("run").to_string_lossy(),
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("diverged"), "{stderr}");
    // 5000 ratings are too few for strata at the default batch (8 x 8 blocks of 1024): a warning,
    // with the largest batch that keeps them.
    assert!(
        stderr.contains("warning: matrix factorization runs without strata")
            && stderr.contains("the set has 5000")
            && stderr.contains("strata with --batch 2048 or less at this --chunk"),
        "{stderr}"
    );
    // A loss that explodes but stays a number (softmax at lr 1e30) is divergence too.
    let dense = d.join("dense.pgd").to_string_lossy().into_owned();
    let gen = ["data", "gen", "dense", &dense, "--rows", "2000", "--features", "20", "--classes", "4"];
    assert!(peregrine(&gen).status.success());
    let exploded = d.join("exploded").to_string_lossy().into_owned();
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "--ranks", "1", "--model", "softmax", "--data", &dense, "-q"];
        args.extend(["--run-dir", &exploded]);
        args.extend(extra);
        peregrine(&args)
    };
    let out = run(&["--lr", "1e30", "--iterations", "20"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("diverged") && stderr.contains("predicts nothing scores 1.3863"), "{stderr}");
    // Labels the features say nothing about (one row in five positive): the model can do no
    // better than always answering "negative", which is reported as a warning, or with
    // --stop-on-stall as an error.
    let noise = d.join("noise.svm");
    let rows: String = (0..2000u64)
        .map(|i| format!("{} {}:1 {}:1\n", u8::from(i % 5 == 0), i % 7 + 1, i % 11 + 8))
        .collect();
    std::fs::write(&noise, rows).expect("write");
    let noise_pgd = d.join("noise.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&["data", "convert", "libsvm", &noise.to_string_lossy(), &noise_pgd]).status.success());
    let still =
        ["train", "--ranks", "1", "--model", "lr", "--data", &noise_pgd, "--lr", "0.5", "--iterations", "40"];
    let still = [&still[..], &["--batch", "500", "--chunk", "50", "--eval-every", "5", "-q"]].concat();
    let (warned, stopped) =
        (d.join("warned").to_string_lossy().into_owned(), d.join("stopped").to_string_lossy().into_owned());
    let out = peregrine(&[&still[..], &["--run-dir", &warned]].concat());
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: the accuracy") && stderr.contains("most frequent class (0.8000)"),
        "{stderr}"
    );
    let out = peregrine(&[&still[..], &["--stop-on-stall", "--run-dir", &stopped]].concat());
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("training stopped: the accuracy"), "{stderr}");
}

/// LDA from the command line: a corpus converted, trained on 2 ranks, its config.toml run again,
/// its topic proportions predicted; bad settings and unsuited schemes refused before anything is
/// written.
#[test]
fn lda_trains_runs_its_config_again_and_refuses_bad_settings() {
    let d_tmp = scratch("lda");
    let d = d_tmp.path();
    let ldac = d.join("c.ldac");
    std::fs::write(&ldac, "3 0:2 3:1 5:4\n2 1:3 2:1\n4 0:1 2:2 4:1 5:1\n2 3:2 4:3\n").expect("write");
    let data = d.join("c.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&["data", "convert", "ldac", &ldac.to_string_lossy(), &data]).status.success());
    let run = d.join("run");
    let lda = |extra: &[&str], dir: &Path| {
        peregrine(
            &[
                &[
                    "train",
                    "--ranks",
                    "2",
                    "--model",
                    "lda",
                    "--data",
                    &data,
                    "-q",
                    "--run-dir",
                    &dir.to_string_lossy(),
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let out = lda(&["--k", "3", "--epochs", "4"], &run);
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    for line in ["model = \"lda\"", "k = 3", "alpha = 0.1", "eta = 0.01"] {
        assert!(config.lines().any(|l| l == line), "{line} missing:\n{config}");
    }
    for other in ["lr", "lr-decay", "warmup", "optimizer", "l2", "hidden", "intercept"] {
        assert!(!config.lines().any(|l| l.starts_with(&format!("{other} ="))), "{other} in:\n{config}");
    }
    runs_again(&run, &[], &d.join("again"));
    let csv = d.join("topics.csv");
    let out = peregrine(&[
        "predict",
        "--model",
        &run.to_string_lossy(),
        "--data",
        &data,
        "--out",
        &csv.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let rows: Vec<String> = std::fs::read_to_string(&csv).expect("csv").lines().map(str::to_owned).collect();
    assert_eq!(rows.len(), 5, "a header and one row per document: {rows:?}");
    assert!(rows[0].contains("topic0,topic1,topic2"), "{}", rows[0]);
    for (args, code, says) in [
        (&["--scheme", "ssp:2"][..], 2, "bsp, lb-bsp, lb-bsp:ma, lb-bsp:narx, speculative, falcon"),
        (&["--lr", "0.1"][..], 2, "no learning rate"),
        (&["--k", "1"][..], 2, "at least 2 topics"),
        (&["--alpha", "nan"][..], 2, "--alpha must be a positive number"),
        (&["--eta", "0"][..], 2, "--eta must be a positive number"),
        (&["--eval", data.as_str()][..], 1, "held-out"),
    ] {
        let refused = d.join("refused");
        let out = lda(args, &refused);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {:?}", text(&out));
        assert!(text(&out).1.contains(says), "{args:?}: {:?}", text(&out));
        assert!(!refused.exists(), "{args:?}: a run directory was written");
    }
}

#[test]
fn every_shipped_config_runs() {
    let d_tmp = scratch("configs");
    let d = d_tmp.path();
    let sparse = train_data(d);
    let dense = d.join("dense.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&[
        "data",
        "gen",
        "dense",
        &dense,
        "--rows",
        "2000",
        "--features",
        "784",
        "--classes",
        "10"
    ])
    .status
    .success());
    let ratings = d.join("ratings.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&[
        "data",
        "gen",
        "ratings",
        &ratings,
        "--ratings",
        "3000",
        "--users",
        "50",
        "--items",
        "40"
    ])
    .status
    .success());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("configs/") {
        let path = entry.expect("entry").path();
        let body = std::fs::read_to_string(&path).expect("read");
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("experiment-")) {
            // An experiment configuration: checked (not run) here; the small one runs in CI.
            let out = peregrine(&["experiment", &path.to_string_lossy(), "--dry-run"]);
            let (stdout, stderr) = text(&out);
            assert!(
                out.status.success() && stdout.contains(" runs:"),
                "{}: {stdout}{stderr}",
                path.display()
            );
            continue;
        }
        let data = if body.contains("model = \"lr\"") {
            &sparse
        } else if body.contains("model = \"mf\"") {
            &ratings
        } else {
            &dense
        };
        let out = peregrine(&[
            "train",
            "--ranks",
            "2",
            "-q",
            "--config",
            &path.to_string_lossy(),
            "--data",
            data,
            "--eval",
            data,
            "--iterations",
            "2",
            "--run-dir",
            &d.join(format!("run-{seen}")).to_string_lossy(),
        ]);
        assert!(out.status.success(), "{}: {:?}", path.display(), text(&out));
        seen += 1;
    }
    assert!(seen >= 4, "{seen} configs");
}

#[test]
fn experiment_writes_tables_and_plots() {
    let d_tmp = scratch("experiment");
    let d = d_tmp.path();
    let data = train_data(d);
    let cfg = d.join("exp.toml");
    std::fs::write(
        &cfg,
        format!(
            "name = \"tiny\"\nseeds = [1, 2]\nschemes = [\"bsp+steal\", \"backup:1\"]\n\
             patterns = [\"persistent:rank=0,speed=0.5\"]\n\
             [workloads.lr]\nmodel = \"lr\"\ndata = \"{data}\"\nbatch = 400\nchunk = 25\nepochs = 2\n\
             eval-every = 5\ntarget-loss = 0.69\n"
        ),
    )
    .expect("write");
    let out = d.join("out");
    let run = peregrine(&[
        "experiment",
        &cfg.to_string_lossy(),
        "--ranks",
        "2",
        "--out",
        &out.to_string_lossy(),
        "--trace",
    ]);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    // Every run traced (not the warm-up), each trace whole.
    let traced = out.join("runs/lr/persistent_rank_0_speed_0_5/bsp_steal/seed-2/trace.json");
    assert!(
        trace_check::check_trace(&traced).iter().any(|e| e["name"] == "taken chunk"),
        "{}",
        traced.display()
    );
    assert!(!out.join("runs/lr/warm-up/trace.json").exists());
    // bsp and ideal are added: 3 schemes x 2 patterns x 2 seeds.
    assert!(stdout.contains("[12/12]"), "{stdout}");
    let csv = std::fs::read_to_string(out.join("results.csv")).expect("results.csv");
    assert_eq!(csv.lines().count(), 13, "{csv}");
    let summary = std::fs::read_to_string(out.join("summary.csv")).expect("summary.csv");
    let ideal = summary.lines().find(|l| l.starts_with("lr,\"ideal\",bsp,")).expect("the ideal row");
    assert!(ideal.contains(",1.0000,"), "Ideal relative to itself: {ideal}");
    for p in ["ideal", "persistent_rank_0_speed_0_5"] {
        for what in ["time-per-iteration", "waste", "loss"] {
            let png = std::fs::read(out.join(format!("plots/lr-{p}-{what}.png"))).expect("png");
            assert!(png.starts_with(b"\x89PNG") && png.len() > 5000, "{p} {what}: {} bytes", png.len());
            let svg = std::fs::read_to_string(out.join(format!("plots/lr-{p}-{what}.svg"))).expect("svg");
            assert!(svg.contains("<svg") && svg.contains("bsp"), "{p} {what}");
        }
    }
    assert!(out.join("runs/lr/ideal/bsp/seed-1/summary.json").exists());
    // The pivot: a row per pattern with its capacity bound (2 ranks, one at half speed: 1 / 0.75).
    let table = std::fs::read_to_string(out.join("table.md")).expect("table.md");
    assert!(table.contains("| pattern | bound | bsp | bsp+steal | backup:1 | best |"), "{table}");
    let row = table.lines().find(|l| l.starts_with("| persistent:rank=0,speed=0.5 |")).expect("pattern row");
    assert!(row.starts_with("| persistent:rank=0,speed=0.5 | 1.33 |"), "{row}");
    assert!(table.lines().any(|l| l.starts_with("| ideal | 1.00 | 1.00 |")), "{table}");
    // Its results are not replaced without --force.
    let again =
        peregrine(&["experiment", &cfg.to_string_lossy(), "--ranks", "2", "--out", &out.to_string_lossy()]);
    assert_eq!(again.status.code(), Some(2), "{}", text(&again).1);
    assert!(text(&again).1.contains("holds an experiment's results") && text(&again).1.contains("--force"));
    assert_eq!(std::fs::read_to_string(out.join("results.csv")).expect("results.csv"), csv, "kept");
}

#[test]
fn experiment_config_errors_are_clear() {
    let d_tmp = scratch("experiment-bad");
    let d = d_tmp.path();
    let data = train_data(d);
    let cfg = d.join("bad.toml");
    for (body, what) in [
        ("schemes = [\"bsp\"]\npatterns = [\"ideal\"]\n[workloads.lr]\nmodel = \"lr\"\ndata = \"D\"\n", "needs a target-loss"),
        ("schemes = [\"fast\"]\npatterns = [\"ideal\"]\n[workloads.lr]\nmodel = \"lr\"\ndata = \"D\"\ntarget-loss = 1\n", "unknown scheme"),
        ("schemes = [\"bsp\"]\npatterns = [\"snail\"]\n[workloads.lr]\nmodel = \"lr\"\ndata = \"D\"\ntarget-loss = 1\n", "unknown straggler pattern"),
        ("schemes = [\"bsp\"]\npatterns = [\"ideal\"]\n[workloads.lr]\nmodel = \"lr\"\ndata = \"D\"\ntarget-loss = 1\nscheme = \"asp\"\n", "the experiment sets those"),
        ("schemes = [\"bsp\"]\npatterns = [\"ideal\"]\nrepeats = 3\n", "unknown field `repeats`"),
        ("schemes = [\"backup:1\"]\npatterns = [\"ideal\"]\n[workloads.lr]\nmodel = \"lr\"\ndata = \"D\"\ntarget-loss = 1\n", "cannot run with 1 rank"),
    ] {
        std::fs::write(&cfg, format!("name = \"x\"\n{}", body.replace('D', &data))).expect("write");
        let out = peregrine(&["experiment", &cfg.to_string_lossy(), "--ranks", "1"]);
        let (_, stderr) = text(&out);
        assert!(!out.status.success() && stderr.contains(what), "{what}: {stderr}");
    }
}

/// `measured <m> s, simulated <s> s, ratio <r>` from a replay's line starting with `what`.
#[test]
fn synthetic_workload_runs_many_ranks_and_refuses_bad_settings() {
    let d_tmp = scratch("synthetic");
    let d = d_tmp.path();
    let data = train_data(d);
    let run = d.join("run");
    let r = run.to_string_lossy().into_owned();
    let base = ["train", "--model", "synthetic", "--data", &data, "--run-dir", &r, "--quiet"];
    for (extra, want) in [
        (&["--chunk-cost=-1ms"][..], "--chunk-cost `-1ms`"),
        (&["--chunk-cost", "0"], "more than 0"),
        (&["--chunk-cost", "2parsecs"], "the unit must be"),
        (&["--chunk-cost", "2h"], "the unit must be"),
        (&["--chunk-cost", "90s"], "at most 60 s"),
        (&["--params", "0"], "--params must be between 1"),
        (&["--params", "4294967295"], "--params must be between 1"),
    ] {
        let out = peregrine(&[&base[..], extra].concat());
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!run.exists(), "{extra:?} wrote {r}");
    }
    let out = peregrine(&["train", "--model", "lr", "--data", &data, "--chunk-cost", "2ms", "--run-dir", &r]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("for --model synthetic"), "{:?}", text(&out));
    assert!(!run.exists());
    // 8 ranks on this machine's cores, rank 0 at half speed: every row once an iteration.
    let (_, stderr) = ok(&[
        &base[..],
        &[
            "--ranks",
            "8",
            "--threads",
            "1",
            "--chunk-cost",
            "1ms",
            "--params",
            "5000",
            "--batch",
            "1000",
            "--chunk",
            "64",
            "--iterations",
            "10",
            "--straggler",
            "persistent:rank=0,speed=0.5",
        ],
    ]
    .concat());
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).expect("summary"))
            .expect("json");
    assert_eq!(summary["model"], "synthetic", "{stderr}");
    let per_rank = summary["per_rank"].as_array().expect("per rank");
    assert_eq!(per_rank.len(), 8);
    let rows: u64 = per_rank.iter().map(|p| p["rows"].as_u64().expect("rows")).sum();
    assert_eq!(rows, 10 * 1000);
    // Each rank slept at least its rows' cost: 1 ms a chunk of 64 rows.
    for p in per_rank {
        let (rows, busy) = (p["rows"].as_f64().expect("rows"), p["busy"].as_f64().expect("busy"));
        assert!(busy >= 0.9 * rows / 64.0 * 1e-3, "{p}");
    }
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    assert!(config.contains("chunk-cost = 0.001") && config.contains("params = 5000"), "{config}");
    assert!(!config.contains("hidden") && !config.contains("optimizer"), "{config}");
    // The recorded configuration runs again as it is, and a bad cost in a file names its place.
    runs_again(&run, &["--iterations", "2"], &d.join("again"));
    let again = std::fs::read_to_string(d.join("again/config.toml")).expect("config");
    assert!(again.contains("chunk-cost = 0.001"), "{again}");
    let bad = d.join("bad.toml");
    std::fs::write(&bad, "model = \"synthetic\"\nchunk-cost = true\n").expect("write");
    let out = peregrine(&["train", "--config", &bad.to_string_lossy(), "--data", &data]);
    // As every bad configuration file (the file is data, not the command line).
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("bad.toml:2") && text(&out).1.contains("chunk-cost"), "{:?}", text(&out));
    // The replay reads it like any run.
    let out = peregrine(&["simulate", "--replay", &r]);
    assert!(out.status.success(), "{:?}", text(&out));
    let (measured, simulated, _) = replayed(&text(&out).0, "time per iteration");
    assert!(measured > 0.0 && simulated > 0.0);
    // Nothing to predict with.
    let model = run.join("model.safetensors");
    let out = peregrine(&["predict", "--model", &model.to_string_lossy(), "--data", &data, "-o", "-"]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("nothing to predict"), "{:?}", text(&out));
}

fn replayed(stdout: &str, what: &str) -> (f64, f64, f64) {
    let line =
        stdout.lines().find(|l| l.starts_with(what)).unwrap_or_else(|| panic!("no `{what}`:\n{stdout}"));
    let nums: Vec<f64> =
        line.split(|c: char| !(c.is_ascii_digit() || c == '.')).filter_map(|w| w.parse().ok()).collect();
    assert_eq!(nums.len(), 3, "{line}");
    (nums[0], nums[1], nums[2])
}

#[test]
fn simulate_replays_a_real_run() {
    let d_tmp = scratch("simulate-replay");
    let d = d_tmp.path();
    let data = train_data(d);
    let run = d.join("run");
    let out = peregrine(&[
        "train",
        "--ranks",
        "2",
        "--model",
        "lr",
        "--data",
        &data,
        "--batch",
        "4000",
        "--chunk",
        "25",
        "--iterations",
        "60",
        "--eval-every",
        "1000",
        "--threads",
        "1",
        "--straggler",
        "persistent:rank=0,speed=0.5",
        "--run-dir",
        &run.to_string_lossy(),
        "--quiet",
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let out = peregrine(&["simulate", "--replay", &run.to_string_lossy()]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("bsp+steal, 2 ranks x 1 threads"), "{stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).expect("summary"))
            .expect("json");
    let measured =
        summary["train_seconds"].as_f64().expect("seconds") / summary["iterations"].as_f64().expect("n");
    let (m, s, r) = replayed(&stdout, "time per iteration:");
    assert!((m - measured).abs() <= 1e-6 * measured.max(1.0) + 5e-7, "{m} vs {measured}");
    // Seconds are printed to four significant digits and the ratio to three decimals.
    assert!((r - s / m).abs() <= 2e-3 * r + 1e-3, "{stdout}");
    // How close the replay comes is measured by scripts/sim-validate.sh (nothing else running;
    // the README's table). Here tests share the cores: a rank whose core is taken waits for a
    // CPU slice (seen: waits of 8 ms around 0.3 ms of compute), which no replay of chunk times
    // can see, so the measured side is no reference. What load cannot change: the replay is
    // deterministic, never slower than three times the measurement (every cost it replays was
    // measured within it), and at least the run's chunks at the cheapest chunk cost measured,
    // spread over both ranks (a replay that lost its chunk costs falls below).
    let again = peregrine(&["simulate", "--replay", &run.to_string_lossy()]);
    assert_eq!(text(&again).0, stdout, "the replay is not deterministic");
    assert!(r < 3.0, "{stdout}");
    let mut cheapest = f64::INFINITY;
    for rank in 0..2 {
        let metrics =
            std::fs::read_to_string(run.join(format!("metrics/rank-{rank}.jsonl"))).expect("metrics");
        for line in metrics.lines() {
            let v: serde_json::Value = serde_json::from_str(line).expect("record");
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            let chunks = f("own") + f("taken") + f("cloned") + f("discarded");
            if chunks > 0.0 && f("compute") > 0.0 {
                cheapest = cheapest.min(f("compute") * f("threads").max(1.0) / chunks / (1.0 + f("delay")));
            }
        }
    }
    let floor = (4000 / 25) as f64 * cheapest / 2.0;
    assert!(s >= 0.99 * floor, "simulated {s} s per iteration, below the floor {floor} s:\n{stdout}");
    // A damaged metrics file: its line named, nothing run.
    let metrics = run.join("metrics/rank-1.jsonl");
    let mut lines = std::fs::read_to_string(&metrics).expect("metrics");
    lines.push_str("{\"iter\": 1000000000000}\n");
    std::fs::write(&metrics, lines).expect("write");
    let out = peregrine(&["simulate", "--replay", &run.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out).1.contains("metrics/rank-1.jsonl:61: `iter` must be an iteration of the run's 60"),
        "{:?}",
        text(&out)
    );
    // A run directory that is not one.
    let out = peregrine(&["simulate", "--replay", &d.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).1.contains("config.toml"), "{:?}", text(&out));
}

#[test]
fn simulate_compares_schemes_at_scale() {
    let out = peregrine(&[
        "simulate",
        "--ranks",
        "256",
        "--threads",
        "4",
        "--iterations",
        "20",
        "--straggler",
        "persistent:rank=0,speed=0.25",
        "--scheme",
        "bsp",
        "--scheme",
        "bsp+steal",
        "--scheme",
        "backup:8",
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("simulated: 256 ranks x 4 threads, 20 iterations"), "{stdout}");
    let row = |name: &str| -> Vec<String> {
        let l =
            stdout.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name}:\n{stdout}"));
        l.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(row("ideal (bsp, no straggler)")[5], "1.00x");
    // One rank at a quarter speed: plain BSP waits for it every iteration (its 4 chunks per
    // thread take as long as 16; Ideal also waits, for the clocks it reads one by one); taking
    // over wins some of it back.
    let bsp: f64 = row("bsp ")[1].parse().expect("s/iteration");
    let steal: f64 = row("bsp+steal")[1].parse().expect("s/iteration");
    let ideal: f64 = row("ideal")[4].parse().expect("s/iteration");
    assert!(bsp > 1.5 * ideal && steal < bsp, "{stdout}");
    // The balanced bound, and the schemes that compute every chunk at or above it.
    assert!(stdout.contains("balanced bound: "), "{stdout}");
    for name in ["bsp ", "bsp+steal"] {
        let vs: f64 = row(name)[8].trim_end_matches('x').parse().expect("vs bound");
        assert!(vs >= 1.0, "{name}: {vs}\n{stdout}");
    }
    for bad in [
        &["simulate", "--ranks", "0"][..],
        &["simulate", "--scheme", "bulk"],
        &["simulate", "--intra", "carrier-pigeon"],
    ] {
        let out = peregrine(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {:?}", text(&out));
    }
    let out = peregrine(&["simulate", "--ranks", "8", "--straggler", "persistent:rank=99,speed=0.5"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("rank 99 does not exist in a world of 8"), "{:?}", text(&out));
    assert!(text(&out).0.is_empty(), "refused before anything is printed: {:?}", text(&out));
    let out = peregrine(&["simulate", "--ranks", "4", "--scheme", "backup:4"]);
    assert_eq!(out.status.code(), Some(2), "{:?}", text(&out));
    assert!(text(&out).1.contains("backup:4"), "{:?}", text(&out));
}

#[test]
fn experiment_simulates_worlds_and_writes_tables_and_plots() {
    let d_tmp = scratch("experiment-sim");
    let d = d_tmp.path();
    let cfg = d.join("sim.toml");
    std::fs::write(
        &cfg,
        "name = \"sim\"\nmode = \"simulate\"\nschemes = [\"bsp+steal\", \"flexrr:2\"]\n\
         patterns = [\"persistent:rank=0,speed=0.5\"]\nranks = [8, 64]\nthreads = [1, 4]\n\
         [simulate]\niterations = 30\nchunk-time = 1e-4\ntarget-iterations = 25\ninter = \"ethernet\"\n",
    )
    .expect("write");
    let out = d.join("out");
    let run = peregrine(&["experiment", &cfg.to_string_lossy(), "--out", &out.to_string_lossy()]);
    let (stdout, stderr) = text(&run);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    // bsp and ideal added: 2 x 2 worlds x 2 patterns x 3 schemes.
    assert!(stdout.contains("[24/24]"), "{stdout}");
    let summary = std::fs::read_to_string(out.join("summary.csv")).expect("summary.csv");
    let ideal = summary.lines().find(|l| l.starts_with("64x4,\"ideal\",bsp,")).expect("the ideal row");
    assert!(ideal.contains(",1.0000,"), "Ideal relative to itself: {ideal}");
    for what in ["time-per-iteration", "waste"] {
        let png = std::fs::read(out.join(format!("plots/8x1-persistent_rank_0_speed_0_5-{what}.png")))
            .expect("png");
        assert!(png.starts_with(b"\x89PNG"), "{what}");
    }
    assert!(!out.join("plots/8x1-ideal-loss.png").exists(), "nothing trained, no loss curve");
    std::fs::write(&cfg, "name = \"sim\"\nmode = \"simulate\"\nschemes = [\"bsp\"]\npatterns = [\"ideal\"]\n[simulate]\nranks = 4\n")
        .expect("write");
    let run = peregrine(&["experiment", &cfg.to_string_lossy(), "--out", &out.to_string_lossy()]);
    assert_eq!(run.status.code(), Some(2), "{:?}", text(&run));
    assert!(text(&run).1.contains("[simulate] ranks"), "{:?}", text(&run));
}

/// A batch cut into fewer chunks than there are ranks is said at start (the last ranks would
/// compute only what they take over), with the chunk size that gives every rank one; a batch
/// that does is not.
#[test]
fn ranks_left_without_a_chunk_are_named_at_start() {
    let t = scratch("idle-ranks");
    let s = |n: &str| t.path().join(n).to_string_lossy().into_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "4000", "--features", "300"]);
    let stderr = |chunk: &str, run: &str| {
        let (data, dir) = (s("d.pgd"), s(run));
        let args = ["train", "--model", "lr", "--data", &data, "--ranks", "4", "--batch", "128"];
        ok(&[&args[..], &["--chunk", chunk, "--iterations", "3", "--run-dir", &dir, "-q"]].concat()).1
    };
    let idle = stderr("64", "a");
    assert!(
        idle.contains(
            "warning: --batch 128 in chunks of 64 rows is 2 chunk(s) an iteration for 4 ranks: ranks 2 to 3"
        ) && idle.contains("--chunk 32 or less gives every rank one"),
        "{idle}"
    );
    let busy = stderr("32", "b");
    assert!(!busy.contains("chunk(s) an iteration"), "{busy}");
}

/// Runs `peregrine args`, expecting success; its standard output and error.
fn ok(args: &[&str]) -> (String, String) {
    let out = peregrine(args);
    let t = text(&out);
    assert!(out.status.success(), "peregrine {args:?}:\n{}\n{}", t.0, t.1);
    t
}

/// The final evaluation's loss and metric in a run directory's summary.
fn final_eval(run: &Path) -> (f64, f64) {
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).expect("summary"))
            .expect("json");
    let e = s["evals"].as_array().and_then(|e| e.last()).expect("an evaluation").clone();
    (e["loss"].as_f64().expect("loss"), e["metric"].as_f64().expect("metric"))
}

/// `predict`'s "loss L, metric M" line.
fn predicted(stderr: &str) -> (f64, f64) {
    let tail = stderr.rsplit(": loss ").next().expect("a loss");
    let mut it = tail.split([',', ' ']).filter(|w| !w.is_empty());
    let loss = it.next().and_then(|w| w.parse().ok()).expect("loss");
    let metric = it.nth(1).and_then(|w| w.trim().parse().ok()).expect("metric");
    (loss, metric)
}

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
fn an_mlp_split_by_units_trains_the_same_network() {
    // One rank of 2 threads, the hidden units split between them or chunks of their own: the
    // same model file (in PyTorch's order either way), up to the sums' grouping.
    let t = scratch("split-units");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "2000", "--features", "12", "--classes", "3"]);
    let data = s("d.pgd");
    for split in ["rows", "units"] {
        let run = format!("run-{split}");
        let out = peregrine_in(
            d,
            &[
                "train",
                "--model",
                "mlp",
                "--hidden",
                "40",
                "--data",
                &data,
                "--split",
                split,
                "--iterations",
                "30",
                "--batch",
                "64",
                "--ranks",
                "1",
                "--threads",
                "2",
                "-q",
                "--run-dir",
                &run,
            ],
        );
        assert!(out.status.success(), "{split}: {:?}", text(&out));
    }
    let (rows, units) = (
        safetensors_f32(&d.join("run-rows/model.safetensors")),
        safetensors_f32(&d.join("run-units/model.safetensors")),
    );
    assert_eq!(rows.keys().collect::<Vec<_>>(), units.keys().collect::<Vec<_>>());
    for (name, r) in &rows {
        let u = &units[name];
        let worst = r.iter().zip(u).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-3, "{name}: the two differ by up to {worst}");
    }
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

/// `train` of LR on `data` into `run`: `iterations` of batches of 512 in chunks of 64, a
/// checkpoint every 100, quiet, then `extra` (the runs the failure tests cut short).
fn lr_train(data: &str, run: &str, iterations: &str, extra: &[&str]) -> Vec<String> {
    let base = ["train", "--model", "lr", "--data", data, "--iterations", iterations, "--batch", "512"];
    let more = ["--chunk", "64", "--checkpoint-every", "100", "--run-dir", run, "--quiet"];
    base.iter().chain(&more).chain(extra).map(|a| (*a).to_owned()).collect()
}

/// [`lr_train`] started (not awaited).
fn spawn_train(data: &str, run: &str, iterations: &str, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(lr_train(data, run, iterations, extra))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start peregrine")
}

/// Waits (at most a minute) until `path` exists.
fn wait_for_file(path: &Path) {
    let start = std::time::Instant::now();
    while !path.exists() {
        assert!(start.elapsed().as_secs() < 60, "no {} written", path.display());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill");
    assert!(ok.success(), "kill {sig} {pid}");
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

// Hostile inputs and faults: no panic, hang or death by signal; a message naming what and where.

/// Section `i`'s (offset, bytes) in a dataset file's header.
fn section(bytes: &[u8], i: usize) -> (usize, usize) {
    let at = 56 + 16 * i;
    let word = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes")) as usize;
    (word(at), word(at + 8))
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

/// A generated dataset large enough that training maps it for a while, and a run on it that
/// goes on until stopped.
fn long_run(d: &Path, extra: &[&str]) -> (std::path::PathBuf, std::process::Child) {
    let data = d.join("big.pgd");
    let s = data.to_str().expect("utf-8");
    ok(&["data", "gen", "sparse", s, "--rows", "100000", "--features", "5000", "--nnz-per-row", "20"]);
    let run = d.join("run");
    let child = spawn_train(s, run.to_str().expect("utf-8"), "100000000", extra);
    wait_for_file(&run.join("metrics").join("rank-1.jsonl"));
    (data, child)
}

/// Waits for `child` at most `limit`; its output and how long it took.
fn finish_within(child: std::process::Child, limit: std::time::Duration) -> (Output, std::time::Duration) {
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

/// Overwrites part of the indices of a mapped dataset in place with indices far beyond its
/// features: the kernels index out of bounds on a compute thread.
fn scribble_indices(data: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let head = std::fs::read(data).expect("read")[..192].to_vec();
    let (at, len) = section(&head, 1);
    let mut f = std::fs::OpenOptions::new().write(true).open(data).expect("open");
    f.seek(SeekFrom::Start((at + len / 2) as u64)).expect("seek");
    f.write_all(&[0xff; 1 << 16]).expect("write");
}

#[test]
fn a_panic_on_a_compute_thread_ends_the_run_naming_rank_and_thread() {
    let t = scratch("panic");
    let (data, child) = long_run(t.path(), &["--ranks", "2", "--watchdog", "0", "--huge-pages", "off"]);
    scribble_indices(&data);
    let (out, took) = finish_within(child, std::time::Duration::from_secs(60));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(101), "{stderr}");
    assert!(took.as_secs() < 20, "{took:?}");
    // A rank of one compute thread on its loop thread's own core runs its chunks on that thread.
    let named = stderr.contains("(pgr-s") || stderr.contains("run on its loop thread (rank-");
    assert!(stderr.contains("compute thread") && named, "{stderr}");
    assert!(stderr.contains("big.pgd (its modification time changed)"), "{stderr}");
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

#[test]
fn default_run_directories_are_unique_and_results_are_not_overwritten() {
    let t = scratch("unique");
    let d = t.path();
    let data = d.join("d.pgd");
    ok(&["data", "gen", "sparse", data.to_str().expect("utf-8"), "--rows", "2000", "--features", "100"]);
    // Four runs started at once (a seed sweep) in one directory: four run directories.
    let runs: Vec<_> = (1..=4)
        .map(|seed| {
            Command::new(env!("CARGO_BIN_EXE_peregrine"))
                .args([
                    "train",
                    "--model",
                    "lr",
                    "--data",
                    data.to_str().expect("utf-8"),
                    "--iterations",
                    "5",
                ])
                .args(["--seed", &seed.to_string(), "--quiet"])
                .current_dir(d)
                .output()
                .expect("run")
        })
        .collect();
    for out in &runs {
        assert!(out.status.success(), "{}", text(out).1);
    }
    let dirs: Vec<_> =
        std::fs::read_dir(d.join("runs")).expect("runs/").map(|e| e.expect("entry").path()).collect();
    assert_eq!(dirs.len(), 4, "{dirs:?}");
    for dir in &dirs {
        assert!(dir.join("summary.json").exists(), "{}", dir.display());
    }
    // A finished run directory is not written again without --force.
    let again = peregrine_in(d, &["train", "--model", "lr", "--data", "d.pgd", "--iterations", "5"]);
    assert!(again.status.success());
    let run = dirs[0].to_str().expect("utf-8");
    let before = std::fs::read(dirs[0].join("summary.json")).expect("summary");
    let out = peregrine_in(
        d,
        &["train", "--model", "lr", "--data", "d.pgd", "--iterations", "7", "--run-dir", run],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out).1);
    assert!(text(&out).1.contains("holds a finished run"), "{}", text(&out).1);
    assert_eq!(std::fs::read(dirs[0].join("summary.json")).expect("summary"), before, "results kept");
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

/// The training set copied into memory with huge pages or read through its mapping, the model is
/// the same to the last bit (1 rank, 1 thread: a deterministic run); the set is 9.4 MB, past the
/// 8 MiB below which nothing is copied. A value other than auto, on or off is refused.
#[test]
fn the_training_set_in_huge_pages_trains_the_model_of_the_mapped_file() {
    let t = scratch("huge-pages");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "3000", "--features", "784", "--classes", "10"]);
    let model = |when: &str| {
        let run = s(&format!("run-{when}"));
        ok(&[
            "train",
            "--model",
            "softmax",
            "--data",
            &s("d.pgd"),
            "--iterations",
            "30",
            "--ranks",
            "1",
            "--threads",
            "1",
            "--checkpoint-every",
            "0",
            "--huge-pages",
            when,
            "--run-dir",
            &run,
            "-q",
        ]);
        let bytes = std::fs::read(Path::new(&run).join("model.safetensors")).expect("model");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let mut tensors: Vec<(String, Vec<u8>)> =
            st.tensors().into_iter().map(|(name, v)| (name, v.data().to_vec())).collect();
        tensors.sort();
        tensors
    };
    let off = model("off");
    assert!(model("on") == off, "on: another model");
    assert!(model("auto") == off, "auto: another model");
    let out = peregrine(&["train", "--model", "softmax", "--data", &s("d.pgd"), "--huge-pages", "sometimes"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--huge-pages") && stderr.contains("sometimes"), "{stderr}");
}

/// `--hash-bits`: LIBSVM data whose feature ids reach 2^32 - 2 (a model of one weight a column
/// would be 4 G weights) trains hashed into 2^12 buckets, learns the label that two of those ids
/// decide, records the bits in config.toml and model.safetensors, and predicts what it was
/// evaluated at (predict hashes alike); out-of-range bits and other models are refused with
/// nothing written.
#[test]
fn hashed_features_train_on_raw_ids_and_predict_alike() {
    let t = scratch("hashed");
    let d = t.path();
    let s = |p: &Path| p.to_str().expect("utf-8").to_owned();
    let mut svm = String::new();
    let mut state = 7u64;
    for row in 0..3000u64 {
        // A few noise ids spread over all of u32, and one of two deciding ids.
        let y = row % 2;
        let mut ids: Vec<u64> = (0..4)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) % 4_000_000_000
            })
            .collect();
        ids.push(if y == 1 { 4_294_967_294 } else { 123_456_789 });
        ids.sort_unstable();
        ids.dedup();
        let feats: Vec<String> = ids.iter().map(|i| format!("{}:1", i + 1)).collect();
        svm.push_str(&format!("{y} {}\n", feats.join(" ")));
    }
    std::fs::write(d.join("raw.svm"), svm).expect("write");
    let data = s(&d.join("raw.pgd"));
    ok(&["data", "convert", "libsvm", &s(&d.join("raw.svm")), &data]);
    let run = d.join("run");
    let r = s(&run);
    let base = ["train", "--model", "lr", "--data", &data, "--run-dir", &r, "--quiet"];
    for (extra, want) in [
        (&["--hash-bits", "0"][..], "--hash-bits must be from 1 to 28"),
        (&["--hash-bits", "29"], "--hash-bits must be from 1 to 28"),
        (&["--hash-bits=-3"], "--hash-bits"),
    ] {
        let out = peregrine(&[&base[..], extra].concat());
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!run.exists(), "{extra:?} wrote {r}");
    }
    let out =
        peregrine(&["train", "--model", "softmax", "--data", &data, "--hash-bits", "12", "--run-dir", &r]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("--hash-bits is for --model lr"), "{:?}", text(&out));
    assert!(!run.exists());
    ok(&[&base[..], &["--hash-bits", "12", "--epochs", "5", "--ranks", "2"]].concat());
    let (loss, accuracy) = final_eval(&run);
    assert!(loss < 0.4 && accuracy > 0.97, "hashed LR (blind: 0.693): loss {loss}, accuracy {accuracy}");
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    assert!(config.contains("hash-bits = 12"), "{config}");
    let bytes = std::fs::read(run.join("model.safetensors")).expect("model");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json header");
    assert_eq!(header["weight"]["shape"], serde_json::json!([4096]));
    assert_eq!(header["__metadata__"]["hash_bits"], "12");
    let (_, stderr) = ok(&["predict", "--model", &r, "--data", &data, "-o", &s(&d.join("p.csv"))]);
    let (p_loss, p_accuracy) = predicted(&stderr);
    assert!((p_loss - loss).abs() <= 1e-4, "predict loss {p_loss} vs training's {loss}");
    assert!((p_accuracy - accuracy).abs() <= 1e-3, "{p_accuracy} vs {accuracy}");
    // The configuration file runs it again.
    let again = d.join("again");
    ok(&["train", "--config", &s(&run.join("config.toml")), "--run-dir", &s(&again), "--quiet"]);
    // (Within float noise: which rank sums which chunk varies from run to run.)
    let again_loss = final_eval(&again).0;
    assert!((again_loss - loss).abs() <= 1e-4 * loss, "the recorded configuration: {again_loss} vs {loss}");
}
