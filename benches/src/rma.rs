//! OSU-style one-sided benchmark of a [`Transport`]: latency at 8 B and bandwidth from 8 B to
//! 4 MiB for `get`, `put`, `accumulate` (and `fetch_add` latency), rank 0 acting on rank 1's
//! shard while the other ranks wait.
//!
//! Run it as `mpirun -n 2 peregrine bench rma` (MPI backend, with the raw-MPI reference) or
//! `peregrine bench rma --backend local` (ranks as threads).
//!
//! Method, after the OSU one-sided micro-benchmarks (osu_get_latency, osu_get_bw, ...):
//! - latency: one operation and its completion per iteration (`get`; `put`/`accumulate` in a
//!   `write_scope`, i.e. issued then flushed at the target; `fetch_add`), after warm-up
//!   iterations that are not timed;
//! - bandwidth: a window of `W` operations of the same size (W = 64, fewer above 256 KiB so that a
//!   window moves at most 16 MiB), issued back to back as one batch, then one completion;
//! - each figure is the median of several trials; with the MPI backend each trial of ours is
//!   paired with the same loop in raw MPI on an `MPI_Win_allocate` window in a `lock_all` epoch
//!   with `MPI_Win_flush` (the reference), so that both see the same machine state: the trial's
//!   timed calls are cut into 16 slices and the two sides take turns slice by slice, the side
//!   going first alternating; the ratio reported is the median of the trials' ratios;
//! - a trial lasts about 5-10 ms at every size (OSU runs 10,000 iterations of its small-message
//!   loops): trials of 1 ms or less moved single ratios by 0.2-0.4 on a shared 2-core machine;
//! - both sides move the same origin buffer: with one 16 MiB buffer each, ours came out 1.10-1.17
//!   times raw MPI's time at 256 KiB-1 MiB in every run on an Intel Xeon, the same MPI calls
//!   with the same sizes, and 0.98-1.02 once the two shared one (two runs each way): which
//!   physical pages a side's buffer got, not its path, made that difference.

use std::cell::RefCell;
use std::fmt;
use std::time::Instant;

use peregrine_transport::{Result, ShardMap, Transport, Window};

/// The operations measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `get`
    Get,
    /// `put` + `flush`
    Put,
    /// `accumulate` (sum) + `flush`
    Accumulate,
    /// `fetch_add` (8 B only)
    FetchAdd,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Get => "get",
            Self::Put => "put",
            Self::Accumulate => "accumulate",
            Self::FetchAdd => "fetch_add",
        })
    }
}

/// Benchmark settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Smallest message of the bandwidth sweep, bytes (multiple of 8).
    pub min_size: usize,
    /// Largest message of the bandwidth sweep, bytes (multiple of 8).
    pub max_size: usize,
    /// Timed iterations of the latency loops (the bandwidth loops time a twentieth as many
    /// windows, at most 256 MiB).
    pub latency_iters: usize,
    /// Untimed warm-up iterations before every timed loop.
    pub warmup: usize,
    /// Trials per figure (the median is reported).
    pub trials: usize,
    /// Measure against raw MPI too (MPI backend only).
    pub raw: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self { min_size: 8, max_size: 4 << 20, latency_iters: 100_000, warmup: 1_000, trials: 11, raw: true }
    }
}

/// What a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One operation + completion per iteration.
    Latency,
    /// Windows of operations, one completion per window.
    Bandwidth,
}

/// One line of the report.
#[derive(Clone, Debug)]
pub struct Row {
    /// What is measured.
    pub kind: Kind,
    /// The operation.
    pub op: Op,
    /// Message size in bytes.
    pub size: usize,
    /// Seconds per operation, ours (median of the trials).
    pub ours: f64,
    /// Seconds per operation, raw MPI, when measured.
    pub raw: Option<f64>,
    /// Ours over raw, the median of the trials' ratios (each trial's two loops ran back to
    /// back), when raw MPI was measured.
    pub paired: Option<f64>,
}

impl Row {
    /// Header line matching [`Row`]'s `Display`.
    pub fn header(kind: Kind) -> String {
        match kind {
            Kind::Latency => format!(
                "{:<11} {:>9} {:>12} {:>12} {:>8}",
                "# op", "size(B)", "lat(us)", "raw-lat(us)", "ours/raw"
            ),
            Kind::Bandwidth => format!(
                "{:<11} {:>9} {:>12} {:>12} {:>8}",
                "# op", "size(B)", "bw(GB/s)", "raw-bw(GB/s)", "raw/ours"
            ),
        }
    }

    /// Ours over raw, as a cost ratio (> 1: ours is slower): the median of the trials' ratios,
    /// which the machine's drift from trial to trial does not move as it moves the medians of
    /// either side.
    pub fn ratio(&self) -> Option<f64> {
        self.paired
    }
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ours, raw) = match self.kind {
            Kind::Latency => (self.ours * 1e6, self.raw.map(|r| r * 1e6)),
            Kind::Bandwidth => {
                (self.size as f64 / self.ours / 1e9, self.raw.map(|r| self.size as f64 / r / 1e9))
            }
        };
        let dash = || "-".to_owned();
        write!(
            f,
            "{:<11} {:>9} {:>12.3} {:>12} {:>8}",
            self.op.to_string(),
            self.size,
            ours,
            raw.map_or_else(dash, |r| format!("{r:.3}")),
            self.ratio().map_or_else(dash, |r| format!("{r:.2}")),
        )
    }
}

/// Operations per completion for a message of `size` bytes in the bandwidth loops.
fn window_ops(size: usize) -> usize {
    (16 << 20) / size.max(1)
}

/// Runs the benchmark; collective (every rank calls it). Rank 0 measures and calls `report` for
/// each row as soon as it is known (other ranks never call it).
pub fn run(t: &Transport, cfg: &Config, mut report: impl FnMut(&Row)) -> Result<()> {
    let n = t.world_size();
    let target = usize::from(n > 1);
    let elems = (cfg.max_size / 8).max(1);
    // Rank 1's shard holds the target region. Every shard is as large as the raw reference's
    // window on every rank, so that the target region lies where raw MPI's does in the shared
    // segment, page-aligned (with one-element shards elsewhere it began 64 bytes into a page).
    let map = ShardMap::from_lens((0..n).map(|_| elems));
    let data: Window<f64> = t.alloc_window("rma bench data", &map)?;
    let counter: Window<u64> = t.alloc_window("rma bench counter", &map)?;
    let base = map.range(target).start;
    let mut raw = raw_reference(t, cfg, elems)?;
    let me = t.rank() == 0;
    // A window of operations moves at most 16 MiB (see `window_ops`). Ours and the reference
    // take turns on the same origin buffer (see the module's docs).
    let buf = RefCell::new(if me { vec![1.0f64; (2 << 20).max(elems)] } else { Vec::new() });

    for op in [Op::Get, Op::Put, Op::Accumulate, Op::FetchAdd] {
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for trial in 0..cfg.trials {
            t.barrier()?;
            if me {
                let mine = || match op {
                    Op::Get => data.get(base, &mut buf.borrow_mut()[..1]),
                    Op::Put => data.write_scope(|s| s.put(base, &buf.borrow()[..1])),
                    Op::Accumulate => data.write_scope(|s| s.accumulate(base, &buf.borrow()[..1])),
                    Op::FetchAdd => counter.fetch_add(base, 1).map(drop),
                };
                let buf = &buf;
                // fetch_add has no origin buffer on either side.
                let reference = raw.as_mut().map(|raw| {
                    move || match op {
                        Op::FetchAdd => raw.op(op, target, 1, &mut []),
                        _ => raw.op(op, target, 1, &mut buf.borrow_mut()),
                    }
                });
                let loops = Loops { trial, iters: cfg.latency_iters, warmup: cfg.warmup, per_call: 1 };
                loops.both(mine, reference, &mut ours, &mut theirs)?;
            }
        }
        if me {
            report(&Row {
                kind: Kind::Latency,
                op,
                size: 8,
                paired: paired(&ours, &theirs),
                ours: median(&mut ours),
                raw: median_opt(&mut theirs),
            });
        }
    }

    for op in [Op::Get, Op::Put, Op::Accumulate] {
        let mut size = cfg.min_size.max(8);
        while size <= cfg.max_size {
            let len = size / 8;
            let w = window_ops(size).clamp(1, 64);
            let ranges = vec![base..base + len; w];
            // A twentieth of the latency loops' iterations (5000 windows by default: 5-10 ms on
            // shared memory) or 256 MiB a trial, whichever is less; at least 4 windows.
            let iters = ((256usize << 20) / (size * w)).min(cfg.latency_iters / 20).max(4);
            let mut ours = Vec::new();
            let mut theirs = Vec::new();
            for trial in 0..cfg.trials {
                t.barrier()?;
                if me {
                    let mine = || {
                        let out = &mut buf.borrow_mut()[..len * w];
                        match op {
                            Op::Get => data.get_batch(&ranges, out),
                            Op::Put => data.write_scope(|s| s.put_batch(&ranges, out)),
                            _ => data.write_scope(|s| s.accumulate_batch(&ranges, out)),
                        }
                    };
                    let buf = &buf;
                    let reference =
                        raw.as_mut().map(|raw| move || raw.window(op, target, len, w, &mut buf.borrow_mut()));
                    let loops = Loops { trial, iters, warmup: cfg.warmup.min(iters), per_call: w };
                    loops.both(mine, reference, &mut ours, &mut theirs)?;
                }
            }
            if me {
                report(&Row {
                    kind: Kind::Bandwidth,
                    op,
                    size,
                    paired: paired(&ours, &theirs),
                    ours: median(&mut ours),
                    raw: median_opt(&mut theirs),
                });
            }
            size *= 2;
        }
    }
    t.barrier()?;
    if let Some(raw) = raw {
        raw.free()?;
    }
    counter.free()?;
    data.free()
}

/// Slices a trial is cut into, ours and the reference taking turns (see [`Loops::both`]).
const SLICES: usize = 16;

/// One trial's loops: `iters` timed calls a side after `warmup` untimed ones, each call
/// `per_call` operations.
struct Loops {
    trial: usize,
    iters: usize,
    warmup: usize,
    per_call: usize,
}

impl Loops {
    /// One trial of ours (`mine`) and of the raw-MPI `reference` (when there is one): seconds per
    /// operation of each pushed to `ours` and `theirs`. The timed calls are cut into
    /// [`SLICES`] slices and the two sides take turns slice by slice, the side that goes first
    /// alternating (ABBA...) and starting with ours in even trials and the reference in odd ones:
    /// both sample the same stretch of the machine's time, and neither always finds the caches
    /// and the target as the other left them. (One side's whole loop, then the other's, left a
    /// shared machine's swings of a few milliseconds between them: at 512 KiB-4 MiB, where both
    /// sides make the same MPI calls, single figures came out at 1.19-1.23.)
    fn both(
        &self,
        mut mine: impl FnMut() -> Result<()>,
        reference: Option<impl FnMut() -> Result<()>>,
        ours: &mut Vec<f64>,
        theirs: &mut Vec<f64>,
    ) -> Result<()> {
        let ops = (self.iters.max(1) * self.per_call.max(1)) as f64;
        calls(self.warmup, &mut mine)?;
        let Some(mut reference) = reference else {
            ours.push(calls(self.iters, &mut mine)? / ops);
            return Ok(());
        };
        calls(self.warmup, &mut reference)?;
        let (mut a, mut b) = (0.0, 0.0);
        let slices = SLICES.min(self.iters).max(1);
        for s in 0..slices {
            let n = self.iters * (s + 1) / slices - self.iters * s / slices;
            if (self.trial + s).is_multiple_of(2) {
                a += calls(n, &mut mine)?;
                b += calls(n, &mut reference)?;
            } else {
                b += calls(n, &mut reference)?;
                a += calls(n, &mut mine)?;
            }
        }
        ours.push(a / ops);
        theirs.push(b / ops);
        Ok(())
    }
}

/// Seconds taken by `n` calls of `f`.
fn calls(n: usize, f: &mut impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(start.elapsed().as_secs_f64())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn median_opt(v: &mut [f64]) -> Option<f64> {
    (!v.is_empty()).then(|| median(v))
}

/// The median of the trials' ratios `ours[i] / theirs[i]`, when there is a reference.
fn paired(ours: &[f64], theirs: &[f64]) -> Option<f64> {
    let mut ratios: Vec<f64> = ours.iter().zip(theirs).map(|(o, t)| o / t).collect();
    median_opt(&mut ratios)
}

#[cfg(feature = "mpi")]
fn raw_reference(t: &Transport, cfg: &Config, elems: usize) -> Result<Option<raw::RawWindow>> {
    if cfg.raw && t.backend() == peregrine_transport::Backend::Mpi {
        raw::RawWindow::new(t.rank(), elems).map(Some)
    } else {
        Ok(None)
    }
}

#[cfg(not(feature = "mpi"))]
fn raw_reference(_: &Transport, _: &Config, _: usize) -> Result<Option<raw::RawWindow>> {
    Ok(None)
}

/// Without MPI there is no reference: the window type is uninhabited, so `raw` is always `None`.
#[cfg(not(feature = "mpi"))]
mod raw {
    use super::{Op, Result};
    pub enum RawWindow {}
    impl RawWindow {
        pub fn op(&mut self, _: Op, _: usize, _: usize, _: &mut [f64]) -> Result<()> {
            match *self {}
        }
        pub fn window(&mut self, _: Op, _: usize, _: usize, _: usize, _: &mut [f64]) -> Result<()> {
            match *self {}
        }
        pub fn free(self) -> Result<()> {
            match self {}
        }
    }
}

/// The reference: the same loops written directly against MPI.
#[cfg(feature = "mpi")]
mod raw {
    use std::ffi::c_int;

    use mpi::ffi;
    use peregrine_transport::{ErrorKind, Result};

    use super::Op;

    /// A raw `MPI_Win_allocate` window in a `lock_all` epoch, on `MPI_COMM_WORLD`.
    /// Invariant: `win` is live until `free`.
    pub struct RawWindow {
        rank: usize,
        win: ffi::MPI_Win,
    }

    fn check(rank: usize, call: &'static str, rc: c_int) -> Result<()> {
        if rc == ffi::MPI_SUCCESS as c_int {
            Ok(())
        } else {
            Err(ErrorKind::Mpi { rank, call, code: rc, message: "raw MPI reference".to_owned() }.into())
        }
    }

    impl RawWindow {
        /// Collective over MPI_COMM_WORLD.
        pub fn new(rank: usize, elems: usize) -> Result<Self> {
            let mut base: *mut f64 = std::ptr::null_mut();
            let mut win = std::mem::MaybeUninit::<ffi::MPI_Win>::uninit();
            // SAFETY: MPI is initialised (the transport did it); out-pointers are valid; every rank
            // calls this collectively.
            let rc = unsafe {
                ffi::MPI_Win_allocate(
                    (elems * 8) as ffi::MPI_Aint,
                    8,
                    ffi::RSMPI_INFO_NULL,
                    ffi::RSMPI_COMM_WORLD,
                    (&mut base as *mut *mut f64).cast(),
                    win.as_mut_ptr(),
                )
            };
            check(rank, "MPI_Win_allocate", rc)?;
            // SAFETY: written by the successful call above.
            let win = unsafe { win.assume_init() };
            // SAFETY: live window; assert 0 = no assertions.
            check(rank, "MPI_Win_lock_all", unsafe { ffi::MPI_Win_lock_all(0, win) })?;
            Ok(Self { rank, win })
        }

        /// One operation of one element and its completion, from `origin`.
        pub fn op(&mut self, op: Op, target: usize, len: usize, origin: &mut [f64]) -> Result<()> {
            self.window(op, target, len, 1, origin)
        }

        /// `w` operations of `len` elements at displacement 0 of `target`, the `i`-th from (or,
        /// for a get, into) `origin[i len..]`, then `MPI_Win_flush`.
        pub fn window(
            &mut self,
            op: Op,
            target: usize,
            len: usize,
            w: usize,
            origin: &mut [f64],
        ) -> Result<()> {
            let dbl = f64::mpi_dt();
            let n = len as c_int;
            let t = target as c_int;
            assert!(
                op == Op::FetchAdd || w * len <= origin.len(),
                "a window of operations fits the origin buffer"
            );
            let buf = origin.as_mut_ptr();
            for i in 0..w {
                // SAFETY: live window in a lock_all epoch; `i * len + len <= origin.len()` for
                // the operations that use `origin` (asserted; `fetch_add` moves its own two words,
                // and its offset `i * len` is 0 with `w == 1`); the target region `0..len` lies
                // inside the target's allocation; `origin` is borrowed mutably until the flush
                // below completes every operation.
                let rc = unsafe {
                    let o = buf.add(i * len).cast();
                    match op {
                        Op::Get => ffi::MPI_Get(o, n, dbl, t, 0, n, dbl, self.win),
                        Op::Put => ffi::MPI_Put(o, n, dbl, t, 0, n, dbl, self.win),
                        Op::Accumulate => {
                            ffi::MPI_Accumulate(o, n, dbl, t, 0, n, dbl, ffi::RSMPI_SUM, self.win)
                        }
                        Op::FetchAdd => {
                            let one = 1u64;
                            let mut old = 0u64;
                            ffi::MPI_Fetch_and_op(
                                (&one as *const u64).cast(),
                                (&mut old as *mut u64).cast(),
                                ffi::RSMPI_UINT64_T,
                                t,
                                0,
                                ffi::RSMPI_SUM,
                                self.win,
                            )
                        }
                    }
                };
                check(self.rank, "MPI RMA", rc)?;
            }
            // SAFETY: live window in a lock_all epoch.
            check(self.rank, "MPI_Win_flush", unsafe { ffi::MPI_Win_flush(t, self.win) })
        }

        /// Collective.
        pub fn free(mut self) -> Result<()> {
            // SAFETY: live window, epoch open.
            check(self.rank, "MPI_Win_unlock_all", unsafe { ffi::MPI_Win_unlock_all(self.win) })?;
            // SAFETY: live window, epoch closed, collective.
            let rc = unsafe { ffi::MPI_Win_free(&mut self.win) };
            check(self.rank, "MPI_Win_free", rc)
        }
    }

    trait MpiDt {
        fn mpi_dt() -> ffi::MPI_Datatype;
    }
    impl MpiDt for f64 {
        fn mpi_dt() -> ffi::MPI_Datatype {
            // SAFETY: constant handle from rsmpi's shim.
            unsafe { ffi::RSMPI_DOUBLE }
        }
    }
}
