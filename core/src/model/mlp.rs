//! A multilayer perceptron over dense rows: `cols -> hidden... -> classes`, ReLU between layers,
//! softmax cross-entropy on top. Parameters: per layer `W^T` (`in x out`, a row per input: the
//! order in which the products read it as stored, [`Weights::InOut`]) then `b` (`out`). Model
//! files hold each `W` as PyTorch does, `out x in` ([`Block::transposed`]); checkpoints hold the
//! parameter vector as it is, and say so ([`Export::param_order`]).

use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Dataset, DenseRows, Kind};
use peregrine_kernels::mlp::{self, Matmul, Weights};

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
}

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
        let mut params = 0;
        for l in dims.windows(2) {
            offsets.push(params);
            params += l[1] * (l[0] + 1);
        }
        Ok(Self { data, lr, l2: 0.0, dims, offsets, params })
    }

    fn rows_of(d: &Dataset) -> DenseRows<'_> {
        d.dense().expect("the kind is checked when the model is built")
    }

    fn layers(&self) -> usize {
        self.dims.len() - 1
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
                let (input, output) = ((i - w.start) / self.dims[l + 1], (i - w.start) % self.dims[l + 1]);
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
        }
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Work) -> f64 {
        let x = Self::rows_of(&self.data.train).rows(rows);
        let n = x.len();
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
            b.push(Block::transposed(
                format!("layers.{l}.weight"),
                &[self.dims[l + 1], self.dims[l]],
                w.start,
            ));
            b.push(Block::new(format!("layers.{l}.bias"), &[self.dims[l + 1]], bias.start));
        }
        b
    }

    fn param_order(&self) -> &'static str {
        "weights in x out"
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
