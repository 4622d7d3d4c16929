//! The strata schedule of matrix factorization ([`Grid`]): the training ratings laid out along the
//! engine's batches in blocks that share no user and no item (libmf's schedule), the rows renumbered
//! band by band, and each chunk-sized slot's keys; and the warning when the grid does not fit.

use std::ops::Range;

use peregrine_kernels::data::gen::Rng;
use peregrine_kernels::data::Ratings;
use peregrine_kernels::mf;

use crate::model::KeySet;

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
///
/// [`Copies::gather`]: crate::model::Copies::gather
/// [`Copies::settle_gathered`]: crate::model::Copies::settle_gathered
/// [`Delta::rows`]: crate::model::Delta::rows
#[derive(Debug)]
pub(super) struct Grid {
    pub(super) users: Vec<u32>,
    pub(super) items: Vec<u32>,
    pub(super) ratings: Vec<f32>,
    pub(super) chunk: usize,
    /// Chunks a batch (`C`).
    pub(super) bins: usize,
    /// Per batch of `bins` slots, whether its slots' keys are pairwise disjoint: its slots are
    /// all block pieces of one round, not loose ratings ([`Model::disjoint`]).
    ///
    /// [`Model::disjoint`]: crate::model::Model::disjoint
    pub(super) disjoint: Vec<bool>,
    /// Each training user's band, and each training item's.
    pub(super) user_bands: Vec<u32>,
    pub(super) item_bands: Vec<u32>,
    /// The rows' order in the parameter vector ([`in_band_order`](Self::in_band_order)): each
    /// user's row among the users' rows, each item's among the items', and the model's key
    /// (users, then items after them) of each of the vector's. Empty before that: the model's
    /// own order.
    pub(super) user_at: Vec<u32>,
    pub(super) item_at: Vec<u32>,
    pub(super) of: Vec<u32>,
    /// Where slot `s`'s keys start in `keys` (one more entry than slots).
    pub(super) key_starts: Vec<usize>,
    keys: Vec<u32>,
    /// How many of slot `s`'s keys are users (they come first).
    pub(super) slot_users: Vec<u32>,
    /// Per rating, its user's and its item's place among its slot's user keys and item keys:
    /// a chunk that is one slot runs on a gathered copy of its rows, indexed by these.
    local_users: Vec<u32>,
    local_items: Vec<u32>,
}

/// One chunk-sized slot of a [`Grid`]: its keys (users first) and its ratings with the user and
/// item ids replaced by their places among those keys.
pub(super) struct Slot<'a> {
    pub(super) keys: &'a [u32],
    pub(super) users: usize,
    pub(super) local: Ratings<'a>,
}

impl Grid {
    /// The layout for batches of `bins` chunks of `chunk` ratings (both at least 1).
    pub(super) fn new(r: &Ratings<'_>, bins: usize, chunk: usize) -> Self {
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
    ///
    /// [`Mf`]: super::Mf
    pub(super) fn in_band_order(mut self, users: usize, items: usize) -> Self {
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
    pub(super) fn with_keys(mut self, users: u32, rows: usize) -> Self {
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
    pub(super) fn disjoint(&self, rows: &Range<usize>, chunk: usize) -> bool {
        let len = self.bins * self.chunk;
        chunk == self.chunk
            && rows.start.is_multiple_of(len)
            && rows.end == (rows.start + len).min(self.users.len())
            && self.disjoint.get(rows.start / len).copied().unwrap_or(false)
    }

    /// The keys of `rows` if they are one chunk-sized slot of the layout (a chunk the engine
    /// cut: its batches start at multiples of the chunk).
    pub(super) fn slot_keys(&self, rows: &Range<usize>) -> Option<&[u32]> {
        self.slot_index(rows).map(|s| self.keys_of(s))
    }

    /// Slot `s`'s keys.
    pub(super) fn keys_of(&self, s: usize) -> &[u32] {
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
    pub(super) fn slot(&self, rows: &Range<usize>) -> Option<Slot<'_>> {
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
pub(super) fn grid_fits(n: usize, c: usize, chunk: usize) -> bool {
    c.checked_mul(c).and_then(|b| b.checked_mul(chunk)).is_some_and(|need| need <= n)
}

/// The warning of a grid that does not fit: `n` training ratings, `c` chunks of `chunk` a batch.
pub(super) fn unstratified(n: usize, c: usize, chunk: usize) -> String {
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use peregrine_kernels::data::gen::RatingsSpec;
    use peregrine_kernels::data::gen::Rng;
    use peregrine_kernels::data::Ratings;

    use super::Grid;
    use crate::model::mf::tests::generated;
    use crate::model::mf::Mf;
    use crate::model::Model;

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
