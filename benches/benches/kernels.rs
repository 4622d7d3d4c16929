//! Micro-benchmarks of the gradient kernels (`peregrine-kernels`), one core.
//!
//! Run (short, as on the shared 2-core development machine, where figures move by +-10%):
//!
//! ```text
//! cargo bench -p peregrine-benches --bench kernels -- --warm-up-time 1 --measurement-time 2
//! ```
//!
//! Add a filter (`-- stream`, `-- lr_`, `-- mlp_`) to run one part. What each figure is compared
//! with, printed in a summary after the criterion output:
//! - `stream/triad`: STREAM's triad `a = b + s c` on three 32 MiB `f32` arrays, measured first in
//!   the same run: the memory bandwidth reference. Bytes are counted as STREAM counts them: two
//!   reads and one write per element, 12 B for `f32` (STREAM's 24 B is for `f64`); the extra
//!   read of `a` that write-allocate caches perform is not counted.
//! - `dense_ooc/*` (16 Mi elements, 64 MiB per array: out of cache): bytes counted the same way
//!   (`dot` reads 8 B per element, `axpy` reads 8 B and writes 4 B), against the triad
//!   (target: >= 85% of it).
//! - `dense_l1/*` (4096 elements, two 16 KiB arrays: in L1): SIMD against the scalar reference
//!   (target: >= 3x).
//! - `lr_*`: sparse logistic-regression gradient, 65,536 features (256 KiB model, in L2), rows of
//!   20..=50 nonzeros at uniform random indices, in nonzeros/s; against the scalar reference and
//!   the issue's plain C loop (~0.27 G nonzeros/s; target: >= 0.5 G).
//! - `softmax/*` (d = 784, k = 10, batch 256; `softmax/simd_chunk64*` a training chunk's 64 rows,
//!   in cache and from memory), `mf/*` (k = 40, MovieLens-1M-sized factor matrices), in rows or
//!   ratings per second: SIMD against scalar; `mf/adaptive_*` the default optimizer's kernel on a
//!   training chunk's shape (1024 ratings, rows in cache).
//! - `mlp_*`: forward + backward of a 784-128-10 MLP, batches 32..256, samples/s, and the big
//!   products of a training chunk alone in FLOP/s, against the FMA peak of one thread measured in
//!   the same run, for each matmul backend (scalar reference, our `wide` kernel,
//!   `matrixmultiply`): the basis of `mlp::Backend::default()`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use criterion::{criterion_group, BenchmarkGroup, Criterion, SamplingMode, Throughput};
use peregrine_kernels::lr::{Csr, SparseGrad};
use peregrine_kernels::mlp::simd::Isa;
use peregrine_kernels::mlp::{self, Backend, Matmul, Op, Weights};
use peregrine_kernels::{dense, lr, mf, softmax};

/// SplitMix64, for reproducible inputs without a dependency.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

/// For benchmarks whose iteration takes milliseconds: 10 samples of equal iteration counts, so
/// that a 2 s measurement time is enough.
fn slow(g: &mut Group<'_>) {
    g.sample_size(10).sampling_mode(SamplingMode::Flat);
}

/// STREAM triad `a = b + s c`, three arrays of 32 MiB.
fn stream(c: &mut Criterion) {
    let n = 32 << 20 >> 2;
    let mut rng = Rng(1);
    let (mut a, b, cc) = (vec![0.0f32; n], rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
    let mut g = c.benchmark_group("stream");
    slow(&mut g);
    g.throughput(Throughput::BytesDecimal(12 * n as u64));
    g.bench_function("triad", |bench| {
        bench.iter(|| {
            let s = black_box(3.0f32);
            for ((ai, bi), ci) in a.iter_mut().zip(&b).zip(&cc) {
                *ai = bi + s * ci;
            }
            black_box(&mut a);
        })
    });
    g.finish();
}

fn dense_group(g: &mut Group<'_>, n: usize, bytes: bool, rng: &mut Rng) {
    let (x, mut y) = (rng.vec(n, -1.0, 1.0), rng.vec(n, -1.0, 1.0));
    let tp =
        |b: u64| if bytes { Throughput::BytesDecimal(b * n as u64) } else { Throughput::Elements(n as u64) };
    g.throughput(tp(8));
    g.bench_function("dot_simd", |b| b.iter(|| dense::dot(black_box(&x), black_box(&y))));
    g.bench_function("dot_scalar", |b| b.iter(|| dense::scalar::dot(black_box(&x), black_box(&y))));
    g.throughput(tp(12));
    g.bench_function("axpy_simd", |b| {
        b.iter(|| dense::axpy(black_box(1e-3), black_box(&x), black_box(&mut y)))
    });
    g.bench_function("axpy_scalar", |b| {
        b.iter(|| dense::scalar::axpy(black_box(-1e-3), black_box(&x), black_box(&mut y)))
    });
    g.throughput(tp(4));
    g.bench_function("sq_norm_simd", |b| b.iter(|| dense::sq_norm(black_box(&x))));
    g.bench_function("sq_norm_scalar", |b| b.iter(|| dense::scalar::sq_norm(black_box(&x))));
}

/// `dot`, `axpy`, `sq_norm` out of cache (16 Mi elements) and in L1 (4096).
fn dense_kernels(c: &mut Criterion) {
    let mut rng = Rng(2);
    let mut g = c.benchmark_group("dense_ooc");
    slow(&mut g);
    dense_group(&mut g, 16 << 20, true, &mut rng);
    g.finish();
    let mut g = c.benchmark_group("dense_l1");
    dense_group(&mut g, 4096, false, &mut rng);
    g.finish();
}

/// Rows of 20..=50 nonzeros at uniform random feature indices.
struct SparseData {
    row_ptr: Vec<u64>,
    indices: Vec<u32>,
    values: Vec<f32>,
    y: Vec<f32>,
}

const LR_FEATURES: usize = 65_536;
const LR_ROWS: usize = 50_000;

fn sparse_data(rng: &mut Rng) -> SparseData {
    let mut d = SparseData { row_ptr: vec![0], indices: Vec::new(), values: Vec::new(), y: Vec::new() };
    for _ in 0..LR_ROWS {
        for _ in 0..20 + rng.below(31) {
            d.indices.push(rng.below(LR_FEATURES) as u32);
            d.values.push(rng.uniform(0.0, 1.0));
        }
        d.row_ptr.push(d.indices.len() as u64);
        d.y.push(rng.below(2) as f32);
    }
    d
}

/// Sparse LR gradient, model in L2.
fn lr_kernels(c: &mut Criterion) {
    let mut rng = Rng(3);
    let d = sparse_data(&mut rng);
    let x = Csr { row_ptr: &d.row_ptr, indices: &d.indices, values: &d.values };
    let w = rng.vec(LR_FEATURES, -0.1, 0.1);
    let mut grad = vec![0.0f32; LR_FEATURES];
    let mut sparse = SparseGrad::new(LR_FEATURES);
    let mut g = c.benchmark_group("lr_grad");
    slow(&mut g);
    g.throughput(Throughput::Elements(x.nnz() as u64));
    g.bench_function("dense_simd", |b| {
        b.iter(|| lr::loss_grad_dense(black_box(x), &d.y, black_box(&w), black_box(&mut grad)))
    });
    g.bench_function("dense_scalar", |b| {
        b.iter(|| lr::scalar::loss_grad_dense(black_box(x), &d.y, black_box(&w), black_box(&mut grad)))
    });
    // As a worker uses it: mini-batches of 256 rows, each into a cleared `SparseGrad`.
    g.bench_function("sparse_simd_mb256", |b| {
        b.iter(|| {
            let mut loss = 0.0;
            for r0 in (0..LR_ROWS).step_by(256) {
                let r1 = (r0 + 256).min(LR_ROWS);
                let (s, e) = (d.row_ptr[r0] as usize, d.row_ptr[r1] as usize);
                let mb =
                    Csr { row_ptr: &d.row_ptr[r0..=r1], indices: &d.indices[s..e], values: &d.values[s..e] };
                sparse.clear();
                loss +=
                    lr::loss_grad_sparse(black_box(mb), &d.y[r0..r1], black_box(&w), black_box(&mut sparse));
            }
            loss
        })
    });
    g.finish();

    // The margins alone: four scalar FMA chains against the sequential reference.
    let mut g = c.benchmark_group("lr_margin");
    slow(&mut g);
    g.throughput(Throughput::Elements(x.nnz() as u64));
    type Margin = fn(&[u32], &[f32], &[f32]) -> f32;
    let variants: [(&str, Margin); 2] = [("chains", lr::simd::margin), ("scalar", lr::scalar::margin)];
    for (name, f) in variants {
        g.bench_function(name, |b| {
            b.iter(|| {
                (0..x.n_rows())
                    .map(|r| {
                        let (idx, val) = x.row(r);
                        f(idx, val, black_box(&w))
                    })
                    .sum::<f32>()
            })
        });
    }
    g.finish();
}

/// Softmax regression, d = 784, k = 10, batch 256.
fn softmax_kernels(c: &mut Criterion) {
    let (n, d, k) = (256, 784, 10);
    let mut rng = Rng(4);
    let x = rng.vec(n * d, 0.0, 1.0);
    let labels: Vec<u32> = (0..n).map(|_| rng.below(k) as u32).collect();
    let (w, bias) = (rng.vec(k * d, -0.05, 0.05), rng.vec(k, -0.1, 0.1));
    let (mut gw, mut gb, mut s) = (vec![0.0; k * d], vec![0.0; k], vec![0.0; softmax::simd::BLOCK_ROWS * k]);
    let mut g = c.benchmark_group("softmax");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("simd", |b| {
        b.iter(|| softmax::loss_grad(black_box(&x), &labels, &w, &bias, &mut gw, &mut gb, &mut s))
    });
    g.bench_function("scalar", |b| {
        b.iter(|| softmax::scalar::loss_grad(black_box(&x), &labels, &w, &bias, &mut gw, &mut gb, &mut s))
    });
    // A training chunk's shape: 64 rows (batch 128 on 2 ranks).
    g.bench_function("simd_chunk64", |b| {
        b.iter(|| {
            softmax::loss_grad(black_box(&x[..64 * d]), &labels[..64], &w, &bias, &mut gw, &mut gb, &mut s)
        })
    });
    // The same chunk's shape with its rows from memory, as in training: consecutive chunks of a
    // 75 MB set, more than a last-level cache holds.
    let big_n = 24_000;
    let xb = rng.vec(big_n * d, 0.0, 1.0);
    let lb: Vec<u32> = (0..big_n).map(|_| rng.below(k) as u32).collect();
    let mut at = 0;
    g.bench_function("simd_chunk64_from_memory", |b| {
        b.iter(|| {
            at = (at + 64) % big_n;
            softmax::loss_grad(
                black_box(&xb[at * d..(at + 64) * d]),
                &lb[at..at + 64],
                &w,
                &bias,
                &mut gw,
                &mut gb,
                &mut s,
            )
        })
    });
    g.finish();
}

/// Matrix-factorization SGD, k = 40, 6040 users x 3706 items (MovieLens-1M), 100,000 ratings.
fn mf_kernels(c: &mut Criterion) {
    let (n_users, n_items, n, k) = (6040, 3706, 100_000, 40);
    let mut rng = Rng(5);
    let users: Vec<u32> = (0..n).map(|_| rng.below(n_users) as u32).collect();
    let items: Vec<u32> = (0..n).map(|_| rng.below(n_items) as u32).collect();
    let ratings: Vec<f32> = (0..n).map(|_| 1.0 + rng.below(5) as f32).collect();
    let (mut u, mut v) = (rng.vec(n_users * k, 0.0, 0.3), rng.vec(n_items * k, 0.0, 0.3));
    let mut g = c.benchmark_group("mf");
    slow(&mut g);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("sgd_simd", |b| {
        b.iter(|| {
            mf::sgd_chunk(&users, &items, &ratings, black_box(&mut u), black_box(&mut v), k, 0.005, 0.02)
        })
    });
    g.bench_function("sgd_scalar", |b| {
        b.iter(|| {
            mf::scalar::sgd_chunk(
                &users,
                &items,
                &ratings,
                black_box(&mut u),
                black_box(&mut v),
                k,
                0.005,
                0.02,
            )
        })
    });
    // Adaptive rates (the default optimizer) on a training chunk's shape: 1024 ratings of 200
    // users and 280 items (rows of k + 2 values, in cache), the users taking turns as in the strata.
    let (cu, ci, cn, w) = (200, 280, 1024, k + 2);
    let mut by_user: Vec<(u32, u32)> =
        (0..cn).map(|_| (rng.below(cu) as u32, rng.below(ci) as u32)).collect();
    by_user.sort_unstable();
    let mut order: Vec<usize> = (0..cn).collect();
    mf::take_turns(&mut order, &by_user.iter().map(|r| r.0).collect::<Vec<_>>());
    let cusers: Vec<u32> = order.iter().map(|&j| by_user[j].0).collect();
    let citems: Vec<u32> = order.iter().map(|&j| by_user[j].1).collect();
    let cratings: Vec<f32> = (0..cn).map(|_| 1.0 + rng.below(5) as f32).collect();
    let rows = |n: usize, rng: &mut Rng| -> Vec<f32> {
        let mut r = rng.vec(n * w, 0.0, 0.15);
        r.chunks_exact_mut(w).for_each(|row| row[k..].fill(1.0));
        r
    };
    let (mut au, mut av) = (rows(cu, &mut rng), rows(ci, &mut rng));
    g.throughput(Throughput::Elements(cn as u64));
    type Adaptive =
        fn(&[u32], &[u32], &[f32], &mut [f32], &mut [f32], usize, f32, f32, Option<f32>, bool) -> f64;
    for (name, f) in [
        ("adaptive_simd", mf::sgd_chunk_adaptive as Adaptive),
        ("adaptive_scalar", mf::scalar::sgd_chunk_adaptive),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                f(
                    &cusers,
                    &citems,
                    &cratings,
                    black_box(&mut au),
                    black_box(&mut av),
                    k,
                    0.1,
                    0.1,
                    None,
                    false,
                )
            })
        });
    }
    g.finish();
}

/// The 784-128-10 MLP and its buffers for one batch.
struct Mlp {
    x: Vec<f32>,
    labels: Vec<u32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
    h: Vec<f32>,
    z: Vec<f32>,
    dz: Vec<f32>,
    dh: Vec<f32>,
    gw1: Vec<f32>,
    gb1: Vec<f32>,
    gw2: Vec<f32>,
    gb2: Vec<f32>,
}

const IN: usize = 784;
const HID: usize = 128;
const OUT: usize = 10;

impl Mlp {
    fn new(n: usize, rng: &mut Rng) -> Mlp {
        Mlp {
            x: rng.vec(n * IN, 0.0, 1.0),
            labels: (0..n).map(|_| rng.below(OUT) as u32).collect(),
            w1: rng.vec(HID * IN, -0.05, 0.05),
            b1: rng.vec(HID, -0.1, 0.1),
            w2: rng.vec(OUT * HID, -0.1, 0.1),
            b2: vec![0.0; OUT],
            h: vec![0.0; n * HID],
            z: vec![0.0; n * OUT],
            dz: vec![0.0; n * OUT],
            dh: vec![0.0; n * HID],
            gw1: vec![0.0; HID * IN],
            gb1: vec![0.0; HID],
            gw2: vec![0.0; OUT * HID],
            gb2: vec![0.0; OUT],
        }
    }

    /// Forward and backward through both layers, the weights in the model's order (a row per
    /// input); returns the summed loss.
    fn step(&mut self, mm: &mut Matmul) -> f64 {
        mlp::dense_forward(mm, &self.x, &self.w1, Weights::InOut, &self.b1, &mut self.h);
        mlp::relu(&mut self.h);
        mlp::dense_forward(mm, &self.h, &self.w2, Weights::InOut, &self.b2, &mut self.z);
        let loss = mlp::softmax_cross_entropy(&self.z, &self.labels, &mut self.dz);
        mlp::dense_backward(
            mm,
            &self.h,
            &self.w2,
            Weights::InOut,
            &self.dz,
            &mut self.gw2,
            &mut self.gb2,
            Some(&mut self.dh),
        );
        mlp::relu_backward(&self.h, &mut self.dh);
        mlp::dense_backward(
            mm,
            &self.x,
            &self.w1,
            Weights::InOut,
            &self.dh,
            &mut self.gw1,
            &mut self.gb1,
            None,
        );
        loss
    }
}

/// The runners timed: our kernel with the widest micro-kernel the CPU runs (`wide`), and, on
/// CPUs where that is AVX-512, with the `f32x8` one too (`wide_f32x8`); `matrixmultiply`; the
/// scalar reference.
fn backends() -> Vec<(&'static str, Matmul)> {
    let mut out = vec![("wide", Matmul::new(Backend::Wide))];
    if Isa::best() != Isa::F32x8 {
        out.push(("wide_f32x8", Matmul::with_isa(Backend::Wide, Isa::F32x8)));
    }
    out.push(("matrixmultiply", Matmul::new(Backend::MatrixMultiply)));
    out.push(("scalar", Matmul::new(Backend::Scalar)));
    out
}
const BATCHES: [usize; 4] = [32, 64, 128, 256];

/// MLP forward + backward per backend and batch size; the first layer's forward product alone.
fn mlp_kernels(c: &mut Criterion) {
    let mut rng = Rng(6);
    let mut g = c.benchmark_group("mlp_step");
    slow(&mut g);
    for n in BATCHES {
        let mut net = Mlp::new(n, &mut rng);
        g.throughput(Throughput::Elements(n as u64));
        for (name, mut mm) in backends() {
            if mm.backend() == Backend::Scalar && n != 256 {
                continue;
            }
            g.bench_function(format!("{name}_{n}"), |b| b.iter(|| net.step(black_box(&mut mm))));
        }
    }
    g.finish();

    // The three big products of one training chunk (64 rows, the MLP's default chunk), in FLOP/s
    // (2 m n k per product), the weights a row per input as the model stores them: the first
    // layer's forward `X V1`, its weight gradient `X^T dH` (accumulated, as chunks add to the
    // gradient) and the same forward at 256 rows.
    let mut g = c.benchmark_group("mlp_gemm");
    slow(&mut g);
    for &(shape, op_a, op_b, beta, m, n, k) in GEMMS {
        let (a, b) = (rng.vec(m * k, -1.0, 1.0), rng.vec(k * n, -0.05, 0.05));
        let mut out = vec![0.0; m * n];
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        for (name, mut mm) in backends() {
            if mm.backend() == Backend::Scalar && shape != "fwd_256" {
                continue;
            }
            g.bench_function(format!("{name}_{shape}"), |bench| {
                bench.iter(|| {
                    mm.matmul(op_a, op_b, m, n, k, 1.0, black_box(&a), black_box(&b), beta, &mut out)
                })
            });
        }
    }
    g.finish();
}

/// `(name, op_a, op_b, beta, m, n, k)` of the products `mlp_gemm` times: `fwd_*` is `X V1`,
/// `grad_*` is `X^T dH`, accumulated (`V1 = W1^T`, `784 x 128`).
type Gemm = (&'static str, Op, Op, f32, usize, usize, usize);
const GEMMS: &[Gemm] = &[
    ("fwd_64", Op::N, Op::N, 0.0, 64, HID, IN),
    ("grad_64", Op::T, Op::N, 1.0, IN, HID, 64),
    ("fwd_256", Op::N, Op::N, 0.0, 256, HID, IN),
];

/// Criterion's output folder, found as criterion finds it.
fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(target).join("criterion");
    }
    let metadata = std::env::var_os("CARGO").and_then(|cargo| {
        let out =
            std::process::Command::new(cargo).args(["metadata", "--format-version", "1"]).output().ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(PathBuf::from(v.get("target_directory")?.as_str()?))
    });
    metadata.unwrap_or_else(|| PathBuf::from("target")).join("criterion")
}

/// Time per iteration (s) of `group/bench` if this run measured it (estimates written after
/// `since`).
fn mean_s(dir: &Path, id: &str, since: SystemTime) -> Option<f64> {
    let path = dir.join(id).join("new").join("estimates.json");
    let fresh = std::fs::metadata(&path).ok()?.modified().ok()? >= since;
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    // Criterion reports the slope of a linear-sampling fit when it has one, else the mean.
    let est = v.get("slope").filter(|s| !s.is_null()).or_else(|| v.get("mean"))?;
    let ns = est.get("point_estimate")?.as_f64()?;
    fresh.then_some(ns * 1e-9)
}

/// Prints each headline figure against its reference, from this run's criterion estimates.
fn summary(since: SystemTime) {
    let dir = criterion_dir();
    let t = |id: &str| mean_s(&dir, id, since);
    println!("\n== kernels: figures against their references (this run, one core, noisy shared machine) ==");
    let cpu = peregrine_kernels::cpu::features();
    println!(
        "instruction set: SIMD kernels compiled for {}; this CPU: {}",
        peregrine_kernels::cpu::compiled_level(),
        peregrine_kernels::cpu::detected_level(&cpu)
    );
    let ooc = (16u64 << 20) as f64;
    let triad = t("stream/triad").map(|s| 12.0 * (32 << 20 >> 2) as f64 / s / 1e9);
    if let Some(tr) = triad {
        println!("STREAM triad (12 B/element counted)            {tr:7.2} GB/s  (reference)");
    }
    for (name, bytes) in [("dot", 8.0), ("axpy", 12.0), ("sq_norm", 4.0)] {
        for v in ["simd", "scalar"] {
            if let Some(s) = t(&format!("dense_ooc/{name}_{v}")) {
                let gbs = bytes * ooc / s / 1e9;
                let pct = triad.map_or(String::new(), |tr| format!("= {:5.1}% of triad", 100.0 * gbs / tr));
                println!(
                    "dense {name:<7} {v:<6} 16 Mi elements           {gbs:7.2} GB/s  {pct}  (target >= 85%)"
                );
            }
        }
    }
    for name in ["dot", "axpy", "sq_norm"] {
        if let (Some(simd), Some(scalar)) =
            (t(&format!("dense_l1/{name}_simd")), t(&format!("dense_l1/{name}_scalar")))
        {
            let ge = 4096.0 / simd / 1e9;
            println!(
                "dense {name:<7} in L1 (4096): simd {ge:6.2} G elem/s, {:5.2}x the scalar reference  (target >= 3x)",
                scalar / simd
            );
        }
    }
    let nnz = {
        let d = sparse_data(&mut Rng(3));
        d.indices.len() as f64
    };
    for id in ["lr_grad/dense_simd", "lr_grad/sparse_simd_mb256", "lr_grad/dense_scalar"] {
        if let Some(s) = t(id) {
            println!(
                "{id:<27} model in L2: {:5.3} G nnz/s  (target >= 0.5; plain C loop ~0.27)",
                nnz / s / 1e9
            );
        }
    }
    for id in ["lr_margin/chains", "lr_margin/scalar"] {
        if let Some(s) = t(id) {
            println!("{id:<27} margins only: {:5.3} G nnz/s", nnz / s / 1e9);
        }
    }
    if let (Some(simd), Some(scalar)) = (t("mf/adaptive_simd"), t("mf/adaptive_scalar")) {
        println!(
            "mf adaptive, a 1024-rating chunk: simd {:5.1} ns a rating, {:5.2}x the scalar reference",
            simd / 1024.0 * 1e9,
            scalar / simd
        );
    }
    for (group, unit, n) in [("softmax", "rows", 256.0), ("mf", "ratings", 100_000.0)] {
        let names: &[&str] = if group == "mf" { &["sgd_simd", "sgd_scalar"] } else { &["simd", "scalar"] };
        if let (Some(simd), Some(scalar)) =
            (t(&format!("{group}/{}", names[0])), t(&format!("{group}/{}", names[1])))
        {
            println!(
                "{group:<8} simd {:8.3} M {unit}/s, {:5.2}x the scalar reference",
                n / simd / 1e6,
                scalar / simd
            );
        }
    }
    for n in BATCHES {
        let row: Vec<String> = backends()
            .iter()
            .filter_map(|(name, _)| {
                t(&format!("mlp_step/{name}_{n}")).map(|s| format!("{name} {:8.1} us", s * 1e6))
            })
            .collect();
        if !row.is_empty() {
            println!("mlp 784-128-10 fwd+bwd, batch {n:>3}: {}", row.join(", "));
        }
    }
    // The products timed, then the FMA peak only if there are any (a second of probing).
    let mut gemms = Vec::new();
    for &(shape, _, _, _, m, n, k) in GEMMS {
        for (name, mm) in backends() {
            if let Some(s) = t(&format!("mlp_gemm/{name}_{shape}")) {
                // matrixmultiply, too, picks the widest kernel the CPU runs.
                let isa = if mm.backend() == Backend::Wide { mm.isa() } else { Isa::best() };
                gemms.push((shape, name, isa, m, n, k, 2.0 * (m * n * k) as f64 / s / 1e9));
            }
        }
    }
    if gemms.is_empty() {
        return;
    }
    // Each figure against the peak of its own instructions.
    let peak = |isa: Isa| peregrine_kernels::roofline::fma_peak_gflops(isa, 1, Duration::from_millis(200), 5);
    let peaks: Vec<(Isa, f64)> = Isa::runnable().map(|isa| (isa, peak(isa))).collect();
    for (shape, name, isa, m, n, k, gf) in gemms {
        let peak = peaks.iter().find(|(i, _)| *i == isa).map_or(f64::NAN, |p| p.1);
        println!(
            "gemm {shape:<7} ({m:>3} x {n:>3} x {k:>3}) {name:<15} {gf:6.1} GFLOP/s, {:3.0} % of the {} FMA peak ({peak:.1})",
            100.0 * gf / peak,
            isa.name()
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2));
    targets = stream, dense_kernels, lr_kernels, softmax_kernels, mf_kernels, mlp_kernels
}

fn main() {
    let start = SystemTime::now();
    benches();
    Criterion::default().configure_from_args().final_summary();
    summary(start);
}
