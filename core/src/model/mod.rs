//! Models over a flat parameter vector that lives, sharded, in one window.
//!
//! A model says how its parameters are laid out ([`Layout`]: keys of `width` parameters, the unit
//! in which sparse models read and write), which keys a set of rows reads ([`Model::keys`]), and
//! how to compute a set of rows against a parameter snapshot into a per-thread [`Model::Work`],
//! which it then drains as an update `delta` (`w <- w + delta`) for the engine to `accumulate`
//! into the owning shards. Gradient models drain `-lr / batch * gradient`; matrix factorization
//! runs SGD over its rows on a private copy of their factors and drains the difference.
//!
//! One window for all of a model's blocks (rather than one per block): a block boundary is just
//! an offset, a dense pull or push is one call, and sparse pulls coalesce neighbouring keys across
//! blocks the same way.

use std::ops::Range;

use peregrine_kernels::data::{Dataset, Kind};

pub use crate::team::PassRows;

pub mod lda;
pub mod lr;
pub mod mf;
pub mod mlp;
pub mod softmax;
pub mod synthetic;

/// A flat parameter vector cut into keys of `width` parameters (the last may be shorter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Parameters.
    pub params: usize,
    /// Parameters per key.
    pub width: usize,
}

impl Layout {
    /// One key holding everything: a dense model.
    pub fn dense(params: usize) -> Self {
        Self { params, width: params.max(1) }
    }

    /// Keys.
    pub fn keys(&self) -> usize {
        self.params.div_ceil(self.width)
    }

    /// The parameters of key `key`.
    #[inline]
    pub fn range(&self, key: u32) -> Range<usize> {
        let s = key as usize * self.width;
        s..(s + self.width).min(self.params)
    }
}

/// A set of keys: a bitmap for membership and the members in insertion order.
#[derive(Clone, Debug)]
pub struct KeySet {
    bits: Vec<u64>,
    list: Vec<u32>,
}

impl KeySet {
    /// An empty set over keys `0..keys`.
    pub fn new(keys: usize) -> Self {
        Self { bits: vec![0; keys.div_ceil(64)], list: Vec::new() }
    }

    /// Adds `key`.
    #[inline]
    pub fn insert(&mut self, key: u32) {
        let (w, b) = ((key / 64) as usize, key % 64);
        if self.bits[w] & (1 << b) == 0 {
            self.bits[w] |= 1 << b;
            self.list.push(key);
        }
    }

    /// Adds every key of `keys`: [`insert`](Self::insert) in bulk, without a branch on whether a
    /// key is new (with features drawn from a skewed distribution, as in sparse LR, that branch
    /// is taken about half the time and mispredicts).
    pub fn extend(&mut self, keys: &[u32]) {
        self.extend_shifted(keys, 0);
    }

    /// Adds `key + shift` for every key of `keys`, as [`extend`](Self::extend) (MF's item rows
    /// follow its user rows).
    pub fn extend_shifted(&mut self, keys: &[u32], shift: u32) {
        let start = self.list.len();
        self.list.resize(start + keys.len(), 0);
        let (bits, list) = (&mut self.bits[..], &mut self.list[..]);
        let mut len = start;
        for &key in keys {
            let key = key + shift;
            let (w, b) = (&mut bits[(key / 64) as usize], 1u64 << (key % 64));
            // Written always, kept (the length moves past it) only if the key is new.
            list[len] = key;
            len += usize::from(*w & b == 0);
            *w |= b;
        }
        self.list.truncate(len);
    }

    /// The members, in insertion order (sorted after [`ranges`](Self::ranges)).
    pub fn keys(&self) -> &[u32] {
        &self.list
    }

    /// Members.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Empties the set in time proportional to its size (or to the bitmap's, when that is less).
    pub fn clear(&mut self) {
        if self.list.len() >= self.bits.len() {
            self.bits.fill(0);
        } else {
            for &k in &self.list {
                self.bits[(k / 64) as usize] = 0;
            }
        }
        self.list.clear();
    }

    /// The number of ranges [`ranges`](Self::ranges) would write (runs of consecutive members),
    /// counted off the bitmap without sorting or writing anything: a run starts at each member
    /// whose predecessor is not one. O(keys / 64).
    pub fn runs(&self) -> usize {
        let mut carry = 0u64;
        let mut n = 0;
        for &w in &self.bits {
            n += (w & !((w << 1) | carry)).count_ones() as usize;
            carry = w >> 63;
        }
        n
    }

    /// Sorts the members and writes the parameter ranges they cover into `out`, neighbouring keys
    /// coalesced.
    pub fn ranges(&mut self, layout: Layout, out: &mut Vec<Range<usize>>) {
        out.clear();
        if self.list.len() * 16 > self.bits.len() {
            // Many keys: reading them off the bitmap in order beats sorting them (150k keys of
            // 1M: a 16k-word scan instead of an O(k log k) sort).
            self.list.clear();
            for (w, &word) in self.bits.iter().enumerate() {
                let mut b = word;
                while b != 0 {
                    self.list.push((w * 64) as u32 + b.trailing_zeros());
                    b &= b - 1;
                }
            }
        } else {
            self.list.sort_unstable();
        }
        for &k in &self.list {
            let r = layout.range(k);
            match out.last_mut() {
                Some(last) if last.end == r.start => last.end = r.end,
                _ => out.push(r),
            }
        }
    }
}

/// An update to push: values over the whole vector and the keys they touch; and, from the
/// chunks of a [`disjoint`](Model::disjoint) batch, whole rows of new values side by side
/// ([`rows`](Self::rows)), which are only ever put, never added.
#[derive(Clone, Debug)]
pub struct Delta {
    layout: Layout,
    values: Vec<f32>,
    keys: KeySet,
    /// New values of the keys of `row_keys`, a row of `layout.width` each, in that order.
    rows: Vec<f32>,
    row_keys: Vec<u32>,
    /// Nothing touched, and the vector holds old values, not zeros ([`discard`](Self::discard)).
    stale: bool,
}

impl Delta {
    /// A zero update.
    pub fn new(layout: Layout) -> Self {
        Self {
            layout,
            values: vec![0.0; layout.params],
            keys: KeySet::new(layout.keys()),
            rows: Vec::new(),
            row_keys: Vec::new(),
            stale: false,
        }
    }

    /// Empties the update for a drain into it: [`clear`](Self::clear), except that a dense
    /// update's vector (one key, all of it touched) is only marked stale, not zeroed: a drain
    /// then trades it for the thread's buffer ([`take_all_unzeroed`](Self::take_all_unzeroed)),
    /// which the thread's next chunk overwrites instead of adding to (the MLP: no pass writing
    /// 400 KB of zeros an iteration), or anything else that adds to it zeroes it first.
    pub fn discard(&mut self) {
        if self.layout.keys() == 1 && !self.keys.is_empty() && self.row_keys.is_empty() {
            self.keys.clear();
            self.stale = true;
        } else {
            self.clear();
        }
    }

    /// Zeroes a stale vector ([`discard`](Self::discard)) before values are added to it.
    #[inline]
    fn clean(&mut self) {
        if self.stale {
            self.values.fill(0.0);
            self.stale = false;
        }
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Adds `scale * src` to key `key` (`src` spans the key).
    #[inline]
    pub fn add(&mut self, key: u32, scale: f32, src: &[f32]) {
        self.clean();
        let r = self.layout.range(key);
        self.keys.insert(key);
        match src {
            // One value (sparse LR's keys): no call into the vector kernel for it.
            [v] if r.len() == 1 => self.values[r.start] += scale * v,
            _ => peregrine_kernels::dense::axpy(scale, src, &mut self.values[r]),
        }
    }

    /// Adds `scale * values[k]` to key `k` for every key of `keys`, in a layout of one parameter
    /// per key (`values` spans the whole vector, as a sparse gradient's dense storage does): the
    /// bulk form of [`add`](Self::add).
    ///
    /// # Panics
    /// If keys are wider than one parameter or `values` is not as long as the vector.
    pub fn add_keys(&mut self, keys: &[u32], values: &[f32], scale: f32) {
        self.clean();
        assert_eq!(self.layout.width, 1, "add_keys: keys of {} parameters", self.layout.width);
        assert_eq!(values.len(), self.values.len(), "add_keys: values do not span the vector");
        self.keys.extend(keys);
        for &k in keys {
            self.values[k as usize] += scale * values[k as usize];
        }
    }

    /// Adds `scale * g` and leaves `g` empty: [`add_keys`](Self::add_keys) of its touched
    /// features, then its clear (sparse LR's drain). Into an empty update the buffers trade places
    /// instead ([`SparseGrad::trade`]: the gradient scaled in place at its touched features, its
    /// value and bitmap buffers becoming the update's), which saves the adds' reads of the update
    /// and the clear's writes: two scattered passes over tens of thousands of features an
    /// iteration on a 100k-feature set.
    ///
    /// # Panics
    /// As [`add_keys`](Self::add_keys).
    pub fn take_sparse(&mut self, scale: f32, g: &mut peregrine_kernels::lr::SparseGrad) {
        self.clean();
        if self.is_empty() && self.layout.width == 1 && self.values.len() == g.dim() {
            g.trade(scale, &mut self.values, &mut self.keys.bits, &mut self.keys.list);
            return;
        }
        self.add_keys(g.indices(), g.values(), scale);
        g.clear();
    }

    /// Adds `scale * src` to every parameter.
    pub fn add_all(&mut self, scale: f32, src: &[f32]) {
        self.clean();
        for k in 0..self.layout.keys() as u32 {
            self.keys.insert(k);
        }
        peregrine_kernels::dense::axpy(scale, src, &mut self.values);
    }

    /// Adds `scale * src` to every parameter and leaves `src` all zeros (a dense model's
    /// drain). Into an empty update (all zeros) the buffers trade places, `src` scaled in place
    /// first: one pass over the vector instead of three (the add's two reads and write, and the
    /// clear).
    pub fn take_all(&mut self, scale: f32, src: &mut Vec<f32>) {
        if self.take_all_unzeroed(scale, src) {
            src.fill(0.0);
        }
    }

    /// [`take_all`](Self::take_all), but `src` may be left holding old values instead of zeros
    /// (the vector of a stale update, [`discard`](Self::discard), traded for it): returns
    /// whether it was, for a caller whose next use of `src` overwrites it.
    pub fn take_all_unzeroed(&mut self, scale: f32, src: &mut Vec<f32>) -> bool {
        if !(self.is_empty() && src.len() == self.values.len()) {
            self.add_all(scale, src);
            src.fill(0.0);
            return false;
        }
        if scale != 1.0 {
            peregrine_kernels::dense::scale(scale, src);
        }
        std::mem::swap(&mut self.values, src);
        for k in 0..self.layout.keys() as u32 {
            self.keys.insert(k);
        }
        std::mem::take(&mut self.stale)
    }

    /// Adds another update.
    pub fn merge(&mut self, other: &Delta) {
        self.add_scaled(other, 1.0);
    }

    /// Adds `s` times another update.
    pub fn add_scaled(&mut self, other: &Delta, s: f32) {
        for &k in other.keys.keys() {
            let r = self.layout.range(k);
            self.add(k, s, &other.values[r]);
        }
    }

    /// Multiplies the update by `s`.
    pub fn scale(&mut self, s: f32) {
        for &k in self.keys.keys() {
            let r = self.layout.range(k);
            peregrine_kernels::dense::scale(s, &mut self.values[r]);
        }
    }

    /// The number of ranges [`ranges`](Self::ranges) would write.
    pub fn runs(&self) -> usize {
        self.keys.runs()
    }

    /// The update over the whole vector (zero where nothing is touched).
    ///
    /// # Panics
    /// If the vector is stale ([`discard`](Self::discard)): nothing was drained into it since.
    pub fn values(&self) -> &[f32] {
        assert!(!self.stale, "the values of an update discarded and not drained into since");
        &self.values
    }

    /// Whether nothing is touched.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.row_keys.is_empty()
    }

    /// Takes rows of new values (`rows`: a row of the layout's width per key of `keys`, in that
    /// order, the keys distinct and not in this update yet) times `scale`, and leaves both
    /// empty. Into an update without rows the buffers trade places (no copy).
    pub fn take_rows(&mut self, scale: f32, rows: &mut Vec<f32>, keys: &mut Vec<u32>) {
        assert_eq!(rows.len(), keys.len() * self.layout.width, "take_rows: a row per key");
        if scale != 1.0 {
            peregrine_kernels::dense::scale(scale, rows);
        }
        if self.row_keys.is_empty() {
            std::mem::swap(&mut self.rows, rows);
            std::mem::swap(&mut self.row_keys, keys);
        } else {
            self.rows.extend_from_slice(rows);
            self.row_keys.extend_from_slice(keys);
        }
        rows.clear();
        keys.clear();
    }

    /// The new values [`take_rows`](Self::take_rows) took, as `(first parameter, values)` runs:
    /// rows of consecutive keys that lie side by side coalesced into one.
    pub fn rows(&self) -> impl Iterator<Item = (usize, &[f32])> + '_ {
        let (l, w) = (self.layout, self.layout.width);
        let mut i = 0;
        std::iter::from_fn(move || {
            let key = *self.row_keys.get(i)?;
            let start = l.range(key).start;
            let mut j = i + 1;
            // A run goes on while the next key follows and this row is whole (the last key's
            // row may be shorter: nothing follows it).
            while self.row_keys.get(j) == Some(&(self.row_keys[j - 1] + 1)) {
                j += 1;
            }
            let last = l.range(self.row_keys[j - 1]);
            let len = last.end - start;
            let run = (start, &self.rows[i * w..i * w + len]);
            i = j;
            Some(run)
        })
    }

    /// A dense update's whole vector as a buffer to transform in place before it is pushed
    /// (the optimizer's step): `None` unless the layout is one key spanning the vector and it is
    /// touched. Whatever is written is gone at the next [`clear`](Self::clear), which zeroes the
    /// whole vector for such a layout (a sparse layout's clear zeroes only touched keys, so it
    /// gets no such buffer).
    pub fn dense_values_mut(&mut self) -> Option<&mut [f32]> {
        (self.layout.keys() == 1 && !self.is_empty()).then_some(&mut self.values[..])
    }

    /// The touched ranges of the vector, coalesced and in order.
    pub fn key_ranges(&mut self, ranges: &mut Vec<Range<usize>>) {
        self.keys.ranges(self.layout, ranges);
    }

    /// The touched ranges (coalesced) and their values back to back, for `accumulate_batch`.
    pub fn ranges(&mut self, ranges: &mut Vec<Range<usize>>, data: &mut Vec<f32>) {
        self.key_ranges(ranges);
        data.clear();
        for r in ranges.iter() {
            data.extend_from_slice(&self.values[r.clone()]);
        }
    }

    /// Resets to zero, in time proportional to what was touched (rows of new values are
    /// dropped, not written over).
    pub fn clear(&mut self) {
        self.clean();
        for &k in self.keys.keys() {
            match &mut self.values[self.layout.range(k)] {
                // One value (as in `add`): a store, not a call to fill a slice of one.
                [v] => *v = 0.0,
                r => r.fill(0.0),
            }
        }
        self.keys.clear();
        self.rows.clear();
        self.row_keys.clear();
    }
}

/// A thread's private copy of the keys a chunk touches, and the change its chunks made: the
/// buffers of models whose chunk runs on a copy of the iteration's snapshot and whose update is
/// what the chunk changed (matrix factorization's SGD, LDA's Gibbs sweep). Chunks of one
/// iteration thus start from the same parameters whichever rank or thread computes them. Chunks
/// of a [`disjoint`](Model::disjoint) batch leave their keys' new values instead (settled
/// without a snapshot).
#[derive(Debug)]
pub struct Copies {
    local: Vec<f32>,
    acc: Vec<f32>,
    chunk_keys: KeySet,
    keys: KeySet,
    /// The rows of [`gather`](Self::gather)'s keys side by side: first those of `kept`, then
    /// the current chunk's.
    gathered: Vec<f32>,
    /// The keys whose new values the chunks of a disjoint batch left in `gathered`, where they
    /// were computed: the update takes them as they are ([`Delta::take_rows`]).
    kept: Vec<u32>,
}

/// A row a chunk left, `new`, into the update's `acc`: its change against the snapshot's row
/// (`acc += new - old`, element by element), or with no snapshot its new values (copied).
#[inline]
fn settle_row(acc: &mut [f32], new: &[f32], old: Option<&[f32]>) {
    // Equal lengths, stated: the loop compiles to vector code without bounds checks.
    let new = &new[..acc.len()];
    let Some(old) = old else {
        acc.copy_from_slice(new);
        return;
    };
    let old = &old[..acc.len()];
    for i in 0..acc.len() {
        acc[i] += new[i] - old[i];
    }
}

impl Copies {
    /// Buffers over the whole of `layout`.
    pub fn new(layout: Layout) -> Self {
        Self {
            local: vec![0.0; layout.params],
            acc: vec![0.0; layout.params],
            chunk_keys: KeySet::new(layout.keys()),
            keys: KeySet::new(layout.keys()),
            gathered: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// Copies the rows of `keys` (distinct) from `params` side by side, in that order; returns
    /// them to work on (`keys.len()` rows of `layout.width`). [`settle_gathered`] with the same
    /// keys adds what the chunk changed. A chunk whose rows are known in advance (MF's strata
    /// keep each slot's) then works on a few hundred rows packed together rather than scattered
    /// over a copy of the whole model.
    ///
    /// [`settle_gathered`]: Self::settle_gathered
    pub fn gather(&mut self, layout: Layout, params: &[f32], keys: &[u32]) -> &mut [f32] {
        let (w, at) = (layout.width, self.kept.len() * layout.width);
        // Appended row by row (no pass writing zeros first: after a drain the buffer is empty).
        self.gathered.truncate(at);
        self.gathered.reserve(keys.len() * w);
        for &key in keys {
            let r = layout.range(key);
            let short = w - r.len();
            self.gathered.extend_from_slice(&params[r]);
            self.gathered.extend(std::iter::repeat_n(0.0, short));
        }
        &mut self.gathered[at..]
    }

    /// Adds what the chunk changed in the rows [`gather`](Self::gather) copied for `keys` (the
    /// same keys), against the snapshot `params`, to the update. With no snapshot (a chunk whose
    /// keys no other chunk of the iteration touches: [`Model::disjoint`]) the rows are their
    /// keys' new values and stay where they are, for [`drain`](Self::drain) to hand over whole:
    /// no copy into the update, and none of it to clear afterwards.
    pub fn settle_gathered(&mut self, layout: Layout, params: Option<&[f32]>, keys: &[u32]) {
        let (w, at) = (layout.width, self.kept.len() * layout.width);
        debug_assert_eq!(self.gathered.len(), at + keys.len() * w, "settle_gathered: the keys gathered");
        let Some(params) = params else {
            self.kept.extend_from_slice(keys);
            return;
        };
        for (row, &key) in self.gathered[at..].chunks_exact(w).zip(keys) {
            let r = layout.range(key);
            settle_row(&mut self.acc[r.clone()], row, Some(&params[r]));
        }
        self.keys.extend(keys);
        self.gathered.truncate(at);
    }

    /// Copies the keys `keys` adds (the chunk's) from `params`; returns the copy to work on
    /// (valid at those keys).
    pub fn take(&mut self, layout: Layout, params: &[f32], keys: impl FnOnce(&mut KeySet)) -> &mut [f32] {
        keys(&mut self.chunk_keys);
        for &key in self.chunk_keys.keys() {
            let r = layout.range(key);
            self.local[r.clone()].copy_from_slice(&params[r]);
        }
        &mut self.local
    }

    /// Adds what the chunk changed (the copy against the snapshot `params`, at its keys) to the
    /// update; with no snapshot, writes their new values into it, as
    /// [`settle_gathered`](Self::settle_gathered) does.
    pub fn settle(&mut self, layout: Layout, params: Option<&[f32]>) {
        for &key in self.chunk_keys.keys() {
            let r = layout.range(key);
            settle_row(&mut self.acc[r.clone()], &self.local[r.clone()], params.map(|p| &p[r]));
        }
        self.keys.extend(self.chunk_keys.keys());
        self.chunk_keys.clear();
    }

    /// Adds `scale` times the accumulated change to `delta`, and clears it. Into an empty
    /// update (one compute thread per rank, or the first to drain) the buffers trade places
    /// instead: an empty update is all zeros, which is what the change must be left as. Rows of
    /// new values kept by [`settle_gathered`](Self::settle_gathered) go over as they are.
    pub fn drain(&mut self, layout: Layout, scale: f32, delta: &mut Delta) {
        if !self.kept.is_empty() {
            self.gathered.truncate(self.kept.len() * layout.width);
            delta.take_rows(scale, &mut self.gathered, &mut self.kept);
        }
        // (Rows of new values in `delta` leave its vector all zeros.)
        delta.clean();
        if delta.keys.is_empty() && delta.values.len() == self.acc.len() {
            if scale != 1.0 {
                for &key in self.keys.keys() {
                    peregrine_kernels::dense::scale(scale, &mut self.acc[layout.range(key)]);
                }
            }
            std::mem::swap(&mut self.acc, &mut delta.values);
            std::mem::swap(&mut self.keys, &mut delta.keys);
            return;
        }
        for &key in self.keys.keys() {
            let r = layout.range(key);
            delta.add(key, scale, &self.acc[r.clone()]);
            self.acc[r].fill(0.0);
        }
        self.keys.clear();
    }
}

/// What an evaluation reports besides the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// Fraction of rows classified right.
    Accuracy,
    /// Root mean squared error of predicted ratings.
    Rmse,
    /// `exp` of the negative log-likelihood per token (topic models; lower is better).
    Perplexity,
}

impl Metric {
    /// Name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Accuracy => "accuracy",
            Self::Rmse => "rmse",
            Self::Perplexity => "perplexity",
        }
    }
}

/// Sums over evaluated rows, to be added up over ranks: `[loss, metric sum, rows]` (the metric sum
/// is the count of right answers for accuracy, the squared error for RMSE).
pub type EvalSums = [f64; 3];

/// The value of `metric` for sums `s`.
pub fn metric_value(metric: Metric, s: EvalSums) -> f64 {
    match metric {
        Metric::Accuracy => s[1] / s[2].max(1.0),
        Metric::Rmse => (s[1] / s[2].max(1.0)).sqrt(),
        Metric::Perplexity => (s[1] / s[2].max(1.0)).exp(),
    }
}

/// What a model that learned nothing scores on the evaluation set: the yardsticks divergence and
/// stalls are judged by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Baseline {
    /// The mean loss of a model that predicts nothing: probability 1/2 (LR), a uniform
    /// distribution over the classes (softmax, MLP), rating 0 (MF).
    pub blind_loss: f64,
    /// The metric of the best constant prediction: the most frequent class's share (accuracy),
    /// the ratings' standard deviation (RMSE of the mean rating).
    pub constant_metric: f64,
}

impl Baseline {
    /// The most frequent class's share among `labels` (0 for none).
    pub fn majority(labels: impl Iterator<Item = usize>, classes: usize) -> f64 {
        let mut counts = vec![0u64; classes.max(1)];
        let mut n = 0u64;
        for y in labels {
            counts[y.min(classes.max(1) - 1)] += 1;
            n += 1;
        }
        counts.into_iter().max().unwrap_or(0) as f64 / n.max(1) as f64
    }
}

/// A model: parameters, data, and how rows turn into updates.
pub trait Model: Send + Sync {
    /// Per-thread buffers: what a chunk's computation accumulates into.
    type Work: Send;

    /// Name in reports.
    fn name(&self) -> &'static str;

    /// The parameter layout.
    fn layout(&self) -> Layout;

    /// Training rows.
    fn rows(&self) -> usize;

    /// Evaluation rows.
    fn eval_rows(&self) -> usize;

    /// What [`evaluate`](Self::evaluate) reports besides the loss.
    fn metric(&self) -> Metric;

    /// Initial values of parameters `range` (a function of the seed and the index only, so every
    /// world size starts from the same model).
    fn init(&self, seed: u64, range: Range<usize>, out: &mut [f32]);

    /// Whether the model reads only the keys its rows touch ([`keys`](Self::keys)); dense models
    /// read every parameter.
    fn sparse(&self) -> bool;

    /// Adds the keys training rows `rows` read to `set` (sparse models).
    fn keys(&self, rows: Range<usize>, set: &mut KeySet);

    /// Buffers for one thread computing chunks of `chunk` rows (a model that
    /// [`joins_chunks`](Self::joins_chunks) grows them in [`compute`](Self::compute) for more).
    fn work(&self, chunk: usize) -> Self::Work;

    /// Computes training rows `rows` against `params` (valid at least at the rows' keys), adding
    /// into `work`; returns the rows' summed loss before the update.
    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Self::Work) -> f64;

    /// As [`compute`](Self::compute), for rows of pass `epoch` over the training data (0 the
    /// first): a model whose schedule changes with the pass overrides it (MF's adaptive rates
    /// step only the first factors in the first pass, as libmf does). The engine calls this.
    fn compute_in(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Self::Work) -> f64 {
        let _ = epoch;
        self.compute(rows, params, work)
    }

    /// Training rows `rows` of pass `epoch` are probably the next this thread computes with
    /// `work` (the rank's next chunk): a model may ask for them in cache while it computes the
    /// current ones, so that its next compute does not begin by waiting on memory. A hint,
    /// given right before a [`compute_in`](Self::compute_in) (a team member's is
    /// [`Part::ahead`](crate::team::Part::ahead)); the default ignores it.
    fn ahead(&self, epoch: u64, rows: Range<usize>, work: &mut Self::Work) {
        let _ = (epoch, rows, work);
    }

    /// The parameters member `part` of a team of `parts` threads computes and steps when the
    /// rank's threads split the model's units (`--split units`, [`crate::team`]): ranges that
    /// cover every parameter once over the team. `None` (the default): the model does not split.
    fn units(&self, part: usize, parts: usize) -> Option<Vec<Range<usize>>> {
        let _ = (part, parts);
        None
    }

    /// The leader's gradient for a run of rows computed by a team: `work`'s buffer, which every
    /// member writes in its [`units`](Self::units) (its old values overwritten where `work`
    /// says so). Only for a model that splits its units.
    fn team_target(&self, work: &mut Self::Work) -> crate::team::SharedGrad {
        let _ = work;
        panic!("{} does not split its units", self.name())
    }

    /// Member `part`'s share of rows `rows` of pass `epoch` computed by a team (every member
    /// calls it, in its own thread, with its own `work` for scratch): writes the gradient of its
    /// [`units`](Self::units) into `part.target`; returns the rows' summed loss (every member
    /// computes it; the leader's counts). Only for a model that splits its units.
    fn compute_part(
        &self,
        epoch: u64,
        rows: Range<usize>,
        params: &[f32],
        work: &mut Self::Work,
        part: &crate::team::Part<'_>,
    ) -> f64 {
        let _ = (epoch, rows, params, work, part);
        panic!("{} does not split its units", self.name())
    }

    /// Whether the chunks of `chunk` rows that training rows `batch` (one iteration's batch)
    /// are cut into touch pairwise disjoint keys. Then, under a scheme whose ranks all start an
    /// iteration from one snapshot and apply every update whole (BSP), a key's value after the
    /// iteration is what the one chunk that touched it left: the engine has those chunks
    /// compute their keys' new values ([`compute_values`](Self::compute_values)) and pushes
    /// them as puts, instead of their changes as accumulates (no subtraction in the chunk, no
    /// read and sum at the target). No by default; MF's strata say yes for their batches of
    /// block pieces.
    fn disjoint(&self, batch: Range<usize>, chunk: usize) -> bool {
        let _ = (batch, chunk);
        false
    }

    /// As [`compute_in`](Self::compute_in), leaving in `work` the new values of the keys the
    /// rows touch instead of what the rows changed ([`drain`](Self::drain) with scale 1 then
    /// writes those values into an update that is zero there). The engine calls it only for the
    /// chunks of batches the model calls [`disjoint`](Self::disjoint); a model that can say so
    /// implements it.
    fn compute_values(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Self::Work) -> f64 {
        let _ = (epoch, rows, params, work);
        unreachable!("{}: a model with disjoint batches computes new values", self.name())
    }

    /// Adds `scale` times what `work` accumulated to `delta`, and clears `work`.
    fn drain(&self, work: &mut Self::Work, scale: f32, delta: &mut Delta);

    /// The scale [`drain`](Self::drain) applies to an iteration of `rows` rows under SGD.
    fn scale(&self, rows: usize) -> f32;

    /// The learning rate of a gradient model, whose [`drain`](Self::drain) with scale `1 / rows`
    /// gives the mean gradient (what optimizers other than SGD step with); `None` for a model
    /// whose update is not a gradient (matrix factorization's SGD over its own ratings).
    fn lr(&self) -> Option<f32>;

    /// The model's L2 penalty, `0.5 l2 |w|^2` over the parameters in the ranges, where a step at
    /// the parameters' owners may apply it instead of the chunks (its gradient `l2 w` added to
    /// the batch's mean gradient, as PyTorch's optimizers apply `weight_decay`): the engine
    /// then builds the threads' work [`without_decay`](Self::without_decay). `None`: no
    /// penalty, or not one weight on fixed parameters (LR's counts the rows touching each
    /// feature).
    fn decay(&self) -> Option<(f32, Vec<Range<usize>>)> {
        None
    }

    /// Makes the chunks computed with `work` leave the [`decay`](Self::decay) penalty's
    /// gradient out: the owners' step applies it.
    fn without_decay(&self, _work: &mut Self::Work) {}

    /// Whether the engine computes a run of consecutive chunks a thread took at once in one
    /// call over all their rows, rather than chunk by chunk: for a model whose cost per call
    /// falls with more rows (matrix products, which pass the weights and their gradient
    /// through the cache once per call). Either way gives the same sums. No by default: MF's
    /// chunks are its strata's slots, each computed on its own rows gathered.
    fn joins_chunks(&self) -> bool {
        false
    }

    /// Parameters L1 regularization leaves alone (an intercept).
    fn unpenalized(&self) -> Range<usize> {
        0..0
    }

    /// Whether rows carry state of their own in the parameters that each visit updates by a
    /// delta against what it read (LDA's topic assignments): such a model needs every pull to
    /// follow every earlier update ([`crate::Scheme::pulls_every_update`]), or a delta lands on
    /// a state it was not computed from.
    fn needs_current_rows(&self) -> bool {
        false
    }

    /// Whether `compute` sleeps instead of computing (a stand-in workload): an injected delay is
    /// then scaled from a chunk's wall time, not from the thread's CPU time (which a sleep does
    /// not use).
    fn slept(&self) -> bool {
        false
    }

    /// What the user should know about how the model trains at the batch and chunk it was built
    /// for (matrix factorization without strata), if anything: rank 0 prints it once the plan
    /// is known to be valid.
    fn warning(&self) -> Option<&str> {
        None
    }

    /// Evaluates full parameters `params` on evaluation rows `rows`.
    fn evaluate(&self, params: &[f32], rows: Range<usize>) -> EvalSums;

    /// What learning nothing scores on the evaluation set ([`Baseline`]); one pass over its
    /// labels.
    fn baseline(&self) -> Baseline;
}

/// A named block of the parameter vector: one tensor of an exported model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    /// Name (`weight`, `bias`, `layers.0.weight`, `users`, ...).
    pub name: String,
    /// Shape, row-major.
    pub shape: Vec<usize>,
    /// Where it lies in the parameter vector.
    pub range: Range<usize>,
    /// How the parameter vector holds the block, where not in `shape`'s row-major order.
    pub held: Held,
}

/// How the parameter vector holds a [`Block`]: the model computes with it in that order, files
/// hold it in `shape`'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Held {
    /// In `shape`'s row-major order.
    AsShaped,
    /// The block's transpose (a matrix of `shape` reversed).
    Transposed,
    /// Its rows (along `shape`'s first dimension) in another order: row `r` at the block's row
    /// `rows[r]`.
    Rows(Vec<u32>),
    /// A matrix's rows in groups of this many (the last one smaller), each group's transpose in
    /// turn (an MLP's first layer split by units: [`mlp::UNIT_BLOCK`]).
    TransposedBlocks(usize),
}

impl Block {
    fn new(name: impl Into<String>, shape: &[usize], start: usize) -> Self {
        let n: usize = shape.iter().product();
        Self { name: name.into(), shape: shape.to_vec(), range: start..start + n, held: Held::AsShaped }
    }

    /// A `rows x cols` matrix (`shape`) whose transpose the parameter vector holds at `start`.
    fn transposed(name: impl Into<String>, shape: &[usize; 2], start: usize) -> Self {
        Self { held: Held::Transposed, ..Self::new(name, shape, start) }
    }

    /// A transposed block ([`transposed`](Self::transposed)) held instead as the transposes of
    /// its groups of `rows` rows ([`Held::TransposedBlocks`]).
    fn in_blocks(self, rows: usize) -> Self {
        debug_assert!(self.held == Held::Transposed && rows > 0, "block {}: in blocks", self.name);
        Self { held: Held::TransposedBlocks(rows), ..self }
    }

    /// The block's rows in groups of `group` (the last one smaller): each group's values (its
    /// place in the block, in either order) and its rows.
    fn row_groups(&self, group: usize) -> impl Iterator<Item = (Range<usize>, usize)> {
        let (rows, cols) = (self.shape[0], self.row_len());
        (0..rows).step_by(group).map(move |r| {
            let end = (r + group).min(rows);
            (r * cols..end * cols, end - r)
        })
    }

    /// The block with row `r` held at row `rows[r]` (a permutation of its rows).
    fn with_rows(self, rows: &[u32]) -> Self {
        debug_assert_eq!(rows.len(), self.shape[0], "block {}: a place per row", self.name);
        Self { held: Held::Rows(rows.to_vec()), ..self }
    }

    /// Values per row along `shape`'s first dimension.
    fn row_len(&self) -> usize {
        self.shape[1..].iter().product()
    }

    /// The block's values in `shape`'s row-major order, from the parameter vector `params`.
    pub fn values<'a>(&self, params: &'a [f32]) -> std::borrow::Cow<'a, [f32]> {
        let held = &params[self.range.clone()];
        let out = match &self.held {
            Held::AsShaped => return std::borrow::Cow::Borrowed(held),
            Held::Transposed => {
                let mut out = vec![0.0; held.len()];
                peregrine_kernels::mlp::transpose(held, self.shape[1], self.shape[0], &mut out);
                out
            }
            Held::Rows(rows) => {
                let w = self.row_len();
                let mut out = Vec::with_capacity(held.len());
                for &at in rows {
                    out.extend_from_slice(&held[at as usize * w..][..w]);
                }
                out
            }
            Held::TransposedBlocks(group) => {
                let mut out = vec![0.0; held.len()];
                for (at, rows) in self.row_groups(*group) {
                    peregrine_kernels::mlp::transpose(&held[at.clone()], self.row_len(), rows, &mut out[at]);
                }
                out
            }
        };
        std::borrow::Cow::Owned(out)
    }

    /// Writes the block's `values` (in `shape`'s row-major order) into the parameter vector.
    ///
    /// # Panics
    /// If `values` is not the block's length.
    pub fn place(&self, values: &[f32], params: &mut [f32]) {
        let held = &mut params[self.range.clone()];
        assert_eq!(
            values.len(),
            held.len(),
            "block {}: {} values for {}",
            self.name,
            values.len(),
            held.len()
        );
        match &self.held {
            Held::AsShaped => held.copy_from_slice(values),
            Held::Transposed => peregrine_kernels::mlp::transpose(values, self.shape[0], self.shape[1], held),
            Held::Rows(rows) => {
                let w = self.row_len();
                for (row, &at) in values.chunks_exact(w.max(1)).zip(rows) {
                    held[at as usize * w..][..w].copy_from_slice(row);
                }
            }
            Held::TransposedBlocks(group) => {
                for (at, rows) in self.row_groups(*group) {
                    peregrine_kernels::mlp::transpose(
                        &values[at.clone()],
                        rows,
                        self.row_len(),
                        &mut held[at],
                    );
                }
            }
        }
    }
}

/// A model that can be written out and applied to new rows.
pub trait Export: Model {
    /// The parameter vector as named blocks, in order, covering it exactly.
    fn blocks(&self) -> Vec<Block>;

    /// How the parameter vector orders its values, where that is not every block as named:
    /// checkpoints, which hold the vector as it is, record it and are refused under another
    /// (a change of order between versions). Empty: each block in its own shape's order.
    fn param_order(&self) -> &'static str {
        ""
    }

    /// Values the model uses besides its parameters (MF's global mean), to be written with them.
    fn constants(&self) -> Vec<(&'static str, Vec<f32>)> {
        Vec::new()
    }

    /// Names of the values [`predict`](Self::predict) gives per row (`probability`; `p0`,
    /// `p1`, ...; `prediction`).
    fn outputs(&self) -> Vec<String>;

    /// Appends, for evaluation rows `rows`, [`outputs`](Self::outputs) values per row under full
    /// parameters `params`: the probability of label 1 (LR), class probabilities (softmax,
    /// MLP), the predicted rating (MF).
    fn predict(&self, params: &[f32], rows: Range<usize>, out: &mut Vec<f32>);

    /// Names of the columns [`label`](Self::label) gives, comma-separated (`label`;
    /// `user,item,rating`).
    fn label_names(&self) -> &'static str {
        "label"
    }

    /// Evaluation row `row`'s label columns as CSV text (`1`; `3`; `12,40,4.5`).
    fn label(&self, row: usize) -> String;
}

/// `z` turned into probabilities in place (a numerically stable softmax).
pub(crate) fn softmax_in_place(z: &mut [f32]) {
    let m = z.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    let mut sum = 0.0f64;
    for v in z.iter_mut() {
        let e = f64::from(*v - m).exp();
        *v = e as f32;
        sum += e;
    }
    for v in z.iter_mut() {
        *v = (f64::from(*v) / sum) as f32;
    }
}

/// A uniform value in `[-a, a)` for parameter `index` under `seed`.
pub fn uniform(seed: u64, index: usize, a: f32) -> f32 {
    let u = (crate::plan::mix(seed ^ crate::plan::mix(index as u64)) >> 40) as f32 / (1u64 << 24) as f32;
    (2.0 * u - 1.0) * a
}

/// Why a model cannot be built on its data.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A dataset cannot be opened.
    #[error("{what}: {source}")]
    Open {
        /// Which set ("training set", "evaluation set").
        what: &'static str,
        /// What failed.
        source: peregrine_kernels::data::DataError,
    },
    /// A dataset holds another kind of data than the model needs.
    #[error("{what} {}: holds {holds} data, this model needs {needs} data", path.display())]
    Kind {
        /// Which set.
        what: &'static str,
        /// Its file.
        path: std::path::PathBuf,
        /// The kind it holds.
        holds: &'static str,
        /// The kind the model needs.
        needs: &'static str,
    },
    /// The evaluation set's shape does not match the training set's.
    #[error("evaluation set {}: {eval}, the training set {train}", path.display())]
    Shape {
        /// The evaluation set's file.
        path: std::path::PathBuf,
        /// Its shape.
        eval: String,
        /// The training set's.
        train: String,
    },
    /// The data or a setting does not fit the model.
    #[error("{0}")]
    Unfit(String),
}

/// A dataset opened for training, checked to be of `kind`.
pub(crate) fn open(path: &std::path::Path, kind: Kind, what: &'static str) -> Built<Dataset> {
    let d = Dataset::open(path).map_err(|source| ModelError::Open { what, source })?;
    if d.kind() != kind {
        return Err(ModelError::Kind { what, path: path.into(), holds: d.kind().name(), needs: kind.name() });
    }
    Ok(d)
}

/// A model's training set and its evaluation set (the training set when none is given), both
/// checked to be of the model's kind.
#[derive(Debug)]
pub(crate) struct Sets {
    pub(crate) train: Dataset,
    eval: Option<Dataset>,
}

/// Training sets of at most this many bytes (and at least [`MIN_COPY`]) are copied into memory
/// backed by transparent huge pages when a model opens them ([`Dataset::into_memory`]); 0, the
/// default: read through their file mappings. Set by the binary before it builds models
/// ([`copy_training_sets_up_to`]).
static TRAINING_COPY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Smallest training set worth the copy: below this the 4 KiB pages' TLB entries cover it.
pub const MIN_COPY: u64 = 8 << 20;

/// Copies training sets of up to `bytes` bytes (at least [`MIN_COPY`]) into memory with huge
/// pages from now on, in this process (0: none; `peregrine train --huge-pages`).
pub fn copy_training_sets_up_to(bytes: u64) {
    TRAINING_COPY.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

impl Sets {
    /// Opens `train` and, if given, `eval`; the training set copied into memory with huge
    /// pages if its size says so ([`copy_training_sets_up_to`]).
    pub(crate) fn open(train: &std::path::Path, eval: Option<&std::path::Path>, kind: Kind) -> Built<Self> {
        let mut train = open(train, kind, "training set")?;
        let most = TRAINING_COPY.load(std::sync::atomic::Ordering::Relaxed);
        if (MIN_COPY..=most).contains(&(train.bytes() as u64)) {
            train = train
                .into_memory(true)
                .map_err(|source| ModelError::Open { what: "training set", source })?;
        }
        let eval = eval.map(|p| open(p, kind, "evaluation set")).transpose()?;
        Ok(Self { train, eval })
    }

    /// Both sets replaced by copies in memory standardized by `scaling`
    /// ([`peregrine_kernels::data::standardize::standardized`]): the kernels read the
    /// standardized rows; the files are left as they are. The training set's copy asks for huge
    /// pages when it was copied into memory for them.
    pub(crate) fn standardize(
        &mut self,
        scaling: &peregrine_kernels::data::standardize::Scaling,
    ) -> Built<()> {
        use peregrine_kernels::data::standardize::standardized;
        let huge = !self.train.is_mapped();
        self.train = standardized(&self.train, scaling, huge)
            .map_err(|source| ModelError::Open { what: "training set", source })?;
        if let Some(e) = self.eval.as_mut() {
            *e = standardized(e, scaling, false)
                .map_err(|source| ModelError::Open { what: "evaluation set", source })?;
        }
        Ok(())
    }

    /// The given evaluation set, if any.
    pub(crate) fn given_eval(&self) -> Option<&Dataset> {
        self.eval.as_ref()
    }

    /// The set evaluations read.
    pub(crate) fn eval(&self) -> &Dataset {
        self.eval.as_ref().unwrap_or(&self.train)
    }
}

/// `(columns, classes)` of a dense training set, checked against its evaluation set.
pub(crate) fn dense_shape(sets: &Sets) -> Built<(usize, usize)> {
    let h = sets.train.header();
    let (cols, classes) = (h.cols as usize, h.classes as usize);
    if let Some(e) = sets.given_eval() {
        if (e.header().cols as usize, e.header().classes as usize) != (cols, classes) {
            return Err(ModelError::Shape {
                path: e.path().into(),
                eval: format!("is {} columns x {} classes", e.header().cols, e.header().classes),
                train: format!("{cols} x {classes}"),
            });
        }
    }
    Ok((cols, classes))
}

/// Checks that an evaluation set matches the training set's columns.
pub(crate) fn same_cols(train: &Dataset, eval: &Dataset) -> Built<()> {
    let (a, b) = (train.header().cols, eval.header().cols);
    if b > a {
        return Err(ModelError::Shape {
            path: eval.path().into(),
            eval: format!(
                "has {b} columns (features), more than the model's; convert both files with the same \
                 `peregrine data convert libsvm --features N`"
            ),
            train: format!("{} has {a}", train.path().display()),
        });
    }
    Ok(())
}

/// Errors a model constructor reports.
pub type Built<T> = Result<T, ModelError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_sets_in_the_size_range_are_copied_into_memory_and_read_the_same() {
        use peregrine_kernels::data::gen::{self, DenseSpec};
        let dir = tempfile::tempdir().expect("tmp");
        // 3,000 x 784 floats: 9.4 MB, past the 8 MiB below which no copy is made.
        let (big, small) = (dir.path().join("big.pgd"), dir.path().join("small.pgd"));
        gen::dense(&DenseSpec { rows: 3000, cols: 784, classes: 10, noise: 0.3, seed: 1 }, &big)
            .expect("gen");
        gen::dense(&DenseSpec { rows: 300, cols: 784, classes: 10, noise: 0.3, seed: 1 }, &small)
            .expect("gen");
        let open = |p: &std::path::Path| Sets::open(p, None, Kind::Dense).expect("open");
        let size = open(&big).train.bytes() as u64;
        assert!(size >= MIN_COPY && (open(&small).train.bytes() as u64) < MIN_COPY);
        // (The setting is the process's: other tests opening sets meanwhile may get copies, which
        // read the same.)
        for (most, big_copied) in [(0, false), (size - 1, false), (size, true), (u64::MAX, true)] {
            copy_training_sets_up_to(most);
            let (b, s) = (open(&big), open(&small));
            assert_eq!(!b.train.is_mapped(), big_copied, "up to {most}");
            assert!(s.train.is_mapped(), "a set under 8 MiB, up to {most}");
            let mapped = Dataset::open(&big).expect("open");
            let (x, y) = (b.train.dense().expect("dense"), mapped.dense().expect("dense"));
            assert!(x.features == y.features && x.labels == y.labels, "up to {most}: the rows read the same");
        }
        copy_training_sets_up_to(0);
    }

    #[test]
    fn a_dense_drain_into_an_empty_or_a_filled_update_adds_alike_and_leaves_zeros() {
        let l = Layout::dense(4);
        for scale in [1.0, -0.5] {
            let (mut empty, mut filled) = (Delta::new(l), Delta::new(l));
            filled.add_all(1.0, &[1.0, 1.0, 1.0, 1.0]);
            for d in [&mut empty, &mut filled] {
                let mut g = vec![2.0, 0.0, -4.0, 8.0];
                d.take_all(scale, &mut g);
                assert_eq!(g, [0.0; 4], "the gradient buffer is left zero");
            }
            let want: Vec<f32> = [2.0, 0.0, -4.0, 8.0].iter().map(|v| scale * v).collect();
            assert_eq!(empty.values(), &want[..]);
            assert_eq!(filled.values(), &want.iter().map(|v| v + 1.0).collect::<Vec<_>>()[..]);
            assert!(!empty.is_empty());
        }
        // Only a touched dense update lends its buffer; its clear zeroes all of it.
        let mut d = Delta::new(l);
        assert!(d.dense_values_mut().is_none(), "untouched");
        d.add_all(1.0, &[1.0; 4]);
        d.dense_values_mut().expect("dense and touched").fill(7.0);
        d.clear();
        assert_eq!(d.values(), &[0.0; 4]);
        let mut sparse = Delta::new(Layout { params: 4, width: 1 });
        sparse.add(2, 1.0, &[1.0]);
        assert!(sparse.dense_values_mut().is_none(), "a sparse clear zeroes only touched keys");
    }

    #[test]
    fn copies_drain_into_an_empty_or_a_filled_update_alike_and_start_over_from_zero() {
        let l = Layout { params: 8, width: 2 };
        let params = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        // Chunk: keys 0 and 2 each gain (1, 1) over the snapshot.
        let chunk = |c: &mut Copies, keys: &[u32]| {
            let local = c.take(l, &params, |set| set.extend(keys));
            for &k in keys {
                local[l.range(k)].iter_mut().for_each(|v| *v += 1.0);
            }
            c.settle(l, Some(&params));
        };
        for scale in [1.0, 0.5] {
            let (mut c, mut empty, mut filled) = (Copies::new(l), Delta::new(l), Delta::new(l));
            filled.add(3, 1.0, &[10.0, 10.0]);
            chunk(&mut c, &[0, 2]);
            c.drain(l, scale, &mut empty);
            assert_eq!(empty.values(), &[scale, scale, 0.0, 0.0, scale, scale, 0.0, 0.0], "scale {scale}");
            assert_eq!(empty.keys.keys().len(), 2);
            // What the thread keeps is zero again: a second chunk adds only its own change.
            chunk(&mut c, &[2]);
            c.drain(l, scale, &mut filled);
            assert_eq!(filled.values(), &[0.0, 0.0, 0.0, 0.0, scale, scale, 10.0, 10.0], "scale {scale}");
            assert!(c.acc.iter().all(|&v| v == 0.0) && c.keys.is_empty());
        }
    }

    #[test]
    fn keys_coalesce_into_ranges() {
        let l = Layout { params: 10, width: 3 };
        let mut s = KeySet::new(l.keys());
        for k in [3, 0, 1, 3] {
            s.insert(k);
        }
        let mut r = Vec::new();
        s.ranges(l, &mut r);
        assert_eq!(r, vec![0..6, 9..10]);
        s.clear();
        assert!(s.is_empty());
        s.insert(2);
        s.ranges(l, &mut r);
        assert_eq!(r, vec![6..9]);
    }

    #[test]
    fn extend_is_insert_in_bulk() {
        // Repeats within one call and across calls, word boundaries, the last key; then a clear
        // of more members than the bitmap has words (it fills the bitmap) and the set reused.
        let mut x = 7u64;
        let keys: Vec<u32> = (0..3000)
            .map(|i| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                if i % 5 == 0 {
                    63 + (i % 3)
                } else {
                    ((x >> 33) % 1000) as u32
                }
            })
            .collect();
        let (mut one, mut bulk) = (KeySet::new(1000), KeySet::new(1000));
        for round in 0..2 {
            for part in keys.chunks(700) {
                part.iter().for_each(|&k| one.insert(k));
                bulk.extend(part);
                assert_eq!(bulk.keys(), one.keys(), "round {round}");
                assert_eq!(bulk.runs(), one.runs(), "round {round}");
            }
            bulk.extend(&[999, 0]);
            one.insert(999);
            one.insert(0);
            assert_eq!(bulk.keys(), one.keys());
            // Shifted: keys 0..500 land at 500..1000, repeats and all.
            bulk.extend_shifted(&[0, 499, 0, 13], 500);
            [500, 999, 500, 513].iter().for_each(|&k| one.insert(k));
            assert_eq!(bulk.keys(), one.keys());
            assert!(bulk.len() > 16, "more members than the bitmap's 16 words");
            bulk.clear();
            one.clear();
            assert!(bulk.is_empty() && bulk.runs() == 0);
        }
        bulk.extend(&[]);
        assert!(bulk.is_empty());
    }

    #[test]
    fn add_keys_is_add_in_bulk() {
        let l = Layout { params: 300, width: 1 };
        let values: Vec<f32> = (0..300).map(|i| i as f32 * 0.5).collect();
        let keys = [5u32, 64, 299, 0, 63, 128];
        let (mut one, mut bulk) = (Delta::new(l), Delta::new(l));
        for _ in 0..2 {
            for &k in &keys {
                one.add(k, -2.0, &values[k as usize..k as usize + 1]);
            }
            bulk.add_keys(&keys, &values, -2.0);
        }
        assert_eq!(bulk.values(), one.values());
        assert_eq!(bulk.values()[299], -4.0 * 149.5);
        assert_eq!(bulk.runs(), one.runs());
        let (mut r1, mut d1, mut r2, mut d2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        one.ranges(&mut r1, &mut d1);
        bulk.ranges(&mut r2, &mut d2);
        assert_eq!((r1, d1), (r2, d2));
        bulk.clear();
        assert!(bulk.is_empty() && bulk.values().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_sparse_gradient_taken_is_its_adds_and_its_clear() {
        use peregrine_kernels::lr::SparseGrad;
        let l = Layout { params: 300, width: 1 };
        let fill = |g: &mut SparseGrad, round: u32| {
            for (i, &k) in [5u32, 64, 299, 0, 63, 128, 64].iter().enumerate() {
                g.add(k, (i as u32 + round) as f32 * 0.5 - 1.0);
            }
        };
        let (mut g, mut h) = (SparseGrad::new(300), SparseGrad::new(300));
        let (mut taken, mut added) = (Delta::new(l), Delta::new(l));
        for round in 0..3 {
            // Into an empty update (the buffers trade places), then into one that is not.
            for _ in 0..2 {
                fill(&mut g, round);
                fill(&mut h, round);
                taken.take_sparse(-2.0, &mut g);
                added.add_keys(h.indices(), h.values(), -2.0);
                h.clear();
                assert!(g.is_empty() && g.values().iter().all(|&v| v == 0.0), "round {round}: left over");
            }
            assert_eq!(taken.values(), added.values(), "round {round}");
            assert_eq!(taken.keys.keys(), added.keys.keys(), "round {round}: keys in first-touch order");
            let (mut r1, mut d1, mut r2, mut d2) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            taken.ranges(&mut r1, &mut d1);
            added.ranges(&mut r2, &mut d2);
            assert_eq!((r1, d1), (r2, d2), "round {round}");
            taken.clear();
            added.clear();
            assert!(taken.is_empty() && taken.values().iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn many_keys_come_out_sorted_from_the_bitmap() {
        let l = Layout { params: 1000, width: 1 };
        let mut s = KeySet::new(l.keys());
        for k in (0..1000u32).rev().filter(|k| k % 3 != 0) {
            s.insert(k);
        }
        let mut r = Vec::new();
        s.ranges(l, &mut r);
        assert!(s.keys().windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s.len(), 666);
        assert_eq!(r.len(), 333);
        assert_eq!(r[0], 1..3);
        s.clear();
        assert!(s.is_empty());
        s.insert(5);
        s.ranges(l, &mut r);
        assert_eq!(r, vec![5..6]);
    }

    #[test]
    fn runs_counts_the_ranges_without_writing_them() {
        // Runs across word boundaries (63, 64, 65; 127..=129), single keys, the last key.
        for (n, keys) in [
            (200usize, vec![0u32, 1, 63, 64, 65, 100, 127, 128, 129, 199]),
            (64, vec![63]),
            (130, (0..130).collect()),
            (1000, (0..1000).filter(|k| k % 7 != 0 && k % 11 != 0).collect()),
            (10, vec![]),
        ] {
            let l = Layout { params: n * 2, width: 2 };
            let mut s = KeySet::new(l.keys());
            for &k in keys.iter().rev() {
                s.insert(k);
            }
            let runs = s.runs();
            let mut r = Vec::new();
            s.ranges(l, &mut r);
            assert_eq!(runs, r.len(), "{keys:?}");
        }
    }

    #[test]
    fn delta_adds_merges_and_clears() {
        let l = Layout { params: 4, width: 2 };
        let mut a = Delta::new(l);
        a.add(1, 2.0, &[1.0, 1.0]);
        let mut b = Delta::new(l);
        b.add(0, 1.0, &[5.0, 6.0]);
        b.add(1, 1.0, &[1.0, 0.0]);
        a.merge(&b);
        a.scale(0.5);
        let (mut r, mut d) = (Vec::new(), Vec::new());
        a.ranges(&mut r, &mut d);
        assert_eq!(r, vec![0..4]);
        assert_eq!(d, vec![2.5, 3.0, 1.5, 1.0]);
        a.clear();
        assert!(a.is_empty());
        a.ranges(&mut r, &mut d);
        assert!(r.is_empty() && d.is_empty());
    }

    #[test]
    fn rows_of_new_values_go_over_whole_and_come_out_in_runs_of_consecutive_keys() {
        // Keys of 3 values, the last (key 4) of 2.
        let l = Layout { params: 14, width: 3 };
        let row = |k: u32| [10.0 * k as f32, 10.0 * k as f32 + 1.0, 10.0 * k as f32 + 2.0];
        let rows_of = |keys: &[u32]| keys.iter().flat_map(|&k| row(k)).collect::<Vec<f32>>();
        let mut d = Delta::new(l);
        let (mut rows, mut keys) = (rows_of(&[1, 2, 0]), vec![1, 2, 0]);
        d.take_rows(1.0, &mut rows, &mut keys);
        assert!(rows.is_empty() && keys.is_empty() && !d.is_empty());
        // Into an update that has rows: appended; the vector stays zeros.
        let (mut rows, mut keys) = (rows_of(&[3, 4]), vec![3, 4]);
        d.take_rows(2.0, &mut rows, &mut keys);
        assert!(d.values().iter().all(|&x| x == 0.0));
        let runs: Vec<(usize, Vec<f32>)> = d.rows().map(|(s, v)| (s, v.to_vec())).collect();
        let twice = |k: u32| row(k).map(|x| 2.0 * x);
        assert_eq!(
            runs,
            vec![
                (3, [row(1), row(2)].concat()),
                (0, row(0).to_vec()),
                // Key 4 holds 2 values: its row's third is padding, not written.
                (9, [&twice(3)[..], &twice(4)[..2]].concat()),
            ]
        );
        // Keys in the vector and rows together; cleared, nothing of either is left.
        d.add(0, 1.0, &[1.0, 1.0, 1.0]);
        assert_eq!(d.runs(), 1);
        d.clear();
        assert!(d.is_empty() && d.rows().next().is_none() && d.values().iter().all(|&x| x == 0.0));
    }
}
