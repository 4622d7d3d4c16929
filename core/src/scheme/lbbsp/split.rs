//! LB-BSP's splits of a batch over the ranks: by water-filling over every rank's prediction (up
//! to [`super::READ_ALL_UP_TO`] ranks), or from the tree of sums of what each rank published
//! ([`crate::sums`], past them).

use std::ops::Range;

use crate::sums::{Totals, PARTS};

/// A prediction in the tree's fixed point: 1/1024 of a row per second (`None`: no prediction).
/// Capped at 2^38 (2.7 x 10^8 rows a second), so that sums over 2^24 ranks fit in 62 bits, and
/// scaled in [`part_by_sums`] by the count of predictions and the chunks, in 128.
pub(super) fn fixed(speed: f64) -> Option<u64> {
    (speed.is_finite() && speed > 0.0).then(|| ((speed * 1024.0).round() as u64).clamp(1, 1 << 38))
}

/// The chunks of `chunks` every one of `n` ranks keeps (one when there are enough: a rank given
/// none would never measure its speed again, and a low estimate would stick), and those left
/// beyond them to split by speed.
pub(super) fn floor_and_spare(chunks: usize, n: usize) -> (usize, usize) {
    let floor = usize::from(chunks >= n);
    (floor, chunks - floor * n)
}

/// How much shorter (predicted) a weighted split must make the iteration before it replaces the
/// even split: moving chunks on the strength of noisy speed estimates costs more than it saves
/// (with one chunk of eight moved by a 10% measurement wobble, every iteration waits for the
/// rank that got the extra chunk).
const MIN_GAIN: f64 = 0.05;

/// Splits `chunks` chunks over ranks by predicted `speeds` (chunks per unit of time; non-positive
/// or non-finite ones count as the mean of the others, all such: even split): rank `r`'s chunks
/// are `starts[r]..starts[r + 1]`. The split minimizes the predicted makespan `max(n_r / s_r)`
/// over whole chunks with at least one chunk each (each chunk goes where it finishes first, ties
/// to the lower rank), and is used only when it beats the even split's by at least
/// [`MIN_GAIN`]; every rank derives the same split from the same speeds.
pub(crate) fn split_starts(chunks: usize, speeds: &[f64]) -> Vec<usize> {
    let n = speeds.len();
    let good: Vec<f64> = speeds.iter().copied().filter(|w| w.is_finite() && *w > 0.0).collect();
    let mean = if good.is_empty() { 1.0 } else { good.iter().sum::<f64>() / good.len() as f64 };
    let s: Vec<f64> = speeds.iter().map(|&x| if x.is_finite() && x > 0.0 { x } else { mean }).collect();
    let even: Vec<usize> = (0..n).map(|k| crate::plan::split(chunks, k, n).len()).collect();
    let makespan = |counts: &[usize]| counts.iter().zip(&s).map(|(&c, &v)| c as f64 / v).fold(0.0, f64::max);
    let best = fill(chunks, &s, floor_and_spare(chunks, n).0);
    let counts = if makespan(&best) < (1.0 - MIN_GAIN) * makespan(&even) { best } else { even };
    std::iter::once(0)
        .chain(counts.iter().scan(0, |at, &c| {
            *at += c;
            Some(*at)
        }))
        .collect()
}

/// What a rank adds to the tree of sums past [`super::READ_ALL_UP_TO`] ranks ([`part_by_sums`]
/// splits by them): its prediction in fixed point (0: none); its base count, the chunks its
/// prediction earns at the last split's level (`spare * p / S` rounded down, `S` the predictions'
/// sum then, `spare` the chunks beyond one a rank of the next iteration), and its weight for the
/// chunks the base counts leave: its prediction if at least the last split's mean, else 0. Without
/// a last split in which every rank had a prediction, no base count and the prediction as weight.
pub(crate) fn published(pred: Option<u64>, level: Option<(Totals, usize)>, n: usize) -> [u64; PARTS] {
    let Some(p) = pred else { return [0; PARTS] };
    match level {
        Some((t, spare)) if t.count == n as u64 && t.sum[0] > 0 => {
            // At most `spare` (a prediction far above the last split's sum): the sum of the
            // base counts then exceeds the batch and the split falls back to proportions.
            let base = (u128::from(p) * spare as u128 / u128::from(t.sum[0])).min(spare as u128);
            let fast = u128::from(p) * u128::from(t.count) >= u128::from(t.sum[0]);
            [p, base as u64, if fast { p } else { 0 }]
        }
        _ => [p, 0, p],
    }
}

/// Rank `rank`'s part of `chunks` chunks split over `n` ranks by their predictions, from the
/// tree of sums ([`crate::sums`]) of what they [`published`]: `world`, every rank's, `before`,
/// those of ranks `0..rank`, and `mine`. Each rank keeps at least one chunk (when there are
/// enough), in integers from prefix sums alone, so that the parts of all ranks tile the batch
/// exactly:
/// - where every rank predicted and the base counts fit the batch: its base count, and of the
///   chunks left `L`, rank `k` starts at `B_k + round(L * F_k / F)` (`B_k`, `F_k` the base
///   counts and weights before it, `F` all weights). A rank slower than the mean gets its base
///   count, rounded down, as water-filling gives a slow rank no chunk it would finish last; the
///   others share the rest in proportion;
/// - otherwise, in proportion to the predictions, a rank without one counting as their mean
///   (as in [`split_starts`]): rank `k` starts at `round(spare * P_k / S)`;
/// - none at all: the even split.
///
/// Each part is within a chunk of its proportional share or of its base count. Used only
/// where it beats the even split by [`MIN_GAIN`], judged from the totals alone (the proportional
/// split's makespan is at most `spare / S + 2 / slowest`, against the even split's), so that
/// every rank decides alike.
pub(crate) fn part_by_sums(
    chunks: usize,
    n: usize,
    rank: usize,
    world: Totals,
    before: Totals,
    mine: [u64; PARTS],
) -> Range<usize> {
    let even = crate::plan::split(chunks, rank, n);
    if world.count == 0 || world.sum[0] == 0 || n == 0 {
        return even;
    }
    let (floor, spare) = floor_and_spare(chunks, n);
    let spare = spare as u128;
    let mean = world.sum[0] as f64 / world.count as f64;
    let slowest = match world.min {
        Some(m) if world.count == n as u64 => m as f64,
        Some(m) => (m as f64).min(mean),
        None => mean,
    };
    let weighted = spare as f64 / (mean * n as f64) + (floor + 1) as f64 / slowest;
    if weighted >= (1.0 - MIN_GAIN) * chunks.div_ceil(n) as f64 / slowest {
        return even;
    }
    // `base + round(left * weight_before / weights)` from the start of the rank's parts.
    let at = |k: usize, base: u128, left: u128, p: u128, total: u128| {
        k * floor + (base + (2 * left * p + total) / (2 * total)) as usize
    };
    let [_, bases, weights] = world.sum.map(u128::from);
    if world.count == n as u64 && bases <= spare && weights > 0 {
        let (b, w) = (u128::from(before.sum[1]), u128::from(before.sum[2]));
        let left = spare - bases;
        let (own_b, own_w) = (u128::from(mine[1]), u128::from(mine[2]));
        return at(rank, b, left, w, weights)..at(rank + 1, b + own_b, left, w + own_w, weights);
    }
    // Every prediction times the count of predictions, a missing one as their sum (the mean,
    // times the count): integers throughout, so every rank computes the same starts.
    let (count, sum) = (u128::from(world.count), u128::from(world.sum[0]));
    let total = sum * n as u128;
    let own = if mine[0] > 0 { u128::from(mine[0]) * count } else { sum };
    let prefix = u128::from(before.sum[0]) * count + (rank as u128 - u128::from(before.count)) * sum;
    at(rank, 0, spare, prefix, total)..at(rank + 1, 0, spare, prefix + own, total)
}

/// Water-filling: `floor` chunks each, then each further chunk to the rank that would finish it
/// first (`(count + 1) / speed` smallest, ties to the lowest rank), until `chunks` are given.
/// Starts from a proportional share known not to exceed the result (see below) and fills the
/// rest from a heap: O(n log n) instead of O(chunks x n), which at 4,096 ranks and 65,536 chunks
/// was 268 M steps per rank and iteration.
fn fill(chunks: usize, s: &[f64], floor: usize) -> Vec<usize> {
    use std::cmp::Reverse;
    let n = s.len();
    let total: f64 = s.iter().sum();
    let spare = chunks - floor * n;
    // The greedy's last value `l` satisfies chunks <= n floor + l total, and every rank gets at
    // least ceil(l s_k) - 1 >= floor(spare s_k / total) - 1 chunks: a lower bound to start from.
    let mut counts: Vec<usize> = s
        .iter()
        .map(|&v| floor.max(((spare as f64 * v / total).floor() as usize).saturating_sub(1)))
        .collect();
    let mut given: usize = counts.iter().sum();
    if given > chunks {
        counts = vec![floor; n];
        given = floor * n;
    }
    /// `(count + 1) / speed` of rank `k`, ordered as f64 by total order, then by rank.
    #[derive(PartialEq)]
    struct Next(f64, usize);
    impl Eq for Next {}
    impl PartialOrd for Next {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Next {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            self.0.total_cmp(&o.0).then(self.1.cmp(&o.1))
        }
    }
    let mut heap: std::collections::BinaryHeap<Reverse<Next>> =
        (0..n).map(|k| Reverse(Next((counts[k] + 1) as f64 / s[k], k))).collect();
    while given < chunks {
        let Some(Reverse(Next(_, k))) = heap.pop() else { break };
        counts[k] += 1;
        given += 1;
        heap.push(Reverse(Next((counts[k] + 1) as f64 / s[k], k)));
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `r`'s part of [`split_starts`].
    fn split_weighted(chunks: usize, speeds: &[f64], r: usize) -> std::ops::Range<usize> {
        let starts = split_starts(chunks, speeds);
        starts[r]..starts[r + 1]
    }

    /// The water-filling as first written: one chunk at a time over every rank.
    fn fill_slowly(chunks: usize, s: &[f64], floor: usize) -> Vec<usize> {
        let n = s.len();
        let mut best = vec![floor; n];
        for _ in 0..chunks - floor * n {
            let k = (0..n)
                .min_by(|&a, &b| ((best[a] + 1) as f64 / s[a]).total_cmp(&((best[b] + 1) as f64 / s[b])))
                .expect("at least one rank");
            best[k] += 1;
        }
        best
    }

    proptest::proptest! {
        #[test]
        fn the_fast_fill_is_the_one_chunk_at_a_time_fill(
            speeds in proptest::collection::vec(prop_oneof_speed(), 1..40),
            extra in 0usize..500,
        ) {
            let n = speeds.len();
            for floor in [0, 1] {
                let chunks = floor * n + extra;
                proptest::prop_assert_eq!(fill(chunks, &speeds, floor), fill_slowly(chunks, &speeds, floor));
            }
        }
    }

    /// Speeds with ties (small integers) and without.
    fn prop_oneof_speed() -> impl proptest::strategy::Strategy<Value = f64> {
        use proptest::strategy::Strategy;
        proptest::prop_oneof![(1u32..5).prop_map(f64::from), 0.01f64..100.0]
    }

    #[test]
    fn weighted_splits_cover_everything_in_proportion() {
        let w = [1.0, 0.5, 0.5];
        let parts: Vec<_> = (0..3).map(|r| split_weighted(100, &w, r)).collect();
        assert_eq!(parts, vec![0..50, 50..75, 75..100]);
        let even: Vec<_> = (0..4).map(|r| split_weighted(10, &[0.0; 4], r).len()).collect();
        assert_eq!(even.iter().sum::<usize>(), 10);
        assert!(even.iter().all(|&n| (2..=3).contains(&n)));
        assert_eq!(split_weighted(10, &[2.0, f64::NAN], 1), 5..10, "a missing weight counts as the mean");
        // 8 chunks at speeds 1 and 0.85: moving one makes 5 / 1 against 4 / 0.85 = 4.7, no gain;
        // at 1 and 0.7: 5 / 1 and 3 / 0.7 against 4 / 0.7 = 5.7, moved.
        assert_eq!(split_weighted(8, &[1.0, 0.85], 0), 0..4);
        assert_eq!(split_weighted(8, &[1.0, 0.7], 0), 0..5);
        assert_eq!(split_weighted(8, &[0.5, 1.0], 0), 0..3, "the slow rank gets fewer");
    }

    /// Every rank's part of [`part_by_sums`] when each [`published`] its prediction in `speeds`
    /// at `level`, the tree's totals computed here; and the totals.
    fn parts_by_sums(
        chunks: usize,
        speeds: &[Option<u64>],
        level: Option<(Totals, usize)>,
    ) -> (Vec<Range<usize>>, Totals) {
        let n = speeds.len();
        let values: Vec<[u64; PARTS]> = speeds.iter().map(|&p| published(p, level, n)).collect();
        let totals = |vs: &[[u64; PARTS]]| Totals::of_all(vs.iter().copied());
        let world = totals(&values);
        let parts =
            (0..n).map(|r| part_by_sums(chunks, n, r, world, totals(&values[..r]), values[r])).collect();
        (parts, world)
    }

    /// Two splits of `chunks` by `speeds`: the first without a level, the second at the first's.
    fn two_splits(chunks: usize, speeds: &[Option<u64>]) -> [Vec<Range<usize>>; 2] {
        let (first, world) = parts_by_sums(chunks, speeds, None);
        let spare = floor_and_spare(chunks, speeds.len()).1;
        [first, parts_by_sums(chunks, speeds, Some((world, spare))).0]
    }

    #[test]
    fn parts_from_the_tree_of_sums_are_proportional_and_tile_the_batch() {
        // 100 ranks, 3200 chunks; rank 0 at half the others' speed: one chunk each, then the 3100
        // left in proportion (99.5 shares: 31.16 chunks a share). The first split: rank 0 ends
        // at 1 + round(15.58) = 17 chunks, rank 1 at 2 + round(15.58 + 31.16) = 49.
        let mut speeds = vec![Some(2048); 100];
        speeds[0] = Some(1024);
        let [first, second] = two_splits(3200, &speeds);
        assert_eq!((first[0].clone(), first[1].clone(), first[99].end), (0..17, 17..49, 3200));
        // The second, at the first's level: base counts 15 (rank 0) and 31 (the others), 3084 in
        // all; the 16 left go to the ranks at or above the mean in proportion. Rank 0 gets
        // 1 + 15 = 16 chunks (as water-filling: at 16 it would finish its 17th after every fast
        // rank its 33rd), rank 1 2 + 46 + round(16 / 99) = 48.
        assert_eq!((second[0].clone(), second[1].clone(), second[99].end), (0..16, 16..48, 3200));
        assert_eq!(second.iter().filter(|p| p.len() == 33).count(), 16);
        // A missing prediction counts as the mean: all missing but one, the even split.
        let mut one = vec![None; 100];
        one[5] = Some(3000);
        assert!(two_splits(3200, &one).iter().flatten().all(|p| p.len() == 32));
        // Noise of a few percent moves nothing (the even split's makespan is not beaten by 5 %).
        let noisy: Vec<_> = (0..100).map(|r| Some(1000 + (r % 7) * 10)).collect();
        assert!(two_splits(3200, &noisy).iter().flatten().all(|p| p.len() == 32));
    }

    proptest::proptest! {
        #[test]
        fn parts_by_sums_cover_every_chunk_once_and_stay_within_a_chunk_of_the_share(
            chunks in 0usize..5000,
            speeds in proptest::collection::vec(proptest::option::weighted(0.9, 1u64..1 << 38), 1..300),
        ) {
            let n = speeds.len();
            let floor = usize::from(chunks >= n);
            let spare = (chunks - floor * n) as f64;
            let (_, world) = parts_by_sums(chunks, &speeds, None);
            let [first, second] = two_splits(chunks, &speeds);
            for (round, parts) in [first, second].iter().enumerate() {
                let mut at = 0;
                for p in parts {
                    proptest::prop_assert_eq!(p.start, at);
                    proptest::prop_assert!(p.end >= p.start);
                    if chunks >= n {
                        proptest::prop_assert!(!p.is_empty(), "every rank keeps a chunk");
                    }
                    at = p.end;
                }
                proptest::prop_assert_eq!(at, chunks);
                if (0..n).all(|r| parts[r] == crate::plan::split(chunks, r, n)) {
                    continue;
                }
                // Within a chunk of the share: in proportion to the predictions (a missing one as
                // their mean); in the second split with every rank predicting, of the base count
                // plus a share of what the base counts leave, by the weights.
                let v: Vec<f64> = speeds.iter().flatten().map(|&x| x as f64).collect();
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let s: Vec<f64> = speeds.iter().map(|x| x.map_or(mean, |x| x as f64)).collect();
                let total = s.iter().sum::<f64>();
                let level = (round == 1).then_some((world, chunks - floor * n));
                let values: Vec<_> = speeds.iter().map(|&p| published(p, level, n)).collect();
                let (bases, weights) = values.iter().fold((0, 0), |(b, w), v| (b + v[1], w + v[2]));
                for (p, (sk, v)) in parts.iter().zip(s.iter().zip(&values)) {
                    let share = if world.count == n as u64 && bases as f64 <= spare && weights > 0 {
                        floor as f64 + v[1] as f64 + (spare - bases as f64) * v[2] as f64 / weights as f64
                    } else {
                        floor as f64 + spare * sk / total
                    };
                    let off = (p.len() as f64 - share).abs();
                    proptest::prop_assert!(off <= 1.0 + 1e-6, "{} vs {share}", p.len());
                }
            }
        }
    }
}
