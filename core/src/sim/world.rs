//! The simulated world: every rank's words, threads and phases, stepped event by event in virtual
//! time, asking each rank's [`Policy`] at the same hooks as the engine does
//! (`crate::engine::run` and `crate::engine::compute` are the mechanism this mirrors, phase for
//! phase).

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;
use std::time::Duration;

use super::cost::{nanos, ComputeModel, NodeCombine};
use super::events::{EventQueue, Nanos};
use super::{SimConfig, SimError};
use peregrine_transport::{Ops, Transport};

use super::cost::Network;
use crate::engine::{IterRecord, RankTotals};
use crate::plan::Plan;
use crate::scheme::{thread_share, OwnChunks, Policy, Take, View};
use crate::tree::Shape;
use crate::words::{self, ProgressWord, Queue};

/// Every rank's one-sided words (clocks, queues, progress, rates), with the sums the simulator
/// keeps beside them so that global questions cost O(1): the slowest clock and how many ranks
/// are at it, the sum of clocks, chunks queued per iteration, ranks whose iteration is done.
pub(super) struct Words {
    world: usize,
    clocks: Vec<u64>,
    min: u64,
    at_min: usize,
    version: u64,
    queues: Vec<Queue>,
    /// The iteration each queue belongs to.
    qit: Vec<u64>,
    /// Chunks queued, per iteration (no zero entries).
    queued: BTreeMap<u64, u64>,
    progress: Vec<ProgressWord>,
    /// The iteration each progress word belongs to (`None`: none announced yet).
    pit: Vec<Option<u64>>,
    /// Per iteration, ranks whose progress word is that iteration's with every chunk done.
    complete: HashMap<u64, usize>,
    rates: Vec<f64>,
    /// The engine's combining trees (`crate::clocks`), when the policy bounds staleness: the
    /// clock tree and, when ranks line up, the done tree.
    trees: Option<(SimTree, Option<SimTree>)>,
    /// Whether the version is one counter (the policy reads it).
    version_kept: bool,
    /// The tree of drained queues (`crate::queue`), when ranks take over chunks under a
    /// staleness bound, with every rank's first iteration whose queue it has not drained.
    drained: Option<(SimTree, FirstAtMost)>,
}

/// Values per index, and the first index whose value is at most a bound, in O(log n): where a
/// descent of the tree of drained queues ends (the first rank that has not drained an
/// iteration).
pub(super) struct FirstAtMost {
    /// A segment tree of minima: leaves at `size..2 * size`.
    min: Vec<u64>,
    size: usize,
}

impl FirstAtMost {
    fn new(n: usize, value: u64) -> Self {
        let size = n.next_power_of_two();
        let mut min = vec![u64::MAX; 2 * size];
        min[size..size + n].fill(value);
        for i in (1..size).rev() {
            min[i] = min[2 * i].min(min[2 * i + 1]);
        }
        Self { min, size }
    }

    fn get(&self, i: usize) -> u64 {
        self.min[self.size + i]
    }

    fn set(&mut self, i: usize, value: u64) {
        let mut i = self.size + i;
        self.min[i] = value;
        while i > 1 {
            i /= 2;
            self.min[i] = self.min[2 * i].min(self.min[2 * i + 1]);
        }
    }

    /// The first index whose value is at most `bound`.
    fn first(&self, bound: u64) -> Option<usize> {
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
    shape: Shape,
    /// Arrivals so far at `(level, host, slot)`, for the nodes not yet complete.
    counts: HashMap<(usize, usize, u64), u64>,
}

impl SimTree {
    fn new(world: usize) -> Self {
        Self { shape: Shape::new(world, crate::tree::FAN), counts: HashMap::new() }
    }

    /// `leaf` arrives at `j`, by `from`: what its atomics cost (one per node it adds to, one
    /// more to name itself at the root if it completes it), and whether it completed the root.
    fn arrive(&mut self, net: &Network, from: usize, leaf: usize, j: u64) -> (Nanos, bool) {
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

impl Words {
    fn new(world: usize, trees: Option<bool>, version_kept: bool, drained: bool) -> Self {
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

    fn tick(&mut self, r: usize) {
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
    fn open(&mut self, r: usize, it: u64, n: u32) {
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
    fn take_own(&mut self, r: usize, max: u32) -> Option<Range<u32>> {
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
    fn steal(&mut self, victim: usize, fraction: f64) -> Option<(u16, Range<u32>)> {
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
    fn done(&mut self, r: usize, n: u32) -> Option<(u64, bool)> {
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

    fn all_done(&self, it: u64) -> bool {
        self.complete.get(&it) == Some(&self.world)
    }

    /// If `r`'s queue is empty and not yet counted drained for its iteration, counts it: returns
    /// that iteration (the take that emptied it, or the fill with none, arrives at the tree).
    fn drain(&mut self, r: usize) -> Option<u64> {
        let (_, next) = self.drained.as_mut()?;
        let it = self.qit[r];
        (self.queues[r].left() == 0 && next.get(r) <= it).then(|| {
            next.set(r, it + 1);
            it
        })
    }

    /// The ranks of the first leaf node of the tree of drained queues with a rank that has not
    /// drained `it` (a look for chunks to take over), or every rank without the tree.
    fn candidates(&self, it: u64) -> Range<usize> {
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
    fn descent_ops(&self) -> Ops {
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
    fn look_ops(&self) -> Ops {
        let mut ops = self.descent_ops();
        ops += Ops::batch(if self.drained.is_some() { crate::tree::FAN.min(self.world) } else { self.world });
        ops
    }

    /// Whether a rank other than `r` among the candidates of `it` has chunks of `it` queued.
    fn stealable_near(&self, r: usize, it: u64) -> bool {
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
    fn any_queued(&self, it: u64) -> bool {
        self.queued.range(..=it).next().is_some()
    }
}

/// The world as rank `rank`'s policy sees it, counting the words it reads (each an atomic
/// one-sided load in a real run, which the simulator charges).
pub(super) struct SimView<'w> {
    w: &'w Words,
    rank: usize,
    ops: Cell<Ops>,
}

impl<'w> SimView<'w> {
    fn new(w: &'w Words, rank: usize) -> Self {
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
    fn ops(&self) -> Ops {
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
        Ok(self.w.queues[rank])
    }
    fn progress(&self, rank: usize) -> crate::scheme::Result<ProgressWord> {
        self.read();
        Ok(self.w.progress[rank])
    }
    fn rate(&self, rank: usize) -> crate::scheme::Result<f64> {
        self.read();
        Ok(self.w.rates[rank])
    }
    fn clocks(&self) -> crate::scheme::Result<Vec<u64>> {
        self.read_all();
        Ok(self.w.clocks.clone())
    }
    fn queues(&self) -> crate::scheme::Result<Vec<Queue>> {
        self.read_all();
        Ok(self.w.queues.clone())
    }
    fn rates(&self) -> crate::scheme::Result<Vec<f64>> {
        self.read_all();
        Ok(self.w.rates.clone())
    }
    /// The descent of the tree of drained queues (its reads charged here, the candidates' words
    /// by the reads that follow).
    fn candidates(&self, it: u64) -> crate::scheme::Result<Range<usize>> {
        self.add(self.w.descent_ops());
        Ok(self.w.candidates(it))
    }
    fn queues_in(&self, ranks: Range<usize>) -> crate::scheme::Result<Vec<Queue>> {
        self.add(Ops::batch(ranks.len()));
        Ok(self.w.queues[ranks].to_vec())
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

/// Where the ranks of a node wait for each other under the node combine
/// ([`super::cost::NodeCombine`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    /// Pulled: no rank of the node computes before every one has its stripe in the node's copy.
    Pull,
    /// Copied its update into its slot: no rank sums its stripe before every slot is filled.
    Push,
}

impl Stage {
    /// The event that takes the rank on past the barrier.
    fn event(self, r: usize) -> Ev {
        match self {
            Self::Pull => Ev::Compute(r),
            Self::Push => Ev::Pushed(r),
        }
    }

    /// What the rank pays past the barrier: its atomic, and after the push's, the sum of the
    /// rank's stripe and its writes.
    fn after(self, c: &NodeCombine) -> Nanos {
        match self {
            Self::Pull => c.barrier,
            Self::Push => c.barrier.saturating_add(c.push_sum),
        }
    }
}

/// Where a rank stands with its node's barrier. A rank arriving schedules its event past the
/// barrier as if it were the last to arrive; if it was not, the event, popped early, waits for
/// the release and is scheduled again then. (So a node whose ranks arrive together schedules no
/// more events than a flat run, in the same order: the event queue's slots are reused as they
/// are there.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Gate {
    /// Not at a barrier, or through it: the rank's events go on.
    Through,
    /// At a barrier not yet released; `parked`: its event past it came and waits for the
    /// release.
    Held { parked: bool },
    /// Released: the rank goes on at this time.
    Released(Nanos),
}

/// The ranks of a node arrived at one of its barriers, with when each arrived.
#[derive(Debug, Default)]
struct Barrier {
    arrived: Vec<(usize, Nanos)>,
    latest: Nanos,
}

/// What a thread is computing.
#[derive(Clone, Debug)]
enum Item {
    /// Own chunks, counted done at the end.
    Whole(Range<u32>),
    /// One own chunk claimed before it started.
    Claimed(u32),
    /// One own chunk computed as a copy: applied if it claims the chunk at the end.
    OwnCopy(u32),
    /// Chunks taken over from `victim`'s iteration `vit`.
    Help { victim: usize, vit: u64, chunks: Range<u32>, reassigned: bool },
    /// A copy of `owner`'s chunk, while lining up.
    Copy { owner: usize, chunk: u32 },
}

/// One compute thread of a rank.
#[derive(Clone, Debug, Default)]
struct Thread {
    item: Option<Item>,
    /// Bumped when the thread's end event is replaced (a copy's delay cut short).
    gen: u64,
    started: Nanos,
    /// When the item's compute (before its injected delay) ends, and when it ends.
    compute_end: Nanos,
    end: Nanos,
    /// The own chunks taken and not yet started (`ClaimFirst`, `AsCopies`), or the last take.
    own: Option<(Range<u32>, OwnChunks)>,
    /// Reassignments to take before the rank's own next chunks.
    takes: VecDeque<Take>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RankPhase {
    Start,
    Pull,
    Compute,
    /// Done computing, lining up: waiting for the iteration to be done everywhere.
    LineWait,
    /// Lining up, threads taking over chunks or copying.
    LineHelp {
        copies: bool,
    },
    Push,
    Wait,
    Done,
}

struct Rank {
    it: u64,
    next: u64,
    phase: RankPhase,
    active: usize,
    delay: f64,
    own_start: usize,
    threads: Vec<Thread>,
    busy_threads: usize,
    c1: Nanos,
    own_done: Nanos,
    per_chunk: Nanos,
    lined_at: Nanos,
    helped: Nanos,
    help_start: Nanos,
    line_wait: Nanos,
    wait_since: Nanos,
    iter_chunks: u64,
    busy: Nanos,
    applied: bool,
    rec: IterRecord,
    totals: RankTotals,
    finished: Nanos,
    /// Under the node combine: the rank and its node's barrier.
    gate: Gate,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Open(usize),
    Compute(usize),
    Thread(usize, usize, u64),
    Pushed(usize),
    /// The rank's tick has landed (and passed up the clock tree).
    Ticked(usize),
    Check(usize),
}

impl Ev {
    /// The rank the event is for.
    fn rank(self) -> usize {
        match self {
            Self::Open(r)
            | Self::Compute(r)
            | Self::Thread(r, ..)
            | Self::Pushed(r)
            | Self::Ticked(r)
            | Self::Check(r) => r,
        }
    }
}

/// A simulation in progress.
pub(super) struct Sim<'a> {
    s: &'a SimConfig,
    plan: Plan,
    q: EventQueue<Ev>,
    w: Words,
    ranks: Vec<Rank>,
    policies: Vec<Box<dyn Policy>>,
    /// The serial world the policies' windows live in (it counts their operations).
    world: Vec<Transport>,
    steal: bool,
    rates: bool,
    copies: bool,
    /// Ranks waiting for `ready`, by iteration.
    waiting: BTreeMap<u64, Vec<usize>>,
    /// Ranks lining up with nothing to do, by iteration.
    lined: HashMap<u64, Vec<usize>>,
    /// Copies running, by chunk `(owner, chunk)`: `(rank, thread)`.
    copying: HashMap<(usize, u32), Vec<(usize, usize)>>,
    /// The batches of the last few iterations: `(iteration, start, end)` at `iteration % 4`.
    batches: [Cell<(u64, usize, usize)>; 4],
    /// Whether the ranks of a node combine on the node ([`SimConfig::node_combine`]).
    combine: bool,
    /// Node barriers not yet released, by `(node, stage, iteration)`.
    barriers: BTreeMap<(usize, Stage, u64), Barrier>,
    /// Per node, its ranks that are done (no barrier waits for them).
    node_done: Vec<usize>,
    /// Seconds of one read of a word of a random rank.
    read_cost: f64,
    /// Seconds of one more read pipelined behind another (a batch reading every rank's word).
    gap_cost: f64,
    pub(super) to_target: Option<Nanos>,
    pub(super) most_iterations: u64,
    records: Option<&'a mut dyn FnMut(&IterRecord)>,
}

type R<T> = Result<T, SimError>;

impl<'a> Sim<'a> {
    pub(super) fn new(
        s: &'a SimConfig,
        plan: Plan,
        world: Vec<Transport>,
        policies: Vec<Box<dyn Policy>>,
        records: Option<&'a mut dyn FnMut(&IterRecord)>,
    ) -> Self {
        let n = s.ranks;
        let steal = policies.first().is_some_and(|p| p.takes_over());
        let rates = policies.first().is_some_and(|p| p.reads_rates());
        let copies = policies.first().is_some_and(|p| p.copies());
        // The engine's aggregated words, as `Clocks::new` chooses them from the policy.
        let trees = policies.first().filter(|p| p.staleness().is_some()).map(|p| p.line_up());
        let version_kept = policies.first().is_some_and(|p| p.reads_version());
        let drained = trees.is_some() && steal;
        let combine = s.node_combine(policies.first().is_some_and(|p| p.synchronous()));
        let ranks = (0..n)
            .map(|_| Rank {
                it: 0,
                next: 0,
                phase: RankPhase::Start,
                active: 1,
                delay: 0.0,
                own_start: 0,
                threads: vec![Thread::default(); s.max_threads()],
                busy_threads: 0,
                c1: 0,
                own_done: 0,
                per_chunk: 0,
                lined_at: 0,
                helped: 0,
                help_start: 0,
                line_wait: 0,
                wait_since: 0,
                iter_chunks: 0,
                busy: 0,
                applied: true,
                rec: IterRecord::default(),
                totals: RankTotals::default(),
                finished: 0,
                gate: Gate::Through,
            })
            .collect();
        let mut q = EventQueue::default();
        for r in 0..n {
            q.push(0, Ev::Open(r));
        }
        Self {
            batches: std::array::from_fn(|_| Cell::new((u64::MAX, 0, 0))),
            read_cost: s.net.mean_atomic(n),
            gap_cost: s.net.mean_gap(n),
            s,
            plan,
            q,
            w: Words::new(n, trees, version_kept, drained),
            ranks,
            policies,
            world,
            steal,
            rates,
            copies,
            combine,
            barriers: BTreeMap::new(),
            node_done: vec![0; n.div_ceil(s.net.ranks_per_node.max(1))],
            waiting: BTreeMap::new(),
            lined: HashMap::new(),
            copying: HashMap::new(),
            to_target: None,
            most_iterations: 0,
            records,
        }
    }

    /// Runs every event; returns the time the last rank finished.
    pub(super) fn run(&mut self) -> R<Nanos> {
        while let Some((t, ev)) = self.q.pop() {
            if t >= super::HORIZON {
                let rank = ev.rank();
                return Err(SimError::Horizon { rank, iteration: self.ranks[rank].it });
            }
            match ev {
                Ev::Open(r) => self.open(r, t)?,
                Ev::Compute(r) => {
                    if self.through(r, Stage::Pull, t) {
                        self.compute(r, t)?;
                    }
                }
                Ev::Thread(r, th, gen) => {
                    if self.ranks[r].threads[th].gen == gen {
                        self.thread_done(r, th, t)?;
                    }
                }
                Ev::Pushed(r) => {
                    if self.through(r, Stage::Push, t) {
                        self.pushed(r, t)?;
                    }
                }
                Ev::Ticked(r) => self.ticked(r, t)?,
                Ev::Check(r) => {
                    if self.ranks[r].phase == RankPhase::LineWait {
                        self.line_up(r, t)?;
                    }
                }
            }
        }
        let stuck: Vec<usize> =
            (0..self.ranks.len()).filter(|&r| self.ranks[r].phase != RankPhase::Done).collect();
        if let Some(&r) = stuck.first() {
            return Err(SimError::Stalled {
                ranks: stuck.len(),
                rank: r,
                iteration: self.ranks[r].it,
                phase: format!("{:?}", self.ranks[r].phase),
            });
        }
        Ok(self.ranks.iter().map(|r| r.finished).max().unwrap_or(0))
    }

    /// Whether the ranks of a node combine on the node.
    pub(super) fn node_combine(&self) -> bool {
        self.combine
    }

    /// Events processed.
    pub(super) fn events(&self) -> u64 {
        self.q.popped()
    }

    /// Every rank's totals, each policy's share included.
    pub(super) fn totals(&self) -> Vec<RankTotals> {
        self.ranks
            .iter()
            .zip(&self.policies)
            .map(|(r, p)| {
                let mut t = r.totals;
                p.totals(&mut t);
                t
            })
            .collect()
    }

    /// Frees the policies (their windows).
    pub(super) fn free(self) -> R<()> {
        for p in self.policies {
            p.free()?;
        }
        Ok(())
    }

    /// The cost of reads `ops` of random ranks' words by `r`, and of the operations `r`'s policy
    /// issued on its own windows since the last charge: a round trip of a random rank each, a
    /// gap for each one pipelined behind another.
    fn charge(&self, r: usize, mut ops: Ops) -> Nanos {
        ops += self.world[r].take_ops();
        nanos(ops.trips as f64 * self.read_cost + ops.pipelined as f64 * self.gap_cost)
    }

    fn transfer_cost(&self, r: usize, it: u64) -> Nanos {
        match &self.s.compute {
            ComputeModel::Replay(m) => nanos(m.get(r, it).comm / 2.0),
            _ => self.s.net.transfer(r, self.s.ranks, self.s.params),
        }
    }

    /// `r`'s costs under the node combine in `it`. Replayed: the measured communication, half
    /// the pull and half the push after the barrier, and the barriers' own atomics in it.
    fn combine_cost(&self, r: usize, it: u64) -> NodeCombine {
        match &self.s.compute {
            ComputeModel::Replay(m) => {
                let half = nanos(m.get(r, it).comm / 2.0);
                NodeCombine { pull: half, push_copy: 0, push_sum: half, barrier: 0 }
            }
            _ => self.s.net.combine(r, self.s.ranks, self.s.params),
        }
    }

    /// `r` reaches its node's barrier `stage` of its iteration at `at` (now or later): the
    /// barrier is released once every rank of the node still running has arrived.
    fn arrive(&mut self, r: usize, stage: Stage, at: Nanos) -> R<()> {
        let it = self.ranks[r].it;
        let after = stage.after(&self.combine_cost(r, it));
        self.ranks[r].gate = Gate::Held { parked: false };
        self.q.push(at.saturating_add(after), stage.event(r));
        let key = (self.s.net.node(r), stage, it);
        let b = self.barriers.entry(key).or_default();
        b.arrived.push((r, at));
        b.latest = b.latest.max(at);
        self.release(key, at)
    }

    /// Ranks of `node`: the full count, the last node's possibly fewer.
    fn node_size(&self, node: usize) -> usize {
        let per_node = self.s.net.ranks_per_node.max(1);
        self.s.ranks.min((node + 1) * per_node) - (node * per_node).min(self.s.ranks)
    }

    /// If every rank of the node still running has arrived at barrier `key`, releases it, not
    /// before `now`: each rank waited from its arrival to the last one, pays the barrier's
    /// atomic, then goes on (computes after the pull, or sums its stripe and writes it after the
    /// copy of its update).
    fn release(&mut self, key: (usize, Stage, u64), now: Nanos) -> R<()> {
        let (node, stage, it) = key;
        let running = self.node_size(node) - self.node_done[node];
        let Some(b) = self.barriers.get(&key).filter(|b| b.arrived.len() >= running) else { return Ok(()) };
        let last = b.latest.max(now);
        let Some(b) = self.barriers.remove(&key) else { return Ok(()) };
        for (r, at) in b.arrived {
            let after = stage.after(&self.combine_cost(r, it));
            let go = last.saturating_add(after);
            let rk = &mut self.ranks[r];
            rk.rec.wait += (last - at) as f64 * 1e-9;
            rk.rec.comm += after as f64 * 1e-9;
            if rk.gate == (Gate::Held { parked: true }) {
                rk.gate = Gate::Through;
                self.q.push(go, stage.event(r));
            } else {
                rk.gate = Gate::Released(go);
            }
        }
        Ok(())
    }

    /// `r`'s event past its node's barrier `stage` came at `t`: whether it goes on now (else it
    /// waits for the release, or comes again at the release's time).
    fn through(&mut self, r: usize, stage: Stage, t: Nanos) -> bool {
        let rk = &mut self.ranks[r];
        match rk.gate {
            Gate::Through => true,
            Gate::Held { .. } => {
                rk.gate = Gate::Held { parked: true };
                false
            }
            Gate::Released(go) if go > t => {
                self.q.push(go, stage.event(r));
                false
            }
            Gate::Released(_) => {
                rk.gate = Gate::Through;
                true
            }
        }
    }

    /// `r` is done at `t`: its node's barriers no longer wait for it.
    fn leave(&mut self, r: usize, t: Nanos) -> R<()> {
        let node = self.s.net.node(r);
        self.node_done[node] += 1;
        let pending: Vec<_> = self.barriers.range((node, Stage::Pull, 0)..).map(|(k, _)| *k).collect();
        for key in pending.into_iter().take_while(|k| k.0 == node) {
            self.release(key, t)?;
        }
        Ok(())
    }

    fn overhead(&self, r: usize, it: u64) -> Nanos {
        match &self.s.compute {
            ComputeModel::Replay(m) => nanos(m.get(r, it).overhead),
            _ => nanos(self.s.overhead),
        }
    }

    /// Opens `r`'s next iteration (hooks `begin`, `threads`, `chunks`, `open`), announced and
    /// queued; the pull follows.
    fn open(&mut self, r: usize, t: Nanos) -> R<()> {
        let cfg = &self.s.cfg;
        let view = SimView::new(&self.w, r);
        let next = self.ranks[r].next;
        let it = if next < cfg.iterations { self.policies[r].begin(&view, next)? } else { next };
        // Once the target is reached every rank stops (a real run's evaluation says so to all).
        if it >= cfg.iterations || self.to_target.is_some() {
            let rk = &mut self.ranks[r];
            rk.phase = RankPhase::Done;
            rk.finished = t;
            return if self.combine { self.leave(r, t) } else { Ok(()) };
        }
        let planned = cfg.elastic.threads(r, it, cfg.inject.threads(r, cfg.threads));
        let active = self.policies[r].threads(planned).clamp(1, self.s.max_threads());
        let delay = cfg.inject.delay(r, it);
        let part = self.policies[r].chunks(&view, it, &self.plan)?;
        self.policies[r].open(&view, it)?;
        let reads = view.ops();
        let n = part.len() as u32;
        self.w.open(r, it, n);
        let mut drain = 0;
        if let Some(j) = self.w.drain(r) {
            drain = self.drained_arrival(r, r, j);
        }
        let rk = &mut self.ranks[r];
        rk.it = it;
        rk.next = it + 1;
        rk.active = active;
        rk.delay = delay;
        rk.own_start = part.start;
        rk.phase = RankPhase::Pull;
        rk.rec = IterRecord {
            rank: r,
            iter: it,
            start: t as f64 * 1e-9,
            threads: active,
            delay,
            ..Default::default()
        };
        // Announcing and filling the queue: two atomics on the rank's own words.
        let pull = if self.combine { self.combine_cost(r, it).pull } else { self.transfer_cost(r, it) };
        let cost = [self.charge(r, reads), self.s.net.atomic(r, r), self.s.net.atomic(r, r), drain, pull]
            .into_iter()
            .fold(0, Nanos::saturating_add);
        self.ranks[r].rec.comm += cost as f64 * 1e-9;
        if self.combine {
            self.arrive(r, Stage::Pull, t.saturating_add(cost))?;
        } else {
            self.q.push(t.saturating_add(cost), Ev::Compute(r));
        }
        if n > 0 && self.steal {
            self.wake_lined(it, t)?;
        }
        if n == 0 {
            // No chunks: done at once, and arrived for at the done tree by the rank itself.
            let after = self.done_arrival(r, r, it);
            if self.w.all_done(it) {
                self.wake_lined(it, t.saturating_add(after))?;
            }
        }
        Ok(())
    }

    /// The pull is done: the active threads start on the rank's chunks.
    fn compute(&mut self, r: usize, t: Nanos) -> R<()> {
        let rk = &mut self.ranks[r];
        rk.phase = RankPhase::Compute;
        rk.c1 = t;
        rk.iter_chunks = 0;
        rk.busy = 0;
        rk.busy_threads = 0;
        self.start_threads(r, t, false)
    }

    /// Starts every active thread of `r` on its next item (copies if `copies`); if none found
    /// anything, the round is over at once.
    fn start_threads(&mut self, r: usize, t: Nanos, copies: bool) -> R<()> {
        for th in 0..self.ranks[r].active {
            if self.dispatch(r, th, t, copies)? {
                self.ranks[r].busy_threads += 1;
            }
        }
        if self.ranks[r].busy_threads == 0 {
            self.round_over(r, t)?;
        }
        Ok(())
    }

    /// Finds thread `th` of `r` its next item and starts it; false if there is none.
    fn dispatch(&mut self, r: usize, th: usize, t: Nanos, copies: bool) -> R<bool> {
        if copies {
            return self.dispatch_copy(r, th, t);
        }
        let it = self.ranks[r].it;
        let tag = words::tag(it);
        let mut extra: Nanos = 0;
        loop {
            // Own chunks taken and not yet started, one at a time; when the take is done, the
            // policy's reassignments.
            if let Some((range, mode)) = self.ranks[r].threads[th].own.clone() {
                if range.start < range.end {
                    let c = range.start;
                    self.ranks[r].threads[th].own = Some((c + 1..range.end, mode));
                    if self.policies[r].settled(r, tag, c)? {
                        continue;
                    }
                    if mode == OwnChunks::ClaimFirst {
                        extra = extra.saturating_add(self.s.net.atomic(r, r));
                        if self.policies[r].claim(r, tag, c)? {
                            return self.start(
                                r,
                                th,
                                t.saturating_add(extra),
                                Item::Claimed(c),
                                &[(r, it, c)],
                            );
                        }
                        continue;
                    }
                    return self.start(r, th, t.saturating_add(extra), Item::OwnCopy(c), &[(r, it, c)]);
                }
                self.ranks[r].threads[th].own = None;
                let view = SimView::new(&self.w, r);
                let mut takes = Vec::new();
                self.policies[r].after_own_chunk(&view, it, &mut takes)?;
                extra = extra.saturating_add(self.charge(r, view.ops()));
                self.ranks[r].threads[th].takes.extend(takes);
                continue;
            }
            if let Some(take) = self.ranks[r].threads[th].takes.pop_front() {
                extra = extra.saturating_add(self.s.net.atomic(r, take.rank));
                if let Some(item) = self.take(r, take, true) {
                    extra = extra.saturating_add(self.drained_by(r, take.rank));
                    let chunks = Self::chunks_of(&item);
                    return self.start(r, th, t.saturating_add(extra), item, &chunks);
                }
                continue;
            }
            extra = extra.saturating_add(self.s.net.atomic(r, r));
            if let Some(range) = self.w.take_own(r, self.s.cfg.grain) {
                extra = extra.saturating_add(self.drained_by(r, r));
                let view = SimView::new(&self.w, r);
                let mode = self.policies[r].own_chunks(&view)?;
                extra = extra.saturating_add(self.charge(r, view.ops()));
                if mode == OwnChunks::Whole {
                    self.ranks[r].threads[th].own = Some((range.end..range.end, mode));
                    let chunks: Vec<_> = range.clone().map(|c| (r, it, c)).collect();
                    return self.start(r, th, t.saturating_add(extra), Item::Whole(range), &chunks);
                }
                self.ranks[r].threads[th].own = Some((range, mode));
                continue;
            }
            // Out of own chunks: take over from the victim the policy names (it names only ranks
            // with chunks queued, so none is asked for when nothing is queued anywhere).
            if self.steal && self.w.any_queued(it) {
                for _ in 0..self.w.world {
                    let view = SimView::new(&self.w, r);
                    let victim = self.policies[r].victim(&view, it)?;
                    extra = extra.saturating_add(self.charge(r, view.ops()));
                    let Some(take) = victim else { break };
                    extra = extra.saturating_add(self.s.net.atomic(r, take.rank));
                    if let Some(item) = self.take(r, take, false) {
                        extra = extra.saturating_add(self.drained_by(r, take.rank));
                        let chunks = Self::chunks_of(&item);
                        return self.start(r, th, t.saturating_add(extra), item, &chunks);
                    }
                }
            }
            return Ok(false);
        }
    }

    /// After `r` took chunks from `owner`'s queue: if that emptied it, `r`'s arrival for it at
    /// the tree of drained queues, and what its atomics cost.
    fn drained_by(&mut self, r: usize, owner: usize) -> Nanos {
        match self.w.drain(owner) {
            Some(j) => self.drained_arrival(r, owner, j),
            None => 0,
        }
    }

    /// `r` arrives for `owner` at slot `j` of the tree of drained queues: what it costs.
    fn drained_arrival(&mut self, r: usize, owner: usize, j: u64) -> Nanos {
        match self.w.drained.as_mut() {
            Some((tree, _)) => tree.arrive(&self.s.net, r, owner, j).0,
            None => 0,
        }
    }

    /// A copy for thread `th` of `r` while lining up, as long as the policy names one.
    fn dispatch_copy(&mut self, r: usize, th: usize, t: Nanos) -> R<bool> {
        let it = self.ranks[r].it;
        let tag = words::tag(it);
        let mut extra: Nanos = 0;
        loop {
            let view = SimView::new(&self.w, r);
            let pick = self.policies[r].copy(&view, it)?;
            extra = extra.saturating_add(self.charge(r, view.ops()));
            let Some((owner, chunk)) = pick else { return Ok(false) };
            if self.policies[r].settled(owner, tag, chunk)? {
                continue;
            }
            return self.start(
                r,
                th,
                t.saturating_add(extra),
                Item::Copy { owner, chunk },
                &[(owner, it, chunk)],
            );
        }
    }

    /// Takes the chunks `take` names from its victim's queue for one thread of `r` (in its current
    /// iteration).
    fn take(&mut self, r: usize, take: Take, reassigned: bool) -> Option<Item> {
        let it = self.ranks[r].it;
        let fraction = thread_share(take.share, self.s.cfg.steal_fraction, self.ranks[r].active);
        let (g, chunks) = self.w.steal(take.rank, fraction)?;
        Some(Item::Help { victim: take.rank, vit: words::untag(g, it), chunks, reassigned })
    }

    /// The chunks `(owner, owner's iteration, chunk)` of a take-over.
    fn chunks_of(item: &Item) -> Vec<(usize, u64, u32)> {
        match item {
            Item::Help { victim, vit, chunks, .. } => chunks.clone().map(|c| (*victim, *vit, c)).collect(),
            _ => Vec::new(),
        }
    }

    /// Starts `item` on thread `th` of `r` at `t`: its chunks' compute, then the injected delay.
    fn start(&mut self, r: usize, th: usize, t: Nanos, item: Item, chunks: &[(usize, u64, u32)]) -> R<bool> {
        let rk = &self.ranks[r];
        let slowdown = match &self.s.compute {
            ComputeModel::Replay(_) => 1.0,
            _ => self.s.cfg.inject.slowdown(r, t as f64 * 1e-9, self.s.max_threads()),
        };
        let mut compute = 0.0;
        for &(owner, cit, c) in chunks {
            let g = self.global_chunk(owner, cit, c);
            compute += self.s.compute.chunk(r, rk.it, cit, g);
        }
        let compute = nanos(compute * slowdown);
        let delay = nanos(compute as f64 * 1e-9 * rk.delay);
        if let Item::OwnCopy(c) | Item::Copy { chunk: c, .. } = item {
            let owner = if let Item::Copy { owner, .. } = item { owner } else { r };
            self.copying.entry((owner, c)).or_default().push((r, th));
        }
        let thread = &mut self.ranks[r].threads[th];
        thread.gen += 1;
        thread.item = Some(item);
        thread.started = t;
        thread.compute_end = t.saturating_add(compute);
        thread.end = thread.compute_end.saturating_add(delay);
        self.q.push(thread.end, Ev::Thread(r, th, thread.gen));
        Ok(true)
    }

    /// The batch chunk number of `owner`'s chunk `c` of iteration `it`.
    fn global_chunk(&self, owner: usize, it: u64, c: u32) -> usize {
        if owner < self.ranks.len() && self.ranks[owner].it == it {
            self.ranks[owner].own_start + c as usize
        } else {
            self.plan.part(it, owner).start + c as usize
        }
    }

    /// Thread `th` of `r` finished its item at `t`.
    fn thread_done(&mut self, r: usize, th: usize, t: Nanos) -> R<()> {
        let Some(item) = self.ranks[r].threads[th].item.take() else { return Ok(()) };
        let it = self.ranks[r].it;
        let started = self.ranks[r].threads[th].started;
        let mut completed = Vec::new();
        let n = match &item {
            Item::Whole(range) => {
                let n = range.end - range.start;
                self.count_rows(r, r, it, range.clone());
                self.ranks[r].rec.own += u64::from(n);
                completed.extend(self.done(r, r, n));
                n
            }
            &Item::Claimed(c) => {
                self.count_rows(r, r, it, c..c + 1);
                self.ranks[r].rec.own += 1;
                completed.extend(self.done(r, r, 1));
                1
            }
            &Item::OwnCopy(c) => {
                completed.extend(self.copy_done(r, th, r, c, t)?);
                1
            }
            Item::Help { victim, vit, chunks, reassigned } => {
                let n = chunks.end - chunks.start;
                self.count_rows(r, *victim, *vit, chunks.clone());
                self.ranks[r].rec.taken += u64::from(n);
                if *reassigned {
                    self.ranks[r].rec.reassigned += u64::from(n);
                }
                completed.extend(self.done(r, *victim, n));
                n
            }
            &Item::Copy { owner, chunk } => {
                completed.extend(self.copy_done(r, th, owner, chunk, t)?);
                1
            }
        };
        let rk = &mut self.ranks[r];
        rk.iter_chunks += u64::from(n);
        rk.busy = rk.busy.saturating_add(t - started);
        if self.rates {
            let since = (t - rk.c1).max(1) as f64 * 1e-9;
            self.w.rates[r] = rk.iter_chunks as f64 / since;
        }
        for (done, after) in completed {
            self.wake_lined(done, t.saturating_add(after))?;
        }
        let copies = matches!(self.ranks[r].phase, RankPhase::LineHelp { copies: true });
        if !self.dispatch(r, th, t, copies)? {
            self.ranks[r].busy_threads -= 1;
            if self.ranks[r].busy_threads == 0 {
                self.round_over(r, t)?;
            }
        }
        Ok(())
    }

    /// A copy of `owner`'s chunk `chunk` (`owner == r`: the rank's own, computed as a copy) ended
    /// on thread `th` of `r` at `t`: applied if it claims the chunk first (then the other copies'
    /// delays stop), dropped if not. Returns the iteration the chunk completed, if it did (with
    /// the time until that is seen: [`Sim::done`]).
    fn copy_done(
        &mut self,
        r: usize,
        th: usize,
        owner: usize,
        chunk: u32,
        t: Nanos,
    ) -> R<Option<(u64, Nanos)>> {
        let it = self.ranks[r].it;
        self.unmark(owner, chunk, r, th);
        if !self.policies[r].claim(owner, words::tag(it), chunk)? {
            self.ranks[r].rec.discarded += 1;
            return Ok(None);
        }
        self.count_rows(r, owner, it, chunk..chunk + 1);
        if owner == r {
            self.ranks[r].rec.own += 1;
        } else {
            self.ranks[r].rec.cloned += 1;
        }
        let completed = self.done(r, owner, 1);
        self.settle(owner, chunk, t);
        Ok(completed)
    }

    /// `r` counts `n` more of `owner`'s chunks done. If every rank's chunks of the iteration are
    /// now done, returns it and when that is seen: with a done tree, once `r` has passed the
    /// owner's arrival up to the root (the other arrivals' atomics are not charged: they come
    /// off the critical path).
    fn done(&mut self, r: usize, owner: usize, n: u32) -> Option<(u64, Nanos)> {
        let (it, all) = self.w.done(owner, n)?;
        let after = self.done_arrival(r, owner, it);
        all.then_some((it, after))
    }

    /// `r` arrives for `owner` at slot `it` of the done tree, if there is one: what it costs.
    fn done_arrival(&mut self, r: usize, owner: usize, it: u64) -> Nanos {
        match self.w.trees.as_mut() {
            Some((_, Some(tree))) => tree.arrive(&self.s.net, r, owner, it).0,
            _ => 0,
        }
    }

    /// Rows of `owner`'s chunks `chunks` of `it`, computed by `r`.
    fn count_rows(&mut self, r: usize, owner: usize, it: u64, chunks: Range<u32>) {
        let batch = self.batch_rows(it);
        let chunk = self.plan.chunk();
        let rows: usize = chunks
            .map(|c| {
                let start = (batch.start + self.global_chunk(owner, it, c) * chunk).min(batch.end);
                (start + chunk).min(batch.end) - start
            })
            .sum();
        self.ranks[r].rec.rows += rows as u64;
    }

    /// [`Plan::batch_rows`], remembered for the last few iterations (it draws a permutation, and
    /// every chunk computed asks for it).
    fn batch_rows(&self, it: u64) -> Range<usize> {
        let cell = &self.batches[it as usize % self.batches.len()];
        let (at, start, end) = cell.get();
        if at == it {
            return start..end;
        }
        let b = self.plan.batch_rows(it);
        cell.set((it, b.start, b.end));
        b
    }

    fn unmark(&mut self, owner: usize, chunk: u32, r: usize, th: usize) {
        if let Some(v) = self.copying.get_mut(&(owner, chunk)) {
            v.retain(|&x| x != (r, th));
            if v.is_empty() {
                self.copying.remove(&(owner, chunk));
            }
        }
    }

    /// `owner`'s chunk `chunk` was claimed at `t`: the other copies' injected delays stop there
    /// (their compute cannot be cut short).
    fn settle(&mut self, owner: usize, chunk: u32, t: Nanos) {
        let Some(others) = self.copying.get(&(owner, chunk)).cloned() else { return };
        for (r, th) in others {
            let thread = &mut self.ranks[r].threads[th];
            let at = thread.compute_end.max(t);
            if at < thread.end {
                thread.end = at;
                thread.gen += 1;
                self.q.push(at, Ev::Thread(r, th, thread.gen));
            }
        }
    }

    /// Every busy thread of `r` is idle: the compute phase, or a round of lining up, is over.
    fn round_over(&mut self, r: usize, t: Nanos) -> R<()> {
        let rk = &mut self.ranks[r];
        match rk.phase {
            RankPhase::Compute => {
                rk.own_done = t - rk.c1;
                rk.per_chunk = rk.own_done.saturating_mul(rk.active as u64) / rk.iter_chunks.max(1);
                if self.policies[r].line_up() {
                    rk.lined_at = t;
                    rk.helped = 0;
                    rk.line_wait = 0;
                    rk.phase = RankPhase::LineWait;
                    self.line_up(r, t)
                } else {
                    self.push(r, t)
                }
            }
            RankPhase::LineHelp { .. } => {
                rk.helped = rk.helped.saturating_add(t - rk.help_start);
                rk.phase = RankPhase::LineWait;
                self.line_up(r, t)
            }
            _ => Ok(()),
        }
    }

    /// Lining up: pushes once the iteration is done everywhere; meanwhile takes over queued
    /// chunks or copies running ones, or waits.
    fn line_up(&mut self, r: usize, t: Nanos) -> R<()> {
        let it = self.ranks[r].it;
        if self.w.all_done(it) || self.to_target.is_some() {
            // The poll that saw it: the done tree's root, or every rank's progress word in one
            // batch.
            let tree = matches!(self.w.trees, Some((_, Some(_))));
            let t = t.saturating_add(self.charge(r, Ops::batch(if tree { 1 } else { self.s.ranks })));
            let rk = &mut self.ranks[r];
            rk.line_wait = (t - rk.lined_at).saturating_sub(rk.helped);
            rk.rec.wait += rk.line_wait as f64 * 1e-9;
            return self.push(r, t);
        }
        if self.steal && self.w.stealable_near(r, it) {
            // The look that found them (the engine's `stealable`).
            let t = t.saturating_add(self.charge(r, self.w.look_ops()));
            let rk = &mut self.ranks[r];
            rk.phase = RankPhase::LineHelp { copies: false };
            rk.help_start = t;
            return self.start_threads(r, t, false);
        }
        if self.copies {
            let rk = &self.ranks[r];
            let due_at =
                [rk.own_done, rk.helped, rk.per_chunk].into_iter().fold(rk.c1, Nanos::saturating_add);
            let view = SimView::new(&self.w, r);
            if self.policies[r].copy_due(&view, it, t >= due_at)? {
                let rk = &mut self.ranks[r];
                rk.phase = RankPhase::LineHelp { copies: true };
                rk.help_start = t;
                return self.start_threads(r, t, true);
            }
            // Polled again: copies become due with time and with the others' rates.
            let poll = (rk.per_chunk / 2).max(5_000);
            self.q.push(due_at.max(t.saturating_add(poll)), Ev::Check(r));
        }
        self.ranks[r].phase = RankPhase::LineWait;
        self.lined.entry(it).or_default().push(r);
        Ok(())
    }

    /// Ranks lining up for `it` look again (its chunks are all done, or some were queued).
    fn wake_lined(&mut self, it: u64, t: Nanos) -> R<()> {
        let Some(ranks) = self.lined.remove(&it) else { return Ok(()) };
        for r in ranks {
            if self.ranks[r].phase == RankPhase::LineWait && self.ranks[r].it == it {
                self.line_up(r, t)?;
            }
        }
        Ok(())
    }

    /// Hook `admit`, then the push (if applied) and its flush. Under the node combine: the copy
    /// of the update into the rank's slot (if it has one), the node barrier, then the sum of its
    /// stripe and its writes to the other nodes ([`Sim::release`]).
    fn push(&mut self, r: usize, t: Nanos) -> R<()> {
        let it = self.ranks[r].it;
        let rk = &mut self.ranks[r];
        rk.phase = RankPhase::Push;
        let computing = t - rk.c1;
        rk.rec.compute += ((computing - rk.line_wait.min(computing)) as f64 * 1e-9).max(0.0);
        let view = SimView::new(&self.w, r);
        let admit =
            self.policies[r].admit(&view, it, Duration::from_nanos(computing), &mut self.ranks[r].rec)?;
        let mut cost = self.charge(r, view.ops());
        let pushes = admit.apply && self.ranks[r].rec.rows > 0;
        if pushes {
            let push =
                if self.combine { self.combine_cost(r, it).push_copy } else { self.transfer_cost(r, it) };
            cost = cost.saturating_add(push);
        }
        self.ranks[r].applied = admit.apply;
        self.ranks[r].rec.comm += cost as f64 * 1e-9;
        if self.combine {
            return self.arrive(r, Stage::Push, t.saturating_add(cost));
        }
        self.q.push(t.saturating_add(cost), Ev::Pushed(r));
        Ok(())
    }

    /// Pushed and flushed: hook `before_tick`, then the tick: an atomic on the rank's clock
    /// word and, with a clock tree, its arrival there (the clock word's mark cleared after).
    fn pushed(&mut self, r: usize, t: Nanos) -> R<()> {
        let it = self.ranks[r].it;
        let view = SimView::new(&self.w, r);
        let busy = Duration::from_nanos(self.ranks[r].busy);
        self.policies[r].before_tick(&view, it, busy, &mut self.ranks[r].rec)?;
        let mut cost = self.charge(r, view.ops()).saturating_add(self.s.net.atomic(r, r));
        if let Some((clock, _)) = self.w.trees.as_mut() {
            let j = self.w.clocks[r];
            cost = [clock.arrive(&self.s.net, r, r, j).0, self.s.net.atomic(r, r)]
                .into_iter()
                .fold(cost, Nanos::saturating_add);
        }
        self.ranks[r].rec.comm += cost as f64 * 1e-9;
        self.q.push(t.saturating_add(cost), Ev::Ticked(r));
        Ok(())
    }

    /// The tick has landed: hook `after_tick`, then `ready`.
    fn ticked(&mut self, r: usize, t: Nanos) -> R<()> {
        let it = self.ranks[r].it;
        self.w.tick(r);
        let applied = self.ranks[r].applied;
        self.policies[r].after_tick(it, applied)?;
        let view = SimView::new(&self.w, r);
        let ready = self.policies[r].ready(&view, it)?;
        let cost = self.charge(r, view.ops());
        // Once the target is reached nobody waits for anyone any more.
        if ready || self.to_target.is_some() {
            self.close(r, t.saturating_add(cost));
        } else {
            let rk = &mut self.ranks[r];
            rk.phase = RankPhase::Wait;
            rk.wait_since = t.saturating_add(cost);
            self.waiting.entry(it).or_default().push(r);
        }
        self.check_waiters(t)
    }

    /// Ranks waiting for `ready`, by iteration, lowest first: every policy's `ready` is monotone
    /// in the iteration (if a rank may start after `it`, so may one after an earlier one), so the
    /// first group still not ready ends the look. Each rank's own policy decides for it; each
    /// resumes after one more poll (its reads).
    fn check_waiters(&mut self, t: Nanos) -> R<()> {
        while let Some((&it, group)) = self.waiting.first_key_value() {
            // The first rank of the group answers for the others: if it may not go on, nor may
            // they, and the group stays whole.
            let rep = group[0];
            if !self.resume(rep, it, t)? {
                break;
            }
            let group = self.waiting.remove(&it).unwrap_or_default();
            let mut keep = Vec::new();
            for r in group.into_iter().skip(1) {
                if !self.resume(r, it, t)? {
                    keep.push(r);
                }
            }
            if !keep.is_empty() {
                self.waiting.insert(it, keep);
                break;
            }
        }
        Ok(())
    }

    /// Asks waiting rank `r`'s policy whether it may go on after `it`; if so, closes its
    /// iteration one poll (its reads) after `t`.
    fn resume(&mut self, r: usize, it: u64, t: Nanos) -> R<bool> {
        let view = SimView::new(&self.w, r);
        if !self.policies[r].ready(&view, it)? {
            return Ok(false);
        }
        let at = t.max(self.ranks[r].wait_since).saturating_add(self.charge(r, view.ops()));
        let rk = &mut self.ranks[r];
        rk.rec.wait += (at - rk.wait_since) as f64 * 1e-9;
        self.close(r, at);
        Ok(true)
    }

    /// The iteration is over at `at`: hook `end`, the record, and the next iteration after the
    /// rank's fixed costs.
    fn close(&mut self, r: usize, at: Nanos) {
        let it = self.ranks[r].it;
        let rec = std::mem::take(&mut self.ranks[r].rec);
        self.policies[r].end(&rec);
        rec.add_to(&mut self.ranks[r].totals);
        if let Some(f) = self.records.as_mut() {
            f(&rec);
        }
        self.most_iterations = self.most_iterations.max(it + 1);
        if r == 0 && self.to_target.is_none() && self.s.target_iterations == Some(it + 1) {
            self.to_target = Some(at);
            // Ranks lining up look again (and push), ranks waiting for others stop waiting.
            for (_, lined) in std::mem::take(&mut self.lined) {
                for w in lined {
                    self.q.push(at, Ev::Check(w));
                }
            }
            for (_, group) in std::mem::take(&mut self.waiting) {
                // `r` itself, if it was waiting, is being closed here.
                for w in group.into_iter().filter(|&w| w != r) {
                    let rk = &mut self.ranks[w];
                    rk.rec.wait += at.saturating_sub(rk.wait_since) as f64 * 1e-9;
                    self.close(w, at.max(self.ranks[w].wait_since));
                }
            }
        }
        self.ranks[r].phase = RankPhase::Start;
        let overhead = self.overhead(r, it);
        self.q.push(at.saturating_add(overhead), Ev::Open(r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::Pattern;
    use crate::sim::tests::config;
    use crate::sim::Hierarchy;

    /// The ranks whose `Compute` event comes past their node's barrier as `sim`'s queue runs out,
    /// every `Open` but `skip`'s handled, every other event dropped.
    fn computing(sim: &mut Sim<'_>, skip: usize) -> R<Vec<usize>> {
        let mut ranks = Vec::new();
        while let Some((t, ev)) = sim.q.pop() {
            match ev {
                Ev::Open(r) if r != skip => sim.open(r, t)?,
                Ev::Compute(r) if sim.through(r, Stage::Pull, t) => ranks.push(r),
                _ => {}
            }
        }
        Ok(ranks)
    }

    /// A rank that is done (it stopped before an iteration its node-mates have begun) no longer
    /// holds its node's barrier: the others go on without it.
    #[test]
    fn a_rank_that_is_done_releases_its_node_barriers() -> R<()> {
        let mut s = config("bsp", 8, 2, Pattern::Ideal);
        s.net.ranks_per_node = 4;
        s.hierarchy = Hierarchy::Auto;
        let plan = crate::engine::check(&s.cfg, s.ranks, s.rows)?;
        let (world, policies) = super::super::build(&s, &plan)?;
        let mut sim = Sim::new(&s, plan, world, policies, None);
        assert!(sim.combine);
        // Every rank but 0 opens iteration 0: node 1's ranks pull and compute, node 0's wait
        // for rank 0 at their pull barrier.
        assert_eq!(computing(&mut sim, 0)?, [4, 5, 6, 7]);
        // Rank 0 stops there (as every rank does at the target): ranks 1-3 go on.
        sim.ranks[0].next = s.cfg.iterations;
        sim.open(0, 0)?;
        assert_eq!(sim.ranks[0].phase, RankPhase::Done);
        assert_eq!(computing(&mut sim, 0)?, [1, 2, 3]);
        sim.free()
    }
}
