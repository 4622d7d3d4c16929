//! Peregrine under a real Slurm: `srun -n 4` directly, an sbatch job whose `srun` runs 4 ranks,
//! and a job that is told to stop before its time limit, saves its state, is requeued and resumes.
//!
//! `$PEREGRINE_SRUN_MPI` names srun's MPI plugin: `pmix` (OpenMPI, the default) or `pmi2` (MPICH).
//!
//! Needs a running Slurm whose `SLURM_CONF` is in the environment (`scripts/slurm-local.sh start`
//! starts a single-node one on loopback; `scripts/test.sh` does it before running these tests).
//!
//! [`cluster`]: the same across nodes, on the multi-node cluster in network namespaces of
//! `scripts/cluster-local.sh` (started by `scripts/test.sh` too).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_peregrine")
}

#[path = "support/slurm_jobs.rs"]
mod slurm_jobs;
use slurm_jobs::{plugin, read, text, Slurm};

#[path = "support/models.rs"]
mod models;

/// The single-node cluster of the environment's `SLURM_CONF`, and [`ONE_JOB`] held.
fn slurm() -> (Slurm, std::sync::MutexGuard<'static, ()>) {
    (Slurm::from_env(), one_job())
}

/// [`ONE_JOB`], held until the guard drops.
fn one_job() -> std::sync::MutexGuard<'static, ()> {
    ONE_JOB.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A fresh directory for one test (the jobs run as root, as the test does), removed when it ends.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-slurm-{name}-")).tempdir().expect("scratch dir")
}

/// `peregrine data gen sparse <dir>/d.pgd` with `rows` rows of 300 features.
fn gen_data(dir: &Path, rows: usize) -> PathBuf {
    let data = dir.join("d.pgd");
    let out = Command::new(exe())
        .args(["data", "gen", "sparse", &data.to_string_lossy(), "--rows", &rows.to_string()])
        .args(["--features", "300"])
        .output()
        .expect("data gen");
    assert!(out.status.success(), "{}", text(&out));
    data
}

/// Submits `peregrine slurm sbatch <options> -- train --model lr --data d.pgd --iterations
/// <iterations> ...` from `dir` (`options` name the job `name`), sends it what Slurm sends before a time limit
/// once rank 0 logged `warn_after` iterations, and waits for its requeue and completion. Checks
/// that it saved, was requeued, resumed and ran every iteration; returns the job id and the log's
/// resume line.
fn train_warned_requeued_resumed(
    slurm: &Slurm,
    dir: &Path,
    name: &str,
    options: &[&str],
    iterations: usize,
    warn_after: usize,
) -> (String, String) {
    let iters = iterations.to_string();
    let train = ["train", "--model", "lr", "--data", "d.pgd", "--iterations", &iters, "--batch", "512"];
    let id = slurm.submit(dir, options, &[&train[..], &["--chunk", "64", "-q"]].concat());
    let output = dir.join(format!("{name}-{id}.out"));
    let metrics = dir.join(format!("runs/{name}-{id}/metrics/rank-0.jsonl"));
    // Once it is well under way, send what Slurm sends before the time limit.
    slurm.wait_for(
        &id,
        Duration::from_secs(120),
        &format!("{warn_after} iterations"),
        || read(&metrics).lines().count() >= warn_after,
        || read(&output),
    );
    slurm.warn_requeue_and_complete(&id, &output, Duration::from_secs(300));
    let log = read(&output);
    assert!(log.contains("stopped on a signal; state saved in"), "{log}");
    assert!(log.contains(&format!("requeueing job {id}")), "{log}");
    let resumed = log
        .lines()
        .find(|l| l.starts_with("resuming from iteration"))
        .unwrap_or_else(|| panic!("no resume:\n{log}"))
        .to_owned();
    let summary = read(&dir.join(format!("runs/{name}-{id}/summary.json")));
    assert!(summary.contains(&format!("\"iterations\": {iterations}")), "{summary}\n{log}");
    (id, resumed)
}

/// The options of the tests' batch jobs on one node.
const ONE_NODE: [&str; 6] = ["--ntasks-per-node", "4", "--time", "5", "--job-name", "ptest"];

/// Held by every test for as long as its job runs: one job at a time, on either cluster. The
/// single node runs one 4-task job at a time (two requeue tests at once would queue each other's
/// requeued job behind their own), and MPI ranks poll: a 4-rank world beside a job on the
/// multi-node cluster starved one of its ranks' accumulates (UCX over TCP) past the 15 s a rank
/// asked to stop has to reach its checkpoint.
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn srun_n4_runs_one_mpi_world() {
    let (slurm, _one) = slurm();
    let mpi = format!("--mpi={}", plugin());
    let out = slurm
        .cmd("srun")
        .args(["-n", "4", &mpi, exe(), "conformance", "--tickets", "5000", "--rounds", "20"])
        .output()
        .expect("srun");
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("all cases passed on 4 ranks (mpi)"),
        "{}",
        text(&out)
    );
}

#[test]
fn srun_tasks_read_their_slurm_environment() {
    let (slurm, _one) = slurm();
    let out = slurm.cmd("srun").args(["-n", "4", exe(), "slurm", "env"]).output().expect("srun");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut procids: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("slurm_procid=")).collect();
    procids.sort_unstable();
    assert_eq!(procids, ["0", "1", "2", "3"], "{stdout}");
    assert_eq!(stdout.lines().filter(|l| *l == "slurm_ntasks=4").count(), 4, "{stdout}");
}

#[test]
fn srun_without_an_mpi_plugin_is_a_clear_error() {
    let (slurm, _one) = slurm();
    let out = slurm.cmd("srun").args(["-n", "2", "--mpi=none", exe(), "conformance"]).output().expect("srun");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("no MPI launcher is visible"), "{}", text(&out));
}

#[test]
fn srun_singletons_are_detected() {
    let (slurm, _one) = slurm();
    // Without a PMI plugin, MPICH starts 4 one-rank worlds (OpenMPI fails in MPI_Init): either way
    // the job must fail, not run 4 copies of the work.
    let out = slurm
        .cmd("srun")
        .args(["-n", "4", "--mpi=none", exe(), "conformance", "--backend", "mpi"])
        .output()
        .expect("srun");
    assert!(!out.status.success(), "{}", text(&out));
    if plugin() == "pmi2" {
        assert!(text(&out).contains("did not join srun's tasks into one world"), "{}", text(&out));
    }
}

#[test]
fn an_sbatch_job_runs_4_ranks_and_records_them() {
    let (slurm, _one) = slurm();
    let dir_tmp = scratch("sbatch");
    let dir = dir_tmp.path();
    let id = slurm.submit(dir, &ONE_NODE, &["conformance", "--tickets", "5000", "--rounds", "20"]);
    let output = dir.join(format!("ptest-{id}.out"));
    slurm.completes(&id, &id, Duration::from_secs(120), &output);
    let log = read(&output);
    assert!(log.contains("all cases passed on 4 ranks (mpi)"), "{log}");
    let meta = read(&dir.join(format!("runs/ptest-{id}/meta.json")));
    for rank in 0..4 {
        assert!(
            meta.contains(&format!("\"slurm_procid\": \"{rank}\"")),
            "rank {rank} missing in meta.json:\n{meta}"
        );
    }
    assert!(meta.contains(&format!("\"slurm_job_id\": \"{id}\"")), "{meta}");
}

#[test]
fn a_job_warned_before_its_time_limit_saves_requeues_and_resumes() {
    let (slurm, _one) = slurm();
    let dir_tmp = scratch("requeue");
    let dir = dir_tmp.path();
    let id = slurm.submit(dir, &ONE_NODE, &["conformance", "--tickets", "2000", "--repeat", "300"]);
    let output = dir.join(format!("ptest-{id}.out"));
    // Once it is well under way, send what Slurm sends before the time limit.
    slurm.wait_for(
        &id,
        Duration::from_secs(120),
        "round 3",
        || read(&output).contains("[3/300]"),
        || read(&output),
    );
    slurm.warn_requeue_and_complete(&id, &output, Duration::from_secs(180));
    let log = read(&output);
    assert!(log.contains("state saved in runs/ptest-"), "{log}");
    assert!(log.contains(&format!("requeueing job {id}")), "{log}");
    let resumed =
        log.lines().find(|l| l.starts_with("resuming from")).unwrap_or_else(|| panic!("no resume:\n{log}"));
    assert!(resumed.contains(&format!("runs/ptest-{id}/checkpoint.json")), "{resumed}");
    assert!(log.contains("all cases passed on 4 ranks (mpi)"), "{log}");
    // Every round ran: the last one's last case is there, and the checkpoint is gone.
    assert!(log.contains("[300/300] ok   bad-use-is-an-error"), "{log}");
    assert!(!dir.join(format!("runs/ptest-{id}/checkpoint.json")).exists());
}

#[test]
fn a_training_job_warned_before_its_time_limit_checkpoints_requeues_and_resumes() {
    let (slurm, _one) = slurm();
    let dir_tmp = scratch("train-requeue");
    let dir = dir_tmp.path();
    gen_data(dir, 20000);
    let (id, resumed) = train_warned_requeued_resumed(&slurm, dir, "ptest", &ONE_NODE, 10000, 200);
    assert!(resumed.contains(&format!("runs/ptest-{id}/checkpoint.safetensors")), "{resumed}");
}

#[test]
fn a_task_killed_under_srun_ends_the_step_and_the_rerun_resumes() {
    let (slurm, _one) = slurm();
    let dir_tmp = scratch("srun-kill");
    let dir = dir_tmp.path();
    let s = |name: &str| dir.join(name).to_string_lossy().into_owned();
    gen_data(dir, 20000);
    let mpi = format!("--mpi={}", plugin());
    let run = s("killed");
    let srun = |out: bool| {
        let mut c = slurm.cmd("srun");
        c.args(["-n", "2", &mpi]);
        if plugin() == "pmi2" {
            // As the batch scripts do: with PMI-2 nothing else ends the step (see sbatch.rs).
            c.arg("--kill-on-bad-exit=1");
        }
        c.args([exe(), "train", "--model", "lr", "--data", &s("d.pgd")])
            .args(["--iterations", "3000", "--batch", "512", "--chunk", "64", "--checkpoint-every", "100"])
            .args(["--run-dir", &run, "-q"]);
        if out {
            c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        }
        c
    };
    let child = srun(true).spawn().expect("srun");
    let ckpt = dir.join("killed/checkpoint.safetensors");
    let start = Instant::now();
    while !ckpt.exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint written");
        std::thread::sleep(Duration::from_millis(5));
    }
    // Task 1: the process whose Slurm environment says so.
    let pids = Command::new("pgrep").args(["-f", &run]).output().expect("pgrep");
    let victim = String::from_utf8_lossy(&pids.stdout)
        .split_whitespace()
        .find(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            comm.trim() == "peregrine"
                && String::from_utf8_lossy(&env).split('\0').any(|kv| kv == "SLURM_PROCID=1")
        })
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no task 1 among {:?}", String::from_utf8_lossy(&pids.stdout)));
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-9", &victim]).status().expect("kill").success());
    let out = child.wait_with_output().expect("wait");
    let ended = killed.elapsed();
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    // Under PMIx, Slurm's plugin ends the step at once. Under PMI-2, --kill-on-bad-exit sends the
    // survivor SIGTERM, which it takes for a stop it cannot reach: its watchdog ends it within the
    // stop's grace (15 s, STOP_GRACE in train/run.rs). Both well before Slurm's SIGKILL, 30 s
    // (KillWait) after SIGTERM, so the step did not merely wait to be killed.
    assert!(ended <= Duration::from_secs(25), "the step ended {ended:?} after task 1 was killed:\n{all}");
    // srun names the task and the signal ("srun: error: <node>: task 1: Killed"); Slurm's PMIx
    // plugin cancels the step, under PMI-2 --kill-on-bad-exit does.
    assert!(all.contains("task 1: Killed"), "{all}");
    assert!(!dir.join("killed/summary.json").exists(), "the run finished before task 1 was killed");
    let again = srun(false).output().expect("srun");
    assert!(again.status.success(), "{}", text(&again));
    assert!(String::from_utf8_lossy(&again.stderr).contains("resuming from iteration"), "{}", text(&again));
}

/// Across nodes: the cluster of `scripts/cluster-local.sh` (4 nodes in network namespaces, two of
/// node type `type-a`, two of `type-b`; MPI between them over TCP). The ranks choose OpenMPI's
/// one-sided component themselves (the tests' `OMPI_MCA_osc` is removed): UCX over TCP between
/// nodes. One job at a time: the machine has 2 cores, and UCX polls.
mod cluster {
    use super::{exe, plugin, read, slurm_jobs, text, Slurm};
    use std::path::Path;
    use std::time::Duration;

    /// The multi-node cluster, and [`super::ONE_JOB`] held.
    fn cluster() -> (Slurm, std::sync::MutexGuard<'static, ()>) {
        (Slurm::namespaced(), super::one_job())
    }

    /// A scratch directory on the shared file system (each node has its own /tmp).
    fn scratch(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("cluster-{name}-"))
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("scratch dir")
    }

    fn srun(slurm: &Slurm, args: &[&str]) -> std::process::Command {
        let mut c = slurm.cmd("srun");
        c.arg(format!("--mpi={}", plugin())).args(args);
        c
    }

    /// The hosts of meta.json's ranks, in rank order.
    fn hosts(meta: &str) -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(meta).unwrap_or_else(|e| panic!("{e}: {meta}"));
        let ranks = v["ranks"].as_array().unwrap_or_else(|| panic!("no ranks: {meta}"));
        ranks.iter().map(|r| r["host"].as_str().unwrap_or_default().to_owned()).collect()
    }

    #[test]
    fn conformance_across_two_nodes() {
        let (slurm, _one) = cluster();
        let out =
            srun(&slurm, &["-N", "2", "-n", "4", exe(), "conformance", "--tickets", "200", "--rounds", "5"])
                .output()
                .expect("srun");
        assert!(out.status.success(), "{}", text(&out));
        peregrine_tests::assert_conformance_passed(
            &String::from_utf8_lossy(&out.stdout),
            4,
            "srun -N 2 -n 4",
        );
    }

    #[test]
    fn bsp_training_across_two_nodes_gives_the_model_of_one_node() {
        let (slurm, _one) = cluster();
        let d_tmp = scratch("bsp");
        let d = d_tmp.path();
        let data = super::gen_data(d, 8000).to_string_lossy().into_owned();
        let train = ["train", "--model", "lr", "--data", &data, "--iterations", "150", "--batch", "512"];
        let run = |name: &str| d.join(name).to_string_lossy().into_owned();
        let (nodes, local) = (run("nodes"), run("local"));
        // One compute thread a rank: the 4 ranks of the two "nodes" share the host's 2 cores, and
        // with 2 threads each (8 on 2 cores) MPICH's ranks, which busy-poll UCX and serialize
        // their MPI calls on one lock, starved one node's ranks for minutes on an Intel Xeon host
        // (a BSP iteration once took 8 minutes). What is tested, the model 2 nodes make against
        // 1 node's, does not depend on the threads; BSP's model does not depend on them either.
        let more = ["--chunk", "64", "--scheme", "bsp", "--threads", "1", "-q", "--run-dir"];
        let out = srun(&slurm, &["-N", "2", "-n", "4", exe()])
            .args(train)
            .args(more)
            .arg(&nodes)
            .output()
            .expect("srun");
        assert!(out.status.success(), "{}", text(&out));
        let out = std::process::Command::new(exe())
            .args(train)
            .args(more)
            .arg(&local)
            .args(["--backend", "local", "--ranks", "4"])
            .output()
            .expect("peregrine");
        assert!(out.status.success(), "{}", text(&out));
        let dist = super::models::model_distance(
            &Path::new(&nodes).join("model.safetensors"),
            &Path::new(&local).join("model.safetensors"),
        );
        assert!(f64::from(dist) <= peregrine_tests::training::BSP_TOLERANCE, "{dist:e} apart");
        // The two nodes' ranks combined their pulls and pushes (the model is pulled whole and
        // stepped at the owners under BSP): one copy and one update per node.
        let summary: serde_json::Value =
            serde_json::from_str(&read(&Path::new(&nodes).join("summary.json"))).expect("summary.json");
        assert_eq!(summary["node_combined"], serde_json::json!([2, 2]), "{summary}");
        let meta = read(&Path::new(&nodes).join("meta.json"));
        let mut h = hosts(&meta);
        h.sort();
        h.dedup();
        assert_eq!(h, ["pgr-n1", "pgr-n2"], "{meta}");
        // OpenMPI's one-sided component, as the ranks chose it (MPICH has its own, and no choice).
        if meta.contains("\"mpi_library\": \"Open MPI") {
            assert!(meta.contains("osc=ucx (no RDMA device on this host; ranks on 2 nodes"), "{meta}");
        } else {
            assert!(meta.contains("\"mpi_library\": \"MPICH") && !meta.contains("mpi_components"), "{meta}");
        }
    }

    #[test]
    fn rma_bench_between_nodes() {
        let (slurm, _one) = cluster();
        let args = [
            "-N",
            "2",
            "-n",
            "2",
            exe(),
            "bench",
            "rma",
            "--max-size",
            "64K",
            "--iters",
            "200",
            "--trials",
            "1",
        ];
        let out = srun(&slurm, &args).output().expect("srun");
        assert!(out.status.success(), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        for op in ["get", "put", "accumulate", "fetch_add"] {
            assert!(stdout.lines().any(|l| l.contains(op)), "{op} missing:\n{stdout}");
        }
        assert!(stdout.to_lowercase().contains("raw"), "no raw-MPI reference:\n{stdout}");
    }

    /// One rank on a `type-a` node and two on a `type-b` node (2 and 4 CPUs), one MPI world: a
    /// BSP training job.
    #[test]
    fn a_heterogeneous_job_runs_across_two_node_types() {
        let (slurm, _one) = cluster();
        let d_tmp = scratch("het");
        let d = d_tmp.path();
        super::gen_data(d, 8000);
        // Ten minutes: the warning before the limit (two minutes before it) never comes in the wait.
        let options =
            ["--constraint", "type-a", "--het", "1:2:1::type-b", "--time", "10", "--job-name", "het"];
        let train = ["train", "--model", "lr", "--data", "d.pgd", "--iterations", "150", "--batch", "512"];
        // Not quiet: the log shows how far the ranks got.
        let id = slurm.submit(d, &options, &[&train[..], &["--chunk", "64", "--scheme", "bsp"]].concat());
        let output = d.join(format!("het-{id}.out"));
        let run = d.join(format!("runs/het-{id}"));
        // Rank 0 writes the summary once every rank has trained; then the job ends.
        let done = run.join("summary.json");
        slurm.wait_for(&id, Duration::from_secs(240), "the summary", || done.exists(), || read(&output));
        let state = || slurm.job_field(&format!("{id}+0"), "JobState");
        if slurm_jobs::waits(Duration::from_secs(60), || slurm_jobs::ended(&state())) {
            assert_eq!(state(), "COMPLETED", "{}\n{}", read(&output), slurm.report(&id));
        } else {
            // Only Slurm 22.05's own hang after every task exited passes (see
            // `srun_hung_in_pmix_teardown`); the ranks' results are checked all the same.
            let report = slurm.report(&id);
            let trace = slurm_jobs::srun_hung_in_pmix_teardown(&id);
            let _ = slurm.cmd("scancel").arg(&id).status();
            slurm_jobs::kill_leftovers(&id);
            let trace = trace.unwrap_or_else(|| {
                panic!("job {id} did not end within 60 s of its summary:\n{}\n{report}", read(&output))
            });
            eprintln!("note: job {id}'s srun hung in Slurm's PMIx teardown after its tasks ended:\n{trace}");
        }
        let summary = read(&run.join("summary.json"));
        assert!(summary.contains("\"iterations\": 150"), "{summary}\n{}", read(&output));
        let meta = read(&run.join("meta.json"));
        let h = hosts(&meta);
        assert_eq!(h.len(), 3, "{meta}");
        assert!(["pgr-n1", "pgr-n2"].contains(&h[0].as_str()), "rank 0 not on a type-a node: {meta}");
        assert!(
            h[1..].iter().all(|x| x == "pgr-n3" || x == "pgr-n4"),
            "ranks 1, 2 not on type-b nodes: {meta}"
        );
        assert!(meta.contains("\"slurm_het_size\": \"2\""), "{meta}");
    }

    #[test]
    fn a_training_job_on_two_nodes_warned_before_its_time_limit_requeues_and_resumes() {
        let (slurm, _one) = cluster();
        let d_tmp = scratch("requeue");
        let d = d_tmp.path();
        super::gen_data(d, 8000);
        let two_nodes = ["--nodes", "2", "--ntasks-per-node", "1", "--time", "5", "--job-name", "pq"];
        let (id, _) = super::train_warned_requeued_resumed(&slurm, d, "pq", &two_nodes, 1500, 100);
        let mut h = hosts(&read(&d.join(format!("runs/pq-{id}/meta.json"))));
        h.sort();
        h.dedup();
        assert_eq!(h.len(), 2, "{h:?}");
    }
}
