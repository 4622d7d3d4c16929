//! The error of every `peregrine` command, and its exit code's class.

use peregrine_transport::Error as TransportError;

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
    /// The ranks stopped on a signal before training began (while they checked the data):
    /// nothing to save, and the run is not complete (exit code
    /// [`crate::preempt::EXIT_REQUEUE`], as for a stop with a checkpoint: a requeued job starts
    /// it afresh).
    #[error(
        "stopped on a signal {during}, before training began: nothing to save; rerun the same command \
         (or let the batch script requeue the job) to start it again"
    )]
    StoppedBeforeStart {
        /// What the ranks were doing.
        during: String,
    },
}

impl AppError {
    /// A usage error (exit code 2): a command line or configuration that cannot run, also when
    /// every rank learned it in a collective.
    pub fn is_usage(&self) -> bool {
        match self {
            AppError::Usage(_) => true,
            AppError::Agreed(e) => e.is_usage(),
            _ => false,
        }
    }
}
