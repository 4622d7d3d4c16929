//! What Peregrine reads and writes, probed as a hostile user would: a checkpoint whose figures
//! were edited, a disk that fills while a checkpoint or a model is written, a model file with
//! NaN weights, CSV files with a byte-order mark or more classes than supported, `simulate`
//! flags out of range, and a scheme that cannot run in the world, on every backend. Each probe
//! runs the built binary and checks its exit status, its message, and what it left on disk.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "support/checkpoints.rs"]
mod checkpoints;

fn peregrine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine")).args(args).output().expect("run peregrine")
}

/// `peregrine args` with files limited to `bytes` (`ulimit -f`: a write past it fails as on a
/// full disk, once the process ignores SIGXFSZ, which would otherwise end it).
fn peregrine_with_file_limit(args: &[&str], bytes: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peregrine"));
    cmd.args(args);
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit, which
    // is async-signal-safe; it allocates nothing and touches no lock.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    cmd.output().expect("run peregrine")
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `peregrine args`, which must succeed: its standard output and error.
fn ok(args: &[&str]) -> (String, String) {
    let out = peregrine(args);
    let t = text(&out);
    assert!(out.status.success(), "peregrine {args:?}:\n{}\n{}", t.0, t.1);
    t
}

/// `peregrine args`, which must fail with `code` and a message containing each of `words`: its
/// standard output and error.
fn fails(args: &[&str], code: i32, words: &[&str]) -> (String, String) {
    let out = peregrine(args);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(code), "peregrine {args:?}:\n{stdout}\n{stderr}");
    for w in words {
        assert!(stderr.contains(w), "peregrine {args:?}: no `{w}` in\n{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
    (stdout, stderr)
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-integrity-{name}-")).tempdir().expect("scratch dir")
}

fn path(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

/// Every `*.tmp` file under `dir`.
fn temporary_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for e in std::fs::read_dir(dir).expect("list").flatten() {
        let p = e.path();
        if p.is_dir() {
            found.extend(temporary_files(&p));
        } else if p.extension().is_some_and(|x| x == "tmp") {
            found.push(p);
        }
    }
    found
}

/// A metadata value of a safetensors file, read from its JSON header.
fn metadata(file: &Path, key: &str) -> String {
    let bytes = std::fs::read(file).expect("read");
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).expect("header");
    header.metadata().as_ref().and_then(|m| m.get(key)).cloned().expect("metadata key")
}

/// Replaces, in place and keeping the file's length, the metadata value `"key":"old"` of a
/// safetensors file by `new` (padded with leading zeros to the old value's length): the edit a
/// user would make in a hex editor.
fn edit_in_place(file: &Path, key: &str, new: &str) {
    let old = metadata(file, key);
    let (sign, digits) = new.strip_prefix('-').map_or(("", new), |d| ("-", d));
    let new = format!("{sign}{digits:0>width$}", width = old.len().saturating_sub(sign.len()));
    assert_eq!(new.len(), old.len(), "the edit keeps the length");
    let (from, to) = (format!("\"{key}\":\"{old}\""), format!("\"{key}\":\"{new}\""));
    let bytes = std::fs::read(file).expect("read");
    let at = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect("the value in the header");
    let mut edited = bytes.clone();
    edited[at..at + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(file, edited).expect("write");
}

/// A checkpoint whose iteration or training seconds were edited after it was written is damaged
/// (the checksum covers them): the run resumes from the previous checkpoint, or, with none, is
/// refused (exit 2) with nothing written; figures out of range under a valid checksum are
/// refused too. Before, the run resumed at the edited iteration, and negative seconds gave a
/// summary of -1e10 s and 7e18 samples/s.
#[test]
fn an_edited_checkpoint_is_not_resumed_from() {
    let t = scratch("edited");
    let d = t.path();
    let data = path(&d.join("d.pgd"));
    ok(&["data", "gen", "dense", &data, "--rows", "400", "--features", "6", "--classes", "3"]);
    let run = d.join("run");
    let args = [
        "train",
        "--model",
        "softmax",
        "--data",
        &data,
        "--iterations",
        "40",
        "--checkpoint-every",
        "10",
        "--ranks",
        "2",
        "--run-dir",
        &path(&run),
        "-q",
    ];
    ok(&args);
    let (newest, previous, summary) = (
        run.join("checkpoint.safetensors"),
        run.join("checkpoint.prev.safetensors"),
        run.join("summary.json"),
    );
    let (at, before) = (metadata(&newest, "iteration"), metadata(&previous, "iteration"));
    // The last checkpoint before the end, and the one before it.
    assert_eq!((&at[..], &before[..]), ("30", "20"));
    std::fs::remove_file(&summary).expect("unfinish");
    edit_in_place(&newest, "iteration", "12");
    let (_, stderr) = ok(&args);
    assert!(
        stderr.contains("checkpoint.safetensors: damaged (checksum")
            && stderr.contains("using the previous checkpoint")
            && stderr.contains("resuming from iteration 20"),
        "{stderr}"
    );
    // No previous to fall back on: refused, nothing written.
    for edit in ["iteration", "train_seconds"] {
        std::fs::remove_file(&summary).expect("unfinish");
        std::fs::remove_file(&previous).expect("no previous");
        edit_in_place(&newest, edit, if edit == "iteration" { "12" } else { "-1e10" });
        let kept = std::fs::read(&newest).expect("read");
        fails(&args, 2, &["no usable checkpoint", "checkpoint.safetensors: damaged (checksum", "--force"]);
        assert!(!summary.exists() && !previous.exists(), "{edit}: written after a refusal");
        assert_eq!(std::fs::read(&newest).expect("read"), kept, "{edit}: the checkpoint changed");
        ok(&[&args[..], &["--force"]].concat());
    }
    // Figures out of range under a valid checksum (as a faulty version would write them).
    let cases: [(&str, &str, &str); 3] = [
        ("train_seconds", "-1e10", "`train_seconds` -10000000000 is not a duration"),
        ("train_seconds", "NaN", "`train_seconds` NaN is not a duration"),
        ("iteration", "41", "`iteration` 41 is past the run's 40 iterations"),
    ];
    for (key, value, expected) in cases {
        std::fs::remove_file(&summary).expect("unfinish");
        std::fs::remove_file(&previous).expect("no previous");
        checkpoints::reseal(&newest, |meta, _| {
            meta.insert(key.into(), value.into());
        });
        fails(&args, 2, &["no usable checkpoint", expected]);
        assert!(!summary.exists(), "{key} {value}: a summary written");
        ok(&[&args[..], &["--force"]].concat());
    }
    assert!(temporary_files(d).is_empty(), "{:?}", temporary_files(d));
}

/// A checkpoint, then a model, that cannot be written (files limited to 12 KB, as a full disk
/// fails a write): the run ends with exit 1 naming the file and the error, not by the SIGXFSZ
/// that would otherwise end it mid-write, and leaves no temporary file. Before, the process died
/// by the signal (exit 153), or, with the signal ignored, left `checkpoint.safetensors.tmp`.
#[test]
fn a_checkpoint_or_model_that_cannot_be_written_leaves_no_temporary_file() {
    let t = scratch("full");
    let d = t.path();
    let data = path(&d.join("w.pgd"));
    // 4,010 parameters: a 16 KB model and a 48 KB checkpoint (Adam's two moments).
    ok(&["data", "gen", "dense", &data, "--rows", "500", "--features", "400", "--classes", "10"]);
    for (every, file) in [("10", "checkpoint.safetensors"), ("0", "model.safetensors")] {
        let run = d.join(format!("run-{every}"));
        let args = [
            "train",
            "--model",
            "softmax",
            "--data",
            &data,
            "--iterations",
            "20",
            "--checkpoint-every",
            every,
            "--ranks",
            "2",
            "--run-dir",
            &path(&run),
            "-q",
        ];
        let out = peregrine_with_file_limit(&args, 12 << 10);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{file}: {:?}\n{stderr}", out.status);
        // `checkpoint.safetensors.tmp`, `model.tmp-<pid>-<n>.safetensors`.
        let stem = file.trim_end_matches(".safetensors");
        assert!(stderr.contains(&format!("/{stem}.")) && stderr.contains(".tmp"), "{stderr}");
        assert!(stderr.contains("File too large"), "{stderr}");
        assert!(temporary_files(&run).is_empty(), "{file}: {:?}", temporary_files(&run));
        assert!(!run.join(file).exists(), "{file} written");
    }
}

/// A model file whose weights hold NaN or an infinity (a diverged run, a damaged copy) is
/// refused by `predict` with the file, the tensor and the first bad index, and no predictions
/// written. Before, it predicted NaN with exit 0.
#[test]
fn a_model_with_weights_that_are_not_numbers_is_refused() {
    use safetensors::tensor::TensorView;
    use safetensors::SafeTensors;
    let t = scratch("nan-model");
    let d = t.path();
    let data = path(&d.join("d.pgd"));
    ok(&["data", "gen", "dense", &data, "--rows", "400", "--features", "6", "--classes", "3"]);
    let run = d.join("run");
    ok(&[
        "train",
        "--model",
        "softmax",
        "--data",
        &data,
        "--iterations",
        "10",
        "--ranks",
        "1",
        "--run-dir",
        &path(&run),
        "-q",
    ]);
    let model = run.join("model.safetensors");
    let whole = std::fs::read(&model).expect("model");
    let out = d.join("p.csv");
    ok(&["predict", "--model", &path(&run), "--data", &data, "-o", &path(&out)]);
    std::fs::remove_file(&out).expect("predictions");
    for (bad, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
        let st = SafeTensors::deserialize(&whole).expect("safetensors");
        let (_, header) = SafeTensors::read_metadata(&whole).expect("header");
        let mut weight: Vec<f32> = st
            .tensor("weight")
            .expect("weight")
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        weight[3] = bad;
        weight[5] = bad;
        let bytes: Vec<u8> = weight.iter().flat_map(|v| v.to_le_bytes()).collect();
        let shape = st.tensor("weight").expect("weight").shape().to_vec();
        let views = [
            ("weight", TensorView::new(safetensors::Dtype::F32, shape, &bytes).expect("view")),
            ("bias", st.tensor("bias").expect("bias")),
        ];
        let rewritten = safetensors::serialize(views, header.metadata().clone()).expect("serialize");
        std::fs::write(&model, rewritten).expect("write");
        let expected = format!("tensor `weight` holds {shown} at index 3 (of 18)");
        fails(
            &["predict", "--model", &path(&run), "--data", &data, "-o", &path(&out)],
            1,
            &["model.safetensors", &expected],
        );
        assert!(!out.exists(), "{shown}: predictions written");
    }
    assert!(temporary_files(d).is_empty(), "{:?}", temporary_files(d));
}

/// A CSV file that starts with a UTF-8 byte-order mark converts as without it: a headerless
/// file keeps its first row, and `--label` finds the header's first name. Before, the first row
/// was taken for a header (exit 0, a row short), and `--label a` found no column `a`.
#[test]
fn a_csv_byte_order_mark_is_not_part_of_the_first_field() {
    let t = scratch("bom");
    let d = t.path();
    let plain = d.join("plain.csv");
    std::fs::write(&plain, "\u{feff}1.5,2,0\n3,4,1\n5,6,1\n").expect("write");
    let (stdout, _) = ok(&["data", "convert", "csv", &path(&plain), &path(&d.join("plain.pgd"))]);
    assert!(stdout.contains(": 3 rows, 2 feature columns"), "{stdout}");
    let named = d.join("named.csv");
    std::fs::write(&named, "\u{feff}a,b\nx,1\ny,2\n").expect("write");
    let (stdout, _) =
        ok(&["data", "convert", "csv", &path(&named), &path(&d.join("named.pgd")), "--label", "a"]);
    assert!(stdout.contains("label column 1 (`a`); classes 0=`x`, 1=`y`"), "{stdout}");
}

/// Whole-number labels past the classes `0..65535` are numbered by value (9, 65536, 70000,
/// 100000; not as text: 100000, 65536, 70000, 9); more than 65,536 distinct labels is refused
/// naming the file and the count, with nothing written; many classes are listed abbreviated.
/// Before, 65,537 labels were renumbered in text order with exit 0 and every one printed.
#[test]
fn csv_classes_are_ordered_by_value_bounded_and_listed_short() {
    let t = scratch("classes");
    let d = t.path();
    let input = d.join("big.csv");
    std::fs::write(&input, "1,70000\n2,100000\n3,9\n4,65536\n5,9\n").expect("write");
    let (stdout, _) = ok(&["data", "convert", "csv", &path(&input), &path(&d.join("big.pgd"))]);
    assert!(stdout.contains("classes 0=`9`, 1=`65536`, 2=`70000`, 3=`100000`\n"), "{stdout}");
    let many = d.join("many.csv");
    let rows: String = (0..=65_536).map(|i| format!("{},{i}\n", i % 7)).collect();
    std::fs::write(&many, rows).expect("write");
    let out = d.join("many.pgd");
    let (stdout, _) = fails(
        &["data", "convert", "csv", &path(&many), &path(&out)],
        1,
        &["many.csv", "65537 distinct labels", "65536 classes"],
    );
    assert!(stdout.is_empty(), "{stdout}");
    assert!(!out.exists() && temporary_files(d).is_empty(), "written after a refusal");
    let thousand = d.join("thousand.csv");
    let rows: String = (0..1000).map(|i| format!("{},{i}\n", i % 7)).collect();
    std::fs::write(&thousand, rows).expect("write");
    let (stdout, _) = ok(&["data", "convert", "csv", &path(&thousand), &path(&d.join("thousand.pgd"))]);
    assert!(
        stdout
            .contains("classes 0=`0`, 1=`1`, 2=`2`, 3=`3`, 4=`4`, ... 993 more ..., 998=`998`, 999=`999`\n")
            && stdout.len() < 300,
        "{stdout}"
    );
}

/// Every numeric flag of `simulate` out of its range is a usage error naming the flag, before
/// anything is printed or simulated; figures in range that add up to a run past the
/// simulator's horizon are refused too. Before, `--inter-bandwidth 1e-5` gave an iteration
/// faster than InfiniBand (the integer clock wrapped round), and `--params 1e19` saturated.
#[test]
fn simulate_refuses_flags_out_of_range_and_runs_past_its_horizon() {
    let base = ["simulate", "--ranks", "4", "--threads", "2", "--scheme", "bsp"];
    let bad: &[(&[&str], &str)] = &[
        (&["--inter-bandwidth", "1e-5"], "--inter-bandwidth"),
        (&["--inter-bandwidth", "0"], "--inter-bandwidth"),
        (&["--inter-bandwidth", "inf"], "--inter-bandwidth"),
        (&["--inter-bandwidth", "NaN"], "--inter-bandwidth"),
        (&["--params", "10000000000000000000"], "--params"),
        (&["--chunk-time", "0"], "--chunk-time"),
        (&["--chunk-time", "NaN"], "--chunk-time"),
        (&["--chunk-time", "inf"], "--chunk-time"),
        (&["--chunk-time", "1e6"], "--chunk-time"),
        (&["--overhead=-1"], "--overhead"),
        (&["--overhead", "inf"], "--overhead"),
        (&["--inter-latency", "NaN"], "--inter-latency"),
        (&["--inter-atomic=-1e-6"], "--inter-atomic"),
        (&["--inter-gap", "1e9"], "--inter-gap"),
        (&["--steal-fraction", "NaN"], "--steal-fraction"),
        (&["--steal-fraction", "1.5"], "--steal-fraction"),
        (&["--chunk", "18446744073709551615"], "--chunk"),
        (&["--rows", "18446744073709551615"], "--rows"),
        (&["--batch", "18446744073709551615"], "--batch"),
        (&["--target-iterations", "0"], "--target-iterations"),
    ];
    for (flags, named) in bad {
        let (stdout, _) = fails(&[&base[..], flags].concat(), 2, &[named]);
        assert!(stdout.is_empty(), "{flags:?}: {stdout}");
    }
    let t = scratch("simulate");
    let json = path(&t.path().join("r.json"));
    for flags in [
        &["--inter-bandwidth", "1", "--params", "1000000000000"][..],
        &["--chunk-time", "86400", "--iterations", "100000"],
    ] {
        fails(
            &[&base[..], flags, &["--json", &json]].concat(),
            2,
            &["passes 146 years of virtual time", "--inter-bandwidth", "--iterations"],
        );
        assert!(!t.path().join("r.json").exists(), "{flags:?}: a report written");
    }
    // A slow link in range: slower than InfiniBand, as it should be.
    let per_iteration = |flags: &[&str]| -> f64 {
        let (stdout, _) = ok(&[&base[..], flags].concat());
        let row = stdout.lines().find(|l| l.starts_with("bsp ")).expect("the bsp row");
        row.split_whitespace().nth(1).expect("s/iteration").parse().expect("a number")
    };
    let (ib, slow) = (per_iteration(&[]), per_iteration(&["--inter-bandwidth", "1e6"]));
    assert!(slow > 100.0 * ib, "1 MB/s: {slow} s/iteration, InfiniBand {ib}");
}

/// A scheme that cannot run with the ranks given is a usage error (exit 2) with nothing
/// written, on the local backend as under mpirun (where it exited 1).
#[test]
fn a_scheme_impossible_in_the_world_is_a_usage_error() {
    let t = scratch("torus");
    let d = t.path();
    let data = path(&d.join("d.pgd"));
    ok(&["data", "gen", "dense", &data, "--rows", "400", "--features", "6", "--classes", "3"]);
    let run = d.join("run");
    let args = [
        "train",
        "--model",
        "softmax",
        "--data",
        &data,
        "--scheme",
        "dbw:torus",
        "--run-dir",
        &path(&run),
        "-q",
    ];
    fails(&[&args[..], &["--ranks", "3"]].concat(), 2, &["scheme `dbw:torus` cannot run with 3 ranks"]);
    assert!(!run.exists(), "a run directory written");
    #[cfg(feature = "mpi")]
    {
        let out = peregrine_tests::mpirun_n(3, Path::new(env!("CARGO_BIN_EXE_peregrine")), &args);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "mpirun -n 3:\n{stdout}\n{stderr}");
        assert!(stderr.contains("scheme `dbw:torus` cannot run with 3 ranks"), "{stderr}");
        assert!(!run.exists(), "a run directory written under mpirun");
    }
}
