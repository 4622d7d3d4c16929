//! Updates to push: a [`Delta`] (values over the whole vector at the keys they touch, or whole
//! rows of new values) and the [`Copies`] of the models that compute on a private copy of their
//! keys and drain what they changed.

use std::ops::Range;

use super::{KeySet, Layout};

/// An update to push: values over the whole vector and the keys they touch; and, from the
/// chunks of a [`disjoint`](super::Model::disjoint) batch, whole rows of new values side by side
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
    /// instead ([`SparseGrad::trade`](peregrine_kernels::lr::SparseGrad::trade): the gradient
    /// scaled in place at its touched features, its value and bitmap buffers becoming the
    /// update's), which saves the adds' reads of the update and the clear's writes: two scattered
    /// passes over tens of thousands of features an iteration on a 100k-feature set.
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

    /// The touched keys, ascending.
    pub fn sorted_keys(&mut self) -> &[u32] {
        self.keys.sort();
        self.keys.keys()
    }

    /// Hands the touched keys, ascending, and the values over the whole vector to `push`, which
    /// leaves the values at those keys zero when it succeeds (it took them); the update is then
    /// empty, with no pass of its own over the keys to clear it. Where `push` fails the update
    /// keeps its keys, so that a clear zeroes whatever it left.
    pub fn push_sorted<E>(
        &mut self,
        push: impl FnOnce(&[u32], &mut [f32]) -> Result<(), E>,
    ) -> Result<(), E> {
        assert!(!self.stale, "the values of an update discarded and not drained into since");
        self.keys.sort();
        push(self.keys.keys(), &mut self.values)?;
        debug_assert!(
            self.keys.keys().iter().all(|&k| self.values[self.layout.range(k)].iter().all(|&v| v == 0.0)),
            "push_sorted: values left at the keys"
        );
        self.keys.clear();
        self.rows.clear();
        self.row_keys.clear();
        Ok(())
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
/// of a [`disjoint`](super::Model::disjoint) batch leave their keys' new values instead (settled
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
    /// keys no other chunk of the iteration touches: [`Model::disjoint`](super::Model::disjoint))
    /// the rows are their keys' new values and stay where they are, for [`drain`](Self::drain) to
    /// hand over whole: no copy into the update, and none of it to clear afterwards.
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

#[cfg(test)]
mod tests {
    use super::*;

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
