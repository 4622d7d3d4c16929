//! Talking to a real Slurm from the tests: the single-node one whose `SLURM_CONF` is in the
//! environment (`scripts/slurm-local.sh`), or the multi-node one in network namespaces
//! (`scripts/cluster-local.sh`), whose client commands run in the controller's namespace.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A Slurm cluster: the environment its client commands need.
pub struct Slurm {
    env: Vec<(String, String)>,
    /// Variables of the tests' environment its commands (and so its jobs) must not inherit.
    unset: Vec<&'static str>,
}

impl Slurm {
    /// The cluster whose `SLURM_CONF` is in the environment; fails clearly if none answers.
    pub fn from_env() -> Self {
        let conf = std::env::var("SLURM_CONF").unwrap_or_default();
        assert!(
            !conf.is_empty() && Path::new(&conf).exists(),
            "these tests need a running Slurm: run `scripts/slurm-local.sh start` and export the SLURM_CONF it prints"
        );
        Self::up(Self { env: vec![], unset: vec![] })
    }

    /// The namespaced multi-node cluster of `scripts/cluster-local.sh` (its state directory
    /// `$PEREGRINE_CLUSTER_DIR`, default `target/cluster-local`); fails clearly if it is not up.
    /// Its commands leave `OMPI_MCA_osc` unset.
    pub fn namespaced() -> Self {
        let dir = std::env::var_os("PEREGRINE_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/cluster-local"));
        let conf = dir.join("slurm.conf");
        assert!(
            conf.exists(),
            "these tests need the namespaced cluster: run `scripts/cluster-local.sh start` (no {})",
            conf.display()
        );
        let path = format!("{}:{}", dir.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        let env = vec![("SLURM_CONF".into(), conf.display().to_string()), ("PATH".into(), path)];
        // Across nodes the ranks choose OpenMPI's one-sided component themselves (the tests'
        // `sm,pt2pt` works on one node only).
        Self::up(Self { env, unset: vec!["OMPI_MCA_osc"] })
    }

    fn up(self) -> Self {
        let out =
            self.cmd("sinfo").args(["-h", "-o", "%T"]).output().expect("sinfo (slurm-client installed?)");
        assert!(out.status.success(), "sinfo failed: {}", String::from_utf8_lossy(&out.stderr));
        self
    }

    /// A client command (or any program) with this cluster's environment, and what OpenMPI
    /// needs on this small machine: more ranks than cores, so idle ranks must yield (srun,
    /// unlike mpirun, does not tell OpenMPI that it oversubscribes).
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        for k in &self.unset {
            c.env_remove(k);
        }
        c.env("OMPI_MCA_mpi_yield_when_idle", "1");
        c
    }

    /// A field of `scontrol show job`.
    pub fn job_field(&self, id: &str, field: &str) -> String {
        let out = self.cmd("scontrol").args(["show", "job", id]).output().expect("scontrol");
        let s = String::from_utf8_lossy(&out.stdout).into_owned();
        s.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{field}=")).map(str::to_owned))
            .unwrap_or_default()
    }

    /// Waits (at most `limit`) until `done()`; on time-out cancels the job and panics with
    /// `context()`.
    pub fn wait_for(
        &self,
        id: &str,
        limit: Duration,
        what: &str,
        mut done: impl FnMut() -> bool,
        context: impl Fn() -> String,
    ) {
        let start = Instant::now();
        while !done() {
            if start.elapsed() > limit {
                let _ = self.cmd("scancel").arg(id).status();
                panic!("job {id}: timed out after {limit:?} waiting for {what}\n{}", context());
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// Submits `peregrine slurm sbatch <options> --submit --mpi <plugin> -- <command>` from
    /// `dir`; returns the job id.
    pub fn submit(&self, dir: &Path, options: &[&str], command: &[&str]) -> String {
        let out = self
            .cmd(env!("CARGO_BIN_EXE_peregrine"))
            .current_dir(dir)
            .args(["slurm", "sbatch", "--submit"])
            .args(options)
            .args(["--mpi", &plugin(), "--"])
            .args(command)
            .output()
            .expect("run peregrine slurm sbatch");
        assert!(out.status.success(), "peregrine slurm sbatch failed:\n{}", text(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()), "not a job id: `{id}`");
        id
    }

    /// Sends job `id` what Slurm sends before a time limit, waits for its requeue, lets it
    /// start again at once and waits (at most `limit`) for it to complete; `output` is its log.
    pub fn warn_requeue_and_complete(&self, id: &str, output: &Path, limit: Duration) {
        let status = self.cmd("scancel").args(["--signal=USR1", id]).status().expect("scancel");
        assert!(status.success());
        self.wait_for(
            id,
            Duration::from_secs(120),
            "the requeue",
            || self.job_field(id, "Restarts") == "1",
            || read(output),
        );
        // A requeued job waits (BeginTime) before it may start again: let it start now.
        let _ = self.cmd("scontrol").args(["update", &format!("jobid={id}"), "StartTime=now"]).status();
        self.wait_for(
            id,
            limit,
            "completion",
            || self.job_field(id, "JobState") == "COMPLETED",
            || read(output),
        );
    }
}

/// srun's `--mpi` plugin for the MPI library this binary was built against:
/// `$PEREGRINE_SRUN_MPI`, `pmix` (OpenMPI) by default, `pmi2` for MPICH.
pub fn plugin() -> String {
    std::env::var("PEREGRINE_SRUN_MPI").unwrap_or_else(|_| "pmix".to_owned())
}

/// Standard output and error, for messages.
pub fn text(out: &Output) -> String {
    format!("{}\n--- stderr\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A file's text, empty when it is not there (yet).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
