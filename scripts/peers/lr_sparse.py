#!/usr/bin/env python3
"""Logistic regression peers on a Peregrine sparse dataset: Vowpal Wabbit (its defaults: adaptive,
normalized, invariant updates, learning rate 0.5, from its binary cache) and scikit-learn
(LogisticRegression with lbfgs, C=1; SGDClassifier with the log loss). Each is run with more and
more passes (VW, SGD) or iterations (lbfgs) until its training log-loss, computed over the whole
training set, is at or below --target; the time is that run's fit (data already in memory or in
VW's cache, as Peregrine's is mapped). Prints one JSON line per tool.

    lr_sparse.py --data adult.pgd --target 0.345 --work DIR [--tools vw,lbfgs,sgd]
"""
import argparse
import json
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgd  # noqa: E402


def log_loss(y, p):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def sweep(fit, steps, target):
    """Runs fit(s) for each s in steps until the loss reaches target: (time, loss, s) of that run,
    or of the last one with reached False."""
    took = loss = s = None
    for s in steps:
        took, loss = fit(s)
        if loss <= target:
            return {"time_to_target": took, "final_loss": loss, "steps": s}
    return {"time_to_target": None, "final_loss": loss, "steps": s, "last_fit_seconds": took}


def vw(x, y, target, work, max_passes):
    from vowpalwabbit import Workspace
    import vowpalwabbit
    text = os.path.join(work, "train.vw")
    cache = os.path.join(work, "train.vw.cache")
    preds = os.path.join(work, "preds.txt")
    model = os.path.join(work, "model.vw")
    if not os.path.exists(text):
        with open(text, "w") as f:
            for r in range(x.shape[0]):
                lo, hi = x.indptr[r], x.indptr[r + 1]
                feats = " ".join(f"{j}:{v:g}" for j, v in zip(x.indices[lo:hi], x.data[lo:hi]))
                f.write(f"{1 if y[r] > 0 else -1} |f {feats}\n")
    common = f"--loss_function logistic --link logistic --holdout_off --quiet --cache_file {cache}"
    if not os.path.exists(cache):
        # Parses the text once into VW's binary cache; the timed runs read the cache.
        Workspace(f"-d {text} {common}").finish()

    def fit(passes):
        t0 = time.perf_counter()
        w = Workspace(f"{common} --passes {passes} -f {model}")
        w.finish()
        took = time.perf_counter() - t0
        Workspace(f"-t -i {model} -d {text} -p {preds} --quiet --link logistic").finish()
        return took, log_loss(y, np.loadtxt(preds, usecols=0))

    r = sweep(fit, range(1, max_passes + 1), target)
    r.update({"peer": f"vowpalwabbit {vowpalwabbit.__version__} (1 thread)",
              "flags": f"{common.split(' --cache_file')[0]}, passes from its cache", "unit": "passes"})
    return r


def timed_fit(m, x, y):
    """Fits the scikit-learn classifier m (stopped early on purpose: no convergence warning);
    returns the fit's seconds and the training log-loss."""
    from sklearn.exceptions import ConvergenceWarning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        t0 = time.perf_counter()
        m.fit(x, y)
        took = time.perf_counter() - t0
    return took, log_loss(y, m.predict_proba(x)[:, 1])


def lbfgs(x, y, target, max_iter):
    import sklearn
    from sklearn.linear_model import LogisticRegression

    def fit(iters):
        return timed_fit(LogisticRegression(C=1.0, solver="lbfgs", max_iter=iters), x, y)

    steps = sorted({min(max_iter, int(round(1.4 ** e))) for e in range(1, 40)})
    r = sweep(fit, steps, target)
    r.update({"peer": f"scikit-learn {sklearn.__version__} LogisticRegression (lbfgs)",
              "flags": "C=1 (L2 1/n per row), intercept", "unit": "iterations"})
    return r


def sgd(x, y, target, max_epochs):
    import sklearn
    from sklearn.linear_model import SGDClassifier

    def fit(epochs):
        m = SGDClassifier(loss="log_loss", alpha=1.0 / x.shape[0], max_iter=epochs, tol=None, random_state=1)
        return timed_fit(m, x, y)

    r = sweep(fit, range(1, max_epochs + 1), target)
    r.update({"peer": f"scikit-learn {sklearn.__version__} SGDClassifier (log loss)",
              "flags": "alpha 1/n, optimal learning rate, intercept", "unit": "epochs"})
    return r


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--target", type=float, required=True)
    p.add_argument("--work", required=True, help="directory for VW's text, cache and model")
    p.add_argument("--tools", default="vw,lbfgs,sgd")
    p.add_argument("--max", type=int, default=30, help="most passes, epochs or iterations / 10")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    x, y = pgd.sparse(a.data)
    for tool in a.tools.split(","):
        if tool == "vw":
            r = vw(x, y, a.target, a.work, a.max)
        elif tool == "lbfgs":
            r = lbfgs(x, y, a.target, 10 * a.max)
        elif tool == "sgd":
            r = sgd(x, y, a.target, a.max)
        else:
            p.error(f"unknown tool {tool!r} (vw, lbfgs, sgd)")
        r["tool"] = tool
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
