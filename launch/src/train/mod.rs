//! `peregrine train`: one training run from a TOML file and flags (flags win).
//!
//! [`args`] holds the flags and the configuration file, [`resolve`] fills in the defaults and
//! checks them, [`run`](mod@run) runs the training (the world, the run directory, the engine, the
//! progress bar), [`resume`] decides where a run starts, and [`output`] writes what a run leaves
//! behind (`summary.json`, the model, the trace) and prints its summary.

use crate::error::AppError;
use crate::world::run_world;

mod args;
mod footprint;
mod output;
mod resolve;
mod resume;
mod run;

pub(crate) use args::{read_toml, RunOpts, TrainFile};
pub use args::{ModelKind, TrainArgs};
pub(crate) use resolve::{check, finish};
pub(crate) use run::{agree_fresh_dir, rank};

/// `peregrine train`.
pub fn run(a: TrainArgs) -> Result<(), AppError> {
    let (resolved, epochs) = resolve::resolve(&a)?;
    let default_ranks = 2;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let opts = RunOpts {
        quiet: a.quiet,
        no_pin: a.no_pin,
        dir: None,
        force: a.force,
        trace: a.trace,
        huge_pages: a.huge_pages,
    };
    run_world(&a.world, default_ranks, |t, ctx| {
        rank(t, ctx, &opts, resolved.clone(), epochs, stamp).map(drop)
    })
}

/// An I/O error as [`AppError::Io`], `what` saying what was being done.
fn io(what: String) -> impl FnOnce(std::io::Error) -> AppError {
    move |source| AppError::Io { what, source }
}
