use super::*;
use crate::data::Dataset;

/// A `.npy` file as `numpy.save` writes it (version 1.0, header padded to 64 bytes).
fn npy(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    let mut h = dict.into_bytes();
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(b' ');
    }
    h.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write");
    p
}

#[test]
fn c_and_fortran_order_give_the_same_dataset() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    // 3 rows x 2 features; labels int64 and bool.
    let x = write(d, "x.npy", &npy("<f4", false, "(3, 2)", &f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])));
    let xf = write(
        d,
        "xf.npy",
        &npy(
            "<f8",
            true,
            "(3, 2)",
            &[1.0f64, 3.0, 5.0, 2.0, 4.0, 6.0].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(),
        ),
    );
    let y = write(
        d,
        "y.npy",
        &npy("<i8", false, "(3,)", &[2i64, 0, 1].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()),
    );
    for (xs, name) in [(&x, "c.pgd"), (&xf, "f.pgd")] {
        let out = d.join(name);
        let c = convert(xs, &y, &out).expect("convert");
        assert_eq!((c.rows, c.cols, c.classes), (3, 2, 3));
        let ds = Dataset::open(&out).expect("open");
        let rows = ds.dense().expect("dense");
        assert_eq!(rows.features, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(rows.labels, &[2, 0, 1]);
    }
    assert_eq!(convert(&xf, &y, &d.join("t.pgd")).expect("convert").dtypes, ("float64", "int64"));
    // Bool labels, (rows, 1) labels, uint8 features, one feature column.
    let x1 = write(d, "x1.npy", &npy("|u1", false, "(4,)", &[0, 255, 7, 1]));
    let yb = write(d, "yb.npy", &npy("|b1", false, "(4, 1)", &[1, 0, 0, 1]));
    let c = convert(&x1, &yb, &d.join("b.pgd")).expect("convert");
    assert_eq!((c.cols, c.classes), (1, 2));
    let ds = Dataset::open(&d.join("b.pgd")).expect("open");
    assert_eq!(ds.dense().expect("dense").features, &[0.0, 255.0, 7.0, 1.0]);
    // Negative int16 values keep their sign.
    let xn = write(d, "xn.npy", &npy("<i2", false, "(2, 1)", &[0xFF, 0xFF, 0x02, 0x00]));
    let y2 = write(d, "y2.npy", &npy("<u4", false, "(2,)", &[0, 0, 0, 0, 1, 0, 0, 0]));
    convert(&xn, &y2, &d.join("n.pgd")).expect("convert");
    let ds = Dataset::open(&d.join("n.pgd")).expect("open");
    assert_eq!(ds.dense().expect("dense").features, &[-1.0, 2.0]);
}

#[test]
fn malformed_arrays_are_errors_naming_what_and_where() {
    let tmp = tempfile::tempdir().expect("tmp");
    let d = tmp.path();
    let x = write(d, "x.npy", &npy("<f4", false, "(2, 2)", &f32s(&[1.0, 2.0, 3.0, 4.0])));
    let y = write(d, "y.npy", &npy("<i4", false, "(2,)", &[0, 0, 0, 0, 1, 0, 0, 0]));
    let cases: Vec<(std::path::PathBuf, std::path::PathBuf, &str)> = vec![
        (write(d, "text.npy", b"1,2\n3,4\n"), y.clone(), "not a NumPy .npy file"),
        (write(d, "v9.npy", b"\x93NUMPY\x09\x00\x10\x00{}"), y.clone(), "format version 9.0"),
        (write(d, "be.npy", &npy(">f4", false, "(2, 2)", &[0; 16])), y.clone(), "big-endian"),
        (write(d, "f2.npy", &npy("<f2", false, "(2, 2)", &[0; 8])), y.clone(), "float16"),
        (write(d, "obj.npy", &npy("|O", false, "(2, 2)", &[0; 32])), y.clone(), "not a plain numeric type"),
        // Found by fuzzing: a dtype starting with a multi-byte character.
        (
            write(d, "utf8.npy", &npy("\u{e9}f4", false, "(2, 2)", &[0; 32])),
            y.clone(),
            "not a plain numeric type",
        ),
        (
            write(d, "3d.npy", &npy("<f4", false, "(2, 1, 2)", &[0; 16])),
            y.clone(),
            "a 2-D (rows, features) array",
        ),
        (
            write(d, "short.npy", &npy("<f4", false, "(2, 2)", &[0; 12])),
            y.clone(),
            "truncated: shape [2, 2] of float32 needs 16 bytes of data, the file has 12",
        ),
        (
            write(d, "nan.npy", &npy("<f4", false, "(2, 2)", &f32s(&[1.0, 2.0, f32::NAN, 4.0]))),
            y.clone(),
            "row 1, column 0: NaN is a missing value (NaN)",
        ),
        (
            write(
                d,
                "big.npy",
                &npy(
                    "<f8",
                    false,
                    "(2, 1)",
                    &[1e300f64, 0.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
                ),
            ),
            y.clone(),
            "not a finite float32",
        ),
        (x.clone(), write(d, "y3.npy", &npy("<i4", false, "(3,)", &[0; 12])), "3 labels for 2 rows"),
        (
            x.clone(),
            write(d, "yf.npy", &npy("<f4", false, "(2,)", &f32s(&[0.0, 2.5]))),
            "label 2.5 at index 1",
        ),
        (
            x.clone(),
            write(
                d,
                "yneg.npy",
                &npy(
                    "<i4",
                    false,
                    "(2,)",
                    &(-1i32).to_le_bytes().iter().chain(&[1, 0, 0, 0]).copied().collect::<Vec<_>>(),
                ),
            ),
            "label -1 at index 0",
        ),
        (
            x.clone(),
            write(d, "y1.npy", &npy("<i4", false, "(2,)", &[1, 0, 0, 0, 1, 0, 0, 0])),
            "one class only",
        ),
        (x.clone(), write(d, "y2d.npy", &npy("<i4", false, "(2, 2)", &[0; 16])), "one label per row"),
        (x.clone(), d.join("missing.npy"), "missing.npy: reading"),
    ];
    for (xs, ys, what) in cases {
        let out = d.join("out.pgd");
        let e = convert(&xs, &ys, &out).expect_err(what).to_string();
        assert!(e.contains(what), "expected `{what}` in: {e}");
        assert!(!out.exists(), "{what}: a dataset was written");
        let leftovers = std::fs::read_dir(d)
            .expect("dir")
            .filter(|f| f.as_ref().is_ok_and(|f| f.file_name().to_string_lossy().contains("out.pgd")))
            .count();
        assert_eq!(leftovers, 0, "{what}: a temporary file was left");
    }
}
