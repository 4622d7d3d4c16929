//! Matrix factorization: `r_ui ~ mean + b_u + b_i + u_u . v_i`, user rows `U` (`users x (k + 1)`:
//! the factors, then the user's bias) then item rows `V` (`items x (k + 1)`); one key per row.
//! `mean` is the training ratings' mean, a constant; without biases (`with_biases(false)`) rows
//! are the `k` factors and `r_ui ~ u_u . v_i`. Under adaptive rates (`with_adaptive(true)`,
//! `--optimizer adagrad`: libmf's per-row schedule) each row ends with one more value, its `G`
//! (the running mean squared gradient, 1 to start): an additive statistic, so its updates add up
//! across chunks and ranks like the factors'.
//!
//! A chunk runs plain SGD, one step per rating in order (the kernel of libmf and of every
//! Hogwild-style MF), on a private copy of the factor rows its ratings touch, taken from the
//! iteration's snapshot ([`Copies`]); what the chunk changed is its update. Chunks of one
//! iteration thus start from the same parameters whichever rank or thread computes them, and their
//! updates add up.

use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Dataset, Kind, Ratings};
use peregrine_kernels::mf;

use super::{
    Baseline, Block, Built, Copies, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError, Sets,
};

/// Matrix factorization with L2-regularised squared error.
#[derive(Debug)]
pub struct Mf {
    data: Sets,
    lr: f32,
    l2: f32,
    k: usize,
    users: usize,
    items: usize,
    /// User and item biases and the global mean.
    biases: bool,
    /// The training ratings' mean (used with biases).
    mean: f32,
    /// Per-row adaptive rates (a `G` ending each row).
    adaptive: bool,
}

impl Mf {
    /// Rank `k` factorization of the ratings in `train` (SGD step `lr`, L2 weight `l2`),
    /// evaluated on `eval` (the training set if `None`).
    pub fn new(train: &Path, eval: Option<&Path>, k: usize, lr: f32, l2: f32) -> Built<Self> {
        let data = Sets::open(train, eval, Kind::Ratings)?;
        if k == 0 {
            return Err(ModelError::Unfit("matrix factorization needs rank k >= 1".into()));
        }
        let t = data.train.ratings().expect("kind checked");
        let (mut users, mut items) = (t.n_users, t.n_items);
        if let Some(e) = data.given_eval() {
            let e = e.ratings().expect("kind checked");
            (users, items) = (users.max(e.n_users), items.max(e.n_items));
        }
        let mean = t.ratings.iter().map(|&r| f64::from(r)).sum::<f64>() / t.ratings.len().max(1) as f64;
        Ok(Self { data, lr, l2, k, users, items, biases: true, mean: mean as f32, adaptive: false })
    }

    /// With user and item biases and the global mean (the default), or without.
    #[must_use]
    pub fn with_biases(self, biases: bool) -> Self {
        Self { biases, ..self }
    }

    /// With per-row adaptive rates (libmf's schedule: steps of `lr / sqrt(G)` per row), or plain
    /// SGD at `lr` (the default).
    #[must_use]
    pub fn with_adaptive(self, adaptive: bool) -> Self {
        Self { adaptive, ..self }
    }

    /// With global mean `mean` (a model trained on other data than it is applied to).
    #[must_use]
    pub fn with_mean(self, mean: f32) -> Self {
        Self { mean, ..self }
    }

    /// Values per row: the factors, the bias if there is one, `G` under adaptive rates.
    fn width(&self) -> usize {
        self.k + usize::from(self.biases) + usize::from(self.adaptive)
    }

    /// The global mean, if the model has biases.
    fn mean(&self) -> Option<f32> {
        self.biases.then_some(self.mean)
    }

    /// With factors for `users` users and `items` items (at least the datasets'): a model
    /// trained on more users or items than a file to predict holds.
    pub fn with_size(self, users: usize, items: usize) -> Built<Self> {
        if users < self.users || items < self.items {
            return Err(ModelError::Unfit(format!(
                "{} has {} users and {} items, the model {users} and {items}",
                self.data.eval().path().display(),
                self.users,
                self.items
            )));
        }
        Ok(Self { users, items, ..self })
    }

    fn rows_of(d: &Dataset) -> Ratings<'_> {
        d.ratings().expect("the kind is checked when the model is built")
    }

    fn split<'a>(&self, params: &'a [f32]) -> (&'a [f32], &'a [f32]) {
        params.split_at(self.users * self.width())
    }
}

impl Model for Mf {
    type Work = Copies;

    fn name(&self) -> &'static str {
        "mf"
    }

    fn layout(&self) -> Layout {
        Layout { params: (self.users + self.items) * self.width(), width: self.width() }
    }

    fn rows(&self) -> usize {
        self.data.train.rows()
    }

    fn eval_rows(&self) -> usize {
        self.data.eval().rows()
    }

    fn metric(&self) -> Metric {
        Metric::Rmse
    }

    /// Factors uniform in `[-a, a)`, `a = 1 / sqrt(k)`: initial predictions are small but not
    /// zero (zero factors would never move); biases zero; `G` 1.
    fn init(&self, seed: u64, range: Range<usize>, out: &mut [f32]) {
        let a = (1.0 / self.k as f32).sqrt();
        let w = self.width();
        for (i, o) in range.zip(out) {
            *o = match i % w {
                c if c < self.k => super::uniform(seed, i, a),
                c if self.adaptive && c == w - 1 => 1.0,
                _ => 0.0,
            };
        }
    }

    fn sparse(&self) -> bool {
        true
    }

    fn keys(&self, rows: Range<usize>, set: &mut KeySet) {
        let r = Self::rows_of(&self.data.train).rows(rows);
        set.extend(r.users);
        set.extend_shifted(r.items, self.users as u32);
    }

    fn work(&self, _chunk: usize) -> Copies {
        Copies::new(self.layout())
    }

    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Copies) -> f64 {
        let l = self.layout();
        let local = work.take(l, params, |set| self.keys(rows.clone(), set));
        let x = Self::rows_of(&self.data.train).rows(rows);
        let (u, v) = local.split_at_mut(self.users * self.width());
        let (k, lr, l2) = (self.k, self.lr, self.l2);
        let sse = match (self.adaptive, self.mean()) {
            (true, mean) => mf::sgd_chunk_adaptive(x.users, x.items, x.ratings, u, v, k, lr, l2, mean),
            (false, Some(m)) => mf::sgd_chunk_biased(x.users, x.items, x.ratings, u, v, k, lr, l2, m),
            (false, None) => mf::sgd_chunk(x.users, x.items, x.ratings, u, v, k, lr, l2),
        };
        work.settle(l, params);
        sse
    }

    fn drain(&self, work: &mut Copies, scale: f32, delta: &mut Delta) {
        work.drain(self.layout(), scale, delta);
    }

    fn scale(&self, _rows: usize) -> f32 {
        1.0
    }

    fn lr(&self) -> Option<f32> {
        None
    }

    fn baseline(&self) -> Baseline {
        let r = Self::rows_of(self.data.eval()).ratings;
        let n = r.len().max(1) as f64;
        let mean = r.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let square = r.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / n;
        Baseline { blind_loss: square, constant_metric: (square - mean * mean).max(0.0).sqrt() }
    }

    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let (u, v) = self.split(params);
        let sse = mf::sse_rows(x.users, x.items, x.ratings, u, v, self.k, self.width(), self.mean());
        [sse, sse, x.len() as f64]
    }
}

impl Export for Mf {
    fn blocks(&self) -> Vec<Block> {
        let w = self.width();
        vec![Block::new("users", &[self.users, w], 0), Block::new("items", &[self.items, w], self.users * w)]
    }

    /// The mean (with biases), and under adaptive rates a marker `row_state` that each row ends
    /// with its `G` (read back by `predict`, not a factor).
    fn constants(&self) -> Vec<(&'static str, Vec<f32>)> {
        let mut c: Vec<_> = self.mean().map(|m| ("mean", vec![m])).into_iter().collect();
        if self.adaptive {
            c.push(("row_state", vec![1.0]));
        }
        c
    }

    fn outputs(&self) -> Vec<String> {
        vec!["prediction".into()]
    }

    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>) {
        let x = Self::rows_of(self.data.eval()).rows(rows);
        let (u, v) = self.split(params);
        let (k, w) = (self.k, self.width());
        for (&a, &b) in x.users.iter().zip(x.items) {
            let (ur, vr) = (&u[a as usize * w..][..w], &v[b as usize * w..][..w]);
            let bias = self.mean().map_or(0.0, |m| m + ur[k] + vr[k]);
            out.push(bias + ur[..k].iter().zip(&vr[..k]).map(|(p, q)| p * q).sum::<f32>());
        }
    }

    fn label_names(&self) -> &'static str {
        "user,item,rating"
    }

    fn label(&self, row: usize) -> String {
        let r = Self::rows_of(self.data.eval());
        format!("{},{},{}", r.users[row], r.items[row], r.ratings[row])
    }
}
