//! A rank's iteration from the end of its compute: lining up, the push (hook `admit`), the tick
//! (hooks `before_tick`, `after_tick`), the wait for `ready` and the close (hook `end`).

use std::time::Duration;

use peregrine_transport::Ops;

use super::barriers::Stage;
use super::view::SimView;
use super::{Ev, RankPhase, Sim, R};
use crate::sim::Nanos;

impl Sim<'_> {
    /// Every busy thread of `r` is idle: the compute phase, or a round of lining up, is over.
    pub(super) fn round_over(&mut self, r: usize, t: Nanos) -> R<()> {
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
    pub(super) fn line_up(&mut self, r: usize, t: Nanos) -> R<()> {
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
        if self.takes_over_now(r) && self.w.stealable_near(r, it) {
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
            self.look(r);
            if self.policies[r].copy_due(&view, it, t >= due_at)? {
                let rk = &mut self.ranks[r];
                rk.phase = RankPhase::LineHelp { copies: true };
                rk.help_start = t;
                return self.start_threads(r, t, true);
            }
            self.unlooked(r);
            // Polled again: copies become due with time and with the others' rates. One poll
            // pending at a time: a rank woken again while one is pending (each rank's opening
            // wakes the ranks lining up) would start a second chain of polls, and at 80 ranks
            // the chains filled the event queue.
            let poll = (rk.per_chunk / 2).max(5_000);
            if !rk.polling {
                self.q.push(due_at.max(t.saturating_add(poll)), Ev::Check(r));
                self.ranks[r].polling = true;
            }
        }
        self.ranks[r].phase = RankPhase::LineWait;
        self.lined.entry(it).or_default().push(r);
        Ok(())
    }

    /// Ranks lining up for `it` look again (its chunks are all done, or some were queued).
    pub(super) fn wake_lined(&mut self, it: u64, t: Nanos) -> R<()> {
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
    pub(super) fn pushed(&mut self, r: usize, t: Nanos) -> R<()> {
        let it = self.ranks[r].it;
        let view = SimView::new(&self.w, r);
        let busy = Duration::from_nanos(self.ranks[r].busy);
        let rec = &mut self.ranks[r].rec;
        rec.busy = busy.as_secs_f64() / rec.threads.max(1) as f64;
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
    pub(super) fn ticked(&mut self, r: usize, t: Nanos) -> R<()> {
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
        self.look(r);
        if !self.policies[r].ready(&view, it)? {
            self.unlooked(r);
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
