//! The transport's error type.

/// Result of a transport operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A transport error: one pointer wide, so that the `Result`s of the one-sided hot paths stay in
/// registers (a 64-byte error made every `?` on them a memory round trip). What happened is its
/// [`ErrorKind`].
pub struct Error(Box<ErrorKind>);

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0
    }

    /// What went wrong, by value.
    pub fn into_kind(self) -> ErrorKind {
        *self.0
    }
}

impl From<ErrorKind> for Error {
    #[cold]
    fn from(kind: ErrorKind) -> Self {
        Self(Box::new(kind))
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Everything that can go wrong in a world of ranks and its windows.
///
/// Every variant names the rank it happened on; MPI failures also name the MPI call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A backend was requested that this binary was built without.
    #[error(
        "the `{backend}` backend was not compiled into this binary: rebuild with `--features {feature}`"
    )]
    NotCompiled {
        /// Backend name as given by the user.
        backend: &'static str,
        /// Cargo feature that enables it.
        feature: &'static str,
    },
    /// An MPI call returned an error code (we run with `MPI_ERRORS_RETURN`).
    #[error("rank {rank}: {call} failed: {message} (MPI error code {code})")]
    Mpi {
        /// The rank the call failed on.
        rank: usize,
        /// The MPI function, e.g. `MPI_Win_allocate`.
        call: &'static str,
        /// The raw error code.
        code: i32,
        /// `MPI_Error_string` of the code.
        message: String,
    },
    /// MPI was initialised already in this process (only one MPI world per process).
    #[error("MPI is already initialised in this process: only one MPI transport per process")]
    AlreadyInitialized,
    /// The MPI library cannot give us the thread level we need.
    #[error("the MPI library provides thread level {provided}, Peregrine needs MPI_THREAD_MULTIPLE")]
    ThreadLevel {
        /// What the library provided, as a name.
        provided: String,
    },
    /// A world needs at least one rank.
    #[error("a world needs at least one rank (got {0})")]
    EmptyWorld(usize),
    /// A global range does not fit in a window.
    #[error("rank {rank}: range {start}..{end} is outside window `{window}` of {len} elements")]
    OutOfRange {
        /// The rank that issued the operation.
        rank: usize,
        /// Window name.
        window: String,
        /// Start of the requested global range.
        start: usize,
        /// End (exclusive) of the requested global range.
        end: usize,
        /// Number of elements in the window.
        len: usize,
    },
    /// The buffer handed to a (batched) operation does not match the ranges it names.
    #[error(
        "rank {rank}: {op} on window `{window}`: ranges cover {expected} elements but the buffer holds {got}"
    )]
    LengthMismatch {
        /// The rank that issued the operation.
        rank: usize,
        /// Operation name.
        op: &'static str,
        /// Window name.
        window: String,
        /// Elements named by the ranges.
        expected: usize,
        /// Elements in the buffer.
        got: usize,
    },
    /// Ranks disagreed about a collective window allocation.
    #[error("rank {rank}: window `{window}` allocated differently across ranks: {detail}")]
    WindowMismatch {
        /// The rank reporting it.
        rank: usize,
        /// Window name (as given on this rank).
        window: String,
        /// What differs.
        detail: String,
    },
    /// A shard map that does not describe the world.
    #[error("rank {rank}: shard map has {parts} shards but the world has {world_size} ranks")]
    ShardCount {
        /// The rank reporting it.
        rank: usize,
        /// Shards in the map.
        parts: usize,
        /// Ranks in the world.
        world_size: usize,
    },
    /// A rank number that does not exist in this world.
    #[error("rank {rank}: {what} rank {target} does not exist in a world of {world_size}")]
    NoSuchRank {
        /// The rank reporting it.
        rank: usize,
        /// What the rank was used as (`target`, `root`).
        what: &'static str,
        /// The offending rank number.
        target: usize,
        /// Ranks in the world.
        world_size: usize,
    },
    /// A collective call whose arguments disagree across ranks.
    #[error("rank {rank}: {op}: ranks disagree: {detail}")]
    CollectiveMismatch {
        /// The rank reporting it.
        rank: usize,
        /// The collective.
        op: &'static str,
        /// What differs.
        detail: String,
    },
    /// A peer left the world (returned, failed or panicked) while this rank waited for it.
    #[error("rank {rank}: rank {peer} left the world while rank {rank} waited in {op}")]
    PeerExited {
        /// The rank reporting it.
        rank: usize,
        /// The rank that left.
        peer: usize,
        /// The collective this rank was in.
        op: &'static str,
    },
    /// An operation on a pair of windows that are not both direct, shard for shard in
    /// proportion ([`crate::Window::step_with_state`]).
    #[error(
        "rank {rank}: {op}: windows `{window}` and `{other}` are not both direct (mapped whole by \
         every process) with shards in proportion"
    )]
    NotDirect {
        /// The rank reporting it.
        rank: usize,
        /// Operation name.
        op: &'static str,
        /// The window operated on.
        window: String,
        /// The other window.
        other: String,
    },
    /// Keys of a keyed operation out of order ([`crate::Window::step_with_state`]).
    #[error("rank {rank}: {op} on window `{window}`: key {key} after key {after}: keys must ascend")]
    Unordered {
        /// The rank reporting it.
        rank: usize,
        /// Operation name.
        op: &'static str,
        /// Window name.
        window: String,
        /// The key out of order.
        key: u32,
        /// The key before it.
        after: u32,
    },
    /// An operation not defined for the element type (e.g. a float compare-and-swap).
    #[error("rank {rank}: {op} is not defined for elements of type {elem}")]
    Unsupported {
        /// The rank reporting it.
        rank: usize,
        /// Operation name.
        op: &'static str,
        /// Element type name.
        elem: &'static str,
    },
}
