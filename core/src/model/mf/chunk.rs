//! One chunk of matrix factorization's training: its ratings (in strata when the model has them)
//! and plain or adaptive-rate SGD over them, on the slot's rows gathered side by side or on a copy
//! of the whole model.

use std::ops::Range;

use peregrine_kernels::data::Ratings;
use peregrine_kernels::mf;

use super::Mf;
use crate::model::{Copies, Model};

impl Mf {
    /// Training ratings `rows`, in strata when the model has them.
    pub(super) fn train_rows(&self, rows: Range<usize>) -> Ratings<'_> {
        let t = Self::rows_of(&self.data.train);
        match &self.grid {
            Some(g) => Ratings { users: &g.users, items: &g.items, ratings: &g.ratings, ..t },
            None => t,
        }
        .rows(rows)
    }

    /// SGD over ratings `x` (ids indexing `u` and `v`) in order, as the model trains; the
    /// summed squared error.
    pub(super) fn sgd(&self, epoch: u64, x: &Ratings<'_>, u: &mut [f32], v: &mut [f32]) -> f64 {
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
    pub(super) fn chunk(
        &self,
        epoch: u64,
        rows: Range<usize>,
        params: &[f32],
        work: &mut Copies,
        values: bool,
    ) -> f64 {
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
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use peregrine_kernels::data::gen::RatingsSpec;

    use crate::model::mf::tests::{generated, put_of};
    use crate::model::mf::Mf;
    use crate::model::{Copies, Delta, KeySet, Model};

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
}
