use std::path::{Path, PathBuf};

use super::*;

/// A scratch directory for one test, removed when it ends (passed or failed).
fn dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-data-{name}-")).tempdir().expect("scratch dir")
}

fn write(d: &Path, name: &str, text: &str) -> PathBuf {
    let p = d.join(name);
    std::fs::write(&p, text).expect("write input");
    p
}

fn no_leftovers(d: &Path, keep: &[&str]) {
    for e in std::fs::read_dir(d).expect("list") {
        let n = e.expect("entry").file_name().into_string().expect("utf8");
        assert!(keep.contains(&n.as_str()), "left behind: {n}");
    }
}

#[test]
fn libsvm_round_trip() {
    let d_tmp = dir("libsvm");
    let d = d_tmp.path();
    let input = write(d, "in.txt", "+1 1:0.5 3:2\n-1 2:1 # comment\n\n0 4:-1.5e2\n1\n");
    let out = d.join("out.pgd");
    let c = libsvm::convert(&input, &out, None).expect("convert");
    assert_eq!(c, Converted { rows: 4, cols: 4, nnz: 4, input_bytes: 44 });
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    let s = ds.sparse().expect("sparse");
    assert_eq!(s.row_ptr, [0, 2, 3, 4, 4]);
    assert_eq!(s.indices, [0, 2, 1, 3]);
    assert_eq!(s.values, [0.5, 2.0, 1.0, -150.0]);
    assert_eq!(s.labels, [1.0, 0.0, 0.0, 1.0]);
    let tail = s.rows(1..3);
    assert_eq!(
        (tail.row_ptr, tail.indices, tail.labels),
        (&[2u64, 3, 4][..], &[1u32, 3][..], &[0.0f32, 0.0][..])
    );
    assert!(ds.sparse().is_ok() && ds.dense().is_err());
    no_leftovers(d, &["in.txt", "out.pgd"]);
    // SVMlight's query ids are read past: the same rows as without them.
    let qid = write(
        d,
        "qid.txt",
        "+1 qid:3 1:0.5 3:2
-1 qid:3 2:1 # comment

0 qid:12 4:-1.5e2
1	qid:1
",
    );
    libsvm::convert(&qid, &d.join("qid.pgd"), None).expect("convert with qid");
    let q = Dataset::open(&d.join("qid.pgd")).expect("open");
    let q = q.sparse().expect("sparse");
    assert_eq!((q.row_ptr, q.indices, q.values, q.labels), (s.row_ptr, s.indices, s.values, s.labels));
}

/// `r` is a parse error of `text` at `line`:`column` saying it `expected` that.
fn assert_located<T: std::fmt::Debug>(r: Result<T>, text: &str, line: u64, column: u64, expected: &str) {
    match r {
        Err(DataError::Parse { line: l, column: c, expected: e, .. }) => {
            assert_eq!((l, c), (line, column), "{text:?}: {e}");
            assert!(e.contains(expected), "{text:?}: `{e}` lacks `{expected}`");
        }
        other => panic!("{text:?}: {other:?}"),
    }
}

#[test]
fn libsvm_errors_name_line_and_column() {
    let d_tmp = dir("libsvm-bad");
    let d = d_tmp.path();
    let cases: &[(&str, u64, u64, &str)] = &[
        ("+1 1:1\nx 1:1\n", 2, 1, "a label"),
        ("+1 0:1\n", 1, 4, "1-based"),
        ("+1 3:1 2:1\n", 1, 8, "indices must increase"),
        ("+1 3:1 3:1\n", 1, 8, "duplicate index 3"),
        ("+1 1:nan\n", 1, 6, "a finite value"),
        ("+1 1:inf\n", 1, 6, "a finite value"),
        ("+1 1:1 2\n", 1, 8, "index:value"),
        ("2 1:1\n", 1, 1, "a binary label"),
        ("+1 a:1\n", 1, 4, "a feature index"),
        ("+1 qid:x 1:1\n", 1, 8, "a query id"),
    ];
    for (i, (text, line, column, expected)) in cases.iter().enumerate() {
        let input = write(d, &format!("bad{i}.txt"), text);
        let out = d.join(format!("bad{i}.pgd"));
        assert_located(libsvm::convert(&input, &out, None), text, *line, *column, expected);
        assert!(!out.exists(), "a failed conversion left {}", out.display());
    }
    let err = libsvm::convert(&write(d, "x.txt", "+1 9:1\n"), &d.join("x.pgd"), Some(4))
        .expect_err("beyond --features");
    assert!(err.to_string().contains("beyond --features 4"), "{err}");
}

#[test]
fn ratings_with_header_and_separators() {
    let d_tmp = dir("ratings");
    let d = d_tmp.path();
    let input = write(
        d,
        "r.txt",
        "user_id:token\titem_id:token\trating:float\n1\t2\t3.5\t881250949\n3::1::5\n2,2,1\n0 0 4\n",
    );
    let out = d.join("r.pgd");
    ratings::convert(&input, &out).expect("convert");
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    let r = ds.ratings().expect("ratings");
    assert_eq!(
        (r.users, r.items, r.ratings),
        (&[1u32, 3, 2, 0][..], &[2u32, 1, 2, 0][..], &[3.5f32, 5.0, 1.0, 4.0][..])
    );
    assert_eq!((r.n_users, r.n_items), (4, 3));
    let bad = write(d, "bad.txt", "1 2 3\n1 x 3\n");
    match ratings::convert(&bad, &d.join("bad.pgd")) {
        Err(DataError::Parse { line: 2, column: 3, .. }) => {}
        other => panic!("{other:?}"),
    }
    let short = write(d, "short.txt", "1 2\n");
    assert!(matches!(ratings::convert(&short, &d.join("s.pgd")), Err(DataError::Parse { line: 1, .. })));
}

fn idx_files(d: &Path, n: u32, magic: u32, labels: &[u8]) -> (PathBuf, PathBuf) {
    let mut img = Vec::new();
    img.extend_from_slice(&magic.to_be_bytes());
    img.extend_from_slice(&n.to_be_bytes());
    img.extend_from_slice(&2u32.to_be_bytes());
    img.extend_from_slice(&2u32.to_be_bytes());
    for i in 0..n * 4 {
        img.push((i * 17 % 256) as u8);
    }
    let mut lab = Vec::new();
    lab.extend_from_slice(&0x801u32.to_be_bytes());
    lab.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    lab.extend_from_slice(labels);
    let (pi, pl) = (d.join("img.idx"), d.join("lab.idx"));
    std::fs::write(&pi, img).expect("write");
    std::fs::write(&pl, lab).expect("write");
    (pi, pl)
}

#[test]
fn idx_counts_whose_product_overflows_are_errors() {
    // Found by fuzzing: images x rows x cols beyond 64 bits.
    let d_tmp = dir("idx-overflow");
    let d = d_tmp.path();
    let mut img = Vec::new();
    for w in [0x803u32, u32::MAX, u32::MAX, u32::MAX] {
        img.extend_from_slice(&w.to_be_bytes());
    }
    let (pi, pl) = (d.join("img.idx"), d.join("lab.idx"));
    std::fs::write(&pi, img).expect("write");
    std::fs::write(&pl, [0, 0, 8, 1, 0, 0, 0, 0]).expect("write");
    let e = idx::convert(&pi, &pl, &d.join("out.pgd")).expect_err("overflow");
    assert!(e.to_string().contains("needs more bytes than an address holds"), "{e}");
    no_leftovers(d, &["img.idx", "lab.idx"]);
}

#[test]
fn idx_plain_and_gzipped() {
    use std::io::Write;
    let d_tmp = dir("idx");
    let d = d_tmp.path();
    let (pi, pl) = idx_files(d, 3, 0x803, &[0, 2, 1]);
    // Gzip the labels: detected by content.
    let raw = std::fs::read(&pl).expect("read");
    let gz = d.join("lab.idx.gz");
    let mut enc = flate2::write::GzEncoder::new(
        std::fs::File::create(&gz).expect("create"),
        flate2::Compression::fast(),
    );
    enc.write_all(&raw).expect("gzip");
    enc.finish().expect("gzip");
    let out = d.join("m.pgd");
    idx::convert(&pi, &gz, &out).expect("convert");
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    let m = ds.dense().expect("dense");
    assert_eq!((m.cols, m.classes, m.labels), (4, 3, &[0u32, 2, 1][..]));
    assert_eq!(m.features[1], 17.0 / 255.0);
    assert_eq!(m.rows(2..3).features, &m.features[8..12]);

    let (pi, pl) = idx_files(d, 3, 0x801, &[0, 2, 1]);
    let e = idx::convert(&pi, &pl, &d.join("x.pgd")).expect_err("wrong magic");
    assert!(e.to_string().contains("wrong IDX magic"), "{e}");
    let (pi, pl) = idx_files(d, 3, 0x803, &[0, 2]);
    assert!(idx::convert(&pi, &pl, &d.join("x.pgd"))
        .expect_err("count")
        .to_string()
        .contains("3 images but"));
    let (pi, pl) = idx_files(d, 3, 0x803, &[0, 2, 1]);
    let mut img = std::fs::read(&pi).expect("read");
    img.truncate(img.len() - 1);
    std::fs::write(&pi, img).expect("write");
    assert!(idx::convert(&pi, &pl, &d.join("x.pgd")).expect_err("truncated").to_string().contains("needs"));
    assert!(!d.join("x.pgd").exists());
}

#[test]
fn corrupt_files_are_refused() {
    let d_tmp = dir("corrupt");
    let d = d_tmp.path();
    let input = write(d, "in.txt", "+1 1:1 2:1\n-1 2:3\n");
    let out = d.join("ok.pgd");
    libsvm::convert(&input, &out, None).expect("convert");
    let good = std::fs::read(&out).expect("read");
    let case = |name: &str, bytes: Vec<u8>, expect: &str| {
        let p = d.join(name);
        std::fs::write(&p, bytes).expect("write");
        let e = Dataset::open(&p).and_then(|ds| ds.verify()).expect_err(name);
        assert!(e.to_string().contains(expect), "{name}: {e}");
    };
    case("short.pgd", good[..100].to_vec(), "truncated");
    case("cut.pgd", good[..good.len() - 8].to_vec(), "truncated");
    let mut m = good.clone();
    m[0] = b'X';
    case("magic.pgd", m, "not a Peregrine dataset");
    case(
        "text.pgd",
        b"+1 1:0.5 3:2\n-1 2:1\n".to_vec(),
        "convert it first with `peregrine data convert libsvm`",
    );
    case("gz.pgd", vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3], "gzip-compressed");
    let mut m = good.clone();
    m[16] ^= 1;
    case("header.pgd", m, "header checksum");
    let mut m = good.clone();
    let last = m.len() - 60;
    m[last] ^= 0x40;
    case("data.pgd", m, "data checksum");
    case("empty.pgd", Vec::new(), "not a Peregrine dataset");
}

/// A dataset's bytes with `cols` replaced and the header checksum recomputed: a valid header
/// over data that contradicts it.
fn with_cols(bytes: &[u8], cols: u64) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[24..32].copy_from_slice(&cols.to_le_bytes());
    let crc = crc32fast::hash(&b[..156]);
    b[156..160].copy_from_slice(&crc.to_le_bytes());
    b
}

/// A dataset's bytes with the header field at `at` replaced by `value` and the header checksum
/// recomputed.
fn with_field(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + value.len()].copy_from_slice(value);
    let crc = crc32fast::hash(&b[..156]);
    b[156..160].copy_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn counts_that_size_a_model_are_bounded_in_the_header() {
    let d_tmp = dir("bounds");
    let d = d_tmp.path();
    let dense = d.join("dense.pgd");
    csv::convert(&write(d, "in.csv", "a,b,label\n1,2,0\n3,4,1\n"), &dense, &csv::CsvOptions::default())
        .expect("convert");
    let good = std::fs::read(&dense).expect("read");
    let open = |name: &str, bytes: Vec<u8>| {
        let p = d.join(name);
        std::fs::write(&p, bytes).expect("write");
        Dataset::open(&p).map(drop)
    };
    // Classes: 65536 is the most (labels 0..65535); one more, or 2^32 - 1, is refused by name.
    open("most.pgd", with_field(&good, 40, &MAX_CLASSES.to_le_bytes())).expect("65536 classes");
    for classes in [MAX_CLASSES + 1, u32::MAX] {
        let e = open("classes.pgd", with_field(&good, 40, &classes.to_le_bytes())).expect_err("refused");
        let e = e.to_string();
        assert!(e.contains("header field `classes`") && e.contains(&classes.to_string()), "{e}");
    }
    // Features past 32-bit ids (a dense file of no rows has no values to bound them).
    let mut none = with_field(&good, 16, &0u64.to_le_bytes());
    none = with_field(&none, 32, &0u64.to_le_bytes());
    let e = open("cols.pgd", with_field(&none, 24, &(MAX_IDS + 1).to_le_bytes())).expect_err("refused");
    assert!(e.to_string().contains("header field `cols`"), "{e}");
    // The writer refuses such counts before it creates anything.
    let shape = Shape {
        kind: Kind::Dense,
        rows: 1,
        cols: 1,
        nnz: 0,
        classes: MAX_CLASSES + 1,
        users: 0,
        truth: Truth::None,
        scaled: false,
    };
    let e = Writer::create(&d.join("w.pgd"), shape).expect_err("refused");
    assert!(e.to_string().contains("header field `classes`"), "{e}");
    no_leftovers(d, &["in.csv", "dense.pgd", "most.pgd", "classes.pgd", "cols.pgd"]);
}

#[test]
fn datasets_modified_in_place_are_told_from_replaced_ones() {
    let d_tmp = dir("modified");
    let d = d_tmp.path();
    let s = gen::SparseSpec { rows: 100, cols: 20, nnz_per_row: 3, zipf: 0.0, seed: 1 };
    gen::sparse(&s, &d.join("a.pgd")).expect("gen");
    gen::sparse(&s, &d.join("b.pgd")).expect("gen");
    let a = Dataset::open(&d.join("a.pgd")).expect("open");
    let b = Dataset::open(&d.join("b.pgd")).expect("open");
    let ours = |d: &Path| -> Vec<String> {
        let prefix = d.display().to_string();
        guard::modified().into_iter().filter(|m| m.starts_with(&prefix)).collect()
    };
    assert!(ours(d).is_empty(), "{:?}", ours(d));
    // a.pgd rewritten in place (a longer file); b.pgd replaced by a new file renamed over it.
    let mut f = std::fs::OpenOptions::new().append(true).open(d.join("a.pgd")).expect("open for append");
    std::io::Write::write_all(&mut f, &[0; 64]).expect("append");
    gen::sparse(&gen::SparseSpec { seed: 2, ..s }, &d.join("b.pgd")).expect("gen over it");
    let m = ours(d);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].contains("a.pgd") && m[0].contains("length went from"), "{m:?}");
    drop((a, b));
    assert!(ours(d).is_empty(), "closed datasets are not listed");
}

#[test]
fn rows_are_checked_by_range_and_the_checksum_by_parts() {
    let d_tmp = dir("check");
    let d = d_tmp.path();
    let s = gen::SparseSpec { rows: 300, cols: 50, nnz_per_row: 5, zipf: 0.0, seed: 3 };
    gen::sparse(&s, &d.join("g.pgd")).expect("gen");
    let ds = Dataset::open(&d.join("g.pgd")).expect("open");
    for parts in 1..=7 {
        let crcs: Vec<(u32, u64)> = (0..parts).map(|p| ds.crc_part(p, parts)).collect();
        let total: u64 = ds.header().sections.iter().map(|[_, len]| len).sum();
        assert_eq!(crcs.iter().map(|c| c.1).sum::<u64>(), total, "the parts tile the data");
        assert_eq!(combine_crcs(&crcs), ds.data_crc(), "{parts} parts");
    }
    for w in 1..=4 {
        for r in 0..w {
            ds.check_rows(shard(300, r, w)).expect("a generated file is sound");
        }
    }

    // A header saying fewer columns than the indices use (checksum recomputed): opens, and the
    // rows holding an index beyond it are refused.
    let input = write(d, "in.txt", "+1 1:1 2:1\n-1 2:3\n0 5:1\n1 1:2\n");
    libsvm::convert(&input, &d.join("ok.pgd"), None).expect("convert");
    let good = std::fs::read(d.join("ok.pgd")).expect("read");
    for cols in [0, 1] {
        let p = d.join(format!("cols{cols}.pgd"));
        std::fs::write(&p, with_cols(&good, cols)).expect("write");
        let ds = Dataset::open(&p).expect("the header alone is valid");
        let e = ds.check_rows(0..4).expect_err("indices beyond cols");
        assert!(e.to_string().contains(&format!("row 0: index 1 beyond {cols} features")), "{e}");
        assert!(ds.verify().is_err());
    }
    let p = d.join("cols2.pgd");
    std::fs::write(&p, with_cols(&good, 2)).expect("write");
    let ds = Dataset::open(&p).expect("open");
    ds.check_rows(0..2).expect("rows 0 and 1 use features 0 and 1");
    let e = ds.check_rows(2..4).expect_err("row 2 uses feature 4");
    assert!(e.to_string().contains("row 2: index 4 beyond 2 features"), "{e}");

    // A value that is not a number (the rows above: values 1 1 3 1 2): named by its row and
    // feature, in the rows that hold it only.
    let header: format::Header = bytemuck::pod_read_unaligned(&good[..format::HEADER_BYTES]);
    let [off, _] = header.sections[2];
    let mut nan = good.clone();
    nan[off as usize + 8..off as usize + 12].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(d.join("nan.pgd"), &nan).expect("write");
    let ds = Dataset::open(&d.join("nan.pgd")).expect("open");
    ds.check_rows(0..1).expect("row 0 holds values 0 and 1");
    let e = ds.check_rows(0..4).expect_err("value 2 is NaN");
    assert!(e.to_string().contains("row 1: feature 1 is NaN (not finite)"), "{e}");

    // A flipped index byte: only the range holding its row is refused; the checksum of the
    // parts no longer matches.
    let mut bad = std::fs::read(d.join("g.pgd")).expect("read");
    let header: format::Header = bytemuck::pod_read_unaligned(&bad[..format::HEADER_BYTES]);
    let [off, len] = header.sections[1];
    let at = (off + len * 3 / 4) as usize / 4 * 4;
    bad[at + 3] = 0x7f;
    std::fs::write(d.join("bad.pgd"), &bad).expect("write");
    let ds = Dataset::open(&d.join("bad.pgd")).expect("open: O(1) checks only");
    let failed: Vec<usize> = (0..4).filter(|&r| ds.check_rows(shard(300, r, 4)).is_err()).collect();
    assert_eq!(failed, [2], "only the quarter holding the flipped index");
    let crcs: Vec<(u32, u64)> = (0..3).map(|p| ds.crc_part(p, 3)).collect();
    let e = ds.check_crc(combine_crcs(&crcs)).expect_err("checksum");
    assert!(e.to_string().contains("data checksum mismatch"), "{e}");
}

#[test]
fn generators_are_seeded_and_hold_their_truth() {
    let d_tmp = dir("gen");
    let d = d_tmp.path();
    let s = gen::SparseSpec { rows: 500, cols: 1000, nnz_per_row: 10, zipf: 1.1, seed: 7 };
    gen::sparse(&s, &d.join("a.pgd")).expect("gen");
    gen::sparse(&s, &d.join("b.pgd")).expect("gen");
    assert_eq!(std::fs::read(d.join("a.pgd")).expect("a"), std::fs::read(d.join("b.pgd")).expect("b"));
    let ds = Dataset::open(&d.join("a.pgd")).expect("open");
    ds.verify().expect("verify");
    let rows = ds.sparse().expect("sparse");
    // Power law: feature 0 is far more frequent than feature 500.
    let count = |j: u32| rows.indices.iter().filter(|&&i| i == j).count();
    assert!(count(0) > 10 * count(500).max(1), "{} vs {}", count(0), count(500));
    // Labels follow the true model: the margin of positives is higher on average.
    let w = ds.truth().expect("truth");
    let margin = |r: usize| -> f32 { rows.rows(r..r + 1).indices.iter().map(|&j| w[j as usize]).sum() };
    let (mut pos, mut neg) = ((0.0, 0), (0.0, 0));
    for r in 0..rows.len() {
        if rows.labels[r] > 0.5 {
            pos = (pos.0 + margin(r), pos.1 + 1);
        } else {
            neg = (neg.0 + margin(r), neg.1 + 1);
        }
    }
    assert!(pos.0 / pos.1 as f32 > neg.0 / neg.1 as f32 + 0.5);

    gen::dense(&gen::DenseSpec { rows: 200, cols: 16, classes: 4, noise: 0.1, seed: 1 }, &d.join("d.pgd"))
        .expect("gen");
    let ds = Dataset::open(&d.join("d.pgd")).expect("open");
    ds.verify().expect("verify");
    assert_eq!(ds.truth().expect("truth").len(), 64);
    let dr = ds.dense().expect("dense");
    assert!((0..4).all(|c| dr.labels.contains(&c)), "every class appears");

    // One-hot pairs: a user and an item a row, popular ids far more frequent, labels following
    // the true leanings.
    let os = gen::OnehotSpec { rows: 4000, users: 300, items: 500, zipf: 1.0, noise: 0.5, seed: 3 };
    gen::onehot(&os, &d.join("o.pgd")).expect("gen");
    gen::onehot(&os, &d.join("o2.pgd")).expect("gen");
    assert_eq!(std::fs::read(d.join("o.pgd")).expect("o"), std::fs::read(d.join("o2.pgd")).expect("o2"));
    let ds = Dataset::open(&d.join("o.pgd")).expect("open");
    ds.verify().expect("verify");
    let rows = ds.sparse().expect("sparse");
    assert_eq!((rows.len(), rows.indices.len(), ds.header().cols), (4000, 8000, 800));
    for r in 0..rows.len() {
        let ids = rows.rows(r..r + 1).indices;
        assert!(ids.len() == 2 && ids[0] < 300 && (300..800).contains(&ids[1]), "row {r}: {ids:?}");
    }
    let count = |j: u32| rows.indices.iter().filter(|&&i| i == j).count();
    assert!(count(0) > 10 * count(250).max(1) && count(300) > 10 * count(750).max(1));
    let w = ds.truth().expect("truth");
    let margin = |r: usize| -> f32 { rows.rows(r..r + 1).indices.iter().map(|&j| w[j as usize]).sum() };
    let mean = |label: f32| {
        let m: Vec<f32> = (0..rows.len()).filter(|&r| rows.labels[r] == label).map(margin).collect();
        m.iter().sum::<f32>() / m.len() as f32
    };
    assert!(mean(1.0) > mean(0.0) + 0.5, "{} vs {}", mean(1.0), mean(0.0));
    let bad = gen::OnehotSpec { noise: f64::NAN, ..os };
    assert!(gen::onehot(&bad, &d.join("bad.pgd")).is_err() && !d.join("bad.pgd").exists());
    let huge = gen::OnehotSpec { users: u64::from(u32::MAX), items: 2, ..os };
    assert!(gen::onehot(&huge, &d.join("bad.pgd")).is_err());

    let rs = gen::RatingsSpec { rows: 1000, users: 50, items: 40, rank: 3, noise: 0.1, seed: 2 };
    gen::ratings(&rs, &d.join("r.pgd")).expect("gen");
    let ds = Dataset::open(&d.join("r.pgd")).expect("open");
    ds.verify().expect("verify");
    let r = ds.ratings().expect("ratings");
    assert_eq!((r.n_users, r.n_items, r.len()), (50, 40, 1000));
    assert!(r.ratings.iter().all(|&x| (1.0..=5.0).contains(&x)));
    assert_eq!(ds.truth().expect("truth").len(), 90 * 3);
}

#[test]
fn shards_and_chunks_tile_the_rows() {
    for world in 1..6 {
        let mut next = 0;
        for rank in 0..world {
            let s = shard(23, rank, world);
            assert_eq!(s.start, next);
            next = s.end;
            let c: Vec<_> = chunks(s.clone(), 4).collect();
            assert_eq!(c.first().map_or(s.start, |r| r.start), s.start);
            assert!(c.windows(2).all(|w| w[0].end == w[1].start));
            assert_eq!(c.last().map_or(s.end, |r| r.end), s.end);
        }
        assert_eq!(next, 23);
    }
}

#[test]
fn csv_with_header_quotes_and_named_classes() {
    use super::csv::{self, CsvConverted, CsvOptions, Header, LabelColumn};
    let d_tmp = dir("csv");
    let d = d_tmp.path();
    // A header (a non-numeric field), a quoted number, a blank line, CRLF, labels as words.
    let input = write(d, "in.csv", "age,\"income\",label\r\n30,5.5,no\r\n41,\"7.25\",yes\n\n22,3e0,no\n");
    let out = d.join("out.pgd");
    let c = csv::convert(&input, &out, &CsvOptions::default()).expect("convert");
    let want = CsvConverted {
        rows: 3,
        cols: 2,
        label: (3, Some("label".into())),
        classes: vec!["no".into(), "yes".into()],
    };
    assert_eq!(c, want);
    let ds = Dataset::open(&out).expect("open");
    ds.verify().expect("verify");
    let x = ds.dense().expect("dense");
    assert_eq!(
        (x.features, x.labels, x.cols, x.classes),
        (&[30.0, 5.5, 41.0, 7.25, 22.0, 3.0][..], &[0u32, 1, 0][..], 2, 2)
    );
    // No header, the label first by number, whole-number labels kept as classes.
    let input = write(d, "plain.csv", "2,1.5,-1\n0,2.5,4\n1,0,0\n");
    let opts = CsvOptions { label: LabelColumn::Number(1), ..CsvOptions::default() };
    let c = csv::convert(&input, &d.join("plain.pgd"), &opts).expect("convert");
    assert_eq!((c.label, c.classes.len()), ((1, None), 3));
    let ds = Dataset::open(&d.join("plain.pgd")).expect("open");
    let x = ds.dense().expect("dense");
    assert_eq!((x.features, x.labels), (&[1.5, -1.0, 2.5, 4.0, 0.0, 0.0][..], &[2u32, 0, 1][..]));
    // Tab-separated, the label named, a header forced.
    let input = write(d, "t.tsv", "f\ty\tg\n1\ta\t2\n3\tb\t4\n");
    let opts = CsvOptions { delimiter: b'\t', header: Header::Yes, label: LabelColumn::Name("y".into()) };
    let c = csv::convert(&input, &d.join("t.pgd"), &opts).expect("convert");
    assert_eq!((c.cols, c.label.0, c.classes), (2, 2, vec!["a".to_string(), "b".to_string()]));
    let ds = Dataset::open(&d.join("t.pgd")).expect("open");
    assert_eq!(ds.dense().expect("dense").features, &[1.0, 2.0, 3.0, 4.0]);
    no_leftovers(d, &["in.csv", "out.pgd", "plain.csv", "plain.pgd", "t.tsv", "t.pgd"]);
}

#[test]
fn csv_errors_name_line_and_column_and_write_nothing() {
    use super::csv::{self, CsvOptions, LabelColumn};
    let d_tmp = dir("csv-bad");
    let d = d_tmp.path();
    let located: &[(&str, u64, u64, &str)] = &[
        ("a,b,y\n1,2,0\n3,,1\n", 3, 3, "a number in column 2 (`b`); this value is missing"),
        ("a,b,y\n1,2,0\n3,NA,1\n", 3, 3, "this value is missing"),
        ("1,2,0\n3,x,1\n", 2, 3, "a number in column 2"),
        ("1,2,0\n3,inf,1\n", 2, 3, "a number in column 2"),
        ("1,2,0\n3,4\n", 2, 4, "3 fields, as on the first line (found 2)"),
        ("1,2,0\n3,4,5,6\n", 2, 7, "3 fields"),
        ("1,2,0\n3,\"4,1\n", 2, 3, "a closing quote"),
        ("a,b,y\n1,2,0\n3,4,\n", 3, 5, "a label (this one is missing)"),
    ];
    for (i, (text, line, column, expected)) in located.iter().enumerate() {
        let input = write(d, &format!("bad{i}.csv"), text);
        let out = d.join(format!("bad{i}.pgd"));
        assert_located(csv::convert(&input, &out, &CsvOptions::default()), text, *line, *column, expected);
        assert!(!out.exists(), "a failed conversion left {}", out.display());
    }
    let whole: &[(&str, CsvOptions, &str)] = &[
        ("a,b,y\n", CsvOptions::default(), "no data rows"),
        ("1,0\n2,0\n", CsvOptions::default(), "one class only"),
        (
            "1,2,0\n",
            CsvOptions { label: LabelColumn::Name("y".into()), ..CsvOptions::default() },
            "not a header",
        ),
        (
            "a,b,y\n1,2,0\n",
            CsvOptions { label: LabelColumn::Name("z".into()), ..CsvOptions::default() },
            "no column `z` in the header (a, b, y)",
        ),
        (
            "1,2,0\n",
            CsvOptions { label: LabelColumn::Number(4), ..CsvOptions::default() },
            "label column 4 does not exist",
        ),
    ];
    for (i, (text, opts, expected)) in whole.iter().enumerate() {
        let input = write(d, &format!("whole{i}.csv"), text);
        let e = csv::convert(&input, &d.join(format!("whole{i}.pgd")), opts).expect_err(text).to_string();
        assert!(e.contains(expected), "{text:?}: `{e}` lacks `{expected}`");
        assert!(e.contains(&format!("whole{i}.csv")), "{e} does not name the file");
    }
    let names: Vec<String> = (0..located.len())
        .map(|i| format!("bad{i}.csv"))
        .chain((0..whole.len()).map(|i| format!("whole{i}.csv")))
        .collect();
    no_leftovers(d, &names.iter().map(String::as_str).collect::<Vec<_>>());
}

/// A UTF-8 byte-order mark at the start of a text file (Excel's "CSV UTF-8", Notepad) is not
/// text: a headerless CSV keeps its first row, a header's first name is found by `--label`, and
/// the other readers read the first line as they read the rest; columns count after it.
#[test]
fn a_byte_order_mark_is_dropped_by_every_text_reader() {
    use super::csv::{self, CsvOptions, LabelColumn};
    let d_tmp = dir("bom");
    let d = d_tmp.path();
    let bom = "\u{feff}";
    // Headerless: three rows, not a header and two rows.
    let input = write(d, "plain.csv", &format!("{bom}1.5,2,0\n3,4,1\n5,6,1\n"));
    let c = csv::convert(&input, &d.join("plain.pgd"), &CsvOptions::default()).expect("convert");
    assert_eq!((c.rows, c.label.1), (3, None));
    let ds = Dataset::open(&d.join("plain.pgd")).expect("open");
    assert_eq!(ds.dense().expect("dense").features, &[1.5, 2.0, 3.0, 4.0, 5.0, 6.0]);
    // A header whose first name is the label.
    let input = write(d, "named.csv", &format!("{bom}a,b\nx,1\ny,2\n"));
    let opts = CsvOptions { label: LabelColumn::Name("a".into()), ..CsvOptions::default() };
    let c = csv::convert(&input, &d.join("named.pgd"), &opts).expect("--label a");
    assert_eq!((c.rows, c.label), (2, (1, Some("a".to_owned()))));
    // A fault on the first line is placed after the mark.
    let input = write(d, "bad.svm", &format!("{bom}+1 1:x\n"));
    assert_located(libsvm::parse(&input), "+1 1:x", 1, 6, "");
    // LIBSVM, ratings (headerless: no row lost), LDA-C and docword.
    let input = write(d, "in.svm", &format!("{bom}+1 1:0.5\n-1 2:1\n"));
    let s = libsvm::parse(&input).expect("libsvm");
    assert_eq!((s.labels, s.indices), (vec![1.0, 0.0], vec![0, 1]));
    let input = write(d, "r.txt", &format!("{bom}1 2 3.5\n0 1 4\n"));
    ratings::convert(&input, &d.join("r.pgd")).expect("ratings");
    let ds = Dataset::open(&d.join("r.pgd")).expect("open");
    assert_eq!(ds.ratings().expect("ratings").ratings, &[3.5, 4.0]);
    let input = write(d, "in.ldac", &format!("{bom}2 0:1 3:2\n1 1:4\n"));
    assert_eq!(bow::parse(&input, bow::Format::Ldac).expect("lda-c").values, vec![1.0, 2.0, 4.0]);
    let input = write(d, "docword.txt", &format!("{bom}2\n3\n2\n1 1 2\n2 3 1\n"));
    assert_eq!(bow::parse(&input, bow::Format::Docword).expect("docword").row_ptr, vec![0, 1, 2]);
}

/// Labels that are numbers but not the classes `0..65535` themselves are numbered by value, not
/// as text (`-1, 2, 10, 100`, not `-1, 10, 100, 2`), up to 65,536 distinct labels; more is an
/// error naming the file and the count, with nothing written.
#[test]
fn csv_numeric_labels_are_ordered_by_value_and_classes_are_bounded() {
    use super::csv::{self, CsvOptions, MAX_CLASSES};
    let d_tmp = dir("csv-classes");
    let d = d_tmp.path();
    let input = write(d, "signed.csv", "1,100\n2,-1\n3,10\n4,2\n5,10\n6,2.5\n");
    let c = csv::convert(&input, &d.join("signed.pgd"), &CsvOptions::default()).expect("convert");
    assert_eq!(c.classes, ["-1", "2", "2.5", "10", "100"]);
    let ds = Dataset::open(&d.join("signed.pgd")).expect("open");
    assert_eq!(ds.dense().expect("dense").labels, &[4, 0, 3, 1, 3, 2]);
    // As many classes as allowed, by even labels up to 131,070: class k is label 2k.
    let text: String = (0..MAX_CLASSES).map(|i| format!("{i},{}\n", 2 * i)).collect();
    let input = write(d, "even.csv", &text);
    let c = csv::convert(&input, &d.join("even.pgd"), &CsvOptions::default()).expect("convert");
    assert_eq!(c.classes.len(), MAX_CLASSES);
    assert_eq!((&c.classes[5][..], &c.classes[MAX_CLASSES - 1][..]), ("10", "131070"));
    let ds = Dataset::open(&d.join("even.pgd")).expect("open");
    assert!(ds.dense().expect("dense").labels.iter().enumerate().all(|(i, &y)| y as usize == i));
    // One more distinct label: refused.
    let text: String = (0..=MAX_CLASSES).map(|i| format!("1,{i}\n")).collect();
    let input = write(d, "many.csv", &text);
    let e = csv::convert(&input, &d.join("many.pgd"), &CsvOptions::default()).expect_err("too many");
    let e = e.to_string();
    assert!(e.contains("many.csv") && e.contains("65537 distinct labels") && e.contains("65536"), "{e}");
    no_leftovers(d, &["signed.csv", "signed.pgd", "even.csv", "even.pgd", "many.csv"]);
}
