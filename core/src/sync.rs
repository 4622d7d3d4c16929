//! Synchronization schemes over one-sided clocks: no coordinator, every rank reads the others'
//! words itself.
//!
//! - `clocks`: one `u64` per rank, the number of iterations whose update the rank has pushed and
//!   flushed. BSP waits for every clock to reach `t + 1` before reading for `t + 1`; SSP(s) waits
//!   until the slowest is at least `t + 1 - s`; ASP never waits.
//! - `progress`: one `u64` per rank, `tag << 48 | total << 24 | done` for the rank's current
//!   iteration (tag = iteration mod 2^16): how many of its chunks exist and how many are computed,
//!   by it or by whoever took them over. BSP pushes only once every rank's chunks of `t` are done:
//!   a rank taking over chunks reads the parameters of `t` after others finished computing, and
//!   nobody may have changed them yet.
//!
//! All reads of these words race with atomic updates, so they are atomics too (`fetch_add(0)`).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use peregrine_transport::{Result, ShardMap, Transport, Window};

/// How ranks wait for each other between iterations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Bulk synchronous: every update of iteration `t` is applied before anyone reads for `t + 1`.
    Bsp,
    /// Stale synchronous with staleness bound `s`: a rank at clock `c` waits until every clock is
    /// at least `c - s`.
    Ssp(u64),
    /// Asynchronous: never wait.
    Asp,
    /// DynSGD: SSP(s) (ASP for `u64::MAX`) with every update scaled by `1 / (1 + staleness)`,
    /// staleness being the number of model versions between this rank's pull and its push, a
    /// version being `N` updates (one per rank, what one BSP step applies): with no straggler an
    /// update is at most a round old and applies in full; a straggler's updates, computed while
    /// the others pushed several rounds, are damped.
    DynSgd(u64),
    /// Backup workers (Sync-opt): each iteration applies the first `N - b` updates, drops the
    /// rest, and late ranks move on to the current iteration.
    Backup(usize),
    /// Backup workers with `b` chosen every iteration from the ranks' compute times (DBW).
    BackupDynamic,
    /// LB-BSP: BSP with each rank's share of the batch set every iteration in proportion to its
    /// predicted speed (see [`crate::lbbsp`]).
    LbBsp(crate::lbbsp::Predictor),
    /// Falcon's EPSP in enforced mode: BSP (every chunk of an iteration done before the next),
    /// with straggler projection (each rank's finish time from its chunk completion rate), task
    /// transfer sized to equalize projected finish times, and elastic parallelism (a rank whose
    /// per-thread rate collapses, e.g. under contention, runs fewer threads until it recovers).
    Falcon,
    /// Falcon's EPSP in slack mode: the same projection, transfer and elastic parallelism, with
    /// SSP(s) synchronization instead of the enforced compute-done point (a pioneer runs up to
    /// `s` iterations ahead, and takes over chunks of older iterations of the ranks behind it).
    FalconSlack(u64),
    /// FlexRR: SSP(s) with rapid reassignment. Ranks form helper groups (each rank helps the
    /// next up to 4 ranks before it); after each of its own chunks a rank checks its group, and a
    /// member more than a quarter of an iteration behind it has half of its remaining chunks taken
    /// over at once, before the helper finishes its own; a rank out of work helps its group too.
    FlexRr(u64),
    /// Speculative execution (task cloning) over BSP: once a rank has done its chunks and waited
    /// as long as one of its chunks takes, its idle threads also compute chunks still running on
    /// ranks slower than 0.6 of its chunk rate; whichever copy finishes first claims the chunk in
    /// a window bitmap and only its result is applied (the other copy is dropped, an injected
    /// delay of the late copy cut short). Ranks that are not slow claim their chunks before
    /// computing them, so they pay nothing for copies. With `+steal` queued chunks are taken
    /// over too; without it only running chunks are copied, as in MapReduce.
    Speculative,
}

impl Scheme {
    /// The staleness bound a rank at iteration `it` waits for before `it + 1`: the slowest clock
    /// must reach the returned value (`None`: no wait).
    pub fn needs(self, it: u64) -> Option<u64> {
        match self {
            Self::Bsp | Self::Falcon | Self::LbBsp(_) | Self::Speculative => Some(it + 1),
            Self::Ssp(s) | Self::DynSgd(s) | Self::FalconSlack(s) | Self::FlexRr(s) => {
                (it + 1).checked_sub(s)
            }
            Self::Asp | Self::Backup(_) | Self::BackupDynamic => None,
        }
    }

    /// Whether this is Falcon's EPSP, in either mode.
    pub fn is_falcon(self) -> bool {
        matches!(self, Self::Falcon | Self::FalconSlack(_))
    }

    /// Whether this is a backup-worker scheme.
    pub fn is_backup(self) -> bool {
        matches!(self, Self::Backup(_) | Self::BackupDynamic)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Bsp => f.write_str("bsp"),
            Self::Ssp(s) => write!(f, "ssp:{s}"),
            Self::Asp => f.write_str("asp"),
            Self::DynSgd(u64::MAX) => f.write_str("dynsgd"),
            Self::DynSgd(s) => write!(f, "dynsgd:{s}"),
            Self::Backup(b) => write!(f, "backup:{b}"),
            Self::BackupDynamic => f.write_str("backup-dynamic"),
            Self::Falcon => f.write_str("falcon"),
            Self::FalconSlack(s) => write!(f, "falcon:slack:{s}"),
            Self::FlexRr(s) => write!(f, "flexrr:{s}"),
            Self::Speculative => f.write_str("speculative"),
            Self::LbBsp(crate::lbbsp::Predictor::Arx) => f.write_str("lb-bsp"),
            Self::LbBsp(p) => write!(f, "lb-bsp:{p}"),
        }
    }
}

impl FromStr for Scheme {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "bsp" => Ok(Self::Bsp),
            "asp" => Ok(Self::Asp),
            "ssp" => Ok(Self::Ssp(3)),
            "dynsgd" => Ok(Self::DynSgd(u64::MAX)),
            "backup-dynamic" | "dbw" => Ok(Self::BackupDynamic),
            "falcon" | "epsp" | "falcon:enforced" => Ok(Self::Falcon),
            "falcon:slack" => Ok(Self::FalconSlack(2)),
            "flexrr" => Ok(Self::FlexRr(3)),
            "speculative" | "clone" => Ok(Self::Speculative),
            "lb-bsp" | "lb-bsp:arx" => Ok(Self::LbBsp(crate::lbbsp::Predictor::Arx)),
            "lb-bsp:ma" => Ok(Self::LbBsp(crate::lbbsp::Predictor::MovingAverage)),
            _ => {
                let bound = |n: &str| {
                    n.parse::<u64>().map_err(|_| {
                        format!("scheme `{s}`: the staleness bound must be a whole number, as in ssp:3")
                    })
                };
                if let Some(n) = lower.strip_prefix("ssp:") {
                    bound(n).map(Self::Ssp)
                } else if let Some(n) = lower.strip_prefix("dynsgd:") {
                    bound(n).map(Self::DynSgd)
                } else if let Some(n) = lower.strip_prefix("flexrr:") {
                    bound(n).map(Self::FlexRr)
                } else if let Some(n) = lower.strip_prefix("falcon:slack:") {
                    bound(n).map(Self::FalconSlack)
                } else if let Some(n) = lower.strip_prefix("backup:") {
                    n.parse().map(Self::Backup).map_err(|_| {
                        format!("scheme `{s}`: the number of backup workers must be a whole number, as in backup:1")
                    })
                } else {
                    Err(format!(
                        "unknown scheme `{s}`: expected bsp, asp, ssp[:<staleness>], dynsgd[:<staleness>], \
                         backup:<b>, backup-dynamic, lb-bsp[:arx|:ma], speculative, flexrr[:<staleness>] or \
                         falcon[:enforced|:slack[:<staleness>]]"
                    ))
                }
            }
        }
    }
}

const MASK: u64 = (1 << 24) - 1;

/// The clock and progress words of every rank.
#[derive(Debug)]
pub struct Clocks {
    clocks: Window<u64>,
    progress: Window<u64>,
    rank: usize,
    world: usize,
}

impl Clocks {
    /// Collective: all clocks at 0, every progress word tagged as no iteration that is about to
    /// start (a zero word would read as "iteration 0: all of its 0 chunks done" on a rank that
    /// has not announced iteration 0 yet, letting others push before it pulled).
    pub fn new(t: &Transport) -> Result<Self> {
        let map = ShardMap::from_lens(vec![1; t.world_size()]);
        let c = Self {
            clocks: t.alloc_window("clocks", &map)?,
            progress: t.alloc_window("progress", &map)?,
            rank: t.rank(),
            world: t.world_size(),
        };
        c.progress.compare_and_swap(c.rank, 0, u64::from(u16::MAX) << 48)?;
        t.barrier()?;
        Ok(c)
    }

    /// Records that this rank's update of its current iteration is pushed; returns the new clock.
    pub fn tick(&self) -> Result<u64> {
        Ok(self.clocks.fetch_add(self.rank, 1)? + 1)
    }

    /// The clock of `rank`.
    pub fn clock(&self, rank: usize) -> Result<u64> {
        self.clocks.fetch_add(rank, 0)
    }

    /// The sum of all clocks: updates pushed so far by everyone (the parameters' version).
    pub fn version(&self) -> Result<u64> {
        let mut s = 0;
        for r in 0..self.world {
            s += self.clock(r)?;
        }
        Ok(s)
    }

    /// The slowest clock.
    pub fn min_clock(&self) -> Result<u64> {
        let mut m = u64::MAX;
        for r in 0..self.world {
            m = m.min(self.clock(r)?);
        }
        Ok(m)
    }

    /// Announces this rank's iteration tagged `tag` with `chunks` chunks, none done.
    pub fn start(&self, tag: u16, chunks: u32) -> Result<()> {
        let word = (u64::from(tag) << 48) | (u64::from(chunks) << 24);
        let mut cur = self.progress.fetch_add(self.rank, 0)?;
        loop {
            let prev = self.progress.compare_and_swap(self.rank, cur, word)?;
            if prev == cur {
                return Ok(());
            }
            cur = prev;
        }
    }

    /// Records `n` more of `rank`'s chunks done.
    pub fn done(&self, rank: usize, n: u32) -> Result<()> {
        self.progress.fetch_add(rank, u64::from(n)).map(drop)
    }

    /// `(tag, total, done)` of `rank`'s current iteration.
    pub fn progress(&self, rank: usize) -> Result<(u16, u32, u32)> {
        let w = self.progress.fetch_add(rank, 0)?;
        Ok(((w >> 48) as u16, ((w >> 24) & MASK) as u32, (w & MASK) as u32))
    }

    /// Whether every rank has started the iteration tagged `tag` and all its chunks are done.
    pub fn all_done(&self, tag: u16) -> Result<bool> {
        for r in 0..self.world {
            let (g, total, done) = self.progress(r)?;
            if g != tag || done < total {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Collective: frees the windows.
    pub fn free(self) -> Result<()> {
        self.clocks.free()?;
        self.progress.free()
    }
}

/// Polls `ready` until it says yes: a short spin, then yielding the core (ranks may share cores),
/// then short sleeps. Returns the time spent.
pub fn wait_until<E>(
    mut ready: impl FnMut() -> std::result::Result<bool, E>,
) -> std::result::Result<Duration, E> {
    let t0 = Instant::now();
    let mut polls = 0u32;
    while !ready()? {
        polls += 1;
        if polls < 64 {
            std::hint::spin_loop();
        } else if polls < 4096 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    Ok(t0.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_parse_and_print() {
        for (s, want) in [
            ("bsp", Scheme::Bsp),
            ("ASP", Scheme::Asp),
            ("ssp:5", Scheme::Ssp(5)),
            ("ssp", Scheme::Ssp(3)),
            ("dynsgd", Scheme::DynSgd(u64::MAX)),
            ("dynsgd:2", Scheme::DynSgd(2)),
            ("backup:1", Scheme::Backup(1)),
            ("backup-dynamic", Scheme::BackupDynamic),
            ("falcon", Scheme::Falcon),
            ("falcon:enforced", Scheme::Falcon),
            ("falcon:slack", Scheme::FalconSlack(2)),
            ("falcon:slack:4", Scheme::FalconSlack(4)),
            ("flexrr", Scheme::FlexRr(3)),
            ("flexrr:1", Scheme::FlexRr(1)),
            ("speculative", Scheme::Speculative),
            ("lb-bsp", Scheme::LbBsp(crate::lbbsp::Predictor::Arx)),
            ("lb-bsp:ma", Scheme::LbBsp(crate::lbbsp::Predictor::MovingAverage)),
        ] {
            let got: Scheme = s.parse().expect("scheme");
            assert_eq!(got, want);
            assert_eq!(got.to_string().parse::<Scheme>().expect("round trip"), want);
        }
        assert!("ssp:x".parse::<Scheme>().expect_err("bad bound").contains("whole number"));
        assert!("bulk".parse::<Scheme>().expect_err("unknown").contains("unknown scheme"));
    }

    #[test]
    fn progress_counts_chunks_done_by_anyone() {
        peregrine_transport::run_local(3, |t| -> Result<()> {
            let c = Clocks::new(&t)?;
            let mine = 3 + t.rank() as u32;
            c.start(9, mine)?;
            t.barrier()?;
            assert!(!c.all_done(9)?);
            // Every rank marks one chunk of every rank done, then each its own remaining ones.
            for r in 0..3 {
                c.done(r, 1)?;
            }
            t.barrier()?;
            c.done(t.rank(), mine - 3)?;
            t.barrier()?;
            let (tag, total, done) = c.progress(t.rank())?;
            assert_eq!((tag, total, done), (9, mine, mine));
            assert!(c.all_done(9)?);
            assert!(!c.all_done(10)?);
            assert_eq!(c.tick()?, 1);
            t.barrier()?;
            assert_eq!(c.min_clock()?, 1);
            t.barrier()?;
            c.free()
        })
        .expect("world")
        .into_iter()
        .for_each(|r| r.expect("rank"));
    }
}
