//! The stop and checkpoint protocol (see the module doc of `engine`): publishing the iteration a
//! rank would begin next when a stop or a timed checkpoint is asked, agreeing on the checkpoint's
//! iteration, and the checkpoint itself (every rank's arrival, rank 0's snapshot of the windows
//! and the schemes' state).

use std::sync::atomic::Ordering;
use std::time::Instant;

use peregrine_transport::ReduceOp;

use super::run::{Local, Run};
use super::trace::{Args, Span};
use super::watch::{Behind, Phase};
use super::TrainError;
use crate::model::Model;
use crate::scheme::Policy;

impl<M: Model> Run<'_, M> {
    /// Publishes the next iteration this rank would begin for a checkpoint request: its own (a
    /// stop flag, or rank 0's timed checkpoint) or another rank's (`published`: how many
    /// publications the control window counts); at most once per request.
    pub(super) fn publish_stop(&self, published: u64) -> Result<(), TrainError> {
        let mine = self.protocol.published.load(Ordering::Relaxed);
        let opened = published > mine * self.world as u64;
        let own = !self.request_open()
            && (self.cfg.stop.as_ref().is_some_and(|f| f.load(Ordering::Relaxed))
                || self.protocol.timed.load(Ordering::Relaxed));
        if !(opened || own) {
            return Ok(());
        }
        self.protocol.published.store(mine + 1, Ordering::Relaxed);
        self.protocol.stops.swap(self.rank, self.protocol.current.load(Ordering::Relaxed) + 1)?;
        self.control.fetch_add(2, 1)?;
        Ok(())
    }

    /// Whether this rank published for a request whose checkpoint it has not taken yet.
    pub(super) fn request_open(&self) -> bool {
        self.protocol.published.load(Ordering::Relaxed) > self.protocol.settled.load(Ordering::Relaxed)
    }

    /// The open request's iteration, once every rank has published for it (joining evaluations
    /// meanwhile): the largest published, which no rank has begun. `None` if an evaluation
    /// reached the target meanwhile.
    pub(super) fn stop_iteration(&self, local: &mut Local) -> Result<Option<u64>, TrainError> {
        let want = self.protocol.published.load(Ordering::Relaxed) * self.world as u64;
        crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            self.serve_evals(&mut local.evals)?;
            Ok(local.evals.stopping() || self.control.load(2)? >= want)
        })?;
        if local.evals.stopping() {
            return Ok(None);
        }
        let mut all = vec![0u64; self.world];
        self.protocol.stops.load_range(0, &mut all)?;
        Ok(all.into_iter().max().map(|d| d.saturating_sub(1)))
    }

    /// Collective: the checkpoint of iteration `at` (see the module doc of `engine`). Returns
    /// the interval to the next one (rank 0's, stretched to keep within the budget) and whether
    /// any rank was asked to stop (every rank then stops here), or `None`, without a checkpoint,
    /// if an evaluation joined meanwhile reached the target (the others stop without arriving).
    pub(super) fn checkpoint(
        &self,
        local: &mut Local,
        policy: &dyn Policy,
        at: u64,
        sink: &mut dyn FnMut(&super::Snapshot) -> Result<(), String>,
    ) -> Result<Option<(u64, bool)>, TrainError> {
        let started = Instant::now();
        self.watch.mark(Phase::Checkpointing, at);
        let checkpointing = Span(started);
        local.checkpoints += 1;
        self.protocol.arrivals.swap(self.rank, local.checkpoints)?;
        let mut arrived = vec![0u64; self.world];
        crate::clocks::wait_until(|| -> Result<bool, TrainError> {
            self.serve_evals(&mut local.evals)?;
            if local.evals.stopping() {
                return Ok(true);
            }
            self.protocol.arrivals.load_range(0, &mut arrived)?;
            match arrived.iter().position(|&a| a < local.checkpoints) {
                None => Ok(true),
                Some(rank) => {
                    self.watch.saw(Behind::Arrival { rank });
                    Ok(false)
                }
            }
        })?;
        if local.evals.stopping() {
            return Ok(None);
        }
        // Every rank has arrived: no evaluation can be asked any more; join the ones asked
        // before, in order, then read the model. From here a stopped rank holds the others in a
        // collective, where no read can name it.
        self.watch.saw(Behind::Collective);
        self.serve_evals(&mut local.evals)?;
        self.t.barrier()?;
        let scheme = self.gather_scheme_state(policy)?;
        // Replicated: the replicas' average is the checkpoint's model (a resumed run starts every
        // replica from it).
        let mut average = (Vec::new(), Vec::new());
        self.params.average_raw(self.t, &mut average.0, &mut average.1)?;
        // [failed, the next interval, asked to stop]: rank 0's interval, the others' zero.
        let stop = self.cfg.stop.as_ref().is_some_and(|f| f.load(Ordering::Relaxed));
        let mut agreed = [0u64, 0, u64::from(stop)];
        let mut why = String::new();
        if self.rank == 0 {
            let mut s = super::Snapshot {
                iteration: at,
                evals: local.evals.points.clone(),
                // Lent to the snapshot, not copied (given back below).
                best: std::mem::take(&mut local.evals.best),
                train_seconds: local.evals.train_time(),
                scheme,
                ..Default::default()
            };
            if self.params.replicated() {
                (s.params, s.state) = std::mem::take(&mut average);
            } else {
                self.params.get_raw(&mut s.params, &mut s.state)?;
            }
            s.weights = self.params.weights_of(&s.params, &s.state);
            if let Err(e) = sink(&s) {
                (agreed[0], why) = (1, e);
            }
            local.evals.best = std::mem::take(&mut s.best);
            // The interval that keeps this checkpoint's cost within the budget of the training
            // time since the previous one.
            let (every, cost) = (self.cfg.checkpoint_every, started.elapsed().as_secs_f64());
            let (since_time, since_iters) =
                (s.train_seconds - local.last_checkpoint.1, at - local.last_checkpoint.0);
            agreed[1] = match self.cfg.checkpoint_budget {
                Some(f) if since_time > 0.0 && cost > f * since_time => {
                    let need = (since_iters as f64 * cost / (f * since_time)).ceil() as u64;
                    need.div_ceil(every).max(1) * every
                }
                _ => every,
            };
            local.last_checkpoint = (at, s.train_seconds);
        }
        self.t.allreduce(&mut agreed, ReduceOp::Max)?;
        // The collectives are over: nobody is behind in them any more.
        self.watch.saw_nobody();
        self.watch.beat();
        self.traced("checkpoint", "checkpoint", checkpointing, Args::default().int("iter", at));
        local.checkpoint_time += started.elapsed();
        if agreed[0] != 0 {
            return Err(TrainError::Checkpoint(if self.rank == 0 {
                why
            } else {
                "rank 0 could not write it".into()
            }));
        }
        Ok(Some((agreed[1].max(1), agreed[2] != 0)))
    }

    /// Collective: every rank's policy state, as [`super::Snapshot::scheme`] holds it (on rank
    /// 0; empty elsewhere, and when no policy has any).
    pub(super) fn gather_scheme_state(&self, policy: &dyn Policy) -> Result<Vec<f64>, TrainError> {
        let mine = policy.state();
        let mut longest = [mine.len() as u64];
        self.t.allreduce(&mut longest, ReduceOp::Max)?;
        if longest[0] == 0 {
            return Ok(Vec::new());
        }
        let stride = longest[0] as usize + 1;
        let mut all = vec![0.0f64; 2 + self.world * stride];
        if self.rank == 0 {
            (all[0], all[1]) = (self.world as f64, stride as f64);
        }
        let at = 2 + self.rank * stride;
        all[at] = mine.len() as f64;
        all[at + 1..at + 1 + mine.len()].copy_from_slice(&mine);
        self.t.allreduce(&mut all, ReduceOp::Sum)?;
        Ok(if self.rank == 0 { all } else { Vec::new() })
    }
}
