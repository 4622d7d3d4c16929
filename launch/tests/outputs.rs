//! One rule for every output of the `peregrine` binary: an output that is an input of the same
//! command (or a file of a run directory it reads), an existing entry that is not a regular file
//! (a device, a FIFO, a directory) or a symbolic link is refused with exit 2, naming the flag and
//! the path, before any work; what was there is unchanged, and no temporary file stays behind.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `peregrine args`, ended (and the test failed) if it runs past 60 s: writing into a FIFO
/// nobody reads would block forever.
fn peregrine(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run peregrine");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("peregrine {args:?} hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A scratch directory, removed when the test ends (passed or failed).
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("peregrine-outputs-{name}-")).tempdir().expect("scratch dir")
}

/// What is at `path`, to compare before and after a run: its kind, and a regular file's bytes.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Missing,
    File(Vec<u8>),
    Link(PathBuf),
    Dir(Vec<String>),
    CharDevice,
    Fifo,
}

fn entry(path: &Path) -> Entry {
    let Ok(m) = std::fs::symlink_metadata(path) else { return Entry::Missing };
    let t = m.file_type();
    if t.is_symlink() {
        Entry::Link(std::fs::read_link(path).expect("read link"))
    } else if t.is_dir() {
        Entry::Dir(names(path))
    } else if t.is_char_device() {
        Entry::CharDevice
    } else if t.is_fifo() {
        Entry::Fifo
    } else {
        Entry::File(std::fs::read(path).expect("read"))
    }
}

/// The names in directory `d`, sorted.
fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf8"))
        .collect();
    v.sort();
    v
}

/// Runs `args`: it must exit 2 with a message naming `path` and containing `says`, leave `path`
/// as it was, and add nothing to `dir`.
fn refused(dir: &Path, args: &[&str], path: &Path, says: &str) {
    let (before, listing) = (entry(path), names(dir));
    let out = peregrine(args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(&path.display().to_string()) && err.contains(says), "{args:?}: {err}");
    assert_eq!(entry(path), before, "{args:?} changed {}", path.display());
    assert_eq!(names(dir), listing, "{args:?} left files behind");
}

/// A `.npy` file as `numpy.save` writes it (version 1.0, header padded to 64 bytes).
fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}").into_bytes();
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

/// A scratch directory holding an input of every kind, a dataset `d.pgd` and, if `model`, a run
/// directory `run` trained on it.
struct Inputs {
    dir: tempfile::TempDir,
}

impl Inputs {
    fn new(name: &str, model: bool) -> Self {
        let dir = scratch(name);
        let d = dir.path();
        let files: [(&str, Vec<u8>); 9] = [
            ("a.csv", b"f1,f2,label\n1,2,0\n3,4,1\n5,6,0\n".to_vec()),
            ("a.svm", b"+1 1:0.5 3:2\n-1 2:1\n".to_vec()),
            ("docword.txt", b"2\n3\n3\n1 1 2\n1 2 1\n2 3 4\n".to_vec()),
            ("a.ldac", b"2 0:2 1:1\n1 2:4\n".to_vec()),
            ("ratings.txt", b"1 1 5\n1 2 3\n2 1 4\n".to_vec()),
            (
                "images.idx",
                [&[0u8, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2][..], &[0, 64, 128, 255, 1, 2, 3, 4]]
                    .concat(),
            ),
            ("labels.idx", vec![0, 0, 8, 1, 0, 0, 0, 2, 3, 7]),
            (
                "x.npy",
                npy(
                    "<f4",
                    "(2, 2)",
                    &[1f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>(),
                ),
            ),
            (
                "y.npy",
                npy("<i4", "(2,)", &[0i32, 1].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()),
            ),
        ];
        for (name, bytes) in files {
            std::fs::write(d.join(name), bytes).expect("write input");
        }
        let s = |n: &str| d.join(n).display().to_string();
        let ok = |args: &[&str]| {
            let out = peregrine(args);
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        };
        ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "200", "--features", "5", "--classes", "3"]);
        if model {
            let run = s("run");
            ok(&[
                "train",
                "--model",
                "softmax",
                "--data",
                &s("d.pgd"),
                "--iterations",
                "5",
                "--ranks",
                "1",
                "--run-dir",
                &run,
                "-q",
            ]);
        }
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn s(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// Every command that writes a file named by the user, with `OUT` standing for it.
    fn file_commands(&self) -> Vec<Vec<String>> {
        let s = |n: &str| self.s(n);
        let sbatch = ["slurm", "sbatch", "--nodes", "1", "--ntasks-per-node", "1", "--cpus-per-task", "1"];
        vec![
            strings(&["predict", "--model", &s("run"), "--data", &s("d.pgd"), "-o", "OUT"]),
            strings(&["data", "convert", "csv", &s("a.csv"), "OUT"]),
            strings(&["data", "convert", "csv", &s("a.csv"), "OUT", "--sparse"]),
            strings(&["data", "convert", "libsvm", &s("a.svm"), "OUT"]),
            strings(&["data", "convert", "docword", &s("docword.txt"), "OUT"]),
            strings(&["data", "convert", "ldac", &s("a.ldac"), "OUT"]),
            strings(&["data", "convert", "ratings", &s("ratings.txt"), "OUT"]),
            strings(&[
                "data",
                "convert",
                "idx",
                "--images",
                &s("images.idx"),
                "--labels",
                &s("labels.idx"),
                "OUT",
            ]),
            strings(&["data", "convert", "npy", "--features", &s("x.npy"), "--labels", &s("y.npy"), "OUT"]),
            strings(&["data", "gen", "sparse", "OUT", "--rows", "10", "--features", "5"]),
            strings(&["data", "gen", "dense", "OUT", "--rows", "10", "--features", "5"]),
            strings(&["data", "gen", "ratings", "OUT", "--ratings", "10", "--users", "3", "--items", "3"]),
            strings(&["data", "split", &s("d.pgd"), "--train", "OUT", "--test", &s("t.pgd")]),
            strings(&["data", "split", &s("d.pgd"), "--train", &s("t.pgd"), "--test", "OUT"]),
            strings(&["data", "standardize", &s("d.pgd"), "OUT"]),
            strings(&[&sbatch[..], &["--time", "1:00", "--script", "OUT", "--", "conformance"]].concat()),
            strings(&["simulate", "--ranks", "2", "--iterations", "5", "--scheme", "bsp", "--json", "OUT"]),
        ]
    }

    /// Every command that writes into a directory named by the user, with `OUT` standing for it.
    fn dir_commands(&self) -> Vec<Vec<String>> {
        let s = |n: &str| self.s(n);
        vec![
            strings(&[
                "train",
                "--model",
                "softmax",
                "--data",
                &s("d.pgd"),
                "--ranks",
                "1",
                "--run-dir",
                "OUT",
            ]),
            strings(&["conformance", "--ranks", "1", "--run-dir", "OUT"]),
            strings(&["experiment", &s("experiment.toml"), "--out", "OUT"]),
            strings(&["report", &s("run"), "--out", "OUT"]),
        ]
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// `cmd` with `OUT` replaced by `out`.
fn with_out<'a>(cmd: &'a [String], out: &'a str) -> Vec<&'a str> {
    cmd.iter().map(|a| if a == "OUT" { out } else { a.as_str() }).collect()
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(status.success(), "mkfifo {}", path.display());
}

#[test]
fn devices_fifos_directories_and_links_are_refused_as_files() {
    let inputs = Inputs::new("files", true);
    let d = inputs.dir.path();
    let fifo = inputs.path("fifo");
    mkfifo(&fifo);
    std::fs::create_dir(inputs.path("folder")).expect("mkdir");
    std::fs::write(inputs.path("theirs.txt"), "theirs").expect("write");
    std::os::unix::fs::symlink(inputs.path("theirs.txt"), inputs.path("link")).expect("symlink");
    // The machine's devices last: a command that writes through the others fails the test
    // before it can replace them.
    let targets = [
        (inputs.path("link"), "symbolic link to"),
        (inputs.path("folder"), "a directory"),
        (fifo, "a FIFO"),
        (PathBuf::from("/dev/full"), "a character device"),
        (PathBuf::from("/dev/null"), "a character device"),
    ];
    for cmd in inputs.file_commands() {
        for (target, says) in &targets {
            refused(d, &with_out(&cmd, &target.display().to_string()), target, says);
        }
    }
    for dev in ["/dev/full", "/dev/null"] {
        let m = std::fs::metadata(dev).expect(dev);
        assert!(m.file_type().is_char_device(), "{dev} is no longer a character device");
    }
    // The link's message names where it points, so that the user can give that path.
    let out = peregrine(&["data", "gen", "dense", &inputs.s("link"), "--rows", "10", "--features", "2"]);
    assert!(stderr(&out).contains(&inputs.s("theirs.txt")), "{}", stderr(&out));
    assert_eq!(std::fs::read(inputs.path("theirs.txt")).expect("read"), b"theirs");
}

#[test]
fn devices_fifos_files_and_links_are_refused_as_directories() {
    let inputs = Inputs::new("dirs", true);
    let d = inputs.dir.path();
    let fifo = inputs.path("fifo");
    mkfifo(&fifo);
    std::fs::write(inputs.path("file"), "theirs").expect("write");
    std::fs::create_dir(inputs.path("folder")).expect("mkdir");
    std::os::unix::fs::symlink(inputs.path("folder"), inputs.path("link")).expect("symlink");
    let targets = [
        (inputs.path("link"), "symbolic link to"),
        (inputs.path("file"), "a regular file, not a directory"),
        (fifo, "a FIFO (named pipe), not a directory"),
        (PathBuf::from("/dev/null"), "a character device, not a directory"),
    ];
    for cmd in inputs.dir_commands() {
        for (target, says) in &targets {
            refused(d, &with_out(&cmd, &target.display().to_string()), target, says);
        }
    }
    // An existing directory is a run directory as good as a new one.
    let out = peregrine(&["conformance", "--ranks", "1", "--run-dir", &inputs.s("folder")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn an_output_that_is_an_input_is_refused() {
    let inputs = Inputs::new("inputs", true);
    let d = inputs.dir.path();
    let s = |n: &str| inputs.s(n);
    // Another spelling of a path, and a hard link to it.
    let respelled = |n: &str| d.join("run/..").join(n).display().to_string();
    std::fs::hard_link(inputs.path("run/model.safetensors"), inputs.path("hard.safetensors")).expect("link");
    let predict =
        |model: &str, out: &str| strings(&["predict", "--model", model, "--data", &s("d.pgd"), "-o", out]);
    let mut cases: Vec<(Vec<String>, String, &str)> = vec![
        (predict(&s("run"), &s("run/model.safetensors")), s("run/model.safetensors"), "--model"),
        (
            predict(&s("run/model.safetensors"), &respelled("run/model.safetensors")),
            s("run/model.safetensors"),
            "--model",
        ),
        (predict(&s("run"), &s("hard.safetensors")), s("hard.safetensors"), "--model"),
        (predict(&s("run"), &respelled("d.pgd")), s("d.pgd"), "--data"),
    ];
    // Every file the run wrote, and those it would write (a checkpoint, a trace).
    for name in [
        "summary.json",
        "config.toml",
        "meta.json",
        "checkpoint.safetensors",
        "trace.json",
        "metrics/rank-0.jsonl",
    ] {
        cases.push((
            predict(&s("run"), &s(&format!("run/{name}"))),
            s(&format!("run/{name}")),
            "run directory",
        ));
    }
    for (kind, input) in [
        ("csv", "a.csv"),
        ("libsvm", "a.svm"),
        ("docword", "docword.txt"),
        ("ldac", "a.ldac"),
        ("ratings", "ratings.txt"),
    ] {
        cases.push((strings(&["data", "convert", kind, &s(input), &s(input)]), s(input), "INPUT"));
        cases.push((strings(&["data", "convert", kind, &s(input), &respelled(input)]), s(input), "INPUT"));
    }
    cases.push((
        strings(&["data", "convert", "csv", &s("a.csv"), &s("a.csv"), "--sparse"]),
        s("a.csv"),
        "INPUT",
    ));
    for (flag, input) in [("--images", "images.idx"), ("--labels", "labels.idx")] {
        let args =
            ["data", "convert", "idx", "--images", &s("images.idx"), "--labels", &s("labels.idx"), &s(input)];
        cases.push((strings(&args), s(input), flag));
    }
    for (flag, input) in [("--features", "x.npy"), ("--labels", "y.npy")] {
        let args = ["data", "convert", "npy", "--features", &s("x.npy"), "--labels", &s("y.npy"), &s(input)];
        cases.push((strings(&args), s(input), flag));
    }
    let ok = |args: &[&str]| {
        let out = peregrine(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    };
    ok(&["data", "standardize", &s("d.pgd"), &s("std.pgd")]);
    cases.extend(
        [
            (strings(&["data", "standardize", &s("d.pgd"), &s("d.pgd")]), s("d.pgd"), "INPUT"),
            (
                strings(&["data", "standardize", &s("d.pgd"), &s("std.pgd"), "--like", &s("std.pgd")]),
                s("std.pgd"),
                "--like",
            ),
            (
                strings(&["data", "split", &s("d.pgd"), "--train", &s("d.pgd"), "--test", &s("t.pgd")]),
                s("d.pgd"),
                "INPUT",
            ),
            (
                strings(&[
                    "data",
                    "split",
                    &s("d.pgd"),
                    "--train",
                    &s("t.pgd"),
                    "--test",
                    &respelled("d.pgd"),
                ]),
                s("d.pgd"),
                "INPUT",
            ),
            // Two outputs that are one file, which does not exist yet: refused, and not made.
            (
                strings(&[
                    "data",
                    "split",
                    &s("d.pgd"),
                    "--train",
                    &s("y.pgd"),
                    "--test",
                    &respelled("y.pgd"),
                ]),
                s("y.pgd"),
                "--train",
            ),
            (
                strings(&["simulate", "--replay", &s("run"), "--json", &s("run/summary.json")]),
                s("run/summary.json"),
                "--replay",
            ),
            (
                strings(
                    &[
                        &[
                            "slurm",
                            "sbatch",
                            "--nodes",
                            "1",
                            "--ntasks-per-node",
                            "1",
                            "--cpus-per-task",
                            "1",
                        ][..],
                        &[
                            "--time",
                            "1:00",
                            "--program",
                            &s("a.csv"),
                            "--script",
                            &respelled("a.csv"),
                            "--",
                            "conformance",
                        ],
                    ]
                    .concat(),
                ),
                s("a.csv"),
                "--program",
            ),
        ],
    );
    for (args, input, says) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let input = PathBuf::from(input);
        // Also the run directory and the input's directory unchanged.
        let run = entry(&inputs.path("run"));
        refused(d, &args, &input, says);
        assert_eq!(entry(&inputs.path("run")), run, "{args:?} changed the run directory");
    }
    assert_eq!(entry(&inputs.path("run/metrics")), Entry::Dir(vec!["rank-0.jsonl".into()]));
}

#[test]
fn outputs_elsewhere_are_written_and_temporary_files_removed() {
    let inputs = Inputs::new("temporary", true);
    let d = inputs.dir.path();
    let s = |n: &str| inputs.s(n);
    // Standard output is an output of predict's own.
    let out = peregrine(&["predict", "--model", &s("run"), "--data", &s("d.pgd"), "-o", "-"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("class,"), "{}", stderr(&out));
    // A file of another name in the run directory, and a regular file replaced.
    for target in [s("run/predictions.csv"), s("a.csv")] {
        let out = peregrine(&["predict", "--model", &s("run"), "--data", &s("d.pgd"), "-o", &target]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(std::fs::read_to_string(&target).expect("read").starts_with("class,"));
    }
    // `--sparse` writes a dense file aside first: a file of the old temporary name is not
    // touched, and nothing else stays behind.
    std::fs::write(inputs.path("s.pgd.dense.tmp"), "theirs").expect("write");
    let listing = names(d);
    let out = peregrine(&[
        "data",
        "convert",
        "npy",
        "--features",
        &s("x.npy"),
        "--labels",
        &s("y.npy"),
        &s("s.pgd"),
        "--sparse",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(inputs.path("s.pgd.dense.tmp")).expect("read"), b"theirs");
    let mut expected = listing.clone();
    expected.push("s.pgd".into());
    expected.sort();
    assert_eq!(names(d), expected);
    // A conversion that fails after the dense file was written (three classes are not two)
    // leaves nothing.
    std::fs::write(inputs.path("three.csv"), "f,label\n1,0\n2,1\n3,2\n").expect("write");
    let listing = names(d);
    let out = peregrine(&["data", "convert", "csv", &s("three.csv"), &s("three.pgd"), "--sparse"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(names(d), listing);
    // A predict that fails before writing leaves nothing either (a model of other data).
    let out = peregrine(&["predict", "--model", &s("run"), "--data", &s("s.pgd"), "-o", &s("bad.csv")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(names(d), listing);
}

#[test]
fn help_states_the_rule() {
    let out = peregrine(&["predict", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("symbolic link") && help.contains("run directory"), "{help}");
}
