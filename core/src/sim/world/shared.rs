//! The one-sided words every simulated rank shares (clocks, queues, progress, rates), with the
//! sums the simulator keeps beside them and the combining trees they feed ([`super::trees`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use peregrine_transport::Ops;

use super::trees::{Minima, SimTree};
use crate::words::{self, ProgressWord, Queue};

/// Every rank's one-sided words (clocks, queues, progress, rates), with the sums the simulator
/// keeps beside them so that global questions cost O(1): the slowest clock and how many ranks
/// are at it, the sum of clocks, chunks queued per iteration, ranks whose iteration is done.
pub(super) struct Words {
    pub(super) world: usize,
    pub(super) clocks: Vec<u64>,
    pub(super) min: u64,
    at_min: usize,
    pub(super) version: u64,
    /// Every rank's queue and progress word (each chunk taken and done touches both).
    pub(super) ranks: Vec<RankWords>,
    /// Chunks queued, per iteration (no zero entries).
    queued: BTreeMap<u64, u64>,
    /// Per iteration, ranks whose progress word is that iteration's with every chunk done.
    complete: HashMap<u64, usize>,
    pub(super) rates: Vec<f64>,
    /// The engine's combining trees (`crate::clocks`), when the policy bounds staleness: the
    /// clock tree and, when ranks line up, the done tree.
    pub(super) trees: Option<(SimTree, Option<SimTree>)>,
    /// Whether the version is one counter (the policy reads it).
    pub(super) version_kept: bool,
    /// The tree of drained queues (`crate::queue`), when ranks take over chunks under a
    /// staleness bound, with every rank's first iteration whose queue it has not drained.
    pub(super) drained: Option<(SimTree, Minima)>,
    /// Looks for chunks to take over so far (drawing their blocks or descents).
    looks: std::cell::Cell<u64>,
    /// Descents of the done tree so far (drawing their paths).
    copy_looks: std::cell::Cell<u64>,
    /// With the done tree: every rank's first iteration whose chunks are not all done (where a
    /// descent of the done tree ends).
    undone: Option<Minima>,
}

/// A rank's chunk queue and progress word, with the iterations they belong to: one cache line
/// (a simulation of thousands of ranks touches a random rank's words at every chunk).
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
pub(super) struct RankWords {
    pub(super) queue: Queue,
    pub(super) progress: ProgressWord,
    /// The iteration the queue belongs to.
    qit: u64,
    /// The iteration the progress word belongs to ([`NONE`]: none announced yet).
    pit: u64,
}

/// No iteration announced yet.
const NONE: u64 = u64::MAX;

impl Words {
    pub(super) fn new(world: usize, trees: Option<bool>, version_kept: bool, drained: bool) -> Self {
        Self {
            drained: drained.then(|| (SimTree::new(world), Minima::new(world, 0))),
            looks: std::cell::Cell::new(0),
            copy_looks: std::cell::Cell::new(0),
            undone: (trees == Some(true)).then(|| Minima::new(world, 0)),
            trees: trees.map(|lines_up| (SimTree::new(world), lines_up.then(|| SimTree::new(world)))),
            version_kept,
            world,
            clocks: vec![0; world],
            min: 0,
            at_min: world,
            version: 0,
            ranks: vec![
                RankWords {
                    queue: Queue::default(),
                    progress: ProgressWord::unpack(ProgressWord::NONE),
                    qit: 0,
                    pit: NONE,
                };
                world
            ],
            queued: BTreeMap::new(),
            complete: HashMap::new(),
            rates: vec![0.0; world],
        }
    }

    pub(super) fn tick(&mut self, r: usize) {
        self.clocks[r] += 1;
        self.version += 1;
        if self.clocks[r] == self.min + 1 {
            self.at_min -= 1;
            if self.at_min == 0 {
                self.min += 1;
                self.at_min = self.clocks.iter().filter(|&&c| c == self.min).count();
            }
        }
    }

    fn unqueue(&mut self, it: u64, n: u32) {
        if n == 0 {
            return;
        }
        if let Some(c) = self.queued.get_mut(&it) {
            *c -= u64::from(n);
            if *c == 0 {
                self.queued.remove(&it);
            }
        }
    }

    /// Announces and queues `r`'s `n` chunks of `it`.
    pub(super) fn open(&mut self, r: usize, it: u64, n: u32) {
        let tag = words::tag(it);
        let old = self.ranks[r];
        self.unqueue(old.qit, old.queue.left());
        if n > 0 {
            *self.queued.entry(it).or_default() += u64::from(n);
        }
        if old.pit != NONE && old.progress.done >= old.progress.total {
            *self.complete.entry(old.pit).or_default() -= 1;
        }
        self.ranks[r] = RankWords {
            queue: Queue { tag, head: 0, tail: n },
            progress: ProgressWord { tag, total: n, done: 0 },
            qit: it,
            pit: it,
        };
        if n == 0 {
            *self.complete.entry(it).or_default() += 1;
            self.finished(r, it);
        }
    }

    /// Takes up to `max` chunks from the head of `r`'s own queue.
    pub(super) fn take_own(&mut self, r: usize, max: u32) -> Option<Range<u32>> {
        let w = &mut self.ranks[r];
        let n = w.queue.left().min(max);
        if n == 0 {
            return None;
        }
        let got = w.queue.head..w.queue.head + n;
        w.queue.head += n;
        let it = w.qit;
        self.unqueue(it, n);
        Some(got)
    }

    /// Takes `fraction` of `victim`'s queued chunks ([`crate::queue::steal_count`]) from its
    /// tail, as [`crate::queue::ChunkQueues::steal`] does.
    pub(super) fn steal(&mut self, victim: usize, fraction: f64) -> Option<(u16, Range<u32>)> {
        let w = &mut self.ranks[victim];
        let n = crate::queue::steal_count(w.queue.left(), fraction, u32::MAX);
        if n == 0 {
            return None;
        }
        w.queue.tail -= n;
        let got = (w.queue.tag, w.queue.tail..w.queue.tail + n);
        let it = w.qit;
        self.unqueue(it, n);
        Some(got)
    }

    /// Counts `n` more of `r`'s chunks done; returns the iteration whose chunks of `r`'s this
    /// completed, if it did, and whether every rank's are now done.
    pub(super) fn done(&mut self, r: usize, n: u32) -> Option<(u64, bool)> {
        let w = &mut self.ranks[r];
        let before = w.progress.done >= w.progress.total;
        w.progress.done += n;
        let it = w.pit;
        if it == NONE {
            return None;
        }
        if !before && w.progress.done >= w.progress.total {
            self.finished(r, it);
            let c = self.complete.entry(it).or_default();
            *c += 1;
            return Some((it, *c == self.world));
        }
        None
    }

    /// `r`'s chunks of `it` are all done.
    fn finished(&mut self, r: usize, it: u64) {
        if let Some(undone) = &mut self.undone {
            undone.set(r, it + 1);
        }
    }

    /// The ranks of a leaf node of the done tree with a rank whose chunks of `it` are not all
    /// done, on `r`'s random path (empty: none), past [`crate::queue::READ_ALL_UP_TO`] ranks
    /// with the done tree; else every rank ([`crate::clocks::Clocks::undone`]).
    pub(super) fn undone(&self, r: usize, it: u64) -> Range<usize> {
        match (&self.undone, &self.trees) {
            (Some(undone), Some((_, Some(tree)))) if self.world > crate::queue::READ_ALL_UP_TO => self.leaf(
                tree,
                undone.pick(&tree.shape, it, crate::queue::draw(r, it, Self::next(&self.copy_looks))),
            ),
            _ => 0..self.world,
        }
    }

    /// What [`Words::undone`] reads: the done tree's descent (as [`Words::descent_ops`]'s).
    pub(super) fn undone_ops(&self) -> Ops {
        let mut ops = Ops::default();
        if let (Some(_), Some((_, Some(tree)))) = (&self.undone, &self.trees) {
            if self.world > crate::queue::READ_ALL_UP_TO {
                ops += self.descent(tree);
            }
        }
        ops
    }

    pub(super) fn all_done(&self, it: u64) -> bool {
        self.complete.get(&it) == Some(&self.world)
    }

    /// If `r`'s queue is empty and not yet counted drained for its iteration, counts it: returns
    /// that iteration (the take that emptied it, or the fill with none, arrives at the tree).
    pub(super) fn drain(&mut self, r: usize) -> Option<u64> {
        let (_, next) = self.drained.as_mut()?;
        let w = &self.ranks[r];
        let it = w.qit;
        (w.queue.left() == 0 && next.get(r) <= it).then(|| {
            next.set(r, it + 1);
            it
        })
    }

    /// The ranks of a leaf node of the tree of drained queues with a rank that has not drained
    /// `it`, on a random path (`r`'s look for chunks to take over), or without the tree a block drawn at
    /// random ([`crate::queue::sampled`]).
    pub(super) fn candidates(&self, r: usize, it: u64) -> Range<usize> {
        match &self.drained {
            Some((tree, next)) => self
                .leaf(tree, next.pick(&tree.shape, it, crate::queue::draw(r, it, Self::next(&self.looks)))),
            None if self.world > crate::queue::SAMPLE_ABOVE => {
                crate::queue::sampled(self.world, r, it, Self::next(&self.looks))
            }
            None => 0..self.world,
        }
    }

    /// What the descent of the tree of drained queues reads: one load of its root and a batch of
    /// a node's children per level below it (counted at [`crate::tree::FAN`]); nothing without
    /// the tree.
    pub(super) fn descent_ops(&self) -> Ops {
        self.drained.as_ref().map_or(Ops::default(), |(tree, _)| self.descent(tree))
    }

    /// A descent of `tree`: one load of its root and a batch of a node's children per level
    /// below it (counted at [`crate::tree::FAN`]).
    fn descent(&self, tree: &SimTree) -> Ops {
        let mut ops = Ops::batch(1);
        for _ in 1..tree.shape.levels() {
            ops += Ops::batch(crate::tree::FAN.min(self.world));
        }
        ops
    }

    /// The ranks of `tree`'s leaf node that holds rank `first` (none: empty), where a descent
    /// ends.
    fn leaf(&self, tree: &SimTree, first: Option<usize>) -> Range<usize> {
        first.map_or(0..0, |r| {
            let host = tree.shape.host(r, 0);
            host..(host + crate::tree::FAN).min(self.world)
        })
    }

    /// The count `c` held, which it now holds one more than.
    fn next(c: &std::cell::Cell<u64>) -> u64 {
        let n = c.get();
        c.set(n + 1);
        n
    }

    /// What a look for chunks to take over costs: the descent, then the candidates' words in one
    /// batch (a leaf node's with the tree, a block's or every rank's without).
    pub(super) fn look_ops(&self) -> Ops {
        let mut ops = self.descent_ops();
        let fan = crate::tree::FAN.min(self.world);
        let sampled = self.world > crate::queue::SAMPLE_ABOVE;
        ops += Ops::batch(if self.drained.is_some() || sampled { fan } else { self.world });
        ops
    }

    /// Whether a rank other than `r` among the candidates of `it` has chunks of `it` queued.
    pub(super) fn stealable_near(&self, r: usize, it: u64) -> bool {
        self.candidates(r, it).any(|v| v != r && self.ranks[v].qit == it && self.ranks[v].queue.left() > 0)
    }

    /// Whether any rank has chunks queued of an iteration not after `it`.
    pub(super) fn any_queued(&self, it: u64) -> bool {
        self.queued.range(..=it).next().is_some()
    }
}
