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

use std::borrow::Cow;
use std::ops::Range;
use std::path::Path;

use peregrine_kernels::data::gen::Rng;
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

/// A copy of the training ratings laid out in strata (20 bytes per rating), libmf's schedule
/// along the engine's batches of `C = batch / chunk` chunks:
///
/// - users fall into `C` bands of about equal rating counts (in a seeded random order of the
///   users, as libmf's random maps), items likewise; a block is a user band by an item band, its
///   ratings sorted by user, then item;
/// - each block is cut into pieces of `chunk` ratings, in which the users then take turns
///   ([`mf::take_turns`]: each one's first rating, then each one's second, ...); what does not fill
///   a piece (drawn at random from the block, not its last users, who would then all meet
///   untrained in the same batches) joins a pool of loose ratings, shuffled;
/// - stratum `s` is the blocks `(b, (b + s) mod C)`, which share no user band and no item band;
///   it is laid out in rounds, round `j` the `j`-th piece of each of its blocks in turn (or a
///   piece of loose ratings where a block has no `j`-th piece), so that each batch-aligned run of
///   `C` pieces is one round: chunks whose updates add up exactly;
/// - the loose ratings left over end the layout (there the chunks of a batch share rows, as in
///   dataset order).
///
/// The layout is a function of the ratings, `batch`, `chunk` and a fixed seed: every rank makes
/// the same one, when the model is built (a sort of the ratings: 10 ms for 90,000).
///
/// Each chunk-sized slot of the layout also keeps the keys (rows) its ratings touch, each once:
/// the pull and the chunk's copy ask for them on every visit, and a piece of 1024 ratings
/// touches a few hundred rows, so that is a fraction of the 2 keys a rating the ratings would
/// give (4 bytes a key: at most 8 bytes a rating more; MovieLens-100k at the defaults keeps 0.47
/// keys a rating, 2 bytes). The pull and the copy gathered the keys rating by rating before:
/// with them kept, MF's epoch on MovieLens-100k took 17 % less (2 ranks, 8 runs of each binary
/// alternated, medians 5.40 -> 4.50 ms; the same model).
///
/// And each rating keeps its user's and its item's places among its slot's keys (8 bytes a
/// rating more), so that a chunk that is one slot runs on its rows gathered side by side
/// ([`Copies::gather`]: on MovieLens-100k ~480 rows, 80 KB) rather than on a copy of the whole
/// model where they lie scattered (441 KB), changing the same values bit for bit. On a Zen 4, 2
/// MPI ranks, 6 runs of 100 epochs of each binary alternated: compute per rank 0.161 -> 0.141 s,
/// training 0.240 -> 0.219 s (medians; the same RMSE). What is left of the chunk's copy is the
/// settle's scattered adds into the rank's update (a whole-model buffer).
///
/// The parameter vector holds the rows band by band ([`in_band_order`](Self::in_band_order)),
/// each slot's keys in order, and a chunk of a round of block pieces leaves its rows' new values
/// where it computed them, put from there ([`Copies::settle_gathered`], [`Delta::rows`]): a
/// round's puts move runs of rows (the unit test's 20,000 generated ratings: 259 runs over the
/// rounds' slots where the same rows in id order make 3,602), no copy into the update, none of it
/// to clear. MovieLens-100k, 2 MPI ranks, 20 epochs, traced, alternated: the iterations that put
/// values 170 -> 133 us (push 42 -> 18 us), then 119 -> 106 with their pulls reading just their
/// keys; `bench-peers.sh --only mf` 0.72x -> 0.60x libmf's epoch; the same model bit for bit (1
/// rank, 1 thread).
#[derive(Debug)]
struct Grid {
    users: Vec<u32>,
    items: Vec<u32>,
    ratings: Vec<f32>,
    chunk: usize,
    /// Chunks a batch (`C`).
    bins: usize,
    /// Per batch of `bins` slots, whether its slots' keys are pairwise disjoint: its slots are
    /// all block pieces of one round, not loose ratings ([`Model::disjoint`]).
    disjoint: Vec<bool>,
    /// Each training user's band, and each training item's.
    user_bands: Vec<u32>,
    item_bands: Vec<u32>,
    /// The rows' order in the parameter vector ([`in_band_order`](Self::in_band_order)): each
    /// user's row among the users' rows, each item's among the items', and the model's key
    /// (users, then items after them) of each of the vector's. Empty before that: the model's
    /// own order.
    user_at: Vec<u32>,
    item_at: Vec<u32>,
    of: Vec<u32>,
    /// Where slot `s`'s keys start in `keys` (one more entry than slots).
    key_starts: Vec<usize>,
    keys: Vec<u32>,
    /// How many of slot `s`'s keys are users (they come first).
    slot_users: Vec<u32>,
    /// Per rating, its user's and its item's place among its slot's user keys and item keys:
    /// a chunk that is one slot runs on a gathered copy of its rows, indexed by these.
    local_users: Vec<u32>,
    local_items: Vec<u32>,
}

/// One chunk-sized slot of a [`Grid`]: its keys (users first) and its ratings with the user and
/// item ids replaced by their places among those keys.
struct Slot<'a> {
    keys: &'a [u32],
    users: usize,
    local: Ratings<'a>,
}

impl Grid {
    /// The layout for batches of `bins` chunks of `chunk` ratings (both at least 1).
    fn new(r: &Ratings<'_>, bins: usize, chunk: usize) -> Self {
        let n = r.len();
        let mut rng = Rng::new(0x6D66_6772_6964, 0);
        // Bands of about equal rating counts, over the ids in a random order.
        let mut bands = |ids: &[u32], count: usize| -> Vec<usize> {
            let mut per = vec![0usize; count];
            for &id in ids {
                per[id as usize] += 1;
            }
            let mut order: Vec<usize> = (0..count).collect();
            rng.shuffle(&mut order);
            let (mut band, mut seen) = (vec![0; count], 0usize);
            for id in order {
                band[id] = (seen * bins / n.max(1)).min(bins - 1);
                seen += per[id];
            }
            band
        };
        let (ub, ib) = (bands(r.users, r.n_users), bands(r.items, r.n_items));
        let narrow = |b: &[usize]| b.iter().map(|&x| x as u32).collect();
        let block = |j: usize| ub[r.users[j] as usize] * bins + ib[r.items[j] as usize];
        let mut sorted: Vec<usize> = (0..n).collect();
        sorted.sort_unstable_by_key(|&j| (block(j), r.users[j], r.items[j]));
        // Each block's pieces (where they start in `sorted`), and the loose ratings.
        let (mut pieces, mut loose) = (vec![Vec::new(); bins * bins], Vec::new());
        let mut start = 0;
        while start < n {
            let b = block(sorted[start]);
            let end = start + sorted[start..].iter().take_while(|&&j| block(j) == b).count();
            let within = &mut sorted[start..end];
            let full = within.len() / chunk * chunk;
            // The ratings past the full pieces, drawn at random, moved to the block's end.
            rng.shuffle_last(within, within.len() - full);
            loose.extend_from_slice(&within[full..]);
            within[..full].sort_unstable_by_key(|&j| (r.users[j], r.items[j]));
            for piece in within[..full].chunks_exact_mut(chunk) {
                mf::take_turns(piece, r.users);
            }
            pieces[b] = (start..start + full).step_by(chunk).collect();
            start = end;
        }
        rng.shuffle(&mut loose);
        let mut order = Vec::with_capacity(n);
        let mut spare = loose.chunks_exact(chunk);
        for s in 0..bins {
            let blocks: Vec<usize> = (0..bins).map(|b| b * bins + (b + s) % bins).collect();
            let rounds = blocks.iter().map(|&b| pieces[b].len()).max().unwrap_or(0);
            for j in 0..rounds {
                for &b in &blocks {
                    if let Some(&p) = pieces[b].get(j) {
                        order.extend_from_slice(&sorted[p..p + chunk]);
                    } else if let Some(piece) = spare.next() {
                        order.extend_from_slice(piece);
                    }
                }
            }
        }
        let tail = spare.remainder();
        order.extend(spare.flatten());
        order.extend_from_slice(tail);
        debug_assert_eq!(order.len(), n);
        Self {
            users: order.iter().map(|&j| r.users[j]).collect(),
            items: order.iter().map(|&j| r.items[j]).collect(),
            ratings: order.iter().map(|&j| r.ratings[j]).collect(),
            chunk,
            bins,
            disjoint: Vec::new(),
            user_bands: narrow(&ub),
            item_bands: narrow(&ib),
            user_at: Vec::new(),
            item_at: Vec::new(),
            of: Vec::new(),
            key_starts: Vec::new(),
            keys: Vec::new(),
            slot_users: Vec::new(),
            local_users: Vec::new(),
            local_items: Vec::new(),
        }
    }

    /// Renumbers the rows of a model of `users` users and `items` items so that each band's lie
    /// side by side in the parameter vector, in id order within it (the users of band 0, of band
    /// 1, ..., then those no training rating has; the items likewise, after the users), and the
    /// ratings' ids with them. A round of block pieces then touches a few long runs of rows
    /// where the bands, drawn over the ids in a random order, scattered them one or two at a
    /// time: the puts of their new values, the pulls of their keys and the chunks' copies move
    /// runs, not single rows. Which rating steps which row, and in which order, is unchanged:
    /// the same model, its rows elsewhere ([`Mf`] maps them back on every way out).
    fn in_band_order(mut self, users: usize, items: usize) -> Self {
        let order = |bands: &[u32], n: usize| {
            let mut ids: Vec<u32> = (0..n as u32).collect();
            ids.sort_unstable_by_key(|&id| (bands.get(id as usize).copied().unwrap_or(u32::MAX), id));
            ids
        };
        let place = |ids: &[u32]| {
            let mut at = vec![0; ids.len()];
            for (row, &id) in ids.iter().enumerate() {
                at[id as usize] = row as u32;
            }
            at
        };
        let (us, is) = (order(&self.user_bands, users), order(&self.item_bands, items));
        (self.user_at, self.item_at) = (place(&us), place(&is));
        self.of = us.into_iter().chain(is.into_iter().map(|i| i + users as u32)).collect();
        for u in &mut self.users {
            *u = self.user_at[*u as usize];
        }
        for i in &mut self.items {
            *i = self.item_at[*i as usize];
        }
        self
    }

    /// Fills each chunk-sized slot's keys (its users, then its items after the `users` user
    /// rows, of `rows` keys in all; each part in key order, so that a band's rows go in runs)
    /// and each rating's places among them.
    fn with_keys(mut self, users: u32, rows: usize) -> Self {
        let mut set = KeySet::new(rows);
        let mut sorted = Vec::new();
        // A key's place in its slot, valid for the slot's keys while the slot is laid out.
        let mut place = vec![0u32; rows];
        self.key_starts.push(0);
        self.local_users.reserve_exact(self.users.len());
        self.local_items.reserve_exact(self.items.len());
        for (u, i) in self.users.chunks(self.chunk).zip(self.items.chunks(self.chunk)) {
            set.extend(u);
            let su = set.len();
            set.extend_shifted(i, users);
            sorted.clear();
            sorted.extend_from_slice(set.keys());
            sorted[..su].sort_unstable();
            sorted[su..].sort_unstable();
            for (j, &key) in sorted.iter().enumerate() {
                // Users from 0, items from 0 after them.
                place[key as usize] = if j < su { j } else { j - su } as u32;
            }
            self.local_users.extend(u.iter().map(|&x| place[x as usize]));
            self.local_items.extend(i.iter().map(|&x| place[(x + users) as usize]));
            self.keys.extend_from_slice(&sorted);
            self.key_starts.push(self.keys.len());
            self.slot_users.push(su as u32);
            set.clear();
        }
        self.keys.shrink_to_fit();
        // A key's batch when last seen (the slots' own keys are distinct).
        let mut seen = vec![usize::MAX; rows];
        let slots = self.key_starts.len() - 1;
        self.disjoint = (0..slots.div_ceil(self.bins))
            .map(|b| {
                let mut disjoint = true;
                for s in b * self.bins..((b + 1) * self.bins).min(slots) {
                    for &key in self.keys_of(s) {
                        disjoint &= seen[key as usize] != b;
                        seen[key as usize] = b;
                    }
                }
                disjoint
            })
            .collect();
        self
    }

    /// Whether `rows` are one batch of the layout (`bins` slots from a multiple of that, cut in
    /// chunks of this layout's) whose slots touch pairwise disjoint keys.
    fn disjoint(&self, rows: &Range<usize>, chunk: usize) -> bool {
        let len = self.bins * self.chunk;
        chunk == self.chunk
            && rows.start.is_multiple_of(len)
            && rows.end == (rows.start + len).min(self.users.len())
            && self.disjoint.get(rows.start / len).copied().unwrap_or(false)
    }

    /// The keys of `rows` if they are one chunk-sized slot of the layout (a chunk the engine
    /// cut: its batches start at multiples of the chunk).
    fn slot_keys(&self, rows: &Range<usize>) -> Option<&[u32]> {
        self.slot_index(rows).map(|s| self.keys_of(s))
    }

    /// Slot `s`'s keys.
    fn keys_of(&self, s: usize) -> &[u32] {
        &self.keys[self.key_starts[s]..self.key_starts[s + 1]]
    }

    /// Which slot `rows` are, if they are one whole slot.
    fn slot_index(&self, rows: &Range<usize>) -> Option<usize> {
        let whole = !rows.is_empty()
            && rows.start.is_multiple_of(self.chunk)
            && rows.end == (rows.start + self.chunk).min(self.users.len());
        whole.then(|| rows.start / self.chunk)
    }

    /// `rows` as a [`Slot`], if they are one whole slot.
    fn slot(&self, rows: &Range<usize>) -> Option<Slot<'_>> {
        let s = self.slot_index(rows)?;
        let keys = self.keys_of(s);
        let users = self.slot_users[s] as usize;
        let local = Ratings {
            users: &self.local_users[rows.clone()],
            items: &self.local_items[rows.clone()],
            ratings: &self.ratings[rows.clone()],
            n_users: users,
            n_items: keys.len() - users,
        };
        Some(Slot { keys, users, local })
    }
}

/// Whether `n` training ratings fill a grid of `c x c` blocks of at least one `chunk` each on
/// average.
fn grid_fits(n: usize, c: usize, chunk: usize) -> bool {
    c.checked_mul(c).and_then(|b| b.checked_mul(chunk)).is_some_and(|need| need <= n)
}

/// The warning of a grid that does not fit: `n` training ratings, `c` chunks of `chunk` a batch.
fn unstratified(n: usize, c: usize, chunk: usize) -> String {
    let need = c.saturating_mul(c).saturating_mul(chunk);
    // The most chunks a batch that still fit at this chunk; failing 2, the largest chunk that 2
    // of fit.
    let most = (1..).take_while(|&b| grid_fits(n, b, chunk)).last().unwrap_or(0);
    let fix = if most >= 2 {
        format!("--batch {} or less at this --chunk", most * chunk)
    } else if n / 4 >= 1 {
        format!("--chunk {} and --batch {} or less", n / 4, 2 * (n / 4))
    } else {
        "more training ratings".to_string()
    };
    format!(
        "matrix factorization runs without strata: {c} x {c} blocks of at least one chunk of {chunk} \
         ratings need {need} training ratings and the set has {n}; the {c} chunks of a batch then share \
         users and items and their updates add up (a longer step, which can diverge); strata with {fix}"
    )
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

    /// Training ratings `rows`, in strata when the model has them.
    fn train_rows(&self, rows: Range<usize>) -> Ratings<'_> {
        let t = Self::rows_of(&self.data.train);
        match &self.grid {
            Some(g) => Ratings { users: &g.users, items: &g.items, ratings: &g.ratings, ..t },
            None => t,
        }
        .rows(rows)
    }

    /// SGD over ratings `x` (ids indexing `u` and `v`) in order, as the model trains; the
    /// summed squared error.
    fn sgd(&self, epoch: u64, x: &Ratings<'_>, u: &mut [f32], v: &mut [f32]) -> f64 {
        let (k, lr, l2) = (self.k, self.lr, self.l2);
        match (self.adaptive, self.mean()) {
            (true, mean) => {
                mf::sgd_chunk_adaptive(x.users, x.items, x.ratings, u, v, k, lr, l2, mean, epoch == 0)
            }
            (false, Some(m)) => mf::sgd_chunk_biased(x.users, x.items, x.ratings, u, v, k, lr, l2, m),
            (false, None) => mf::sgd_chunk(x.users, x.items, x.ratings, u, v, k, lr, l2),
        }
    }

    /// A chunk of pass `epoch` into `work`: what it changed, or its rows' new values
    /// ([`Model::compute_values`]). A chunk that is one slot of the strata runs on its rows
    /// gathered side by side ([`Copies::gather`]: a few hundred rows, where the whole model's
    /// copy scatters them over all of it), its ratings indexed by their places among them.
    fn chunk(&self, epoch: u64, rows: Range<usize>, params: &[f32], work: &mut Copies, values: bool) -> f64 {
        let l = self.layout();
        let Some(slot) = self.grid.as_ref().and_then(|g| g.slot(&rows)) else {
            return self.compute_scattered(epoch, rows, params, work, values);
        };
        let rows = work.gather(l, params, slot.keys);
        let (u, v) = rows.split_at_mut(slot.users * l.width);
        let sse = self.sgd(epoch, &slot.local, u, v);
        work.settle_gathered(l, (!values).then_some(params), slot.keys);
        sse
    }

    /// [`Mf::chunk`] on a copy of the whole model, at the keys its ratings touch (any rows: not
    /// one slot of the strata, or no strata).
    fn compute_scattered(
        &self,
        epoch: u64,
        rows: Range<usize>,
        params: &[f32],
        work: &mut Copies,
        values: bool,
    ) -> f64 {
        let l = self.layout();
        let local = work.take(l, params, |set| self.keys(rows.clone(), set));
        let (u, v) = local.split_at_mut(self.users * self.width());
        let sse = self.sgd(epoch, &self.train_rows(rows), u, v);
        work.settle(l, (!values).then_some(params));
        sse
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
    use std::collections::{BTreeMap, HashSet};

    use peregrine_kernels::data::gen::{self, RatingsSpec};

    use std::ops::Range;

    use super::{Copies, Delta, Export, Grid, KeySet, Mf, Model, Ratings, Rng};

    /// What a put of `d` writes ([`Delta::key_ranges`]' values and [`Delta::rows`]), by index.
    fn put_of(d: &mut Delta) -> BTreeMap<usize, u32> {
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
    fn generated(spec: RatingsSpec) -> (tempfile::TempDir, std::path::PathBuf) {
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
    fn a_batch_is_disjoint_where_its_chunks_share_no_row_and_they_then_leave_new_values() {
        // 20,000 ratings, batches of 8 chunks of 128: 8 x 8 blocks of about 312 ratings, two
        // pieces each and the rest loose.
        let (_dir, path) =
            generated(RatingsSpec { rows: 20_000, users: 200, items: 150, rank: 3, noise: 0.1, seed: 9 });
        let (n, batch, chunk) = (20_000, 1024, 128);
        let m = Mf::new(&path, None, 12, 0.05, 0.02)
            .expect("model")
            .with_adaptive(true)
            .with_strata(batch, chunk);
        let l = m.layout();
        let mut disjoint = 0;
        for start in (0..n).step_by(batch) {
            let rows = start..(start + batch).min(n);
            // The chunks' keys, as the model reads them, pairwise disjoint or not.
            let mut seen = HashSet::new();
            for c in rows.clone().step_by(chunk) {
                let mut set = KeySet::new(l.keys());
                m.keys(c..(c + chunk).min(rows.end), &mut set);
                seen.extend(set.keys().iter().map(|&k| (c, k)));
            }
            let keys: HashSet<u32> = seen.iter().map(|&(_, k)| k).collect();
            let expect = keys.len() == seen.len();
            assert_eq!(m.disjoint(rows.clone(), chunk), expect, "{rows:?}");
            disjoint += usize::from(expect);
            // Not one of the layout's batches: other chunks, or misaligned, or cut short.
            assert!(!m.disjoint(rows.clone(), chunk / 2), "{rows:?} in chunks of {}", chunk / 2);
            assert!(!m.disjoint(rows.start + 1..rows.end, chunk), "{rows:?} from one row on");
            assert!(!m.disjoint(rows.start..rows.end - 1, chunk), "{rows:?} less its last row");
        }
        // 20 batches: 8 strata of 2 rounds of block pieces (16 disjoint here), then the loose
        // ratings' batches.
        assert!((10..20).contains(&disjoint), "{disjoint} of 20 batches disjoint");
        assert!(
            !Mf::new(&path, None, 12, 0.05, 0.02).expect("model").disjoint(0..batch, chunk),
            "without strata"
        );

        // A chunk's new values are the snapshot plus its change, on its gathered rows (a slot) and on
        // the whole copy (any rows), in the first pass and a later one, drained into an update that
        // is zero at its keys.
        let mut params = vec![0.0; l.params];
        m.init(3, 0..l.params, &mut params);
        for rows in [0..chunk, 3 * chunk..4 * chunk, 5..chunk + 5] {
            for epoch in [0, 1] {
                let (mut a, mut b) = (m.work(chunk), m.work(chunk));
                let sa = m.compute_in(epoch, rows.clone(), &params, &mut a);
                let sb = m.compute_values(epoch, rows.clone(), &params, &mut b);
                assert_eq!(sa.to_bits(), sb.to_bits(), "{rows:?}, epoch {epoch}: error");
                let (mut change, mut values) = (Delta::new(l), Delta::new(l));
                m.drain(&mut a, 1.0, &mut change);
                m.drain(&mut b, 1.0, &mut values);
                let mut ra = Vec::new();
                change.key_ranges(&mut ra);
                let put = put_of(&mut values);
                let touched: Vec<usize> = ra.into_iter().flatten().collect();
                assert_eq!(put.keys().copied().collect::<Vec<_>>(), touched, "{rows:?}, epoch {epoch}: keys");
                let mut moved = 0;
                for j in touched {
                    let want = params[j] + change.values()[j];
                    let got = f32::from_bits(put[&j]);
                    assert!(
                        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "{rows:?}, {j}: {got} vs {want}"
                    );
                    moved += usize::from(got != params[j]);
                }
                assert!(moved > chunk, "{rows:?}, epoch {epoch}: {moved} values moved");
                // A slot's rows go over whole, where it computed them: the update's vector stays
                // zeros (nothing of it to clear); the whole copy's values are written into it.
                let slot = m.grid.as_ref().and_then(|g| g.slot(&rows)).is_some();
                assert_eq!(values.values().iter().all(|&x| x == 0.0), slot, "{rows:?}: rows or vector");
                // The buffers are left as drained: a second chunk's values land on zeros.
                let sc = m.compute_values(epoch, rows.clone(), &params, &mut b);
                assert_eq!(sc.to_bits(), sa.to_bits());
                let mut again = Delta::new(l);
                m.drain(&mut b, 1.0, &mut again);
                assert_eq!(put_of(&mut again), put, "{rows:?}, epoch {epoch}: computed again");
            }
        }
        // Two chunks of a disjoint batch drained into one update (two threads of a rank, each
        // its own rows): both chunks' rows written, each once.
        assert!(m.disjoint(0..batch, chunk), "the first batch is a round of block pieces");
        let (mut both, mut b, mut c) = (Delta::new(l), m.work(chunk), m.work(chunk));
        let mut union = BTreeMap::new();
        for (rows, work) in [(0..chunk, &mut b), (chunk..2 * chunk, &mut c)] {
            let mut alone = Delta::new(l);
            m.compute_values(1, rows.clone(), &params, work);
            m.drain(work, 1.0, &mut alone);
            union.extend(put_of(&mut alone));
            m.compute_values(1, rows, &params, work);
            m.drain(work, 1.0, &mut both);
        }
        assert_eq!(put_of(&mut both), union, "two chunks into one update");
    }

    #[test]
    fn a_slot_on_its_gathered_rows_changes_what_it_would_on_the_whole_copy() {
        // 20,000 ratings in 8 x 8 blocks of 128: every chunk-sized slot, the first pass and a
        // later one, with biases or without, plain or adaptive rates.
        let (_dir, path) =
            generated(RatingsSpec { rows: 20_000, users: 200, items: 150, rank: 3, noise: 0.1, seed: 9 });
        for (biases, adaptive) in [(false, true), (true, true), (true, false)] {
            let m = Mf::new(&path, None, 12, 0.05, 0.02)
                .expect("model")
                .with_biases(biases)
                .with_adaptive(adaptive)
                .with_strata(1024, 128);
            let g = m.grid.as_ref().expect("strata");
            let l = m.layout();
            let bits = |d: &Delta| d.values().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let mut params = vec![0.0; l.params];
            m.init(3, 0..l.params, &mut params);
            for start in (0..20_000).step_by(128) {
                let rows = start..(start + 128).min(20_000);
                assert!(g.slot(&rows).is_some(), "{rows:?} is a slot");
                for epoch in [0, 1] {
                    let run = |gathered: bool, c: &mut Copies| {
                        if gathered {
                            m.compute_in(epoch, rows.clone(), &params, c)
                        } else {
                            m.compute_scattered(epoch, rows.clone(), &params, c, false)
                        }
                    };
                    let (mut a, mut b) = (m.work(128), m.work(128));
                    let (sa, sb) = (run(true, &mut a), run(false, &mut b));
                    assert_eq!(sa.to_bits(), sb.to_bits(), "{rows:?}, epoch {epoch}: error");
                    // Drained scaled into an update that has a key already (added key by key),
                    // then, run again, into an empty one (the buffers trade places, each
                    // touched key scaled).
                    let (mut da, mut db) = (Delta::new(l), Delta::new(l));
                    da.add(0, 1.0, &params[l.range(0)]);
                    db.add(0, 1.0, &params[l.range(0)]);
                    m.drain(&mut a, 0.5, &mut da);
                    m.drain(&mut b, 0.5, &mut db);
                    assert_eq!(bits(&da), bits(&db), "{rows:?}, epoch {epoch}: update");
                    let (mut ea, mut eb) = (Delta::new(l), Delta::new(l));
                    run(true, &mut a);
                    run(false, &mut b);
                    m.drain(&mut a, 0.5, &mut ea);
                    m.drain(&mut b, 0.5, &mut eb);
                    assert_eq!(bits(&ea), bits(&eb), "{rows:?}, epoch {epoch}: update into an empty one");
                    assert!(ea.values().iter().any(|&x| x != 0.0), "{rows:?}: the chunk changed something");
                }
            }
            // Rows that are not one slot take the whole copy.
            assert!(g.slot(&(5..133)).is_none() && g.slot(&(0..256)).is_none());
        }
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

    #[test]
    fn a_grid_that_does_not_fit_says_what_would() {
        // MovieLens-100k's 90,000 training ratings at --batch 16384 --chunk 2048 (which diverges).
        let w = super::unstratified(90_000, 8, 2048);
        assert!(w.contains("8 x 8 blocks of at least one chunk of 2048 ratings need 131072"), "{w}");
        assert!(w.ends_with("strata with --batch 12288 or less at this --chunk"), "{w}");
        // (6 chunks of 2048 fit: 6 x 6 x 2048 <= 90,000; 7 do not.)
        // No chunk count of 2 or more fits 1,000 ratings in chunks of 1024: 2 x 2 x 250 do.
        let w = super::unstratified(1000, 4, 1024);
        assert!(w.ends_with("strata with --chunk 250 and --batch 500 or less"), "{w}");
        assert!(super::unstratified(3, 4, 1024).ends_with("strata with more training ratings"));
        // One chunk a batch: nothing to share, no warning.
        let (_dir, path) =
            generated(RatingsSpec { rows: 500, users: 20, items: 20, rank: 2, noise: 0.1, seed: 4 });
        let m = Mf::new(&path, None, 2, 0.1, 0.1).expect("model").with_strata(1024, 1024);
        assert!(m.grid.is_none() && m.warning().is_none());
    }

    /// Ratings of `users` x `items` drawn with skew (a few heavy users and items, as real
    /// ratings have).
    fn skewed(n: usize, users: u32, items: u32) -> (Vec<u32>, Vec<u32>, Vec<f32>) {
        let mut rng = Rng::new(5, 1);
        let mut draw = |m: u32| (rng.uniform().powi(2) * f64::from(m)) as u32;
        let (u, i): (Vec<u32>, Vec<u32>) = (0..n).map(|_| (draw(users), draw(items))).unzip();
        let r = (0..n).map(|j| (j % 5) as f32 + 1.0).collect();
        (u, i, r)
    }

    #[test]
    fn strata_keep_every_rating_and_give_a_batch_chunks_that_share_no_row() {
        let (n, users, items, chunk, per_batch) = (120_000, 3000, 1500, 256, 8);
        let (u, i, r) = skewed(n, users, items);
        let ratings =
            Ratings { users: &u, items: &i, ratings: &r, n_users: users as usize, n_items: items as usize };
        let g = Grid::new(&ratings, per_batch, chunk);
        // A permutation of the ratings.
        let sorted = |u: &[u32], i: &[u32], r: &[f32]| {
            let mut v: Vec<_> = (0..u.len()).map(|j| (u[j], i[j], r[j].to_bits())).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(sorted(&g.users, &g.items, &g.ratings), sorted(&u, &i, &r));
        // Batches whose chunks touch disjoint rows, and rows per chunk, against dataset order.
        let look = |u: &[u32], i: &[u32]| {
            let (mut disjoint, mut rows, mut batches) = (0, 0, 0);
            for b in (0..n).step_by(per_batch * chunk) {
                let mut seen = HashSet::new();
                let mut clash = false;
                for c in (b..(b + per_batch * chunk).min(n)).step_by(chunk) {
                    let e = (c + chunk).min(n);
                    let own: HashSet<(bool, u32)> = u[c..e]
                        .iter()
                        .map(|&x| (true, x))
                        .chain(i[c..e].iter().map(|&x| (false, x)))
                        .collect();
                    rows += own.len();
                    clash |= own.iter().any(|k| seen.contains(k));
                    seen.extend(own);
                }
                disjoint += usize::from(!clash);
                batches += 1;
            }
            (disjoint as f64 / batches as f64, rows as f64 / n.div_ceil(chunk) as f64)
        };
        let (share, rows) = look(&g.users, &g.items);
        let (share0, rows0) = look(&u, &i);
        assert!(
            share >= 0.75,
            "{share:.2} of the batches have chunks sharing no row (dataset order: {share0:.2})"
        );
        assert!(rows < 0.5 * rows0, "rows per chunk: {rows:.0} in strata, {rows0:.0} in dataset order");
    }
}
