//! A compute thread's state ([`Slot`]): its buffers, counts and trace events, held by the run
//! and filled by the compute loop ([`super::compute`]).

use std::ops::Range;

use super::trace::Event;
use crate::model::{Delta, KeySet};
use crate::scheme::Take;

/// Per-thread state.
pub(super) struct Slot<W> {
    pub work: W,
    pub loss: f64,
    pub rows: u64,
    pub own: u64,
    pub taken: u64,
    /// Sparse models: the parameters of chunks taken over, pulled by this thread.
    pub steal: Option<StealBuf>,
    /// Copies: a chunk's own buffers (its result is kept only if the chunk is claimed), the
    /// claimed results, and a place to drop the others.
    pub spec: Option<Spec<W>>,
    /// Chunks taken over at once after an own chunk (rapid reassignment).
    pub reassigned: u64,
    /// Copies of other ranks' chunks applied (this copy finished first).
    pub cloned: u64,
    /// Copies computed and dropped (they finished second).
    pub discarded: u64,
    /// The policy's reassignments after an own chunk (kept to reuse its buffer).
    pub takes: Vec<Take>,
    /// This thread's track in the trace (the loop's is 0).
    pub tid: u32,
    /// Trace events since the loop last wrote them.
    pub events: Vec<Event>,
    /// Chunks taken over in this iteration, by victim.
    pub taken_from: Vec<(usize, u64)>,
    /// A team's leader: its buffers for its own part of a run (its `work`, or a copy's, is the
    /// run's gradient, which every member writes).
    pub scratch: Option<W>,
}

impl<W> Slot<W> {
    pub(super) fn new(work: W, tid: u32) -> Self {
        Self {
            tid,
            events: Vec::new(),
            taken_from: Vec::new(),
            work,
            loss: 0.0,
            rows: 0,
            own: 0,
            taken: 0,
            steal: None,
            spec: None,
            reassigned: 0,
            cloned: 0,
            discarded: 0,
            takes: Vec::new(),
            scratch: None,
        }
    }
}

/// A copy of a chunk running elsewhere: its own buffers, the claimed results, and a place to
/// drop the others.
pub(super) struct Spec<W> {
    pub work: W,
    pub won: Delta,
    pub trash: Delta,
}

/// Sparse models: the parameters of chunks taken over, pulled by the thread that computes them.
pub(super) struct StealBuf {
    pub params: Vec<f32>,
    pub keys: KeySet,
    pub ranges: Vec<Range<usize>>,
    pub buf: Vec<f32>,
}
