//! The one-sided words every simulated rank shares (clocks, queues, progress, rates), with the
//! sums the simulator keeps beside them and the combining trees they feed ([`super::trees`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use peregrine_transport::Ops;

use super::trees::{FirstAtMost, SimTree};
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
    pub(super) queues: Vec<Queue>,
    /// The iteration each queue belongs to.
    qit: Vec<u64>,
    /// Chunks queued, per iteration (no zero entries).
    queued: BTreeMap<u64, u64>,
    pub(super) progress: Vec<ProgressWord>,
    /// The iteration each progress word belongs to (`None`: none announced yet).
    pit: Vec<Option<u64>>,
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
    pub(super) drained: Option<(SimTree, FirstAtMost)>,
}

impl Words {
    pub(super) fn new(world: usize, trees: Option<bool>, version_kept: bool, drained: bool) -> Self {
        Self {
            drained: drained.then(|| (SimTree::new(world), FirstAtMost::new(world, 0))),
            trees: trees.map(|lines_up| (SimTree::new(world), lines_up.then(|| SimTree::new(world)))),
            version_kept,
            world,
            clocks: vec![0; world],
            min: 0,
            at_min: world,
            version: 0,
            queues: vec![Queue::default(); world],
            qit: vec![0; world],
            queued: BTreeMap::new(),
            progress: vec![ProgressWord::unpack(ProgressWord::NONE); world],
            pit: vec![None; world],
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
        let old = self.queues[r];
        self.unqueue(self.qit[r], old.left());
        self.queues[r] = Queue { tag, head: 0, tail: n };
        self.qit[r] = it;
        if n > 0 {
            *self.queued.entry(it).or_default() += u64::from(n);
        }
        if let Some(p) = self.pit[r] {
            if self.progress[r].done >= self.progress[r].total {
                *self.complete.entry(p).or_default() -= 1;
            }
        }
        self.progress[r] = ProgressWord { tag, total: n, done: 0 };
        self.pit[r] = Some(it);
        if n == 0 {
            *self.complete.entry(it).or_default() += 1;
        }
    }

    /// Takes up to `max` chunks from the head of `r`'s own queue.
    pub(super) fn take_own(&mut self, r: usize, max: u32) -> Option<Range<u32>> {
        let q = &mut self.queues[r];
        let n = q.left().min(max);
        if n == 0 {
            return None;
        }
        let got = q.head..q.head + n;
        q.head += n;
        let it = self.qit[r];
        self.unqueue(it, n);
        Some(got)
    }

    /// Takes `fraction` of `victim`'s queued chunks (at least one) from its tail, as
    /// [`crate::queue::ChunkQueues::steal`] does.
    pub(super) fn steal(&mut self, victim: usize, fraction: f64) -> Option<(u16, Range<u32>)> {
        let q = &mut self.queues[victim];
        let left = q.left();
        let n = ((f64::from(left) * fraction).ceil() as u32).max(1).min(left);
        if n == 0 {
            return None;
        }
        q.tail -= n;
        let got = (q.tag, q.tail..q.tail + n);
        let it = self.qit[victim];
        self.unqueue(it, n);
        Some(got)
    }

    /// Counts `n` more of `r`'s chunks done; returns the iteration whose chunks of `r`'s this
    /// completed, if it did, and whether every rank's are now done.
    pub(super) fn done(&mut self, r: usize, n: u32) -> Option<(u64, bool)> {
        let p = &mut self.progress[r];
        let before = p.done >= p.total;
        p.done += n;
        let it = self.pit[r]?;
        if !before && p.done >= p.total {
            let c = self.complete.entry(it).or_default();
            *c += 1;
            return Some((it, *c == self.world));
        }
        None
    }

    pub(super) fn all_done(&self, it: u64) -> bool {
        self.complete.get(&it) == Some(&self.world)
    }

    /// If `r`'s queue is empty and not yet counted drained for its iteration, counts it: returns
    /// that iteration (the take that emptied it, or the fill with none, arrives at the tree).
    pub(super) fn drain(&mut self, r: usize) -> Option<u64> {
        let (_, next) = self.drained.as_mut()?;
        let it = self.qit[r];
        (self.queues[r].left() == 0 && next.get(r) <= it).then(|| {
            next.set(r, it + 1);
            it
        })
    }

    /// The ranks of the first leaf node of the tree of drained queues with a rank that has not
    /// drained `it` (a look for chunks to take over), or every rank without the tree.
    pub(super) fn candidates(&self, it: u64) -> Range<usize> {
        match &self.drained {
            Some((tree, next)) => match next.first(it) {
                Some(r) => {
                    let host = tree.shape.host(r, 0);
                    host..(host + crate::tree::FAN).min(self.world)
                }
                None => 0..0,
            },
            None => 0..self.world,
        }
    }

    /// What the descent of the tree of drained queues reads: one load of its root and a batch of
    /// a node's children per level below it (counted at [`crate::tree::FAN`]); nothing without
    /// the tree.
    pub(super) fn descent_ops(&self) -> Ops {
        let mut ops = Ops::default();
        if let Some((tree, _)) = &self.drained {
            ops += Ops::batch(1);
            for _ in 1..tree.shape.levels() {
                ops += Ops::batch(crate::tree::FAN.min(self.world));
            }
        }
        ops
    }

    /// What a look for chunks to take over costs: the descent, then the candidates' words in one
    /// batch (a leaf node's with the tree, every rank's without).
    pub(super) fn look_ops(&self) -> Ops {
        let mut ops = self.descent_ops();
        ops += Ops::batch(if self.drained.is_some() { crate::tree::FAN.min(self.world) } else { self.world });
        ops
    }

    /// Whether a rank other than `r` among the candidates of `it` has chunks of `it` queued.
    pub(super) fn stealable_near(&self, r: usize, it: u64) -> bool {
        if self.drained.is_none() {
            return self.stealable(r, it);
        }
        self.candidates(it).any(|v| v != r && self.qit[v] == it && self.queues[v].left() > 0)
    }

    /// Whether a rank other than `r` has chunks of `it` queued.
    fn stealable(&self, r: usize, it: u64) -> bool {
        let mine = if self.qit[r] == it { u64::from(self.queues[r].left()) } else { 0 };
        self.queued.get(&it).is_some_and(|&c| c > mine)
    }

    /// Whether any rank has chunks queued of an iteration not after `it`.
    pub(super) fn any_queued(&self, it: u64) -> bool {
        self.queued.range(..=it).next().is_some()
    }
}
