#!/usr/bin/env python3
"""scikit-learn's fits of the generated learning problems, the figures the held-out quality
tests (launch/tests/quality.rs) compare Peregrine's defaults against.

    cargo run --release -p peregrine-tests --bin problems -- DIR judged
    python3 scripts/sklearn_reference.py DIR [NAME...]

Binary problems: LogisticRegression() (C=1, lbfgs, intercept) on features standardized with
StandardScaler fitted on the training file (dense) or as they are (sparse, one-hot).
Multiclass problems: LogisticRegression() (multinomial) and MLPClassifier() (one hidden layer of
100 ReLU units, Adam, up to 200 epochs): the mean over random_state 0..4, whose runs differ by
about a point of accuracy. Every figure is on the test file.
"""
import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_svmlight_file
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, log_loss
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler
import sklearn


def binary(d, name):
    xtr, ytr = load_svmlight_file(str(d / f"{name}.train.libsvm"))
    xte, yte = load_svmlight_file(str(d / f"{name}.test.libsvm"), n_features=xtr.shape[1])
    dense = xtr.nnz == xtr.shape[0] * xtr.shape[1]
    if dense:
        s = StandardScaler().fit(xtr.toarray())
        xtr, xte = s.transform(xtr.toarray()), s.transform(xte.toarray())
    m = LogisticRegression(max_iter=1000).fit(xtr, ytr)
    p = m.predict_proba(xte)[:, 1]
    return {"lr_log_loss": log_loss(yte, p), "lr_accuracy": accuracy_score(yte > 0, p > 0.5),
            "positives": float((ytr > 0).mean())}


def multiclass(d, name):
    tr = np.loadtxt(d / f"{name}.train.csv", delimiter=",", skiprows=1)
    te = np.loadtxt(d / f"{name}.test.csv", delimiter=",", skiprows=1)
    xtr, ytr, xte, yte = tr[:, :-1], tr[:, -1].astype(int), te[:, :-1], te[:, -1].astype(int)
    out = {}
    m = LogisticRegression(max_iter=1000).fit(xtr, ytr)
    p = m.predict_proba(xte)
    out["softmax_log_loss"], out["softmax_accuracy"] = log_loss(yte, p), accuracy_score(yte, p.argmax(1))
    losses, accs = [], []
    for seed in range(5):
        p = MLPClassifier(random_state=seed).fit(xtr, ytr).predict_proba(xte)
        losses.append(log_loss(yte, p))
        accs.append(accuracy_score(yte, p.argmax(1)))
    out["mlp_log_loss"], out["mlp_accuracy"] = np.mean(losses), np.mean(accs)
    out["mlp_accuracy_sd"] = np.std(accs)
    return out


def main():
    d = Path(sys.argv[1])
    names = sys.argv[2:] or sorted({p.name.split(".")[0] for p in d.glob("*.train.*")})
    print(f"# scikit-learn {sklearn.__version__}, numpy {np.__version__}")
    for name in names:
        f = multiclass if (d / f"{name}.train.csv").exists() else binary
        figures = f(d, name)
        print(name, " ".join(f"{k}={v:.4f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
