//! The simulated world: every rank's words, threads and phases, stepped event by event in virtual
//! time, asking each rank's [`Policy`] at the same hooks as the engine does
//! (`crate::engine::run` and `crate::engine::compute` are the mechanism this mirrors, phase for
//! phase).
//!
//! This file holds the world's state and its driver (the event loop); the rest lives beside it:
//! - `shared`: every rank's one-sided words and the sums kept beside them;
//! - `trees`: the combining trees' arrival accounting;
//! - `view`: the world as a rank's policy sees it;
//! - `barriers`: the node barriers under the node combine;
//! - `compute`: an iteration's opening, pull and compute (threads taking chunks);
//! - `finish`: lining up, the push, the tick, the wait and the close.

mod barriers;
mod compute;
mod finish;
mod shared;
mod trees;
mod view;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;

use super::cost::{nanos, CombineCosts, ComputeModel};
use super::events::{EventQueue, Grouped, Nanos};
use super::{SimConfig, SimError};
use peregrine_transport::{Ops, Transport};

use crate::engine::{IterRecord, RankTotals};
use crate::plan::Plan;
use crate::scheme::{OwnChunks, Policy, Take};

use barriers::{Barrier, Gate, Stage};
use shared::Words;

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
    /// The end game: the rank's next own chunks left to free threads elsewhere, until the end.
    Leave,
}

/// One compute thread of a rank.
#[derive(Clone, Debug, Default)]
struct Thread {
    item: Option<Item>,
    /// Bumped when the thread's end event is replaced (a copy's delay cut short).
    gen: u32,
    started: Nanos,
    /// When the item's compute (before its injected delay) ends, and when it ends.
    compute_end: Nanos,
    end: Nanos,
    /// The own chunks taken and not yet started (`ClaimFirst`, `AsCopies`), or the last take.
    own: Option<(Range<u32>, OwnChunks)>,
    /// Reassignments to take before the rank's own next chunks.
    takes: VecDeque<Take>,
    /// Whether the thread may still leave own chunks to free threads elsewhere in the iteration
    /// (the end game: once).
    leave: bool,
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
    /// The end game's survey of other ranks and its pause.
    end_game: crate::scheme::endgame::State,
    /// Whether a thread left own chunks to free threads in this iteration: the rank, slower than
    /// they are, then takes over no other rank's chunks (computing or lining up).
    left: bool,
    applied: bool,
    rec: IterRecord,
    totals: RankTotals,
    finished: Nanos,
    /// Under the node combine: the rank and its node's barrier.
    gate: Gate,
    /// Whether a poll of the line-up (`Ev::Check`) is pending.
    polling: bool,
    /// Operations on the policy's own windows issued before a look the simulator made on the
    /// rank's behalf and not charged yet ([`Sim::unlooked`]): charged with the rank's next step.
    owed: Cell<Ops>,
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Open(usize),
    Compute(usize),
    Thread(usize, usize, u32),
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

/// An [`Ev`] as the queue holds it: 12 bytes instead of 32 (ranks and threads fit in 32 and 16
/// bits: `simulate` takes at most 1,000,000 ranks of 1,024 threads), so that a rank's heap of
/// events, ~16 of them with their times, spans 8 cache lines instead of 12.
#[derive(Clone, Copy, Debug)]
struct Packed {
    rank: u32,
    gen: u32,
    thread: u16,
    kind: u8,
}

impl From<Ev> for Packed {
    fn from(ev: Ev) -> Self {
        let (kind, thread, gen) = match ev {
            Ev::Open(_) => (0, 0, 0),
            Ev::Compute(_) => (1, 0, 0),
            Ev::Thread(_, th, gen) => (2, th, gen),
            Ev::Pushed(_) => (3, 0, 0),
            Ev::Ticked(_) => (4, 0, 0),
            Ev::Check(_) => (5, 0, 0),
        };
        debug_assert!(ev.rank() <= u32::MAX as usize && thread <= usize::from(u16::MAX));
        Self { rank: ev.rank() as u32, gen, thread: thread as u16, kind }
    }
}

impl From<Packed> for Ev {
    fn from(p: Packed) -> Self {
        let r = p.rank as usize;
        match p.kind {
            0 => Self::Open(r),
            1 => Self::Compute(r),
            2 => Self::Thread(r, usize::from(p.thread), p.gen),
            3 => Self::Pushed(r),
            4 => Self::Ticked(r),
            _ => Self::Check(r),
        }
    }
}

/// A rank's events share a heap of the queue (a few at a time: one per busy thread).
impl Grouped for Packed {
    fn group(&self) -> usize {
        self.rank as usize
    }
}

/// A thread computing a copy: `(rank, thread, the thread's generation with the copy)`.
type Copier = (usize, usize, u32);

/// A simulation in progress.
pub(super) struct Sim<'a> {
    s: &'a SimConfig,
    plan: Plan,
    q: EventQueue<Packed>,
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
    /// Copies of other ranks' chunks started, by chunk `(owner, chunk)`, until the chunk is
    /// claimed (an owner's own copy of its chunk is found among its threads).
    copying: HashMap<(usize, u32), Vec<Copier>>,
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
                end_game: Default::default(),
                left: false,
                applied: true,
                rec: IterRecord::default(),
                totals: RankTotals::default(),
                finished: 0,
                gate: Gate::Through,
                polling: false,
                owed: Cell::new(Ops::default()),
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
            let ev = Ev::from(ev);
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
                    self.ranks[r].polling = false;
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
        ops += self.ranks[r].owed.take();
        nanos(ops.trips as f64 * self.read_cost + ops.pipelined as f64 * self.gap_cost)
    }

    /// Before a look the simulator makes on `r`'s behalf (a waiting rank's `ready`, a lining-up
    /// rank's `copy_due`): sets aside what the rank's policy issued so far, still to be charged.
    fn look(&self, r: usize) {
        let mut owed = self.ranks[r].owed.get();
        owed += self.world[r].take_ops();
        self.ranks[r].owed.set(owed);
    }

    /// After such a look found nothing: drops what it read. A real rank polls while it waits or
    /// lines up, idle; only the poll that finds the condition true delays what it does next (one
    /// poll, charged where the rank goes on), not each of the looks the simulator makes to learn
    /// when that is (at 4,096 ranks, one per other rank's event).
    fn unlooked(&self, r: usize) {
        let _ = self.world[r].take_ops();
    }

    fn transfer_cost(&self, r: usize, it: u64) -> Nanos {
        match &self.s.compute {
            ComputeModel::Replay(m) => nanos(m.get(r, it).comm / 2.0),
            _ => self.s.net.transfer(r, self.s.ranks, self.s.params),
        }
    }

    /// `r`'s costs under the node combine in `it`. Replayed: the measured communication, half
    /// the pull and half the push after the barrier, and the barriers' own atomics in it.
    fn combine_cost(&self, r: usize, it: u64) -> CombineCosts {
        match &self.s.compute {
            ComputeModel::Replay(m) => {
                let half = nanos(m.get(r, it).comm / 2.0);
                CombineCosts { pull: half, push_copy: 0, push_sum: half, barrier: 0 }
            }
            _ => self.s.net.combine(r, self.s.ranks, self.s.params),
        }
    }

    fn overhead(&self, r: usize, it: u64) -> Nanos {
        match &self.s.compute {
            ComputeModel::Replay(m) => nanos(m.get(r, it).overhead),
            _ => nanos(self.s.overhead),
        }
    }
}
