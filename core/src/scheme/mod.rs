//! Synchronization schemes and straggler mitigations as **policies**: the engine
//! ([`crate::engine`]) is the mechanism (windows, queues, the pool, pulls and pushes, waits) and
//! asks a `Policy` at named points of every iteration what to do; each scheme is one file that
//! owns its state and windows. `README.md` in this folder lists the hooks in the order an
//! iteration calls them, and which scheme uses which.
//!
//! A scheme is named on the command line and in configuration files as `name[:arguments]`
//! (`ssp:3`, `backup:1`, `falcon:slack:2`); [`Scheme`] is that name parsed once, by the
//! registry of scheme files, and checked against the world it is to run in
//! ([`Scheme::validate`]) before anything is written. [`SchemeSpec`] adds whether ranks take over
//! each other's chunks (`bsp+steal` in an experiment's list).
//!
//! Policies decide from a `View` of the world: the ranks' clocks, queue words, progress words
//! and published chunk rates. In a run the view reads the windows one-sidedly as a decision needs
//! them; in tests it is a hand-made one (`Snapshot`, test-only), so that every decision rule is
//! a deterministic unit test.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use peregrine_transport::Transport;

use crate::plan::Plan;
use crate::record::{IterRecord, RankTotals};
use crate::words::{self, ProgressWord, Queue};

mod backup;
mod dbw;
mod dynsgd;
pub(crate) mod endgame;
mod falcon;
mod flexrr;
pub mod lbbsp;
pub mod narx;
mod speculative;
mod staleness;
pub mod traces;

/// Failures of window operations inside a policy.
pub(crate) type Result<T> = std::result::Result<T, peregrine_transport::Error>;

/// Every scheme file's entry: the registry. A new scheme is a new file with its `FAMILY` and one
/// line here.
const FAMILIES: &[Family] = &[
    staleness::FAMILY,
    dynsgd::FAMILY,
    backup::FAMILY,
    dbw::FAMILY,
    lbbsp::FAMILY,
    speculative::FAMILY,
    flexrr::FAMILY,
    falcon::FAMILY,
];

/// A scheme file's entry in the registry.
pub(crate) struct Family {
    /// The forms it accepts, for the error that lists them (`ssp[:<staleness>]`).
    pub forms: &'static str,
    /// A name of each of its schemes, default arguments (what lists of schemes name).
    pub names: &'static [&'static str],
    /// What `peregrine simulate` compares when no `--scheme` is given (with `+steal` where the
    /// scheme is compared taking chunks over).
    pub compared: &'static [&'static str],
    /// Parses a lower-case scheme name: `None` if the name is not this family's.
    pub parse: fn(&str) -> Option<Parsed>,
}

/// What a family makes of a name that is its own: the scheme, or why its arguments are wrong.
pub(crate) type Parsed = std::result::Result<Arc<dyn SchemeKind>, SchemeError>;

/// A scheme with its arguments, parsed: what a scheme file makes of its name.
pub(crate) trait SchemeKind: fmt::Debug + fmt::Display + Send + Sync {
    /// Whether the scheme can run in a world of `ranks` ranks; the error names the scheme and the
    /// range it accepts.
    fn validate(&self, _ranks: usize) -> std::result::Result<(), SchemeError> {
        Ok(())
    }

    /// Whether every iteration's pull follows every update of the iterations before it, each
    /// applied whole (BSP's guarantee): what a model whose rows carry state of their own needs
    /// ([`crate::model::Model::needs_current_rows`]).
    fn pulls_every_update(&self) -> bool {
        false
    }

    /// Whether every rank keeps its own replica of the model (decentralized: DBW) instead of
    /// one model sharded over the ranks: the engine then pulls and steps the rank's own replica,
    /// hands the stepped one to [`Policy::publish`] and the policy averages it with its
    /// neighbours' ([`Policy::mix`]); evaluations use the replicas' average.
    fn replicated(&self) -> bool {
        false
    }

    /// This rank's policy for a run (collective: every rank builds its own, and policies that
    /// own windows allocate them here).
    fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>>;
}

/// What a policy is built from.
pub(crate) struct Setup<'a> {
    /// The world.
    pub t: &'a Transport,
    /// Whether the user asked for chunks to be taken over (`bsp+steal`, ...).
    pub steal: bool,
    /// The iteration the run starts at (0, or the checkpoint's when resumed).
    pub start: u64,
    /// The run's batches and chunks.
    pub plan: &'a Plan,
    /// Whether the world is simulated ([`crate::sim`]): the node this process runs on is not the
    /// rank's, so its loads (LB-BSP's exogenous inputs) are not read.
    pub simulated: bool,
    /// The model's parameters (a replicated policy's windows hold copies of them).
    pub params: usize,
    /// In a simulated world, what its ranks' policies share (none in a run).
    pub shared: Option<Arc<Shared>>,
}

/// What the policies of a simulated world share: results that every rank would compute alike
/// from the same words, computed once. All ranks of a simulation live in one thread, and
/// thousands of them each computing the same thing made a scheme's simulation quadratic in the
/// ranks (LB-BSP's split: 3 s an iteration at 4,096 ranks).
#[derive(Debug, Default)]
pub(crate) struct Shared {
    /// LB-BSP's split of the last iteration a rank computed it for: the iteration and every
    /// rank's first chunk, then the end ([`lbbsp`]).
    pub split: std::sync::Mutex<Option<(u64, Arc<[usize]>)>>,
}

/// Errors of scheme names and of schemes that cannot run in a world.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemeError {
    /// No scheme has this name.
    #[error("unknown scheme `{name}`: expected {forms}")]
    Unknown {
        /// The name given.
        name: String,
        /// Every accepted form.
        forms: String,
    },
    /// An argument of a scheme is not what it accepts.
    #[error("scheme `{name}`: {what} must be {accepted}, as in {example}")]
    Argument {
        /// The name given.
        name: String,
        /// The argument.
        what: &'static str,
        /// What it accepts.
        accepted: &'static str,
        /// An accepted form.
        example: &'static str,
    },
    /// The scheme cannot run with this many ranks.
    #[error("scheme `{scheme}` cannot run with {ranks} rank{}: {accepted}", if *ranks == 1 { "" } else { "s" })]
    World {
        /// The scheme.
        scheme: String,
        /// The ranks of the world.
        ranks: usize,
        /// What it accepts.
        accepted: String,
    },
}

impl SchemeError {
    /// An argument error for scheme `name`.
    pub(crate) fn argument(
        name: &str,
        what: &'static str,
        accepted: &'static str,
        example: &'static str,
    ) -> Self {
        Self::Argument { name: name.into(), what, accepted, example }
    }
}

/// Parses a staleness bound argument of scheme `name` (`ssp:3`).
pub(crate) fn bound(name: &str, arg: &str, example: &'static str) -> std::result::Result<u64, SchemeError> {
    arg.parse().map_err(|_| {
        SchemeError::argument(
            name,
            "the staleness bound",
            "a whole number of iterations (0 or more)",
            example,
        )
    })
}

/// A synchronization scheme or straggler mitigation, parsed from its name.
#[derive(Clone, Debug)]
pub struct Scheme(Arc<dyn SchemeKind>);

impl Scheme {
    /// BSP, the reference every experiment compares with.
    pub fn bsp() -> Self {
        Self(Arc::new(staleness::Bound::Bsp))
    }

    /// Checks that the scheme can run in a world of `ranks` ranks (before anything is started or
    /// written): the error names the scheme and the accepted range.
    pub fn validate(&self, ranks: usize) -> std::result::Result<(), SchemeError> {
        self.0.validate(ranks)
    }

    /// Whether every iteration's pull follows every update of the iterations before it, each
    /// applied whole: BSP, LB-BSP, speculative execution and enforced Falcon (not SSP, ASP,
    /// DynSGD's scaled updates, backup workers' skipping ahead, FlexRR, slack Falcon).
    pub fn pulls_every_update(&self) -> bool {
        self.0.pulls_every_update()
    }

    /// Whether every rank keeps its own replica of the model (DBW) rather than one model sharded
    /// over the ranks.
    pub fn replicated(&self) -> bool {
        self.0.replicated()
    }

    /// A name of every scheme of the registry (default arguments), in registry order.
    pub fn names() -> impl Iterator<Item = &'static str> {
        FAMILIES.iter().flat_map(|f| f.names.iter().copied())
    }

    /// The schemes `peregrine simulate` compares by default, as [`SchemeSpec`] names.
    pub fn compared_by_default() -> impl Iterator<Item = &'static str> {
        FAMILIES.iter().flat_map(|f| f.compared.iter().copied())
    }

    /// Every accepted form, for help texts.
    pub fn forms() -> String {
        let forms: Vec<&str> = FAMILIES.iter().map(|f| f.forms).collect();
        match forms.split_last() {
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    pub(crate) fn policy(&self, setup: &Setup<'_>) -> Result<Box<dyn Policy>> {
        self.0.policy(setup)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Schemes are equal when their canonical names are (`ssp` and `ssp:3` are one scheme).
impl PartialEq for Scheme {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Scheme {}

impl FromStr for Scheme {
    type Err = SchemeError;

    fn from_str(s: &str) -> std::result::Result<Self, SchemeError> {
        let lower = s.trim().to_ascii_lowercase();
        for f in FAMILIES {
            if let Some(parsed) = (f.parse)(&lower) {
                return parsed.map(Scheme);
            }
        }
        Err(SchemeError::Unknown { name: s.into(), forms: Self::forms() })
    }
}

/// A scheme and whether ranks take over each other's queued chunks: `scheme[+steal]` in an
/// experiment's list (`bsp+steal`); `peregrine train` takes over unless `--no-steal`. Backup
/// workers and LB-BSP never take over (dropping late updates, or resizing the shares, is their
/// answer to stragglers); FlexRR and Falcon always do (taking over is their mechanism).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemeSpec {
    /// The scheme.
    pub scheme: Scheme,
    /// Whether chunks may be taken over.
    pub steal: bool,
}

impl SchemeSpec {
    /// `scheme`, taking over chunks if `steal`.
    pub fn new(scheme: Scheme, steal: bool) -> Self {
        Self { scheme, steal }
    }

    /// BSP without taking over: Ideal's scheme in the experiment.
    pub fn reference() -> Self {
        Self::new(Scheme::bsp(), false)
    }
}

impl Default for SchemeSpec {
    fn default() -> Self {
        Self::new(Scheme::bsp(), true)
    }
}

impl fmt::Display for SchemeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.scheme, if self.steal { "+steal" } else { "" })
    }
}

impl FromStr for SchemeSpec {
    type Err = SchemeError;

    /// `scheme[+steal]`: without the suffix, no taking over.
    fn from_str(s: &str) -> std::result::Result<Self, SchemeError> {
        let t = s.trim();
        match t.strip_suffix("+steal") {
            Some(name) => Ok(Self::new(name.parse()?, true)),
            None => Ok(Self::new(t.parse()?, false)),
        }
    }
}

crate::serde_as_name!(Scheme, SchemeSpec);

/// The world as a policy sees it: every rank's words, read when a decision needs them.
pub(crate) trait View {
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in the world.
    fn world(&self) -> usize;
    /// `rank`'s clock: iterations whose update it has pushed.
    fn clock(&self, rank: usize) -> Result<u64>;
    /// `rank`'s chunk queue.
    fn queue(&self, rank: usize) -> Result<Queue>;
    /// `rank`'s progress word (its current iteration's chunks, and how many are done).
    fn progress(&self, rank: usize) -> Result<ProgressWord>;
    /// `rank`'s published chunk rate in its current iteration (chunks per second; 0: none yet).
    fn rate(&self, rank: usize) -> Result<f64>;

    /// Every rank's clock, read in one batch (one round trip, not one per rank).
    fn clocks(&self) -> Result<Vec<u64>> {
        (0..self.world()).map(|r| self.clock(r)).collect()
    }
    /// The ranks worth looking at for queued chunks of `it` to take over (this rank may be among
    /// them; empty: none has any). In a run that takes over chunks under a staleness bound, the
    /// ranks of one leaf node of the tree of drained queues (at most 16, found in O(log N):
    /// `crate::queue`); else every rank.
    fn candidates(&self, _it: u64) -> Result<Range<usize>> {
        Ok(0..self.world())
    }
    /// The ranks worth looking at for chunks of `it` not yet done (copies to compute; this rank
    /// may be among them; empty: every rank is done). Past [`crate::queue::READ_ALL_UP_TO`] ranks
    /// in a run that lines up under a staleness bound, the ranks of one leaf node of the done
    /// tree (found in O(log N): `crate::clocks`); else every rank.
    fn undone(&self, _it: u64) -> Result<Range<usize>> {
        Ok(0..self.world())
    }
    /// The chunk queues of `ranks`, read in one batch.
    fn queues_in(&self, ranks: Range<usize>) -> Result<Vec<Queue>> {
        ranks.map(|r| self.queue(r)).collect()
    }
    /// The published chunk rates of `ranks`, read in one batch.
    fn rates_in(&self, ranks: Range<usize>) -> Result<Vec<f64>> {
        ranks.map(|r| self.rate(r)).collect()
    }
    /// The progress words of `ranks`, read in one batch.
    fn progress_in(&self, ranks: Range<usize>) -> Result<Vec<ProgressWord>> {
        ranks.map(|r| self.progress(r)).collect()
    }

    /// Whether every rank's clock is at least `clock` (in a run with a staleness bound, one
    /// load of a combining tree's root: `crate::clocks`).
    fn reached(&self, clock: u64) -> Result<bool> {
        Ok(self.clocks()?.into_iter().all(|c| c >= clock))
    }

    /// The sum of all clocks: updates pushed so far by everyone (the parameters' version).
    fn version(&self) -> Result<u64> {
        Ok(self.clocks()?.into_iter().sum())
    }
}

/// A hand-made view: every word given (tests of decision rules).
#[cfg(test)]
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    pub rank: usize,
    pub clocks: Vec<u64>,
    pub queues: Vec<Queue>,
    pub progress: Vec<ProgressWord>,
    pub rates: Vec<f64>,
    /// What [`View::undone`] answers (`None`: every rank).
    pub undone: Option<Range<usize>>,
}

#[cfg(test)]
impl Snapshot {
    /// `world` ranks seen from `rank`, every word zero.
    pub fn new(rank: usize, world: usize) -> Self {
        Self {
            rank,
            clocks: vec![0; world],
            queues: vec![Queue::default(); world],
            progress: vec![ProgressWord::default(); world],
            rates: vec![0.0; world],
            undone: None,
        }
    }
}

#[cfg(test)]
impl View for Snapshot {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.clocks.len()
    }
    fn undone(&self, _it: u64) -> Result<Range<usize>> {
        Ok(self.undone.clone().unwrap_or(0..self.world()))
    }
    fn clock(&self, rank: usize) -> Result<u64> {
        Ok(self.clocks[rank])
    }
    fn queue(&self, rank: usize) -> Result<Queue> {
        Ok(self.queues[rank])
    }
    fn progress(&self, rank: usize) -> Result<ProgressWord> {
        Ok(self.progress[rank])
    }
    fn rate(&self, rank: usize) -> Result<f64> {
        Ok(self.rates[rank])
    }
}

/// The fraction of a victim's queued chunks one of a thief's `threads` active threads takes:
/// the rank's share split over them (each thread computes what it takes alone).
pub(crate) fn thread_share(share: Share, configured: f64, threads: usize) -> f64 {
    let rank = match share {
        Share::Configured => configured,
        Share::Fraction(f) => f,
    };
    rank / threads.max(1) as f64
}

/// How much of a victim's queue a thief takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Share {
    /// The configured steal fraction (`--steal-fraction`, half by default).
    Configured,
    /// This fraction of what is left.
    Fraction(f64),
}

/// Chunks to take over: from whom and how many.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Take {
    /// The victim.
    pub rank: usize,
    /// Its share.
    pub share: Share,
}

/// How a rank's threads run the own chunks they take from its queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnChunks {
    /// Compute them and count them done: nobody else computes them.
    Whole,
    /// Claim each before computing it; a chunk already claimed (a copy won) is skipped.
    ClaimFirst,
    /// Compute each as a copy into its own buffers and apply it only if it claims the chunk
    /// first (another rank may be computing a copy of it).
    AsCopies,
}

/// Whether and how this rank's update of an iteration is applied.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Admit {
    /// Push the update.
    pub apply: bool,
    /// Factor on the update (on top of the model's step and the learning-rate decay).
    pub scale: f32,
}

impl Admit {
    /// Applied as computed.
    pub const FULL: Self = Self { apply: true, scale: 1.0 };
}

/// The hooks a scheme answers, in the order an iteration calls them (see `README.md`). Hooks
/// that take `&mut self` run on the rank's main thread between phases; `&self` hooks may run on
/// any of its compute threads at once.
pub(crate) trait Policy: Send + Sync {
    /// Whether ranks take over each other's queued chunks (fixed for the run).
    fn takes_over(&self) -> bool;

    /// Whether the policy reads the ranks' chunk rates (the engine publishes them only then):
    /// at least where it has the end game ([`leaves_chunks`](Self::leaves_chunks)), which reads
    /// them.
    fn reads_rates(&self) -> bool {
        self.leaves_chunks()
    }

    /// The most iterations this policy's `ready` lets a rank's clock run ahead of the slowest
    /// (`Some(0)`: BSP; `None`: no bound, or clocks that skip iterations): with a bound, the
    /// engine keeps "every clock at least `c`" in a combining tree and [`View::reached`] is one
    /// load (fixed for the run).
    fn staleness(&self) -> Option<u64> {
        None
    }

    /// Whether the policy reads [`View::version`] (the engine keeps it as one counter then).
    fn reads_version(&self) -> bool {
        false
    }

    /// `begin`: the iteration this rank runs, `next` being the one after its last (a late rank
    /// may skip ahead).
    fn begin(&mut self, _view: &dyn View, next: u64) -> Result<u64> {
        Ok(next)
    }

    /// `threads`: the active compute threads of this iteration, `planned` being what the
    /// configuration and the injected pattern give.
    fn threads(&mut self, planned: usize) -> usize {
        planned
    }

    /// `chunks`: this rank's chunks of iteration `it` (global chunk numbers).
    fn chunks(&mut self, view: &dyn View, it: u64, plan: &Plan) -> Result<Range<usize>> {
        Ok(plan.part(it, view.rank()))
    }

    /// `open`: the iteration's chunks are decided; called before they are announced and queued
    /// and before the pull.
    fn open(&mut self, _view: &dyn View, _it: u64) -> Result<()> {
        Ok(())
    }

    /// `own_chunks`: how the next own chunks taken from the queue are run.
    fn own_chunks(&self, _view: &dyn View) -> Result<OwnChunks> {
        Ok(OwnChunks::Whole)
    }

    /// Claims `owner`'s chunk `chunk` of the iteration tagged `tag`: true for the first caller
    /// only (under [`OwnChunks::ClaimFirst`] and [`OwnChunks::AsCopies`]).
    fn claim(&self, _owner: usize, _tag: u16, _chunk: u32) -> Result<bool> {
        Ok(true)
    }

    /// Whether `owner`'s chunk `chunk` of the iteration tagged `tag` can no longer be claimed.
    fn settled(&self, _owner: usize, _tag: u16, _chunk: u32) -> Result<bool> {
        Ok(false)
    }

    /// `after_own_chunk`: after each take of own chunks, ranks to take chunks from at once,
    /// before this rank's own remaining ones (rapid reassignment).
    fn after_own_chunk(&self, _view: &dyn View, _it: u64, _out: &mut Vec<Take>) -> Result<()> {
        Ok(())
    }

    /// `victim`: out of own chunks, whom to take over from (a rank with queued chunks of an
    /// iteration not ahead of `it`), and how many.
    fn victim(&self, view: &dyn View, it: u64) -> Result<Option<Take>> {
        Ok(most_left(view, it)?.map(|rank| Take { rank, share: Share::Configured }))
    }

    /// `line_up`: whether the rank, done computing, waits until every rank's chunks of the
    /// iteration are done before pushing (helping with queued ones), so that nobody reads the
    /// iteration's parameters after someone changed them.
    fn line_up(&self) -> bool {
        false
    }

    /// Whether a thread of this rank, about to take one of its own queued chunks, leaves it to
    /// the free threads of other ranks when they would finish it sooner ([`endgame`]): for
    /// schemes whose iteration ends with its last chunk, with taking over, every rank's part of
    /// one size (fixed for the run).
    fn leaves_chunks(&self) -> bool {
        false
    }

    /// Whether the policy ever copies chunks running elsewhere ([`copy_due`](Self::copy_due)):
    /// fixed for the run (the simulator polls for copies only then).
    fn copies(&self) -> bool {
        false
    }

    /// While lining up, `waited` long enough: whether to copy chunks still running elsewhere.
    fn copy_due(&self, _view: &dyn View, _it: u64, _waited: bool) -> Result<bool> {
        Ok(false)
    }

    /// A chunk `(owner, chunk)` still running elsewhere for one of this rank's threads to copy
    /// (marked, so that no other thread of this rank copies it too).
    fn copy(&self, _view: &dyn View, _it: u64) -> Result<Option<(usize, u32)>> {
        Ok(None)
    }

    /// `admit`: whether and how this rank's update of `it` is applied, after `compute` of
    /// computing; the policy's metrics go into `rec`.
    fn admit(
        &mut self,
        _view: &dyn View,
        _it: u64,
        _compute: Duration,
        _rec: &mut IterRecord,
    ) -> Result<Admit> {
        Ok(Admit::FULL)
    }

    /// `publish` (replicated schemes): this rank's replica stepped with its update of `it`, `y`,
    /// before the clock ticks.
    fn publish(&mut self, _view: &dyn View, _it: u64, _y: &[f32]) -> Result<()> {
        Ok(())
    }

    /// `before_tick`: the update is pushed and flushed, the clock not yet ticked. `busy` is the
    /// time this rank's threads spent in chunks.
    fn before_tick(
        &mut self,
        _view: &dyn View,
        _it: u64,
        _busy: Duration,
        _rec: &mut IterRecord,
    ) -> Result<()> {
        Ok(())
    }

    /// `after_tick`: the clock ticked; `applied` says whether the update was pushed.
    fn after_tick(&mut self, _it: u64, _applied: bool) -> Result<()> {
        Ok(())
    }

    /// `ready`: whether this rank may start the iteration after `it`.
    fn ready(&self, view: &dyn View, it: u64) -> Result<bool>;

    /// Whether `ready(it)` holds only once every rank has pushed its update of `it` in full
    /// (BSP): the engine may then step a dense model's optimizer at the owners of the parameters
    /// with the iteration's summed gradient, instead of every rank stepping with its share, and
    /// put the new values of batches whose chunks touch disjoint keys (`Model::disjoint`). Such
    /// a policy admits every update whole ([`Admit::FULL`]): new values cannot be scaled.
    fn synchronous(&self) -> bool {
        false
    }

    /// `mix` (replicated schemes): once `ready`, this rank's replica of `it` (`x`, holding what
    /// was published) averaged with the neighbours'.
    fn mix(&mut self, _view: &dyn View, _it: u64, _x: &mut [f32], _rec: &mut IterRecord) -> Result<()> {
        Ok(())
    }

    /// `end`: the iteration's record is complete.
    fn end(&mut self, _rec: &IterRecord) {}

    /// The policy's share of this rank's totals.
    fn totals(&self, _totals: &mut RankTotals) {}

    /// What this rank's policy learned that a run resumed from a checkpoint should start from
    /// (LB-BSP's speed predictor), flattened; empty if nothing.
    fn state(&self) -> Vec<f64> {
        Vec::new()
    }

    /// Starts from `state`, as [`Policy::state`] gave it on the same rank of a world of the same
    /// size, before the first iteration (the ranks synchronize after it).
    fn restore(&mut self, _rank: usize, _state: &[f64]) -> Result<()> {
        Ok(())
    }

    /// Collective: frees the policy's windows.
    fn free(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// The rank other than this one with the most chunks queued in an iteration not ahead of `it`,
/// among the [candidates](View::candidates) (their queues read in one batch).
pub(crate) fn most_left(view: &dyn View, it: u64) -> Result<Option<usize>> {
    let (me, ranks) = (view.rank(), view.candidates(it)?);
    let queues = view.queues_in(ranks.clone())?;
    let among = ranks.clone().filter(|&r| r != me).map(|r| (r, queues[r - ranks.start]));
    best_queued(it, among, |_, q| Ok(f64::from(q.left())))
}

/// Among `(rank, queue)` pairs, the rank with chunks queued in an iteration not ahead of `it`
/// and the largest `score` (ties: the first).
pub(crate) fn best_queued(
    it: u64,
    queues: impl Iterator<Item = (usize, Queue)>,
    mut score: impl FnMut(usize, Queue) -> Result<f64>,
) -> Result<Option<usize>> {
    let mut best: Option<(usize, f64)> = None;
    for (r, q) in queues {
        if q.left() == 0 || words::ahead(q.tag, it) {
            continue;
        }
        let s = score(r, q)?;
        if best.is_none_or(|(_, b)| s > b) {
            best = Some((r, s));
        }
    }
    Ok(best.map(|(r, _)| r))
}

/// Parses `name[:arg]` forms: `Some(arg)` after `prefix:` when `s` starts with it.
pub(crate) fn arg<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    s.strip_prefix(prefix)?.strip_prefix(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_lists_of_schemes_parse_and_cover_every_family() {
        let names: Vec<&str> = Scheme::names().collect();
        for n in &names {
            n.parse::<Scheme>().unwrap_or_else(|e| panic!("{n}: {e}"));
        }
        for f in FAMILIES {
            assert!(f.names.iter().all(|n| (f.parse)(n).is_some_and(|p| p.is_ok())), "{}", f.forms);
            assert!(!f.names.is_empty(), "{} names no scheme", f.forms);
        }
        let compared: Vec<&str> = Scheme::compared_by_default().collect();
        assert!(compared.contains(&"bsp") && compared.len() >= 4, "{compared:?}");
        for c in compared {
            c.parse::<SchemeSpec>().unwrap_or_else(|e| panic!("{c}: {e}"));
        }
    }

    #[test]
    fn every_scheme_parses_and_prints_its_canonical_name() {
        for (given, canonical) in [
            ("bsp", "bsp"),
            ("ASP", "asp"),
            ("ssp:5", "ssp:5"),
            ("ssp", "ssp:3"),
            ("dynsgd", "dynsgd"),
            ("dynsgd:2", "dynsgd:2"),
            ("backup:1", "backup:1"),
            ("backup-dynamic", "backup-dynamic"),
            ("dbw", "dbw:ring"),
            ("dbw:torus:1", "dbw:torus:1"),
            ("falcon", "falcon"),
            ("epsp", "falcon"),
            ("falcon:enforced", "falcon"),
            ("falcon:slack", "falcon:slack:2"),
            ("falcon:slack:4", "falcon:slack:4"),
            ("flexrr", "flexrr:3"),
            ("flexrr:1", "flexrr:1"),
            ("speculative", "speculative"),
            ("clone", "speculative"),
            ("lb-bsp", "lb-bsp"),
            ("lb-bsp:arx", "lb-bsp"),
            ("lb-bsp:ma", "lb-bsp:ma"),
            ("lb-bsp:narx", "lb-bsp:narx"),
        ] {
            let got: Scheme = given.parse().unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(got.to_string(), canonical, "{given}");
            assert_eq!(canonical.parse::<Scheme>().expect("round trip"), got);
        }
        assert_eq!(Scheme::bsp(), "bsp".parse().expect("bsp"));
        assert_ne!(Scheme::bsp(), "ssp:0".parse().expect("ssp:0"));
    }

    #[test]
    fn bad_names_say_what_is_accepted() {
        let e = "ssp:x".parse::<Scheme>().expect_err("bad bound").to_string();
        assert!(e.contains("whole number") && e.contains("ssp:3"), "{e}");
        for bad in ["ssp:-1", "flexrr:x", "falcon:slack:-1", "dynsgd:1.5", "backup:x", "backup:-1"] {
            let e = bad.parse::<Scheme>().expect_err(bad).to_string();
            assert!(e.contains(bad) && e.contains("must be"), "{bad}: {e}");
        }
        for unknown in ["bulk", "speculative:3", "falcon:lazy", "lb-bsp:nar", "backup"] {
            let e = unknown.parse::<Scheme>().expect_err(unknown).to_string();
            assert!(e.contains("unknown scheme") || e.contains("must be"), "{unknown}: {e}");
        }
        let e = "bulk".parse::<Scheme>().expect_err("unknown").to_string();
        for form in ["bsp", "ssp[:<staleness>]", "backup:<b>", "falcon[:enforced|:slack[:<staleness>]]"] {
            assert!(e.contains(form), "{e} lacks {form}");
        }
    }

    #[test]
    fn specs_parse_the_steal_suffix() {
        let s: SchemeSpec = "ssp:2+steal".parse().expect("spec");
        assert_eq!((s.scheme.to_string().as_str(), s.steal), ("ssp:2", true));
        let s: SchemeSpec = "bsp".parse().expect("spec");
        assert_eq!(s, SchemeSpec::reference());
        assert_eq!(s.to_string(), "bsp");
        assert_eq!("bsp+steal".parse::<SchemeSpec>().expect("spec").to_string(), "bsp+steal");
        assert!("bulk+steal".parse::<SchemeSpec>().is_err());
    }

    #[test]
    fn impossible_worlds_are_refused_with_the_range() {
        let e = "backup:2".parse::<Scheme>().expect("backup:2").validate(2).expect_err("b = ranks");
        let text = e.to_string();
        assert!(
            text.contains("backup:2") && text.contains("2 ranks") && text.contains("at most 1"),
            "{text}"
        );
        assert!("backup:1".parse::<Scheme>().expect("backup:1").validate(2).is_ok());
        assert!("backup:1".parse::<Scheme>().expect("backup:1").validate(1).is_err());
        assert!("backup:0".parse::<Scheme>().expect("backup:0").validate(1).is_ok());
        for ok in
            ["bsp", "ssp:2", "asp", "dynsgd", "lb-bsp", "speculative", "flexrr:2", "falcon", "backup-dynamic"]
        {
            assert!(ok.parse::<Scheme>().expect(ok).validate(1).is_ok(), "{ok} on one rank");
        }
    }

    #[test]
    fn the_most_left_victim_skips_ranks_ahead_and_itself() {
        let mut v = Snapshot::new(0, 4);
        v.queues = vec![
            Queue { tag: 5, head: 0, tail: 40 }, // itself: never
            Queue { tag: 5, head: 2, tail: 6 },  // 4 left
            Queue { tag: 6, head: 0, tail: 9 },  // 9 left, but of iteration 6: ahead of 5
            Queue { tag: 4, head: 1, tail: 8 },  // 7 left, of iteration 4: behind, eligible
        ];
        assert_eq!(most_left(&v, 5).expect("view"), Some(3));
        let among = |ranks: &[usize], it| {
            best_queued(it, ranks.iter().map(|&r| (r, v.queues[r])), |_, q| Ok(f64::from(q.left())))
                .expect("view")
        };
        assert_eq!(among(&[1, 2], 5), Some(1));
        assert_eq!(most_left(&v, 6).expect("view"), Some(2), "from iteration 6, 6 is not ahead");
        v.queues[1].head = 6;
        v.queues[3].head = 8;
        assert_eq!(most_left(&v, 5).expect("view"), None);
    }
}
