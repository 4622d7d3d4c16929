//! Starting the world of ranks: local threads or MPI processes, and turning a rank's failure
//! into one clear message and a non-zero exit instead of a hang.

use clap::{Args, ValueEnum};
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
}

impl WorldArgs {
    fn backend(&self) -> Result<Backend, AppError> {
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
        if backend == Backend::Local
            && self.backend == BackendChoice::Auto
            && !Backend::Mpi.compiled()
            && under_launcher()
        {
            return Err(TransportError::from(TransportErrorKind::NotCompiled {
                backend: "mpi",
                feature: "mpi",
            })
            .into());
        }
        Ok(backend)
    }
}

/// Whether an MPI launcher started us, whichever backend was compiled in.
fn under_launcher() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// Runs `body` on every rank of the world `args` describes (`default_ranks` threads for the local
/// backend unless `--ranks` says otherwise).
///
/// Local backend: the ranks' errors are collected and the root cause (the first error that is not
/// a consequence of another rank leaving) is returned. MPI backend: a rank that fails prints its
/// error and calls `MPI_Abort`, so that peers blocked in a collective do not hang.
pub fn run_world<F>(args: &WorldArgs, default_ranks: usize, body: F) -> Result<(), AppError>
where
    F: Fn(&Transport) -> Result<(), AppError> + Sync,
{
    match args.backend()? {
        Backend::Local => {
            let outcomes = run_local(args.ranks.unwrap_or(default_ranks), |t| body(&t))?;
            let mut errors: Vec<AppError> = outcomes.into_iter().filter_map(Result::err).collect();
            let root = errors
                .iter()
                .position(|e| !matches!(e, AppError::Transport(t) if matches!(t.kind(), TransportErrorKind::PeerExited { .. })))
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
            if let Err(e) = body(&t) {
                eprintln!("peregrine: error: {e}");
                if t.world_size() > 1 {
                    t.abort(1);
                }
                return Err(e);
            }
            Ok(())
        }
    }
}

/// OpenMPI 4.1's default one-sided component (osc/rdma over shared memory) crashes in
/// `MPI_Compare_and_swap`: unless the user chose components, use `sm` on a node and `pt2pt`
/// between nodes. Read by MPI_Init, so it must be set before.
fn openmpi_defaults() {
    if std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some() && std::env::var_os("OMPI_MCA_osc").is_none() {
        // SAFETY-free in edition 2021, but still process-global: this runs on the main thread
        // before MPI_Init, while no other thread exists.
        std::env::set_var("OMPI_MCA_osc", "sm,pt2pt");
    }
}
