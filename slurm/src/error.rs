//! The crate's error type.

/// The most hosts [`expand`](crate::expand) produces; a list naming more is an error
/// ([`HostlistProblem::TooManyHosts`]).
pub const MAX_HOSTS: usize = 1_000_000;

/// The most bytes of host names [`expand`](crate::expand) produces (64 MiB); a list expanding to
/// more is an error.
pub const MAX_EXPANDED_BYTES: usize = 64 << 20;

/// Everything that can go wrong in this crate: one variant per failing operation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A hostlist could not be expanded: by [`expand`](crate::expand), or while reading a node-list
    /// variable in [`SlurmEnv::from_vars`](crate::SlurmEnv::from_vars).
    #[error("{}invalid hostlist {list:?} at byte {position}{}: {problem}", var_prefix(.variable), near(.text))]
    Hostlist {
        /// The environment variable the list came from, if any (`SLURM_JOB_NODELIST`, ...).
        variable: Option<&'static str>,
        /// The whole list as given.
        list: String,
        /// Byte offset in `list` where the problem is.
        position: usize,
        /// The offending text: the character, range, bracket group or host name at `position`.
        text: String,
        /// What is wrong there.
        problem: HostlistProblem,
    },
    /// A Slurm environment variable's value does not parse (a number, or the
    /// `SLURM_TASKS_PER_NODE` form `2(x3),1`).
    #[error("invalid {variable}={value:?}: expected {expected} at byte {position}")]
    Variable {
        /// The variable's name.
        variable: &'static str,
        /// Its value.
        value: String,
        /// Byte offset in `value` where parsing failed.
        position: usize,
        /// What was expected there.
        expected: &'static str,
    },
    /// A batch script cannot be written as asked (the message names the option and value).
    #[error("{0}")]
    Sbatch(String),
    /// Slurm variables that parse on their own contradict each other (a rank not below the
    /// task count, a node count that disagrees with the node list, ...).
    #[error("contradictory Slurm environment: {message}")]
    Inconsistent {
        /// The variables involved, by name.
        variables: Vec<&'static str>,
        /// What contradicts what, with the values.
        message: String,
    },
}

fn var_prefix(variable: &Option<&'static str>) -> String {
    variable.map(|v| format!("{v}: ")).unwrap_or_default()
}

fn near(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(" ({text:?})")
    }
}

/// What is wrong with a hostlist, in [`Error::Hostlist`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostlistProblem {
    /// The list is empty or all whitespace.
    EmptyList,
    /// An empty host name: two commas in a row, or a leading or trailing comma.
    EmptyElement,
    /// A `[` without its `]`.
    UnclosedBracket,
    /// A `]` without a `[` before it.
    UnmatchedBracket,
    /// A `[` inside brackets.
    NestedBracket,
    /// Nothing between brackets or between commas inside brackets: `[]`, `[1,]`.
    EmptyRange,
    /// A range whose upper bound is below its lower bound: `[5-3]`.
    DescendingRange {
        /// The lower bound as written.
        low: u64,
        /// The upper bound as written.
        high: u64,
    },
    /// Something other than a digit where a range bound was expected: `[a-3]`, `[1-]`, `[1-2-3]`.
    ExpectedDigit {
        /// The character found instead.
        found: char,
    },
    /// A range bound that does not fit in 64 bits.
    NumberTooLarge,
    /// The list names more than [`MAX_HOSTS`] hosts.
    TooManyHosts {
        /// How many it names (saturating).
        count: u64,
    },
    /// The expanded host names would take more than [`MAX_EXPANDED_BYTES`] bytes.
    TooLong {
        /// How many bytes they would take (saturating).
        bytes: u64,
    },
    /// Whitespace inside a host name (only whitespace around commas is allowed).
    Whitespace,
}

impl std::fmt::Display for HostlistProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::EmptyList => write!(f, "the list is empty (expected at least one host name)"),
            Self::EmptyElement => write!(f, "empty host name (expected a name between commas)"),
            Self::UnclosedBracket => write!(f, "'[' is never closed (expected ']')"),
            Self::UnmatchedBracket => write!(f, "']' without a matching '['"),
            Self::NestedBracket => write!(f, "nested '[' (brackets cannot nest; expected ']')"),
            Self::EmptyRange => write!(f, "empty range (expected a number or low-high)"),
            Self::DescendingRange { low, high } => {
                write!(f, "descending range {low}-{high} (expected low <= high)")
            }
            Self::ExpectedDigit { found } => write!(f, "expected a digit, found {found:?}"),
            Self::NumberTooLarge => write!(f, "number does not fit in 64 bits"),
            Self::TooManyHosts { count } => {
                write!(f, "expands to {count} hosts, more than the limit of {MAX_HOSTS}")
            }
            Self::TooLong { bytes } => {
                write!(
                    f,
                    "expands to {bytes} bytes of host names, more than the limit of {MAX_EXPANDED_BYTES}"
                )
            }
            Self::Whitespace => write!(f, "whitespace inside a host name (expected ',' between hosts)"),
        }
    }
}
