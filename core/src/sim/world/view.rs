//! The world as one rank's policy sees it ([`View`]), counting the words it reads.

use std::cell::Cell;
use std::ops::Range;

use peregrine_transport::Ops;

use super::shared::Words;
use crate::scheme::View;
use crate::words::{ProgressWord, Queue};

/// The world as rank `rank`'s policy sees it, counting the words it reads (each an atomic
/// one-sided load in a real run, which the simulator charges).
pub(super) struct SimView<'w> {
    w: &'w Words,
    rank: usize,
    ops: Cell<Ops>,
}

impl<'w> SimView<'w> {
    pub(super) fn new(w: &'w Words, rank: usize) -> Self {
        Self { w, rank, ops: Cell::new(Ops::default()) }
    }

    /// A question about every rank: one read of an aggregated word (a tree's root, the version
    /// counter) where the engine keeps one, else a word of every rank in one batch.
    fn read_aggregate(&self, kept: bool) {
        if kept {
            self.read();
        } else {
            self.read_all();
        }
    }

    /// One word read on its own: a round trip.
    fn read(&self) {
        self.add(Ops::batch(1));
    }

    /// A word of every rank read in one batch: one round trip, the rest pipelined behind it.
    fn read_all(&self) {
        self.add(Ops::batch(self.w.world));
    }

    fn add(&self, ops: Ops) {
        let mut o = self.ops.get();
        o += ops;
        self.ops.set(o);
    }

    /// The reads so far.
    pub(super) fn ops(&self) -> Ops {
        self.ops.get()
    }
}

impl View for SimView<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.w.world
    }
    fn clock(&self, rank: usize) -> crate::scheme::Result<u64> {
        self.read();
        Ok(self.w.clocks[rank])
    }
    fn queue(&self, rank: usize) -> crate::scheme::Result<Queue> {
        self.read();
        Ok(self.w.ranks[rank].queue)
    }
    fn progress(&self, rank: usize) -> crate::scheme::Result<ProgressWord> {
        self.read();
        Ok(self.w.ranks[rank].progress)
    }
    fn rate(&self, rank: usize) -> crate::scheme::Result<f64> {
        self.read();
        Ok(self.w.rates[rank])
    }
    fn clocks(&self) -> crate::scheme::Result<Vec<u64>> {
        self.read_all();
        Ok(self.w.clocks.clone())
    }
    /// The descent of the tree of drained queues (its reads charged here, the candidates' words
    /// by the reads that follow).
    fn candidates(&self, it: u64) -> crate::scheme::Result<Range<usize>> {
        self.add(self.w.descent_ops());
        Ok(self.w.candidates(self.rank, it))
    }
    fn undone(&self, it: u64) -> crate::scheme::Result<Range<usize>> {
        self.add(self.w.undone_ops());
        Ok(self.w.undone(self.rank, it))
    }
    fn queues_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<Queue>> {
        self.add(Ops::batch(ranks.len()));
        Ok(self.w.ranks[ranks].iter().map(|w| w.queue).collect())
    }
    fn progress_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<ProgressWord>> {
        self.add(Ops::batch(ranks.len()));
        Ok(self.w.ranks[ranks].iter().map(|w| w.progress).collect())
    }
    fn rates_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<f64>> {
        self.add(Ops::batch(ranks.len()));
        Ok(self.w.rates[ranks].to_vec())
    }
    /// One load of the clock tree's root, or every clock in one batch without a staleness
    /// bound (as the engine's view reads them), answered from the running minimum.
    fn reached(&self, clock: u64) -> crate::scheme::Result<bool> {
        self.read_aggregate(self.w.trees.is_some());
        Ok(self.w.min >= clock)
    }
    fn version(&self) -> crate::scheme::Result<u64> {
        self.read_aggregate(self.w.version_kept);
        Ok(self.w.version)
    }
}
