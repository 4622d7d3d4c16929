//! A rank's iteration up to the end of its compute: opening it (hooks `begin`, `threads`,
//! `chunks`, `open`), the pull, and its threads taking, computing and counting chunks done (its
//! own, taken over, or copies).

use std::ops::Range;

use super::barriers::Stage;
use super::view::SimView;
use super::{Ev, Item, RankPhase, Sim, R};
use crate::engine::IterRecord;
use crate::scheme::{endgame, thread_share, OwnChunks, Take};
use crate::sim::cost::{nanos, ComputeModel};
use crate::sim::Nanos;
use crate::words;

impl Sim<'_> {
    /// Opens `r`'s next iteration (hooks `begin`, `threads`, `chunks`, `open`), announced and
    /// queued; the pull follows.
    pub(super) fn open(&mut self, r: usize, t: Nanos) -> R<()> {
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
    pub(super) fn compute(&mut self, r: usize, t: Nanos) -> R<()> {
        let rk = &mut self.ranks[r];
        rk.phase = RankPhase::Compute;
        rk.c1 = t;
        rk.iter_chunks = 0;
        rk.busy = 0;
        rk.busy_threads = 0;
        let leave = self.policies[r].leaves_chunks();
        rk.left = false;
        for thread in &mut rk.threads {
            thread.leave = leave;
        }
        self.start_threads(r, t, false)
    }

    /// Starts every active thread of `r` on its next item (copies if `copies`); if none found
    /// anything, the round is over at once.
    pub(super) fn start_threads(&mut self, r: usize, t: Nanos, copies: bool) -> R<()> {
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
                    // A chunk claimed first needs no look at whether it is settled (the claim
                    // fails then), as in the engine.
                    if mode != OwnChunks::ClaimFirst && self.policies[r].settled(r, tag, c)? {
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
                                (r, it, c..c + 1),
                            );
                        }
                        continue;
                    }
                    return self.start(r, th, t.saturating_add(extra), Item::OwnCopy(c), (r, it, c..c + 1));
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
                if let Some(item) = self.take(r, take, true, t.saturating_add(extra)) {
                    extra = extra.saturating_add(self.drained_by(r, take.rank));
                    let chunks = Self::chunks_of(&item);
                    return self.start(r, th, t.saturating_add(extra), item, chunks);
                }
                continue;
            }
            if self.ranks[r].threads[th].leave {
                if let Some((until, cost)) = self.end_game(r, t.saturating_add(extra))? {
                    self.ranks[r].threads[th].leave = false;
                    self.ranks[r].left = true;
                    let at = t.saturating_add(extra).saturating_add(cost);
                    return Ok(self.wait_for_takers(r, th, at, until));
                }
            }
            extra = extra.saturating_add(self.s.net.atomic(r, r));
            if let Some(range) = self.w.take_own(r, self.s.cfg.grain) {
                extra = extra.saturating_add(self.drained_by(r, r));
                let view = SimView::new(&self.w, r);
                let mode = self.policies[r].own_chunks(&view)?;
                extra = extra.saturating_add(self.charge(r, view.ops()));
                if mode == OwnChunks::Whole {
                    self.ranks[r].threads[th].own = Some((range.end..range.end, mode));
                    let chunks = (r, it, range.clone());
                    return self.start(r, th, t.saturating_add(extra), Item::Whole(range), chunks);
                }
                self.ranks[r].threads[th].own = Some((range, mode));
                continue;
            }
            // Out of own chunks: take over from the victim the policy names (it names only ranks
            // with chunks queued, so none is asked for when nothing is queued anywhere).
            if self.takes_over_now(r) && self.w.any_queued(it) {
                for _ in 0..self.w.world {
                    let view = SimView::new(&self.w, r);
                    let victim = self.policies[r].victim(&view, it)?;
                    extra = extra.saturating_add(self.charge(r, view.ops()));
                    let Some(take) = victim else { break };
                    extra = extra.saturating_add(self.s.net.atomic(r, take.rank));
                    if let Some(item) = self.take(r, take, false, t.saturating_add(extra)) {
                        extra = extra.saturating_add(self.drained_by(r, take.rank));
                        let chunks = Self::chunks_of(&item);
                        return self.start(r, th, t.saturating_add(extra), item, chunks);
                    }
                }
            }
            return Ok(false);
        }
    }

    /// Whether `r` takes over other ranks' chunks in its current iteration: with taking over,
    /// unless a thread of it left own chunks to free threads elsewhere (the engine's).
    pub(super) fn takes_over_now(&self, r: usize) -> bool {
        self.steal && !self.ranks[r].left
    }

    /// The end game ([`endgame`]) for a thread of `r` about to take one of its own chunks at `t`:
    /// until when it leaves them to free threads elsewhere, and what surveying the other ranks
    /// cost (once an iteration); `None` to take the chunk now.
    fn end_game(&mut self, r: usize, t: Nanos) -> R<Option<(Nanos, Nanos)>> {
        let rk = &self.ranks[r];
        let rank = endgame::Rank {
            now: t.saturating_sub(rk.c1) as f64 * 1e-9,
            chunks: rk.iter_chunks,
            busy: rk.busy as f64 * 1e-9,
            threads: self.s.max_threads(),
            others: self.w.world - 1,
        };
        let (it, words, mut state) = (rk.it, &self.w.ranks[r], rk.end_game);
        let mut surveyed = None;
        let until = state.leave(
            it,
            &rank,
            || Ok(words.queue.left()),
            || {
                let view = SimView::new(&self.w, r);
                let survey = endgame::survey(&view, it, words.progress.total)?;
                surveyed = Some(view.ops());
                Ok((survey, words.progress.total))
            },
        )?;
        self.ranks[r].end_game = state;
        let cost = surveyed.map_or(0, |ops| self.charge(r, ops));
        Ok(until.map(|until| (self.ranks[r].c1.saturating_add(nanos(until)), cost)))
    }

    /// Thread `th` of `r` leaves its rank's next chunks to free threads elsewhere from `at` until
    /// `until`, then takes what they left.
    fn wait_for_takers(&mut self, r: usize, th: usize, at: Nanos, until: Nanos) -> bool {
        let thread = &mut self.ranks[r].threads[th];
        thread.gen = thread.gen.wrapping_add(1);
        thread.item = Some(Item::Leave);
        thread.started = at;
        thread.end = until.max(at);
        thread.compute_end = thread.end;
        self.q.push(thread.end, Ev::Thread(r, th, thread.gen));
        true
    }

    /// `victim`'s queue was taken from at `t`: if that emptied it, its threads that left their
    /// chunks to free threads ([`Item::Leave`]) see it at their next poll and go on.
    fn emptied(&mut self, victim: usize, t: Nanos) {
        if !self.ranks[victim].left || self.w.ranks[victim].queue.left() > 0 {
            return;
        }
        let at = t.saturating_add(self.s.net.atomic(victim, victim));
        for th in 0..self.ranks[victim].threads.len() {
            let thread = &mut self.ranks[victim].threads[th];
            if matches!(thread.item, Some(Item::Leave)) && at < thread.end {
                thread.gen = thread.gen.wrapping_add(1);
                thread.end = at;
                thread.compute_end = at;
                self.q.push(at, Ev::Thread(victim, th, thread.gen));
            }
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
                (owner, it, chunk..chunk + 1),
            );
        }
    }

    /// Takes the chunks `take` names from its victim's queue for one thread of `r` (in its current
    /// iteration) at `t` (the victim's threads waiting in the end game see it if that emptied it).
    fn take(&mut self, r: usize, take: Take, reassigned: bool, t: Nanos) -> Option<Item> {
        let it = self.ranks[r].it;
        let fraction = thread_share(take.share, self.s.cfg.steal_fraction, self.ranks[r].active);
        let (g, chunks) = self.w.steal(take.rank, fraction)?;
        self.emptied(take.rank, t);
        Some(Item::Help { victim: take.rank, vit: words::untag(g, it), chunks, reassigned })
    }

    /// The chunks `(owner, owner's iteration, chunks)` of a take-over.
    fn chunks_of(item: &Item) -> (usize, u64, Range<u32>) {
        match item {
            Item::Help { victim, vit, chunks, .. } => (*victim, *vit, chunks.clone()),
            _ => (0, 0, 0..0),
        }
    }

    /// Starts `item` on thread `th` of `r` at `t`: the compute of its chunks (`owner`'s `chunks`
    /// of the owner's iteration `cit`), then the injected delay.
    fn start(
        &mut self,
        r: usize,
        th: usize,
        t: Nanos,
        item: Item,
        chunks: (usize, u64, Range<u32>),
    ) -> R<bool> {
        let rk = &self.ranks[r];
        let slowdown = match &self.s.compute {
            ComputeModel::Replay(_) => 1.0,
            _ => self.s.cfg.inject.slowdown(r, t as f64 * 1e-9, self.s.max_threads()),
        };
        let mut compute = 0.0;
        let (owner, cit, chunks) = chunks;
        for c in chunks {
            let g = self.global_chunk(owner, cit, c);
            compute += self.s.compute.chunk(r, rk.it, cit, g);
        }
        let compute = nanos(compute * slowdown);
        let delay = nanos(compute as f64 * 1e-9 * rk.delay);
        // Copies of other ranks' chunks are few (a chunk is copied once); the owner's own copy
        // of each of its chunks is found among its threads when the chunk is claimed.
        if let Item::Copy { owner, chunk } = item {
            let gen = self.ranks[r].threads[th].gen.wrapping_add(1);
            self.copying.entry((owner, chunk)).or_default().push((r, th, gen));
        }
        let thread = &mut self.ranks[r].threads[th];
        thread.gen = thread.gen.wrapping_add(1);
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
    pub(super) fn thread_done(&mut self, r: usize, th: usize, t: Nanos) -> R<()> {
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
                completed.extend(self.copy_done(r, r, c, t)?);
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
                completed.extend(self.copy_done(r, owner, chunk, t)?);
                1
            }
            // Not busy while waiting: on to what the free threads left (if they left any, the
            // end game pauses).
            Item::Leave => {
                let backoff = &mut self.ranks[r].end_game.backoff;
                if self.w.ranks[r].queue.left() > 0 {
                    backoff.missed(it);
                } else {
                    backoff.answered();
                }
                return self.next_item(r, th, t);
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
        self.next_item(r, th, t)
    }

    /// Thread `th` of `r`, free at `t`, starts its next item, or is done with the round.
    fn next_item(&mut self, r: usize, th: usize, t: Nanos) -> R<()> {
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
    /// on a thread of `r` at `t`: applied if it claims the chunk first (then the other copies'
    /// delays stop), dropped if not. Returns the iteration the chunk completed, if it did (with
    /// the time until that is seen: [`Sim::done`]).
    fn copy_done(&mut self, r: usize, owner: usize, chunk: u32, t: Nanos) -> R<Option<(u64, Nanos)>> {
        let it = self.ranks[r].it;
        if !self.policies[r].claim(owner, words::tag(it), chunk)? {
            // Claimed before (and its copies settled then), or its iteration is over.
            self.copiers(owner, chunk);
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

    /// Takes the copies of `owner`'s chunk `chunk` by other ranks out of the map of copies (its
    /// hashing skipped while the map is empty, as it is for most chunks).
    fn copiers(&mut self, owner: usize, chunk: u32) -> Option<Vec<super::Copier>> {
        if self.copying.is_empty() {
            return None;
        }
        self.copying.remove(&(owner, chunk))
    }

    /// `owner`'s chunk `chunk` was claimed at `t`: the other copies' injected delays stop there
    /// (their compute cannot be cut short). A copy whose thread has moved on since (its item's
    /// generation is not the one it started with) is skipped: finished copies are not removed
    /// one by one, which with thousands of copies of one chunk was quadratic.
    fn settle(&mut self, owner: usize, chunk: u32, t: Nanos) {
        // The owner's thread computing it as its own copy (it started before any other copy).
        let own = self.ranks[owner].threads.iter().enumerate().find_map(|(th, thread)| {
            matches!(thread.item, Some(Item::OwnCopy(c)) if c == chunk).then_some((owner, th, thread.gen))
        });
        let others = self.copiers(owner, chunk);
        for (r, th, gen) in own.into_iter().chain(others.into_iter().flatten()) {
            let thread = &mut self.ranks[r].threads[th];
            if thread.gen != gen {
                continue;
            }
            let at = thread.compute_end.max(t);
            if at < thread.end {
                thread.end = at;
                thread.gen = thread.gen.wrapping_add(1);
                self.q.push(at, Ev::Thread(r, th, thread.gen));
            }
        }
    }
}
