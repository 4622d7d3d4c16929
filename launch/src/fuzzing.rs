//! Entry points for the fuzz targets (`fuzz/`): the parsers of outside input that live in this
//! crate, each reading a file as the command does, returning the error message a user would see
//! (or nothing). A panic, a hang or an abort in any of them is a bug; an `Err` is the expected
//! answer to bad input. Not for other uses.

use std::path::Path;

use clap::Parser;

use crate::{Cli, Command};

fn parse(argv: &[&str]) -> Result<Command, String> {
    Cli::try_parse_from(argv).map(|c| c.command).map_err(|e| e.to_string())
}

/// A training configuration (`peregrine train --config FILE`), read and resolved with the
/// command line's defaults, as `train` does before it starts any rank.
pub fn train_config(path: &Path) -> Result<(), String> {
    let path = path.to_str().ok_or("a UTF-8 path")?;
    match parse(&["peregrine", "train", "--config", path])? {
        Command::Train(a) => crate::train::check(&a).map_err(|e| e.to_string()),
        _ => unreachable!("parsed as train"),
    }
}

/// An experiment configuration (`peregrine experiment FILE`), read and checked as `experiment`
/// does before it runs anything.
pub fn experiment_config(path: &Path) -> Result<(), String> {
    let path = path.to_str().ok_or("a UTF-8 path")?;
    match parse(&["peregrine", "experiment", path, "--dry-run"])? {
        Command::Experiment(a) => crate::experiment::check(&a).map_err(|e| e.to_string()),
        _ => unreachable!("parsed as experiment"),
    }
}

/// The checkpoints of a run directory (`checkpoint.safetensors` and the previous one), loaded
/// as a resumed run loads them.
pub fn checkpoint(run_dir: &Path) -> Result<(), String> {
    crate::checkpoint::Store::new(run_dir).load().map(drop)
}

/// A model file (`peregrine predict --model FILE`), loaded as `predict` loads it.
pub fn model_file(path: &Path) -> Result<(), String> {
    crate::model_file::Saved::load(path).map(drop).map_err(|e| e.to_string())
}
