#!/usr/bin/env python3
"""Judged problems from public data, and scikit-learn's figures on them: what the quality tests
(launch/tests/quality.rs) compare Peregrine's defaults against, in the same run.

    python3 scripts/sklearn_judged.py DIR [MOVIELENS_INTER]

No default of Peregrine was chosen on these sets (docs/defaults.md). They come as a user has
them, at their raw scale: scikit-learn's bundled `breast_cancer` (569 rows, 30 measurements
from 0.0008 to 4254, binary), `wine` (178 rows, 13 measurements up to 1680, 3 classes) and
`digits` (1,797 8x8 images, pixels 0-16, 10 classes), read from the installed package; and, if
MOVIELENS_INTER (the MovieLens-100k ratings, `user item rating time` rows after a header) is
given, `movielens-likes`: each rating a row of two one-hot features (user `u` is feature `u`,
item `i` feature `943 + i`), label 1 for a rating of 4 or 5.

The bundled sets are small (45 test rows for wine), so each is split `SPLITS` times (stratified,
75/25, seeds 0..SPLITS-1) and judged by the mean over the splits. For every split, DIR receives
`<name>-<k>.train.<ext>` and `<name>-<k>.test.<ext>` (LIBSVM for binary sets, CSV with a
`label` column for multiclass ones) with the raw features; movielens-likes has one 80/20 split.
scikit-learn fits, as the model issue states them: LogisticRegression() (lbfgs, C = 1) on
features standardized by StandardScaler fitted on the training file (the one-hot set as it is),
multinomial for multiclass sets; MLPClassifier(hidden_layer_sizes=(128,), random_state=k) on the
standardized features. Prints one JSON object: for every problem, its files, task, and the mean
test log-loss and accuracy of each fit.
"""
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import sklearn
from sklearn import datasets
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, log_loss
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

SPLITS = 5
MOVIELENS_USERS = 943


def write_libsvm(path, x, y):
    with open(path, "w") as f:
        for row, label in zip(x, y):
            feats = " ".join(f"{j + 1}:{v:.9g}" for j, v in enumerate(row) if v != 0)
            f.write(f"{'+1' if label else '-1'} {feats}\n")


def write_csv(path, x, y):
    with open(path, "w") as f:
        f.write(",".join(f"x{j}" for j in range(x.shape[1])) + ",label\n")
        for row, label in zip(x, y):
            f.write(",".join(f"{v:.9g}" for v in row) + f",{label}\n")


def fit(task, xtr, ytr, xte, yte, seed, standardize=True):
    """scikit-learn's test figures on one split."""
    if standardize:
        s = StandardScaler().fit(xtr)
        xtr, xte = s.transform(xtr), s.transform(xte)
    out = {}
    fits = {"lr" if task == "binary" else "softmax": LogisticRegression(max_iter=10000)}
    if task == "multiclass":
        fits["mlp"] = MLPClassifier(hidden_layer_sizes=(128,), random_state=seed)
    for name, m in fits.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            p = m.fit(xtr, ytr).predict_proba(xte)
        pred = m.classes_[p.argmax(1)]
        out[name] = {"log_loss": log_loss(yte, p, labels=m.classes_), "accuracy": accuracy_score(yte, pred)}
    return out


def mean(figures):
    return {
        fit_name: {k: float(np.mean([f[fit_name][k] for f in figures])) for k in figures[0][fit_name]}
        for fit_name in figures[0]
    }


def bundled(d, name, load, task):
    x, y = load(return_X_y=True)
    ext = "libsvm" if task == "binary" else "csv"
    write = write_libsvm if task == "binary" else write_csv
    figures, files = [], []
    for k in range(SPLITS):
        xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=k, stratify=y)
        pair = [d / f"{name}-{k}.{s}.{ext}" for s in ("train", "test")]
        write(pair[0], xtr, ytr)
        write(pair[1], xte, yte)
        files.append([str(p) for p in pair])
        figures.append(fit(task, xtr, ytr, xte, yte, k))
    return {"task": task, "features": x.shape[1], "files": files, "sklearn": mean(figures)}


def movielens(d, inter):
    rows = np.loadtxt(inter, skiprows=1, usecols=(0, 1, 2))
    users, items, y = rows[:, 0].astype(int), rows[:, 1].astype(int), (rows[:, 2] >= 4).astype(int)
    features = MOVIELENS_USERS + int(items.max())
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, test_size=0.2, random_state=0)
    pair = [d / f"movielens-likes-0.{s}.libsvm" for s in ("train", "test")]
    for path, part in zip(pair, (tr, te)):
        with open(path, "w") as f:
            for r in part:
                f.write(f"{'+1' if y[r] else '-1'} {users[r]}:1 {MOVIELENS_USERS + items[r]}:1\n")
    from scipy.sparse import csr_matrix

    def onehot(part):
        n = len(part)
        cols = np.concatenate([users[part] - 1, MOVIELENS_USERS + items[part] - 1])
        return csr_matrix((np.ones(2 * n), (np.tile(np.arange(n), 2), cols)), shape=(n, features))

    f = fit("binary", onehot(tr), y[tr], onehot(te), y[te], 0, standardize=False)
    return {"task": "binary", "features": features, "files": [[str(p) for p in pair]], "sklearn": f}


def main():
    d = Path(sys.argv[1])
    d.mkdir(parents=True, exist_ok=True)
    problems = {
        "breast-cancer": bundled(d, "breast-cancer", datasets.load_breast_cancer, "binary"),
        "wine": bundled(d, "wine", datasets.load_wine, "multiclass"),
        "digits": bundled(d, "digits", datasets.load_digits, "multiclass"),
    }
    if len(sys.argv) > 2:
        problems["movielens-likes"] = movielens(d, sys.argv[2])
    print(json.dumps({"sklearn": sklearn.__version__, "numpy": np.__version__, "problems": problems}))


if __name__ == "__main__":
    main()
