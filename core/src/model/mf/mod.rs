//! Matrix factorization: `r_ui ~ mean + b_u + b_i + u_u . v_i`, user rows `U` (`users x (k + 1)`:
//! the factors, then the user's bias) then item rows `V` (`items x (k + 1)`); one key per row.
//! `mean` is the training ratings' mean, a constant; without biases (`with_biases(false)`) rows
//! are the `k` factors and `r_ui ~ u_u . v_i`. Under adaptive rates (`with_adaptive(true)`,
//! `--optimizer adagrad`: libmf's per-row schedule) each row ends with two more values, the `G`s
//! of its first 8 factors and of the others (running mean squared gradients, 1 to start):
//! additive statistics, so their updates add up across chunks and ranks like the factors'. As in
//! libmf, the factors then start uniform in `[0, 1 / sqrt(k))` and the first pass over the data
//! steps only the first 8 ([`mf::sgd_chunk_adaptive`]).
//!
//! A chunk runs plain SGD, one step per rating in order (the kernel of libmf and of every
//! Hogwild-style MF), on a private copy of the factor rows its ratings touch, taken from the
//! iteration's snapshot ([`Copies`]); what the chunk changed is its update. Chunks of one
//! iteration thus start from the same parameters whichever rank or thread computes them, and their
//! updates add up.
//!
//! With [`Mf::with_strata`] (what `peregrine train` sets) training visits the ratings in strata
//! of a grid, libmf's schedule laid out along the engine's batches (`Grid`): the chunks of one
//! batch take their ratings from blocks that share no user and no item, so their updates add up
//! exactly as if run one after the other, and each chunk touches a few hundred rows (the copies
//! it takes and settles shrink by that much) rather than one or two per rating.
//!
//! Here the model, its [`Model`] and [`Export`] sides; the strata in `grid`, a chunk's SGD in
//! `chunk`.

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::{Dataset, Kind, Ratings};
use peregrine_kernels::mf;

use super::{
    Baseline, Block, Built, Copies, Delta, EvalSums, Export, KeySet, Layout, Metric, Model, ModelError, Sets,
};

mod chunk;
mod grid;

use grid::{grid_fits, unstratified, Grid};

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
    /// Per-row adaptive rates (two `G`s ending each row).
    adaptive: bool,
    /// The training ratings laid out in strata, if so.
    grid: Option<Grid>,
    /// Why training runs without strata though a batch has several chunks, if so.
    unstratified: Option<String>,
}

/// Values that end each row under adaptive rates: the `G`s of the first factors and of the
/// others (written to model files as `row_state`).
pub const ROW_STATE: usize = 2;

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
        Ok(Self {
            data,
            lr,
            l2,
            k,
            users,
            items,
            biases: true,
            mean: mean as f32,
            adaptive: false,
            grid: None,
            unstratified: None,
        })
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

    /// Training in strata for batches of `batch` rows cut in chunks of `chunk` (`Grid`), the
    /// plan the engine runs; without it, ratings are visited in dataset order. Also in dataset
    /// order when the grid's `C x C` blocks (`C = batch / chunk`) would hold less than a chunk
    /// each on average: then no block fills a piece (and the grid would only cost memory).
    #[must_use]
    pub fn with_strata(self, batch: usize, chunk: usize) -> Self {
        let t = Self::rows_of(&self.data.train);
        let (c, chunk) = (batch.div_ceil(chunk.max(1)).max(1), chunk.max(1));
        let fits = grid_fits(t.len(), c, chunk);
        let rows = self.layout().keys();
        let grid = fits.then(|| {
            Grid::new(&t, c, chunk).in_band_order(self.users, self.items).with_keys(self.users as u32, rows)
        });
        let unstratified = (!fits && c > 1).then(|| unstratified(t.len(), c, chunk));
        Self { grid, unstratified, ..self }
    }

    /// With global mean `mean` (a model trained on other data than it is applied to).
    #[must_use]
    pub fn with_mean(self, mean: f32) -> Self {
        Self { mean, ..self }
    }

    /// Values per row: the factors, the bias if there is one, [`ROW_STATE`] `G`s under adaptive
    /// rates.
    fn width(&self) -> usize {
        self.k + usize::from(self.biases) + ROW_STATE * usize::from(self.adaptive)
    }

    /// The global mean, if the model has biases.
    fn mean(&self) -> Option<f32> {
        self.biases.then_some(self.mean)
    }

    /// With factors for `users` users and `items` items (at least the datasets'): a model
    /// trained on more users or items than a file to predict holds. Strata, if any, are laid out
    /// again for that many rows.
    pub fn with_size(self, users: usize, items: usize) -> Built<Self> {
        if users < self.users || items < self.items {
            return Err(ModelError::Unfit(format!(
                "{} has {} users and {} items, the model {users} and {items}",
                self.data.eval().path().display(),
                self.users,
                self.items
            )));
        }
        let strata = self.grid.as_ref().map(|g| (g.bins * g.chunk, g.chunk));
        let m = Self { users, items, grid: None, ..self };
        Ok(match strata {
            Some((batch, chunk)) => m.with_strata(batch, chunk),
            None => m,
        })
    }

    fn rows_of(d: &Dataset) -> Ratings<'_> {
        d.ratings().expect("the kind is checked when the model is built")
    }

    fn split<'a>(&self, params: &'a [f32]) -> (&'a [f32], &'a [f32]) {
        params.split_at(self.users * self.width())
    }

    /// The strata whose bands order the rows in the parameter vector ([`Grid::in_band_order`]),
    /// if not the model's own order.
    fn row_order(&self) -> Option<&Grid> {
        self.grid.as_ref().filter(|g| !g.of.is_empty())
    }

    /// Ratings `x`'s user and item ids as the parameter vector's rows ([`row_order`]
    /// (Self::row_order)): the evaluation set's ids are the model's own.
    fn vector_ids<'a>(&self, x: &Ratings<'a>) -> (Cow<'a, [u32]>, Cow<'a, [u32]>) {
        let Some(g) = self.row_order() else {
            return (Cow::Borrowed(x.users), Cow::Borrowed(x.items));
        };
        let rows = |ids: &[u32], at: &[u32]| ids.iter().map(|&id| at[id as usize]).collect();
        (Cow::Owned(rows(x.users, &g.user_at)), Cow::Owned(rows(x.items, &g.item_at)))
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

    /// Factors uniform in `[-a, a)`, `a = 1 / sqrt(k)` (in `[0, a)` under adaptive rates, as
    /// libmf starts them): initial predictions are small but not zero (zero factors would never
    /// move); biases zero; `G`s 1.
    fn init(&self, seed: u64, range: Range<usize>, out: &mut [f32]) {
        let a = (1.0 / self.k as f32).sqrt();
        let w = self.width();
        let order = self.row_order().map(|g| &g.of[..]);
        for (i, o) in range.zip(out) {
            // Each value drawn by its place in the model, wherever the vector holds its row.
            let i = order.map_or(i, |of| of[i / w] as usize * w + i % w);
            *o = match i % w {
                c if c < self.k && self.adaptive => super::uniform(seed, i, a).abs(),
                c if c < self.k => super::uniform(seed, i, a),
                c if self.adaptive && c >= w - ROW_STATE => 1.0,
                _ => 0.0,
            };
        }
    }

    fn sparse(&self) -> bool {
        true
    }

    /// Why training runs in dataset order though a batch has several chunks (the grid would not
    /// fit: see [`Mf::with_strata`]), with what would give it strata; `None` in strata or with
    /// one chunk a batch.
    fn warning(&self) -> Option<&str> {
        self.unstratified.as_deref()
    }

    fn keys(&self, rows: Range<usize>, set: &mut KeySet) {
        if let Some(keys) = self.grid.as_ref().and_then(|g| g.slot_keys(&rows)) {
            set.extend(keys);
            return;
        }
        let r = self.train_rows(rows);
        set.extend(r.users);
        set.extend_shifted(r.items, self.users as u32);
    }

    fn work(&self, _chunk: usize) -> Copies {
        Copies::new(self.layout())
    }

    /// Past the first pass (see [`compute_in`](Model::compute_in)).
    fn compute(&self, rows: Range<usize>, params: &[f32], work: &mut Copies) -> f64 {
        self.compute_in(1, rows, params, work)
    }

    /// See `Mf::chunk`.
    fn compute_in(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Copies) -> f64 {
        self.chunk(epoch, rows, params, work, false)
    }

    /// The batches of a round of the strata: each chunk one block piece, the blocks sharing no
    /// user band and no item band (the loose ratings' batches share rows).
    fn disjoint(&self, batch: Range<usize>, chunk: usize) -> bool {
        self.grid.as_ref().is_some_and(|g| g.disjoint(&batch, chunk))
    }

    fn compute_values(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Copies) -> f64 {
        self.chunk(epoch, rows, params, work, true)
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
        let (users, items) = self.vector_ids(&x);
        let sse = mf::sse_rows(&users, &items, x.ratings, u, v, self.k, self.width(), self.mean());
        [sse, sse, x.len() as f64]
    }
}

impl Export for Mf {
    /// Users then items, a row each in id order; with strata the vector holds the rows in band
    /// order (`Grid::in_band_order`), put back in id order on the way out and in.
    fn blocks(&self) -> Vec<Block> {
        let w = self.width();
        let (users, items) =
            (Block::new("users", &[self.users, w], 0), Block::new("items", &[self.items, w], self.users * w));
        match self.row_order() {
            Some(g) => vec![users.with_rows(&g.user_at), items.with_rows(&g.item_at)],
            None => vec![users, items],
        }
    }

    /// With strata, rows in band order (`Grid::in_band_order`): a checkpoint written before
    /// (rows in id order) is refused.
    fn param_order(&self) -> &'static str {
        if self.row_order().is_some() {
            "rows by strata bands"
        } else {
            ""
        }
    }

    /// The mean (with biases), and under adaptive rates `row_state`, how many values each row
    /// ends with that are not factors (its `G`s: read back by `predict`).
    fn constants(&self) -> Vec<(&'static str, Vec<f32>)> {
        let mut c: Vec<_> = self.mean().map(|m| ("mean", vec![m])).into_iter().collect();
        if self.adaptive {
            c.push(("row_state", vec![ROW_STATE as f32]));
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
        let (users, items) = self.vector_ids(&x);
        for (&a, &b) in users.iter().zip(items.iter()) {
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use peregrine_kernels::data::gen::{self, RatingsSpec};

    use std::ops::Range;

    use super::{Delta, Export, Grid, KeySet, Mf, Model, Ratings};

    /// What a put of `d` writes ([`Delta::key_ranges`]' values and [`Delta::rows`]), by index.
    pub(super) fn put_of(d: &mut Delta) -> BTreeMap<usize, u32> {
        let mut ranges = Vec::new();
        d.key_ranges(&mut ranges);
        let mut out: BTreeMap<usize, u32> =
            ranges.into_iter().flatten().map(|j| (j, d.values()[j].to_bits())).collect();
        for (start, v) in d.rows() {
            for (j, x) in v.iter().enumerate() {
                assert!(out.insert(start + j, x.to_bits()).is_none(), "{} written twice", start + j);
            }
        }
        out
    }

    /// A generated ratings file (in a temporary directory, kept while the first value lives).
    pub(super) fn generated(spec: RatingsSpec) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("r.pgd");
        gen::ratings(&spec, &path).expect("generate");
        (dir, path)
    }

    #[test]
    fn strata_only_where_a_block_fills_a_chunk_on_average() {
        let (_dir, path) =
            generated(RatingsSpec { rows: 2000, users: 60, items: 50, rank: 3, noise: 0.1, seed: 3 });
        let m = || Mf::new(&path, None, 4, 0.1, 0.1).expect("model");
        let first_users = |m: &Mf| m.train_rows(0..8).users.to_vec();
        let plain = first_users(&m());
        // 8 x 8 blocks of at least 1024 ratings would need 65,536; 4 x 4 of 64 need 1,024.
        for (batch, chunk, strata) in [(8192, 1024, false), (512, 128, false), (256, 64, true)] {
            let s = m().with_strata(batch, chunk);
            assert_eq!(s.grid.is_some(), strata, "batch {batch}, chunk {chunk}");
            assert_eq!(s.warning().is_some(), !strata, "batch {batch}, chunk {chunk}");
            assert_eq!(s.rows(), 2000);
            assert_eq!(
                first_users(&s) != plain,
                strata,
                "batch {batch}, chunk {chunk}: dataset order or not"
            );
        }
        // What the warnings suggest gives strata.
        for (batch, chunk, fix) in [
            (8192, 1024, (1000, 500, "--chunk 500 and --batch 1000 or less")),
            (512, 128, (384, 128, "--batch 384 or less at this --chunk")),
        ] {
            let w = m().with_strata(batch, chunk).warning().map(str::to_string).unwrap_or_default();
            assert!(w.ends_with(&format!("strata with {}", fix.2)), "{w}");
            assert!(m().with_strata(fix.0, fix.1).grid.is_some(), "batch {}, chunk {}", fix.0, fix.1);
        }
    }

    #[test]
    fn the_keys_a_slot_keeps_are_the_keys_of_its_ratings() {
        // 20,000 ratings: 8 x 8 blocks of 128 fit; the last slot holds 20,000 mod 128 = 32.
        let (_dir, path) =
            generated(RatingsSpec { rows: 20_000, users: 200, items: 150, rank: 3, noise: 0.1, seed: 7 });
        let m = Mf::new(&path, None, 4, 0.1, 0.1).expect("model").with_strata(1024, 128);
        assert!(m.grid.is_some());
        let keys = m.layout().keys();
        let of = |rows: Range<usize>, kept: bool| {
            assert_eq!(m.grid.as_ref().and_then(|g| g.slot_keys(&rows)).is_some(), kept, "{rows:?}");
            let mut set = KeySet::new(keys);
            m.keys(rows.clone(), &mut set);
            let mut got = set.keys().to_vec();
            got.sort_unstable();
            let r = m.train_rows(rows);
            let mut want: Vec<u32> =
                r.users.iter().copied().chain(r.items.iter().map(|&i| i + m.users as u32)).collect();
            want.sort_unstable();
            want.dedup();
            assert_eq!(got, want);
        };
        for start in (0..20_000).step_by(128) {
            of(start..(start + 128).min(20_000), true);
        }
        // Rows that are not one slot: the ratings' keys, as without strata.
        of(5..300, false);
        of(0..256, false);
        of(19_968..19_990, false);
        // The empty rows past the last slot of a set that fills its slots exactly: no keys.
        let (_d, exact) =
            generated(RatingsSpec { rows: 512, users: 30, items: 20, rank: 2, noise: 0.1, seed: 8 });
        let e = Mf::new(&exact, None, 2, 0.1, 0.1).expect("model").with_strata(256, 128);
        assert!(e.grid.is_some());
        let mut set = KeySet::new(e.layout().keys());
        e.keys(512..512, &mut set);
        assert!(set.keys().is_empty());
        // Into a set that has keys already: each key once.
        let mut set = KeySet::new(keys);
        m.keys(0..128, &mut set);
        m.keys(0..128, &mut set);
        let mut k = set.keys().to_vec();
        k.sort_unstable();
        k.dedup();
        assert_eq!(k.len(), set.keys().len());
    }

    #[test]
    fn strata_hold_the_rows_by_band_and_every_way_out_has_them_in_id_order() {
        // The evaluation set has users and items no training rating has: rows past every band.
        let (_dir, path) =
            generated(RatingsSpec { rows: 20_000, users: 200, items: 150, rank: 3, noise: 0.1, seed: 11 });
        let (_d2, eval) =
            generated(RatingsSpec { rows: 3000, users: 230, items: 170, rank: 3, noise: 0.1, seed: 12 });
        let (batch, chunk) = (1024, 128);
        let plain = Mf::new(&path, Some(&eval), 6, 0.1, 0.1).expect("model").with_adaptive(true);
        assert!(plain.users > 200 && plain.items > 150, "rows no training rating has");
        let strata = Mf::new(&path, Some(&eval), 6, 0.1, 0.1)
            .expect("model")
            .with_adaptive(true)
            .with_strata(batch, chunk);
        let g = strata.grid.as_ref().expect("strata");
        assert!(plain.row_order().is_none() && plain.param_order().is_empty());
        assert_eq!(strata.param_order(), "rows by strata bands");
        let l = strata.layout();
        assert_eq!(l, plain.layout());

        // Each band's rows side by side, in id order; the rows without a band after them.
        let shift = strata.users as u32;
        for (bands, at, first) in [(&g.user_bands, &g.user_at, 0), (&g.item_bands, &g.item_at, shift)] {
            let mut last = None;
            for b in 0..=g.bins as u32 {
                let ids: Vec<u32> = (0..at.len() as u32)
                    .filter(|&id| bands.get(id as usize).copied().unwrap_or(g.bins as u32) == b)
                    .collect();
                let rows: Vec<u32> = ids.iter().map(|&id| at[id as usize] + first).collect();
                let start = last.map_or(first, |r: u32| r + 1);
                assert_eq!(rows, (start..start + ids.len() as u32).collect::<Vec<_>>(), "band {b}");
                last = rows.last().copied().or(last);
            }
        }
        // A slot's keys in order, users then items; in the rounds of block pieces, in a few runs
        // where the same rows in id order would be a row or two each.
        let runs = |keys: &[u32]| 1 + keys.windows(2).filter(|w| w[1] != w[0] + 1).count();
        let (mut band_runs, mut id_runs) = (0, 0);
        for s in 0..g.key_starts.len() - 1 {
            let keys = g.keys_of(s);
            let users = g.slot_users[s] as usize;
            assert!(keys[..users].is_sorted() && keys[users..].is_sorted(), "slot {s}");
            if g.disjoint[s / g.bins] {
                let mut ids: Vec<u32> = keys.iter().map(|&k| g.of[k as usize]).collect();
                ids.sort_unstable();
                (band_runs, id_runs) = (band_runs + runs(keys), id_runs + runs(&ids));
            }
        }
        assert!(band_runs * 4 < id_runs, "{band_runs} runs in band order, {id_runs} in id order");

        // The initial model, its blocks, its evaluation and its predictions are the model's
        // without strata, value for value.
        let (mut pp, mut ps) = (vec![0.0; l.params], vec![0.0; l.params]);
        plain.init(3, 0..l.params, &mut pp);
        strata.init(3, 0..l.params, &mut ps);
        assert!(pp != ps, "the rows lie elsewhere");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let exported = |m: &Mf, p: &[f32]| -> Vec<(String, Vec<u32>)> {
            m.blocks().iter().map(|b| (b.name.clone(), bits(&b.values(p)))).collect()
        };
        assert_eq!(exported(&strata, &ps), exported(&plain, &pp));
        let mut back = vec![0.0; l.params];
        for (b, (_, v)) in strata.blocks().iter().zip(exported(&plain, &pp)) {
            let v: Vec<f32> = v.into_iter().map(f32::from_bits).collect();
            b.place(&v, &mut back);
        }
        assert_eq!(bits(&back), bits(&ps), "blocks read back into the strata's order");
        let n = strata.eval_rows();
        let sums = |m: &Mf, p: &[f32]| m.evaluate(p, 0..n).map(f64::to_bits);
        assert_eq!(sums(&strata, &ps), sums(&plain, &pp));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        strata.predict(&ps, 0..n, &mut a);
        plain.predict(&pp, 0..n, &mut b);
        assert_eq!(bits(&a), bits(&b));

        // A slot's new values are those its ratings give the model in id order, bit for bit.
        let t = Mf::rows_of(&strata.data.train);
        let ids = Grid::new(&t, batch / chunk, chunk);
        for slot in [0..chunk, 5 * chunk..6 * chunk] {
            for epoch in [0, 1] {
                let mut want = pp.clone();
                let x = Ratings {
                    users: &ids.users[slot.clone()],
                    items: &ids.items[slot.clone()],
                    ratings: &ids.ratings[slot.clone()],
                    ..t
                };
                let (u, v) = want.split_at_mut(plain.users * l.width);
                plain.sgd(epoch, &x, u, v);
                let mut work = strata.work(chunk);
                strata.compute_values(epoch, slot.clone(), &ps, &mut work);
                let mut d = Delta::new(l);
                strata.drain(&mut work, 1.0, &mut d);
                let mut got = ps.clone();
                for (j, x) in put_of(&mut d) {
                    got[j] = f32::from_bits(x);
                }
                assert_eq!(exported(&strata, &got), exported(&plain, &want), "{slot:?}, epoch {epoch}");
                assert!(bits(&want) != bits(&pp), "{slot:?} trained");
            }
        }
    }
}
