//! Evaluations: joined by every rank when rank 0 asks, from its next iteration end or wait.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use peregrine_transport::ReduceOp;

use super::run::Run;
use super::{EvalPoint, TrainError};
use crate::model::{metric_value, Model};
use crate::plan::split;

/// Where this rank's evaluations stand.
pub(super) struct Evals {
    pub points: Vec<EvalPoint>,
    /// Time spent evaluating (and waiting for others to join an evaluation).
    pub time: Duration,
    pub to_target: Option<f64>,
    /// Evaluations this rank has joined.
    joined: u64,
    /// The full model, pulled for each evaluation.
    pub params: Vec<f32>,
    /// This rank's iterations done.
    pub iters: u64,
    start: Instant,
}

impl Evals {
    /// No evaluation yet, training time counted from now; `params` parameters to pull.
    pub(super) fn new(params: usize) -> Self {
        Self {
            points: Vec::new(),
            time: Duration::ZERO,
            to_target: None,
            joined: 0,
            params: vec![0.0; params],
            iters: 0,
            start: Instant::now(),
        }
    }

    /// Training seconds so far (evaluations excluded).
    pub(super) fn train_time(&self) -> f64 {
        (self.start.elapsed() - self.time).as_secs_f64()
    }
}

impl<M: Model> Run<'_, M> {
    /// Waits until `ready` (or an evaluation has decided to stop), joining the evaluations rank 0
    /// asks for meanwhile; returns the time waited, evaluations excluded.
    pub(super) fn wait_serving(
        &self,
        ev: &mut Evals,
        mut ready: impl FnMut() -> Result<bool, TrainError>,
    ) -> Result<Duration, TrainError> {
        let mut paused = Duration::ZERO;
        let w = crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            paused += self.serve_evals(ev)?;
            Ok(ev.to_target.is_some() || ready()?)
        })?;
        Ok(w.saturating_sub(paused))
    }

    /// Joins every evaluation rank 0 has asked for and this rank has not joined yet; returns the
    /// time it took.
    pub(super) fn serve_evals(&self, ev: &mut Evals) -> Result<Duration, TrainError> {
        let t0 = Instant::now();
        let asked = self.control.load(0)?;
        while ev.joined < asked {
            ev.joined += 1;
            // Everyone's pushes so far have landed (flushed before the barrier).
            self.t.barrier()?;
            self.evaluate(ev)?;
        }
        Ok(if asked > 0 { t0.elapsed() } else { Duration::ZERO })
    }

    /// Evaluates the current global model (collective): every rank pulls all of it and evaluates
    /// its share of the evaluation rows with its threads; the sums are added up over ranks, and
    /// the point is labelled with rank 0's iteration count and training time.
    pub(super) fn evaluate(&self, ev: &mut Evals) -> Result<(), TrainError> {
        let e0 = Instant::now();
        let train_time = ev.train_time();
        self.params.get(0, &mut ev.params)?;
        let mine = split(self.model.eval_rows(), self.rank, self.world);
        let threads = self.pool.active();
        let sums = Mutex::new([0.0f64; 3]);
        let replica = &ev.params[..];
        self.pool.run(|w| {
            let part = split(mine.len(), w, threads);
            let s = self.model.evaluate(replica, mine.start + part.start..mine.start + part.end);
            let mut all = sums.lock().expect("eval sums");
            for (a, b) in all.iter_mut().zip(s) {
                *a += b;
            }
        });
        let s = sums.into_inner().expect("eval sums");
        let (iter, time) = if self.rank == 0 { (ev.iters as f64, train_time) } else { (0.0, 0.0) };
        let mut all = [s[0], s[1], s[2], iter, time];
        self.t.allreduce(&mut all, ReduceOp::Sum)?;
        let loss = all[0] / all[2].max(1.0);
        let metric = metric_value(self.model.metric(), [all[0], all[1], all[2]]);
        let (iter, time) = (all[3] as u64, all[4]);
        ev.time += e0.elapsed();
        if !loss.is_finite() {
            return Err(TrainError::Diverged { iter, loss });
        }
        ev.points.push(EvalPoint { iter, time, loss, metric });
        if ev.to_target.is_none() && self.cfg.target_loss.is_some_and(|g| loss <= g) {
            ev.to_target = Some(time);
        }
        Ok(())
    }
}
