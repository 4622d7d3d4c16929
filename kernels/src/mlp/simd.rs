//! Our own GEMM: BLIS-style blocks and a register-tiled micro-kernel, its operands packed only
//! where their layout asks for it; `f32x8` ReLU and softmax cross-entropy.
//!
//! Two micro-kernels, the CPU's choosing at run time ([`Isa::best`]): `wide::f32x8`, a 6x16
//! tile of `C` in 12 `f32x8` registers (per step two loads of `B`, six broadcasts of `A`, 12
//! FMAs: the 16 `ymm` registers of AVX2 hold no more), and AVX-512, an 8x32 tile in 16 `zmm`
//! registers (two loads, eight broadcasts, 16 FMAs of 16 lanes). The default build targets
//! x86-64-v3, so AVX-512 code can only come from a function compiled with the feature enabled
//! ([`gemm`] picks it after `is_x86_feature_detected!`); on a CPU with two 512-bit FMA
//! units (Intel Xeon) it doubles the peak, on a Zen 4 (256-bit units) it halves the
//! instructions. Why 8x32 and not 6x32 (the `f32x8` tile widened): a tile of 8 rows divides the
//! MLP's 64- and 128-row products into whole panels, and its 16 FMAs a step for two loads of `B`
//! read a third less of `B` per flop; the 6x32 tile ran the first layer's forward of a 64-row
//! chunk at 100 GFLOP/s, the 8x32 one at 119-125 (Intel Xeon, AVX-512 peak 232-245 GFLOP/s a
//! core; the `f32x8` kernel 86-93, its own peak 123-131).
//!
//! Loops, outermost first (BLIS): `jc` over `NC` columns of `C`; `pc` over `KC` of the inner
//! dimension, that `KC x NC` block of `op(B)` in column panels of `NR`; `ic` over `MC` rows,
//! that `MC x KC` block of `op(A)` in row panels of `MR`; then every (row panel, column panel)
//! pair runs the micro-kernel (along the rows of `C` or down its columns: see
//! `row_order_b_bytes`), which keeps its tile of `C` in registers for the whole `KC` loop.
//!
//! What the micro-kernel reads per step is `NR` consecutive values of a row of `op(B)` and one
//! value of each of `MR` rows of `op(A)`. `op(B) = B^T` has its `NR` values a column length
//! apart, and is packed (8x8 `f32x8` transposes into panels). The others are read in place: a
//! row of `op(B) = B` holds its `NR` values side by side, one row length from the next step's;
//! the `MR` rows of `op(A) = A` are streams, the next panel's asked for ahead (`Ahead`);
//! `op(A) = A^T` holds each step's `MR` values side by side. A ragged last panel is packed, with
//! zeros past the edge so that the micro-kernel never branches.
//! (BLIS packs every panel, for contiguous streams and fewer TLB misses on large matrices; at
//! an MLP's sizes the copy cost more than it saved.) Measured in one process on a Zen 4, the
//! packed and in-place versions alternated, 12 rounds of 200 calls, operands in cache: the
//! first layer's forward `X W1^T` of a 64-row chunk 137.3 -> 131.7 us, of 256 rows 494 -> 472
//! us, its weight gradient `dH^T X` 134.4 -> 131.4 us, the 10-output layer 3.9 -> 3.0 us;
//! reading `op(A) = A^T` in place too (each step's 6 values a row length from the next's) took
//! the weight gradient to 140 us, and is not done. MLP training, 2 MPI ranks, 8 runs of each
//! binary alternated: 279.9k -> 292.8k samples/s at batch 128, 354.7k -> 362.2k at 512
//! (medians), the same model. (Those figures are the `f32x8` kernel's.)

use std::array;

use wide::f32x8;

use super::{check_gemm, Op};
pub use crate::cpu::Isa;
use crate::dense::simd::{load, store, LANES};

/// Inner-dimension block: a `MR x KC` panel of `A` (24-32 KiB) stays in L1, a `KC x NR` panel
/// of `B` (64 KiB for 16 columns, 128 KiB for 32) streams from L2. BLIS keeps the panel of `B`
/// in L1 (`KC` = 256 here before), but an MLP's inner dimension is its input width (784 for
/// MNIST-sized images): in one block, each tile of `C` is written once rather than once per
/// block, and nothing is packed twice. Measured on the forward `X W1^T` of a 64-row chunk and of
/// 256 rows (both orders of tiles alternated in one process, 1000 calls each, two runs): `KC` =
/// 512, 784 and 1024 took 2, 4 and 5 % less time than 256 (`f32x8`); with AVX-512, 256 gave
/// 122 GFLOP/s on the 64-row forward against 119 (one run each): the same.
const KC: usize = 1024;
/// Row block: the packed `MC x KC` block of `A` (384 KiB) stays in L2.
const MC: usize = 96;
/// Column block: the packed `KC x NC` block of `B` (up to 4 MiB) lives in L3.
const NC: usize = 1024;

/// Blocks of `B` (packed or read in place) up to [`row_order_b_bytes`] are walked once per row
/// panel of `A` (tiles along the rows of `C`), larger ones once in all (BLIS's order, tiles down
/// the columns of `C`). A short inner dimension makes `C` the bulk of the traffic: the weight
/// gradient `dH^T X` of a 64-row chunk (`k = 64`) updates a 128 x 784 `C` (400 KiB, out of L2)
/// in tiles of 6 x 16, and going along its rows, which the prefetcher follows, took 5-8 % less
/// time than going down its columns (both orders alternated in one process, `C` evicted between
/// calls, 1000 calls each, three runs); the MLP's other products took the same time either way.
/// (Those were the weights as `out x in`; held as `in x out` since, the gradient is `X^T dH`, a
/// 784 x 128 `C` of the same size and the same inner dimension, walked the same way.)
///
/// The forward `X V`, whose `B` is 400 KiB, went down the columns with a bound of 256 KiB: along
/// the rows took the same time in one process, with the chunk's rows in cache or read from
/// memory. Since the micro-kernel's loop got faster, along the rows is ahead in training (each
/// panel of the chunk's rows read once from memory and reused from L1 for the four panels of
/// `V`, which streams from L2): on an Intel Xeon (2 MiB of L2 a core), 2 MPI ranks, alternated,
/// batch 512 ~552k -> ~574k and ~556k -> ~564k samples/s (4 and 5 runs each), batch 128 ~412k ->
/// ~425k and ~427k -> ~433k. Hence a bound of half the core's L2, so that `B` stays there.
fn row_order_b_bytes() -> usize {
    l2().map_or(256 * 1024, |l2| l2 / 2)
}

/// One core's L2 in bytes ([`crate::cpu::l2_bytes`], read once).
fn l2() -> Option<usize> {
    static BYTES: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *BYTES.get_or_init(crate::cpu::l2_bytes)
}

/// Packing buffers for [`gemm`], grown on first use and then reused (no allocation in steady
/// state).
#[derive(Debug, Clone, Default)]
pub struct Pack {
    a: Vec<f32>,
    b: Vec<f32>,
}

fn grow(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    &mut v[..len]
}

/// Packs rows `i0..i0 + mc`, columns `p0..p0 + kc` of `op(A)` (strides `rs`, `cs`, one of them
/// 1) into panels of `MR` rows: `out[panel][kk * MR + i]`, zero rows past `mc`.
///
/// `op(A) = A` (`cs == 1`, rows contiguous): 8x8 `f32x8` transposes of `MR` rows (plus zero
/// rows) by 8 columns, then the first `MR` lanes of each column; `op(A) = A^T` (`rs == 1`): each
/// column of the panel is `MR` contiguous floats, a copy.
#[allow(clippy::too_many_arguments)]
fn pack_a<const MR: usize>(
    a: &[f32],
    rs: usize,
    cs: usize,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    out: &mut [f32],
) {
    const { assert!(MR <= LANES, "pack_a: a panel's rows are lanes of one f32x8") };
    for (p, panel) in out.chunks_exact_mut(kc * MR).enumerate() {
        let rows = (mc - p * MR).min(MR);
        let r0 = i0 + p * MR;
        if rows < MR {
            panel.fill(0.0);
        }
        if cs == 1 {
            let kc8 = kc - kc % LANES;
            for kk in (0..kc8).step_by(LANES) {
                let t = f32x8::transpose(array::from_fn(|i| {
                    if i < rows {
                        let s = (r0 + i) * rs + p0 + kk;
                        load(&a[s..s + LANES])
                    } else {
                        f32x8::ZERO
                    }
                }));
                for (q, col) in panel[kk * MR..(kk + LANES) * MR].chunks_exact_mut(MR).enumerate() {
                    col.copy_from_slice(&t[q].as_array()[..MR]);
                }
            }
            for i in 0..rows {
                let s = (r0 + i) * rs + p0;
                for kk in kc8..kc {
                    panel[kk * MR + i] = a[s + kk];
                }
            }
        } else {
            for (kk, col) in panel.chunks_exact_mut(MR).enumerate() {
                let s = (p0 + kk) * cs + r0;
                if rows == MR {
                    // Fixed length: an inline copy, not a `memcpy` call per column.
                    col.copy_from_slice(&a[s..s + MR]);
                } else {
                    col[..rows].copy_from_slice(&a[s..s + rows]);
                }
            }
        }
    }
}

/// Packs rows `p0..p0 + kc`, columns `j0..j0 + nc` of `op(B)` (strides `rs`, `cs`, one of them
/// 1) into panels of `nr` columns (a multiple of 8, the micro-kernel's): `out[panel][kk * nr +
/// j]`, zero columns past `nc`.
///
/// `op(B) = B` (`cs == 1`): each row of the panel is a contiguous copy; `op(B) = B^T`
/// (`rs == 1`, columns contiguous): 8x8 `f32x8` transposes, two per 8 rows of the panel.
#[allow(clippy::too_many_arguments)]
fn pack_b(
    nr: usize,
    b: &[f32],
    rs: usize,
    cs: usize,
    p0: usize,
    kc: usize,
    j0: usize,
    nc: usize,
    out: &mut [f32],
) {
    for (q, panel) in out.chunks_exact_mut(kc * nr).enumerate() {
        let cols = (nc - q * nr).min(nr);
        let jq = j0 + q * nr;
        if cols < nr {
            panel.fill(0.0);
        }
        if cs == 1 {
            for (kk, dst) in panel.chunks_exact_mut(nr).enumerate() {
                let s = (p0 + kk) * rs + jq;
                if cols == nr {
                    // Fixed length: `f32x8` moves, not a `memcpy` call per row.
                    for (h, d) in dst.chunks_exact_mut(LANES).enumerate() {
                        store(d, load(&b[s + h * LANES..s + (h + 1) * LANES]));
                    }
                } else {
                    dst[..cols].copy_from_slice(&b[s..s + cols]);
                }
            }
        } else {
            let kc8 = kc - kc % LANES;
            for h in 0..nr / LANES {
                let hcols = cols.saturating_sub(h * LANES).min(LANES);
                if hcols == 0 {
                    break;
                }
                for kk in (0..kc8).step_by(LANES) {
                    let t = f32x8::transpose(array::from_fn(|j| {
                        if j < hcols {
                            let s = (jq + h * LANES + j) * cs + p0 + kk;
                            load(&b[s..s + LANES])
                        } else {
                            f32x8::ZERO
                        }
                    }));
                    for (r, t) in t.iter().enumerate() {
                        let d = (kk + r) * nr + h * LANES;
                        store(&mut panel[d..d + LANES], *t);
                    }
                }
                for j in 0..hcols {
                    let s = (jq + h * LANES + j) * cs + p0;
                    for kk in kc8..kc {
                        panel[kk * nr + h * LANES + j] = b[s + kk];
                    }
                }
            }
        }
    }
}

/// Where the micro-kernel reads a panel of `MR` rows of `op(A)` over `kc` steps of the inner
/// dimension.
#[derive(Clone, Copy)]
enum APanel<'a, const MR: usize> {
    /// `op(A) = A` read in place: row `i`'s values `a[i * lda..][..kc]`, each row a stream the
    /// prefetcher follows.
    Rows { a: &'a [f32], lda: usize },
    /// `op(A) = A^T` read in place: step `kk`'s values `a[kk * lda..][..MR]`, side by side.
    Cols { a: &'a [f32], lda: usize },
    /// Packed: the `MR` values of each step side by side.
    Packed(&'a [f32]),
}

/// Lines of memory asked for in L2, one per turn of [`steps`]' loop: the next row panel of
/// `op(A) = A` read in place, while the tiles of this one run. The forward `X V` reads each
/// panel of a chunk's rows once from memory, and the hardware's prefetchers, which follow each
/// of the panel's eight rows only once it is being read, left the first of its four tiles
/// waiting on memory; the `q`-th tile asks for the `q`-th share of the next panel's lines, so
/// two of the four tiles of a 784-long panel ask for all of them. Measured in one process on an
/// Intel Xeon (AVX-512), rows streamed from a 60,000-row set, both versions alternated, 6 runs
/// of 2000 calls: the forward of 64 rows 99.5 -> 84.0 us (medians; 77 with the rows in cache),
/// of 256 rows 373 -> 336 us; the weight gradient (which reads the same rows right after,
/// from cache) unchanged. MLP training, 2 MPI ranks, 5 runs of each binary alternated: batch
/// 128 431k -> 440k samples/s, batch 512 528k -> 566k (medians). Only for a block that spans
/// whole rows (`kc` = the row length), whose next panel is one stretch of memory.
///
/// The same look-ahead carries a [`Warm`] stream: rows the caller will read next (the next
/// chunk's), one line a turn of the products that have no panel of their own to ask for.
#[derive(Clone, Copy)]
struct Ahead {
    /// The next line's address.
    at: usize,
    /// Lines still to ask for.
    left: usize,
}

impl Ahead {
    /// The lines of `next` (the next panel's rows, contiguous) that tile `q` of a panel asks
    /// for: those after the `q` tiles before it, each of which asked for one a turn of `kc`.
    fn for_tile(next: &[f32], kc: usize, q: usize) -> Option<Self> {
        let (lines, first) = (next.len().div_ceil(LINE), q * (kc / UNROLL));
        (first < lines).then(|| Self { at: next[first * LINE..].as_ptr() as usize, left: lines - first })
    }

    #[inline(always)]
    fn next(&mut self) {
        if self.left > 0 {
            prefetch_line(self.at);
            self.left -= 1;
            self.at = self.at.wrapping_add(crate::cpu::CACHE_LINE);
        }
    }
}

/// Asks for the cache line at address `at` in L2: an address, not a reference, because a
/// prefetch reads nothing the program sees and never faults, whatever the address (a [`Warm`]
/// stream's rows may be gone by the time it is asked for).
#[inline(always)]
fn prefetch_line(at: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht1` only hints the caches: it neither faults nor changes what any load
    // returns, for any address; SSE is part of x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(at as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// The most bytes a [`Warm`] stream asks for: a quarter of the core's L2 (256 KiB where it is
/// not known), so that the rows asked for do not push out the operands of the products that
/// ask for them (the current rows, the weights and their gradient).
fn warm_bytes() -> usize {
    l2().map_or(256 * 1024, |l2| l2 / 4)
}

/// Lines a [`Matmul`](super::Matmul)'s next products ask for in L2, one per turn of their
/// micro-kernels' loops (those with no panel of their own to ask for ahead): the rows a
/// caller will read next, fetched from memory while it computes on what is in cache. Kept as
/// addresses (see `prefetch_line`): a stream outliving its rows only asks for lines nobody
/// reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct Warm {
    at: usize,
    left: usize,
}

impl Warm {
    /// The lines of `rows`, up to a quarter of the core's L2 (`warm_bytes`).
    pub fn new(rows: &[f32]) -> Self {
        let at = rows.as_ptr() as usize;
        let end = at + std::mem::size_of_val(rows).min(warm_bytes());
        let first = at - at % crate::cpu::CACHE_LINE;
        Self { at: first, left: (end - first).div_ceil(crate::cpu::CACHE_LINE) }
    }

    /// Lines still to ask for.
    pub fn left(&self) -> usize {
        self.left
    }

    /// The next `turns` lines (fewer at the end), as a tile's look-ahead.
    fn take(&mut self, turns: usize) -> Option<Ahead> {
        let n = turns.min(self.left);
        (n > 0).then(|| {
            let a = Ahead { at: self.at, left: n };
            self.at = self.at.wrapping_add(n * crate::cpu::CACHE_LINE);
            self.left -= n;
            a
        })
    }
}

/// Floats in a cache line.
const LINE: usize = crate::cpu::CACHE_LINE / size_of::<f32>();

/// Steps of the inner dimension per turn of [`steps`]' loop.
const UNROLL: usize = 4;

/// The steps of a micro-kernel: `step(a_k, b_k)` for each `kk < kc`, with the `MR` values of
/// `op(A)`'s column `kk` (by reference: the kernel broadcasts each straight from memory, which
/// takes a load port, not the shuffle port that FMAs share on Intel cores) and the `NR` values of
/// `op(B)`'s row `kk` (`b`'s rows `rsb` apart: a packed panel `NR`, `op(B) = B` read in place its
/// row length).
///
/// The operands' bounds are checked once, `op(A)` is one pointer and two strides (row `i`,
/// step `kk` at `i rs + kk cs`: the compiler folds them into addresses, where eight row
/// references took eight registers and their own increments), and the loop runs [`UNROLL`]
/// steps a turn. A turn of one step spent six scalar instructions (two bounds checks, the
/// counters, the loop's branch) beside 16 FMAs, and on Intel cores those share ports 0 and 5
/// with the FMAs. Measured in one process on an Intel Xeon (AVX-512, peak ~210 GFLOP/s a core),
/// the two versions alternated, operands in cache: an 8 x 32 x 784 product 160 -> 190-203
/// GFLOP/s, the MLP's forward `X V` of a 64-row chunk 85-86 -> 77-78 us, its weight gradient
/// the same (83-91 us; 88-92 with `f32x8`, whose forward went 131-139 -> 123-130 us). Two or
/// eight steps a turn were slower than four (eight spills registers).
///
/// With `ahead`, each turn asks for one more of its lines. (Its check inside the loop of every
/// product slowed the weight gradient's from 86 to 107 us: the loop without it is its own code.)
#[inline(always)]
fn steps<const MR: usize, const NR: usize>(
    a: APanel<'_, MR>,
    b: &[f32],
    rsb: usize,
    kc: usize,
    ahead: Option<Ahead>,
    step: impl FnMut([&f32; MR], &[f32]),
) {
    if kc == 0 {
        return;
    }
    assert!(b.len() >= (kc - 1) * rsb + NR, "steps: B's panel is short");
    // Every arm's SAFETY: for every `kk < kc` the step reads `a[i rs + kk cs]` for `i < MR`
    // (packed: `i + kk MR < kc MR`; rows: `i lda + kk < (MR - 1) lda + kc`; columns: `i + kk
    // lda < (kc - 1) lda + MR`) and `b[kk rsb..kk rsb + NR]` (`(kc - 1) rsb + NR <= b.len()`),
    // all asserted here; the references live only during the call to `step`, and nothing writes
    // `a` or `b` meanwhile (shared borrows). Each arm passes its strides as literals where it
    // can, so that the compiler folds them into addresses.
    match a {
        APanel::Packed(ap) => {
            assert!(ap.len() >= kc * MR, "steps: A's packed panel is short");
            // SAFETY: as above, with the packed panel's bound.
            unsafe {
                match ahead {
                    Some(mut h) => {
                        run::<MR, NR>(ap.as_ptr(), 1, MR, b.as_ptr(), rsb, kc, move || h.next(), step)
                    }
                    None => run::<MR, NR>(ap.as_ptr(), 1, MR, b.as_ptr(), rsb, kc, || {}, step),
                }
            }
        }
        APanel::Rows { a, lda } => {
            assert!(a.len() >= (MR - 1) * lda + kc, "steps: A's rows are short");
            // SAFETY: as above, with the rows' bound. Each loop its own code, so that the one
            // without look-ahead keeps its registers.
            unsafe {
                match ahead {
                    Some(mut h) => {
                        run::<MR, NR>(a.as_ptr(), lda, 1, b.as_ptr(), rsb, kc, move || h.next(), step)
                    }
                    None => run::<MR, NR>(a.as_ptr(), lda, 1, b.as_ptr(), rsb, kc, || {}, step),
                }
            }
        }
        APanel::Cols { a, lda } => {
            assert!(a.len() >= (kc - 1) * lda + MR, "steps: A's columns are short");
            // SAFETY: as above, with the columns' bound.
            unsafe {
                match ahead {
                    Some(mut h) => {
                        run::<MR, NR>(a.as_ptr(), 1, lda, b.as_ptr(), rsb, kc, move || h.next(), step)
                    }
                    None => run::<MR, NR>(a.as_ptr(), 1, lda, b.as_ptr(), rsb, kc, || {}, step),
                }
            }
        }
    }
}

/// [`steps`]' loop over raw pointers: `op(A)`'s value `(i, kk)` at `a + i rs + kk cs`, `op(B)`'s
/// row `kk` at `b + kk rsb`; `turn` after each [`UNROLL`] steps.
///
/// # Safety
/// Those are readable `f32`s for every `i < MR`, `kk < kc` (and the `NR` values of each row of
/// `op(B)`), not written during the call.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn run<const MR: usize, const NR: usize>(
    a: *const f32,
    rs: usize,
    cs: usize,
    b: *const f32,
    rsb: usize,
    kc: usize,
    mut turn: impl FnMut(),
    mut step: impl FnMut([&f32; MR], &[f32]),
) {
    // SAFETY: `kk < kc`, the caller's contract.
    let mut at = |kk: usize| unsafe {
        step(array::from_fn(|i| &*a.add(i * rs + kk * cs)), std::slice::from_raw_parts(b.add(kk * rsb), NR))
    };
    let mut kk = 0;
    while kk + UNROLL <= kc {
        for u in 0..UNROLL {
            at(kk + u);
        }
        turn();
        kk += UNROLL;
    }
    while kk < kc {
        at(kk);
        kk += 1;
    }
}

/// A register-tiled micro-kernel of `MR x NR` and the instructions it is written in.
trait Micro<const MR: usize, const NR: usize> {
    /// `sum_kk a[kk] (MR) x b[kk] (NR)` over `kc` steps (see [`steps`]), written to `out`. One
    /// function, so that the tile goes from registers to `C` without a copy in memory between
    /// them.
    ///
    /// # Safety
    /// The CPU runs the kernel's instructions.
    unsafe fn tile(
        a: APanel<'_, MR>,
        b: &[f32],
        rsb: usize,
        kc: usize,
        ahead: Option<Ahead>,
        out: TileOut<'_>,
    );
}

/// Where a tile goes: `C[tile] <- alpha acc + beta C[tile]` for the valid `mr x nr` corner of
/// `c`, whose rows are `ldc` apart (`C` not read if `beta == 0`).
struct TileOut<'a> {
    c: &'a mut [f32],
    ldc: usize,
    mr: usize,
    nr: usize,
    alpha: f32,
    beta: f32,
}

/// Writes a ragged tile stored in `t` to `out`.
fn write_ragged<const MR: usize, const NR: usize>(t: &[[f32; NR]; MR], out: TileOut<'_>) {
    let TileOut { c, ldc, mr, nr, alpha, beta } = out;
    for (i, t) in t.iter().enumerate().take(mr) {
        for (cij, &tj) in c[i * ldc..i * ldc + nr].iter_mut().zip(t) {
            *cij = if beta == 0.0 { alpha * tj } else { alpha * tj + beta * *cij };
        }
    }
}

/// The `wide` micro-kernel, `MR` x 16 in `2 MR` `f32x8` (6 x 16 in [`gemm`]: 12 of AVX2's 16
/// registers): per step two loads of `B`, `MR` broadcasts of `A` and `2 MR` FMAs. AVX2+FMA in the default build; whatever the build's target features make of
/// `f32x8` otherwise.
struct F32x8Tile;

impl<const MR: usize> Micro<MR, 16> for F32x8Tile {
    #[inline(always)]
    unsafe fn tile(
        a: APanel<'_, MR>,
        b: &[f32],
        rsb: usize,
        kc: usize,
        ahead: Option<Ahead>,
        out: TileOut<'_>,
    ) {
        let mut acc = [[f32x8::ZERO; 2]; MR];
        steps::<MR, 16>(a, b, rsb, kc, ahead, |ak, bk| {
            let (b0, b1) = (load(&bk[..LANES]), load(&bk[LANES..2 * LANES]));
            for i in 0..MR {
                let ai = f32x8::splat(*ak[i]);
                acc[i][0] = ai.mul_add(b0, acc[i][0]);
                acc[i][1] = ai.mul_add(b1, acc[i][1]);
            }
        });
        if out.nr < 2 * LANES {
            let t: [[f32; 16]; MR] =
                array::from_fn(|i| array::from_fn(|j| acc[i][j / LANES].as_array()[j % LANES]));
            return write_ragged(&t, out);
        }
        let TileOut { c, ldc, mr, alpha, beta, .. } = out;
        let (va, vb) = (f32x8::splat(alpha), f32x8::splat(beta));
        for (i, acc) in acc.iter().enumerate().take(mr) {
            for (h, cs) in c[i * ldc..i * ldc + 2 * LANES].chunks_exact_mut(LANES).enumerate() {
                let v = acc[h] * va;
                store(cs, if beta == 0.0 { v } else { vb.mul_add(load(cs), v) });
            }
        }
    }
}

/// The AVX-512 micro-kernel, `MR` x 32 in `2 MR` `zmm` registers (8 x 32 in [`gemm`]):
/// per step two loads of `B`, `MR` broadcasts of `A` and `2 MR` FMAs of 16 lanes. Chosen at run
/// time ([`Isa::best`]) whatever the build's target level, so that
/// the portable x86-64-v3 binary uses the AVX-512 units of the CPUs that have them.
#[cfg(target_arch = "x86_64")]
struct ZmmTile;

#[cfg(target_arch = "x86_64")]
impl<const MR: usize> Micro<MR, 32> for ZmmTile {
    #[inline(always)]
    unsafe fn tile(
        a: APanel<'_, MR>,
        b: &[f32],
        rsb: usize,
        kc: usize,
        ahead: Option<Ahead>,
        out: TileOut<'_>,
    ) {
        // SAFETY: the caller's contract.
        unsafe { zmm::tile(a, b, rsb, kc, ahead, out) }
    }
}

/// [`ZmmTile`]'s code, in functions compiled with AVX-512F enabled: the intrinsics inline only
/// into code that has their feature (a closure inherits its function's).
#[cfg(target_arch = "x86_64")]
mod zmm {
    use std::arch::x86_64::{
        _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_mul_ps, _mm512_set1_ps, _mm512_setzero_ps, _mm512_storeu_ps,
    };

    use super::{steps, write_ragged, APanel, Ahead, TileOut};

    /// Lanes of a `zmm` register.
    const W: usize = 16;

    /// See [`super::Micro::tile`].
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(super) unsafe fn tile<const MR: usize>(
        a: APanel<'_, MR>,
        b: &[f32],
        rsb: usize,
        kc: usize,
        ahead: Option<Ahead>,
        out: TileOut<'_>,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        steps::<MR, 32>(a, b, rsb, kc, ahead, |ak, bk| {
            let bk = &bk[..2 * W];
            // SAFETY: each load reads 16 floats of `bk`, which holds 32.
            let (b0, b1) = unsafe { (_mm512_loadu_ps(bk.as_ptr()), _mm512_loadu_ps(bk[W..].as_ptr())) };
            for i in 0..MR {
                let ai = _mm512_set1_ps(*ak[i]);
                acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
            }
        });
        if out.nr < 2 * W {
            let mut t = [[0.0f32; 2 * W]; MR];
            for (t, acc) in t.iter_mut().zip(&acc) {
                for (th, &v) in t.chunks_exact_mut(W).zip(acc) {
                    // SAFETY: `th` holds 16 floats.
                    unsafe { _mm512_storeu_ps(th.as_mut_ptr(), v) };
                }
            }
            return write_ragged(&t, out);
        }
        let TileOut { c, ldc, mr, alpha, beta, .. } = out;
        let (va, vb) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
        for (i, acc) in acc.iter().enumerate().take(mr) {
            for (cs, &v) in c[i * ldc..i * ldc + 2 * W].chunks_exact_mut(W).zip(acc) {
                let v = _mm512_mul_ps(v, va);
                // SAFETY: the load and the store cover the 16 floats of `cs`.
                unsafe {
                    let v =
                        if beta == 0.0 { v } else { _mm512_fmadd_ps(vb, _mm512_loadu_ps(cs.as_ptr()), v) };
                    _mm512_storeu_ps(cs.as_mut_ptr(), v);
                }
            }
        }
    }
}

/// `C <- alpha op(A) op(B) + beta C` (row-major; `op(A)` is `m x k`, `op(B)` is `k x n`) with
/// the micro-kernel of `isa` ([`Isa::best`] for the widest this CPU runs). With `beta == 0`, `C`
/// is only written. Its tiles with no panel of their own to ask for ahead take their next lines
/// from `warm`, one a turn.
///
/// # Panics
/// If `a.len() != m k`, `b.len() != k n` or `c.len() != m n`, or if the CPU does not run `isa`
/// ([`Isa::available`]).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    isa: Isa,
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    b: &[f32],
    beta: f32,
    c: &mut [f32],
    pack: &mut Pack,
    warm: &mut Warm,
) {
    check_gemm(m, n, k, a, b, c);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 || alpha == 0.0 {
        super::scale_c(beta, c);
        return;
    }
    assert!(isa.available(), "gemm: this CPU does not run {} instructions", isa.name());
    let p = Product { op_a, op_b, m, n, k, alpha, a, b, beta };
    match isa {
        // SAFETY: the binary's own target features, checked at start-up.
        Isa::F32x8 => unsafe { blocks::<F32x8Tile, 6, 16>(&p, c, pack, warm) },
        // SAFETY: AVX-512F detected just above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { gemm_avx512(&p, c, pack, warm) },
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx512 => unreachable!("AVX-512 is never available off x86-64"),
    }
}

/// A product's operands as [`gemm`] takes them (`C` apart: it is written), checked, with `m`,
/// `n`, `k` > 0.
struct Product<'a> {
    op_a: Op,
    op_b: Op,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &'a [f32],
    b: &'a [f32],
    beta: f32,
}

/// [`blocks`] with the AVX-512 kernel, compiled with AVX-512F enabled so that its intrinsics
/// inline.
///
/// # Safety
/// The CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gemm_avx512(p: &Product<'_>, c: &mut [f32], pack: &mut Pack, warm: &mut Warm) {
    // SAFETY: the caller's contract.
    unsafe { blocks::<ZmmTile, 8, 32>(p, c, pack, warm) }
}

/// The blocked loops of [`gemm`] around micro-kernel `K`.
///
/// # Safety
/// The CPU runs `K`'s instructions.
#[inline(always)]
unsafe fn blocks<K: Micro<MR, NR>, const MR: usize, const NR: usize>(
    p: &Product<'_>,
    c: &mut [f32],
    pack: &mut Pack,
    warm: &mut Warm,
) {
    let &Product { op_a, op_b, m, n, k, alpha, a, b, beta } = p;
    let nr_k = NR;
    let (ars, acs) = op_a.strides(m, k);
    let (brs, bcs) = op_b.strides(k, n);
    for jc in (0..n).step_by(NC) {
        let nc = NC.min(n - jc);
        for pc in (0..k).step_by(KC) {
            let kc = KC.min(k - pc);
            // `op(B) = B`: its rows are the panels' rows, read in place but for a ragged last
            // panel (packed, zero-padded); `op(B) = B^T`: every panel packed (transposed).
            let (panels_b, full_b) = (nc.div_ceil(nr_k), if bcs == 1 { nc / nr_k } else { 0 });
            let pb = grow(&mut pack.b, (panels_b - full_b) * nr_k * kc);
            pack_b(nr_k, b, brs, bcs, pc, kc, jc + full_b * nr_k, nc - full_b * nr_k, pb);
            let pb = &pack.b[..(panels_b - full_b) * nr_k * kc];
            let beta = if pc == 0 { beta } else { 1.0 };
            // Tiles along the rows of C for a small block of B (see `row_order_b_bytes`).
            let row_order = kc * panels_b * nr_k * std::mem::size_of::<f32>() <= row_order_b_bytes();
            let b_panel = |q: usize| -> (&[f32], usize) {
                if q < full_b {
                    (&b[pc * brs + jc + q * nr_k..], brs)
                } else {
                    (&pb[(q - full_b) * kc * nr_k..(q - full_b + 1) * kc * nr_k], nr_k)
                }
            };
            for ic in (0..m).step_by(MC) {
                let mc = MC.min(m - ic);
                // Full panels read in place (`op(A) = A` by rows, `op(A) = A^T` by columns: each
                // step's `MR` values side by side, a row length from the next step's), a ragged
                // last one packed (zero rows added). With `A^T` packed instead, the weight
                // gradient of a 64-row chunk took 85-93 us against 83-88 in place (AVX-512, one
                // process, alternated; before `steps` took one pointer and two strides, in
                // place took 4 % more).
                let (panels_a, full_a) = (mc.div_ceil(MR), mc / MR);
                let pa = grow(&mut pack.a, (panels_a - full_a) * MR * kc);
                pack_a::<MR>(a, ars, acs, ic + full_a * MR, mc - full_a * MR, pc, kc, pa);
                let pa = &pack.a[..(panels_a - full_a) * MR * kc];
                let a_panel = |p: usize| -> APanel<'_, MR> {
                    if p < full_a && acs == 1 {
                        APanel::Rows { a: &a[(ic + p * MR) * ars + pc..], lda: ars }
                    } else if p < full_a {
                        APanel::Cols { a: &a[pc * acs + ic + p * MR..], lda: acs }
                    } else {
                        APanel::Packed(&pa[(p - full_a) * kc * MR..(p - full_a + 1) * kc * MR])
                    }
                };
                let mut tile = |p: usize, q: usize| {
                    let (i, mr) = (ic + p * MR, (mc - p * MR).min(MR));
                    let (j, nr) = (jc + q * nr_k, (nc - q * nr_k).min(nr_k));
                    let (bp, rsb) = b_panel(q);
                    // Rows of A read in place: the next panel's rows (of this block or the next
                    // one's first), asked for while this one runs.
                    let next = i + MR;
                    let ahead = if row_order && acs == 1 && kc == ars && next < m {
                        Ahead::for_tile(&a[next * ars..(next + MR.min(m - next)) * ars], kc, q)
                    } else {
                        warm.take(kc / UNROLL)
                    };
                    // SAFETY: the caller's contract.
                    unsafe {
                        let out = TileOut { c: &mut c[i * n + j..], ldc: n, mr, nr, alpha, beta };
                        K::tile(a_panel(p), bp, rsb, kc, ahead, out);
                    }
                };
                if row_order {
                    // Tiles along rows of C: C streams row by row, the block of B from L2.
                    for p in 0..panels_a {
                        for q in 0..panels_b {
                            tile(p, q);
                        }
                    }
                } else {
                    // Tiles down columns of C: each panel of B is fetched once for all of A's.
                    for q in 0..panels_b {
                        for p in 0..panels_a {
                            tile(p, q);
                        }
                    }
                }
            }
        }
    }
}
/// `x <- max(x, 0)`.
pub fn relu(x: &mut [f32]) {
    let mut x8 = x.chunks_exact_mut(LANES);
    for c in &mut x8 {
        store(c, load(c).max(f32x8::ZERO));
    }
    for v in x8.into_remainder() {
        *v = v.max(0.0);
    }
}

/// `dy <- dy * [y > 0]`, with `y` the ReLU's output (positive exactly where its input was).
///
/// # Panics
/// If `y.len() != dy.len()`.
pub fn relu_backward(y: &[f32], dy: &mut [f32]) {
    assert_eq!(y.len(), dy.len(), "relu_backward: length mismatch");
    let mut g8 = dy.chunks_exact_mut(LANES);
    let y8 = y.chunks_exact(LANES);
    let y_tail = y8.remainder();
    for (g, yc) in (&mut g8).zip(y8) {
        let keep = load(yc).simd_gt(f32x8::ZERO);
        store(g, keep.select(load(g), f32x8::ZERO));
    }
    for (g, &v) in g8.into_remainder().iter_mut().zip(y_tail) {
        if v <= 0.0 {
            *g = 0.0;
        }
    }
}

/// Summed cross-entropy of the rows of `logits` (`n x k`, `n = labels.len()`) against `labels`;
/// writes `grad_logits <- softmax(logits) - onehot(labels)`, the gradient of the *sum* (divide by
/// `n` for the mean).
///
/// # Panics
/// On inconsistent lengths or a label `>= k`.
///
/// Up to [`XENT_BLOCK_CLASSES`] classes, 8 rows at a time, a row a lane (one `exp` per class for
/// the 8, the rows' logits gathered and their gradient scattered): 128 rows of 10 classes took
/// ~10 us a row at a time (`crate::softmax::simd::xent_row`, two `exp`s of 8 lanes and a `ln` for
/// each row). The rows past the last 8 go a row at a time.
pub fn softmax_cross_entropy(logits: &[f32], labels: &[u32], grad_logits: &mut [f32]) -> f64 {
    let k = super::xent_classes(logits, labels, grad_logits);
    let xent_row = crate::softmax::simd::xent_row;
    if k == 0 || k > XENT_BLOCK_CLASSES {
        return super::softmax_cross_entropy_with(xent_row, logits, labels, grad_logits);
    }
    let full = labels.len() - labels.len() % LANES;
    let mut loss = 0.0;
    for (r, y) in labels[..full].chunks_exact(LANES).enumerate() {
        let at = r * LANES * k..(r + 1) * LANES * k;
        loss += xent_rows(&logits[at.clone()], y, &mut grad_logits[at], k);
    }
    let at = full * k..;
    loss + super::softmax_cross_entropy_with(
        xent_row,
        &logits[at.clone()],
        &labels[full..],
        &mut grad_logits[at],
    )
}

/// Most classes [`softmax_cross_entropy`] takes 8 rows at a time (their logits in registers).
pub const XENT_BLOCK_CLASSES: usize = 16;

/// [`softmax_cross_entropy`] of 8 rows of `k <= XENT_BLOCK_CLASSES` classes, a row a lane.
fn xent_rows(z: &[f32], labels: &[u32], g: &mut [f32], k: usize) -> f64 {
    let mut v = [f32x8::ZERO; XENT_BLOCK_CLASSES];
    for (c, v) in v[..k].iter_mut().enumerate() {
        *v = f32x8::new(array::from_fn(|i| z[i * k + c]));
    }
    let m = v[1..k].iter().fold(v[0], |m, &x| m.max(x));
    let mut s = f32x8::ZERO;
    for v in &mut v[..k] {
        *v = (*v - m).exp();
        s += *v;
    }
    let inv = f32x8::ONE / s;
    for (c, v) in v[..k].iter().enumerate() {
        for (i, p) in (*v * inv).to_array().into_iter().enumerate() {
            g[i * k + c] = p;
        }
    }
    let (m, ln_s) = (m.to_array(), s.ln().to_array());
    let mut loss = 0.0;
    for (i, &y) in labels.iter().enumerate() {
        let y = y as usize;
        assert!(y < k, "softmax_cross_entropy: label {y} out of range for {k} classes");
        g[i * k + y] -= 1.0;
        loss += f64::from(m[i]) + f64::from(ln_s[i]) - f64::from(z[i * k + y]);
    }
    loss
}
