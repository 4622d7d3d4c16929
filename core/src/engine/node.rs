//! Node-combined communication: the ranks of one node share one copy of a dense model and add
//! their updates up on the node before anything crosses the network, so that what crosses it per
//! iteration grows with nodes, not ranks.
//!
//! The weights stay sharded over every rank as they are without it (node `n` holds its ranks'
//! consecutive shards). Rank `i` of a node of `k` ranks *combines* the shards `(n, j)` of every
//! node `n` with `j % k == i` (with equal nodes: the shard of its own index on every node), and
//! per iteration:
//! 1. **pull**: reads those shards, one pipelined get per owner, into the node's copy
//!    ([`NodeShared`]), then the node barrier; every rank of the node then computes on the whole
//!    copy in place, with no pull of its own;
//! 2. **push**: writes its update into its slot of the node's update block, the node barrier,
//!    then adds the node's slots up over the shards it combines, in local-rank order (the same
//!    sum whoever adds), and sends each shard's sum to its owner as soon as it is summed (the
//!    send crosses the network while the next shard is summed): an accumulate into the weights,
//!    or, where the owners step ([`super::params`]), a put into the owner's slot for this node,
//!    which the owner steps with once every node's has landed. Its own shard's sum stays here
//!    for its own step.
//!
//! A rank then moves `2 * P / k` values over `2 * (nodes - 1)` operations between nodes per
//! iteration, where alone it moves `2 * P` over `2 * (world - 1)`.
//!
//! What keeps the shared blocks race free: a rank writes the copy's ranges of its own shards at
//! its pull, after the barrier of the previous push (which every rank of the node reaches only
//! once its chunks are done: nobody still reads the old copy), and nobody reads the copy before
//! the pull's barrier; a rank writes its own update slot only after the pull's barrier (every
//! rank of the node has summed the previous slots: they sum before they tick and pull), and
//! reads other slots, at its own shards' ranges only, after the push's barrier. It needs every
//! rank of a node to run the same iterations and push at each: a synchronous scheme
//! ([`crate::scheme::Policy::synchronous`]) without copies of chunks; [`applies`] says where.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use peregrine_transport::{NodeLayout, NodeShared, ShardMap, Transport, Window};

use super::TrainError;

/// Whether the node-combined pulls and pushes apply: asked (`wanted`), a scheme that runs every
/// rank through every iteration in step and pushes at each (`synchronous`), one model sharded
/// over all (not `replicated`), pulled whole (not `keyed`), each push either linear in the rows'
/// gradients (no optimizer step at the pushing rank: `stepless`) or stepped at the owners
/// (`owner_steps`); and nodes to combine across: more than one, some with several ranks. (Where
/// it applies, the iterations whose chunks touch disjoint keys push changes, not new values:
/// a node's sum is of changes.)
pub(super) fn applies(
    wanted: bool,
    synchronous: bool,
    (replicated, keyed): (bool, bool),
    (stepless, owner_steps): (bool, bool),
    layout: Option<&NodeLayout>,
) -> bool {
    wanted
        && synchronous
        && !replicated
        && !keyed
        && (stepless || owner_steps)
        && layout.is_some_and(|l| l.nodes() > 1 && l.shares_nodes())
}

/// How a rank waits for its node's barrier: polls the function it is given until it says yes,
/// or until the run stops (an evaluation said so: the other ranks of the node may then have
/// left without coming to this barrier), doing the rank's other duties meanwhile (joining
/// evaluations).
pub(super) type Wait<'a> =
    dyn FnMut(&mut dyn FnMut() -> Result<bool, TrainError>) -> Result<(), TrainError> + 'a;

/// Enters the node barrier of `block` and waits for it: `false` if the wait ended without it
/// (the run stops).
fn barrier(block: &NodeShared<f32>, wait: &mut Wait<'_>) -> Result<bool, TrainError> {
    let ticket = block.arrive();
    wait(&mut || Ok(block.arrived(ticket)?))?;
    Ok(block.arrived(ticket)?)
}

/// A rank's part in its node's combined communication.
pub(super) struct Combiner {
    layout: NodeLayout,
    /// The node's copy of the weights.
    copy: NodeShared<f32>,
    /// The node's ranks' updates, `local_size` vectors of `params`.
    slots: NodeShared<f32>,
    /// The shards this rank combines, in rank order: global range and owner.
    shards: Vec<(Range<usize>, usize)>,
    /// The same ranges.
    ranges: Vec<Range<usize>>,
    /// Their node's sums, back to back (and the pull's buffer).
    sum: Mutex<Vec<f32>>,
    params: usize,
    rank: usize,
}

impl Combiner {
    /// Collective: the node blocks for a model of `params` values sharded as `map`; `None` on
    /// every rank where some node has none (see [`Transport::alloc_node_shared`]).
    pub(super) fn start(t: &Transport, map: &ShardMap, params: usize) -> Result<Option<Self>, TrainError> {
        let Some(layout) = t.node_layout() else { return Ok(None) };
        let Some(copy) = t.alloc_node_shared::<f32>("weights", params)? else { return Ok(None) };
        let Some(slots) = t.alloc_node_shared::<f32>("updates", params * layout.local_size())? else {
            return Ok(None);
        };
        let (i, k) = (layout.local(), layout.local_size());
        let shards: Vec<(Range<usize>, usize)> = (0..layout.nodes())
            .flat_map(|n| layout.ranks(n).enumerate().filter(move |(j, _)| j % k == i).map(|(_, r)| r))
            .map(|r| (map.range(r), r))
            .filter(|(range, _)| !range.is_empty())
            .collect();
        let ranges = shards.iter().map(|(r, _)| r.clone()).collect();
        Ok(Some(Self {
            layout,
            copy,
            slots,
            shards,
            ranges,
            sum: Mutex::new(Vec::new()),
            params,
            rank: t.rank(),
        }))
    }

    /// The node layout.
    pub(super) fn layout(&self) -> &NodeLayout {
        &self.layout
    }

    /// Pulls this rank's shards of `w` into the node's copy and waits for the node's other ranks
    /// to pull theirs: the whole model, to read in place until this rank's next
    /// [`offer`](Self::offer); `None` if the run stops meanwhile.
    ///
    /// # Safety
    /// The slice must not be used after this rank's next offer begins (the other ranks of the
    /// node then pull the next iteration's weights into it).
    pub(super) unsafe fn pull(
        &self,
        w: &Window<f32>,
        wait: &mut Wait<'_>,
    ) -> Result<Option<&[f32]>, TrainError> {
        let mut buf = self.sum.lock().expect("the node sum");
        buf.resize(self.ranges.iter().map(Range::len).sum(), 0.0);
        w.get_batch(&self.ranges, &mut buf)?;
        let mut off = 0;
        for r in &self.ranges {
            // SAFETY: within the copy (a range of the weights); this rank's own shards, which no
            // other rank of the node writes, and nobody reads before the barrier below (the
            // module's protocol).
            let to = unsafe { std::slice::from_raw_parts_mut(self.copy.as_ptr().add(r.start), r.len()) };
            to.copy_from_slice(&buf[off..off + r.len()]);
            off += r.len();
        }
        drop(buf);
        if !barrier(&self.copy, wait)? {
            return Ok(None);
        }
        // SAFETY: the whole copy, written by the node's ranks before the barrier and by nobody
        // until this rank's next push (the caller's contract).
        Ok(Some(unsafe { std::slice::from_raw_parts(self.copy.as_ptr(), self.params) }))
    }

    /// Offers this rank's `update` (all `params` values; `None`: nothing to add) to the node's
    /// sum: writes it into this rank's slot and waits for the node's other ranks to write
    /// theirs; `false` if the run stops meanwhile. [`sum_shards`](Self::sum_shards) then adds
    /// the slots up.
    pub(super) fn offer(&self, update: Option<&[f32]>, wait: &mut Wait<'_>) -> Result<bool, TrainError> {
        let (p, i) = (self.params, self.layout.local());
        {
            // SAFETY: this rank's own slot (within the slots block of `k` vectors of `p`), which
            // nobody else touches until the barrier below (the module's protocol).
            let mine = unsafe { std::slice::from_raw_parts_mut(self.slots.as_ptr().add(i * p), p) };
            match update {
                Some(u) if u.len() == p => mine.copy_from_slice(u),
                _ => mine.fill(0.0),
            }
        }
        barrier(&self.slots, wait)
    }

    /// The buffer of the node's sums of this rank's shards, back to back, for
    /// [`sum_shards`](Self::sum_shards) to fill (as long as they are).
    pub(super) fn sums(&self) -> MutexGuard<'_, Vec<f32>> {
        let mut sum = self.sum.lock().expect("the node sum");
        sum.resize(self.ranges.iter().map(Range::len).sum(), 0.0);
        sum
    }

    /// After an [`offer`](Self::offer) that every rank of the node made: adds the node's slots
    /// up over each of this rank's shards in turn, in local-rank order (the same sum whoever
    /// adds), into its part of `out` (from [`sums`](Self::sums)), and hands that part to `send`
    /// at once: the send of one shard's sum (a nonblocking one-sided write) crosses the network
    /// while the next shard is summed, instead of every send waiting for the whole sum.
    pub(super) fn sum_shards<'d, E>(
        &self,
        out: &'d mut [f32],
        mut send: impl FnMut(&(Range<usize>, usize), &'d [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        let (p, k) = (self.params, self.layout.local_size());
        let slot = |l: usize, r: &Range<usize>| {
            // SAFETY: slot `l` at one of this rank's own shards (within the slots block of `k`
            // vectors of `p`): read only, by this rank alone, after the offers' barrier (each
            // rank reads the slots at its own shards).
            unsafe { std::slice::from_raw_parts(self.slots.as_ptr().add(l * p + r.start), r.len()) }
        };
        let mut rest = out;
        for shard in &self.shards {
            let r = &shard.0;
            let (sum, tail) = std::mem::take(&mut rest).split_at_mut(r.len());
            rest = tail;
            sum.copy_from_slice(slot(0, r));
            for l in 1..k {
                sum.iter_mut().zip(slot(l, r)).for_each(|(s, x)| *s += x);
            }
            send(shard, sum)?;
        }
        Ok(())
    }

    /// This rank's own shard's node sum from the last [`sum_shards`](Self::sum_shards) (empty if
    /// it has none), passed to `f`.
    pub(super) fn own_sum<R>(&self, f: impl FnOnce(&[f32]) -> R) -> R {
        let sum = self.sum.lock().expect("the node sum");
        let mut off = 0;
        for (r, owner) in &self.shards {
            if *owner == self.rank {
                return f(&sum[off..off + r.len()]);
            }
            off += r.len();
        }
        f(&[])
    }
}
