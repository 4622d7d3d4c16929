//! Errors of the data layer: every one names the file, and for text inputs the line and column.

use std::path::{Path, PathBuf};

/// Result of a data operation.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// What went wrong reading, converting or generating a dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// The operating system refused (open, read, write, rename, map).
    #[error("{path}: {what}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A text input is malformed at a line and column (1-based).
    #[error("{path}:{line}:{column}: expected {expected}, found {found:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: u64,
        /// 1-based column (bytes).
        column: u64,
        /// What the format wants there.
        expected: String,
        /// What is there (truncated to a few dozen characters).
        found: String,
    },
    /// A binary input (dataset file, IDX) is malformed: bad magic, version, sizes, checksum,
    /// truncation.
    #[error("{path}: {detail}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the expected and found values.
        detail: String,
    },
    /// The dataset is of another kind than the caller needs.
    #[error("{path}: holds a {found} dataset, expected {expected}")]
    WrongKind {
        /// The file.
        path: PathBuf,
        /// Kind wanted.
        expected: &'static str,
        /// Kind found.
        found: &'static str,
    },
    /// Arguments that cannot describe a dataset (zero rows, too many features, ...).
    #[error("{0}")]
    Invalid(String),
}

impl DataError {
    pub(crate) fn io<'p>(path: &'p Path, what: &'static str) -> impl FnOnce(std::io::Error) -> Self + 'p {
        move |source| Self::Io { path: path.to_owned(), what, source }
    }

    pub(crate) fn format(path: &Path, detail: impl Into<String>) -> Self {
        Self::Format { path: path.to_owned(), detail: detail.into() }
    }
}
