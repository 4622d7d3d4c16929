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
        done: impl FnMut() -> bool,
        context: impl Fn() -> String,
    ) {
        if !waits(limit, done) {
            // What the job and its processes were doing, before cancelling kills them.
            let report = self.report(id);
            let _ = self.cmd("scancel").arg(id).status();
            panic!("job {id}: timed out after {limit:?} waiting for {what}\n{}\n{report}", context());
        }
    }

    /// Slurm's view of job `id` (every component of a heterogeneous job) and its steps, and the
    /// processes of this machine that run in it: their threads' states, kernel wait channels and
    /// CPU time, which tell a rank that spins from one that blocks, and where.
    pub fn report(&self, id: &str) -> String {
        let run = |args: &[&str]| {
            self.cmd(args[0]).args(&args[1..]).output().map(|o| text(&o)).unwrap_or_else(|e| e.to_string())
        };
        let mut r = format!(
            "--- scontrol show job {id}\n{}\n--- squeue -s -j {id}\n{}",
            run(&["scontrol", "show", "job", id]),
            run(&["squeue", "-s", "-j", id])
        );
        for pid in job_pids(id) {
            let proc_dir = Path::new("/proc").join(pid.to_string());
            let cmd = String::from_utf8_lossy(&std::fs::read(proc_dir.join("cmdline")).unwrap_or_default())
                .replace('\0', " ");
            r += &format!("\n--- process {pid}: {cmd}");
            let tasks = std::fs::read_dir(proc_dir.join("task")).into_iter().flatten().flatten();
            for t in tasks {
                let stat = read(&t.path().join("stat"));
                // Fields after the parenthesised name: state, ..., utime and stime (14th and 15th).
                let (name, rest) = stat.rsplit_once(')').unwrap_or_default();
                let f: Vec<&str> = rest.split_whitespace().collect();
                let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                r += &format!(
                    "\n  thread {} {} state {} cpu {} ticks wchan {}",
                    t.file_name().to_string_lossy(),
                    name.split_once('(').map_or("", |x| x.1),
                    f.first().unwrap_or(&"?"),
                    ticks(11) + ticks(12),
                    read(&t.path().join("wchan"))
                );
            }
        }
        r
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
        // A requeued job waits (BeginTime) before it may start again: let it start sooner, but
        // not at once. Its node revokes the job's credential when it ends the first run, and
        // refuses a relaunch whose credential is not newer than that, to the second ("Job
        // credential revoked": the job then fails): wait for the first run's processes to be
        // gone, and give the next start a second or two more.
        let gone = Instant::now();
        while !job_pids(id).is_empty() && gone.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.cmd("scontrol").args(["update", &format!("jobid={id}"), "StartTime=now+2"]).status();
        self.completes(id, id, limit, output);
    }

    /// Waits (at most `limit`) for job `id` to end, watching its component `job` (`id` itself,
    /// or `<id>+<k>` of a heterogeneous job), and checks that it completed; `output` is its log.
    pub fn completes(&self, id: &str, job: &str, limit: Duration, output: &Path) {
        let state = || self.job_field(job, "JobState");
        self.wait_for(id, limit, "its end", || ended(&state()), || read(output));
        assert_eq!(state(), "COMPLETED", "{}\n{}", read(output), self.report(id));
    }
}

/// srun's `--mpi` plugin for the MPI library this binary was built against:
/// `$PEREGRINE_SRUN_MPI`, `pmix` (OpenMPI) by default, `pmi2` for MPICH.
pub fn plugin() -> String {
    std::env::var("PEREGRINE_SRUN_MPI").unwrap_or_else(|_| "pmix".to_owned())
}

/// Polls `done()` until it holds (true) or `limit` has passed (false).
pub fn waits(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    true
}

/// srun's backtrace, when job `id`'s tasks have all exited and its srun hangs in Slurm 22.05's
/// PMIx plugin: that plugin joins its abort agent's thread once per component of a
/// heterogeneous step, without a lock, and a second join after the first has finished waits on a
/// thread that is gone (later Slurm counts the components and joins once). `None` otherwise, or
/// when gdb cannot tell.
pub fn srun_hung_in_pmix_teardown(id: &str) -> Option<String> {
    let comm = |pid: u32| read(Path::new(&format!("/proc/{pid}/comm"))).trim().to_owned();
    let pids = job_pids(id);
    if pids.iter().any(|&p| comm(p) == "peregrine") {
        return None;
    }
    pids.into_iter().filter(|&p| comm(p) == "srun").find_map(|p| {
        let out = Command::new("gdb")
            .args(["-p", &p.to_string(), "-batch", "-ex", "thread apply all bt"])
            .output()
            .ok()?;
        let trace = String::from_utf8_lossy(&out.stdout).into_owned();
        trace.lines().any(|l| l.contains("pmixp_abort_agent_stop")).then(|| {
            trace
                .lines()
                .filter(|l| l.starts_with('#') || l.starts_with("Thread"))
                .collect::<Vec<_>>()
                .join("\n")
        })
    })
}

/// Kills the processes of job `id` left on this machine (a hung srun outlives `scancel`).
pub fn kill_leftovers(id: &str) {
    for pid in job_pids(id) {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
}

/// The processes of this machine (any of the test clusters' nodes) that run in job `id`.
fn job_pids(id: &str) -> Vec<u32> {
    let key = format!("SLURM_JOB_ID={id}");
    let dirs = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    let pids = dirs.filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()));
    pids.filter(|pid| {
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        env.split(|&b| b == 0).any(|v| v == key.as_bytes())
    })
    .collect()
}

/// Whether a job in `state` (`scontrol show job`'s JobState) has ended, in success or not.
pub fn ended(state: &str) -> bool {
    const ENDS: [&str; 9] = [
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    ];
    ENDS.contains(&state)
}

/// Standard output and error, for messages.
pub fn text(out: &Output) -> String {
    format!("{}\n--- stderr\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A file's text, empty when it is not there (yet).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}
