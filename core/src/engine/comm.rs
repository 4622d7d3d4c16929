//! Pulls and pushes: the parameters a rank reads before computing, and its update after.

use std::ops::Range;
use std::time::Instant;

use peregrine_transport::Window;

use super::run::Run;
use super::{IterRecord, TrainError};
use crate::model::{Delta, KeySet, Layout, Model};

impl<M: Model> Run<'_, M> {
    /// Whether pulls read only the keys of the chunks (else the whole model).
    pub(super) fn keyed(&self) -> bool {
        self.model.sparse() && self.model.layout().params > self.cfg.dense_pull_below
    }

    /// Pulls what this rank's chunks of `it` read into `replica`: all of a dense model (or a
    /// small sparse one), the chunks' keys of a sparse one.
    pub(super) fn pull_into(
        &self,
        it: u64,
        keys: &mut KeySet,
        ranges: &mut Vec<Range<usize>>,
        data: &mut Vec<f32>,
        replica: &mut [f32],
        rec: &mut IterRecord,
    ) -> Result<(), TrainError> {
        let c0 = Instant::now();
        if self.keyed() {
            let part = self.own.lock().expect("own chunks").clone();
            keys.clear();
            for g in part {
                self.model.keys(self.plan.global_chunk_rows(it, g), keys);
            }
            pull_keys(&self.params, self.model.layout(), keys, ranges, data, replica)?;
        } else {
            self.params.get(0, replica)?;
        }
        rec.comm += c0.elapsed().as_secs_f64();
        Ok(())
    }

    /// Sums every thread's update, times `scale`, into `delta`, and the threads' counts into
    /// `rec`.
    pub(super) fn drain(&self, scale: f32, delta: &mut Delta, rec: &mut IterRecord) {
        delta.clear();
        for s in &self.slots {
            let mut s = s.lock().expect("a compute thread panicked");
            let s = &mut *s;
            self.model.drain(&mut s.work, scale, delta);
            rec.own += std::mem::take(&mut s.own);
            rec.taken += std::mem::take(&mut s.taken);
            rec.rows += std::mem::take(&mut s.rows);
            rec.loss += std::mem::take(&mut s.loss);
            rec.reassigned += std::mem::take(&mut s.reassigned);
            rec.cloned += std::mem::take(&mut s.cloned);
            rec.discarded += std::mem::take(&mut s.discarded);
            if let Some(sp) = s.spec.as_mut() {
                delta.add_scaled(&sp.won, scale);
                sp.won.clear();
            }
        }
    }

    /// Accumulates `delta` into the owning shards: only the touched keys (a dense model's one key
    /// is all of it), or all of the update, zeros included, when they are too [`scattered`].
    pub(super) fn push_delta(
        &self,
        delta: &mut Delta,
        ranges: &mut Vec<Range<usize>>,
        data: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        delta.ranges(ranges, data);
        if ranges.len() > 1 && scattered(ranges, delta.layout().params) {
            self.params.accumulate(0, delta.values())?;
        } else {
            self.params.accumulate_batch(ranges, data)?;
        }
        Ok(())
    }
}

/// Whether `ranges` are so many that moving all `params` elements costs less: one small one-sided
/// operation costs about as much as moving 512 elements (~100-200 ns against 10-20 GB/s; measured
/// on MF, where 128 and 32 were no better). On a 1M-feature Zipf dataset a 50,000-row batch
/// touches ~100k scattered weights: one 4 MB get instead of 100k gets.
pub(super) fn scattered(ranges: &[Range<usize>], params: usize) -> bool {
    ranges.len().saturating_mul(ELEMENTS_PER_OPERATION) >= params
}

/// Elements one small one-sided operation costs as much as moving (see [`scattered`]).
const ELEMENTS_PER_OPERATION: usize = 512;

/// Reads the parameters of `keys` from `params` into the same positions of `into` (or all of
/// them, when the keys are too [`scattered`]).
pub(super) fn pull_keys(
    params: &Window<f32>,
    layout: Layout,
    keys: &mut KeySet,
    ranges: &mut Vec<Range<usize>>,
    buf: &mut Vec<f32>,
    into: &mut [f32],
) -> Result<(), TrainError> {
    keys.ranges(layout, ranges);
    if scattered(ranges, layout.params) {
        return Ok(params.get(0, into)?);
    }
    let n = ranges.iter().map(|r| r.len()).sum();
    buf.resize(n, 0.0);
    params.get_batch(ranges, buf)?;
    let mut off = 0;
    for r in ranges.iter() {
        into[r.clone()].copy_from_slice(&buf[off..off + r.len()]);
        off += r.len();
    }
    Ok(())
}
