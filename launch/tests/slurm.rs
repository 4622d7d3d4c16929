//! Peregrine under a real Slurm: `srun -n 4` directly, an sbatch job whose `srun` runs 4 ranks,
//! and a job that is told to stop before its time limit, saves its state, is requeued and resumes.
//!
//! `$PEREGRINE_SRUN_MPI` names srun's MPI plugin: `pmix` (OpenMPI, the default) or `pmi2` (MPICH).
//!
//! Needs a running Slurm whose `SLURM_CONF` is in the environment (`scripts/slurm-local.sh start`
//! starts a single-node one on loopback; `scripts/test.sh` does it before running these tests).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_peregrine")
}

/// Fails with a clear message if there is no Slurm to talk to.
fn slurm_up() {
    let conf = std::env::var("SLURM_CONF").unwrap_or_default();
    assert!(
        !conf.is_empty() && Path::new(&conf).exists(),
        "these tests need a running Slurm: run `scripts/slurm-local.sh start` and export the SLURM_CONF it prints"
    );
    let out =
        Command::new("sinfo").args(["-h", "-o", "%T"]).output().expect("sinfo (slurm-client installed?)");
    assert!(out.status.success(), "sinfo failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A command with the environment OpenMPI needs on this small machine: more ranks than cores, so
/// idle ranks must yield (srun, unlike mpirun, does not tell OpenMPI that it oversubscribes).
fn cmd(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env("OMPI_MCA_mpi_yield_when_idle", "1");
    c
}

/// srun's `--mpi` plugin for the MPI library this binary was built against.
fn plugin() -> String {
    std::env::var("PEREGRINE_SRUN_MPI").unwrap_or_else(|_| "pmix".to_owned())
}

fn text(out: &Output) -> String {
    format!("{}\n--- stderr\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A fresh directory for one test (the jobs run as root, as the test does), removed when it ends.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-slurm-{name}-")).tempdir().expect("scratch dir")
}

fn job_field(id: &str, field: &str) -> String {
    let out = Command::new("scontrol").args(["show", "job", id]).output().expect("scontrol");
    let s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{field}=")).map(str::to_owned))
        .unwrap_or_default()
}

/// Waits (at most `limit`) until `done()`; on time-out cancels the job and panics with `context()`.
fn wait_for(
    id: &str,
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            let _ = Command::new("scancel").arg(id).status();
            panic!("job {id}: timed out after {limit:?} waiting for {what}\n{}", context());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Submits `peregrine slurm sbatch ... -- <command>` from `dir`; returns the job id.
fn submit(dir: &Path, command: &[&str]) -> String {
    let out = cmd(exe())
        .current_dir(dir)
        .args(["slurm", "sbatch", "--ntasks-per-node", "4", "--time", "5", "--job-name", "ptest", "--submit"])
        .args(["--mpi", &plugin(), "--"])
        .args(command)
        .output()
        .expect("run peregrine slurm sbatch");
    assert!(out.status.success(), "peregrine slurm sbatch failed:\n{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()), "not a job id: `{id}`");
    id
}

/// Sends job `id` what Slurm sends before a time limit, waits for its requeue, lets it start
/// again at once and waits (at most `limit`) for it to complete; `output` is its log.
fn warn_requeue_and_complete(id: &str, output: &Path, limit: Duration) {
    let status = Command::new("scancel").args(["--signal=USR1", id]).status().expect("scancel");
    assert!(status.success());
    wait_for(
        id,
        Duration::from_secs(120),
        "the requeue",
        || job_field(id, "Restarts") == "1",
        || read(output),
    );
    // A requeued job waits (BeginTime) before it may start again: let it start now.
    let _ = Command::new("scontrol").args(["update", &format!("jobid={id}"), "StartTime=now"]).status();
    wait_for(id, limit, "completion", || job_field(id, "JobState") == "COMPLETED", || read(output));
}

/// Held by the tests whose jobs are requeued: the single node runs one 4-task job at a time, so
/// two such tests at once would queue each other's requeued job behind their own.
static REQUEUE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn srun_n4_runs_one_mpi_world() {
    slurm_up();
    let mpi = format!("--mpi={}", plugin());
    let out = cmd("srun")
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
    slurm_up();
    let out = cmd("srun").args(["-n", "4", exe(), "slurm", "env"]).output().expect("srun");
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut procids: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("slurm_procid=")).collect();
    procids.sort_unstable();
    assert_eq!(procids, ["0", "1", "2", "3"], "{stdout}");
    assert_eq!(stdout.lines().filter(|l| *l == "slurm_ntasks=4").count(), 4, "{stdout}");
}

#[test]
fn srun_without_an_mpi_plugin_is_a_clear_error() {
    slurm_up();
    let out = cmd("srun").args(["-n", "2", "--mpi=none", exe(), "conformance"]).output().expect("srun");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("no MPI launcher is visible"), "{}", text(&out));
}

#[test]
fn srun_singletons_are_detected() {
    slurm_up();
    // Without a PMI plugin, MPICH starts 4 one-rank worlds (OpenMPI fails in MPI_Init): either way
    // the job must fail, not run 4 copies of the work.
    let out = cmd("srun")
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
    slurm_up();
    let dir_tmp = scratch("sbatch");
    let dir = dir_tmp.path();
    let id = submit(dir, &["conformance", "--tickets", "5000", "--rounds", "20"]);
    let output = dir.join(format!("ptest-{id}.out"));
    wait_for(
        &id,
        Duration::from_secs(120),
        "completion",
        || job_field(&id, "JobState") == "COMPLETED",
        || read(&output),
    );
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
    slurm_up();
    let _node = REQUEUE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir_tmp = scratch("requeue");
    let dir = dir_tmp.path();
    let id = submit(dir, &["conformance", "--tickets", "2000", "--repeat", "300"]);
    let output = dir.join(format!("ptest-{id}.out"));
    // Once it is well under way, send what Slurm sends before the time limit.
    wait_for(
        &id,
        Duration::from_secs(120),
        "round 3",
        || read(&output).contains("[3/300]"),
        || read(&output),
    );
    warn_requeue_and_complete(&id, &output, Duration::from_secs(180));
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
    slurm_up();
    let _node = REQUEUE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir_tmp = scratch("train-requeue");
    let dir = dir_tmp.path();
    let data = dir.join("d.pgd");
    let out = Command::new(exe())
        .args(["data", "gen", "sparse", &data.to_string_lossy(), "--rows", "20000", "--features", "500"])
        .output()
        .expect("data gen");
    assert!(out.status.success(), "{}", text(&out));
    let args = [
        "train",
        "--model",
        "lr",
        "--data",
        "d.pgd",
        "--iterations",
        "10000",
        "--batch",
        "512",
        "--chunk",
        "64",
        "-q",
    ];
    let id = submit(dir, &args);
    let output = dir.join(format!("ptest-{id}.out"));
    let metrics = dir.join(format!("runs/ptest-{id}/metrics/rank-0.jsonl"));
    // Once it is well under way, send what Slurm sends before the time limit.
    wait_for(
        &id,
        Duration::from_secs(120),
        "200 iterations",
        || read(&metrics).lines().count() >= 200,
        || read(&output),
    );
    warn_requeue_and_complete(&id, &output, Duration::from_secs(300));
    let log = read(&output);
    assert!(log.contains("stopped on a signal; state saved in"), "{log}");
    assert!(log.contains(&format!("requeueing job {id}")), "{log}");
    let resumed = log
        .lines()
        .find(|l| l.starts_with("resuming from iteration"))
        .unwrap_or_else(|| panic!("no resume:\n{log}"));
    assert!(resumed.contains(&format!("runs/ptest-{id}/checkpoint.safetensors")), "{resumed}");
    let summary = read(&dir.join(format!("runs/ptest-{id}/summary.json")));
    assert!(summary.contains("\"iterations\": 10000"), "{summary}\n{log}");
}

#[test]
fn a_task_killed_under_srun_ends_the_step_and_the_rerun_resumes() {
    slurm_up();
    let _node = REQUEUE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir_tmp = scratch("srun-kill");
    let dir = dir_tmp.path();
    let s = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let out = Command::new(exe())
        .args(["data", "gen", "sparse", &s("d.pgd"), "--rows", "20000", "--features", "500"])
        .output()
        .expect("data gen");
    assert!(out.status.success(), "{}", text(&out));
    let mpi = format!("--mpi={}", plugin());
    let run = s("killed");
    let srun = |out: bool| {
        let mut c = cmd("srun");
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
    assert!(ended <= Duration::from_secs(10), "the step ended {ended:?} after task 1 was killed:\n{all}");
    // srun names the task and the signal ("srun: error: <node>: task 1: Killed"); Slurm's PMIx
    // plugin cancels the step, under PMI-2 --kill-on-bad-exit does.
    assert!(all.contains("task 1: Killed"), "{all}");
    assert!(!dir.join("killed/summary.json").exists(), "the run finished before task 1 was killed");
    let again = srun(false).output().expect("srun");
    assert!(again.status.success(), "{}", text(&again));
    assert!(String::from_utf8_lossy(&again.stderr).contains("resuming from iteration"), "{}", text(&again));
}
