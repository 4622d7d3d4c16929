//! Sizes from flags and headers checked before anything of their size is allocated: a flag or a
//! small file that asks for more memory than there is gets a clear refusal (naming the flag or
//! header field and the memory), never a death by signal, and the refusal itself stays small;
//! `data gen` checks what its flags ask for alike; `data info` reads only the header; a signal during the data check stops it at once; the
//! local backend's memory grows linearly with its ranks.
//!
//! Each run's peak memory is its own maximum resident set, read from `wait4` (not
//! `RUSAGE_CHILDREN`, which mixes the children of tests running side by side).

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Peak memory a refused input may take.
const REFUSED_RSS: u64 = 100 << 20;

/// Longest a probe may run before it counts as hung.
const HANG: Duration = Duration::from_secs(60);

/// How one run of the binary ended.
#[derive(Debug)]
struct Ended {
    /// Exit code, if it exited.
    code: Option<i32>,
    /// Signal, if one ended it.
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    /// Its own peak resident memory, bytes.
    max_rss: u64,
}

/// A running `peregrine`, its output read by two threads.
struct Running {
    pid: libc::pid_t,
    started: Instant,
    readers: [std::thread::JoinHandle<String>; 2],
}

/// Starts `peregrine args` in `dir`, its address space limited to `limit` bytes if given
/// (`ulimit -v`: the memory a machine "has", whatever this one has).
// The child is reaped by `wait4` in [`Running::wait`], which gives its own resource usage.
#[allow(clippy::zombie_processes)]
fn start(dir: &Path, args: &[&str], limit: Option<u64>) -> Running {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_peregrine"));
    cmd.args(args).current_dir(dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    if let Some(bytes) = limit {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the closure calls only setrlimit, which is
        // async-signal-safe, on a struct of its own.
        unsafe {
            cmd.pre_exec(move || {
                let l = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
                if libc::setrlimit(libc::RLIMIT_AS, &l) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    let mut child = cmd.spawn().expect("run peregrine");
    let read = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = read(Box::new(child.stdout.take().expect("piped")));
    let err = read(Box::new(child.stderr.take().expect("piped")));
    Running { pid: child.id() as libc::pid_t, started: Instant::now(), readers: [out, err] }
}

impl Running {
    /// Waits for the run to end (at most [`HANG`], then it is killed and the test fails).
    fn wait(self) -> Ended {
        let (mut status, mut usage) = (0, zeroed_rusage());
        loop {
            // SAFETY: wait4 writes only the status and the rusage it is given, which outlive the
            // call; the pid is this test's own child, not yet reaped (std's `Child` is never
            // waited on).
            let r = unsafe { libc::wait4(self.pid, &mut status, libc::WNOHANG, &mut usage) };
            assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
            if r == self.pid {
                break;
            }
            if self.started.elapsed() > HANG {
                // SAFETY: a signal to this test's own child, which has not been reaped.
                unsafe { libc::kill(self.pid, libc::SIGKILL) };
                panic!("peregrine ran past {HANG:?}: hung");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let [out, err] = self.readers;
        Ended {
            code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            stdout: out.join().expect("stdout reader"),
            stderr: err.join().expect("stderr reader"),
            max_rss: u64::try_from(usage.ru_maxrss).expect("a size") * 1024,
        }
    }
}

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: rusage is plain integers and timevals, for which all zeros is a valid value.
    unsafe { std::mem::zeroed() }
}

fn run(dir: &Path, args: &[&str], limit: Option<u64>) -> Ended {
    start(dir, args, limit).wait()
}

fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-limits-{name}-")).tempdir().expect("scratch dir")
}

fn ok(dir: &Path, args: &[&str]) {
    let e = run(dir, args, None);
    assert_eq!(e.code, Some(0), "{args:?}: {}", e.stderr);
}

/// A refusal: exit `code`, no signal, every part of `expect` in the message, at most
/// [`REFUSED_RSS`], and no run directory left.
fn refused(dir: &Path, e: &Ended, code: i32, expect: &[&str]) {
    assert_eq!((e.code, e.signal), (Some(code), None), "{}", e.stderr);
    for part in expect {
        assert!(e.stderr.contains(part), "`{part}` in {}", e.stderr);
    }
    assert!(!e.stderr.contains("panicked"), "{}", e.stderr);
    assert!(e.max_rss <= REFUSED_RSS, "peak memory {} MB: {}", e.max_rss >> 20, e.stderr);
    assert!(!dir.join("runs").exists(), "a run directory was left");
}

/// An 8 GiB address space: what the refusals are judged against, whatever this machine has.
const EIGHT_GB: Option<u64> = Some(8 << 30);

#[test]
fn flags_that_size_a_model_past_the_memory_are_refused_by_name() {
    let d_tmp = scratch("flags");
    let d = d_tmp.path();
    ok(d, &["data", "gen", "dense", "dense.pgd", "--rows", "200", "--features", "10"]);
    ok(d, &["data", "gen", "ratings", "ratings.pgd", "--ratings", "2000", "--users", "100", "--items", "50"]);
    ok(d, &["data", "gen", "sparse", "sparse.pgd", "--rows", "1000", "--features", "1000"]);
    let cases: [(&[&str], &[&str]); 6] = [
        (
            &["--model", "mlp", "--chunk", "1000000000000000000", "--data", "dense.pgd"],
            &["--chunk 1000000000000000000 and --grain 1"],
        ),
        (
            &["--model", "mlp", "--hidden", "4294967295", "--data", "dense.pgd"],
            &["--hidden 4294967295", "MLP 10-4294967295-10"],
        ),
        (
            &["--model", "mlp", "--hidden", "100000,100000", "--data", "dense.pgd"],
            &["--hidden 100000,100000"],
        ),
        (
            &["--model", "mlp", "--hidden", "18446744073709551615", "--data", "dense.pgd"],
            &["--hidden 18446744073709551615"],
        ),
        (
            &["--model", "mf", "--k", "4294967295", "--data", "ratings.pgd"],
            &["--k 4294967295", "100 users and 50 items"],
        ),
        (
            &["--model", "lda", "--k", "4294967295", "--data", "sparse.pgd"],
            &["--k 4294967295", "LDA of 4294967295 topics"],
        ),
    ];
    for (args, expect) in cases {
        let e = run(d, &[&["train", "-q", "--iterations", "2"][..], args].concat(), EIGHT_GB);
        refused(d, &e, 2, expect);
        refused(d, &e, 2, &["parameters (", "training needs about", "available (", "use "]);
    }
}

#[test]
fn data_gen_flags_past_the_memory_are_refused_by_name() {
    let d_tmp = scratch("gen");
    let d = d_tmp.path();
    let cases: [(&[&str], &str); 4] = [
        (&["sparse", "--rows", "1", "--features", "4000000000"], "--features 4000000000"),
        (&["sparse", "--rows", "100000000000000", "--features", "10"], "--rows 100000000000000"),
        (&["dense", "--rows", "1", "--features", "100000000", "--classes", "65536"], "--classes 65536"),
        (&["ratings", "--users", "4000000000", "--items", "4000000000", "--rank", "1000"], "--rank 1000"),
    ];
    for (args, expect) in cases {
        let e = run(d, &[&["data", "gen"][..], args, &["out.pgd"]].concat(), EIGHT_GB);
        refused(d, &e, 2, &[expect, "need about", "available ("]);
        assert_eq!(std::fs::read_dir(d).expect("list").count(), 0, "{args:?} left a file");
    }
}

#[test]
fn benchmark_and_conformance_sizes_past_the_memory_are_refused_by_name() {
    let d_tmp = scratch("bench");
    let d = d_tmp.path();
    let cases: [(&[&str], &str); 2] = [
        (
            &["bench", "rma", "--max-size", "1000000000000", "--iters", "1", "--ranks", "2"],
            "--max-size 1000000000000",
        ),
        (&["conformance", "--tickets", "100000000000", "--ranks", "2"], "--tickets 100000000000"),
    ];
    for (args, expect) in cases {
        let e = run(d, args, EIGHT_GB);
        refused(d, &e, 2, &[expect, "need about", "available ("]);
    }
}

#[test]
fn small_files_whose_models_exceed_the_memory_are_refused_with_the_fix() {
    let d_tmp = scratch("files");
    let d = d_tmp.path();
    // One LIBSVM line, a feature id of 10^8: a weight per id is 400 MB a copy, some ten copies
    // over two ranks; the refusal suggests hashed features, and they fit.
    std::fs::write(d.join("one.svm"), "1 100000000:1\n0 5:1\n").expect("write");
    ok(d, &["data", "convert", "libsvm", "one.svm", "one.pgd"]);
    let four_gb = Some(4 << 30);
    let e = run(d, &["train", "-q", "--model", "lr", "--data", "one.pgd", "--iterations", "2"], four_gb);
    refused(d, &e, 2, &["one.pgd declares 100000000 features", "header field `cols`", "--hash-bits"]);
    let bits = e.stderr.split("--hash-bits ").nth(1).and_then(|s| s.split(' ').next()).expect("a bit count");
    let hashed =
        ["train", "-q", "--model", "lr", "--data", "one.pgd", "--iterations", "2", "--hash-bits", bits];
    let e = run(d, &[&hashed[..], &["--run-dir", "hashed"]].concat(), four_gb);
    assert_eq!((e.code, e.signal), (Some(0), None), "--hash-bits {bits}: {}", e.stderr);
    // A feature id of 4 * 10^9: 16 GB a copy.
    std::fs::write(d.join("far.svm"), "1 4000000000:1\n0 5:1\n").expect("write");
    ok(d, &["data", "convert", "libsvm", "far.svm", "far.pgd"]);
    let e = run(d, &["train", "-q", "--model", "lr", "--data", "far.pgd"], EIGHT_GB);
    refused(d, &e, 2, &["4000000000 features", "--hash-bits"]);
    // A CSV of 100,000 features whose labels 0 and 65535 make 65,536 classes: a softmax
    // regression of 6.5 * 10^9 weights.
    let row = |label: u32| format!("{}{label}\n", "1,".repeat(100_000));
    std::fs::write(d.join("wide.csv"), row(0) + &row(65535)).expect("write");
    ok(d, &["data", "convert", "csv", "wide.csv", "wide.pgd"]);
    let e = run(d, &["train", "-q", "--model", "softmax", "--data", "wide.pgd"], EIGHT_GB);
    refused(d, &e, 2, &["100000 features and 65536 classes", "header fields `cols`, `classes`"]);
}

/// A dataset's bytes with the header field at `at` replaced by `value` and the header checksum
/// recomputed (the format's: CRC-32 of bytes 0..156, stored at 156).
fn with_field(bytes: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + value.len()].copy_from_slice(value);
    let crc = crc32fast::hash(&b[..156]);
    b[156..160].copy_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn a_header_declaring_more_classes_than_labels_can_name_is_refused() {
    let d_tmp = scratch("classes");
    let d = d_tmp.path();
    std::fs::write(d.join("t.csv"), "a,b,c,d,label\n1,2,3,4,0\n5,6,7,8,1\n").expect("write");
    ok(d, &["data", "convert", "csv", "t.csv", "t.pgd"]);
    let good = std::fs::read(d.join("t.pgd")).expect("read");
    assert_eq!(good.len(), 320, "the 320-byte file of the report");
    std::fs::write(d.join("classes.pgd"), with_field(&good, 40, &u32::MAX.to_le_bytes())).expect("write");
    let message = ["classes.pgd", "header field `classes` is 4294967295", "at most 65536"];
    let e = run(d, &["data", "info", "--verify", "classes.pgd"], None);
    refused(d, &e, 1, &message);
    for model in ["softmax", "mlp"] {
        let e = run(d, &["train", "-q", "--model", model, "--data", "classes.pgd"], EIGHT_GB);
        refused(d, &e, 1, &message);
    }
}

#[test]
fn standardizing_a_file_that_declares_2_to_the_32_features_is_refused() {
    let d_tmp = scratch("standardize");
    let d = d_tmp.path();
    std::fs::write(d.join("w.svm"), "1 3:1\n0 2:1\n").expect("write");
    ok(d, &["data", "convert", "libsvm", "w.svm", "w.pgd"]);
    let wide = with_field(&std::fs::read(d.join("w.pgd")).expect("read"), 24, &(1u64 << 32).to_le_bytes());
    std::fs::write(d.join("wide.pgd"), wide).expect("write");
    let e = run(d, &["data", "standardize", "wide.pgd", "out.pgd"], EIGHT_GB);
    refused(d, &e, 2, &["wide.pgd: its 4294967296 features (header field `cols`) need about", "available ("]);
    assert!(!d.join("out.pgd").exists());
}

#[test]
fn predict_refuses_a_model_whose_metadata_describes_more_than_its_tensors() {
    let d_tmp = scratch("predict");
    let d = d_tmp.path();
    ok(d, &["data", "gen", "dense", "dense.pgd", "--rows", "100", "--features", "10"]);
    ok(
        d,
        &[
            "train",
            "-q",
            "--model",
            "mlp",
            "--hidden",
            "4",
            "--data",
            "dense.pgd",
            "--iterations",
            "2",
            "--run-dir",
            "r",
        ],
    );
    let file = std::fs::read(d.join("r/model.safetensors")).expect("model");
    let n = u64::from_le_bytes(file[..8].try_into().expect("8 bytes")) as usize;
    let header = std::str::from_utf8(&file[8..8 + n]).expect("json");
    assert!(header.contains(r#""hidden":"4""#), "{header}");
    for (hidden, expect) in [
        ("4294967295", "the data needs [4294967295, 10]"),
        ("18446744073709551615", "more parameters than an index numbers"),
        ("100000,100000", "the data needs [100000, 10]"),
    ] {
        let mut json = header.replace(r#""hidden":"4""#, &format!(r#""hidden":"{hidden}""#));
        while json.len() % 8 != 0 {
            json.push(' ');
        }
        let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(json.as_bytes());
        bytes.extend_from_slice(&file[8 + n..]);
        std::fs::write(d.join("m.safetensors"), bytes).expect("write");
        let e =
            run(d, &["predict", "--model", "m.safetensors", "--data", "dense.pgd", "-o", "p.csv"], EIGHT_GB);
        refused(d, &e, 1, &[expect]);
        assert!(!d.join("p.csv").exists(), "--hidden {hidden}: predictions written");
    }
}

/// A sparse dataset of 2^28 rows and no nonzeros, 3 GiB long, all of it a hole but its header
/// (no disk space, and reading it reads zeros): row offsets all 0, labels all 0.
fn holes(path: &Path) {
    let rows: u64 = 1 << 28;
    let align = |x: u64| x.div_ceil(64) * 64;
    let mut h = Vec::with_capacity(192);
    h.extend_from_slice(b"PRGRNDS\0");
    h.extend_from_slice(&1u32.to_le_bytes()); // version
    h.extend_from_slice(&1u32.to_le_bytes()); // sparse
    for v in [rows, 1, 0] {
        h.extend_from_slice(&v.to_le_bytes()); // rows, cols, nnz
    }
    h.extend_from_slice(&2u32.to_le_bytes()); // classes
    h.extend_from_slice(&0u32.to_le_bytes()); // truth rank
    h.extend_from_slice(&0u64.to_le_bytes()); // users
    let mut at: u64 = 192;
    for len in [8 * (rows + 1), 0, 0, 4 * rows, 0, 0] {
        h.extend_from_slice(&at.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        at = align(at + len);
    }
    h.extend_from_slice(&0u32.to_le_bytes()); // data checksum (not that of the zeros)
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.resize(192, 0);
    let f = std::fs::File::create(path).expect("create");
    std::io::Write::write_all(&mut &f, &h).expect("write");
    f.set_len(at).expect("extend with a hole");
}

#[test]
fn data_info_reads_only_the_header() {
    let d_tmp = scratch("info");
    let d = d_tmp.path();
    holes(&d.join("rows.pgd"));
    let started = Instant::now();
    let e = run(d, &["data", "info", "rows.pgd"], None);
    assert_eq!((e.code, e.signal), (Some(0), None), "{}", e.stderr);
    assert!(e.stdout.contains("rows 268435456") && !e.stdout.contains("positive"), "{}", e.stdout);
    // Reading the labels took 1 GB and seconds; the header is a page.
    assert!(e.max_rss <= 64 << 20, "peak memory {} MB", e.max_rss >> 20);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

#[test]
fn a_signal_during_the_data_check_stops_it_at_once() {
    let d_tmp = scratch("sigterm");
    let d = d_tmp.path();
    holes(&d.join("rows.pgd"));
    let p = start(d, &["train", "-q", "--model", "lr", "--data", "rows.pgd", "--ranks", "2"], None);
    // The check has begun once the file's pages are mapped in: a few MB of row offsets.
    let status = format!("/proc/{}/status", p.pid);
    let reading = || {
        let s = std::fs::read_to_string(&status).unwrap_or_default();
        let kb = s
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:")?.split_whitespace().next()?.parse::<u64>().ok());
        kb.unwrap_or(0) > 64 << 10
    };
    while !reading() {
        if p.started.elapsed() > HANG {
            // SAFETY: a signal to this test's own running child.
            unsafe { libc::kill(p.pid, libc::SIGKILL) };
            panic!("the check never began: {:?}", p.wait());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let signalled = Instant::now();
    // SAFETY: a signal to this test's own running child.
    assert_eq!(unsafe { libc::kill(p.pid, libc::SIGTERM) }, 0);
    let e = p.wait();
    let took = signalled.elapsed();
    // Exit 75, as for a stop at a checkpoint: the batch script requeues, the rerun starts afresh.
    assert_eq!((e.code, e.signal), (Some(75), None), "{}", e.stderr);
    assert!(
        e.stderr.contains("stopped on a signal while checking rows.pgd, before training began"),
        "{}",
        e.stderr
    );
    assert!(took < Duration::from_secs(5), "{took:?} after the signal");
    assert!(!d.join("runs").exists(), "a run directory was left");
}

#[test]
fn local_ranks_take_memory_linear_in_their_number() {
    let d_tmp = scratch("ranks");
    let d = d_tmp.path();
    ok(d, &["data", "gen", "sparse", "small.pgd", "--rows", "20000", "--features", "1000"]);
    let per_rank = |ranks: usize| {
        let n = ranks.to_string();
        let args = ["train", "-q", "--model", "lr", "--data", "small.pgd", "--iterations", "3", "--no-pin"];
        let e = run(d, &[&args[..], &["--threads", "1", "--ranks", &n, "--run-dir", &n]].concat(), None);
        assert_eq!((e.code, e.signal), (Some(0), None), "{ranks} ranks: {}", e.stderr);
        e.max_rss as f64 / ranks as f64
    };
    let (few, many) = (per_rank(64), per_rank(256));
    // Four times the ranks: the same memory a rank (measured 0.9 and 0.8 MB, most of it the
    // dataset's mapping, one per rank); before, every rank's copy of every rank's words in an
    // allreduce made it 1.9 and 10.6 MB.
    assert!(many < 2.0 * few, "{:.1} MB a rank at 64 ranks, {:.1} MB at 256", few / 1e6, many / 1e6);
}
