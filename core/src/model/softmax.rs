//! Softmax (multinomial logistic) regression over dense rows: `W` (`classes x cols`) then `b`.

use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Dataset, DenseRows, Kind};
use peregrine_kernels::softmax;

use super::{
    Baseline, Block, Built, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError, Sets,
};

/// Softmax regression, cross-entropy loss.
#[derive(Debug)]
pub struct Softmax {
    data: Sets,
    lr: f32,
    /// L2 weight of `W` (not of `b`).
    l2: f32,
    cols: usize,
    classes: usize,
}

/// Per-thread gradient and logits (of a block of rows: see `softmax::simd::BLOCK_ROWS`).
#[derive(Debug)]
pub struct Work {
    grad: Vec<f32>,
    scratch: Vec<f32>,
    /// Whether chunks add the L2 penalty's gradient (not where the owners do: `without_decay`).
    decay: bool,
}

impl Softmax {
    /// Trains on the dense dataset `train` with learning rate `lr`; evaluates on `eval` (the
    /// training set if `None`).
    pub fn new(train: &Path, eval: Option<&Path>, lr: f32) -> Built<Self> {
        let data = Sets::open(train, eval, Kind::Dense)?;
        let (cols, classes) = super::dense_shape(&data)?;
        if classes < 2 {
            return Err(ModelError::Unfit(format!(
                "training set {}: {classes} class(es), softmax needs 2 or more",
                data.train.path().display()
            )));
        }
        Ok(Self { data, lr, l2: 0.0, cols, classes })
    }

    /// Reading its training and evaluation sets standardized by `scaling` (`peregrine train
    /// --standardize`, and `predict` with such a model): copies of them in memory, the size of
    /// the sets.
    pub fn standardized(mut self, scaling: &peregrine_kernels::data::standardize::Scaling) -> Built<Self> {
        self.data.standardize(scaling)?;
        Ok(self)
    }

    /// With L2 regularization `0.5 l2 |W|^2` (the biases are not regularized).
    #[must_use]
    pub fn with_l2(self, l2: f32) -> Self {
        Self { l2, ..self }
    }

    fn rows_of(d: &Dataset) -> DenseRows<'_> {
        d.dense().expect("the kind is checked when the model is built")
    }

    fn split<'a>(&self, params: &'a [f32]) -> (&'a [f32], &'a [f32]) {
        params.split_at(self.classes * self.cols)
    }
}

impl Model for Softmax {
    type Work = Work;

    fn name(&self) -> &'static str {
        "softmax"
    }

    fn layout(&self) -> Layout {
        Layout::dense(self.classes * (self.cols + 1))
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

    fn init(&self, _seed: u64, _range: Range<usize>, out: &mut [f32]) {
        out.fill(0.0);
    }

    fn sparse(&self) -> bool {
        false
    }

    fn keys(&self, _rows: Range<usize>, _set: &mut KeySet) {}

    fn work(&self, _chunk: usize) -> Work {
        Work {
            grad: vec![0.0; self.layout().params],
            scratch: vec![0.0; softmax::simd::BLOCK_ROWS * self.classes],
            decay: true,
        }
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Work) -> f64 {
        let x = Self::rows_of(&self.data.train).rows(rows);
        let (w, b) = self.split(params);
        let (gw, gb) = work.grad.split_at_mut(self.classes * self.cols);
        let loss = softmax::loss_grad(x.features, x.labels, w, b, gw, gb, &mut work.scratch);
        if self.l2 > 0.0 && work.decay {
            // Each row's share of the regularizer: the iteration's mean gradient gets l2 W.
            peregrine_kernels::dense::axpy(self.l2 * x.len() as f32, w, gw);
        }
        loss
    }

    fn decay(&self) -> Option<(f32, Vec<Range<usize>>)> {
        (self.l2 > 0.0).then(|| (self.l2, std::iter::once(0..self.classes * self.cols).collect()))
    }

    fn without_decay(&self, work: &mut Work) {
        work.decay = false;
    }

    fn drain(&self, work: &mut Work, scale: f32, delta: &mut Delta) {
        delta.take_all(scale, &mut work.grad);
    }

    fn scale(&self, rows: usize) -> f32 {
        -self.lr / rows.max(1) as f32
    }

    fn lr(&self) -> Option<f32> {
        Some(self.lr)
    }

    fn baseline(&self) -> Baseline {
        let classes = self.classes;
        let y = Self::rows_of(self.data.eval()).labels;
        Baseline {
            blind_loss: (classes as f64).ln(),
            constant_metric: Baseline::majority(y.iter().map(|&y| y as usize), classes),
        }
    }

    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let (w, b) = self.split(params);
        let mut z = vec![0.0f32; self.classes];
        let (mut loss, mut right) = (0.0, 0.0);
        for (i, &y) in x.labels.iter().enumerate() {
            let row = &x.features[i * self.cols..(i + 1) * self.cols];
            let guess = softmax::predict(row, w, b, &mut z);
            right += f64::from(u8::from(guess == y));
            loss += softmax::xent_row(&mut z, y as usize);
        }
        [loss, right, x.len() as f64]
    }
}

impl Export for Softmax {
    fn blocks(&self) -> Vec<Block> {
        vec![
            Block::new("weight", &[self.classes, self.cols], 0),
            Block::new("bias", &[self.classes], self.classes * self.cols),
        ]
    }

    fn outputs(&self) -> Vec<String> {
        (0..self.classes).map(|c| format!("p{c}")).collect()
    }

    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>) {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let (w, b) = self.split(params);
        let mut z = vec![0.0f32; self.classes];
        for row in x.features.chunks_exact(self.cols) {
            softmax::predict(row, w, b, &mut z);
            super::softmax_in_place(&mut z);
            out.extend_from_slice(&z);
        }
    }

    fn label(&self, row: usize) -> String {
        Self::rows_of(self.data.eval()).labels[row].to_string()
    }
}
