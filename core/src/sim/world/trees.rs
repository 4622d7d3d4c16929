//! The engine's combining trees in the simulated world (`crate::clocks`, `crate::queue`,
//! [`crate::tree`]): which arrival completes which node, what each arrival's atomics cost, and
//! where a descent of the tree of drained queues ends.

use std::collections::HashMap;

use super::Sim;
use crate::sim::{Nanos, Network};
use crate::tree::Shape;

/// Values per index and the minimum of every aligned block of them, in O(log n): where a
/// descent of the tree of drained queues or the done tree ends (a leaf node with a rank that has
/// not drained, or done, an iteration).
pub(super) struct Minima {
    /// A segment tree of minima: leaves at `size..2 * size`.
    min: Vec<u64>,
    size: usize,
}

impl Minima {
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

    /// Where a descent of a combining tree of `shape` with `draw` ends
    /// ([`crate::tree::Tree::missing`]): the first index of a leaf node holding an index whose
    /// value is at most `bound`, entering at each level the child [`crate::tree::pick`] draws
    /// among those holding one.
    pub(super) fn pick(&self, shape: &Shape, bound: u64, draw: u64) -> Option<usize> {
        if self.min[1] > bound {
            return None;
        }
        let mut host = 0;
        for level in (1..shape.levels()).rev() {
            let (span, kids) = (shape.span(level - 1), shape.children(host, level) as usize);
            // The children's minima: consecutive nodes of the segment tree, one per aligned
            // block of `span` (a power of two) indices.
            let first = (self.size + host) >> span.trailing_zeros();
            host +=
                crate::tree::pick(draw, level, (0..kids).filter(|&i| self.min[first + i] <= bound))? * span;
        }
        Some(host)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::Tree;

    #[test]
    fn a_simulated_descent_ends_where_the_engines_does() {
        // The engine's tree of 300 ranks (three levels) and the simulator's values, with the same
        // ranks late at slot 3: for every draw both descents end at the same leaf node.
        for late in [vec![299], vec![299, 130], vec![5, 20, 130, 131, 250, 299], vec![]] {
            let mut sim = Minima::new(300, 4);
            for &r in &late {
                sim.set(r, 3);
            }
            let shape = Shape::new(300, crate::tree::FAN);
            let engine =
                peregrine_transport::run_local(300, |t| -> peregrine_transport::Result<Vec<Option<usize>>> {
                    let tree = Tree::new(&t, "test tree", 3, 0)?;
                    for j in 0..4u64 {
                        if j < 3 || !late.contains(&t.rank()) {
                            tree.arrive(t.rank(), j)?;
                        }
                        t.barrier()?;
                    }
                    let ends =
                        (0..16).map(|d| Ok(tree.missing(3, d * 7919 + t.rank() as u64)?.map(|r| r.start)));
                    let ends = ends.collect::<peregrine_transport::Result<Vec<_>>>()?;
                    t.barrier()?;
                    tree.free()?;
                    Ok(ends)
                })
                .expect("world");
            for (rank, ends) in engine.into_iter().enumerate() {
                for (d, end) in ends.expect("rank").into_iter().enumerate() {
                    let draw = d as u64 * 7919 + rank as u64;
                    assert_eq!(sim.pick(&shape, 3, draw), end, "late {late:?}, draw {draw}");
                    if let Some(leaf) = end {
                        assert!(late.iter().any(|&r| shape.host(r, 0) == leaf), "{leaf} holds a late rank");
                    }
                }
            }
        }
    }
}
