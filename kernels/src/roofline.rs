//! The machine's own limits, measured: the peak rate of fused multiply-adds (f32, in the
//! instructions of a kernel: [`Isa`]) and STREAM's triad bandwidth. A kernel's GFLOP/s or GB/s is judged
//! as a fraction of these, taken on the same machine in the same run.
//!
//! The FMA probe runs [`chains`] independent dependency chains of `x = x * a + b` per thread: an
//! FMA has a latency of about 4 cycles and two issue ports on recent x86 cores, so 8 or more
//! chains in registers keep both ports busy (10 on AVX2, whose 16 `ymm` registers also hold the
//! two constants; 12 on AVX-512, with 32 `zmm`). The triad is `a[i] = b[i] + s * c[i]` on three
//! arrays split between the threads, each thread touching its own part first (its pages local),
//! 12 bytes counted per element as STREAM counts them (the write-allocate read of `a` is not).
//!
//! And what a cache line costs between two cores: [`line_round_trip_ns`], two threads on two CPUs
//! handing one line back and forth. Ranks on one machine exchange their gradients and weights
//! through memory, so every line of them crosses between cores; on a virtual machine the
//! host decides how far apart its CPUs are, and that can change while a job runs (on one 2-CPU
//! cloud machine the round trip was 50-85 ns for minutes, then 340-420 ns for minutes, as the
//! host moved the two onto distant cores; a two-thread copy of 72 KB each way then took 3.5x as
//! long). A figure taken beside a run tells which of those machines the run had.
//!
//! And what a block of them costs: [`handoff`], each of the two threads copying a block of
//! [`HANDOFF_BYTES`] into lines the other read last, then reading the block the other just
//! wrote, both at once: as 2 ranks push their gradients into slots the owners read the step
//! before and the owners read them, or as a forward reads the weights the other rank just
//! stepped. The read is timed again from the reader's own cache right after: the same loop where
//! nothing crosses.

use std::cell::UnsafeCell;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use wide::f32x8;

pub use crate::cpu::Isa;

/// Independent FMA chains per thread of `isa`'s probe: 10 `ymm` (whose 16 registers also hold
/// the two constants), 12 `zmm` (of 32).
pub fn chains(isa: Isa) -> usize {
    match isa {
        Isa::F32x8 => 10,
        Isa::Avx512 => 12,
    }
}

/// Whether this build's `f32x8::mul_add` is one fused instruction (otherwise a multiply and an
/// add, counted as the same two flops). AVX-512's probe always fuses.
pub const FUSED: bool = cfg!(target_feature = "fma");

/// `rounds` rounds of one `mul_add` on each of 10 `f32x8`; returns a value that depends on every
/// chain (so none is optimized away). Flops: `rounds * 10 * 8 * 2`.
#[inline(never)]
fn fma_chains_f32x8(rounds: u64, seed: f32) -> f32 {
    let a = f32x8::splat(black_box(0.999_999_9));
    let b = f32x8::splat(black_box(1e-7));
    let mut acc = [f32x8::splat(seed); 10];
    for (i, x) in acc.iter_mut().enumerate() {
        *x += f32x8::splat(i as f32 * 1e-3);
    }
    for _ in 0..rounds {
        for x in acc.iter_mut() {
            *x = x.mul_add(a, b);
        }
    }
    acc.iter().fold(f32x8::splat(0.0), |s, x| s + *x).reduce_add()
}

/// The same on 12 `zmm` registers. Flops: `rounds * 12 * 16 * 2`.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline(never)]
unsafe fn fma_chains_zmm(rounds: u64, seed: f32) -> f32 {
    use std::arch::x86_64::{
        _mm512_add_ps, _mm512_fmadd_ps, _mm512_reduce_add_ps, _mm512_set1_ps, _mm512_setzero_ps,
    };
    let a = _mm512_set1_ps(black_box(0.999_999_9));
    let b = _mm512_set1_ps(black_box(1e-7));
    let mut acc = [_mm512_setzero_ps(); 12];
    for (i, x) in acc.iter_mut().enumerate() {
        *x = _mm512_set1_ps(seed + i as f32 * 1e-3);
    }
    for _ in 0..rounds {
        for x in acc.iter_mut() {
            *x = _mm512_fmadd_ps(*x, a, b);
        }
    }
    _mm512_reduce_add_ps(acc.iter().fold(_mm512_setzero_ps(), |s, x| _mm512_add_ps(s, *x)))
}

/// `isa`'s probe: `rounds` rounds on each chain.
///
/// # Panics
/// If the CPU does not run `isa`.
fn fma_chains(isa: Isa, rounds: u64, seed: f32) -> f32 {
    assert!(isa.available(), "FMA probe: this CPU does not run {} instructions", isa.name());
    match isa {
        Isa::F32x8 => fma_chains_f32x8(rounds, seed),
        // SAFETY: AVX-512F detected just above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { fma_chains_zmm(rounds, seed) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx512 => unreachable!("AVX-512 is never available off x86-64"),
    }
}

/// Runs `work` on each input, one thread per input, the threads started together; returns the
/// results and the time from the common start to the last one's end.
fn together<I: Send, R: Send>(inputs: Vec<I>, work: impl Fn(I) -> R + Sync) -> (Vec<R>, Duration) {
    let start = std::sync::Barrier::new(inputs.len() + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = inputs
            .into_iter()
            .map(|input| {
                let (start, work) = (&start, &work);
                s.spawn(move || {
                    start.wait();
                    work(input)
                })
            })
            .collect();
        // The clock starts before the threads are let go: started after, it could start late
        // (this thread descheduled while they run) and a short run would look impossibly fast.
        let t0 = Instant::now();
        start.wait();
        let out = handles.into_iter().map(|h| h.join().expect("probe thread")).collect();
        (out, t0.elapsed())
    })
}

/// Peak f32 FMA throughput of `threads` threads in GFLOP/s with `isa`'s instructions (one
/// multiply-add counted as two flops): the best of `reps` runs of about `each` apiece.
///
/// # Panics
/// If the CPU does not run `isa` ([`Isa::available`]).
pub fn fma_peak_gflops(isa: Isa, threads: usize, each: Duration, reps: usize) -> f64 {
    let threads = threads.max(1);
    // Calibrate the rounds for `each` on one thread.
    let mut rounds = 1u64 << 16;
    loop {
        let t0 = Instant::now();
        black_box(fma_chains(isa, rounds, 1.0));
        let e = t0.elapsed();
        if e >= each / 4 || rounds >= 1 << 40 {
            rounds = (rounds as f64 * each.as_secs_f64() / e.as_secs_f64().max(1e-9)).max(1.0) as u64;
            break;
        }
        rounds *= 4;
    }
    let flops = (rounds * (chains(isa) * isa.lanes() * 2) as u64 * threads as u64) as f64;
    (0..reps.max(1))
        .map(|_| {
            let (sums, took) = together((0..threads).collect(), |t| fma_chains(isa, rounds, 1.0 + t as f32));
            black_box(sums);
            flops / took.as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// STREAM triad bandwidth of `threads` threads in GB/s over three arrays of `elems` f32 each:
/// the best of `reps` runs (STREAM reports the best).
pub fn triad_gbs(threads: usize, elems: usize, reps: usize) -> f64 {
    let threads = threads.max(1);
    let per = elems.div_ceil(threads);
    // Each thread allocates its own parts and touches them first (its pages, its node).
    let sizes = (0..threads).map(|t| per.min(elems.saturating_sub(t * per))).collect();
    let (mut parts, _) = together(sizes, |n| (vec![0f32; n], vec![1f32; n], vec![2f32; n]));
    let s = black_box(3.0f32);
    let bytes = (12 * elems) as f64;
    (0..reps.max(1))
        .map(|_| {
            let (_, took) = together(parts.iter_mut().collect(), |(a, b, c)| {
                for ((a, b), c) in a.iter_mut().zip(b.iter()).zip(c.iter()) {
                    *a = b + s * c;
                }
                black_box(a.first().copied());
            });
            bytes / took.as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// A line of its own: nothing else shares it.
#[repr(align(128))]
struct Line(AtomicU64);

impl Line {
    /// Spins until the line holds `v`.
    fn wait_for(&self, v: u64) {
        self.spin_until(|x| x == v);
    }

    /// Spins until `done` holds of the line's value, yielding now and then: two threads on one
    /// CPU still take turns.
    fn spin_until(&self, done: impl Fn(u64) -> bool) {
        let mut spins = 0u32;
        while !done(self.0.load(Ordering::Acquire)) {
            spins += 1;
            if spins.is_multiple_of(4096) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// The round trip of one cache line between two threads, in nanoseconds: the first writes the
/// line, the second answers on it, `rounds` times; the best of `reps` runs. Each thread first
/// calls `place(i)` (`i` 0 or 1): where the caller binds them to the CPUs it wants measured.
pub fn line_round_trip_ns(rounds: u64, reps: usize, place: impl Fn(usize) + Sync) -> f64 {
    let rounds = rounds.max(1);
    let line = Line(AtomicU64::new(0));
    (0..reps.max(1))
        .map(|_| {
            line.0.store(0, Ordering::Relaxed);
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    place(1);
                    start.wait();
                    for i in 0..rounds {
                        line.wait_for(2 * i + 1);
                        line.0.store(2 * i + 2, Ordering::Release);
                    }
                });
                s.spawn(|| {
                    place(0);
                    start.wait();
                    let t0 = Instant::now();
                    for i in 0..rounds {
                        line.0.store(2 * i + 1, Ordering::Release);
                        line.wait_for(2 * i + 2);
                    }
                    t0.elapsed().as_nanos() as f64 / rounds as f64
                })
                .join()
                .expect("line probe thread")
            })
        })
        .fold(f64::INFINITY, f64::min)
}

/// The block [`handoff`] moves: about half the parameters of the MLP 784-128-10 (101,770 f32),
/// what each of 2 ranks hands the other every step.
pub const HANDOFF_BYTES: usize = 200 << 10;

/// Rates of [`handoff`], GB/s a thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Handoff {
    /// Copying a block into lines the other thread read last.
    pub copy_gbs: f64,
    /// Reading a block the other thread just wrote.
    pub read_gbs: f64,
    /// Reading it again right after, from the reader's own cache.
    pub local_gbs: f64,
}

/// A block of [`handoff`]: thread `i` reads block `i`, the other thread writes it.
struct Block(UnsafeCell<Vec<f32>>);

// SAFETY: the threads of `handoff` reach the blocks only between the steps of their barrier (an
// AcqRel increment, then Acquire loads until both arrived): while copying, each writes only the
// other's block; while reading, each reads only its own. No two accesses to a block overlap, and
// each thread sees what the other wrote before the step between them.
unsafe impl Sync for Block {}

/// What handing `bytes` between two threads costs (see the [module docs](self)), both at once as
/// 2 ranks do: in each of `rounds` rounds each thread copies a block into the other's (lines the
/// other read the round before), then reads its own (the lines the other just wrote), and reads
/// it again (from its own cache); each rate is the median over both threads' rounds, the best of
/// `reps` runs. Each thread first calls `place(i)` (`i` 0 or 1), as in [`line_round_trip_ns`].
pub fn handoff(bytes: usize, rounds: usize, reps: usize, place: impl Fn(usize) + Sync) -> Handoff {
    let n = (bytes / size_of::<f32>()).max(1);
    let rounds = rounds.max(1);
    let rate = |mut secs: Vec<f64>| {
        secs.sort_by(f64::total_cmp);
        (n * size_of::<f32>()) as f64 / secs[secs.len() / 2].max(1e-12) / 1e9
    };
    let best = |a: f64, b: f64| if a.is_nan() { b } else { a.max(b) };
    let mut out = Handoff { copy_gbs: f64::NAN, read_gbs: f64::NAN, local_gbs: f64::NAN };
    for _ in 0..reps.max(1) {
        let blocks = [(); 2].map(|_| Block(UnsafeCell::new(vec![0.0f32; n])));
        let arrived = Line(AtomicU64::new(0));
        // The `k`-th step of the two threads' barrier (both go through the same steps).
        let step = |k: u64| {
            arrived.0.fetch_add(1, Ordering::AcqRel);
            arrived.spin_until(|x| x >= 2 * k);
        };
        // Each thread's copies, reads, and reads from its own cache, in seconds.
        let times: Vec<[Vec<f64>; 3]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|me| {
                    let (blocks, step, place) = (&blocks, &step, &place);
                    s.spawn(move || {
                        place(me);
                        let src = vec![1.0f32 + me as f32; n];
                        let mut t: [Vec<f64>; 3] = Default::default();
                        step(1);
                        for r in 0..rounds as u64 {
                            let t0 = Instant::now();
                            // SAFETY: the copying step: only this thread writes the other's block
                            // (see `Block`).
                            unsafe { (*blocks[1 - me].0.get()).copy_from_slice(&src) };
                            t[0].push(t0.elapsed().as_secs_f64());
                            step(2 * r + 2);
                            // SAFETY: the reading step: only this thread reads its block.
                            let own = unsafe { &*blocks[me].0.get() };
                            for times in &mut t[1..] {
                                let t0 = Instant::now();
                                black_box(crate::dense::sq_norm(black_box(own)));
                                times.push(t0.elapsed().as_secs_f64());
                            }
                            step(2 * r + 3);
                        }
                        t
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("handoff probe thread")).collect()
        });
        let both = |k: usize| times.iter().flat_map(|t| t[k].iter().copied()).collect::<Vec<_>>();
        out = Handoff {
            copy_gbs: best(out.copy_gbs, rate(both(0))),
            read_gbs: best(out.read_gbs, rate(both(1))),
            local_gbs: best(out.local_gbs, rate(both(2))),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chains_compute_what_they_say() {
        // Each chain x -> x a + b, from seed + i / 1000, summed over the lanes; each probe this
        // CPU runs.
        let rounds = 1000u64;
        let (a, b) = (0.999_999_9f64, 1e-7f64);
        for isa in Isa::runnable() {
            let got = fma_chains(isa, rounds, 1.0) as f64;
            let want: f64 = (0..chains(isa))
                .map(|i| {
                    let mut x = 1.0 + i as f64 * 1e-3;
                    for _ in 0..rounds {
                        x = x * a + b;
                    }
                    x * isa.lanes() as f64
                })
                .sum();
            assert!((got - want).abs() / want < 1e-4, "{isa:?}: {got} vs {want}");
        }
    }

    #[test]
    fn the_probes_measure_positive_rates() {
        let peak = fma_peak_gflops(Isa::best(), 2, Duration::from_millis(20), 2);
        assert!(peak.is_finite() && peak > 0.1, "{peak}");
        let triad = triad_gbs(2, 1 << 16, 2);
        assert!(triad.is_finite() && triad > 0.01, "{triad}");
        // Each thread is placed first, once a run (where the caller binds it; here nowhere).
        let placed = std::sync::Mutex::new(Vec::new());
        let ns = line_round_trip_ns(2000, 2, |i| placed.lock().expect("placed").push(i));
        let mut placed = placed.into_inner().expect("placed");
        placed.sort_unstable();
        assert_eq!(placed, [0, 0, 1, 1]);
        assert!(ns.is_finite() && ns > 1.0, "{ns}");
        let placed = std::sync::Mutex::new(Vec::new());
        let h = handoff(64 << 10, 20, 2, |i| placed.lock().expect("placed").push(i));
        let mut placed = placed.into_inner().expect("placed");
        placed.sort_unstable();
        assert_eq!(placed, [0, 0, 1, 1]);
        for r in [h.copy_gbs, h.read_gbs, h.local_gbs] {
            assert!(r.is_finite() && r > 0.01, "{h:?}");
        }
    }
}
