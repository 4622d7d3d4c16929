//! `peregrine train` end to end on local threads: the run directory, config files and their
//! errors, bad input, divergence, LDA, the shipped configs, ranks left without chunks, the MLP split
//! by units, hashed features, huge pages, default run directories, a panicking compute thread.

use std::path::Path;
use std::process::Command;

#[path = "support/cli_common.rs"]
mod common;
use common::{
    final_eval, finish_within, long_run, ok, peregrine, peregrine_in, predicted, runs_again, scratch,
    scribble_indices, text, train_data,
};

#[path = "support/models.rs"]
mod models;
use models::safetensors_f32;

#[test]
fn train_writes_its_run_directory() {
    let d_tmp = scratch("train-run");
    let d = d_tmp.path();
    let data = train_data(d);
    let run = d.join("run");
    let out = peregrine(&[
        "train",
        "--ranks",
        "2",
        "--model",
        "lr",
        "--data",
        &data,
        "--epochs",
        "3",
        "--batch",
        "500",
        "--chunk",
        "50",
        "--lr",
        "1",
        "--straggler",
        "slow-worker:p=0.5",
        "--target-loss",
        "0.0001",
        "--run-dir",
        &run.to_string_lossy(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("lr | bsp | 2 ranks | 24 iterations"), "{stdout}");
    assert!(stdout.contains("did not reach loss <= 0.0001"), "{stdout}");
    // Standard error is not a terminal here: no progress bar.
    assert!(!stderr.contains('\r'), "{stderr:?}");
    for f in ["config.toml", "meta.json", "summary.json", "metrics/rank-0.jsonl", "metrics/rank-1.jsonl"] {
        assert!(run.join(f).exists(), "{f} missing");
    }
    let lines = std::fs::read_to_string(run.join("metrics/rank-1.jsonl")).expect("metrics");
    assert_eq!(lines.lines().count(), 24);
    for key in ["\"compute\"", "\"comm\"", "\"wait\"", "\"own\"", "\"taken\"", "\"threads\"", "\"loss\""] {
        assert!(lines.lines().all(|l| l.contains(key)), "{key} missing: {lines}");
    }
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    assert!(config.contains("model = \"lr\"") && config.contains("iterations = 24"), "{config}");
    assert!(config.contains("intercept = true"), "LR has an intercept by default: {config}");
    // The resolved configuration runs again as a config file.
    runs_again(&run, &[], &d.join("again"));
    // Without the intercept: one parameter less, and the choice recorded.
    let lr_on_1 = |data: &str, extra: &[&str]| {
        peregrine(&[&["train", "--ranks", "1", "--model", "lr", "--data", data][..], extra].concat())
    };
    let none = d.join("none");
    let out = lr_on_1(&data, &["--iterations", "2", "--no-intercept", "--run-dir", &none.to_string_lossy()]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(text(&out).0.contains("lr | bsp | 1 rank | 2 iterations"), "{:?}", text(&out));
    let config = std::fs::read_to_string(none.join("config.toml")).expect("config");
    assert!(config.contains("intercept = false"), "{config}");
    // Only LR's own keys: no factor rank or hidden layers of other models. L2 defaults to
    // 1 / training rows.
    let rows = 4000.0f32;
    assert!(config.lines().any(|l| l == format!("l2 = {}", 1.0 / rows)), "{config}");
    for other in ["k =", "hidden ="] {
        assert!(!config.lines().any(|l| l.starts_with(other)), "{other} in an LR run's config:\n{config}");
    }
    // L1 selects FTRL; the resolved optimizer and schedule are recorded and run again.
    let l1 = d.join("l1");
    let out =
        lr_on_1(&data, &["--iterations", "4", "--l1", "0.01", "-q", "--run-dir", &l1.to_string_lossy()]);
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(l1.join("config.toml")).expect("config");
    for line in ["optimizer = \"ftrl\"", "l1 = 0.01", "lr = 1.0", "warmup = 0"] {
        assert!(config.lines().any(|l| l == line), "{line} missing:\n{config}");
    }
    runs_again(&l1, &["--optimizer", "ftrl"], &d.join("l1-again"));
    let adam = d.join("adam");
    let out = lr_on_1(
        &data,
        &[
            "--iterations",
            "4",
            "--optimizer",
            "adam",
            "--lr-decay",
            "cosine",
            "--warmup",
            "2",
            "-q",
            "--run-dir",
            &adam.to_string_lossy(),
        ],
    );
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(adam.join("config.toml")).expect("config");
    for line in ["optimizer = \"adam\"", "lr-decay = \"cosine\"", "warmup = 2"] {
        assert!(config.lines().any(|l| l == line), "{line} missing:\n{config}");
    }
    // An evaluation set with more features than the training set: the fix named.
    let scratch_run = d.join("refused").to_string_lossy().into_owned();
    let wide = d.join("wide.svm");
    std::fs::write(&wide, "+1 1:1 400:1\n-1 2:1\n").expect("write");
    let wide_pgd = d.join("wide.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&["data", "convert", "libsvm", &wide.to_string_lossy(), &wide_pgd]).status.success());
    let out = lr_on_1(&data, &["--eval", &wide_pgd, "-q", "--run-dir", &scratch_run]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("--features N"), "{:?}", text(&out));
    // A text file given as a dataset: told to convert it.
    let out = lr_on_1(&wide.to_string_lossy(), &["-q", "--run-dir", &scratch_run]);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    assert!(text(&out).1.contains("peregrine data convert libsvm"), "{:?}", text(&out));
}

#[test]
fn train_config_file_errors_name_file_line_and_column() {
    let d_tmp = scratch("train-config");
    let d = d_tmp.path();
    let data = train_data(d);
    let cfg = d.join("bad.toml");
    std::fs::write(&cfg, format!("model = \"lr\"\ndata = \"{data}\"\nbatchsize = 64\n")).expect("write");
    let out = peregrine(&["train", "--config", &cfg.to_string_lossy()]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bad.toml:3:1") && stderr.contains("unknown field `batchsize`"), "{stderr}");
    std::fs::write(&cfg, "model = \"svm\"\n").expect("write");
    let (_, stderr) = text(&peregrine(&["train", "--config", &cfg.to_string_lossy()]));
    assert!(stderr.contains("bad.toml:1:9") && stderr.contains("unknown variant `svm`"), "{stderr}");
    // Scheme names are parsed where they are read.
    std::fs::write(&cfg, "model = \"lr\"\nscheme = \"ssp:soon\"\n").expect("write");
    let (_, stderr) = text(&peregrine(&["train", "--config", &cfg.to_string_lossy()]));
    assert!(stderr.contains("bad.toml:2:10") && stderr.contains("whole number"), "{stderr}");
    // A relative data path is relative to the file.
    std::fs::write(&cfg, "model = \"lr\"\ndata = \"sparse.pgd\"\niterations = 2\n").expect("write");
    let out = peregrine(&[
        "train",
        "--ranks",
        "1",
        "-q",
        "--config",
        &cfg.to_string_lossy(),
        "--run-dir",
        &d.join("rel").to_string_lossy(),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
}

#[test]
fn train_bad_input_is_a_clear_error() {
    let d_tmp = scratch("train-bad");
    let d = d_tmp.path();
    let data = train_data(d);
    let cases: &[(&[&str], i32, &str)] = &[
        (&["train", "--data", &data], 2, "no model"),
        (&["train", "--model", "lr"], 2, "no training data"),
        (&["train", "--model", "lr", "--data", &data, "--scheme", "ssp:x"], 2, "whole number"),
        (
            &["train", "--model", "lr", "--data", &data, "--straggler", "persistent:rank=0,speed=1.5"],
            2,
            "must be in (0, 1]",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--straggler", "tortoise"],
            2,
            "unknown straggler pattern",
        ),
        (
            &[
                "train",
                "--model",
                "lr",
                "--data",
                &data,
                "--straggler",
                "persistent:rank=7,speed=0.5",
                "--ranks",
                "2",
            ],
            2,
            "rank 7 does not exist",
        ),
        (&["train", "--model", "lr", "--data", &data, "--lr=-1"], 2, "learning rate must be positive"),
        (&["train", "--model", "lr", "--data", &data, "--chunk", "0"], 2, "must be at least 1"),
        (&["train", "--model", "softmax", "--data", &data], 1, "this model needs dense multiclass data"),
        (&["train", "--model", "lr", "--data", "/nonexistent.pgd"], 1, "/nonexistent.pgd"),
        (
            &["train", "--model", "lr", "--data", &data, "--epochs", "1", "--iterations", "3"],
            2,
            "cannot be used with",
        ),
        // Schemes that cannot run in the world they are given: refused before anything starts.
        (
            &["train", "--model", "lr", "--data", &data, "--ranks", "2", "--scheme", "backup:2"],
            2,
            "scheme `backup:2` cannot run with 2 ranks",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--ranks", "1", "--scheme", "backup:1"],
            2,
            "at most 0",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--scheme", "falcon:slack:-1"],
            2,
            "must be a whole number",
        ),
        (&["train", "--model", "lr", "--data", &data, "--scheme", "speculative:3"], 2, "unknown scheme"),
        (&["train", "--model", "lr", "--data", &data, "--grain", "0"], 2, "grain must be at least 1, got 0"),
        (
            &["train", "--model", "lr", "--data", &data, "--steal-fraction", "0"],
            2,
            "steal fraction must be in (0, 1]",
        ),
        (&["train", "--model", "lr", "--data", &data, "--batch", "0"], 2, "must be at least 1"),
        (
            &["train", "--model", "lr", "--data", &data, "--iterations", "0"],
            2,
            "iterations must be at least 1",
        ),
        (&["train", "--model", "lr", "--data", &data, "--threads", "100000"], 2, "at most 1024"),
        (
            &["train", "--model", "lr", "--data", &data, "--optimizer", "rmsprop"],
            2,
            "unknown optimizer `rmsprop`",
        ),
        (&["train", "--model", "lr", "--data", &data, "--optimizer", "momentum:1.5"], 2, "must be in [0, 1)"),
        (
            &["train", "--model", "mf", "--data", &data, "--optimizer", "adam"],
            2,
            "mf runs SGD over each rating",
        ),
        (&["train", "--model", "mlp", "--data", &data, "--l1", "0.1"], 2, "--l1 is for --model lr"),
        (
            &["train", "--model", "softmax", "--data", &data, "--split", "units"],
            2,
            "--split units is for --model mlp",
        ),
        (
            &["train", "--model", "mlp", "--data", &data, "--split", "units", "--hidden", "8,4"],
            2,
            "one hidden layer, not 2 (8,4)",
        ),
        (
            &["train", "--model", "mlp", "--data", &data, "--split", "columns"],
            2,
            "possible values: rows, units",
        ),
        (
            &["train", "--model", "lr", "--data", &data, "--l1", "0.1", "--optimizer", "adam"],
            2,
            "FTRL-Proximal",
        ),
        (&["train", "--model", "lr", "--data", &data, "--l1=-1"], 2, "--l1 must be 0 or more"),
        (
            &["train", "--model", "lr", "--data", &data, "--optimizer", "ftrl", "--warmup", "10"],
            2,
            "takes a constant learning rate",
        ),
        (&["train", "--model", "lr", "--data", &data, "--lr-decay", "fast"], 2, "or `cosine`"),
    ];
    let d_tmp = scratch("train-bad-cwd");
    let d = d_tmp.path();
    for (args, code, what) in cases {
        let out = peregrine_in(d, args);
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {stderr}");
        assert!(stderr.contains(what), "{args:?}: expected `{what}` in {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // Refused before anything is written: no run directory.
        assert!(!d.join("runs").exists(), "{args:?} left a run directory");
    }
}

#[test]
fn train_divergence_is_an_error() {
    let d_tmp = scratch("train-div");
    let d = d_tmp.path();
    let data = d.join("ratings.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&[
        "data",
        "gen",
        "ratings",
        &data,
        "--ratings",
        "5000",
        "--users",
        "100",
        "--items",
        "80"
    ])
    .status
    .success());
    let out = peregrine(&[
        "train",
        "--ranks",
        "1",
        "--model",
        "mf",
        "--data",
        &data,
        "--lr",
        "50",
        "--iterations",
        "5",
        "-q",
        "--run-dir",
        &d.join("run").to_string_lossy(),
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("diverged"), "{stderr}");
    // 5000 ratings are too few for strata at the default batch (8 x 8 blocks of 1024): a warning,
    // with the largest batch that keeps them.
    assert!(
        stderr.contains("warning: matrix factorization runs without strata")
            && stderr.contains("the set has 5000")
            && stderr.contains("strata with --batch 2048 or less at this --chunk"),
        "{stderr}"
    );
    // A loss that explodes but stays a number (softmax at lr 1e30) is divergence too.
    let dense = d.join("dense.pgd").to_string_lossy().into_owned();
    let gen = ["data", "gen", "dense", &dense, "--rows", "2000", "--features", "20", "--classes", "4"];
    assert!(peregrine(&gen).status.success());
    let exploded = d.join("exploded").to_string_lossy().into_owned();
    let run = |extra: &[&str]| {
        let mut args = vec!["train", "--ranks", "1", "--model", "softmax", "--data", &dense, "-q"];
        args.extend(["--run-dir", &exploded]);
        args.extend(extra);
        peregrine(&args)
    };
    let out = run(&["--lr", "1e30", "--iterations", "20"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("diverged") && stderr.contains("predicts nothing scores 1.3863"), "{stderr}");
    // Labels the features say nothing about (one row in five positive): the model can do no
    // better than always answering "negative", which is reported as a warning, or with
    // --stop-on-stall as an error.
    let noise = d.join("noise.svm");
    let rows: String = (0..2000u64)
        .map(|i| format!("{} {}:1 {}:1\n", u8::from(i % 5 == 0), i % 7 + 1, i % 11 + 8))
        .collect();
    std::fs::write(&noise, rows).expect("write");
    let noise_pgd = d.join("noise.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&["data", "convert", "libsvm", &noise.to_string_lossy(), &noise_pgd]).status.success());
    let still =
        ["train", "--ranks", "1", "--model", "lr", "--data", &noise_pgd, "--lr", "0.5", "--iterations", "40"];
    let still = [&still[..], &["--batch", "500", "--chunk", "50", "--eval-every", "5", "-q"]].concat();
    let (warned, stopped) =
        (d.join("warned").to_string_lossy().into_owned(), d.join("stopped").to_string_lossy().into_owned());
    let out = peregrine(&[&still[..], &["--run-dir", &warned]].concat());
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: the accuracy") && stderr.contains("most frequent class (0.8000)"),
        "{stderr}"
    );
    let out = peregrine(&[&still[..], &["--stop-on-stall", "--run-dir", &stopped]].concat());
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("training stopped: the accuracy"), "{stderr}");
}

/// LDA from the command line: a corpus converted, trained on 2 ranks, its config.toml run again,
/// its topic proportions predicted; bad settings and unsuited schemes refused before anything is
/// written.
#[test]
fn lda_trains_runs_its_config_again_and_refuses_bad_settings() {
    let d_tmp = scratch("lda");
    let d = d_tmp.path();
    let ldac = d.join("c.ldac");
    std::fs::write(&ldac, "3 0:2 3:1 5:4\n2 1:3 2:1\n4 0:1 2:2 4:1 5:1\n2 3:2 4:3\n").expect("write");
    let data = d.join("c.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&["data", "convert", "ldac", &ldac.to_string_lossy(), &data]).status.success());
    let run = d.join("run");
    let lda = |extra: &[&str], dir: &Path| {
        peregrine(
            &[
                &[
                    "train",
                    "--ranks",
                    "2",
                    "--model",
                    "lda",
                    "--data",
                    &data,
                    "-q",
                    "--run-dir",
                    &dir.to_string_lossy(),
                ][..],
                extra,
            ]
            .concat(),
        )
    };
    let out = lda(&["--k", "3", "--epochs", "4"], &run);
    assert!(out.status.success(), "{:?}", text(&out));
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    for line in ["model = \"lda\"", "k = 3", "alpha = 0.1", "eta = 0.01"] {
        assert!(config.lines().any(|l| l == line), "{line} missing:\n{config}");
    }
    for other in ["lr", "lr-decay", "warmup", "optimizer", "l2", "hidden", "intercept"] {
        assert!(!config.lines().any(|l| l.starts_with(&format!("{other} ="))), "{other} in:\n{config}");
    }
    runs_again(&run, &[], &d.join("again"));
    let csv = d.join("topics.csv");
    let out = peregrine(&[
        "predict",
        "--model",
        &run.to_string_lossy(),
        "--data",
        &data,
        "--out",
        &csv.to_string_lossy(),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let rows: Vec<String> = std::fs::read_to_string(&csv).expect("csv").lines().map(str::to_owned).collect();
    assert_eq!(rows.len(), 5, "a header and one row per document: {rows:?}");
    assert!(rows[0].contains("topic0,topic1,topic2"), "{}", rows[0]);
    for (args, code, says) in [
        (&["--scheme", "ssp:2"][..], 2, "bsp, lb-bsp, lb-bsp:ma, lb-bsp:narx, speculative, falcon"),
        (&["--lr", "0.1"][..], 2, "no learning rate"),
        (&["--k", "1"][..], 2, "at least 2 topics"),
        (&["--alpha", "nan"][..], 2, "--alpha must be a positive number"),
        (&["--eta", "0"][..], 2, "--eta must be a positive number"),
        (&["--eval", data.as_str()][..], 1, "held-out"),
    ] {
        let refused = d.join("refused");
        let out = lda(args, &refused);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {:?}", text(&out));
        assert!(text(&out).1.contains(says), "{args:?}: {:?}", text(&out));
        assert!(!refused.exists(), "{args:?}: a run directory was written");
    }
}

#[test]
fn every_shipped_config_runs() {
    let d_tmp = scratch("configs");
    let d = d_tmp.path();
    let sparse = train_data(d);
    let dense = d.join("dense.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&[
        "data",
        "gen",
        "dense",
        &dense,
        "--rows",
        "2000",
        "--features",
        "784",
        "--classes",
        "10"
    ])
    .status
    .success());
    let ratings = d.join("ratings.pgd").to_string_lossy().into_owned();
    assert!(peregrine(&[
        "data",
        "gen",
        "ratings",
        &ratings,
        "--ratings",
        "3000",
        "--users",
        "50",
        "--items",
        "40"
    ])
    .status
    .success());
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("configs/") {
        let path = entry.expect("entry").path();
        let body = std::fs::read_to_string(&path).expect("read");
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("experiment-")) {
            // An experiment configuration: checked (not run) here; the small one runs in CI.
            let out = peregrine(&["experiment", &path.to_string_lossy(), "--dry-run"]);
            let (stdout, stderr) = text(&out);
            assert!(
                out.status.success() && stdout.contains(" runs:"),
                "{}: {stdout}{stderr}",
                path.display()
            );
            continue;
        }
        let data = if body.contains("model = \"lr\"") {
            &sparse
        } else if body.contains("model = \"mf\"") {
            &ratings
        } else {
            &dense
        };
        let out = peregrine(&[
            "train",
            "--ranks",
            "2",
            "-q",
            "--config",
            &path.to_string_lossy(),
            "--data",
            data,
            "--eval",
            data,
            "--iterations",
            "2",
            "--run-dir",
            &d.join(format!("run-{seen}")).to_string_lossy(),
        ]);
        assert!(out.status.success(), "{}: {:?}", path.display(), text(&out));
        seen += 1;
    }
    assert!(seen >= 4, "{seen} configs");
}

/// A batch cut into fewer chunks than there are ranks is said at start (the last ranks would
/// compute only what they take over), with the chunk size that gives every rank one; a batch
/// that does is not.
#[test]
fn ranks_left_without_a_chunk_are_named_at_start() {
    let t = scratch("idle-ranks");
    let s = |n: &str| t.path().join(n).to_string_lossy().into_owned();
    ok(&["data", "gen", "sparse", &s("d.pgd"), "--rows", "4000", "--features", "300"]);
    let stderr = |chunk: &str, run: &str| {
        let (data, dir) = (s("d.pgd"), s(run));
        let args = ["train", "--model", "lr", "--data", &data, "--ranks", "4", "--batch", "128"];
        ok(&[&args[..], &["--chunk", chunk, "--iterations", "3", "--run-dir", &dir, "-q"]].concat()).1
    };
    let idle = stderr("64", "a");
    assert!(
        idle.contains(
            "warning: --batch 128 in chunks of 64 rows is 2 chunk(s) an iteration for 4 ranks: ranks 2 to 3"
        ) && idle.contains("--chunk 32 or less gives every rank one"),
        "{idle}"
    );
    let busy = stderr("32", "b");
    assert!(!busy.contains("chunk(s) an iteration"), "{busy}");
}

#[test]
fn an_mlp_split_by_units_trains_the_same_network() {
    // One rank of 2 threads, the hidden units split between them or chunks of their own: the
    // same model file (in PyTorch's order either way), up to the sums' grouping.
    let t = scratch("split-units");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "2000", "--features", "12", "--classes", "3"]);
    let data = s("d.pgd");
    for split in ["rows", "units"] {
        let run = format!("run-{split}");
        let out = peregrine_in(
            d,
            &[
                "train",
                "--model",
                "mlp",
                "--hidden",
                "40",
                "--data",
                &data,
                "--split",
                split,
                "--iterations",
                "30",
                "--batch",
                "64",
                "--ranks",
                "1",
                "--threads",
                "2",
                "-q",
                "--run-dir",
                &run,
            ],
        );
        assert!(out.status.success(), "{split}: {:?}", text(&out));
    }
    let (rows, units) = (
        safetensors_f32(&d.join("run-rows/model.safetensors")),
        safetensors_f32(&d.join("run-units/model.safetensors")),
    );
    assert_eq!(rows.keys().collect::<Vec<_>>(), units.keys().collect::<Vec<_>>());
    for (name, r) in &rows {
        let u = &units[name];
        let worst = r.iter().zip(u).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-3, "{name}: the two differ by up to {worst}");
    }
}

#[test]
fn a_panic_on_a_compute_thread_ends_the_run_naming_rank_and_thread() {
    let t = scratch("panic");
    let (data, child) = long_run(t.path(), &["--ranks", "2", "--watchdog", "0", "--huge-pages", "off"]);
    scribble_indices(&data);
    let (out, took) = finish_within(child, std::time::Duration::from_secs(60));
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(101), "{stderr}");
    assert!(took.as_secs() < 20, "{took:?}");
    // A rank of one compute thread on its loop thread's own core runs its chunks on that thread.
    let named = stderr.contains("(pgr-s") || stderr.contains("run on its loop thread (rank-");
    assert!(stderr.contains("compute thread") && named, "{stderr}");
    assert!(stderr.contains("big.pgd (its modification time changed)"), "{stderr}");
}

#[test]
fn default_run_directories_are_unique_and_results_are_not_overwritten() {
    let t = scratch("unique");
    let d = t.path();
    let data = d.join("d.pgd");
    ok(&["data", "gen", "sparse", data.to_str().expect("utf-8"), "--rows", "2000", "--features", "100"]);
    // Four runs started at once (a seed sweep) in one directory: four run directories.
    let runs: Vec<_> = (1..=4)
        .map(|seed| {
            Command::new(env!("CARGO_BIN_EXE_peregrine"))
                .args([
                    "train",
                    "--model",
                    "lr",
                    "--data",
                    data.to_str().expect("utf-8"),
                    "--iterations",
                    "5",
                ])
                .args(["--seed", &seed.to_string(), "--quiet"])
                .current_dir(d)
                .output()
                .expect("run")
        })
        .collect();
    for out in &runs {
        assert!(out.status.success(), "{}", text(out).1);
    }
    let dirs: Vec<_> =
        std::fs::read_dir(d.join("runs")).expect("runs/").map(|e| e.expect("entry").path()).collect();
    assert_eq!(dirs.len(), 4, "{dirs:?}");
    for dir in &dirs {
        assert!(dir.join("summary.json").exists(), "{}", dir.display());
    }
    // A finished run directory is not written again without --force.
    let again = peregrine_in(d, &["train", "--model", "lr", "--data", "d.pgd", "--iterations", "5"]);
    assert!(again.status.success());
    let run = dirs[0].to_str().expect("utf-8");
    let before = std::fs::read(dirs[0].join("summary.json")).expect("summary");
    let out = peregrine_in(
        d,
        &["train", "--model", "lr", "--data", "d.pgd", "--iterations", "7", "--run-dir", run],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out).1);
    assert!(text(&out).1.contains("holds a finished run"), "{}", text(&out).1);
    assert_eq!(std::fs::read(dirs[0].join("summary.json")).expect("summary"), before, "results kept");
}

/// The training set copied into memory with huge pages or read through its mapping, the model is
/// the same to the last bit (1 rank, 1 thread: a deterministic run); the set is 9.4 MB, past the
/// 8 MiB below which nothing is copied. A value other than auto, on or off is refused.
#[test]
fn the_training_set_in_huge_pages_trains_the_model_of_the_mapped_file() {
    let t = scratch("huge-pages");
    let d = t.path();
    let s = |name: &str| d.join(name).to_str().expect("utf-8").to_owned();
    ok(&["data", "gen", "dense", &s("d.pgd"), "--rows", "3000", "--features", "784", "--classes", "10"]);
    let model = |when: &str| {
        let run = s(&format!("run-{when}"));
        ok(&[
            "train",
            "--model",
            "softmax",
            "--data",
            &s("d.pgd"),
            "--iterations",
            "30",
            "--ranks",
            "1",
            "--threads",
            "1",
            "--checkpoint-every",
            "0",
            "--huge-pages",
            when,
            "--run-dir",
            &run,
            "-q",
        ]);
        let bytes = std::fs::read(Path::new(&run).join("model.safetensors")).expect("model");
        let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let mut tensors: Vec<(String, Vec<u8>)> =
            st.tensors().into_iter().map(|(name, v)| (name, v.data().to_vec())).collect();
        tensors.sort();
        tensors
    };
    let off = model("off");
    assert!(model("on") == off, "on: another model");
    assert!(model("auto") == off, "auto: another model");
    let out = peregrine(&["train", "--model", "softmax", "--data", &s("d.pgd"), "--huge-pages", "sometimes"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--huge-pages") && stderr.contains("sometimes"), "{stderr}");
}

/// `--hash-bits`: LIBSVM data whose feature ids reach 2^32 - 2 (a model of one weight a column
/// would be 4 G weights) trains hashed into 2^12 buckets, learns the label that two of those ids
/// decide, records the bits in config.toml and model.safetensors, and predicts what it was
/// evaluated at (predict hashes alike); out-of-range bits and other models are refused with
/// nothing written.
#[test]
fn hashed_features_train_on_raw_ids_and_predict_alike() {
    let t = scratch("hashed");
    let d = t.path();
    let s = |p: &Path| p.to_str().expect("utf-8").to_owned();
    let mut svm = String::new();
    let mut state = 7u64;
    for row in 0..3000u64 {
        // A few noise ids spread over all of u32, and one of two deciding ids.
        let y = row % 2;
        let mut ids: Vec<u64> = (0..4)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (state >> 33) % 4_000_000_000
            })
            .collect();
        ids.push(if y == 1 { 4_294_967_294 } else { 123_456_789 });
        ids.sort_unstable();
        ids.dedup();
        let feats: Vec<String> = ids.iter().map(|i| format!("{}:1", i + 1)).collect();
        svm.push_str(&format!("{y} {}\n", feats.join(" ")));
    }
    std::fs::write(d.join("raw.svm"), svm).expect("write");
    let data = s(&d.join("raw.pgd"));
    ok(&["data", "convert", "libsvm", &s(&d.join("raw.svm")), &data]);
    let run = d.join("run");
    let r = s(&run);
    let base = ["train", "--model", "lr", "--data", &data, "--run-dir", &r, "--quiet"];
    for (extra, want) in [
        (&["--hash-bits", "0"][..], "--hash-bits must be from 1 to 28"),
        (&["--hash-bits", "29"], "--hash-bits must be from 1 to 28"),
        (&["--hash-bits=-3"], "--hash-bits"),
    ] {
        let out = peregrine(&[&base[..], extra].concat());
        let (_, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(stderr.contains(want), "{extra:?}: {stderr}");
        assert!(!run.exists(), "{extra:?} wrote {r}");
    }
    let out =
        peregrine(&["train", "--model", "softmax", "--data", &data, "--hash-bits", "12", "--run-dir", &r]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("--hash-bits is for --model lr"), "{:?}", text(&out));
    assert!(!run.exists());
    ok(&[&base[..], &["--hash-bits", "12", "--epochs", "5", "--ranks", "2"]].concat());
    let (loss, accuracy) = final_eval(&run);
    assert!(loss < 0.4 && accuracy > 0.97, "hashed LR (blind: 0.693): loss {loss}, accuracy {accuracy}");
    let config = std::fs::read_to_string(run.join("config.toml")).expect("config");
    assert!(config.contains("hash-bits = 12"), "{config}");
    let bytes = std::fs::read(run.join("model.safetensors")).expect("model");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).expect("json header");
    assert_eq!(header["weight"]["shape"], serde_json::json!([4096]));
    assert_eq!(header["__metadata__"]["hash_bits"], "12");
    let (_, stderr) = ok(&["predict", "--model", &r, "--data", &data, "-o", &s(&d.join("p.csv"))]);
    let (p_loss, p_accuracy) = predicted(&stderr);
    assert!((p_loss - loss).abs() <= 1e-4, "predict loss {p_loss} vs training's {loss}");
    assert!((p_accuracy - accuracy).abs() <= 1e-3, "{p_accuracy} vs {accuracy}");
    // The configuration file runs it again.
    let again = d.join("again");
    ok(&["train", "--config", &s(&run.join("config.toml")), "--run-dir", &s(&again), "--quiet"]);
    // (Within float noise: which rank sums which chunk varies from run to run.)
    let again_loss = final_eval(&again).0;
    assert!((again_loss - loss).abs() <= 1e-4 * loss, "the recorded configuration: {again_loss} vs {loss}");
}
