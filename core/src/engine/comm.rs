//! Pulls and pushes: the parameters a rank reads before computing, and its update after.

use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::params::{keyed, PullKeys};
use super::run::Run;
use super::{IterRecord, TrainError};
use crate::model::{Delta, Model};

impl<M: Model> Run<'_, M> {
    /// Whether pulls read only the keys of the chunks (else the whole model, or this rank's
    /// whole replica).
    pub(super) fn keyed(&self) -> bool {
        keyed(self.model, self.cfg, self.params.replicated())
    }

    /// Pulls what this rank's chunks of `it` read into `replica`: all of a dense model (or a
    /// small sparse one) with its optimizer state (into `state`), the chunks' keys of a sparse
    /// one.
    pub(super) fn pull_into(
        &self,
        it: u64,
        keys: &mut PullKeys,
        ranges: &mut Vec<Range<usize>>,
        data: &mut Vec<f32>,
        (replica, state): (&mut [f32], &mut Vec<f32>),
        rec: &mut IterRecord,
    ) -> Result<(), TrainError> {
        let started = Instant::now();
        // An iteration whose chunks put new values (MF's rounds of block pieces, each chunk's
        // rows its own) always reads just its keys, whatever the other iterations found: they
        // are the few kept with each slot of the layout, a rank's share of the rows (in runs,
        // MF's bands), and the rows it does not read stay where the other ranks' puts will
        // write them. MF on MovieLens-100k, 2 ranks: those iterations' pull 21 -> 18 us and
        // push 14 -> 7 us, against reading the whole model as the iterations before said.
        let values = self.values.load(Ordering::Relaxed);
        if self.params.owner_steps() {
            // The owners step: the state stays where it lives.
            self.params.get_all(replica)?;
        } else if !self.keyed() {
            self.params.get_all_with_state(replica, state)?;
        } else if !values && keys.skip() {
            self.params.get_all(replica)?;
        } else {
            keys.set.clear();
            self.own_keys(it, &mut keys.set);
            let whole = self.params.pull_keys(self.model.layout(), &mut keys.set, ranges, data, replica)?;
            if !values {
                keys.saw(whole);
            }
        }
        rec.comm += started.elapsed().as_secs_f64();
        Ok(())
    }

    /// Where the chunks may read the weights in place: whether iteration `it` copies the whole
    /// model instead ([`PullKeys::copy_whole`], from the keys of this rank's own chunks).
    pub(super) fn copy_whole(&self, it: u64, keys: &mut PullKeys) -> bool {
        keys.copy_whole(|set| {
            self.own_keys(it, set);
            super::params::read_whole(set.runs(), set.len(), self.model.layout(), true)
        })
    }

    /// Adds the keys of this rank's own chunks of `it` to `set`.
    fn own_keys(&self, it: u64, set: &mut crate::model::KeySet) {
        let part = self.own.lock().expect("own chunks").clone();
        for g in part {
            self.model.keys(self.plan.global_chunk_rows(it, g), set);
        }
    }

    /// Sums every thread's update, times `scale`, into `delta`, and the threads' counts into
    /// `rec`.
    pub(super) fn drain(&self, scale: f32, delta: &mut Delta, rec: &mut IterRecord) {
        delta.discard();
        for (w, s) in self.slots.iter().enumerate() {
            let mut s = s.lock().expect("a compute thread panicked");
            let s = &mut *s;
            // A team's members compute into the leader's buffers (theirs hold no gradient).
            if w == 0 || self.team.is_none() {
                self.model.drain(&mut s.work, scale, delta);
            }
            rec.own += std::mem::take(&mut s.own);
            rec.taken += std::mem::take(&mut s.taken);
            rec.rows += std::mem::take(&mut s.rows);
            rec.loss += std::mem::take(&mut s.loss);
            rec.reassigned += std::mem::take(&mut s.reassigned);
            rec.cloned += std::mem::take(&mut s.cloned);
            rec.discarded += std::mem::take(&mut s.discarded);
            for (v, n) in s.taken_from.drain(..) {
                match rec.taken_from.iter_mut().find(|(w, _)| *w == v) {
                    Some((_, k)) => *k += n,
                    None => rec.taken_from.push((v, n)),
                }
            }
            if let Some(sp) = s.spec.as_mut() {
                delta.add_scaled(&sp.won, scale);
                sp.won.clear();
            }
        }
    }
}
