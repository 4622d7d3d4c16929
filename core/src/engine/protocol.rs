//! The stop and checkpoint protocol's words and counters, one set per rank; the protocol itself
//! (publishing, agreeing, arriving) is `checkpoint.rs`'s.

use std::sync::atomic::{AtomicBool, AtomicU64};

use peregrine_transport::{ShardMap, Transport, Window};

use super::TrainError;

/// The protocol's words and counters.
pub(super) struct Protocol {
    /// Every rank's count of checkpoints it has arrived at (one word per rank, so that a rank
    /// that never arrives can be named).
    pub arrivals: Window<u64>,
    /// Every rank's published iteration plus one for the current checkpoint request.
    pub stops: Window<u64>,
    /// The iteration this rank would begin next if it left its current wait.
    pub current: AtomicU64,
    /// Checkpoint requests (stops and timed checkpoints) this rank has published its iteration
    /// for: request `k` is open on every rank once any rank published for it (the control word
    /// counts past `(k - 1) * world`).
    pub published: AtomicU64,
    /// Requests whose checkpoint this rank has taken.
    pub settled: AtomicU64,
    /// Rank 0: a timed checkpoint is due ([`Config::checkpoint_seconds`](super::Config::checkpoint_seconds)).
    pub timed: AtomicBool,
}

impl Protocol {
    /// The protocol's windows (collective: every rank allocates them at the same point) and
    /// counters, for a run starting at iteration `start`.
    pub(super) fn new(t: &Transport, start: u64) -> Result<Self, TrainError> {
        let one_word_each = ShardMap::from_lens(vec![1; t.world_size()]);
        Ok(Self {
            arrivals: t.alloc_window("checkpoint arrivals", &one_word_each)?,
            stops: t.alloc_window("stop iterations", &one_word_each)?,
            current: AtomicU64::new(start),
            published: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            timed: AtomicBool::new(false),
        })
    }

    /// Frees the protocol's windows (collective).
    pub(super) fn free(self) -> Result<(), TrainError> {
        self.arrivals.free()?;
        self.stops.free()?;
        Ok(())
    }
}
