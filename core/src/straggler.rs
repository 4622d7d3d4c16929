//! The straggler report: which ranks were slow, by how much, what it cost the others, and what
//! kind of slowness the run shows.
//!
//! Each rank measures its compute rate (rows per second of its threads' time in chunks, per
//! thread, injected delays included: without dispatch, lining up or waiting) per iteration. The
//! report scores every rank as NVIDIA's resiliency extension does
//! (`nvidia_resiliency_ext.straggler`, which compares median section times): a **relative**
//! performance score, the rank's typical (median) iteration rate over the best rank's, and an
//! **individual** one, its median iteration rate over its own best (90th percentile); a rank
//! whose relative score is under [`THRESHOLD`] (the extension's default, 0.7) is flagged. Its
//! straggler score is `1 - relative`: 0 for the fastest rank, 0.5 for one at half its speed.
//!
//! The pattern: **persistent** when flagged ranks are steadily slow (slow all the time, not now
//! and then: their iterations no more uneven than the healthy ranks', their individual scores
//! within `NOISE` of the healthy ranks' typical one, or of [`THRESHOLD`]); **periodic** when
//! slow episodes (runs of iterations under [`THRESHOLD`] of the rank's own best) start at whole
//! multiples of one period, at least three times; **transient** when the ranks' slow iterations
//! average `SLOW_SHARE` (10 %) or more without either; **none** otherwise. The pattern is a
//! heuristic over one run's rates: a short run on a busy machine can show its noise as transient.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::record::RankTotals;

/// A rank under this share of the best rank's rate is a straggler; an iteration under this
/// share of the rank's own best is slow.
pub const THRESHOLD: f64 = 0.7;

/// Below this share of slow iterations a rank counts as steady (an even run on a shared 2-core
/// machine shows 1-5 %; one rank in ten delayed at random per iteration, 12 %).
const SLOW_SHARE: f64 = 0.1;

/// How much more uneven than the healthy ranks a flagged rank's iterations may be and still
/// count as steady: its individual score this much under theirs (or under [`THRESHOLD`]).
const NOISE: f64 = 0.1;

/// A rank's iteration rates summed up (computed on the rank from its samples).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RateStats {
    /// The 90th percentile of its iteration rates.
    pub best: f64,
    /// The median.
    pub median: f64,
    /// The share of its iterations under [`THRESHOLD`] of `best`.
    pub slow_share: f64,
    /// Runs of slow iterations.
    pub episodes: u64,
    /// Whether the episodes start at whole multiples of one period (at least three).
    pub periodic: bool,
}

/// Sums up `(start time, rate)` samples, one per iteration with rows computed.
pub fn rate_stats(samples: &[(f32, f32)]) -> RateStats {
    if samples.is_empty() {
        return RateStats::default();
    }
    let mut rates: Vec<f64> = samples.iter().map(|s| f64::from(s.1)).collect();
    rates.sort_by(f64::total_cmp);
    let at = |q: f64| rates[((rates.len() - 1) as f64 * q).round() as usize];
    let (best, median) = (at(0.9), at(0.5));
    let slow = |r: f32| f64::from(r) < THRESHOLD * best;
    let slow_count = samples.iter().filter(|s| slow(s.1)).count();
    let mut starts = Vec::new();
    let mut was_slow = false;
    for &(t, r) in samples {
        let s = slow(r);
        if s && !was_slow {
            starts.push(f64::from(t));
        }
        was_slow = s;
    }
    RateStats {
        best,
        median,
        slow_share: slow_count as f64 / samples.len() as f64,
        episodes: starts.len() as u64,
        periodic: periodic(&starts),
    }
}

/// Whether the gaps between `starts` are whole multiples of the smallest (within a fifth of it),
/// with at least three episodes.
fn periodic(starts: &[f64]) -> bool {
    let gaps: Vec<f64> = starts.windows(2).map(|w| w[1] - w[0]).collect();
    if gaps.len() < 2 {
        return false;
    }
    let base = gaps.iter().copied().fold(f64::INFINITY, f64::min);
    base > 0.0 && gaps.iter().all(|g| (g / base - (g / base).round()).abs() <= 0.2)
}

/// One rank in the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankScore {
    /// The rank.
    pub rank: usize,
    /// Rows per second of its threads' time in chunks, per thread, in its median iteration.
    pub rate: f64,
    /// `rate` over the best rank's.
    pub relative: f64,
    /// Its median iteration rate over its own best.
    pub individual: f64,
    /// `1 - relative`.
    pub score: f64,
    /// `relative` under [`THRESHOLD`].
    pub flagged: bool,
    /// Seconds it waited for others.
    pub waited: f64,
    /// Seconds others waited for it (each wait counted for the rank last waited for).
    pub cost_to_others: f64,
    /// Its own chunks others computed.
    pub gave: u64,
    /// Other ranks' chunks it computed.
    pub took: u64,
    /// Share of its iterations under [`THRESHOLD`] of its own best rate.
    pub slow_share: f64,
}

/// The report of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StragglerReport {
    /// Every rank, in rank order.
    pub ranks: Vec<RankScore>,
    /// Flagged ranks, the highest score first.
    pub flagged: Vec<usize>,
    /// `persistent`, `periodic`, `transient` or `none`.
    pub pattern: String,
    /// [`THRESHOLD`].
    pub threshold: f64,
}

/// The report from every rank's totals.
pub fn report(per_rank: &[RankTotals]) -> StragglerReport {
    // The typical iteration's rate, as the extension compares ranks by their median section
    // times: a burst of the machine's noise over a few iterations (a 0.3 s run of two even
    // ranks once put one at 0.69 of the other by their totals) does not move it; a rank slow
    // all along is slow in its median iteration.
    let rate = |t: &RankTotals| t.median_rate;
    let best = per_rank.iter().map(rate).fold(0.0, f64::max);
    let ranks: Vec<RankScore> = per_rank
        .iter()
        .enumerate()
        .map(|(rank, t)| {
            let relative = if best > 0.0 { rate(t) / best } else { 1.0 };
            RankScore {
                rank,
                rate: rate(t),
                relative,
                individual: if t.best_rate > 0.0 { t.median_rate / t.best_rate } else { 1.0 },
                score: (1.0 - relative).clamp(0.0, 1.0),
                flagged: relative < THRESHOLD,
                waited: t.wait,
                cost_to_others: t.waited_for_me,
                gave: t.assigned.saturating_sub(t.own),
                took: t.taken,
                slow_share: t.slow_share,
            }
        })
        .collect();
    let mut flagged: Vec<&RankScore> = ranks.iter().filter(|r| r.flagged).collect();
    flagged.sort_by(|a, b| b.score.total_cmp(&a.score));
    // Steady: no more uneven than the machine makes every rank (the healthy ranks' typical
    // individual score). A flagged rank is slow in its median iteration; one slow now and then
    // is fast in its best ones, so its median is far under its best. On a busy 2-core machine a
    // healthy rank's median iteration has been at 0.75 of its best, and a rank injected at 0.35
    // of the speed at 0.70; a rank slow (at 0.35) in two thirds of its iterations sits at 0.35.
    let healthy = {
        let mut h: Vec<f64> = ranks.iter().filter(|r| !r.flagged).map(|r| r.individual).collect();
        h.sort_by(f64::total_cmp);
        h.get(h.len() / 2).copied().unwrap_or(1.0)
    };
    let steady = flagged.iter().all(|r| r.individual >= THRESHOLD.min(healthy) - NOISE);
    let episodic = |t: &RankTotals| t.slow_share >= SLOW_SHARE && t.episodes > 0;
    // Transient slowness shows on the ranks at large, not as one rank's noise.
    let mean_slow = per_rank.iter().map(|t| t.slow_share).sum::<f64>() / per_rank.len().max(1) as f64;
    let pattern = if !flagged.is_empty() && steady {
        "persistent"
    } else if per_rank.iter().any(|t| episodic(t) && t.periodic) {
        "periodic"
    } else if !flagged.is_empty() || mean_slow >= SLOW_SHARE {
        "transient"
    } else {
        "none"
    };
    StragglerReport {
        flagged: flagged.iter().map(|r| r.rank).collect(),
        ranks,
        pattern: pattern.into(),
        threshold: THRESHOLD,
    }
}

impl fmt::Display for StragglerReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.flagged.is_empty() {
            "none".to_owned()
        } else {
            self.flagged.iter().map(|r| format!("rank {r}")).collect::<Vec<_>>().join(", ")
        };
        writeln!(
            f,
            "stragglers: {who} (pattern: {}; flagged under {} of the best rank's rate)",
            self.pattern, self.threshold
        )?;
        writeln!(
            f,
            "{:>5} {:>12} {:>9} {:>10} {:>6} {:>9} {:>10} {:>6} {:>6} {:>6}",
            "rank",
            "rows/s",
            "relative",
            "individual",
            "score",
            "waited_s",
            "cost_s",
            "gave",
            "took",
            "slow%"
        )?;
        for r in &self.ranks {
            writeln!(
                f,
                "{:>5} {:>12.0} {:>9.2} {:>10.2} {:>6.2} {:>9.3} {:>10.3} {:>6} {:>6} {:>6.1}{}",
                r.rank,
                r.rate,
                r.relative,
                r.individual,
                r.score,
                r.waited,
                r.cost_to_others,
                r.gave,
                r.took,
                100.0 * r.slow_share,
                if r.flagged { "  <- straggler" } else { "" }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rows: u64, compute: f64, stats: RateStats) -> RankTotals {
        RankTotals {
            rows,
            busy: compute,
            best_rate: stats.best,
            median_rate: stats.median,
            slow_share: stats.slow_share,
            episodes: stats.episodes,
            periodic: stats.periodic,
            ..RankTotals::default()
        }
    }

    fn steady(rate: f32, n: usize) -> RateStats {
        rate_stats(&(0..n).map(|i| (i as f32, rate * (1.0 + 0.01 * (i % 3) as f32))).collect::<Vec<_>>())
    }

    #[test]
    fn a_rank_at_half_speed_is_flagged_as_persistent_and_nobody_in_an_even_run() {
        let r = report(&[
            rank(500, 1.0, steady(500.0, 50)),
            rank(1000, 1.0, steady(1000.0, 50)),
            rank(980, 1.0, steady(980.0, 50)),
        ]);
        assert_eq!(r.flagged, [0]);
        assert_eq!(r.pattern, "persistent");
        assert!((r.ranks[0].score - 0.5).abs() < 1e-9 && r.ranks[1].score == 0.0);
        let even = report(&[rank(1000, 1.0, steady(1000.0, 50)), rank(950, 1.0, steady(950.0, 50))]);
        assert!(even.flagged.is_empty());
        assert_eq!(even.pattern, "none");
    }

    #[test]
    fn a_slow_rank_on_a_noisy_machine_is_persistent_and_one_slow_now_and_then_is_not() {
        // Every iteration's rate jitters by the machine, spread evenly from `low` to 1 of the
        // rank's rate: a healthy rank's median at 0.75 of its best, the slowed rank's at 0.69
        // with half its iterations under 0.7 of its best.
        let noisy = |rate: f32, low: f32| {
            let at = |i: usize| rate * (low + (1.0 - low) * ((i * 37) % 100) as f32 / 99.0);
            rate_stats(&(0..100).map(|i| (i as f32, at(i))).collect::<Vec<_>>())
        };
        let (slow, healthy) = (noisy(350.0, 0.28), noisy(1000.0, 0.41));
        assert!((healthy.median / healthy.best - 0.75).abs() < 0.01, "{healthy:?}");
        assert!(slow.median / slow.best < 0.7 && slow.slow_share >= 0.5, "{slow:?}");
        let r = report(&[rank(350, 1.0, slow), rank(1000, 1.0, healthy)]);
        assert_eq!((r.flagged.as_slice(), r.pattern.as_str()), (&[0][..], "persistent"));
        // Slow (at 0.35) in a third of its iterations, at full speed otherwise, beside a steady
        // rank: its typical iteration is fast (not flagged), and the run's slowness transient.
        let at = |i: usize| if (i * 37) % 100 < 33 { 350.0 } else { 1000.0 };
        let episodes = rate_stats(&(0..100).map(|i| (i as f32, at(i))).collect::<Vec<_>>());
        let r = report(&[rank(600, 1.0, episodes), rank(1000, 1.0, steady(1000.0, 100))]);
        assert_eq!((r.flagged.as_slice(), r.pattern.as_str()), (&[][..], "transient"));
        // Slow in two thirds of them: flagged, and not steady.
        let at = |i: usize| if (i * 37) % 100 < 67 { 350.0 } else { 1000.0 };
        let episodes = rate_stats(&(0..100).map(|i| (i as f32, at(i))).collect::<Vec<_>>());
        let r = report(&[rank(450, 1.0, episodes), rank(1000, 1.0, steady(1000.0, 100))]);
        assert_eq!((r.flagged.as_slice(), r.pattern.as_str()), (&[0][..], "transient"));
    }

    #[test]
    fn slow_episodes_are_periodic_when_they_recur_at_multiples_of_one_period() {
        // Slow for 2 of every 10 iterations, then with one period skipped.
        let slow_at = |i: usize| i % 10 < 2 && i / 10 != 3;
        let samples: Vec<(f32, f32)> =
            (0..60).map(|i| (i as f32 * 0.1, if slow_at(i) { 300.0 } else { 1000.0 })).collect();
        let s = rate_stats(&samples);
        assert!(s.periodic, "{s:?}");
        assert_eq!(s.episodes, 5);
        let r = report(&[rank(1000, 1.0, s), rank(1000, 1.0, steady(1000.0, 60))]);
        assert_eq!(r.pattern, "periodic");
        // Scattered: transient.
        let scattered: Vec<(f32, f32)> = (0..60)
            .map(|i| (i as f32 * 0.1, if [3, 4, 11, 29, 30, 47, 48].contains(&i) { 300.0 } else { 1000.0 }))
            .collect();
        let s = rate_stats(&scattered);
        assert!(!s.periodic, "{s:?}");
        // On one rank of two: its noise; on both: transient.
        assert_eq!(report(&[rank(1000, 1.0, s), rank(1000, 1.0, steady(1000.0, 60))]).pattern, "none");
        assert_eq!(report(&[rank(1000, 1.0, s), rank(1000, 1.0, s)]).pattern, "transient");
    }

    #[test]
    fn ranks_are_scored_in_the_order_of_their_speeds() {
        let r = report(&[
            rank(1000, 1.0, steady(1000.0, 9)),
            rank(500, 1.0, steady(500.0, 9)),
            rank(750, 1.0, steady(750.0, 9)),
        ]);
        let mut order: Vec<usize> = (0..3).collect();
        order.sort_by(|&a, &b| r.ranks[b].score.total_cmp(&r.ranks[a].score));
        assert_eq!(order, [1, 2, 0]);
        assert_eq!(r.flagged, [1]);
        let text = r.to_string();
        assert!(text.starts_with("stragglers: rank 1 (pattern: persistent"), "{text}");
    }
}
