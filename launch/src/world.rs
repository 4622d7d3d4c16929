//! Starting the world of ranks: local threads or MPI processes, and turning a rank's failure
//! into one clear message and a non-zero exit instead of a hang.

use std::path::PathBuf;

use crate::preempt::Preemption;
use clap::{Args, ValueEnum};
use peregrine_slurm::SlurmEnv;
use peregrine_transport::{
    run_local, Backend, Error as TransportError, ErrorKind as TransportErrorKind, Transport,
};

/// Errors of the `peregrine` commands.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// From the transport; the message names the rank (and MPI call).
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Inconsistent command line.
    #[error("{0}")]
    Usage(String),
    /// A conformance case failed.
    #[error("conformance: {0}")]
    Conformance(String),
    /// A file system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file's content is wrong.
    #[error("{what}: {detail}")]
    Data {
        /// The file (with line and column where known).
        what: String,
        /// What is wrong.
        detail: String,
    },
    /// A dataset could not be read, converted or generated (the message names file, line, column).
    #[error(transparent)]
    Dataset(#[from] peregrine_kernels::data::DataError),
    /// The Slurm environment is malformed or contradicts the MPI world.
    #[error(transparent)]
    Slurm(#[from] peregrine_slurm::Error),
    /// The Slurm world and the MPI world disagree.
    #[error("{0}")]
    Launch(String),
    /// Training could not start or go on (thread pool, divergence, reports).
    #[error("{0}")]
    Train(String),
    /// An error every rank learned in the same collective (the rank that found it carries its
    /// message; the others carry [`AppError::Elsewhere`]): each rank exits with it, and nothing
    /// needs aborting (under MPICH an `MPI_Abort` while a peer is in `MPI_Finalize` hangs).
    #[error("{0}")]
    Agreed(Box<AppError>),
    /// Another rank found the fault and reports it (this rank's error is secondary).
    #[error("{what}")]
    Elsewhere {
        /// The rank that found it.
        rank: usize,
        /// What it found, in short.
        what: String,
    },
    /// The ranks stopped at a safe point after a signal and saved their state: not a failure, but
    /// the run is not complete (exit code [`crate::preempt::EXIT_REQUEUE`]).
    #[error("stopped on a signal; state saved in {checkpoint}")]
    Preempted {
        /// The checkpoint file.
        checkpoint: String,
    },
}

/// The `--backend` choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// `mpi` when started by an MPI launcher (mpirun, mpiexec, srun --mpi=pmix|pmi2), else `local`.
    Auto,
    /// Ranks as threads of this process (`--ranks N`).
    Local,
    /// One rank per MPI process (needs a build with `--features mpi`).
    Mpi,
}

/// How the world of ranks is formed.
#[derive(Debug, Args)]
pub struct WorldArgs {
    /// Transport backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Number of ranks for the local backend (threads of this process). Under MPI the launcher
    /// sets the world size (`mpirun -n N`).
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub ranks: Option<usize>,
    /// Run directory: meta.json (ranks, hosts, CPU binding, Slurm ids) and, after a stop on a
    /// signal, checkpoint.json to resume from. Batch scripts from `peregrine slurm sbatch` set it to
    /// runs/<job name>-<job id>.
    #[arg(long, value_name = "DIR", env = "PEREGRINE_RUN_DIR")]
    pub run_dir: Option<PathBuf>,
}

/// What a command gets besides its rank.
#[derive(Debug)]
pub struct RunContext {
    /// The Slurm task, when started by Slurm.
    pub slurm: Option<SlurmEnv>,
    /// `--run-dir`.
    pub run_dir: Option<PathBuf>,
    /// Set by SIGUSR1/SIGTERM.
    pub preemption: Preemption,
}

impl WorldArgs {
    fn backend(&self) -> Result<Backend, AppError> {
        // Under a launcher `detect` says Mpi whether or not it was compiled in: a build without
        // the feature then fails in `Transport::mpi` with the feature's name.
        let backend = match self.backend {
            BackendChoice::Auto => Backend::detect(),
            BackendChoice::Local => Backend::Local,
            BackendChoice::Mpi => Backend::Mpi,
        };
        if backend == Backend::Mpi && self.ranks.is_some() {
            return Err(AppError::Usage(
                "--ranks sets the number of local (thread) ranks; under MPI the launcher sets it (mpirun -n N)".into(),
            ));
        }
        Ok(backend)
    }
}

/// Runs `body` on every rank of the world `args` describes (`default_ranks` threads for the local
/// backend unless `--ranks` says otherwise).
///
/// Local backend: the ranks' errors are collected and the root cause (the first error that is not
/// a consequence of another rank leaving) is returned. MPI backend: a rank that fails prints its
/// error and calls `MPI_Abort`, so that peers blocked in a collective do not hang.
pub fn run_world<F>(args: &WorldArgs, default_ranks: usize, body: F) -> Result<(), AppError>
where
    F: Fn(&Transport, &RunContext) -> Result<(), AppError> + Sync,
{
    let backend = args.backend()?;
    let slurm = SlurmEnv::from_env()?;
    if let Some(s) =
        slurm.as_ref().filter(|s| srun_direct() && s.procid.is_some() && s.ntasks.unwrap_or(1) > 1)
    {
        if backend == Backend::Local {
            return Err(AppError::Launch(format!(
                "srun started this process as task {} of {}, but no MPI launcher is visible: run `srun --mpi=pmix` \
                 (OpenMPI) or `srun --mpi=pmi2` (MPICH), with a build that has `--features mpi`",
                s.procid.unwrap_or(0),
                s.ntasks.unwrap_or(1)
            )));
        }
    }
    let ctx = RunContext { slurm, run_dir: args.run_dir.clone(), preemption: Preemption::install()? };
    match backend {
        Backend::Local => {
            let outcomes = run_local(args.ranks.unwrap_or(default_ranks), |t| body(&t, &ctx))?;
            let mut errors: Vec<AppError> = outcomes.into_iter().filter_map(Result::err).collect();
            let root = errors
                .iter()
                .position(|e| {
                    !matches!(e, AppError::Elsewhere { .. })
                        && !matches!(e, AppError::Transport(t) if matches!(t.kind(), TransportErrorKind::PeerExited { .. }))
                })
                .unwrap_or(0);
            if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.swap_remove(root))
            }
        }
        Backend::Mpi => {
            openmpi_defaults();
            let t = Transport::mpi()?;
            let result = check_slurm_world(&t, ctx.slurm.as_ref()).and_then(|()| body(&t, &ctx));
            match result {
                // Every rank agreed to stop (collectively): a normal exit on every rank.
                Err(e @ AppError::Preempted { .. }) => Err(e),
                // Every rank knows (a collective found it): each exits with its message.
                Err(e @ (AppError::Elsewhere { .. } | AppError::Agreed(_))) => Err(e),
                Err(e) => {
                    eprintln!("peregrine: error: {e}");
                    if t.world_size() > 1 {
                        t.abort(1);
                    }
                    Err(e)
                }
                Ok(()) => Ok(()),
            }
        }
    }
}

/// Whether `srun` started this process itself (a task of a job step), rather than `mpirun` (which,
/// inside an allocation, starts its daemons with srun: their SLURM_PROCID is not the MPI rank).
fn srun_direct() -> bool {
    let set = |v: &str| std::env::var_os(v).is_some();
    set("SLURM_STEP_ID") && !set("OMPI_COMM_WORLD_SIZE") && !set("HYDI_CONTROL_FD")
}

/// Under `srun`, the MPI world must be the Slurm step: MPICH started with the wrong `--mpi` plugin
/// silently runs N one-rank worlds.
fn check_slurm_world(t: &Transport, slurm: Option<&SlurmEnv>) -> Result<(), AppError> {
    let Some(s) = slurm.filter(|_| srun_direct()) else { return Ok(()) };
    let (Some(procid), Some(ntasks)) = (s.procid, s.ntasks) else { return Ok(()) };
    if t.world_size() != ntasks as usize || t.rank() != procid as usize {
        return Err(AppError::Launch(format!(
            "MPI rank {} of {} but Slurm task {procid} of {}: the MPI library did not join srun's tasks into one \
             world; use `srun --mpi=pmix` for OpenMPI or `srun --mpi=pmi2` for MPICH",
            t.rank(),
            t.world_size(),
            ntasks
        )));
    }
    Ok(())
}

/// OpenMPI 4.1's default one-sided component (osc/rdma over shared memory) crashes in
/// `MPI_Compare_and_swap`: unless the user chose components, use `sm` on a node and `pt2pt`
/// between nodes. Set whatever the MPI library (under `srun` an OpenMPI process has no `OMPI_*`
/// variable before `MPI_Init`, and MPICH ignores it); read by `MPI_Init`, so it must be set before.
fn openmpi_defaults() {
    if std::env::var_os("OMPI_MCA_osc").is_none() {
        // Edition 2021: `set_var` is safe but process-global. This runs on the main thread before
        // MPI_Init, while no other thread exists.
        std::env::set_var("OMPI_MCA_osc", "sm,pt2pt");
    }
}
