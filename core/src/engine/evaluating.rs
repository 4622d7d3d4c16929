//! Evaluations: joined by every rank when rank 0 asks, from its next iteration end or wait
//! (their record and rules: [`super::evals`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use peregrine_transport::ReduceOp;

use super::evals::{evals_since_best, Evals};
use super::run::Run;
use super::{EvalPoint, TrainError};
use crate::model::{metric_value, Model};
use crate::plan::split;

impl<M: Model> Run<'_, M> {
    /// Waits until `ready` (or an evaluation has decided to stop), joining the evaluations rank 0
    /// asks for meanwhile; returns the time waited, evaluations excluded.
    pub(super) fn wait_serving(
        &self,
        evals: &mut Evals,
        mut ready: impl FnMut() -> Result<bool, TrainError>,
    ) -> Result<Duration, TrainError> {
        let mut paused = Duration::ZERO;
        let w = crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            paused += self.serve_evals(evals)?;
            Ok(evals.stopping() || ready()?)
        })?;
        Ok(w.saturating_sub(paused))
    }

    /// [`wait_serving`](Self::wait_serving) for a wait on memory this rank's node shares (a
    /// node barrier: [`super::node`]): `ready` is a load, polled `LOCAL_POLLS` times between
    /// looks at the evaluation words on rank 0 (a round trip, and between nodes one that needs
    /// rank 0's library to progress), which only a wait longer than that makes; every poll
    /// lets the library serve the others' one-sided calls on this rank's windows.
    fn wait_on_node(
        &self,
        evals: &mut Evals,
        mut ready: impl FnMut() -> Result<bool, TrainError>,
    ) -> Result<(), TrainError> {
        /// Polls of the node's memory between looks at the evaluations.
        const LOCAL_POLLS: u32 = 256;
        let mut polls = 0u32;
        crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            polls += 1;
            if polls.is_multiple_of(LOCAL_POLLS) {
                self.serve_evals(evals)?;
            } else {
                // The others' one-sided calls on this rank's windows (over TCP they wait for it).
                self.t.progress()?;
            }
            Ok(ready()? || evals.stopping())
        })?;
        Ok(())
    }

    /// How this rank waits at its node's barriers ([`super::node::Wait`]):
    /// [`wait_on_node`](Self::wait_on_node), joining evaluations with `evals`.
    pub(super) fn node_wait<'s>(
        &'s self,
        evals: &'s mut Evals,
    ) -> impl FnMut(&mut dyn FnMut() -> Result<bool, TrainError>) -> Result<(), TrainError> + 's {
        move |ready| self.wait_on_node(evals, ready)
    }

    /// Joins every evaluation rank 0 has asked for and this rank has not joined yet; returns the
    /// time it took.
    pub(super) fn serve_evals(&self, evals: &mut Evals) -> Result<Duration, TrainError> {
        // Every wait comes here. The others' one-sided calls on this rank's windows first, while
        // it holds none of its own locks: rank 0 waiting on the control words in its own shard
        // would otherwise serve them only inside its own reads, holding its accumulate lock, and
        // a rank reading them could wait for the lock for good (OpenMPI's osc/ucx over TCP).
        self.t.progress()?;
        // Evaluations asked and stop publications, in one read; where a stop asked by another
        // rank is published from.
        let mut words = [0u64; 3];
        self.control.load_range(0, &mut words)?;
        self.publish_stop(words[2])?;
        let started = Instant::now();
        let asked = words[0];
        while evals.joined < asked {
            evals.joined += 1;
            self.watch.mark(super::watch::Phase::Evaluating, evals.iters);
            let evaluating = super::trace::Span::now();
            // Everyone's pushes so far have landed (flushed before the barrier).
            self.t.barrier()?;
            self.evaluate(evals)?;
            self.watch.beat();
            self.traced(
                "evaluate",
                "evaluate",
                evaluating,
                super::trace::Args::default().int("iter", evals.iters),
            );
        }
        Ok(if asked > 0 { started.elapsed() } else { Duration::ZERO })
    }

    /// Evaluates the current global model (collective): every rank pulls all of it and evaluates
    /// its share of the evaluation rows with its threads; the sums are added up over ranks, and
    /// the point is labelled with rank 0's iteration count and training time.
    pub(super) fn evaluate(&self, evals: &mut Evals) -> Result<(), TrainError> {
        let e0 = Instant::now();
        let train_time = evals.train_time();
        let consensus = if self.params.replicated() {
            Some(self.params.average(self.t, &mut evals.params, &mut evals.own)?)
        } else {
            self.params.get_all(&mut evals.params)?;
            None
        };
        let mine = split(self.model.eval_rows(), self.rank, self.world);
        let threads = self.pool.active();
        let sums = Mutex::new([0.0f64; 3]);
        let replica = &evals.params[..];
        self.pool.run(|w| {
            let part = split(mine.len(), w, threads);
            let s = self.model.evaluate(replica, mine.start + part.start..mine.start + part.end);
            let mut all = sums.lock().expect("eval sums");
            for (a, b) in all.iter_mut().zip(s) {
                *a += b;
            }
        });
        let s = sums.into_inner().expect("eval sums");
        let (iter, time) = if self.rank == 0 { (evals.iters as f64, train_time) } else { (0.0, 0.0) };
        let mut all = [s[0], s[1], s[2], iter, time, evals.train_loss, evals.train_rows];
        self.t.allreduce(&mut all, ReduceOp::Sum)?;
        (evals.train_loss, evals.train_rows) = (0.0, 0.0);
        let loss = all[0] / all[2].max(1.0);
        let metric = metric_value(self.model.metric(), [all[0], all[1], all[2]]);
        let (iter, time) = (all[3] as u64, all[4]);
        let train_loss = (all[6] > 0.0).then(|| all[5] / all[6]);
        evals.time += e0.elapsed();
        evals.points.push(EvalPoint { iter, time, loss, metric, train_loss, consensus });
        // Every rank judges the same reduced figures: all stop together, or none. (No evaluation
        // rows, nothing to judge.)
        if all[2] > 0.0 {
            evals.health.check(&evals.points, self.cfg.stop_on_stall)?;
            if self.rank == 0 && self.cfg.keep_best && evals_since_best(&evals.points) == Some(0) {
                evals.best.clone_from(&evals.params);
            }
            evals.judge_early_stop(self.cfg.early_stop);
        }
        if evals.to_target.is_none() && self.cfg.target_loss.is_some_and(|g| loss <= g) {
            evals.to_target = Some(time);
        }
        Ok(())
    }
}
