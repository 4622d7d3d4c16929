//! Owner-side steps ([`super::params::Params::owner_steps`]): the gradient slots each rank (or,
//! node-combined, each node) puts its part of an iteration's gradient into at the owners, and the
//! owner's step of its shard split among its threads.

use std::ops::Range;

use peregrine_transport::{NodeLayout, ShardMap, Transport, Window};

use super::TrainError;
use crate::optim::{Gradient, Optimizer, Step};
use crate::pool::RankPool;

/// The parts of `ranges` within `to`, relative to its start (empty parts left out).
pub(super) fn clipped(ranges: &[Range<usize>], to: Range<usize>) -> impl Iterator<Item = Range<usize>> + '_ {
    ranges
        .iter()
        .map(move |r| r.start.max(to.start)..r.end.min(to.end))
        .filter(|r| !r.is_empty())
        .map(move |r| r.start - to.start..r.end - to.start)
}

/// The parameters each of a rank's threads steps, by `(thread, threads)` (global ranges).
pub(super) type Units<'a> = dyn Fn(usize, usize) -> Vec<Range<usize>> + Sync + 'a;

/// [`Params::step_owned`] by the threads of `pool`: thread `i` steps `units(i, threads)` within the
/// shard `mine` (`w`, the state `st` and the gradient `g` are the shard's; `g` has at most one
/// other rank's part).
pub(super) fn step_split(
    opt: Optimizer,
    step: Step,
    (w, st, g): (&mut [f32], &mut [f32], &Gradient<'_>),
    (pool, units): (&RankPool, &Units<'_>),
    mine: Range<usize>,
) {
    /// The shard's weights and state, shared by the threads, each stepping ranges of its own.
    struct Shard(*mut f32, *mut f32);
    // SAFETY: the threads write disjoint ranges ([`Model::units`] covers each parameter once).
    unsafe impl Sync for Shard {}
    let (n, k) = (w.len(), opt.slots());
    assert_eq!(st.len(), n * k, "step_split: the state is not {k} values per parameter");
    let shard = Shard(w.as_mut_ptr(), st.as_mut_ptr());
    let threads = pool.active();
    pool.run(|i| {
        let shard = &shard;
        let mut decayed = Vec::new();
        for Range { start: lo, end: hi } in clipped(&units(i, threads), mine.clone()) {
            // SAFETY: within the shard (clipped to it); this thread's own range (above).
            let (w, st) = unsafe {
                (
                    std::slice::from_raw_parts_mut(shard.0.add(lo), hi - lo),
                    std::slice::from_raw_parts_mut(shard.1.add(lo * k), (hi - lo) * k),
                )
            };
            let decay = g.decay.map(|(l2, ranges)| {
                decayed.clear();
                decayed.extend(clipped(ranges, lo..hi));
                (l2, &decayed[..])
            });
            let parts = if g.parts.is_empty() { g.parts } else { &g.parts[lo..hi] };
            let own = g.own.map(|o| &o[lo..hi]);
            opt.step_in_place(step, w, st, &Gradient { parts, own, scale: g.scale, decay });
        }
    });
}

/// The gradient of owner-side steps ([`Params::owner_steps`]): at each owner `r`, one slot as
/// long as `r`'s shard of the weights for every other rank, in rank order, where that rank `put`s
/// its contribution to the iteration's gradient of the shard. Each slot has one writer, so a
/// push is a plain put (an RDMA write where the network does it; no accumulate with its
/// target-side sum and lock), the owner never clears them (the next put overwrites), and it sums
/// them in rank order, the same sum whatever order the pushes landed in. A rank holds `world - 1`
/// slots of its shard: about one model's worth, beside its replica and its update.
pub(super) struct Slots {
    pub(super) win: Window<f32>,
    /// The weights' sharding.
    pub(super) map: ShardMap,
    pub(super) rank: usize,
    /// Node-combined ([`super::node`]): the slots are per node, not per rank.
    pub(super) nodes: Option<NodeLayout>,
    /// The model's L2 penalty ([`Model::decay`]), its ranges within this rank's shard: the step
    /// applies it, the chunks leave it out.
    pub(super) decay: Option<(f32, Vec<Range<usize>>)>,
}

impl Slots {
    /// Collective: allocates the slots for weights sharded as `map`; the step applies `decay`
    /// (global ranges).
    pub(super) fn alloc(
        t: &Transport,
        map: &ShardMap,
        decay: Option<(f32, Vec<Range<usize>>)>,
        nodes: Option<NodeLayout>,
    ) -> Result<Self, TrainError> {
        let others = nodes.as_ref().map_or(t.world_size(), NodeLayout::nodes) - 1;
        let lens = (0..t.world_size()).map(|r| map.len_of(r) * others);
        let win = t.alloc_window("gradient slots", &ShardMap::from_lens(lens))?;
        let mine = map.range(t.rank());
        let decay = decay.map(|(l2, ranges)| (l2, clipped(&ranges, mine).collect()));
        Ok(Self { win, map: map.clone(), rank: t.rank(), nodes, decay })
    }

    /// Node-combined: where this node's sum of `owner`'s shard goes at `owner` (this node's
    /// slot there, in the window's indices); `None` for an owner on this node (a rank combines
    /// only its own shard of its node's, which it steps itself).
    pub(super) fn node_slot(&self, owner: usize) -> Option<usize> {
        let layout = self.nodes.as_ref().expect("node-combined slots");
        let (from, to) = (layout.node(), layout.node_of(owner));
        let slot = match from.cmp(&to) {
            std::cmp::Ordering::Equal => return None,
            std::cmp::Ordering::Less => from,
            std::cmp::Ordering::Greater => from - 1,
        };
        Some(self.win.map().range(owner).start + slot * self.map.len_of(owner))
    }

    /// Puts `values` (the whole vector) into this rank's slot at every other owner, starting
    /// with the owner after this rank (ranks that push at once start at different owners), and
    /// completes the puts.
    pub(super) fn put(&self, values: &[f32]) -> Result<(), TrainError> {
        let world = self.map.parts();
        self.win.write_scope(|s| {
            for owner in (1..world).map(|i| (self.rank + i) % world).filter(|&r| self.map.len_of(r) > 0) {
                let slot = if self.rank < owner { self.rank } else { self.rank - 1 };
                let at = self.win.map().range(owner).start + slot * self.map.len_of(owner);
                s.put(at, &values[self.map.range(owner)])?;
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// Whether the optimizer steps at the owners ([`Params::owner_steps`]): under a synchronous
/// scheme, for a model pulled whole (not `replicated`, not `keyed`) that steps with a learning
/// rate, with an optimizer that keeps state and stores the weights themselves (FTRL derives them
/// from its state on every read: its ranks step with their shares).
pub(super) fn owner_steps_apply(
    synchronous: bool,
    replicated: bool,
    keyed: bool,
    stepped: bool,
    opt: Optimizer,
) -> bool {
    synchronous && !replicated && !keyed && stepped && opt.slots() > 0 && !opt.derived()
}
