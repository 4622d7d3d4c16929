//! The view a policy decides from in a real run ([`Live`]): the world read from the windows.

use std::ops::Range;

use peregrine_transport::Window;

use super::watch::Watch;
use crate::clocks::Clocks;
use crate::queue::ChunkQueues;
use crate::scheme::View;
use crate::words;

/// The world read live from the windows: each read one atomic one-sided load, a word of every
/// rank one batch of them.
pub(super) struct Live<'r> {
    pub(super) queues: &'r ChunkQueues,
    pub(super) clocks: &'r Clocks,
    pub(super) rates: &'r Window<u64>,
    pub(super) watch: &'r Watch,
    pub(super) rank: usize,
    pub(super) world: usize,
}

impl View for Live<'_> {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    fn clock(&self, rank: usize) -> crate::scheme::Result<u64> {
        self.clocks.clock(rank)
    }
    fn queue(&self, rank: usize) -> crate::scheme::Result<words::Queue> {
        self.queues.peek(rank)
    }
    fn progress(&self, rank: usize) -> crate::scheme::Result<words::ProgressWord> {
        self.clocks.progress(rank)
    }
    fn rate(&self, rank: usize) -> crate::scheme::Result<f64> {
        Ok(f64::from_bits(self.rates.load(rank)?))
    }
    fn clocks(&self) -> crate::scheme::Result<Vec<u64>> {
        let words = self.clocks.clock_words()?;
        self.watch.saw_clocks(self.rank, &words);
        Ok(words.into_iter().map(|w| w & !crate::clocks::PASSING).collect())
    }
    fn reached(&self, clock: u64) -> crate::scheme::Result<bool> {
        if self.clocks.tree() {
            self.clocks.reached(clock)
        } else {
            // Every clock, naming the slowest for the watchdog as it is read.
            Ok(self.clocks()?.into_iter().all(|c| c >= clock))
        }
    }
    fn version(&self) -> crate::scheme::Result<u64> {
        self.clocks.version()
    }
    fn candidates(&self, it: u64) -> crate::scheme::Result<Range<usize>> {
        self.queues.candidates(it)
    }
    fn undone(&self, it: u64) -> crate::scheme::Result<Range<usize>> {
        self.clocks.undone(it)
    }
    fn queues_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<words::Queue>> {
        self.queues.peek_in(ranks)
    }
    fn progress_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<words::ProgressWord>> {
        self.clocks.progress_in(ranks)
    }
    fn rates_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<f64>> {
        let mut bits = vec![0; ranks.len()];
        self.rates.load_range(ranks.start, &mut bits)?;
        Ok(bits.into_iter().map(f64::from_bits).collect())
    }
}
