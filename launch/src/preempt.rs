//! Stopping cleanly before a time limit, and resuming after a requeue.
//!
//! Slurm sends `SIGUSR1` some time before a job's limit (`#SBATCH --signal=USR1@<secs>`, written by
//! `peregrine slurm sbatch`) and `SIGTERM` when it preempts or kills a job. Either sets a flag; at
//! its safe points a command asks [`Preemption::should_stop`], a collective (one allreduce), so that
//! every rank stops at the same point. Rank 0 then writes the command's state to
//! `<run-dir>/checkpoint.json` (a temporary file, then a rename: never half-written, and the
//! temporary file removed if either fails), and the process exits with [`EXIT_REQUEUE`]; the
//! batch script requeues the job, and the requeued job finds the checkpoint in the same run
//! directory and resumes from it.
//!
//! A second `SIGTERM` ends the process at once (exit code 143), for a rank that cannot reach a
//! safe point.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use peregrine_transport::{ReduceOp, Transport};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use peregrine_slurm::sbatch::EXIT_REQUEUE;

pub use crate::output::write_atomically;

use crate::error::AppError;

/// The flag the signals set.
#[derive(Debug, Clone)]
pub struct Preemption {
    flag: Arc<AtomicBool>,
}

impl Preemption {
    /// Installs the handlers for `SIGUSR1` and `SIGTERM`.
    pub fn install() -> Result<Self, AppError> {
        use signal_hook::consts::{SIGTERM, SIGUSR1};
        let flag = Arc::new(AtomicBool::new(false));
        let io = |e: std::io::Error| AppError::Io { what: "installing signal handlers".into(), source: e };
        // Order matters: the conditional shutdown fires only if the flag is already set.
        signal_hook::flag::register_conditional_shutdown(SIGTERM, 143, flag.clone()).map_err(io)?;
        signal_hook::flag::register(SIGTERM, flag.clone()).map_err(io)?;
        signal_hook::flag::register(SIGUSR1, flag.clone()).map_err(io)?;
        Ok(Self { flag })
    }

    /// The flag itself (for a command that checks it at its own safe points).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// Collective: whether any rank was asked to stop.
    pub fn should_stop(&self, t: &Transport) -> Result<bool, AppError> {
        let mut any = [u64::from(self.flag.load(Ordering::Relaxed))];
        t.allreduce(&mut any, ReduceOp::Max)?;
        Ok(any[0] > 0)
    }
}

/// Where a command keeps its checkpoint: `<run-dir>/checkpoint.json`.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    path: PathBuf,
}

impl Checkpoint {
    /// The checkpoint of the run in `run_dir`.
    pub fn in_dir(run_dir: &Path) -> Self {
        Self { path: run_dir.join("checkpoint.json") }
    }

    /// The checkpoint's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state, if there is one.
    pub fn load<S: DeserializeOwned>(&self) -> Result<Option<S>, AppError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(AppError::Io { what: format!("reading {}", self.path.display()), source: e })
            }
        };
        serde_json::from_str(&text).map(Some).map_err(|e| AppError::Data {
            what: format!("{}:{}:{}", self.path.display(), e.line(), e.column()),
            detail: format!("not a checkpoint of this command: {e}"),
        })
    }

    /// Saves `state` (call on one rank): written to a temporary file, then renamed.
    pub fn save<S: Serialize>(&self, state: &S) -> Result<(), AppError> {
        let json = serde_json::to_string_pretty(state).map_err(|e| AppError::Data {
            what: self.path.display().to_string(),
            detail: format!("cannot encode the checkpoint: {e}"),
        })?;
        write_atomically(&self.path, json.as_bytes())
    }

    /// Removes the checkpoint once the run is complete.
    pub fn remove(&self) -> Result<(), AppError> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(AppError::Io { what: format!("removing {}", self.path.display()), source: e })
            }
            _ => Ok(()),
        }
    }
}
