//! Data-layer benchmarks: LIBSVM conversion throughput, and the cost of opening a dataset against
//! its size.
//!
//! Run: `cargo bench -p peregrine-benches --bench data`. Compared with: the targets
//! (conversion >= 100 MB/s of text per core; opening O(1), so a 50x larger file opens as fast).
//! Conversion is measured end to end as a user runs it: parse, write a temporary file, fsync,
//! rename.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use peregrine_kernels::data::{gen, libsvm, Dataset};

/// A scratch directory, removed when the benchmark ends.
fn scratch() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("peregrine-bench-data-").tempdir().expect("scratch dir")
}

/// Adult as uncompressed LIBSVM text (3.4 MB), written once.
fn adult_text(dir: &Path) -> PathBuf {
    let gz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/adult.libsvm.gz");
    let text = peregrine_kernels::data::text::read_all(&gz).expect("read tests/data/adult.libsvm.gz");
    let p = dir.join("adult.svm");
    std::fs::write(&p, text).expect("write adult text");
    p
}

fn conversion(c: &mut Criterion) {
    let dir_tmp = scratch();
    let dir = dir_tmp.path();
    let input = adult_text(dir);
    let bytes = std::fs::metadata(&input).expect("stat").len();
    let out = dir.join("adult.pgd");
    let mut g = c.benchmark_group("convert");
    g.throughput(Throughput::Bytes(bytes));
    g.sample_size(20);
    g.bench_function("libsvm-adult-3.4MB", |b| {
        b.iter(|| libsvm::convert(black_box(&input), &out, None).expect("convert"))
    });
    g.finish();
}

fn open(c: &mut Criterion) {
    let dir_tmp = scratch();
    let dir = dir_tmp.path();
    let small = dir.join("small.pgd");
    let large = dir.join("large.pgd");
    gen::dense(&gen::DenseSpec { rows: 2_000, cols: 784, classes: 10, noise: 0.1, seed: 1 }, &small)
        .expect("gen small");
    gen::dense(&gen::DenseSpec { rows: 100_000, cols: 784, classes: 10, noise: 0.1, seed: 1 }, &large)
        .expect("gen large");
    let mut g = c.benchmark_group("open");
    for (name, p) in [("dense-6MB", &small), ("dense-300MB", &large)] {
        g.bench_function(name, |b| b.iter(|| Dataset::open(black_box(p)).expect("open").rows()));
    }
    g.finish();
}

criterion_group!(benches, conversion, open);
criterion_main!(benches);
