//! The engine's combining trees in the simulated world (`crate::clocks`, `crate::queue`,
//! [`crate::tree`]): which arrival completes which node, what each arrival's atomics cost, and
//! where a descent of the tree of drained queues ends.

use std::collections::HashMap;

use super::Sim;
use crate::sim::{Nanos, Network};
use crate::tree::Shape;

/// Values per index, and the first index whose value is at most a bound, in O(log n): where a
/// descent of the tree of drained queues ends (the first rank that has not drained an
/// iteration).
pub(super) struct FirstAtMost {
    /// A segment tree of minima: leaves at `size..2 * size`.
    min: Vec<u64>,
    size: usize,
}

impl FirstAtMost {
    pub(super) fn new(n: usize, value: u64) -> Self {
        let size = n.next_power_of_two();
        let mut min = vec![u64::MAX; 2 * size];
        min[size..size + n].fill(value);
        for i in (1..size).rev() {
            min[i] = min[2 * i].min(min[2 * i + 1]);
        }
        Self { min, size }
    }

    pub(super) fn get(&self, i: usize) -> u64 {
        self.min[self.size + i]
    }

    pub(super) fn set(&mut self, i: usize, value: u64) {
        let mut i = self.size + i;
        self.min[i] = value;
        while i > 1 {
            i /= 2;
            self.min[i] = self.min[2 * i].min(self.min[2 * i + 1]);
        }
    }

    /// The first index whose value is at most `bound`.
    pub(super) fn first(&self, bound: u64) -> Option<usize> {
        if self.min[1] > bound {
            return None;
        }
        let mut i = 1;
        while i < self.size {
            i = if self.min[2 * i] <= bound { 2 * i } else { 2 * i + 1 };
        }
        Some(i - self.size)
    }
}

/// A combining tree's counts in the simulated world ([`crate::tree`]): which arrival completes
/// which node, so that each arrival is charged the atomics it issues.
pub(super) struct SimTree {
    pub(super) shape: Shape,
    /// Arrivals so far at `(level, host, slot)`, for the nodes not yet complete.
    counts: HashMap<(usize, usize, u64), u64>,
}

impl SimTree {
    pub(super) fn new(world: usize) -> Self {
        Self { shape: Shape::new(world, crate::tree::FAN), counts: HashMap::new() }
    }

    /// `leaf` arrives at `j`, by `from`: what its atomics cost (one per node it adds to, one
    /// more to name itself at the root if it completes it), and whether it completed the root.
    pub(super) fn arrive(&mut self, net: &Network, from: usize, leaf: usize, j: u64) -> (Nanos, bool) {
        let mut cost = 0;
        for level in 0..self.shape.levels() {
            let host = self.shape.host(leaf, level);
            cost = net.atomic(from, host).saturating_add(cost);
            let c = self.counts.entry((level, host, j)).or_default();
            *c += 1;
            if *c < self.shape.children(leaf, level) {
                return (cost, false);
            }
            self.counts.remove(&(level, host, j));
        }
        (cost.saturating_add(net.atomic(from, 0)), true)
    }
}

impl Sim<'_> {
    /// After `r` took chunks from `owner`'s queue: if that emptied it, `r`'s arrival for it at
    /// the tree of drained queues, and what its atomics cost.
    pub(super) fn drained_by(&mut self, r: usize, owner: usize) -> Nanos {
        match self.w.drain(owner) {
            Some(j) => self.drained_arrival(r, owner, j),
            None => 0,
        }
    }

    /// `r` arrives for `owner` at slot `j` of the tree of drained queues: what it costs.
    pub(super) fn drained_arrival(&mut self, r: usize, owner: usize, j: u64) -> Nanos {
        match self.w.drained.as_mut() {
            Some((tree, _)) => tree.arrive(&self.s.net, r, owner, j).0,
            None => 0,
        }
    }

    /// `r` arrives for `owner` at slot `it` of the done tree, if there is one: what it costs.
    pub(super) fn done_arrival(&mut self, r: usize, owner: usize, it: u64) -> Nanos {
        match self.w.trees.as_mut() {
            Some((_, Some(tree))) => tree.arrive(&self.s.net, r, owner, it).0,
            _ => 0,
        }
    }
}
