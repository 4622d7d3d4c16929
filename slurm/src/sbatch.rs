//! Batch scripts that run Peregrine under `srun`, with the binding, thread and preemption
//! settings an HPC user would otherwise write by hand.
//!
//! The script asks Slurm for a warning signal before the time limit (`--signal=USR1@<secs>`, sent
//! to every task of the job step). Peregrine's ranks agree at their next safe point to stop, save
//! their state and exit with [`EXIT_REQUEUE`]; the script then requeues the job
//! (`scontrol requeue`), and the requeued job (same job id, `SLURM_RESTART_COUNT` > 0) resumes from
//! the saved state.

use std::fmt::Write as _;

use crate::Error;

/// Exit code with which Peregrine says "state saved, requeue me" (`EX_TEMPFAIL`).
pub const EXIT_REQUEUE: i32 = 75;

/// The PMI plugin `srun` starts the MPI ranks with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MpiPlugin {
    /// `--mpi=pmix`: OpenMPI.
    Pmix,
    /// `--mpi=pmi2`: MPICH (with `pmix` or `none` MPICH silently starts N one-rank jobs).
    Pmi2,
}

impl MpiPlugin {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pmix => "pmix",
            Self::Pmi2 => "pmi2",
        }
    }
}

/// One kind of node in the job. A job with several groups is a heterogeneous job (node types with
/// different core counts), one Slurm het component per group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGroup {
    /// Nodes of this kind.
    pub nodes: u32,
    /// MPI ranks per node.
    pub ntasks_per_node: u32,
    /// Cores per rank: the rank's compute threads.
    pub cpus_per_task: u32,
    /// Partition of this group (else the job's).
    pub partition: Option<String>,
    /// Node feature constraint (`--constraint`), e.g. the node type.
    pub constraint: Option<String>,
}

/// Everything the batch script says.
#[derive(Clone, Debug)]
pub struct BatchSpec {
    /// `--job-name`.
    pub job_name: String,
    /// One group, or several for a heterogeneous job.
    pub groups: Vec<NodeGroup>,
    /// `--time` (Slurm's formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`).
    pub time: Option<String>,
    /// `--partition` for every group that does not name its own.
    pub partition: Option<String>,
    /// `--account`.
    pub account: Option<String>,
    /// `--output` (`%j` is the job id).
    pub output: String,
    /// `srun --mpi=...`.
    pub mpi: MpiPlugin,
    /// Seconds before the time limit at which Slurm sends the warning signal; 0: none.
    pub warn_before_secs: u32,
    /// Whether the job may be requeued (after a checkpoint, or by preemption).
    pub requeue: bool,
    /// Further `#SBATCH` options, verbatim (e.g. `--mail-type=END`).
    pub extra: Vec<String>,
    /// The `peregrine` executable, as compute nodes see it (a shared file system).
    pub program: String,
    /// Its arguments (command and options).
    pub args: Vec<String>,
}

/// Checks a Slurm time limit.
pub fn check_time(t: &str) -> Result<(), Error> {
    let bad = || Error::Sbatch(format!("--time `{t}`: expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"));
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (Some(d), r),
        None => (None, t),
    };
    let num = |s: &str| !s.is_empty() && s.len() <= 6 && s.bytes().all(|b| b.is_ascii_digit());
    if days.is_some_and(|d| !num(d)) {
        return Err(bad());
    }
    let parts: Vec<&str> = rest.split(':').collect();
    if parts.len() > 3 || !parts.iter().all(|p| num(p)) {
        return Err(bad());
    }
    let zero = |s: &str| s.bytes().all(|b| b == b'0');
    if parts.iter().all(|p| zero(p)) && days.is_none_or(zero) {
        return Err(Error::Sbatch(format!("--time `{t}` is zero")));
    }
    Ok(())
}

/// Quotes a word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn check_word(what: &str, s: &str) -> Result<(), Error> {
    if s.is_empty() || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(Error::Sbatch(format!("{what} `{s}` must be one word without spaces")));
    }
    Ok(())
}

/// Renders the batch script.
pub fn render(spec: &BatchSpec) -> Result<String, Error> {
    if spec.groups.is_empty() {
        return Err(Error::Sbatch("a job needs at least one node group".into()));
    }
    for (i, g) in spec.groups.iter().enumerate() {
        if g.nodes == 0 || g.ntasks_per_node == 0 || g.cpus_per_task == 0 {
            return Err(Error::Sbatch(format!(
                "node group {i}: nodes ({}), tasks per node ({}) and cpus per task ({}) must be >= 1",
                g.nodes, g.ntasks_per_node, g.cpus_per_task
            )));
        }
        for (what, v) in [("partition", &g.partition), ("constraint", &g.constraint)] {
            if let Some(v) = v {
                check_word(what, v)?;
            }
        }
    }
    check_word("--job-name", &spec.job_name)?;
    check_word("--output", &spec.output)?;
    for (what, v) in [("--partition", &spec.partition), ("--account", &spec.account)] {
        if let Some(v) = v {
            check_word(what, v)?;
        }
    }
    if let Some(t) = &spec.time {
        check_time(t)?;
    }
    for e in &spec.extra {
        if !e.starts_with("--") || e.contains('\n') {
            return Err(Error::Sbatch(format!("extra sbatch option `{e}` must look like --name[=value]")));
        }
    }
    if spec.program.is_empty() {
        return Err(Error::Sbatch("the peregrine program path is empty".into()));
    }

    let het = spec.groups.len() > 1;
    let ranks: u32 = spec.groups.iter().map(|g| g.nodes * g.ntasks_per_node).sum();
    let mut s = String::new();
    let w = &mut s;
    // `write!` to a String cannot fail.
    macro_rules! line {
        ($($t:tt)*) => { let _ = writeln!(w, $($t)*); };
    }
    line!("#!/bin/bash");
    line!("# Peregrine batch job: {ranks} MPI ranks{}.", if het { " in a heterogeneous job" } else { "" });
    line!("# Written by `peregrine slurm sbatch`; submit with `sbatch <this file>`.");
    line!("#SBATCH --job-name={}", spec.job_name);
    line!("#SBATCH --output={}", spec.output);
    line!("#SBATCH --open-mode=append");
    if let Some(t) = &spec.time {
        line!("#SBATCH --time={t}");
    }
    if let Some(a) = &spec.account {
        line!("#SBATCH --account={a}");
    }
    if spec.requeue {
        line!("#SBATCH --requeue");
    } else {
        line!("#SBATCH --no-requeue");
    }
    if spec.warn_before_secs > 0 {
        line!(
            "# Warning before the time limit, to every rank: they save their state and exit {EXIT_REQUEUE}."
        );
        line!("#SBATCH --signal=USR1@{}", spec.warn_before_secs);
    }
    for e in &spec.extra {
        line!("#SBATCH {e}");
    }
    for (i, g) in spec.groups.iter().enumerate() {
        if i > 0 {
            line!("#SBATCH hetjob");
        }
        line!("#SBATCH --nodes={}", g.nodes);
        line!("#SBATCH --ntasks-per-node={}", g.ntasks_per_node);
        line!("#SBATCH --cpus-per-task={}", g.cpus_per_task);
        if let Some(p) = g.partition.as_ref().or(spec.partition.as_ref()) {
            line!("#SBATCH --partition={p}");
        }
        if let Some(c) = &g.constraint {
            line!("#SBATCH --constraint={c}");
        }
    }
    line!();
    line!("set -u");
    line!("# One-sided MPI: unless OMPI_MCA_osc is exported, each rank picks OpenMPI's component itself:");
    line!("# ucx where UCX reports an RDMA transport (InfiniBand, RoCE), else sm,pt2pt.");
    line!(
        "# The run directory (meta.json, checkpoint.json): the same for a requeued job, which resumes there."
    );
    line!("export PEREGRINE_RUN_DIR=\"${{PEREGRINE_RUN_DIR:-runs/$SLURM_JOB_NAME-$SLURM_JOB_ID}}\"");
    line!("# Each rank computes on its cores: as many threads as cpus per task (per het group).");
    line!("export OMP_NUM_THREADS=\"${{SLURM_CPUS_PER_TASK:-1}}\" RAYON_NUM_THREADS=\"${{SLURM_CPUS_PER_TASK:-1}}\"");
    line!();
    let mut srun = format!("srun --mpi={} --cpu-bind=cores", spec.mpi.as_str());
    if spec.mpi == MpiPlugin::Pmi2 {
        // A task that dies must end the step: with PMI-2 nothing else does (the others would
        // wait for it until the watchdog). With PMIx, Slurm's plugin cancels the step itself, and
        // this flag must not be given: it would also end the step when the ranks leave with
        // EXIT_REQUEUE, and a PMIx step ended that way leaves its socket behind (Slurm 22.05),
        // so that the requeued job's first step cannot start.
        srun.push_str(" --kill-on-bad-exit=1");
    }
    if het {
        // Slurm >= 22.05 no longer passes the batch's --cpus-per-task to srun; each het group
        // keeps its own allocation with --het-group.
        let _ = write!(srun, " --het-group=0-{}", spec.groups.len() - 1);
    } else {
        srun.push_str(" --cpus-per-task=\"$SLURM_CPUS_PER_TASK\"");
    }
    let cmd: Vec<String> = std::iter::once(&spec.program).chain(&spec.args).map(|a| shell_quote(a)).collect();
    line!("status=0");
    line!("{srun} {} || status=$?", cmd.join(" "));
    line!("if [ \"$status\" -eq {EXIT_REQUEUE} ]; then");
    if spec.requeue {
        line!("    echo \"peregrine: state saved before the time limit; requeueing job $SLURM_JOB_ID\"");
        line!("    scontrol requeue \"$SLURM_JOB_ID\"");
        line!("    exit 0");
    } else {
        line!("    echo \"peregrine: state saved before the time limit; resubmit this script to resume\"");
    }
    line!("fi");
    line!("exit \"$status\"");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> BatchSpec {
        BatchSpec {
            job_name: "peregrine".into(),
            groups: vec![NodeGroup {
                nodes: 2,
                ntasks_per_node: 4,
                cpus_per_task: 8,
                partition: None,
                constraint: None,
            }],
            time: Some("01:00:00".into()),
            partition: Some("compute".into()),
            account: None,
            output: "peregrine-%j.out".into(),
            mpi: MpiPlugin::Pmix,
            warn_before_secs: 120,
            requeue: true,
            extra: vec![],
            program: "/shared/bin/peregrine".into(),
            args: vec!["train".into(), "--config".into(), "my run.toml".into()],
        }
    }

    #[test]
    fn a_homogeneous_job() {
        let s = render(&spec()).expect("valid spec");
        for line in [
            "#!/bin/bash",
            "#SBATCH --nodes=2",
            "#SBATCH --ntasks-per-node=4",
            "#SBATCH --cpus-per-task=8",
            "#SBATCH --partition=compute",
            "#SBATCH --time=01:00:00",
            "#SBATCH --signal=USR1@120",
            "#SBATCH --requeue",
            "srun --mpi=pmix --cpu-bind=cores --cpus-per-task=\"$SLURM_CPUS_PER_TASK\" /shared/bin/peregrine train --config 'my run.toml' || status=$?",
            "if [ \"$status\" -eq 75 ]; then",
            "    scontrol requeue \"$SLURM_JOB_ID\"",
        ] {
            assert!(s.lines().any(|l| l == line), "missing `{line}` in\n{s}");
        }
        assert!(!s.contains("hetjob"));
    }

    #[test]
    fn a_heterogeneous_job_has_one_component_per_group() {
        let mut sp = spec();
        sp.groups.push(NodeGroup {
            nodes: 1,
            ntasks_per_node: 2,
            cpus_per_task: 16,
            partition: Some("big".into()),
            constraint: Some("fat".into()),
        });
        sp.mpi = MpiPlugin::Pmi2;
        let s = render(&sp).expect("valid spec");
        assert_eq!(s.matches("#SBATCH hetjob").count(), 1);
        assert!(
            s.contains("#SBATCH --cpus-per-task=16\n#SBATCH --partition=big\n#SBATCH --constraint=fat"),
            "{s}"
        );
        assert!(s.contains("srun --mpi=pmi2 --cpu-bind=cores --kill-on-bad-exit=1 --het-group=0-1 "), "{s}");
        assert!(s.contains("10 MPI ranks in a heterogeneous job"), "{s}");
    }

    #[test]
    fn bad_specs_are_errors() {
        let mut sp = spec();
        sp.groups[0].nodes = 0;
        assert!(render(&sp).is_err());
        let mut sp = spec();
        sp.job_name = "two words".into();
        assert!(render(&sp).is_err());
        let mut sp = spec();
        sp.extra = vec!["mail-type=END".into()];
        assert!(render(&sp).is_err());
        for t in ["", "1:2:3:4", "1-", "x", "0", "00:00", "1-2:3:4:5", "-1"] {
            assert!(check_time(t).is_err(), "time `{t}` accepted");
        }
        for t in ["30", "10:00", "01:00:00", "2-12", "2-12:30", "2-12:30:00"] {
            assert!(check_time(t).is_ok(), "time `{t}` rejected");
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("plain/path-1.toml"), "plain/path-1.toml");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
    }
}
