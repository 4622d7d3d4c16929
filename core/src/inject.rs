//! Straggler injection, after the injected-straggler framework of the FlexPS straggler study:
//! seeded, reproducible, off by default.
//!
//! Delays happen inside compute, never by skipping work, so every scheme sees the same
//! stragglers: a rank with delay factor `f` in an iteration sleeps `f` times each chunk's compute
//! time (the computing thread's CPU time: preemptions by the machine are not multiplied) right
//! after the chunk (many small delay points spread over the iteration, including chunks it took
//! over from others). A disruptor instead competes for the rank's cores with CPU-burning
//! threads. Everything random is drawn from `(seed, rank, iteration)` (or `(seed, rank, period)`),
//! so a rerun, or another scheme, meets the same stragglers.
//!
//! | pattern | flag | what |
//! |---|---|---|
//! | ideal | `ideal` | none |
//! | slow worker | `slow-worker:p=0.1,max=2` | each iteration each rank is delayed with probability `p` by a factor uniform in `[0, max]` of its compute time |
//! | disrupted machine | `disrupted:p=0.5,period=1,intensity=200` | every `period` seconds, with probability `p`, a disruptor runs `intensity`% of the rank's worker count in busy threads on the rank's CPUs for `period` seconds |
//! | power law | `power-law:alpha=4` | each rank's per-iteration delay factor `x - 1`, `x` Pareto with density `~ x^-alpha`, `x >= 1` (the study used 4, 7, 11) |
//! | persistent | `persistent:rank=0/2,speed=0.5` or `persistent:rank=0,threads=1` | chosen ranks permanently run at `speed` of their speed, or with fewer threads |
//! | heterogeneous | `heterogeneous:speed=1/0.5/0.75,threads=2/1` | per-rank speeds and thread counts (a mix of node types; lists cycle over the ranks) |
//! | speed trace | `trace:name=periodic,rank=0` | chosen ranks run at the speed of a synthetic trace ([`crate::scheme::traces`]: `noise`, `periodic`, `trend`, `load`, `mix`) iteration by iteration, full speed being the trace's 1000 (faster iterations of the trace run at full speed) |

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::plan::mix;

/// A straggler pattern.
#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    /// No injected straggler.
    Ideal,
    /// Transient: delayed with probability `p` by a factor uniform in `[0, max]`.
    SlowWorker {
        /// Probability per rank and iteration.
        p: f64,
        /// Largest delay factor.
        max: f64,
    },
    /// CPU-burning threads on the rank's cores, now and then.
    Disrupted {
        /// Probability per rank and period.
        p: f64,
        /// Period and length of a disruption.
        period: Duration,
        /// Busy threads in percent of the rank's worker threads (200 = twice as many).
        intensity: f64,
    },
    /// Delay factor `x - 1` per rank and iteration, `x` Pareto(`alpha - 1`) on `[1, inf)`.
    PowerLaw {
        /// Exponent of the density.
        alpha: f64,
    },
    /// Chosen ranks slowed for good.
    Persistent {
        /// The ranks.
        ranks: Vec<usize>,
        /// Their speed (0 < speed <= 1).
        speed: f64,
        /// Their thread count, if fewer cores.
        threads: Option<usize>,
    },
    /// Per-rank speeds and thread counts, cycling over the ranks.
    Heterogeneous {
        /// Speeds (0 < speed <= 1).
        speeds: Vec<f64>,
        /// Thread counts (empty: unchanged).
        threads: Vec<usize>,
    },
    /// Chosen ranks at the speed of a synthetic trace, iteration by iteration.
    Trace {
        /// The trace (one of [`crate::speed_traces::NAMES`]).
        name: &'static str,
        /// The ranks.
        ranks: Vec<usize>,
    },
}

/// Iterations over which a trace's mean speed is taken for [`Pattern::capacity`].
const TRACE_CAPACITY_ITERATIONS: u64 = 1200;

/// An injection: a pattern and its seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Injection {
    /// What is injected.
    pub pattern: Pattern,
    /// Seed of everything random in it.
    pub seed: u64,
}

impl Default for Injection {
    fn default() -> Self {
        Self { pattern: Pattern::Ideal, seed: 1 }
    }
}

/// A uniform number in `[0, 1)` from `(seed, a, b, stream)`.
fn unit(seed: u64, a: u64, b: u64, stream: u64) -> f64 {
    let h = mix(seed ^ mix(a.wrapping_mul(0x9E37_79B9) ^ mix(b ^ mix(stream))));
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl Pattern {
    /// The expected compute capacity of `world` ranks under this pattern, as a fraction of the
    /// same ranks without it: the mean over ranks of each rank's expected speed (`1 / (1 + d)`
    /// for a delay factor `d`; a disrupted rank's share of its cores, `w / (w + b)` for `w`
    /// workers and `b` burning threads; a thread count `T` of `threads` configured, `T /
    /// threads`; unknown `threads`: thread counts ignored). No scheme can reach a target faster
    /// than Ideal divided by this, unless it needs fewer samples: `1 / capacity` is the bound
    /// the experiment prints next to each pattern.
    pub fn capacity(&self, world: usize, threads: Option<usize>) -> f64 {
        let world = world.max(1);
        let cores = |t: usize| threads.map_or(1.0, |c| t.min(c) as f64 / c.max(1) as f64);
        let per_rank = |r: usize| -> f64 {
            match self {
                Self::Ideal => 1.0,
                Self::SlowWorker { p, max } => {
                    // E[1 / (1 + U)], U uniform on [0, max]: ln(1 + max) / max.
                    let slowed = if *max > 0.0 { (1.0 + max).ln() / max } else { 1.0 };
                    1.0 - p + p * slowed
                }
                Self::Disrupted { p, intensity, .. } => {
                    let w = threads.unwrap_or(1).max(1) as f64;
                    let b = ((intensity / 100.0) * w).ceil().max(1.0);
                    1.0 - p + p * w / (w + b)
                }
                // E[1 / x] for the Pareto density (alpha - 1) x^-alpha on [1, inf).
                Self::PowerLaw { alpha } => (alpha - 1.0) / alpha,
                Self::Persistent { ranks, speed, threads: t } => {
                    if ranks.contains(&r) {
                        speed * t.map_or(1.0, cores)
                    } else {
                        1.0
                    }
                }
                Self::Heterogeneous { speeds, threads: t } => {
                    let s = speeds.get(r % speeds.len().max(1)).copied().unwrap_or(1.0);
                    s * if t.is_empty() { 1.0 } else { cores(t[r % t.len()]) }
                }
                Self::Trace { name, ranks } if ranks.contains(&r) => {
                    (0..TRACE_CAPACITY_ITERATIONS)
                        .map(|it| 1.0 / (1.0 + trace_delay(name, 1, it)))
                        .sum::<f64>()
                        / TRACE_CAPACITY_ITERATIONS as f64
                }
                Self::Trace { .. } => 1.0,
            }
        };
        (0..world).map(per_rank).sum::<f64>() / world as f64
    }
}

impl Injection {
    /// Whether anything is injected.
    pub fn is_ideal(&self) -> bool {
        self.pattern == Pattern::Ideal
    }

    /// The delay factor of `rank` in iteration `it`: after each chunk it computes, the rank sleeps
    /// this many times the chunk's compute time.
    pub fn delay(&self, rank: usize, it: u64) -> f64 {
        let r = rank as u64;
        match &self.pattern {
            Pattern::Ideal | Pattern::Disrupted { .. } => 0.0,
            Pattern::SlowWorker { p, max } => {
                if unit(self.seed, r, it, 1) < *p {
                    unit(self.seed, r, it, 2) * max
                } else {
                    0.0
                }
            }
            Pattern::PowerLaw { alpha } => {
                // Inverse CDF of the Pareto density (alpha - 1) x^-alpha on [1, inf); capped so
                // that one draw cannot stall a run for ever.
                let u = 1.0 - unit(self.seed, r, it, 3);
                (u.powf(-1.0 / (alpha - 1.0)) - 1.0).min(100.0)
            }
            Pattern::Persistent { ranks, speed, .. } => {
                if ranks.contains(&rank) {
                    1.0 / speed - 1.0
                } else {
                    0.0
                }
            }
            Pattern::Heterogeneous { speeds, .. } => {
                speeds.get(rank % speeds.len().max(1)).map_or(0.0, |s| 1.0 / s - 1.0)
            }
            Pattern::Trace { name, ranks } if ranks.contains(&rank) => trace_delay(name, self.seed, it),
            Pattern::Trace { .. } => 0.0,
        }
    }

    /// The compute threads of `rank`, given the configured count.
    pub fn threads(&self, rank: usize, configured: usize) -> usize {
        match &self.pattern {
            Pattern::Persistent { ranks, threads: Some(t), .. } if ranks.contains(&rank) => *t,
            Pattern::Heterogeneous { threads, .. } if !threads.is_empty() => threads[rank % threads.len()],
            _ => configured,
        }
    }

    /// How much slower `rank`'s chunks run at `at` seconds after the start under a disruptor (the
    /// simulator's account of [`Injection::disruptor`]): `(w + b) / w` while it burns, `w` being
    /// the rank's `workers` threads sharing their cores with `b` busy threads; 1 otherwise. The
    /// same draw per `(seed, rank, period)` decides when it burns.
    pub fn slowdown(&self, rank: usize, at: f64, workers: usize) -> f64 {
        let Pattern::Disrupted { p, period, intensity } = self.pattern else { return 1.0 };
        let k = (at.max(0.0) / period.as_secs_f64().max(1e-9)) as u64;
        if unit(self.seed, rank as u64, k, 4) < p {
            let w = workers.max(1) as f64;
            (w + ((intensity / 100.0) * w).ceil().max(1.0)) / w
        } else {
            1.0
        }
    }

    /// Starts this rank's disruptor, if the pattern has one: busy threads on `cpus` (empty: let
    /// the OS place them), `workers` being the rank's thread count. Stops when dropped.
    pub fn disruptor(&self, rank: usize, cpus: &[usize], workers: usize) -> Option<Disruptor> {
        let Pattern::Disrupted { p, period, intensity } = self.pattern else { return None };
        let busy = ((intensity / 100.0) * workers as f64).ceil().max(1.0) as usize;
        let stop = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicBool::new(false));
        let (seed, cpus) = (self.seed, cpus.to_vec());
        let (s, a) = (Arc::clone(&stop), Arc::clone(&active));
        let handle = std::thread::Builder::new()
            .name(format!("pgr-disrupt{rank}"))
            .spawn(move || {
                let start = Instant::now();
                let mut k = 0u64;
                while !s.load(Ordering::Relaxed) {
                    let until = start + period.mul_f64((k + 1) as f64);
                    if unit(seed, rank as u64, k, 4) < p {
                        a.store(true, Ordering::Relaxed);
                        burn(busy, &cpus, until, &s);
                        a.store(false, Ordering::Relaxed);
                    }
                    while Instant::now() < until && !s.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(5).min(until - Instant::now()));
                    }
                    k += 1;
                }
            })
            .ok()?;
        Some(Disruptor { stop, active, handle: Some(handle), busy })
    }
}

/// The delay factor of iteration `it` of trace `name`: `1000 / speed - 1`, none where the trace
/// runs faster than 1000.
fn trace_delay(name: &str, seed: u64, it: u64) -> f64 {
    (1000.0 / crate::speed_traces::speed(name, seed, it).0 - 1.0).max(0.0)
}

/// Runs `n` threads spinning until `until` (or `stop`), each pinned to one of `cpus` in turn.
fn burn(n: usize, cpus: &[usize], until: Instant, stop: &AtomicBool) {
    std::thread::scope(|sc| {
        for i in 0..n {
            let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
            sc.spawn(move || {
                if let Some(c) = cpu {
                    crate::pool::pin_current_thread(c);
                }
                let mut x = 0u64;
                while Instant::now() < until && !stop.load(Ordering::Relaxed) {
                    for _ in 0..1000 {
                        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                    }
                }
            });
        }
    });
}

/// A running disruptor.
#[derive(Debug)]
pub struct Disruptor {
    stop: Arc<AtomicBool>,
    active: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    busy: usize,
}

impl Disruptor {
    /// Whether it is burning now.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    /// Busy threads per disruption.
    pub fn busy_threads(&self) -> usize {
        self.busy
    }
}

impl Drop for Disruptor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |v: &[usize]| v.iter().map(ToString::to_string).collect::<Vec<_>>().join("/");
        match self {
            Self::Ideal => f.write_str("ideal"),
            Self::SlowWorker { p, max } => write!(f, "slow-worker:p={p},max={max}"),
            Self::Disrupted { p, period, intensity } => {
                write!(f, "disrupted:p={p},period={},intensity={intensity}", period.as_secs_f64())
            }
            Self::PowerLaw { alpha } => write!(f, "power-law:alpha={alpha}"),
            Self::Persistent { ranks, speed, threads } => {
                write!(f, "persistent:rank={},speed={speed}", list(ranks))?;
                match threads {
                    Some(t) => write!(f, ",threads={t}"),
                    None => Ok(()),
                }
            }
            Self::Heterogeneous { speeds, threads } => {
                let s = speeds.iter().map(ToString::to_string).collect::<Vec<_>>().join("/");
                write!(f, "heterogeneous:speed={s}")?;
                if threads.is_empty() {
                    Ok(())
                } else {
                    write!(f, ",threads={}", list(threads))
                }
            }
            Self::Trace { name, ranks } => write!(f, "trace:name={name},rank={}", list(ranks)),
        }
    }
}

/// A straggler pattern that cannot be parsed: the message names the pattern and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PatternError(String);

impl FromStr for Pattern {
    type Err = PatternError;

    /// `NAME[:key=value,...]`, list values separated by `/` (see the module docs).
    fn from_str(s: &str) -> Result<Self, PatternError> {
        let (name, args) = s.split_once(':').unwrap_or((s, ""));
        let mut kv = Vec::new();
        for part in args.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| PatternError(format!("straggler pattern `{s}`: `{part}` is not key=value")))?;
            kv.push((k.trim(), v.trim()));
        }
        let known: &[&str] = match name {
            "ideal" | "none" => &[],
            "slow-worker" => &["p", "max"],
            "disrupted" => &["p", "period", "intensity"],
            "power-law" => &["alpha"],
            "persistent" => &["rank", "speed", "threads"],
            "heterogeneous" => &["speed", "threads"],
            "trace" => &["name", "rank"],
            _ => {
                return Err(PatternError(format!(
                    "unknown straggler pattern `{name}`: expected ideal, slow-worker, disrupted, power-law, \
                     persistent, heterogeneous or trace"
                )))
            }
        };
        if let Some((k, _)) = kv.iter().find(|(k, _)| !known.contains(k)) {
            return Err(PatternError(format!(
                "straggler pattern `{name}`: unknown key `{k}` (keys: {})",
                known.join(", ")
            )));
        }
        let get = |k: &str| kv.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        let num = |k: &str, default: Option<f64>| -> Result<f64, PatternError> {
            match get(k) {
                Some(v) => v.parse::<f64>().ok().filter(|x| x.is_finite()).ok_or_else(|| {
                    PatternError(format!("straggler pattern `{name}`: {k}={v} is not a number"))
                }),
                None => {
                    default.ok_or_else(|| PatternError(format!("straggler pattern `{name}` needs {k}=...")))
                }
            }
        };
        let list = |k: &str| -> Result<Vec<f64>, PatternError> {
            get(k).map_or(Ok(Vec::new()), |v| {
                v.split('/')
                    .map(|x| {
                        x.trim().parse::<f64>().map_err(|_| {
                            PatternError(format!(
                                "straggler pattern `{name}`: {k}={v}: `{x}` is not a number"
                            ))
                        })
                    })
                    .collect()
            })
        };
        let count = |x: f64, what: &str| -> Result<usize, PatternError> {
            if x >= 0.0 && x.fract() == 0.0 {
                Ok(x as usize)
            } else {
                Err(PatternError(format!(
                    "straggler pattern `{name}`: {what} must be whole numbers, got {x}"
                )))
            }
        };
        let prob = |p: f64| {
            if (0.0..=1.0).contains(&p) {
                Ok(p)
            } else {
                Err(PatternError(format!("straggler pattern `{name}`: p={p} is not a probability")))
            }
        };
        let speed_ok = |v: f64| {
            if v > 0.0 && v <= 1.0 {
                Ok(v)
            } else {
                Err(PatternError(format!("straggler pattern `{name}`: speed {v} must be in (0, 1]")))
            }
        };
        let ranks = || -> Result<Vec<usize>, PatternError> {
            let ranks =
                list("rank")?.into_iter().map(|r| count(r, "ranks")).collect::<Result<Vec<_>, _>>()?;
            if ranks.is_empty() {
                return Err(PatternError(format!("straggler pattern `{name}` needs rank=R[/R...]")));
            }
            Ok(ranks)
        };
        Ok(match name {
            "ideal" | "none" => Self::Ideal,
            "trace" => {
                let names = crate::speed_traces::NAMES;
                let trace = get("name").ok_or_else(|| {
                    PatternError(format!(
                        "straggler pattern `{name}` needs name=... (one of {})",
                        names.join(", ")
                    ))
                })?;
                let Some(&trace) = names.iter().find(|n| **n == trace) else {
                    return Err(PatternError(format!(
                        "straggler pattern `{name}`: unknown trace `{trace}` (traces: {})",
                        names.join(", ")
                    )));
                };
                Self::Trace { name: trace, ranks: ranks()? }
            }
            "slow-worker" => {
                Self::SlowWorker { p: prob(num("p", None)?)?, max: num("max", Some(2.0))?.max(0.0) }
            }
            "disrupted" => {
                let period = num("period", Some(1.0))?;
                let intensity = num("intensity", Some(100.0))?;
                if period <= 0.0 || intensity <= 0.0 {
                    return Err(PatternError(format!(
                        "straggler pattern `{name}`: period and intensity must be positive"
                    )));
                }
                Self::Disrupted {
                    p: prob(num("p", None)?)?,
                    period: Duration::from_secs_f64(period),
                    intensity,
                }
            }
            "power-law" => {
                let alpha = num("alpha", None)?;
                if alpha <= 2.0 {
                    return Err(PatternError(format!(
                        "straggler pattern `{name}`: alpha={alpha} must be above 2 (finite mean delay)"
                    )));
                }
                Self::PowerLaw { alpha }
            }
            "persistent" => {
                let ranks = ranks()?;
                let threads = get("threads")
                    .map(|_| num("threads", None).and_then(|t| count(t, "threads")))
                    .transpose()?;
                if threads == Some(0) {
                    return Err(PatternError(format!(
                        "straggler pattern `{name}`: threads must be at least 1"
                    )));
                }
                let speed = if get("speed").is_none() && threads.is_some() {
                    1.0
                } else {
                    speed_ok(num("speed", None)?)?
                };
                Self::Persistent { ranks, speed, threads }
            }
            _ => {
                let speeds = list("speed")?.into_iter().map(speed_ok).collect::<Result<Vec<_>, _>>()?;
                let threads = list("threads")?
                    .into_iter()
                    .map(|t| count(t, "threads"))
                    .collect::<Result<Vec<_>, _>>()?;
                if speeds.is_empty() || threads.contains(&0) {
                    return Err(PatternError(format!(
                        "straggler pattern `{name}` needs speed=S[/S...] (and threads of at least 1)"
                    )));
                }
                Self::Heterogeneous { speeds, threads }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inj(s: &str) -> Injection {
        Injection { pattern: s.parse().expect("pattern"), seed: 7 }
    }

    #[test]
    fn patterns_parse_print_and_parse_back() {
        for s in [
            "ideal",
            "slow-worker:p=0.1,max=2",
            "disrupted:p=0.5,period=0.5,intensity=200",
            "power-law:alpha=4",
            "persistent:rank=0/2,speed=0.5",
            "persistent:rank=1,speed=1,threads=1",
            "heterogeneous:speed=1/0.5/0.75,threads=2/1",
            "trace:name=periodic,rank=0/3",
        ] {
            let p: Pattern = s.parse().expect(s);
            assert_eq!(p.to_string(), s);
            assert_eq!(p.to_string().parse::<Pattern>().expect("again"), p);
        }
    }

    #[test]
    fn bad_patterns_say_what_is_wrong() {
        for (s, what) in [
            ("tortoise", "unknown straggler pattern"),
            ("slow-worker", "needs p="),
            ("slow-worker:p=2", "not a probability"),
            ("slow-worker:p=0.1,speed=1", "unknown key `speed`"),
            ("power-law:alpha=2", "must be above 2"),
            ("persistent:speed=0.5", "needs rank="),
            ("persistent:rank=0,speed=0", "must be in (0, 1]"),
            ("persistent:rank=0.5,speed=0.5", "whole numbers"),
            ("heterogeneous:speed=1/x", "`x` is not a number"),
            ("trace:rank=0", "needs name=... (one of noise, periodic, trend, load, mix)"),
            ("trace:name=saw,rank=0", "unknown trace `saw`"),
            ("trace:name=trend", "needs rank=R"),
            ("disrupted:p=0.1,period=0", "must be positive"),
            ("slow-worker:p", "is not key=value"),
        ] {
            let e = s.parse::<Pattern>().expect_err(s).to_string();
            assert!(e.contains(what), "{s}: {e}");
        }
    }

    #[test]
    fn delays_are_seeded_and_have_the_right_law() {
        let n = 20_000u64;
        let slow = inj("slow-worker:p=0.25,max=2");
        let d: Vec<f64> = (0..n).map(|it| slow.delay(1, it)).collect();
        assert_eq!(d, (0..n).map(|it| slow.delay(1, it)).collect::<Vec<_>>(), "reproducible");
        let hit = d.iter().filter(|&&x| x > 0.0).count() as f64 / n as f64;
        assert!((hit - 0.25).abs() < 0.02, "P(delayed) = {hit}");
        let mean = d.iter().filter(|&&x| x > 0.0).sum::<f64>() / (hit * n as f64);
        assert!((mean - 1.0).abs() < 0.05, "mean delay when delayed = {mean}");
        assert_ne!(slow.delay(0, 5), slow.delay(1, 5), "ranks draw independently");
        // Power law: E[x] = (alpha - 1) / (alpha - 2) for x >= 1, so E[delay] = 1 / (alpha - 2).
        for alpha in [4.0, 7.0, 11.0] {
            let p = Injection { pattern: Pattern::PowerLaw { alpha }, seed: 3 };
            let mean = (0..n).map(|it| p.delay(0, it)).sum::<f64>() / n as f64;
            let want = 1.0 / (alpha - 2.0);
            assert!((mean - want).abs() < 0.1 * want + 0.01, "alpha {alpha}: mean {mean}, want {want}");
        }
        let per = inj("persistent:rank=0/2,speed=0.5,threads=1");
        assert_eq!((per.delay(0, 9), per.delay(1, 9), per.delay(2, 9)), (1.0, 0.0, 1.0));
        assert_eq!((per.threads(0, 4), per.threads(1, 4)), (1, 4));
        let het = inj("heterogeneous:speed=1/0.5,threads=2/1");
        assert_eq!(
            (het.delay(0, 0), het.delay(1, 0), het.delay(2, 0), het.delay(3, 0)),
            (0.0, 1.0, 0.0, 1.0)
        );
        assert_eq!((het.threads(0, 8), het.threads(1, 8)), (2, 1));
        let trace = inj("trace:name=periodic,rank=0");
        assert!((trace.delay(0, 3) - 1.0).abs() < 0.12, "a disrupted iteration: half speed");
        assert!(trace.delay(0, 10) < 0.06, "a quiet one: full speed");
        assert_eq!(trace.delay(1, 3), 0.0, "rank 1 is not traced");
        assert_eq!(inj("ideal").delay(0, 0), 0.0);
    }

    #[test]
    fn capacity_matches_the_patterns_means() {
        let cap = |p: &str, world, threads| p.parse::<Pattern>().expect("pattern").capacity(world, threads);
        assert_eq!(cap("ideal", 4, None), 1.0);
        assert!((cap("persistent:rank=0,speed=0.5", 2, None) - 0.75).abs() < 1e-12);
        assert!((cap("persistent:rank=0,speed=0.5", 8, None) - 15.0 / 16.0).abs() < 1e-12);
        assert!((cap("persistent:rank=1,speed=1,threads=1", 2, Some(4)) - 0.625).abs() < 1e-12);
        assert!((cap("heterogeneous:speed=1/0.5", 4, None) - 0.75).abs() < 1e-12);
        assert!((cap("power-law:alpha=4", 3, None) - 0.75).abs() < 1e-12);
        assert!((cap("disrupted:p=0.5,intensity=200", 2, Some(1)) - 2.0 / 3.0).abs() < 1e-12);
        // Periodic trace: 6 iterations in 20 at half speed, the rest at full speed (+-5 % noise,
        // the faster half of it clipped): about 0.85 for the traced rank.
        let periodic = cap("trace:name=periodic,rank=0", 2, None);
        assert!((periodic - (1.0 + 0.85) / 2.0).abs() < 0.01, "{periodic}");
        // Slow worker: against the mean of 1 / (1 + d) over many seeded draws.
        let inj = Injection { pattern: "slow-worker:p=0.3".parse().expect("pattern"), seed: 3 };
        let n = 200_000;
        let mean = (0..n).map(|it| 1.0 / (1.0 + inj.delay(0, it))).sum::<f64>() / n as f64;
        assert!((mean - inj.pattern.capacity(1, None)).abs() < 0.005, "{mean}");
        // Power law, capped at 100: the same against draws.
        let inj = Injection { pattern: "power-law:alpha=4".parse().expect("pattern"), seed: 3 };
        let mean = (0..n).map(|it| 1.0 / (1.0 + inj.delay(0, it))).sum::<f64>() / n as f64;
        assert!((mean - 0.75).abs() < 0.005, "{mean}");
    }

    #[test]
    fn a_disruptor_burns_the_cpu_when_drawn_and_stops_when_dropped() {
        // p = 1: always on; the busy threads must use CPU time on this process.
        let d = inj("disrupted:p=1,period=0.2,intensity=100").disruptor(0, &[], 1).expect("disruptor");
        assert_eq!(d.busy_threads(), 1);
        let cpu0 = process_cpu_seconds();
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(300));
        assert!(d.active() || t0.elapsed() > Duration::from_millis(200));
        let burnt = process_cpu_seconds() - cpu0;
        drop(d);
        assert!(burnt > 0.1, "the disruptor burnt only {burnt} s of CPU in 0.3 s");
        // p = 0: never on.
        let d = inj("disrupted:p=0,period=0.05,intensity=100").disruptor(0, &[], 1).expect("disruptor");
        std::thread::sleep(Duration::from_millis(120));
        assert!(!d.active());
    }

    fn process_cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("stat");
        let f: Vec<&str> = stat.rsplit_once(')').expect("comm").1.split_whitespace().collect();
        // utime and stime are fields 14 and 15 (1-based), 12 and 13 after the comm field.
        let ticks: f64 = f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
        ticks / 100.0
    }
}
