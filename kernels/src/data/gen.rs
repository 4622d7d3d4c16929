//! Seeded synthetic datasets of every kind, at any size, each holding the model that generated
//! it. Every row is generated from its own seed (`seed`, row), so that the file is written in one
//! streaming pass per section, in constant memory, and reruns are identical.
//!
//! - sparse: rows with about `nnz_per_row` features (uniform between half and 1.5x), drawn from a
//!   power law (Zipf with exponent `zipf`: feature `j` has weight `1 / (j+1)^zipf`), values 1;
//!   true weights `w* ~ N(0, 1)`, label `1` with probability `sigmoid(x . w*)`.
//! - dense: features `N(0, 1)`, true weights `W*` (classes x cols) `N(0, 1/cols)`, label the
//!   argmax of `W* x + N(0, noise)`.
//! - one-hot pairs: each row a user and an item, each drawn from its own power law (Zipf with
//!   exponent `zipf` over `users`, then over `items`: a long tail of rare ids), one-hot as two
//!   features (user `u` is feature `u`, item `i` feature `users + i`); true weights `w* ~ N(0, 1)`
//!   (a user's and an item's leaning), label `1` with probability
//!   `sigmoid(w*_u + w*_i + N(0, noise))` (the noise: what the ids do not tell, such as taste).
//!   Like/dislike data from ratings, as a recommender's logistic regression sees it.
//! - ratings: uniform (user, item) pairs, true factors `N(0, 1/sqrt(rank))`, rating
//!   `clamp(3 + 2 u.v + N(0, noise), 1, 5)`.

use std::path::Path;

use super::error::{DataError, Result};
use super::format::{Kind, Shape, Truth, Writer};
use super::libsvm::Converted;

/// SplitMix64: small, fast, good enough for synthetic data; seeded per row.
#[derive(Clone, Copy, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for stream `stream` of seed `seed`.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut r = Self(seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17));
        r.next_u64();
        r
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in 0..n.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Shuffles `v` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        self.shuffle_last(v, v.len().saturating_sub(1));
    }

    /// The first `m` steps of [`shuffle`](Self::shuffle), from the back: the last `m` places of
    /// `v` (`m <= v.len()`) get a uniformly drawn selection of its values, in random order.
    pub fn shuffle_last<T>(&mut self, v: &mut [T], m: usize) {
        let n = v.len();
        for last in (n - m..n).rev() {
            v.swap(last, self.below(last as u64 + 1) as usize);
        }
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u = self.uniform().max(f64::MIN_POSITIVE);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

/// Streams of the generators: one per purpose, so that sections can be regenerated apart.
const TRUTH: u64 = u64::MAX;

/// Options of [`sparse`].
#[derive(Clone, Copy, Debug)]
pub struct SparseSpec {
    /// Rows.
    pub rows: u64,
    /// Features.
    pub cols: u64,
    /// Mean nonzeros per row.
    pub nnz_per_row: u32,
    /// Zipf exponent of feature frequencies (0: uniform).
    pub zipf: f64,
    /// Seed.
    pub seed: u64,
}

/// Inverse-CDF table of a Zipf law over `n` features.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: u64, s: f64) -> Self {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n)
            .map(|j| {
                acc += 1.0 / ((j + 1) as f64).powf(s);
                acc
            })
            .collect();
        for c in &mut cdf {
            *c /= acc;
        }
        Self { cdf }
    }

    fn sample(&self, rng: &mut Rng) -> u32 {
        let u = rng.uniform();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u32
    }
}

/// The sorted, distinct features of row `r`.
fn sparse_row(spec: &SparseSpec, zipf: &Zipf, r: u64, out: &mut Vec<u32>) {
    let mut rng = Rng::new(spec.seed, r);
    let k = u64::from(spec.nnz_per_row);
    let n = (k / 2 + rng.below(k + 1)).clamp(1, spec.cols);
    out.clear();
    for _ in 0..n {
        out.push(zipf.sample(&mut rng));
    }
    out.sort_unstable();
    out.dedup();
}

impl SparseSpec {
    /// Bytes [`sparse`] holds while it writes: the row offsets (8 a row), the true weights and
    /// the features' cumulative frequencies (4 and 8 a feature).
    pub fn memory(&self) -> u128 {
        8 * (u128::from(self.rows) + 1) + 12 * u128::from(self.cols)
    }
}

impl DenseSpec {
    /// Bytes [`dense`] holds while it writes: the true weights (4 a class and feature), a row
    /// and the labels (4 a row).
    pub fn memory(&self) -> u128 {
        4 * u128::from(self.classes) * u128::from(self.cols)
            + 4 * u128::from(self.cols)
            + 4 * u128::from(self.rows)
    }
}

impl RatingsSpec {
    /// Bytes [`ratings`] holds while it writes: the true factors (4 a user or item and rank).
    pub fn memory(&self) -> u128 {
        4 * (u128::from(self.users) + u128::from(self.items)) * u128::from(self.rank)
    }
}

/// Writes `n` values of 1 into section 2 (a sparse file's values: every feature present is 1).
fn write_ones(out: &mut Writer, n: u64) -> Result<()> {
    let ones = vec![1.0f32; 4096];
    let mut left = n;
    while left > 0 {
        let k = left.min(ones.len() as u64) as usize;
        out.write(2, &ones[..k])?;
        left -= k as u64;
    }
    Ok(())
}

fn too_big(what: &str) -> DataError {
    DataError::Invalid(format!("{what} is too large for this format (indices are 32-bit)"))
}

/// Writes a sparse binary-labelled dataset.
pub fn sparse(spec: &SparseSpec, output: &Path) -> Result<Converted> {
    if spec.rows == 0 || spec.cols == 0 || spec.nnz_per_row == 0 {
        return Err(DataError::Invalid("rows, features and nonzeros per row must be >= 1".into()));
    }
    if spec.cols > u64::from(u32::MAX) {
        return Err(too_big("the feature count"));
    }
    let zipf = Zipf::new(spec.cols, spec.zipf);
    let mut truth_rng = Rng::new(spec.seed, TRUTH);
    let w: Vec<f32> = (0..spec.cols).map(|_| truth_rng.normal() as f32).collect();
    // Pass 1: row lengths.
    let mut row = Vec::new();
    let mut row_ptr = Vec::with_capacity(spec.rows as usize + 1);
    row_ptr.push(0u64);
    for r in 0..spec.rows {
        sparse_row(spec, &zipf, r, &mut row);
        row_ptr.push(row_ptr[r as usize] + row.len() as u64);
    }
    let nnz = row_ptr[spec.rows as usize];
    let shape = Shape {
        kind: Kind::Sparse,
        rows: spec.rows,
        cols: spec.cols,
        nnz,
        classes: 2,
        users: 0,
        truth: Truth::Present { rank: 0 },
        scaled: false,
    };
    let mut out = Writer::create(output, shape)?;
    out.write(0, &row_ptr)?;
    drop(row_ptr);
    for r in 0..spec.rows {
        sparse_row(spec, &zipf, r, &mut row);
        out.write(1, &row)?;
    }
    write_ones(&mut out, nnz)?;
    let mut labels = Vec::with_capacity(4096);
    for r in 0..spec.rows {
        sparse_row(spec, &zipf, r, &mut row);
        let z: f64 = row.iter().map(|&j| f64::from(w[j as usize])).sum();
        let mut rng = Rng::new(spec.seed ^ 0x5eed, r);
        labels.push(if rng.uniform() < 1.0 / (1.0 + (-z).exp()) { 1.0f32 } else { 0.0 });
        if labels.len() == 4096 {
            out.write(3, &labels)?;
            labels.clear();
        }
    }
    out.write(3, &labels)?;
    out.write(4, &w)?;
    out.finish()?;
    Ok(Converted { rows: spec.rows, cols: spec.cols, nnz, input_bytes: 0 })
}

/// Options of [`dense`].
#[derive(Clone, Copy, Debug)]
pub struct DenseSpec {
    /// Rows.
    pub rows: u64,
    /// Features.
    pub cols: u64,
    /// Classes.
    pub classes: u32,
    /// Standard deviation of the label noise.
    pub noise: f64,
    /// Seed.
    pub seed: u64,
}

/// Writes a dense multiclass dataset.
pub fn dense(spec: &DenseSpec, output: &Path) -> Result<Converted> {
    if spec.rows == 0 || spec.cols == 0 || spec.classes < 2 {
        return Err(DataError::Invalid("rows and features must be >= 1, classes >= 2".into()));
    }
    let (d, k) = (spec.cols as usize, spec.classes as usize);
    let mut truth_rng = Rng::new(spec.seed, TRUTH);
    let scale = 1.0 / (d as f64).sqrt();
    let w: Vec<f32> = (0..k * d).map(|_| (truth_rng.normal() * scale) as f32).collect();
    let shape = Shape {
        kind: Kind::Dense,
        rows: spec.rows,
        cols: spec.cols,
        nnz: 0,
        classes: spec.classes,
        users: 0,
        truth: Truth::Present { rank: 0 },
        scaled: false,
    };
    let mut out = Writer::create(output, shape)?;
    let mut x = vec![0f32; d];
    let mut labels = Vec::with_capacity(spec.rows as usize);
    for r in 0..spec.rows {
        let mut rng = Rng::new(spec.seed, r);
        for v in &mut x {
            *v = rng.normal() as f32;
        }
        let mut best = (f64::NEG_INFINITY, 0u32);
        for c in 0..k {
            let s: f64 =
                w[c * d..(c + 1) * d].iter().zip(&x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>()
                    + spec.noise * rng.normal();
            if s > best.0 {
                best = (s, c as u32);
            }
        }
        labels.push(best.1);
        out.write(0, &x)?;
    }
    out.write(1, &labels)?;
    out.write(4, &w)?;
    out.finish()?;
    Ok(Converted { rows: spec.rows, cols: spec.cols, nnz: spec.rows * spec.cols, input_bytes: 0 })
}

/// Options of [`onehot`].
#[derive(Clone, Copy, Debug)]
pub struct OnehotSpec {
    /// Rows.
    pub rows: u64,
    /// Users.
    pub users: u64,
    /// Items.
    pub items: u64,
    /// Zipf exponent of user and item frequencies (0: uniform).
    pub zipf: f64,
    /// Standard deviation of the noise added to each row's logit.
    pub noise: f64,
    /// Seed.
    pub seed: u64,
}

impl OnehotSpec {
    /// Bytes [`onehot`] holds while it writes: the true weights (4 a feature) and the ids'
    /// cumulative frequencies (8 a user or item).
    pub fn memory(&self) -> u128 {
        12 * (u128::from(self.users) + u128::from(self.items))
    }
}

/// Writes a sparse binary-labelled dataset of one-hot (user, item) pairs.
pub fn onehot(spec: &OnehotSpec, output: &Path) -> Result<Converted> {
    if spec.rows == 0 || spec.users == 0 || spec.items == 0 {
        return Err(DataError::Invalid("rows, users and items must be >= 1".into()));
    }
    let cols = spec.users.checked_add(spec.items).filter(|&c| c <= u64::from(u32::MAX));
    let Some(cols) = cols else { return Err(too_big("users plus items")) };
    if !(spec.noise.is_finite() && spec.noise >= 0.0) {
        return Err(DataError::Invalid(format!("the noise must be finite and >= 0, not {}", spec.noise)));
    }
    let (users, items) = (Zipf::new(spec.users, spec.zipf), Zipf::new(spec.items, spec.zipf));
    let mut truth_rng = Rng::new(spec.seed, TRUTH);
    let w: Vec<f32> = (0..cols).map(|_| truth_rng.normal() as f32).collect();
    let pair = |r: u64| {
        let mut rng = Rng::new(spec.seed, r);
        let u = users.sample(&mut rng);
        let i = spec.users as u32 + items.sample(&mut rng);
        ([u, i], rng)
    };
    let shape = Shape {
        kind: Kind::Sparse,
        rows: spec.rows,
        cols,
        nnz: 2 * spec.rows,
        classes: 2,
        users: 0,
        truth: Truth::Present { rank: 0 },
        scaled: false,
    };
    let mut out = Writer::create(output, shape)?;
    let mut chunk = Vec::with_capacity(4096);
    for r in 0..=spec.rows {
        chunk.push(2 * r);
        if chunk.len() == 4096 || r == spec.rows {
            out.write(0, &chunk)?;
            chunk.clear();
        }
    }
    let mut ids = Vec::with_capacity(4096);
    for r in 0..spec.rows {
        ids.extend_from_slice(&pair(r).0);
        if ids.len() >= 4096 || r + 1 == spec.rows {
            out.write(1, &ids)?;
            ids.clear();
        }
    }
    write_ones(&mut out, 2 * spec.rows)?;
    let mut labels = Vec::with_capacity(4096);
    for r in 0..spec.rows {
        let ([u, i], mut rng) = pair(r);
        let z = f64::from(w[u as usize]) + f64::from(w[i as usize]) + spec.noise * rng.normal();
        labels.push(if rng.uniform() < 1.0 / (1.0 + (-z).exp()) { 1.0f32 } else { 0.0 });
        if labels.len() == 4096 || r + 1 == spec.rows {
            out.write(3, &labels)?;
            labels.clear();
        }
    }
    out.write(4, &w)?;
    out.finish()?;
    Ok(Converted { rows: spec.rows, cols, nnz: 2 * spec.rows, input_bytes: 0 })
}

/// Options of [`ratings`].
#[derive(Clone, Copy, Debug)]
pub struct RatingsSpec {
    /// Ratings.
    pub rows: u64,
    /// Users.
    pub users: u64,
    /// Items.
    pub items: u64,
    /// Rank of the true factors.
    pub rank: u32,
    /// Standard deviation of the rating noise.
    pub noise: f64,
    /// Seed.
    pub seed: u64,
}

/// Writes a ratings dataset from a known low-rank matrix.
pub fn ratings(spec: &RatingsSpec, output: &Path) -> Result<Converted> {
    if spec.rows == 0 || spec.users == 0 || spec.items == 0 || spec.rank == 0 {
        return Err(DataError::Invalid("ratings, users, items and rank must be >= 1".into()));
    }
    if spec.users > u64::from(u32::MAX) || spec.items > u64::from(u32::MAX) {
        return Err(too_big("the user or item count"));
    }
    let k = spec.rank as usize;
    let mut truth_rng = Rng::new(spec.seed, TRUTH);
    let scale = 1.0 / (k as f64).sqrt();
    let f: Vec<f32> = (0..(spec.users + spec.items) as usize * k)
        .map(|_| (truth_rng.normal() * scale.sqrt()) as f32)
        .collect();
    let (uf, vf) = f.split_at(spec.users as usize * k);
    let shape = Shape {
        kind: Kind::Ratings,
        rows: spec.rows,
        cols: spec.items,
        nnz: 0,
        classes: 0,
        users: spec.users,
        truth: Truth::Present { rank: spec.rank },
        scaled: false,
    };
    let pair = |r: u64| {
        let mut rng = Rng::new(spec.seed, r);
        (rng.below(spec.users) as u32, rng.below(spec.items) as u32, rng)
    };
    let mut out = Writer::create(output, shape)?;
    let mut ids = Vec::with_capacity(4096);
    for section in 0..2 {
        for r in 0..spec.rows {
            let (u, i, _) = pair(r);
            ids.push(if section == 0 { u } else { i });
            if ids.len() == 4096 || r + 1 == spec.rows {
                out.write(section, &ids)?;
                ids.clear();
            }
        }
    }
    let mut values = Vec::with_capacity(4096);
    for r in 0..spec.rows {
        let (u, i, mut rng) = pair(r);
        let (u, i) = (u as usize, i as usize);
        let dot: f32 = uf[u * k..(u + 1) * k].iter().zip(&vf[i * k..(i + 1) * k]).map(|(a, b)| a * b).sum();
        values.push((3.0 + 2.0 * f64::from(dot) + spec.noise * rng.normal()).clamp(1.0, 5.0) as f32);
        if values.len() == 4096 || r + 1 == spec.rows {
            out.write(2, &values)?;
            values.clear();
        }
    }
    out.write(4, &f)?;
    out.finish()?;
    Ok(Converted { rows: spec.rows, cols: spec.items, nnz: spec.rows, input_bytes: 0 })
}
