//! Decentralized SGD with backup workers (DBW: Xiong, Yan, Singh, Li, "Straggler-resilient
//! distributed machine learning with dynamic backup workers", 2021). No parameter shards: every
//! rank keeps its own replica of the model; each iteration it steps its replica with its own
//! gradient (`y_i = x_i - lr g_i`), publishes `y_i`, waits only for its fastest `k_i` neighbours in
//! a communication graph (the rest are its *backup workers*, `b_i = d_i - k_i`), and averages:
//! `x_i = W_ii y_i + sum_j W_ij y_j` over the neighbours it exchanged with. The weights are
//! Metropolis-Hastings', `W_ij = 1 / (1 + max(d_i, d_j))`, with the weight of a neighbour not
//! exchanged with kept by each of the two (so each iteration's matrix is symmetric and doubly
//! stochastic: the replicas' average moves exactly by the average of the updates).
//!
//! The engine keeps the replicas ([`SchemeKind::replicated`]); this policy owns the exchange:
//! - **estimates** (a window, `5 P` values per rank for `P` parameters): three slots for the
//!   published `y` (by iteration mod 3) and two for the current `x` behind a version word (a
//!   sequence lock: read, check that the version did not move);
//! - **edges** (a window, one word per edge, on its lower rank): the edge's latest iteration and
//!   who arrived at it. The first endpoint to arrive sets its bit; the second finds it and makes
//!   the edge *active* (both exchange); an endpoint that closes its wait with the other not yet
//!   arrived *cuts* the edge (neither exchanges). Every step is a compare-and-swap against the
//!   word read, so both endpoints always agree. After averaging, each endpoint of an active edge
//!   sets its acknowledgement bit; an edge is reused for a later iteration, and a `y` slot
//!   rewritten, only once both have read (so a `y` is never overwritten under its reader);
//! - **words** (a window, 2 per rank): the version of the rank's current `x`, and its last
//!   compute time (microseconds), the input of the dynamic choice.
//!
//! A rank waits until `k_i` of its edges are active, or until every edge is settled (active or
//! cut: a neighbour that closed without it, or one already in a later iteration), and in either
//! case until it has arrived on every edge (an edge whose previous exchange the neighbour has not
//! acknowledged yet holds it: arriving is its only way to tell that neighbour that this
//! iteration's exchange is off; leaving without it once left a neighbour in the last iteration
//! waiting for ever). A rank that
//! exchanged with nobody while neighbours were ahead is a late rank: it averages its `y` with its
//! neighbours' current `x` (read under the sequence lock: a pull, not an exchange, so the
//! average is not kept that iteration) and moves on to the iteration they are in, as a late rank
//! under backup workers does.
//!
//! The dynamic choice (`dbw:<graph>`): each rank, each iteration, from its own and its
//! neighbours' last compute times, waits for the `k` that maximizes replicas averaged per second,
//! `(k + 1) / max(own, d_(k))` (`d_(k)` the k-th shortest neighbour time): more neighbours average
//! more, waiting for slower ones costs time. The static variant (`dbw:<graph>:<b>`) waits for
//! `d_i - b` neighbours always.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peregrine_transport::{ShardMap, Window};

use super::{arg, Admit, Family, Parsed, Policy, Result, SchemeError, SchemeKind, Setup, View};
use crate::record::{Figure, IterRecord};

pub(crate) const FAMILY: Family =
    Family { forms: "dbw[:ring|:torus|:complete|:regular-<k>][:<b>]", names: &["dbw"], compared: &[], parse };

fn parse(s: &str) -> Option<Parsed> {
    let rest = if s == "dbw" { None } else { Some(arg(s, "dbw")?) };
    Some(parse_args(s, rest).map(|d| Arc::new(d) as Arc<dyn SchemeKind>))
}

fn parse_args(s: &str, rest: Option<&str>) -> std::result::Result<Dbw, SchemeError> {
    let parts: Vec<&str> = rest.map_or_else(Vec::new, |r| r.split(':').collect());
    let bad_graph = || {
        SchemeError::argument(
            s,
            "the graph",
            "ring, torus, complete or regular-<k> (a random graph, k neighbours each)",
            "dbw:torus",
        )
    };
    let bad_b = || {
        SchemeError::argument(
            s,
            "the number of backup workers",
            "a whole number below each rank's number of neighbours",
            "dbw:ring:1",
        )
    };
    let (graph, b) = match parts.as_slice() {
        [] => (None, None),
        [one] if one.chars().all(|c| c.is_ascii_digit()) && !one.is_empty() => (None, Some(*one)),
        [g] => (Some(*g), None),
        [g, b] => (Some(*g), Some(*b)),
        _ => return Err(bad_graph()),
    };
    let graph = match graph {
        None | Some("ring") => Graph::Ring,
        Some("") => return Err(bad_graph()),
        Some("torus") => Graph::Torus,
        Some("complete") => Graph::Complete,
        Some(g) => match g.strip_prefix("regular-").and_then(|k| k.parse().ok()) {
            Some(k) if k >= 1 => Graph::Regular(k),
            _ => return Err(bad_graph()),
        },
    };
    let fixed = match b {
        None => None,
        Some(b) => Some(b.parse().map_err(|_| bad_b())?),
    };
    Ok(Dbw { graph, fixed })
}

/// The communication graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Graph {
    /// Each rank and the ranks before and after it (two neighbours).
    Ring,
    /// A 2-D torus of `r x c` ranks, `r` the largest divisor of the world with `r <= c` (four
    /// neighbours; a side of 2 gives three, of 1 is refused).
    Torus,
    /// Every rank a neighbour of every other.
    Complete,
    /// A random connected graph with `k` neighbours each (drawn with a fixed seed: the same
    /// graph for the same world and `k`).
    Regular(usize),
}

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ring => f.write_str("ring"),
            Self::Torus => f.write_str("torus"),
            Self::Complete => f.write_str("complete"),
            Self::Regular(k) => write!(f, "regular-{k}"),
        }
    }
}

/// Tries of the random regular graph before it is given up.
const REGULAR_TRIES: u64 = 200;

impl Graph {
    /// Every rank's neighbours, sorted, for a world of `n` ranks; or what the graph needs.
    pub(crate) fn build(self, n: usize) -> std::result::Result<Vec<Vec<usize>>, String> {
        let sorted = |sets: Vec<BTreeSet<usize>>| sets.into_iter().map(|s| s.into_iter().collect()).collect();
        let mut sets = vec![BTreeSet::new(); n];
        let link = |sets: &mut Vec<BTreeSet<usize>>, a: usize, b: usize| {
            if a != b {
                sets[a].insert(b);
                sets[b].insert(a);
            }
        };
        match self {
            Self::Ring => (0..n).for_each(|i| link(&mut sets, i, (i + 1) % n)),
            Self::Complete => (0..n).for_each(|i| (i + 1..n).for_each(|j| link(&mut sets, i, j))),
            Self::Torus => {
                let r = (1..=n).filter(|r| n.is_multiple_of(*r) && r * r <= n).max().unwrap_or(1);
                if r < 2 {
                    return Err(format!(
                        "a torus is r x c ranks with r and c at least 2 (4, 6, 8, 9, 10, 12, ...); {n} is not"
                    ));
                }
                let c = n / r;
                for i in 0..n {
                    let (a, b) = (i / c, i % c);
                    link(&mut sets, i, a * c + (b + 1) % c);
                    link(&mut sets, i, ((a + 1) % r) * c + b);
                }
            }
            Self::Regular(k) => {
                if k >= n || (n * k) % 2 == 1 {
                    return Err(format!(
                        "a {k}-regular graph needs more than {k} ranks and an even number of ends (ranks x k); {n} ranks do not"
                    ));
                }
                return (0..REGULAR_TRIES).find_map(|t| regular(n, k, t)).map(sorted).ok_or_else(|| {
                    format!(
                        "no connected {k}-regular graph on {n} ranks was drawn in {REGULAR_TRIES} tries: use a smaller k, or complete"
                    )
                });
            }
        }
        Ok(sorted(sets))
    }
}

/// One try at a random connected `k`-regular graph on `n` nodes (pairing ends at random, never
/// a node with itself or a pair twice; a try that gets stuck or is not connected fails).
fn regular(n: usize, k: usize, attempt: u64) -> Option<Vec<BTreeSet<usize>>> {
    let mut state = crate::plan::mix(0x5EED_0000 ^ (n as u64) << 20 ^ (k as u64) << 8 ^ attempt);
    let mut next = |m: usize| {
        state = crate::plan::mix(state);
        (state % m as u64) as usize
    };
    let mut ends: Vec<usize> = (0..n).flat_map(|v| std::iter::repeat_n(v, k)).collect();
    let mut sets = vec![BTreeSet::new(); n];
    while !ends.is_empty() {
        let pair = (0..100)
            .map(|_| (next(ends.len()), next(ends.len())))
            .find(|&(i, j)| i != j && ends[i] != ends[j] && !sets[ends[i]].contains(&ends[j]))?;
        let (a, b) = (ends[pair.0], ends[pair.1]);
        sets[a].insert(b);
        sets[b].insert(a);
        let (hi, lo) = (pair.0.max(pair.1), pair.0.min(pair.1));
        ends.swap_remove(hi);
        ends.swap_remove(lo);
    }
    let mut seen = vec![false; n];
    let mut stack = vec![0];
    seen[0] = true;
    while let Some(v) = stack.pop() {
        for &w in &sets[v] {
            if !std::mem::replace(&mut seen[w], true) {
                stack.push(w);
            }
        }
    }
    seen.iter().all(|&s| s).then_some(sets)
}

/// Metropolis-Hastings weight of the edge between ranks of `di` and `dj` neighbours.
pub(crate) fn mh_weight(di: usize, dj: usize) -> f32 {
    1.0 / (1 + di.max(dj)) as f32
}

/// DBW on a graph, with `Some(b)` backup workers per rank always or `None` chosen per iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dbw {
    graph: Graph,
    fixed: Option<usize>,
}

impl fmt::Display for Dbw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dbw:{}", self.graph)?;
        if let Some(b) = self.fixed {
            write!(f, ":{b}")?;
        }
        Ok(())
    }
}

impl SchemeKind for Dbw {
    fn validate(&self, ranks: usize) -> std::result::Result<(), SchemeError> {
        let world = |accepted: String| SchemeError::World { scheme: self.to_string(), ranks, accepted };
        let graph = self.graph.build(ranks).map_err(world)?;
        let least = graph.iter().map(Vec::len).min().unwrap_or(0);
        match self.fixed {
            Some(b) if ranks > 1 && b >= least => Err(world(format!(
                "b backup workers leave d - b neighbours to wait for, so b must be at most {} on this graph, where a rank has {least} neighbour{} (b = {b} would wait for none)",
                least.saturating_sub(1),
                if least == 1 { "" } else { "s" }
            ))),
            _ => Ok(()),
        }
    }

    fn replicated(&self) -> bool {
        true
    }

    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        let (t, rank, world) = (setup.t, setup.t.rank(), setup.t.world_size());
        // Built as `validate` built it, before any policy (the engine's and the simulator's
        // checks call it first).
        let graph = self.graph.build(world).expect("the graph was validated for this world");
        let params = setup.params;
        // Edge (a, b), a < b: a word on a, at b's place among a's higher neighbours.
        let higher: Vec<Vec<usize>> =
            graph.iter().enumerate().map(|(a, n)| n.iter().copied().filter(|&b| b > a).collect()).collect();
        let edges = t.alloc_window("dbw edges", &ShardMap::from_lens(higher.iter().map(Vec::len)))?;
        let first: Vec<usize> = higher
            .iter()
            .scan(0, |at, h| {
                let mine = *at;
                *at += h.len();
                Some(mine)
            })
            .collect();
        let d = graph[rank].len();
        let nbrs: Vec<Nbr> = graph[rank]
            .iter()
            .map(|&j| {
                let (a, b) = (rank.min(j), rank.max(j));
                let at = higher[a].iter().position(|&x| x == b).expect("an edge is in its lower rank's list");
                Nbr { rank: j, weight: mh_weight(d, graph[j].len()), word: first[a] + at }
            })
            .collect();
        let est = t.alloc_window("dbw estimates", &ShardMap::from_lens(vec![SLOTS * params; world]))?;
        let words = t.alloc_window("dbw words", &ShardMap::from_lens(vec![2; world]))?;
        t.barrier()?;
        let start = setup.start;
        Ok(Box::new(DbwPolicy {
            rank,
            world,
            params,
            fixed: self.fixed,
            state: Mutex::new(State {
                round: start,
                k: d,
                edges: vec![EdgeState::Waiting; d],
                pending: vec![0.0; params],
                published: true,
                closed: true,
                ahead: start,
                slots: [(u64::MAX, Vec::new()), (u64::MAX, Vec::new()), (u64::MAX, Vec::new())],
                version: 0,
                read: vec![0.0; params],
                times: vec![0; d],
            }),
            time_words: nbrs.iter().map(|n| 2 * n.rank + 1..2 * n.rank + 2).collect(),
            nbrs,
            est,
            edges,
            words,
        }))
    }
}

/// Values per rank in the estimates window: three `y` slots and two `x` slots of `P` each.
const SLOTS: usize = 5;
/// `y` slots (by iteration mod 3).
const Y_SLOTS: u64 = 3;

/// Edge word: the iteration plus one in the low bits (0: never used), flags above.
const ROUND_MASK: u64 = (1 << 40) - 1;
/// The lower rank arrived.
const LO: u64 = 1 << 40;
/// The higher rank arrived.
const HI: u64 = 1 << 41;
/// Cut: closed by the one that arrived, before the other did.
const CUT: u64 = 1 << 42;
/// The lower rank read the other's `y` (active edges).
const ACK_LO: u64 = 1 << 43;
/// The higher rank did.
const ACK_HI: u64 = 1 << 44;

fn decode(w: u64) -> (Option<u64>, u64) {
    ((w & ROUND_MASK).checked_sub(1), w & !ROUND_MASK)
}

fn encode(round: u64, flags: u64) -> u64 {
    ((round + 1) & ROUND_MASK) | flags
}

/// A neighbour: its rank, its Metropolis-Hastings weight and the edge's word.
#[derive(Clone, Copy, Debug)]
struct Nbr {
    rank: usize,
    weight: f32,
    word: usize,
}

/// An edge in this rank's current iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EdgeState {
    /// This rank has not arrived yet (the edge's previous exchange is not acknowledged by both).
    Waiting,
    /// Arrived; the neighbour has not.
    Arrived,
    /// Both arrived: they exchange.
    Active,
    /// No exchange (cut by one of them, or the neighbour is in a later iteration).
    Cut,
}

/// What the policy changes as the iteration goes.
struct State {
    round: u64,
    /// Neighbours to wait for this iteration.
    k: usize,
    edges: Vec<EdgeState>,
    /// This iteration's `y`, until written.
    pending: Vec<f32>,
    published: bool,
    closed: bool,
    /// The latest iteration a neighbour was seen in (a late rank moves on to it).
    ahead: u64,
    /// Per `y` slot: the iteration it holds and the neighbours that exchanged it.
    slots: [(u64, Vec<usize>); 3],
    /// Version of this rank's current `x`.
    version: u64,
    /// A neighbour's estimate, as read.
    read: Vec<f32>,
    /// The neighbours' last compute times, as read.
    times: Vec<u64>,
}

struct DbwPolicy {
    rank: usize,
    world: usize,
    params: usize,
    fixed: Option<usize>,
    nbrs: Vec<Nbr>,
    /// Where the neighbours' compute times are in `words`.
    time_words: Vec<std::ops::Range<usize>>,
    state: Mutex<State>,
    est: Window<f32>,
    edges: Window<u64>,
    words: Window<u64>,
}

impl DbwPolicy {
    fn mine(&self, other: usize) -> (u64, u64) {
        if self.rank < other {
            (LO, ACK_LO)
        } else {
            (HI, ACK_HI)
        }
    }

    /// Where rank `r`'s slot `s` starts in the estimates window.
    fn slot(&self, r: usize, s: usize) -> usize {
        (r * SLOTS + s) * self.params
    }

    /// Publishes this iteration's `y` once its slot's previous readers are done, then arrives on
    /// every edge it can.
    fn advance(&self, st: &mut State) -> Result<()> {
        let u = st.round;
        if !st.published {
            let s = (u % Y_SLOTS) as usize;
            let (held, readers) = &st.slots[s];
            for &i in readers {
                let n = self.nbrs[i];
                let (r, f) = decode(self.edges.load(n.word)?);
                if r == Some(*held) && f & (ACK_LO | ACK_HI) != ACK_LO | ACK_HI {
                    return Ok(());
                }
            }
            self.est.put(self.slot(self.rank, s), &st.pending)?;
            self.est.flush(self.rank)?;
            st.published = true;
        }
        for i in 0..self.nbrs.len() {
            if st.edges[i] == EdgeState::Waiting {
                st.edges[i] = self.arrive(self.nbrs[i], u, &mut st.ahead)?;
            }
        }
        Ok(())
    }

    /// Arrives at iteration `u` on the edge to `n`: `Waiting` if the edge's previous exchange is
    /// not acknowledged by both yet.
    fn arrive(&self, n: Nbr, u: u64, ahead: &mut u64) -> Result<EdgeState> {
        let (me, _) = self.mine(n.rank);
        let mut cur = self.edges.load(n.word)?;
        loop {
            let (r, f) = decode(cur);
            let new = match r {
                Some(r) if r > u => {
                    *ahead = (*ahead).max(r);
                    return Ok(EdgeState::Cut);
                }
                Some(r) if r == u => {
                    if f & CUT != 0 {
                        return Ok(EdgeState::Cut);
                    }
                    if f & me != 0 {
                        return Ok(EdgeState::Arrived);
                    }
                    encode(u, f | me)
                }
                _ => {
                    if r.is_some() && f & (LO | HI) == LO | HI && f & (ACK_LO | ACK_HI) != ACK_LO | ACK_HI {
                        return Ok(EdgeState::Waiting);
                    }
                    encode(u, me)
                }
            };
            let prev = self.edges.compare_and_swap(n.word, cur, new)?;
            if prev == cur {
                return Ok(if new & (LO | HI) == LO | HI { EdgeState::Active } else { EdgeState::Arrived });
            }
            cur = prev;
        }
    }

    /// An edge this rank arrived on: whether the neighbour arrived too (`Active`), went past
    /// this iteration (`Cut`), or not yet; if `close`, cuts it in the last case.
    fn settle(&self, n: Nbr, u: u64, close: bool, ahead: &mut u64) -> Result<EdgeState> {
        let (me, _) = self.mine(n.rank);
        let mut cur = self.edges.load(n.word)?;
        loop {
            let (r, f) = decode(cur);
            match r {
                Some(r) if r > u => {
                    *ahead = (*ahead).max(r);
                    return Ok(EdgeState::Cut);
                }
                Some(r) if r == u && f & (LO | HI) == LO | HI => return Ok(EdgeState::Active),
                _ if !close => return Ok(EdgeState::Arrived),
                _ => {}
            }
            let prev = self.edges.compare_and_swap(n.word, cur, encode(u, me | CUT))?;
            if prev == cur {
                return Ok(EdgeState::Cut);
            }
            cur = prev;
        }
    }

    /// Reads rank `r`'s current `x` into `out` under its sequence lock: false if it has none yet
    /// or it kept changing.
    fn read_x(&self, r: usize, out: &mut [f32]) -> Result<bool> {
        for _ in 0..8 {
            let v = self.words.load(2 * r)?;
            if v == 0 {
                return Ok(false);
            }
            self.est.get(self.slot(r, 3 + (v % 2) as usize), out)?;
            if self.words.load(2 * r)? == v {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl Policy for DbwPolicy {
    fn takes_over(&self) -> bool {
        false
    }

    fn begin(&mut self, _view: &dyn View, next: u64) -> Result<u64> {
        // A late rank moves on to the iteration its neighbours are in.
        Ok(next.max(self.state.lock().expect("dbw state").ahead))
    }

    fn admit(&mut self, _view: &dyn View, it: u64, compute: Duration, rec: &mut IterRecord) -> Result<Admit> {
        let own = compute.as_micros().max(1) as u64;
        self.words.swap(2 * self.rank + 1, own)?;
        let d = self.nbrs.len();
        let mut st = self.state.lock().expect("dbw state");
        let k = match self.fixed {
            Some(b) => d - b.min(d),
            None => {
                self.words.load_batch(&self.time_words, &mut st.times)?;
                best_k(own, &mut st.times)
            }
        };
        st.round = it;
        st.k = k;
        rec.scheme.set("backups", Figure::Count((d - k) as u64));
        // Each replica steps with its own rows' mean gradient: the engine scales updates to the
        // whole batch, of which a rank computes a `1 / N` share.
        Ok(Admit { apply: true, scale: self.world as f32 })
    }

    fn publish(&mut self, _view: &dyn View, it: u64, y: &[f32]) -> Result<()> {
        let mut st = self.state.lock().expect("dbw state");
        debug_assert_eq!(st.round, it);
        st.pending.copy_from_slice(y);
        st.published = false;
        st.closed = false;
        st.edges.fill(EdgeState::Waiting);
        self.advance(&mut st)
    }

    fn ready(&self, _view: &dyn View, _it: u64) -> Result<bool> {
        let mut st = self.state.lock().expect("dbw state");
        if st.closed {
            return Ok(true);
        }
        self.advance(&mut st)?;
        let u = st.round;
        let st = &mut *st;
        for (i, e) in st.edges.iter_mut().enumerate() {
            if *e == EdgeState::Arrived {
                *e = self.settle(self.nbrs[i], u, false, &mut st.ahead)?;
            }
        }
        let active = st.edges.iter().filter(|&&e| e == EdgeState::Active).count();
        let settled = st.edges.iter().all(|&e| matches!(e, EdgeState::Active | EdgeState::Cut));
        // An edge whose previous exchange is not acknowledged yet holds the close: arriving on it
        // is this rank's only way to tell the neighbour that this iteration's exchange is off.
        let waiting = st.edges.contains(&EdgeState::Waiting);
        if !(st.published && !waiting && (active >= st.k || settled)) {
            return Ok(false);
        }
        for (i, e) in st.edges.iter_mut().enumerate() {
            if *e == EdgeState::Arrived {
                *e = self.settle(self.nbrs[i], u, true, &mut st.ahead)?;
            }
        }
        st.closed = true;
        Ok(true)
    }

    fn mix(&mut self, _view: &dyn View, it: u64, x: &mut [f32], rec: &mut IterRecord) -> Result<()> {
        let mut guard = self.state.lock().expect("dbw state");
        let st = &mut *guard;
        let active: Vec<usize> = (0..self.nbrs.len()).filter(|&i| st.edges[i] == EdgeState::Active).collect();
        // x = W_ii y + sum_j W_ij v_j = y + sum_j W_ij (v_j - y), `y` as published.
        let mut mixin = |w: f32, v: &[f32]| {
            for ((x, &v), &y) in x.iter_mut().zip(v).zip(&st.pending) {
                *x += w * (v - y);
            }
        };
        if !active.is_empty() {
            let s = (it % Y_SLOTS) as usize;
            for &i in &active {
                let n = self.nbrs[i];
                self.est.get(self.slot(n.rank, s), &mut st.read)?;
                mixin(n.weight, &st.read);
            }
        } else if st.ahead > it {
            // Late: pull the neighbours' current estimates.
            for n in &self.nbrs {
                if self.read_x(n.rank, &mut st.read)? {
                    mixin(n.weight, &st.read);
                }
            }
        }
        rec.scheme.set("dropped", Figure::Flag(active.is_empty() && !self.nbrs.is_empty()));
        for &i in &active {
            let n = self.nbrs[i];
            let (_, ack) = self.mine(n.rank);
            let mut cur = self.edges.load(n.word)?;
            loop {
                let prev = self.edges.compare_and_swap(n.word, cur, cur | ack)?;
                if prev == cur {
                    break;
                }
                cur = prev;
            }
        }
        st.slots[(it % Y_SLOTS) as usize] = (it, active);
        // The new x, behind the version word.
        let v = st.version + 1;
        self.est.put(self.slot(self.rank, 3 + (v % 2) as usize), x)?;
        self.est.flush(self.rank)?;
        self.words.swap(2 * self.rank, v)?;
        st.version = v;
        Ok(())
    }

    fn free(self: Box<Self>) -> Result<()> {
        self.est.free()?;
        self.edges.free()?;
        self.words.free()
    }
}

/// Neighbours to wait for: the `k` in `1..=d` maximizing `(k + 1) / max(own, d_(k))` over the
/// neighbours' last compute times `nbr` (ties: the larger `k`); all of them while a time is
/// missing (0).
fn best_k(own: u64, nbr: &mut [u64]) -> usize {
    let d = nbr.len();
    if d == 0 || nbr.contains(&0) {
        return d;
    }
    nbr.sort_unstable();
    let rate = |k: usize| (k + 1) as f64 / own.max(nbr[k - 1]) as f64;
    let mut best = (d, rate(d));
    for k in (1..d).rev() {
        if rate(k) > best.1 * (1.0 + 1e-9) {
            best = (k, rate(k));
        }
    }
    best.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graphs_have_their_degrees_and_are_symmetric_and_connected() {
        for (g, n, d) in [
            (Graph::Ring, 4, 2),
            (Graph::Ring, 2, 1),
            (Graph::Torus, 9, 4),
            (Graph::Torus, 12, 4),
            (Graph::Complete, 5, 4),
            (Graph::Regular(3), 10, 3),
            (Graph::Regular(4), 200, 4),
        ] {
            let adj = g.build(n).unwrap_or_else(|e| panic!("{g} on {n}: {e}"));
            for (i, nb) in adj.iter().enumerate() {
                assert_eq!(nb.len(), d, "{g} on {n}: rank {i} has {nb:?}");
                assert!(nb.iter().all(|&j| j != i && adj[j].contains(&i)), "{g} on {n}: not symmetric");
            }
            // Metropolis-Hastings: every row (and so every column) sums to 1 with its self weight.
            for (i, nb) in adj.iter().enumerate() {
                let out: f32 = nb.iter().map(|&j| mh_weight(nb.len(), adj[j].len())).sum();
                assert!(out < 1.0, "{g}: rank {i} gives away {out}");
            }
        }
        // A torus with a side of 2: three neighbours (the two along the side of 2 coincide).
        assert!(Graph::Torus.build(8).expect("2 x 4").iter().all(|n| n.len() == 3));
        assert!(Graph::Torus.build(7).expect_err("prime").contains("7 is not"));
        assert!(Graph::Regular(3).build(5).expect_err("odd ends").contains("even number"));
        assert!(Graph::Regular(4).build(4).expect_err("k = n").contains("more than 4"));
        // The random graph is the same every time for the same world and k.
        assert_eq!(Graph::Regular(3).build(30), Graph::Regular(3).build(30));
    }

    #[test]
    fn names_parse_to_the_graph_and_backups() {
        for (given, canonical) in [
            ("dbw", "dbw:ring"),
            ("dbw:1", "dbw:ring:1"),
            ("dbw:torus", "dbw:torus"),
            ("dbw:torus:2", "dbw:torus:2"),
            ("dbw:regular-3:0", "dbw:regular-3:0"),
            ("dbw:complete", "dbw:complete"),
        ] {
            let d = parse(given).expect("dbw's").unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(d.to_string(), canonical);
        }
        for bad in ["dbw:star", "dbw:ring:x", "dbw:regular-0", "dbw:ring:1:2", "dbw:"] {
            let e = parse(bad).expect("dbw's").expect_err(bad).to_string();
            assert!(e.contains("must be"), "{bad}: {e}");
        }
        assert!(parse("backup:1").is_none());
        let ring1 = parse("dbw:ring:1").expect("dbw").expect("parsed");
        assert!(ring1.validate(4).is_ok());
        let e =
            parse("dbw:ring:2").expect("dbw").expect("parsed").validate(4).expect_err("b = d").to_string();
        assert!(e.contains("at most 1") && e.contains("2 neighbours"), "{e}");
        let e = parse("dbw:torus").expect("dbw").expect("parsed").validate(5).expect_err("prime").to_string();
        assert!(e.contains("dbw:torus") && e.contains("5 ranks"), "{e}");
    }

    #[test]
    fn the_dynamic_choice_leaves_out_slow_neighbours() {
        // Ring, a neighbour at half speed: waiting for it halves the rate (3 / 2 < 2 / 1).
        assert_eq!(best_k(100, &mut [100, 200]), 1);
        // Both neighbours as fast as this rank (within noise): wait for both (3 / 105 > 2 / 100).
        assert_eq!(best_k(100, &mut [105, 98]), 2);
        // The slow rank itself: its neighbours are faster, waiting costs nothing.
        assert_eq!(best_k(200, &mut [100, 100]), 2);
        // Four neighbours 100, 110, 300, 310: k = 2 gives 3 / 110 = 0.027, k = 4 gives 5 / 310.
        assert_eq!(best_k(100, &mut [300, 110, 310, 100]), 2);
        // A neighbour without a time yet: wait for all.
        assert_eq!(best_k(100, &mut [0, 100]), 2);
        assert_eq!(best_k(100, &mut []), 0);
    }

    #[test]
    fn edge_words_round_trip() {
        assert_eq!(decode(0), (None, 0));
        assert_eq!(decode(encode(0, LO)), (Some(0), LO));
        assert_eq!(decode(encode(41, LO | HI | ACK_HI)), (Some(41), LO | HI | ACK_HI));
    }
}
