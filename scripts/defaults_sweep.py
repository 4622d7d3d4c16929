#!/usr/bin/env python3
"""The sweep Peregrine's training defaults were chosen by (docs/defaults.md).

    cargo build --release -p peregrine -p peregrine-tests
    python3 scripts/defaults_sweep.py WORKDIR [lr|softmax|mlp ...]

Tuning data only: Adult and heart_scale (80/20 random splits), Fashion-MNIST (its own test set),
the generated tuning problems of tests/src/problems.rs (`problems DIR tuning`), standardized
where dense (`tune-multiclass-small` and `-clean` have 300 and 150 training rows), and one-hot (user, item) like/dislike pairs from `peregrine data gen onehot`
(`tune-onehot`). The problems the quality tests judge (launch/tests/quality.rs) are not used here.

Logistic regression is swept twice: on the sparse sets (features mostly absent: Adult,
tune-sparse, tune-onehot), whose default is `lr`'s default on sparse data, and on the dense ones
(heart_scale, tune-binary), whose default is `lr`'s on dense data (`ModelKind::defaults`).

For every model, optimizer, learning rate and training length, trains on 2 local ranks under
BSP and records the test loss. A setting's score on a dataset is its test loss over the best
test loss any setting reached there; the default is the setting whose worst score over the
datasets is smallest (robust rather than best on one set); datasets whose test set has fewer than
1000 rows (heart_scale: 54) are shown but not scored, their test loss having a standard error
(~7 %) larger than the differences scored. Prints one table per model.
"""
import json
import os
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("PEREGRINE_BIN_DIR", ROOT / "target" / "release"))
PEREGRINE = str(BIN / "peregrine")
FMNIST = Path("/usr/share/datasets/fashion-mnist")

BATCH = {"lr": 4096, "softmax": 256, "mlp": 128}
OPTIMIZERS = {
    "lr": ["sgd", "momentum", "adagrad", "adam", "ftrl"],
    "softmax": ["sgd", "momentum", "adagrad", "adam"],
    "mlp": ["sgd", "momentum", "adagrad", "adam"],
}
# Learning rates per optimizer: a decade in half-decade steps around the usual values.
LRS = {
    "sgd": [0.03, 0.1, 0.3, 1.0, 3.0],
    "momentum": [0.003, 0.01, 0.03, 0.1, 0.3],
    "adagrad": [0.01, 0.03, 0.1, 0.3, 1.0],
    "adam": [0.0003, 0.001, 0.003, 0.01, 0.03],
    "ftrl": [0.01, 0.03, 0.1, 0.3, 1.0],
}
# Training length: 5 epochs, and 5 epochs or at least N iterations, whichever is longer.
MIN_ITERS = {"lr": [0, 300, 1000], "softmax": [0, 1000, 3000], "mlp": [0, 1000, 3000, 10000]}
EPOCHS = 5
# L2: none, or 1 / training rows (scikit-learn's and LIBLINEAR's C = 1).
L2S = {"lr": [0, "1/n"], "softmax": ["1/n"], "mlp": ["1/n"]}
# Learning-rate decay: inverse-time per epoch (lr / (1 + F epoch)), or cosine to 0.
DECAYS = {"lr": [0], "softmax": [0, 1, "cosine"], "mlp": [0, 1, "cosine"]}
# What a setting is scored by: the test loss (lr, softmax: the quality tests judge log-loss), or
# the test error rate 1 - accuracy (mlp: judged by accuracy; its log-loss also grows with
# confidence on rows it already classifies right).
SCORE = {"lr": "loss", "softmax": "loss", "mlp": "error"}
# Rows of each table printed (best first).
TOP = 25


def run(*args):
    r = subprocess.run([PEREGRINE, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"peregrine {' '.join(map(str, args))}: {r.stderr.strip()}")
    return r.stdout


def rows(path):
    out = run("data", "info", path)
    for tok in ("rows ", "ratings "):
        if tok in out:
            return int(out.split(tok)[1].split()[0])
    raise ValueError(out)


def prepare(work):
    """(model family, name, train, test) for every tuning dataset."""
    work.mkdir(parents=True, exist_ok=True)
    sets = []
    pgd = lambda n: work / f"{n}.pgd"
    if not pgd("tune-onehot-train").exists():
        run("data", "gen", "onehot", pgd("tune-onehot"), "--rows", 200000, "--users", 3000, "--items", 5000,
            "--zipf", 1.0, "--noise", 1.0, "--seed", 5)
        run("data", "split", pgd("tune-onehot"), "--train", pgd("tune-onehot-train"), "--test", pgd("tune-onehot-test"),
            "--test-fraction", 0.2, "--seed", 1)
    if not pgd("tune-multiclass-clean-train").exists():
        subprocess.run([str(BIN / "problems"), work, "tuning"], check=True, capture_output=True)
        for n in ["tune-multiclass-small", "tune-multiclass-clean"]:
            for s in ["train", "test"]:
                if not pgd(f"{n}-{s}").exists():
                    run("data", "convert", "csv", work / f"{n}.{s}.csv", pgd(f"{n}-{s}"))
    if not pgd("adult-train").exists():
        run("data", "convert", "libsvm", ROOT / "tests/data/adult.libsvm.gz", pgd("adult"))
        run("data", "split", pgd("adult"), "--train", pgd("adult-train"), "--test", pgd("adult-test"), "--test-fraction", 0.2)
        run("data", "convert", "libsvm", ROOT / "tests/data/heart_scale", pgd("heart"))
        run("data", "split", pgd("heart"), "--train", pgd("heart-train"), "--test", pgd("heart-test"), "--test-fraction", 0.2)
        subprocess.run([str(BIN / "problems"), work, "tuning"], check=True, capture_output=True)
        for n in ["tune-binary", "tune-sparse"]:
            for s in ["train", "test"]:
                run("data", "convert", "libsvm", work / f"{n}.{s}.libsvm", pgd(f"{n}-{s}-raw"), "--features", 50 if n == "tune-binary" else 5000)
        run("data", "standardize", pgd("tune-binary-train-raw"), pgd("tune-binary-train"))
        run("data", "standardize", pgd("tune-binary-test-raw"), pgd("tune-binary-test"), "--like", pgd("tune-binary-train"))
        for s in ["train", "test"]:
            pgd(f"tune-sparse-{s}-raw").rename(pgd(f"tune-sparse-{s}"))
            run("data", "convert", "csv", work / f"tune-multiclass.{s}.csv", pgd(f"tune-multiclass-{s}"))
        run("data", "convert", "idx", "--images", FMNIST / "train-images-idx3-ubyte.gz", "--labels", FMNIST / "train-labels-idx1-ubyte.gz", pgd("fmnist-train"))
        run("data", "convert", "idx", "--images", FMNIST / "t10k-images-idx3-ubyte.gz", "--labels", FMNIST / "t10k-labels-idx1-ubyte.gz", pgd("fmnist-test"))
    for n in ["adult", "tune-sparse", "tune-onehot"]:
        sets.append(("lr-sparse", n, pgd(f"{n}-train"), pgd(f"{n}-test")))
    for n in ["heart", "tune-binary"]:
        sets.append(("lr-dense", n, pgd(f"{n}-train"), pgd(f"{n}-test")))
    for n in ["fmnist", "tune-multiclass", "tune-multiclass-small", "tune-multiclass-clean"]:
        sets.append(("dense", n, pgd(f"{n}-train"), pgd(f"{n}-test")))
    return sets


def train(work, model, train_set, test_set, opt, lr, iters, l2, decay):
    d = work / "runs" / f"{model}-{train_set.stem}-{opt}-{lr}-{iters}-{l2:.3g}-d{decay}"
    s = d / "summary.json"
    if not s.exists():
        run("train", "--model", model, "--data", train_set, "--eval", test_set, "--optimizer", opt,
            "--lr", lr, "--iterations", iters, "--l2", l2, "--lr-decay", decay, "--ranks", 2,
            "--run-dir", d, "--quiet")
    e = json.loads(s.read_text())["evals"][-1]
    loss = e["loss"] if math.isfinite(e["loss"]) else float("inf")
    return loss, e["metric"]


def main():
    work = Path(sys.argv[1]).resolve()
    groups = sys.argv[2:] or ["lr", "softmax", "mlp"]
    groups = [g for x in groups for g in (["lr-sparse", "lr-dense"] if x == "lr" else [x])]
    sets = prepare(work)
    for group in groups:
        model = group.split("-")[0]
        family = group if model == "lr" else "dense"
        data = [s for s in sets if s[0] == family]
        results = {}
        for _, name, tr, te in data:
            n = rows(tr)
            per_epoch = math.ceil(n / BATCH[model])
            for opt in OPTIMIZERS[model]:
                for lr in LRS[opt]:
                    for m in MIN_ITERS[model]:
                        iters = max(EPOCHS * per_epoch, m)
                        for l2 in L2S[model]:
                            for decay in DECAYS[model]:
                                if opt == "ftrl" and decay:
                                    continue
                                # The longest runs and cosine decay only for the two best rules
                                # of the shorter ones.
                                if (m == 10000 or decay == "cosine") and opt not in ("adam", "momentum"):
                                    continue
                                if decay == "cosine" and m < 3000:
                                    continue
                                v = 1 / n if l2 == "1/n" else 0.0
                                results[(opt, lr, m, l2, decay, name)] = train(work, model, tr, te, opt, lr, iters, v, decay)
        if SCORE[model] == "error":
            results = {k: (1.0 - a, a) for k, (_, a) in results.items()}
        best = {name: min(v[0] for k, v in results.items() if k[-1] == name) for _, name, _, _ in data}
        names = [d[1] for d in data]
        scored = [rows(te) >= 1000 for _, _, _, te in data]
        what = "test loss" if SCORE[model] == "loss" else "test error rate"
        print(f"\n## {group}: {what} / best {what} of the sweep (accuracy)\n")
        shown = [n if keep else f"{n} (not scored)" for n, keep in zip(names, scored)]
        print("| optimizer | lr | min iterations | l2 | decay | " + " | ".join(shown) + " | worst |")
        print("|---|---|---|---|---|" + "---|" * (len(names) + 1))
        rows_out = []
        for key in sorted({k[:-1] for k in results}, key=str):
            r = [results[key + (n,)] for n in names]
            score = [l / best[n] for (l, _), n in zip(r, names)]
            worst = max(x for x, keep in zip(score, scored) if keep)
            rows_out.append((worst, key, r, score))
        rows_out.sort(key=lambda x: x[0])
        for worst, key, r, score in rows_out[:TOP]:
            cells = [f"{s:.3f} ({a:.3f})" for s, (_, a) in zip(score, r)]
            print("| " + " | ".join(map(str, key)) + " | " + " | ".join(cells) + f" | {worst:.3f} |")
        print("\nbest setting per optimizer (its learning rate is the default under that optimizer):\n")
        for opt in OPTIMIZERS[model]:
            worst, (_, lr, m, l2, decay), _, _ = next(x for x in rows_out if x[1][0] == opt)
            print(f"- {opt}: lr {lr}, min iterations {m}, l2 {l2}, decay {decay}: worst {worst:.3f}")
        print(f"\nbest {what} per dataset: " + ", ".join(f"{n} {best[n]:.4f}" for n in names))


if __name__ == "__main__":
    main()
