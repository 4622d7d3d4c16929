//! The node barriers under the node combine ([`crate::sim::cost::CombineCosts`]): where the ranks
//! of a node wait for each other after the pull and after copying their update, and how a rank
//! goes on past them.

use super::{Ev, Sim, R};
use crate::sim::{CombineCosts, Nanos};

/// Where the ranks of a node wait for each other under the node combine
/// ([`super::cost::CombineCosts`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Stage {
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
    fn after(self, c: &CombineCosts) -> Nanos {
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
pub(super) enum Gate {
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
pub(super) struct Barrier {
    arrived: Vec<(usize, Nanos)>,
    latest: Nanos,
}

impl Sim<'_> {
    /// `r` reaches its node's barrier `stage` of its iteration at `at` (now or later): the
    /// barrier is released once every rank of the node still running has arrived.
    pub(super) fn arrive(&mut self, r: usize, stage: Stage, at: Nanos) -> R<()> {
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
    pub(super) fn through(&mut self, r: usize, stage: Stage, t: Nanos) -> bool {
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
    pub(super) fn leave(&mut self, r: usize, t: Nanos) -> R<()> {
        let node = self.s.net.node(r);
        self.node_done[node] += 1;
        let pending: Vec<_> = self.barriers.range((node, Stage::Pull, 0)..).map(|(k, _)| *k).collect();
        for key in pending.into_iter().take_while(|k| k.0 == node) {
            self.release(key, t)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::RankPhase;
    use super::*;
    use crate::inject::Pattern;
    use crate::sim::tests::config;
    use crate::sim::NodeCombine;

    /// The ranks whose `Compute` event comes past their node's barrier as `sim`'s queue runs out,
    /// every `Open` but `skip`'s handled, every other event dropped.
    fn computing(sim: &mut Sim<'_>, skip: usize) -> R<Vec<usize>> {
        let mut ranks = Vec::new();
        while let Some((t, ev)) = sim.q.pop() {
            match Ev::from(ev) {
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
        s.node_combine = NodeCombine::Auto;
        let plan = crate::engine::check(&s.cfg, s.ranks, s.rows)?;
        let (world, policies) = crate::sim::build(&s, &plan)?;
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
