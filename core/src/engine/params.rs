//! The model's parameters in windows: the weights (or what they are derived from) and the
//! optimizer's state beside them ([`crate::optim`]).
//!
//! The state window is laid out like the weights' with `slots` values per parameter, interleaved
//! (parameter `j`'s state at `slots j ..`), and sharded the same way: rank `r`'s shard of the state
//! belongs to rank `r`'s shard of the weights, so a parameter's state lives on the rank that owns
//! it, and a range of parameters reads its state as one range.
//!
//! Under a synchronous scheme (BSP) a dense model's optimizer steps at the owners instead
//! ([`Params::owner_steps`]): ranks `put` their share of the iteration's mean gradient into
//! their own slots at the owners ([`super::owner::Slots`]), and once every rank's share has landed each rank
//! sums them and steps its own shard of the weights with its own shard of the state, in place in
//! the windows' local memory ([`Params::step_owned`]). The state then never travels: a rank's
//! pull reads the weights only and its push writes the gradient only, half the bytes of pulling
//! and pushing both. Where the ranks share memory (MPI processes on one node) there is no pull:
//! the weights window is mapped whole by every rank, and the chunks read it in place
//! ([`Params::weights_in_place`]) between the barrier that ends the owners' steps and the pushes
//! that let the next ones begin.

use std::ops::Range;
use std::sync::Mutex;

use peregrine_transport::{NodeLayout, ReduceOp, ShardMap, Transport, Window};

use super::node::{Combiner, Wait};
use super::owner::{step_split, Slots, Units};
use super::TrainError;
use crate::model::{Delta, KeySet, Layout, Model};
use crate::optim::{Gradient, Optimizer, Step};
use crate::pool::RankPool;

/// The parameter windows of a run.
pub(super) struct Params {
    /// The weights (FTRL: its `z`).
    pub w: Window<f32>,
    /// The optimizer's state, `slots` values per parameter (none for SGD).
    state: Option<Window<f32>>,
    opt: Optimizer,
    slots: usize,
    /// The base learning rate (FTRL derives weights with it).
    lr: f32,
    /// Parameters without L1 (an intercept).
    exempt: Range<usize>,
    /// Replicated: where this rank's replica starts in `w`, and its optimizer state.
    own: Option<(usize, Mutex<Vec<f32>>)>,
    /// Owner-side steps: the other ranks' contributions to the gradient of this rank's shard.
    grad: Option<Slots>,
    /// The model's parameters.
    len: usize,
    /// A keyed model's chunks read the weights in place ([`Windows::Keyed`]).
    in_place: bool,
    /// A push by key steps the weights with their state in one pass ([`Window::steps_with`]:
    /// both windows direct, MPI processes of one node), where the optimizer keeps state and
    /// its weights are not derived.
    one_pass: bool,
    /// Node-combined pulls and pushes ([`super::node`]).
    node: Option<Combiner>,
}

/// What a node-combined pull gave ([`Params::pull_node`]).
pub(super) enum NodePull<'a> {
    /// The node's copy of the weights, to read in place.
    Copy(&'a [f32]),
    /// Nothing: the run stops (an evaluation said so) before the node's ranks had all pulled.
    Stopped,
    /// Nothing: the ranks of a node do not combine here.
    Alone,
}

/// How the parameter windows are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Windows {
    /// Shared where the ranks share memory, for the owners to step in place
    /// ([`Params::owner_steps`]).
    OwnerSteps,
    /// A sparse model pulled and pushed by key: direct where the ranks share memory
    /// ([`Transport::alloc_direct_window`]), its keys read and added in place, not through one
    /// library call per run of keys. With `in_place` (the scheme lines the ranks up after every
    /// iteration's chunks, before anyone pushes: [`crate::scheme::Policy::line_up`]), the chunks
    /// read the weights in place there, with no pull at all ([`Params::weights_in_place`]).
    Keyed { in_place: bool },
    /// Anything else: pulled and pushed in long ranges.
    Plain,
}

/// A push's buffers, kept from iteration to iteration.
#[derive(Default)]
pub(super) struct PushBufs {
    ranges: Vec<Range<usize>>,
    data: Vec<f32>,
    sranges: Vec<Range<usize>>,
    st: Vec<f32>,
    ds: Vec<f32>,
    /// FTRL: the touched weights as read (derived).
    z: Vec<f32>,
}

impl Params {
    /// Collective: allocates the windows and writes this rank's shard of `model`'s initial values
    /// (and zero state); if `replicated`, its whole replica; with [`Windows::OwnerSteps`] (the
    /// caller checked [`super::owner::owner_steps_apply`]), the gradient window too; with `node_combine` (the
    /// caller checked [`super::node::applies`]), the node blocks, where every node can have
    /// them ([`node_combined`](Self::node_combined) says).
    pub(super) fn start<M: Model>(
        t: &Transport,
        model: &M,
        opt: Optimizer,
        seed: u64,
        (replicated, windows, node_combine): (bool, Windows, bool),
    ) -> Result<Self, TrainError> {
        let owner_steps = windows == Windows::OwnerSteps;
        let layout = model.layout();
        let (lr, exempt, slots) = (model.lr().unwrap_or(0.0), model.unpenalized(), opt.slots());
        let stored = |range: Range<usize>| {
            let mut init = vec![0.0f32; range.len()];
            model.init(seed, range.clone(), &mut init);
            for (j, v) in init.iter_mut().enumerate() {
                *v = opt.stored(lr, exempt.contains(&(range.start + j)), *v);
            }
            init
        };
        if replicated {
            let p = layout.params;
            let w: Window<f32> = t.alloc_window("replicas", &ShardMap::from_lens(vec![p; t.world_size()]))?;
            let at = t.rank() * p;
            w.put(at, &stored(0..p))?;
            w.flush_all()?;
            let own = Some((at, Mutex::new(vec![0.0; p * slots])));
            return Ok(Self {
                w,
                state: None,
                opt,
                slots,
                lr,
                exempt,
                own,
                grad: None,
                len: p,
                in_place: false,
                one_pass: false,
                node: None,
            });
        }
        // Owner-side steps read the weights in place where the ranks share memory
        // ([`weights_in_place`](Self::weights_in_place)), and keyed pulls and pushes access it
        // directly: a window every rank maps whole, its shards in whole lines so that they lie
        // back to back.
        let map = if windows != Windows::Plain {
            ShardMap::balanced_in_lines::<f32>(layout.params, t.world_size())
        } else {
            ShardMap::balanced(layout.params, t.world_size())
        };
        let w: Window<f32> = match windows {
            Windows::OwnerSteps => t.alloc_shared_window("parameters", &map)?,
            Windows::Keyed { .. } => t.alloc_direct_window("parameters", &map)?,
            Windows::Plain => t.alloc_window("parameters", &map)?,
        };
        let state = if slots > 0 {
            let lens = ShardMap::from_lens((0..t.world_size()).map(|r| map.len_of(r) * slots));
            Some(match windows {
                Windows::Keyed { .. } => t.alloc_direct_window("optimizer state", &lens)?,
                _ => t.alloc_window("optimizer state", &lens)?,
            })
        } else {
            None
        };
        let mine = map.range(t.rank());
        w.put(mine.start, &stored(mine.clone()))?;
        w.flush_all()?;
        let node = if node_combine { Combiner::start(t, &map, layout.params)? } else { None };
        let grad = if owner_steps {
            Some(Slots::alloc(t, &map, model.decay(), node.as_ref().map(|n| n.layout().clone()))?)
        } else {
            None
        };
        // In place only on a direct window that this rank maps whole (every rank then does:
        // agreed at allocation); not the local backend's (direct, but its shards apart).
        // SAFETY: the slice is dropped at once, before anything writes the window.
        let whole = unsafe { w.whole_in_place() }?.is_some();
        let in_place =
            matches!(windows, Windows::Keyed { in_place: true }) && w.is_direct() && whole && !opt.derived();
        let one_pass = !opt.derived() && state.as_ref().is_some_and(|s| w.steps_with(s));
        Ok(Self {
            w,
            state,
            opt,
            slots,
            lr,
            exempt,
            own: None,
            grad,
            len: layout.params,
            in_place,
            one_pass,
            node,
        })
    }

    /// Whether every rank keeps its own replica.
    pub(super) fn replicated(&self) -> bool {
        self.own.is_some()
    }

    /// Replicated: this rank's optimizer state.
    fn own_state(&self) -> std::sync::MutexGuard<'_, Vec<f32>> {
        self.own.as_ref().expect("a replicated run").1.lock().expect("the replica's state")
    }

    /// Reads every parameter into `out` (weights: FTRL's are derived from the window's values).
    pub(super) fn get_all(&self, out: &mut [f32]) -> Result<(), TrainError> {
        if self.opt.derived() || self.replicated() {
            return self.get_all_with_state(out, &mut Vec::new());
        }
        Ok(self.w.get(0, out)?)
    }

    /// Reads every parameter into `out` and, if the optimizer keeps state, all of it into `st`:
    /// the state a push of a model pulled whole steps with (read with the weights, before the
    /// iteration's pushes).
    pub(super) fn get_all_with_state(&self, out: &mut [f32], st: &mut Vec<f32>) -> Result<(), TrainError> {
        if let Some((at, _)) = &self.own {
            self.w.get(*at, out)?;
            if self.slots > 0 {
                st.clone_from(&self.own_state());
                self.opt.weights(self.lr, 0, &self.exempt, out, st);
            }
            return Ok(());
        }
        self.w.get(0, out)?;
        if self.slots > 0 {
            st.resize(out.len() * self.slots, 0.0);
            self.state().get(0, st)?;
            self.opt.weights(self.lr, 0, &self.exempt, out, st);
        }
        Ok(())
    }

    /// The weights of every parameter from the windows' values `raw` and state `st` as
    /// [`get_raw`](Self::get_raw) read them (FTRL's derived; the values themselves otherwise).
    pub(super) fn weights_of(&self, raw: &[f32], st: &[f32]) -> Vec<f32> {
        let mut w = raw.to_vec();
        if self.slots > 0 {
            self.opt.weights(self.lr, 0, &self.exempt, &mut w, st);
        }
        w
    }

    /// Reads the windows as they are: every parameter's stored value into `w` and the optimizer
    /// state into `st` (for a checkpoint).
    pub(super) fn get_raw(&self, w: &mut Vec<f32>, st: &mut Vec<f32>) -> Result<(), TrainError> {
        w.resize(self.w.len(), 0.0);
        self.w.get(0, w)?;
        st.resize(self.w.len() * self.slots, 0.0);
        if self.slots > 0 {
            self.state().get(0, st)?;
        }
        Ok(())
    }

    /// Collective, replicated: the replicas' average of the stored values into `w` and of the
    /// optimizer state into `st` (a checkpoint's).
    pub(super) fn average_raw(
        &self,
        t: &Transport,
        w: &mut Vec<f32>,
        st: &mut Vec<f32>,
    ) -> Result<(), TrainError> {
        let Some((at, _)) = &self.own else { return Ok(()) };
        w.resize(self.len, 0.0);
        self.w.get(*at, w)?;
        st.clone_from(&self.own_state());
        let n = t.world_size() as f32;
        for v in [w, st] {
            t.allreduce(&mut v[..], ReduceOp::Sum)?;
            v.iter_mut().for_each(|x| *x /= n);
        }
        Ok(())
    }

    /// Collective, replicated: every replica's weights averaged into `out` (this rank's own in
    /// `mine`), and the consensus distance, the replicas' root-mean-square distance from the
    /// average.
    pub(super) fn average(
        &self,
        t: &Transport,
        out: &mut [f32],
        mine: &mut Vec<f32>,
    ) -> Result<f64, TrainError> {
        mine.resize(out.len(), 0.0);
        self.get_all(mine)?;
        out.copy_from_slice(mine);
        t.allreduce(out, ReduceOp::Sum)?;
        let n = t.world_size() as f32;
        out.iter_mut().for_each(|x| *x /= n);
        let mut d = [mine.iter().zip(out.iter()).map(|(a, b)| f64::from(a - b).powi(2)).sum::<f64>()];
        t.allreduce(&mut d, ReduceOp::Sum)?;
        Ok((d[0] / f64::from(n)).sqrt())
    }

    /// Replicated: this rank's replica stepped with `delta` (none: as it is) into `y`, its
    /// optimizer state stepped with it. Without `step`, `delta` is the update itself; with it,
    /// the optimizer steps every parameter with this rank's contributions, as a push of a model
    /// pulled whole does.
    pub(super) fn step_own(
        &self,
        delta: Option<&Delta>,
        step: Option<Step>,
        y: &mut Vec<f32>,
        b: &mut PushBufs,
    ) -> Result<(), TrainError> {
        let at = self.own.as_ref().expect("a replicated run").0;
        y.resize(self.len, 0.0);
        self.w.get(at, y)?;
        let Some(delta) = delta else { return Ok(()) };
        let Some(step) = step else {
            peregrine_kernels::dense::axpy(1.0, delta.values(), y);
            return Ok(());
        };
        let mut st = self.own_state();
        let PushBufs { data, ds, z, .. } = b;
        data.clear();
        data.extend_from_slice(delta.values());
        ds.clear();
        ds.resize(st.len(), 0.0);
        z.clear();
        if self.opt.derived() {
            // FTRL steps with the weights its stored values and state give.
            z.extend_from_slice(y);
            self.opt.weights(self.lr, 0, &self.exempt, z, &st);
        }
        self.opt.step(step, data, &st, ds, z);
        st.iter_mut().zip(ds.iter()).for_each(|(s, d)| *s += d);
        peregrine_kernels::dense::axpy(1.0, data, y);
        Ok(())
    }

    /// Replicated: writes this rank's replica.
    pub(super) fn set_own(&self, t: &Transport, x: &[f32]) -> Result<(), TrainError> {
        let at = self.own.as_ref().expect("a replicated run").0;
        self.w.put(at, x)?;
        Ok(self.w.flush(t.rank())?)
    }

    /// Writes this rank's shard of `w` and of the optimizer state `st` (a checkpoint's) into the
    /// windows; replicated, its whole replica and state.
    pub(super) fn restore(&self, t: &Transport, w: &[f32], st: &[f32]) -> Result<(), TrainError> {
        if let Some((at, _)) = &self.own {
            self.w.put(*at, w)?;
            self.own_state().copy_from_slice(st);
            return self.flush_all();
        }
        let mine = self.w.map().range(t.rank());
        self.w.put(mine.start, &w[mine.clone()])?;
        if self.slots > 0 {
            let s = mine.start * self.slots..mine.end * self.slots;
            self.state().put(s.start, &st[s])?;
        }
        self.flush_all()
    }

    /// Whether the optimizer keeps state.
    pub(super) fn stateful(&self) -> bool {
        self.slots > 0
    }

    /// Reads the parameters of `keys` into the same positions of `into` (or all of them, when the
    /// keys are too [`scattered`] or cover half the keys or more). Returns whether it read all of
    /// them with room to spare: the keys' runs were twice as many as [`scattered`] asks, or the
    /// keys cover two thirds of all.
    pub(super) fn pull_keys(
        &self,
        layout: Layout,
        keys: &mut KeySet,
        ranges: &mut Vec<Range<usize>>,
        buf: &mut Vec<f32>,
        into: &mut [f32],
    ) -> Result<bool, TrainError> {
        // Decided before the ranges are written: a scattered set is read whole, and sorting its
        // keys into ranges would be wasted (a tenth of a sparse LR run over 100k features).
        let direct = self.w.is_direct();
        if let Some(room) = read_whole(keys.runs(), keys.len(), layout, direct) {
            self.get_all(into)?;
            return Ok(room);
        }
        keys.ranges(layout, ranges);
        if !self.opt.derived() {
            // Straight into place: no buffer between the window and the chunks' copy.
            self.w.get_at(ranges, into)?;
            return Ok(false);
        }
        let n = ranges.iter().map(|r| r.len()).sum();
        buf.resize(n, 0.0);
        self.w.get_batch(ranges, buf)?;
        if self.opt.derived() {
            let (mut sr, mut st) = (Vec::new(), vec![0.0; n * self.slots]);
            self.state_ranges(ranges, &mut sr);
            self.state().get_batch(&sr, &mut st)?;
            self.derive(ranges, buf, &st);
        }
        let mut off = 0;
        for r in ranges.iter() {
            into[r.clone()].copy_from_slice(&buf[off..off + r.len()]);
            off += r.len();
        }
        Ok(false)
    }

    /// The state's ranges of parameter ranges `ranges`, into `out`.
    fn state_ranges(&self, ranges: &[Range<usize>], out: &mut Vec<Range<usize>>) {
        let k = self.slots;
        out.clear();
        out.extend(ranges.iter().map(|r| r.start * k..r.end * k));
    }

    /// FTRL: turns the window's values of `ranges`, read back to back into `zw` with their state
    /// `st`, into weights in place (nothing to do for other optimizers).
    fn derive(&self, ranges: &[Range<usize>], zw: &mut [f32], st: &[f32]) {
        let (mut off, k) = (0, self.slots);
        for r in ranges {
            let n = r.len();
            self.opt.weights(
                self.lr,
                r.start,
                &self.exempt,
                &mut zw[off..off + n],
                &st[off * k..(off + n) * k],
            );
            off += n;
        }
    }

    /// Accumulates `delta` into the owning shards. Without `step`, `delta` is the weights' update
    /// itself; with it, `delta` holds this rank's contributions ([`crate::optim`]), and the push
    /// steps with the touched parameters' state and accumulates the weights' and the state's
    /// updates. The state (and FTRL's weights) is `pulled`, read with the whole model (and then
    /// every parameter steps), or else read now for the touched keys. Only the touched keys move,
    /// or whole vectors (zeros elsewhere) when they are too [`scattered`].
    pub(super) fn push(
        &self,
        delta: &mut Delta,
        step: Option<Step>,
        pulled: Option<(&[f32], &[f32])>,
        b: &mut PushBufs,
    ) -> Result<(), TrainError> {
        let PushBufs { ranges, data, sranges, st, ds, z } = b;
        let params = delta.layout().params;
        let Some(step) = step else {
            return write_delta(&self.w, delta, ranges, true);
        };
        let (state, k, derived) = (self.state(), self.slots, self.opt.derived());
        // MPI processes of one node: each touched key's state read, stepped, and both changes
        // added, in one pass over the sorted keys (sparse LR at 1M features: the push was bound
        // by its passes over ~12k keys, three of them through the windows, and by the ranges).
        let one_pass = pulled.is_none() && self.one_pass;
        // What steps: every parameter of a model pulled whole (untouched ones with a zero
        // gradient: momentum and Adam's moments decay as the textbook rules say, so the ranks'
        // pushes add up to one step however the rows were split); else the touched keys, back to
        // back, or in whole vectors when they are too scattered.
        let whole = if pulled.is_some() {
            ranges.clear();
            ranges.push(0..params);
            true
        } else if one_pass {
            let keys = delta.sorted_keys();
            let runs = keys.windows(2).filter(|k| k[1] != k[0] + 1).count() + 1;
            runs > 1 && scattered(runs, params, true)
        } else {
            delta.ranges(ranges, data);
            ranges.len() > 1 && scattered(ranges.len(), params, self.w.is_direct())
        };
        if !whole && one_pass {
            // The update is taken whole: no clear of it at the next drain.
            let width = delta.layout().width;
            delta.push_sorted(|keys, values| {
                self.w.step_with_state(state, width, keys, values, |c, st, ds| {
                    self.opt.step(step, c, st, ds, &[])
                })
            })?;
            return Ok(());
        }
        if whole && one_pass {
            delta.ranges(ranges, data);
        }
        if !whole && pulled.is_none() {
            self.state_ranges(ranges, sranges);
            // On a direct window, in blocks: a block's state is still in the cache when its
            // change is added back, where a push of ~40k scattered keys at once (sparse LR
            // hashed into 2^24 features) read it again from memory.
            let block = if self.w.is_direct() && state.is_direct() { KEYS_A_BLOCK } else { usize::MAX };
            let (mut off, mut at) = (0, 0);
            while at < ranges.len() {
                let end = ranges.len().min(at.saturating_add(block));
                let n = ranges[at..end].iter().map(Range::len).sum::<usize>();
                let bufs = (&mut data[off..off + n], &mut *st, &mut *ds, &mut *z);
                self.step_keys(step, (&ranges[at..end], &sranges[at..end]), bufs)?;
                (off, at) = (off + n, end);
            }
            return Ok(());
        }
        // A dense update steps in its own buffer (no copy); the next drain clears it.
        let in_place = whole && delta.dense_values_mut().is_some();
        if whole && !in_place {
            data.clear();
            data.extend_from_slice(delta.values());
        }
        // The state (and FTRL's weights) to step with: as pulled, or read now.
        let (st, w): (&[f32], &[f32]) = match pulled {
            Some((w, st)) => (st, if derived { w } else { &[] }),
            None => {
                st.resize(params * k, 0.0);
                z.resize(if derived { params } else { 0 }, 0.0);
                state.get(0, st)?;
                if derived {
                    self.w.get(0, z)?;
                    self.opt.weights(self.lr, 0, &self.exempt, z, st);
                }
                (&st[..], &z[..])
            }
        };
        ds.clear();
        ds.resize(st.len(), 0.0);
        let c: &mut [f32] = match delta.dense_values_mut() {
            Some(v) if in_place => v,
            _ => data,
        };
        // Every parameter where the model was pulled whole; else the touched ones, in place in
        // whole vectors (too scattered to move by key).
        for r in ranges.iter() {
            let w = if derived { &w[r.clone()] } else { &[] };
            self.opt.step(
                step,
                &mut c[r.clone()],
                &st[r.start * k..r.end * k],
                &mut ds[r.start * k..r.end * k],
                w,
            );
        }
        self.w.accumulate(0, c)?;
        state.accumulate(0, ds)?;
        Ok(())
    }

    /// Steps the touched keys `ranges` (their state's ranges `sranges`) with their contributions
    /// `c`, back to back: reads their state (and FTRL's weights) now and adds the weights' and
    /// the state's changes (`st`, `ds`, `z`: buffers).
    fn step_keys(
        &self,
        step: Step,
        (ranges, sranges): (&[Range<usize>], &[Range<usize>]),
        (c, st, ds, z): (&mut [f32], &mut Vec<f32>, &mut Vec<f32>, &mut Vec<f32>),
    ) -> Result<(), TrainError> {
        let (state, k, derived) = (self.state(), self.slots, self.opt.derived());
        let n = c.len();
        st.resize(n * k, 0.0);
        z.resize(if derived { n } else { 0 }, 0.0);
        state.get_batch(sranges, st)?;
        if derived {
            self.w.get_batch(ranges, z)?;
            self.derive(ranges, z, st);
        }
        ds.clear();
        ds.resize(n * k, 0.0);
        let mut off = 0;
        for r in ranges {
            let (o, n) = (off, r.len());
            let w = if derived { &z[o..o + n] } else { &[] };
            self.opt.step(step, &mut c[o..o + n], &st[o * k..(o + n) * k], &mut ds[o * k..(o + n) * k], w);
            off += n;
        }
        self.w.accumulate_batch(ranges, c)?;
        state.accumulate_batch(sranges, ds)?;
        Ok(())
    }

    /// Puts `delta`'s values at its touched keys (their new values: the iteration's chunks touched
    /// disjoint keys, [`crate::model::Model::disjoint`]) into the owning shards, completed at the
    /// targets on return ([`write_delta`]).
    pub(super) fn put_values(&self, delta: &mut Delta, b: &mut PushBufs) -> Result<(), TrainError> {
        write_delta(&self.w, delta, &mut b.ranges, false)
    }

    /// Owner-side steps on a window this rank maps whole (MPI processes on one node: see
    /// [`Transport::alloc_shared_window`]): every weight, read in place, with no pull; `None`
    /// elsewhere (pull them).
    ///
    /// # Safety
    /// The slice must not outlive this rank's compute of the iteration, which has to end before
    /// the rank pushes: the owners step their shards in place once every rank pushed, and the
    /// ranks line up after the step before reading the weights again (the protocol of
    /// [`step_owned`](Self::step_owned)). Nothing else writes the weights window meanwhile.
    pub(super) unsafe fn weights_in_place(&self) -> Result<Option<&[f32]>, TrainError> {
        if !self.owner_steps() && !self.in_place {
            return Ok(None);
        }
        // SAFETY: the caller's contract: no rank writes the weights while the slice lives.
        Ok(unsafe { self.w.whole_in_place() }?)
    }

    /// Whether a keyed model's chunks read the weights in place ([`Windows::Keyed`]): its
    /// pushes land only once every rank's chunks of the iteration are done (the line-up), and the
    /// next iteration's reads begin once every rank pushed (a synchronous bound); a rank that
    /// leaves before the line-up completed (an evaluation said stop) does not push.
    pub(super) fn reads_in_place(&self) -> bool {
        self.in_place
    }

    /// Whether the optimizer steps at the owners (see the module docs): pulls read the weights
    /// only, pushes ([`push_gradient`](Self::push_gradient)) write the gradient slots, and
    /// every rank steps its own shard ([`step_owned`](Self::step_owned)) once the iteration's
    /// pushes have landed.
    pub(super) fn owner_steps(&self) -> bool {
        self.grad.is_some()
    }

    /// Whether the owners' step applies the model's L2 penalty ([`Model::decay`]): the chunks
    /// then leave it out ([`Model::without_decay`]).
    pub(super) fn owners_decay(&self) -> bool {
        self.grad.as_ref().is_some_and(|g| g.decay.is_some())
    }

    /// Owner-side steps: puts this rank's part of the iteration's gradient (`delta`: its sum over
    /// the rank's rows, which the owners scale; all zeros when the rank has nothing to add) into
    /// its slot at every other owner, each owner's
    /// whole shard of it straight from `delta`. Every rank pushes at every iteration that the
    /// owners step: a slot holds what its rank put last. The part in this rank's own shard stays
    /// in `delta` and joins [`step_owned`](Self::step_owned) there: it would only pass through
    /// local memory twice.
    pub(super) fn push_gradient(&self, delta: &Delta) -> Result<(), TrainError> {
        self.grad.as_ref().expect("owner-side steps").put(delta.values())
    }

    /// Owner-side steps, once every rank's gradient of the iteration has landed: steps this
    /// rank's shard of the weights and of the state with the sum of the other ranks' slots in
    /// rank order (`step`'s share is the whole iteration) plus this rank's own part (its pushed
    /// `delta`, if it pushed one: see [`push_gradient`](Self::push_gradient)), times `scale` (the
    /// ranks push their sums over rows: `1 / rows` of the batch), plus the model's L2 penalty's
    /// gradient where the owners apply it ([`owners_decay`](Self::owners_decay)), in place in the
    /// windows' local memory ([`Optimizer::step_in_place`]; the slots are only read).
    ///
    /// The caller's protocol makes that exclusive (the windows' `with_own_shard` contract): every
    /// rank flushed its pushes into the slots before the wait that said they landed, and pulled
    /// the weights of this iteration before pushing; pushes never write the weights or the
    /// state; and the ranks line up (a barrier) after the step, before anyone reads the weights
    /// or writes the slots again.
    ///
    /// With `split`, the threads of `pool` step the shard between them, each the parameters
    /// the function gives for it (`(thread, threads)`: a team's units, [`Model::units`]), so that
    /// each steps what it computed; with 3 or more ranks (slots not side by side for a range) the
    /// calling thread steps it all.
    pub(super) fn step_owned(
        &self,
        step: Step,
        scale: f32,
        pushed: Option<&Delta>,
        split: Option<(&RankPool, &Units<'_>)>,
    ) -> Result<(), TrainError> {
        let g = self.grad.as_ref().expect("owner-side steps");
        let step = Step { share: 1.0, ..step };
        let mine = g.map.range(g.rank);
        let decay = g.decay.as_ref().map(|(l2, ranges)| (*l2, &ranges[..]));
        let split = split.filter(|(pool, _)| pool.active() > 1);
        // This rank's own part: its node's sum of its shard where the node combines, else its
        // pushed update's.
        let Some(node) = &self.node else {
            return self.step_shard(step, scale, pushed.map(|d| &d.values()[mine.clone()]), split, decay);
        };
        node.own_sum(|sum| self.step_shard(step, scale, (!sum.is_empty()).then_some(sum), split, decay))
    }

    /// [`step_owned`](Self::step_owned) with this rank's own part `own` of its shard's gradient.
    fn step_shard(
        &self,
        step: Step,
        scale: f32,
        own: Option<&[f32]>,
        split: Option<(&RankPool, &Units<'_>)>,
        decay: Option<(f32, &[Range<usize>])>,
    ) -> Result<(), TrainError> {
        let g = self.grad.as_ref().expect("owner-side steps");
        let (state, opt) = (self.state(), self.opt);
        let mine = g.map.range(g.rank);
        // SAFETY: exclusive access to the three shards, by the protocol above.
        let stepped = unsafe {
            g.win.with_own_shard(|parts| {
                state.with_own_shard(|st| {
                    self.w.with_own_shard(|w| match split {
                        Some((pool, units)) if parts.len() <= w.len() => {
                            let g = Gradient { parts, own, scale, decay };
                            step_split(opt, step, (w, st, &g), (pool, units), mine.clone());
                        }
                        _ => opt.step_in_place(step, w, st, &Gradient { parts, own, scale, decay }),
                    })
                })
            })
        };
        stepped???;
        Ok(())
    }

    /// The node layout where the ranks of a node combine their pulls and pushes
    /// ([`super::node`]).
    pub(super) fn node_combined(&self) -> Option<&NodeLayout> {
        self.node.as_ref().map(Combiner::layout)
    }

    /// Node-combined: pulls this rank's shards into the node's copy of the weights; once every
    /// rank of the node has, the whole copy, to read in place. Waits with `wait`.
    ///
    /// # Safety
    /// The slice must not be used once this rank's next [`push_node`](Self::push_node) begins.
    pub(super) unsafe fn pull_node(&self, wait: &mut Wait<'_>) -> Result<NodePull<'_>, TrainError> {
        let Some(node) = &self.node else { return Ok(NodePull::Alone) };
        // SAFETY: the caller's contract, passed on.
        Ok(match unsafe { node.pull(&self.w, wait) }? {
            Some(w) => NodePull::Copy(w),
            None => NodePull::Stopped,
        })
    }

    /// Node-combined: adds this rank's `update` (a dense vector of every parameter; `None`: none
    /// to add) up with its node's and sends the sums of this rank's shards to their owners: into
    /// the owners' gradient slots where the owners step ([`step_owned`](Self::step_owned) then
    /// steps this rank's own shard with its node's sum), else added to the weights. Complete at
    /// the targets on return. Every rank of the node calls it at every iteration; waits with
    /// `wait` (nothing is sent if the run stops meanwhile).
    pub(super) fn push_node(&self, update: Option<&[f32]>, wait: &mut Wait<'_>) -> Result<(), TrainError> {
        let node = self.node.as_ref().expect("node-combined");
        // The run stops: the others of the node may have left.
        if !node.offer(update, wait)? {
            return Ok(());
        }
        // Each shard's sum is sent as soon as it is summed, completed at the scope's end.
        let mut sums = node.sums();
        match &self.grad {
            Some(g) => g.win.write_scope(|s| {
                node.sum_shards(&mut sums, |(_, owner), sum| match g.node_slot(*owner) {
                    Some(at) => s.put(at, sum),
                    None => Ok(()),
                })
            })?,
            None => self
                .w
                .write_scope(|s| node.sum_shards(&mut sums, |(r, _), sum| s.accumulate(r.start, sum)))?,
        }
        Ok(())
    }

    /// Completes this rank's writes at every target.
    pub(super) fn flush_all(&self) -> Result<(), TrainError> {
        self.w.flush_all()?;
        if let Some(s) = &self.state {
            s.flush_all()?;
        }
        if let Some(g) = &self.grad {
            g.win.flush_all()?;
        }
        Ok(())
    }

    /// Collective: releases the windows.
    pub(super) fn free(self) -> Result<(), TrainError> {
        self.w.free()?;
        if let Some(s) = self.state {
            s.free()?;
        }
        if let Some(g) = self.grad {
            g.win.free()?;
        }
        Ok(())
    }

    fn state(&self) -> &Window<f32> {
        self.state.as_ref().expect("an optimizer with state has a state window")
    }
}

/// Writes `delta` into window `w` straight from its values (no gathering copy), completed at the
/// targets on return: adds it (`accumulate`) at its touched ranges, or over the whole vector
/// when they are too [`scattered`]; or puts it (new values) at its touched ranges only, one put
/// per run of touched keys (the keys it does not touch belong to other ranks' chunks, or to none),
/// and its rows of new values ([`Delta::rows`]) from where the chunks left them.
fn write_delta(
    w: &Window<f32>,
    delta: &mut Delta,
    ranges: &mut Vec<Range<usize>>,
    accumulate: bool,
) -> Result<(), TrainError> {
    let (runs, len) = (delta.runs(), delta.layout().params);
    if accumulate && runs > 1 && scattered(runs, len, w.is_direct()) {
        ranges.clear();
        ranges.push(0..len);
    } else {
        delta.key_ranges(ranges);
    }
    let values = delta.values();
    debug_assert!(!accumulate || delta.rows().next().is_none(), "rows of new values accumulated");
    w.write_scope(|s| {
        if accumulate {
            s.accumulate_at(ranges, values)?;
        } else {
            s.put_at(ranges, values)?;
        }
        if !accumulate {
            for (start, v) in delta.rows() {
                s.put(start, v)?;
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// The keys of a rank's own sparse pulls, and how many of its next pulls read the whole model
/// without gathering keys first. When a pull's keys were scattered with room to spare (twice the
/// runs [`scattered`] asks) or covered two thirds of all keys, the next [`RECHECK`]` - 1` pulls
/// read everything straight away: rows are drawn alike from iteration to iteration, and gathering
/// the keys cost more than the read (sparse LR, 2M x 100k, 2048 rows a rank: 35k inserts, a third
/// of the rank's own time; MF on MovieLens-100k: 7 % of it).
/// Every [`RECHECK`]-th pull gathers them again. Reading whole is never wrong, only dearer when
/// the keys would have been few.
pub(super) struct PullKeys {
    pub set: KeySet,
    /// Pulls left that read whole without gathering keys.
    whole: u32,
    /// Where the chunks may read the weights in place ([`Params::reads_in_place`]): iterations
    /// left that do so without gathering keys.
    place: u32,
}

/// One pull in this many gathers its keys while they keep coming out scattered.
pub(super) const RECHECK: u32 = 16;

impl PullKeys {
    pub(super) fn new(keys: usize) -> Self {
        Self { set: KeySet::new(keys), whole: 0, place: 0 }
    }

    /// Where the chunks may read the weights in place: whether this iteration copies the whole
    /// model instead. In place, a chunk's reads miss on every line the other ranks' pushes just
    /// wrote; a streaming copy of the whole model pays less where the keys are as scattered as
    /// makes a pull read whole ([`read_whole`]: sparse LR on 100k features, 2 ranks, computed
    /// 20 % slower in place than after a copy; on 1M features in place is the cheaper).
    /// `whole_pays` gathers the keys into the set and answers [`read_whole`]'s question; it is
    /// asked every [`RECHECK`]-th iteration, and the answer holds in between.
    pub(super) fn copy_whole(&mut self, whole_pays: impl FnOnce(&mut KeySet) -> Option<bool>) -> bool {
        if self.skip() {
            return true;
        }
        if self.place > 0 {
            self.place -= 1;
            return false;
        }
        self.set.clear();
        let whole = whole_pays(&mut self.set);
        (self.whole, self.place) = if whole.is_some() { (RECHECK - 1, 0) } else { (0, RECHECK - 1) };
        whole.is_some()
    }

    /// Whether this pull reads whole without gathering keys (and counts it).
    pub(super) fn skip(&mut self) -> bool {
        let skip = self.whole > 0;
        self.whole = self.whole.saturating_sub(1);
        skip
    }

    /// Records what a pull that gathered its keys found ([`Params::pull_keys`]'s answer).
    pub(super) fn saw(&mut self, whole_with_room: bool) {
        self.whole = if whole_with_room { RECHECK - 1 } else { 0 };
    }
}

/// How many touched ranges a push by key to a direct window steps at a time
/// ([`Params::push`]): the state of 512 keys, a line each where scattered, is 32 KB.
const KEYS_A_BLOCK: usize = 512;

/// Whether `ranges` are so many that moving all `params` elements costs less: one small one-sided
/// operation costs about as much as moving 512 elements (~100-200 ns against 10-20 GB/s; measured
/// on MF, where 128 and 32 were no better). On a 1M-feature Zipf dataset a 50,000-row batch
/// touches ~100k scattered weights: one 4 MB get instead of 100k gets.
pub(super) fn scattered(ranges: usize, params: usize, direct: bool) -> bool {
    let per = if direct { ELEMENTS_PER_DIRECT_RANGE } else { ELEMENTS_PER_OPERATION };
    ranges.saturating_mul(per) >= params
}

/// Whether a pull of `keys` keys in `runs` runs reads the whole model: when they are
/// [`scattered`], or cover half of all keys (then reading whole moves at most twice the bytes, in
/// one operation per shard; MF on MovieLens-100k, 4,096 ratings a rank: 80 % of the rows). If so,
/// whether with room to spare: twice the runs [`scattered`] asks, or two thirds of the keys.
pub(super) fn read_whole(runs: usize, keys: usize, layout: Layout, direct: bool) -> Option<bool> {
    let all = layout.keys();
    (scattered(runs, layout.params, direct) || 2 * keys >= all)
        .then(|| scattered(runs / 2, layout.params, direct) || 3 * keys >= 2 * all)
}

/// Elements one small one-sided operation costs as much as moving (see [`scattered`]).
const ELEMENTS_PER_OPERATION: usize = 512;

/// Elements a run of keys read or added in place on a direct window costs as much as moving
/// in a whole-vector copy or add: a run is a random access (a cache line, 16 floats, from
/// farther than the streaming copy's) and its share of the update's bookkeeping (the sorted
/// ranges, the clear). Sparse LR under `mpirun -n 2` on one node (AMD EPYC), one epoch, pushes
/// by key against whole vectors: at 100k features (about 8k runs a rank an iteration) 0.10-0.17
/// s against 0.035 s whole; at 1M features (about 15k runs) by key was the cheaper at every
/// constant from 8 to 128. Sorted ascending, the runs are read with the prefetchers' help (in
/// the order the keys came, the same pulls and pushes took twice as long).
const ELEMENTS_PER_DIRECT_RANGE: usize = 32;

/// Whether pulls of `model` read only the keys of the chunks: a sparse model above
/// `dense_pull_below` parameters, unless every rank keeps its own replica.
pub(super) fn keyed<M: Model>(model: &M, cfg: &super::Config, replicated: bool) -> bool {
    model.sparse() && model.layout().params > cfg.dense_pull_below && !replicated
}

#[cfg(test)]
mod tests {
    use super::{read_whole, scattered, PullKeys, RECHECK};
    use crate::model::Layout;

    #[test]
    fn pulls_read_whole_without_keys_while_they_keep_coming_out_scattered() {
        let mut k = PullKeys::new(10);
        assert!(!k.skip(), "the first pull gathers its keys");
        k.saw(true);
        for _ in 1..RECHECK {
            assert!(k.skip());
        }
        assert!(!k.skip(), "every RECHECK-th pull gathers them again");
        k.saw(false);
        assert!(!k.skip() && !k.skip(), "keys not scattered with room: every pull gathers them");
        k.saw(true);
        assert!(k.skip());
        k.saw(false);
        assert!(!k.skip());
    }

    #[test]
    fn pulls_read_whole_when_keys_are_scattered_or_cover_half() {
        // 100 keys of 10 parameters: scattered from 2 runs (1000 / 512), with room from 4.
        let l = Layout { params: 1000, width: 10 };
        assert_eq!(read_whole(1, 49, l, false), None, "one run of under half the keys is read as keys");
        assert_eq!(read_whole(1, 50, l, false), Some(false), "half the keys: whole, but not with room");
        assert_eq!(read_whole(1, 67, l, false), Some(true), "two thirds: whole with room");
        assert_eq!(read_whole(2, 10, l, false), Some(false), "scattered");
        assert_eq!(read_whole(4, 10, l, false), Some(true), "scattered twice over");
    }

    #[test]
    fn scattered_is_a_count_of_runs_against_the_parameters() {
        assert!(!scattered(1, 1000, false) && scattered(2, 1000, false) && scattered(1, 512, false));
        assert!(!scattered(0, 1, false));
        // In place (a direct window), a range costs a random access, not a library call.
        assert!(!scattered(31, 1000, true) && scattered(32, 1000, true));
        // What `pull_keys` asks of "room to spare": twice the runs.
        assert!(scattered(4, 2048, false) && !scattered(4 / 2, 2048, false));
    }
}
