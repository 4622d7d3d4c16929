//! A multilayer perceptron over dense rows: `cols -> hidden... -> classes`, ReLU between layers,
//! softmax cross-entropy on top. Parameters: per layer `W^T` (`in x out`, a row per input: the
//! order in which the products read it as stored, [`Weights::InOut`]) then `b` (`out`). Model
//! files hold each `W` as PyTorch does, `out x in` (`Block::transposed`); checkpoints hold the
//! parameter vector as it is, and say so ([`Export::param_order`]).

use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Dataset, DenseRows, Kind};
use peregrine_kernels::mlp::{self, Matmul, Op, Weights};

use crate::team::SharedGrad;

use super::{
    Baseline, Block, Built, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError, Sets,
};

/// The MLP.
#[derive(Debug)]
pub struct Mlp {
    data: Sets,
    lr: f32,
    /// L2 weight of every layer's `W` (not of the biases).
    l2: f32,
    /// Layer widths, input first, classes last.
    dims: Vec<usize>,
    /// Offset of each layer's `W^T` in the parameter vector (`b` follows it).
    offsets: Vec<usize>,
    params: usize,
    /// The rank's threads split the hidden units ([`split_units`](Mlp::split_units)): the first
    /// layer's `W^T` is held in blocks of [`UNIT_BLOCK`] units.
    split: bool,
}

/// Hidden units per block of the first layer's weights of an MLP split by units: each block is
/// the `in x 32` columns of `W^T` for 32 units (the last one narrower), row-major, so that a
/// thread's units are whole blocks, side by side in the vector, and each block is the operand of
/// one product as stored (the AVX-512 micro-kernel's tile is 32 columns wide).
pub const UNIT_BLOCK: usize = 32;

/// Per-thread activations, their gradients, the parameter gradient and the product runner.
#[derive(Debug)]
pub struct Work {
    acts: Vec<Vec<f32>>,
    grads: Vec<Vec<f32>>,
    grad: Vec<f32>,
    mm: Matmul,
    /// Whether chunks add the L2 penalty's gradient (not where the owners do: `without_decay`).
    decay: bool,
    /// `grad` holds old values, not zeros (traded for a stale update's vector:
    /// [`Delta::take_all_unzeroed`]): the next chunk writes it instead of adding to it.
    stale: bool,
    /// A team member's logits over its hidden units (split units), before the team's sum.
    part: Vec<f32>,
}

impl Mlp {
    /// An MLP with hidden layers `hidden` on the dense dataset `train` (learning rate `lr`),
    /// evaluated on `eval` (the training set if `None`).
    pub fn new(train: &Path, eval: Option<&Path>, hidden: &[usize], lr: f32) -> Built<Self> {
        let data = Sets::open(train, eval, Kind::Dense)?;
        let (cols, classes) = super::dense_shape(&data)?;
        if classes < 2 || hidden.contains(&0) {
            return Err(ModelError::Unfit(format!(
                "an MLP needs 2 or more classes ({classes}) and no empty hidden layer ({hidden:?})"
            )));
        }
        let dims: Vec<usize> = std::iter::once(cols).chain(hidden.iter().copied()).chain([classes]).collect();
        let mut offsets = Vec::new();
        let mut params = 0usize;
        for l in dims.windows(2) {
            offsets.push(params);
            params = l[0]
                .checked_add(1)
                .and_then(|i| l[1].checked_mul(i))
                .and_then(|n| params.checked_add(n))
                .ok_or_else(|| {
                    ModelError::Unfit(format!(
                        "an MLP {} has more parameters than an index numbers",
                        dims.iter().map(ToString::to_string).collect::<Vec<_>>().join("-")
                    ))
                })?;
        }
        Ok(Self { data, lr, l2: 0.0, dims, offsets, params, split: false })
    }

    /// The MLP whose hidden units a rank's threads split between them (`--split units`,
    /// [`crate::team`]): each thread computes its units' share of every chunk, for all the
    /// chunk's rows, and steps their weights (its blocks of the first layer's `W^T`, its part of
    /// `b`, its rows of the output layer's `W^T`), so that they stay in its core's cache; the
    /// threads sum their logits. The first layer's `W^T` is held in blocks of [`UNIT_BLOCK`]
    /// units, so that each thread's units are one range of the parameter vector and each block
    /// one product's operand: checkpoints say so and are refused by a run that splits otherwise.
    ///
    /// # Errors
    /// [`ModelError::Unfit`] unless the MLP has one hidden layer.
    pub fn split_units(self) -> Built<Self> {
        if self.dims.len() != 3 {
            return Err(ModelError::Unfit(format!(
                "the threads split the hidden units of an MLP with one hidden layer, not {} ({:?})",
                self.dims.len() - 2,
                &self.dims[1..self.dims.len() - 1]
            )));
        }
        Ok(Self { split: true, ..self })
    }

    /// Blocks of the first layer's units (split units).
    fn unit_blocks(&self) -> usize {
        self.dims[1].div_ceil(UNIT_BLOCK)
    }

    /// The hidden units of blocks `b` (split units).
    fn block_units(&self, b: Range<usize>) -> Range<usize> {
        (b.start * UNIT_BLOCK).min(self.dims[1])..(b.end * UNIT_BLOCK).min(self.dims[1])
    }

    /// Where blocks `b` of the first layer's weights lie (split units): every block before the
    /// last is [`UNIT_BLOCK`] units wide.
    fn block_params(&self, b: Range<usize>) -> Range<usize> {
        let (start, n_in) = (self.offsets[0], self.dims[0]);
        let u = self.block_units(b);
        start + u.start * n_in..start + u.end * n_in
    }

    /// Where the first layer's bias of hidden units `u` lies.
    fn unit_bias(&self, u: Range<usize>) -> Range<usize> {
        let b0 = self.wb(0).1;
        b0.start + u.start..b0.start + u.end
    }

    /// Where the output layer's rows of `W^T` for hidden units `u` lie.
    fn out_rows(&self, u: Range<usize>) -> Range<usize> {
        let (w1, c) = (self.wb(1).0, self.dims[2]);
        w1.start + u.start * c..w1.start + u.end * c
    }

    /// Blocks `part` of `parts` has (split units): an even share, the first ones one more.
    fn share(&self, part: usize, parts: usize) -> Range<usize> {
        let (nb, parts) = (self.unit_blocks(), parts.max(1));
        let at = |p: usize| p * (nb / parts) + p.min(nb % parts);
        at(part)..at(part + 1)
    }

    fn rows_of(d: &Dataset) -> DenseRows<'_> {
        d.dense().expect("the kind is checked when the model is built")
    }

    fn layers(&self) -> usize {
        self.dims.len() - 1
    }

    /// Reading its training and evaluation sets standardized by `scaling` (`peregrine train
    /// --standardize`, and `predict` with such a model): copies of them in memory, the size of
    /// the sets.
    pub fn standardized(mut self, scaling: &peregrine_kernels::data::standardize::Scaling) -> Built<Self> {
        self.data.standardize(scaling)?;
        Ok(self)
    }

    /// With L2 regularization `0.5 l2 |W|^2` of every layer's weights (not of the biases).
    #[must_use]
    pub fn with_l2(self, l2: f32) -> Self {
        Self { l2, ..self }
    }

    /// `W^T` and `b` of layer `l` within `params` (or a gradient of the same layout).
    fn wb(&self, l: usize) -> (Range<usize>, Range<usize>) {
        let (i, o, s) = (self.dims[l], self.dims[l + 1], self.offsets[l]);
        (s..s + o * i, s + o * i..s + o * (i + 1))
    }

    fn buffers(&self, n: usize) -> Vec<Vec<f32>> {
        self.dims[1..].iter().map(|&d| vec![0.0; n * d]).collect()
    }

    /// Grows `bufs` (from [`buffers`](Self::buffers)) to hold `n` rows: the engine computes a
    /// run of consecutive chunks in one call.
    fn fit(&self, bufs: &mut [Vec<f32>], n: usize) {
        for (b, &d) in bufs.iter_mut().zip(&self.dims[1..]) {
            if b.len() < n * d {
                b.resize(n * d, 0.0);
            }
        }
    }

    /// Forward pass of `x` (`n` rows) into `acts`; returns the logits' layer index.
    fn forward(&self, mm: &mut Matmul, x: &[f32], params: &[f32], acts: &mut [Vec<f32>], n: usize) {
        if self.split {
            // The hidden layer block by block (each block's `n x width` activations in turn),
            // the logits summed over the blocks.
            let (h, z) = acts.split_at_mut(1);
            let c = self.dims[2];
            let (b1, z) = (self.wb(1).1, &mut z[0][..n * c]);
            for row in z.chunks_exact_mut(c) {
                row.copy_from_slice(&params[b1.clone()]);
            }
            self.hidden(mm, x, params, 0..self.unit_blocks(), &mut h[0][..n * self.dims[1]]);
            self.logits(mm, params, 0..self.unit_blocks(), &h[0][..n * self.dims[1]], 1.0, z);
            return;
        }
        for l in 0..self.layers() {
            let (w, b) = self.wb(l);
            let (before, rest) = acts.split_at_mut(l);
            let input = if l == 0 { x } else { &before[l - 1][..n * self.dims[l]] };
            let out = &mut rest[0][..n * self.dims[l + 1]];
            mlp::dense_forward(mm, input, &params[w], Weights::InOut, &params[b], out);
            if l + 1 < self.layers() {
                mlp::relu(out);
            }
        }
    }

    /// Split units: the activations of the hidden units of blocks `blocks` for the `n` rows of
    /// `x`, block after block (`n x width` each) in `h`.
    fn hidden(&self, mm: &mut Matmul, x: &[f32], params: &[f32], blocks: Range<usize>, h: &mut [f32]) {
        let n = x.len() / self.dims[0];
        let first = self.block_units(blocks.clone()).start;
        for b in blocks {
            let u = self.block_units(b..b + 1);
            let hb = &mut h[in_part(n, &u, first)];
            let bias = &params[self.unit_bias(u)];
            mlp::dense_forward(mm, x, &params[self.block_params(b..b + 1)], Weights::InOut, bias, hb);
            mlp::relu(hb);
        }
    }

    /// Split units: `z <- beta z + h W` over the units of blocks `blocks` (`h` as [`hidden`]
    /// leaves it, `W` their rows of the output layer's `W^T`).
    ///
    /// [`hidden`]: Self::hidden
    fn logits(
        &self,
        mm: &mut Matmul,
        params: &[f32],
        blocks: Range<usize>,
        h: &[f32],
        beta: f32,
        z: &mut [f32],
    ) {
        let c = self.dims[2];
        let n = z.len() / c;
        let first = self.block_units(blocks.clone()).start;
        let mut beta = beta;
        for b in blocks {
            let u = self.block_units(b..b + 1);
            let (hb, w) = (&h[in_part(n, &u, first)], &params[self.out_rows(u.clone())]);
            mm.matmul(Op::N, Op::N, n, c, u.len(), 1.0, hb, w, beta, z);
            beta = 1.0;
        }
        if beta == 0.0 {
            z.fill(0.0);
        }
    }

    /// Split units: rows `x` through the units of blocks `blocks` (those of member `lead` = 0 also
    /// the output bias), their logits summed over the team by `sum`; writes the gradient of those
    /// units' weights into `target`; returns the rows' summed loss.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        &self,
        x: &DenseRows<'_>,
        params: &[f32],
        s: Scratch<'_>,
        blocks: Range<usize>,
        target: SharedGrad,
        lead: bool,
        sum: impl FnOnce(&[f32], &mut [f32]),
    ) -> f64 {
        let (n, c) = (x.len(), self.dims[2]);
        let u = self.block_units(blocks.clone());
        let k = u.len();
        let b1 = self.wb(1).1;
        self.fit(s.acts, n);
        self.fit(s.grads, n);
        if s.part.len() < n * c {
            s.part.resize(n * c, 0.0);
        }
        let (h, z) = s.acts.split_at_mut(1);
        let (h, z, zp) = (&mut h[0][..n * k], &mut z[0][..n * c], &mut s.part[..n * c]);
        self.hidden(s.mm, x.features, params, blocks.clone(), h);
        self.logits(s.mm, params, blocks.clone(), h, 0.0, zp);
        sum(zp, z);
        for row in z.chunks_exact_mut(c) {
            peregrine_kernels::dense::axpy(1.0, &params[b1.clone()], row);
        }
        let (dh, dz) = s.grads.split_at_mut(1);
        let (dh, dz) = (&mut dh[0][..n * k], &mut dz[0][..n * c]);
        let loss = mlp::softmax_cross_entropy(z, x.labels, dz);
        let accumulate = !target.fresh;
        if lead {
            // SAFETY: the leader's own range ([`Model::units`]), during its run.
            let gb1 = unsafe { target.slice(b1) };
            if !accumulate {
                gb1.fill(0.0);
            }
            for row in dz.chunks_exact(c) {
                peregrine_kernels::dense::axpy(1.0, row, gb1);
            }
        }
        let beta = if accumulate { 1.0 } else { 0.0 };
        let decay = (self.l2 > 0.0 && s.decay).then_some(self.l2 * n as f32);
        for b in blocks {
            let ub = self.block_units(b..b + 1);
            let at = in_part(n, &ub, u.start);
            let (hb, dhb) = (&h[at.clone()], &mut dh[at]);
            let (w1b, vb) = (self.out_rows(ub.clone()), self.block_params(b..b + 1));
            // SAFETY: this member's own ranges ([`Model::units`]), during its run.
            let (gw1, gv, gb0) = unsafe {
                (
                    target.slice(w1b.clone()),
                    target.slice(vb.clone()),
                    target.slice(self.unit_bias(ub.clone())),
                )
            };
            // The output layer's rows for these units, and the units' gradient (its bias is the
            // leader's, above).
            s.mm.matmul(Op::T, Op::N, ub.len(), c, n, 1.0, hb, dz, beta, gw1);
            s.mm.matmul(Op::N, Op::T, n, ub.len(), c, 1.0, dz, &params[w1b.clone()], 0.0, dhb);
            mlp::relu_backward(hb, dhb);
            mlp::dense_backward_as(
                s.mm,
                x.features,
                &params[vb.clone()],
                Weights::InOut,
                dhb,
                gv,
                gb0,
                None,
                accumulate,
            );
            if let Some(f) = decay {
                // Each row's share of the regularizer, as in `compute`.
                peregrine_kernels::dense::axpy(f, &params[vb], gv);
                peregrine_kernels::dense::axpy(f, &params[w1b], gw1);
            }
        }
        loss
    }
}

/// Where the `n x width` values of hidden units `u` lie in a buffer that holds those of units
/// from `first` on, block after block (split units).
fn in_part(n: usize, u: &Range<usize>, first: usize) -> Range<usize> {
    n * (u.start - first)..n * (u.end - first)
}

/// A [`Work`]'s buffers for a pass of split units, without its gradient (written through a
/// [`SharedGrad`]).
struct Scratch<'a> {
    acts: &'a mut [Vec<f32>],
    grads: &'a mut [Vec<f32>],
    mm: &'a mut Matmul,
    part: &'a mut Vec<f32>,
    decay: bool,
}

impl Work {
    /// The buffers of a pass, `self.grad` apart.
    fn scratch(&mut self) -> Scratch<'_> {
        Scratch {
            acts: &mut self.acts,
            grads: &mut self.grads,
            mm: &mut self.mm,
            part: &mut self.part,
            decay: self.decay,
        }
    }
}

impl Model for Mlp {
    type Work = Work;

    fn name(&self) -> &'static str {
        "mlp"
    }

    fn layout(&self) -> Layout {
        Layout::dense(self.params)
    }

    fn rows(&self) -> usize {
        self.data.train.rows()
    }

    fn eval_rows(&self) -> usize {
        self.data.eval().rows()
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    /// Weights uniform in `[-a, a)`, `a = sqrt(6 / fan_in)` (He), biases zero. Each weight
    /// draws by its place in `W` (`out x in`), so the initial network is the same whatever order
    /// the vector holds it in.
    fn init(&self, seed: u64, range: Range<usize>, out: &mut [f32]) {
        for (i, o) in range.zip(out) {
            let l = self.offsets.partition_point(|&s| s <= i) - 1;
            let (w, _) = self.wb(l);
            *o = if w.contains(&i) {
                // Row `input`, column `output` of `W^T` is `W[output][input]`.
                let (input, output) = if l == 0 && self.split {
                    // Block `b` is `in x width` from its first unit's place.
                    let (j, n_in) = (i - w.start, self.dims[0]);
                    let b = j / (UNIT_BLOCK * n_in);
                    let u = self.block_units(b..b + 1);
                    let within = j - u.start * n_in;
                    (within / u.len(), u.start + within % u.len())
                } else {
                    ((i - w.start) / self.dims[l + 1], (i - w.start) % self.dims[l + 1])
                };
                super::uniform(
                    seed,
                    w.start + output * self.dims[l] + input,
                    (6.0 / self.dims[l] as f32).sqrt(),
                )
            } else {
                0.0
            };
        }
    }

    fn sparse(&self) -> bool {
        false
    }

    fn keys(&self, _rows: Range<usize>, _set: &mut KeySet) {}

    fn work(&self, chunk: usize) -> Work {
        Work {
            acts: self.buffers(chunk),
            grads: self.buffers(chunk),
            grad: vec![0.0; self.params],
            mm: Matmul::default(),
            decay: true,
            stale: false,
            part: Vec::new(),
        }
    }

    /// Split by units: the rows' features, asked for in L2 by the products of the next
    /// compute that have no panel of their own to ask for ahead ([`Matmul::warm`]), mostly the
    /// weight gradients, which read the current rows from cache. A block's forward has one
    /// column panel of 32 units, whose tiles ask ahead for only half of the next row panel, so
    /// without it the next chunk's forward waits on memory: one thread's forward of 128 rows
    /// through its 64 units took 83-85 us with the rows read from a 60,000-row set and 71-73 us
    /// with them asked for during the weight gradients before it (those 78 -> 79-81 us), 70 us
    /// with the rows in cache (Intel Xeon, AVX-512, one process, 2000 iterations, runs
    /// alternated). Training one rank of 2 threads at batch 128: an iteration 204-218 -> 191-200
    /// us, 564k-601k -> 617k-637k samples/s (3 runs each, alternated); at batch 512 758-761 ->
    /// 711-726 us, 653k-655k -> 682k-690k (2 runs each; the stream capped at a quarter of L2,
    /// 512 KiB of the 1.6 MB chunk, ran the same in 4 more pairs).
    ///
    /// Split by rows, nothing: the first layer's forward has four column panels, whose tiles ask
    /// ahead for all of the next row panel, and the rank's share of a batch is half the rows.
    /// With 2 MPI ranks at batch 128, asking for the whole next chunk took 3-7 % off the samples
    /// per second in 4 of 5 alternated pairs (1 % more in the fifth; more lines held in L2
    /// beside the weights, the gradient and the shard), and asking for its first 8 rows (the
    /// panel nothing asks ahead for) moved them by -4 to +1.5 % in 3 pairs: no gain.
    fn ahead(&self, _epoch: u64, rows: Range<usize>, work: &mut Work) {
        if self.split {
            work.mm.warm(Self::rows_of(&self.data.train).rows(rows).features);
        }
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Work) -> f64 {
        let x = Self::rows_of(&self.data.train).rows(rows);
        let n = x.len();
        if self.split {
            // All the units, as one member.
            let target = self.team_target(work);
            return self.pass(&x, params, work.scratch(), 0..self.unit_blocks(), target, true, |a, z| {
                z.copy_from_slice(a)
            });
        }
        let top = self.layers() - 1;
        self.fit(&mut work.acts, n);
        self.fit(&mut work.grads, n);
        self.forward(&mut work.mm, x.features, params, &mut work.acts, n);
        let c = self.dims[top + 1];
        let fresh = std::mem::take(&mut work.stale);
        let loss =
            mlp::softmax_cross_entropy(&work.acts[top][..n * c], x.labels, &mut work.grads[top][..n * c]);
        for l in (0..=top).rev() {
            let (w, b) = self.wb(l);
            let (gw, gb) = {
                let (lo, hi) = work.grad.split_at_mut(b.start);
                (&mut lo[w.start..], &mut hi[..b.len()])
            };
            let (gbelow, gabove) = work.grads.split_at_mut(l);
            let dy = &gabove[0][..n * self.dims[l + 1]];
            let input = if l == 0 { x.features } else { &work.acts[l - 1][..n * self.dims[l]] };
            let gx = if l == 0 { None } else { Some(&mut gbelow[l - 1][..n * self.dims[l]]) };
            mlp::dense_backward_as(
                &mut work.mm,
                input,
                &params[w.clone()],
                Weights::InOut,
                dy,
                gw,
                gb,
                gx,
                !fresh,
            );
            if self.l2 > 0.0 && work.decay {
                // Each row's share of the regularizer: the iteration's mean gradient gets l2 W.
                let gw = &mut work.grad[w.clone()];
                peregrine_kernels::dense::axpy(self.l2 * n as f32, &params[w], gw);
            }
            if l > 0 {
                mlp::relu_backward(
                    &work.acts[l - 1][..n * self.dims[l]],
                    &mut gbelow[l - 1][..n * self.dims[l]],
                );
            }
        }
        loss
    }

    fn drain(&self, work: &mut Work, scale: f32, delta: &mut Delta) {
        if std::mem::take(&mut work.stale) {
            // No chunk since the last drain: its contribution is zeros.
            work.grad.fill(0.0);
        }
        work.stale = delta.take_all_unzeroed(scale, &mut work.grad);
    }

    /// Member `part`'s hidden units (split units): its blocks of the first layer's `W^T`, its
    /// part of the first `b`, its rows of the output layer's `W^T`; the leader also has the
    /// output `b`.
    fn units(&self, part: usize, parts: usize) -> Option<Vec<Range<usize>>> {
        if !self.split {
            return None;
        }
        let blocks = self.share(part, parts);
        let u = self.block_units(blocks.clone());
        let mut r = vec![self.block_params(blocks), self.unit_bias(u.clone()), self.out_rows(u)];
        if part == 0 {
            r.push(self.wb(1).1);
        }
        Some(r)
    }

    fn team_target(&self, work: &mut Work) -> SharedGrad {
        let fresh = std::mem::take(&mut work.stale);
        SharedGrad::new(&mut work.grad, fresh)
    }

    /// Member `part`'s hidden units for all of `rows`: their activations, its share of the
    /// logits (summed by the team), the loss, and the gradient of its units' weights.
    fn compute_part(
        &self,
        _epoch: u64,
        rows: Range<usize>,
        params: &[f32],
        work: &mut Work,
        part: &crate::team::Part<'_>,
    ) -> f64 {
        if let Some((epoch, next)) = part.ahead.clone() {
            self.ahead(epoch, next, work);
        }
        let x = Self::rows_of(&self.data.train).rows(rows);
        let blocks = self.share(part.index, part.of);
        self.pass(&x, params, work.scratch(), blocks, part.target, part.index == 0, |a, z| part.sum(a, z))
    }

    fn scale(&self, rows: usize) -> f32 {
        -self.lr / rows.max(1) as f32
    }

    fn lr(&self) -> Option<f32> {
        Some(self.lr)
    }

    fn decay(&self) -> Option<(f32, Vec<Range<usize>>)> {
        (self.l2 > 0.0).then(|| (self.l2, (0..self.layers()).map(|l| self.wb(l).0).collect()))
    }

    fn without_decay(&self, work: &mut Work) {
        work.decay = false;
    }

    /// Each call streams every layer's weights and their gradient through the cache. At
    /// 784-128-10 on Fashion-MNIST, batch 128 in chunks of 16 under LB-BSP, rank 0 at half
    /// speed (2 MPI ranks, Zen 4, 4 runs of each binary alternated): 130k-162k samples/s chunk
    /// by chunk, 168k-206k with runs in one call.
    fn joins_chunks(&self) -> bool {
        true
    }

    fn baseline(&self) -> Baseline {
        let classes = *self.dims.last().expect("an output layer");
        let y = Self::rows_of(self.data.eval()).labels;
        Baseline {
            blind_loss: (classes as f64).ln(),
            constant_metric: Baseline::majority(y.iter().map(|&y| y as usize), classes),
        }
    }

    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let mut mm = Matmul::default();
        let block = 256;
        let mut acts = self.buffers(block);
        let c = *self.dims.last().expect("at least two layers");
        let mut g = vec![0.0f32; block * c];
        let (mut loss, mut right) = (0.0, 0.0);
        for s in (0..x.len()).step_by(block) {
            let e = (s + block).min(x.len());
            let n = e - s;
            let xb = x.rows(s..e);
            self.forward(&mut mm, xb.features, params, &mut acts, n);
            let z = &acts[self.layers() - 1][..n * c];
            for (i, &y) in xb.labels.iter().enumerate() {
                right += f64::from(u8::from(mlp_argmax(&z[i * c..(i + 1) * c]) == y as usize));
            }
            loss += mlp::softmax_cross_entropy(z, xb.labels, &mut g[..n * c]);
        }
        [loss, right, x.len() as f64]
    }
}

fn mlp_argmax(z: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in z.iter().enumerate() {
        if v > z[best] {
            best = i;
        }
    }
    best
}

impl Export for Mlp {
    fn blocks(&self) -> Vec<Block> {
        let mut b = Vec::new();
        for l in 0..self.layers() {
            let (w, bias) = self.wb(l);
            let (name, shape) = (format!("layers.{l}.weight"), [self.dims[l + 1], self.dims[l]]);
            b.push(if l == 0 && self.split {
                Block::transposed(name, &shape, w.start).in_blocks(UNIT_BLOCK)
            } else {
                Block::transposed(name, &shape, w.start)
            });
            b.push(Block::new(format!("layers.{l}.bias"), &[self.dims[l + 1]], bias.start));
        }
        b
    }

    fn param_order(&self) -> &'static str {
        if self.split {
            "weights in x out, the first layer's in blocks of 32 units"
        } else {
            "weights in x out"
        }
    }

    fn outputs(&self) -> Vec<String> {
        (0..*self.dims.last().expect("at least two layers")).map(|c| format!("p{c}")).collect()
    }

    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>) {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let mut mm = Matmul::default();
        let block = 256;
        let mut acts = self.buffers(block);
        let c = *self.dims.last().expect("at least two layers");
        for s in (0..x.len()).step_by(block) {
            let n = (s + block).min(x.len()) - s;
            self.forward(&mut mm, x.rows(s..s + n).features, params, &mut acts, n);
            for z in acts[self.layers() - 1][..n * c].chunks_exact_mut(c) {
                super::softmax_in_place(z);
                out.extend_from_slice(z);
            }
        }
    }

    fn label(&self, row: usize) -> String {
        Self::rows_of(self.data.eval()).labels[row].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::team::{SharedGrad, Team};
    use peregrine_kernels::data::gen::{self, DenseSpec};

    /// Rows `rows`' gradient and loss computed by a team of `parts` (into a buffer of old values
    /// when `fresh`), against the model's own `compute` into zeros.
    fn team_against_whole(m: &Mlp, parts: usize, fresh: bool) {
        let n = m.layout().params;
        let params: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 / 101.0 - 0.5) * 0.4).collect();
        let rows = 3..45;
        let mut whole = m.work(8);
        let want_loss = m.compute(rows.clone(), &params, &mut whole);
        // The ranges cover the vector once.
        let mut covered = vec![0u32; n];
        for p in 0..parts {
            for r in m.units(p, parts).expect("units") {
                covered[r].iter_mut().for_each(|c| *c += 1);
            }
        }
        assert!(covered.iter().all(|&c| c == 1), "{parts} members: {covered:?}");
        let team = Team::new(parts);
        let mut lead = m.work(8);
        if fresh {
            lead.grad.fill(7.0);
            lead.stale = true;
        }
        let target = m.team_target(&mut lead);
        assert_eq!(target.fresh, fresh);
        let start = team.posted();
        let (loss, others) = std::thread::scope(|s| {
            let members: Vec<_> = (1..parts)
                .map(|index| {
                    let (team, params) = (&team, &params);
                    s.spawn(move || {
                        let (mut w, mut losses) = (m.work(8), Vec::new());
                        team.follow(index, start, |epoch, rows, p, part| {
                            // (Checked after the run: a member that panics leaves the others waiting.)
                            losses.push((
                                std::ptr::eq(p, &params[..]),
                                m.compute_part(epoch, rows, p, &mut w, part),
                            ));
                        });
                        losses
                    })
                })
                .collect();
            // The leader hints at rows to come (only the cache sees it).
            let loss =
                team.run((0, rows.clone()), Some((0, 0..rows.len())), &params, target, parts, |part| {
                    m.compute_part(0, rows.clone(), &params, &mut m.work(8), part)
                });
            team.close();
            (loss, members.into_iter().flat_map(|h| h.join().expect("member")).collect::<Vec<_>>())
        });
        assert_eq!(others.len(), parts - 1, "one run for each member");
        for (same, l) in others.into_iter().chain([(true, loss)]) {
            assert!(same, "every member reads the leader's parameters");
            assert!((l - want_loss).abs() <= 1e-5 * want_loss.abs(), "{parts}: loss {l} vs {want_loss}");
        }
        for (i, (g, w)) in lead.grad.iter().zip(&whole.grad).enumerate() {
            assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{parts} members, param {i}: {g} vs {w}");
        }
        let _ = SharedGrad::new(&mut [], false);
    }

    #[test]
    fn a_team_splitting_the_hidden_units_computes_the_whole_gradient() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = dir.path().join("d.pgd");
        gen::dense(&DenseSpec { rows: 60, cols: 23, classes: 4, noise: 0.3, seed: 2 }, &data).expect("gen");
        for (hidden, l2) in [(70, 0.0), (70, 0.05), (13, 0.0), (96, 0.0)] {
            let m = Mlp::new(&data, None, &[hidden], 0.1)
                .expect("model")
                .with_l2(l2)
                .split_units()
                .expect("split");
            for parts in [1, 2, 3, 4] {
                for fresh in [false, true] {
                    team_against_whole(&m, parts, fresh);
                }
            }
        }
        let deep = Mlp::new(&data, None, &[5, 4], 0.1).expect("model");
        let e = deep.split_units().expect_err("two hidden layers").to_string();
        assert!(e.contains("one hidden layer, not 2 ([5, 4])"), "{e}");
        let plain = Mlp::new(&data, None, &[5], 0.1).expect("model");
        assert!(plain.units(0, 2).is_none(), "units split only when asked");
    }

    #[test]
    fn an_mlp_whose_parameters_overflow_an_index_is_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = dir.path().join("d.pgd");
        gen::dense(&DenseSpec { rows: 10, cols: 9, classes: 3, noise: 0.3, seed: 5 }, &data).expect("gen");
        for hidden in [&[usize::MAX][..], &[usize::MAX / 4, 8], &[1 << 40, 1 << 40]] {
            let e = Mlp::new(&data, None, hidden, 0.1).expect_err("refused");
            assert!(e.to_string().contains("more parameters than an index numbers"), "{hidden:?}: {e}");
        }
        assert_eq!(
            Mlp::new(&data, None, &[1 << 20], 0.1).expect("model").layout().params,
            (1 << 20) * 13 + 3
        );
    }

    #[test]
    fn a_split_mlp_holds_the_same_network_in_its_own_order() {
        let dir = tempfile::tempdir().expect("tmp");
        let data = dir.path().join("d.pgd");
        gen::dense(&DenseSpec { rows: 40, cols: 9, classes: 3, noise: 0.3, seed: 5 }, &data).expect("gen");
        let plain = Mlp::new(&data, None, &[40], 0.1).expect("model");
        let split = Mlp::new(&data, None, &[40], 0.1).expect("model").split_units().expect("split");
        let n = plain.layout().params;
        let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
        plain.init(3, 0..n, &mut a);
        split.init(3, 0..n, &mut b);
        // Exported in PyTorch's order, the two are one network.
        for (x, y) in plain.blocks().iter().zip(split.blocks()) {
            assert_eq!(x.values(&a), y.values(&b), "{}", x.name);
        }
        assert_ne!(a, b, "the first layer's weights are held in blocks");
        // Written back from the files' order, the vector is the same.
        let mut c = vec![0.0; n];
        for blk in split.blocks() {
            blk.place(&blk.values(&b), &mut c);
        }
        assert_eq!(b, c);
        assert_ne!(plain.param_order(), split.param_order());
        let (ea, eb) = (plain.evaluate(&a, 0..40), split.evaluate(&b, 0..40));
        for (x, y) in ea.iter().zip(&eb) {
            assert!((x - y).abs() <= 1e-4 * x.abs().max(1.0), "{ea:?} vs {eb:?}");
        }
    }
}
