//! Converting the real datasets (and checking what comes out), through the library and the
//! figures every user of these datasets knows.
//!
//! Adult and heart_scale ship in tests/data. Fashion-MNIST comes from Debian's
//! `dataset-fashion-mnist` (`$PEREGRINE_FASHION_MNIST`, default /usr/share/datasets/fashion-mnist)
//! and MovieLens-100k from the PyPI wheel `recbole==1.2.1` (`$PEREGRINE_ML100K` names the
//! extracted `ml-100k.inter`); `scripts/test.sh` installs and fetches both. A missing dataset is a
//! failure that says how to get it, not a skipped test.

use std::path::{Path, PathBuf};

use peregrine_kernels::data::{idx, libsvm, ratings, Dataset, Kind};

fn repo_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("peregrine-datasets-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

#[test]
fn adult() {
    let d = scratch("adult");
    let out = d.join("adult.prg");
    let c = libsvm::convert(&repo_data("adult.libsvm.gz"), &out, None).expect("convert adult");
    assert_eq!((c.rows, c.cols, c.nnz), (48_842, 122, 683_788));
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    let s = ds.sparse().expect("sparse");
    let positive = s.labels.iter().filter(|&&y| y == 1.0).count() as f64 / s.len() as f64;
    assert!((0.23..0.25).contains(&positive), "positive fraction {positive}");
    assert!(s.values.iter().all(|&v| v == 1.0), "one-hot data");
}

#[test]
fn heart_scale() {
    let d = scratch("heart");
    let out = d.join("heart.prg");
    let c = libsvm::convert(&repo_data("heart_scale"), &out, None).expect("convert heart_scale");
    assert_eq!((c.rows, c.cols), (270, 13));
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    assert!(ds.sparse().expect("sparse").values.iter().all(|v| (-1.0..=1.0).contains(v)));
}

#[test]
fn fashion_mnist() {
    let dir = std::env::var("PEREGRINE_FASHION_MNIST")
        .unwrap_or_else(|_| "/usr/share/datasets/fashion-mnist".into());
    let dir = Path::new(&dir);
    assert!(
        dir.join("train-images-idx3-ubyte.gz").exists(),
        "Fashion-MNIST not found in {}: `apt-get install dataset-fashion-mnist` (scripts/test.sh does)",
        dir.display()
    );
    let d = scratch("fmnist");
    for (split, n) in [("train", 60_000), ("t10k", 10_000)] {
        let out = d.join(format!("{split}.prg"));
        idx::convert(
            &dir.join(format!("{split}-images-idx3-ubyte.gz")),
            &dir.join(format!("{split}-labels-idx1-ubyte.gz")),
            &out,
        )
        .expect("convert Fashion-MNIST");
        let ds = Dataset::open(&out).expect("open");
        ds.verify().expect("verify");
        let m = ds.dense().expect("dense");
        assert_eq!((m.len(), m.cols, m.classes), (n, 784, 10));
        // Balanced: every class has exactly a tenth of the images.
        for c in 0..10 {
            assert_eq!(m.labels.iter().filter(|&&y| y == c).count(), n / 10, "class {c}");
        }
        assert!(m.features.iter().all(|v| (0.0..=1.0).contains(v)));
    }
}

#[test]
fn movielens_100k() {
    let path = std::env::var("PEREGRINE_ML100K").unwrap_or_default();
    assert!(
        !path.is_empty() && Path::new(&path).exists(),
        "MovieLens-100k not found (PEREGRINE_ML100K={path:?}): scripts/test.sh fetches it from the PyPI wheel recbole==1.2.1"
    );
    let d = scratch("ml100k");
    let out = d.join("ml.prg");
    ratings::convert(Path::new(&path), &out).expect("convert MovieLens");
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    assert_eq!(ds.kind(), Kind::Ratings);
    let r = ds.ratings().expect("ratings");
    assert_eq!((r.len(), r.n_users, r.n_items), (100_000, 944, 1683), "1-based ids: 943 users, 1682 items");
    assert!(r.ratings.iter().all(|&x| (1.0..=5.0).contains(&x) && x.fract() == 0.0));
    let users: std::collections::HashSet<u32> = r.users.iter().copied().collect();
    assert_eq!(users.len(), 943);
}
