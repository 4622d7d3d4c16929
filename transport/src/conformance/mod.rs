//! The conformance suite: what every backend must do, as SPMD cases that check their own results.
//!
//! Each case is run by every rank of a world (threads under `cargo test` for `local`, processes
//! under `mpirun -n 2|4` for `mpi`: see `tests/`) and returns an error naming the rank and what
//! was wrong. [`run_all`] runs them in order, with a barrier between cases.
//!
//! The cases live in submodules by what they check: `collectives`, `rma` (single-range gets,
//! puts and accumulates), `batches` (batched and positioned ranges), `in_place` (own shards,
//! shared and direct windows, a window stepped with its state), `atomics` and `bad_use`. This module holds what they share and
//! the runner.

mod atomics;
mod bad_use;
mod batches;
mod collectives;
mod in_place;
mod rma;

use std::time::{Duration, Instant};

use crate::{Error, ErrorKind, ShardMap, Transport};
use atomics::{
    cas_election, cas_spin_lock, fetch_add_tickets, load_batch_everywhere, owner_waits, swap_chain,
};
use bad_use::bad_use;
use batches::{
    batches_between_shards, batches_inside_one_shard, positioned_batches_direct, positioned_batches_plain,
};
use collectives::collectives;
use in_place::{direct_window, own_shard_in_place, stepped_with_state, whole_in_place};
use rma::{accumulate_everywhere, uneven_shards};

pub use rma::FromSmall;

/// How a case failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// A transport call failed where it should have worked.
    #[error(transparent)]
    Transport(#[from] Error),
    /// A result was wrong.
    #[error("rank {rank}: {detail}")]
    Check {
        /// The rank that saw it.
        rank: usize,
        /// What was expected and what came.
        detail: String,
    },
}

type Outcome = std::result::Result<(), Failure>;

/// The kind of a result's error, if any.
fn kind<T>(r: crate::Result<T>) -> Option<ErrorKind> {
    r.err().map(Error::into_kind)
}

macro_rules! ensure {
    ($t:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failure::Check { rank: $t.rank(), detail: format!($($fmt)+) });
        }
    };
}
// Imported by path (`use super::ensure`) in the submodules of cases.
use ensure;

/// Sizes of the suite's loops.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// `fetch_add` calls per rank on the shared counter.
    pub tickets_per_rank: usize,
    /// Rounds of the compare-and-swap election.
    pub election_rounds: usize,
    /// Critical sections per rank under the compare-and-swap spin lock.
    pub lock_sections: usize,
    /// Whether a window from [`Transport::alloc_shared_window`] must be readable whole in place
    /// ([`Window::whole_in_place`]: MPI processes on one node with shared windows), must not be,
    /// or (`None`) either.
    ///
    /// [`Window::whole_in_place`]: crate::Window::whole_in_place
    pub whole_in_place: Option<bool>,
}

impl Default for Params {
    fn default() -> Self {
        Self { tickets_per_rank: 100_000, election_rounds: 200, lock_sections: 200, whole_in_place: None }
    }
}

/// A named case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Short name, printed in reports.
    pub name: &'static str,
    /// The case; every rank calls it.
    pub run: fn(&Transport, &Params) -> Outcome,
}

/// Every case, in the order [`run_all`] runs them.
pub const CASES: &[Case] = &[
    Case { name: "collectives", run: collectives },
    Case { name: "uneven-shards-crossing-ranges", run: uneven_shards },
    Case { name: "batches-back-and-forth-between-shards", run: batches_between_shards },
    Case { name: "batches-inside-one-shard", run: batches_inside_one_shard },
    Case { name: "own-shard-in-place", run: own_shard_in_place },
    Case { name: "shared-window-read-whole-in-place", run: whole_in_place },
    Case { name: "accumulate-everywhere-f32", run: accumulate_everywhere::<f32> },
    Case { name: "accumulate-everywhere-f64", run: accumulate_everywhere::<f64> },
    Case { name: "accumulate-everywhere-u64", run: accumulate_everywhere::<u64> },
    Case { name: "fetch-add-tickets", run: fetch_add_tickets },
    Case { name: "compare-and-swap-election", run: cas_election },
    Case { name: "compare-and-swap-spin-lock", run: cas_spin_lock },
    Case { name: "owner-waits-on-its-own-shard", run: owner_waits },
    Case { name: "swap-chain-and-load", run: swap_chain },
    Case { name: "load-batch-of-every-rank", run: load_batch_everywhere },
    Case { name: "positioned-batches-of-many-ranges", run: positioned_batches_plain },
    Case { name: "positioned-batches-on-a-direct-window", run: positioned_batches_direct },
    Case { name: "direct-window-accumulates-and-atomics", run: direct_window },
    Case { name: "direct-window-stepped-with-its-state", run: stepped_with_state },
    Case { name: "bad-use-is-an-error", run: bad_use },
];

/// Result of one case on this rank.
#[derive(Debug)]
pub struct CaseReport {
    /// The case's name.
    pub name: &'static str,
    /// Wall time on this rank.
    pub elapsed: Duration,
    /// What happened.
    pub outcome: Outcome,
}

impl CaseReport {
    /// One report line: `ok   <case> <ms> (<ranks> ranks, <backend>)` or `FAIL <case> <error>`.
    pub fn line(&self, t: &Transport) -> String {
        match &self.outcome {
            Ok(()) => format!(
                "ok   {:<32} {:>9.3} ms  ({} ranks, {})",
                self.name,
                self.elapsed.as_secs_f64() * 1e3,
                t.world_size(),
                t.backend()
            ),
            Err(e) => format!("FAIL {:<32} {e}", self.name),
        }
    }
}

/// The line rank 0 prints after every case passed.
pub fn summary_line(t: &Transport) -> String {
    format!("conformance: all cases passed on {} ranks ({})", t.world_size(), t.backend())
}

/// Runs one case on this rank (collective), then a barrier.
pub fn run_case(t: &Transport, case: &Case, params: &Params) -> CaseReport {
    let start = Instant::now();
    let outcome = (case.run)(t, params).and_then(|()| Ok(t.barrier()?));
    CaseReport { name: case.name, elapsed: start.elapsed(), outcome }
}

/// Runs every case on this rank (collective), and calls `report` after each. Stops at the first
/// failure, since peers may then be stuck in a different collective.
pub fn run_all(t: &Transport, params: &Params, mut report: impl FnMut(&CaseReport)) -> Outcome {
    for case in CASES {
        let r = run_case(t, case, params);
        report(&r);
        r.outcome?;
    }
    Ok(())
}

/// An uneven map with an empty shard; value at global index `i`.
fn uneven_map(n: usize) -> ShardMap {
    ShardMap::from_lens((0..n).map(|r| if r == 1 { 0 } else { 5 + 7 * r + 3 * (r % 2) }))
}

fn pattern(i: usize) -> f64 {
    (i * i) as f64 * 0.25 + 1.0
}
