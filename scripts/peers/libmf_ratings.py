#!/usr/bin/env python3
"""libmf (PyPI `libmf`, its C++ built with AVX by bench-peers.sh) on Peregrine ratings datasets:
k factors, `--iters` epochs of its default solver (L2-regularized, squared loss, no biases),
`--threads` threads. Prints one JSON line: seconds per epoch and the test RMSE.

An epoch's time is the fit's marginal cost: a fit of 1 epoch and one of `--iters`, back to back in
this process, `(T(iters) - T(1)) / (iters - 1)`. A fit also copies the ratings, scales them, sorts
them into its grid of blocks and sets up its model (~9 ms on MovieLens-100k: ~0.45 ms of each
epoch over 20, a tenth to a fifth of an epoch), where Peregrine's training time starts after its
own setup; the whole fit over the epochs is printed too (`fit_epoch_seconds`).

    libmf_ratings.py --train ml-train.pgd --test ml-test.pgd --k 40 --iters 20 --threads 2
"""
import argparse
import contextlib
import io
import json
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pgd  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--k", type=int, default=40)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    if a.iters < 2:
        p.error("--iters must be at least 2 (an epoch's time is the difference of two fits)")
    # The bindings print which shared object they load.
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from libmf import mf
    u, i, r, _, _ = pgd.ratings(a.train)
    tu, ti, tr, _, _ = pgd.ratings(a.test)
    train = np.stack([u, i, r], axis=1).astype(np.float32)
    # libmf's own defaults (mf_get_default_param, as its command line): L2 0.1 on both factors, no
    # L1. The bindings' defaults differ (L1 0.04, L2 0) and reach a test RMSE of 1.45 here.
    params = dict(lambda_p1=0.0, lambda_q1=0.0, lambda_p2=0.1, lambda_q2=0.1, eta=0.1, nr_bins=26)

    def fit(iters):
        engine = mf.MF(k=a.k, nr_threads=a.threads, nr_iters=iters, quiet=True, **params)
        t0 = time.perf_counter()
        engine.fit(train)
        return engine, time.perf_counter() - t0

    _, one = fit(1)
    engine, took = fit(a.iters)
    # The bindings' predict reads its (n, 2) input column by column (X[i], X[i + n]) though fit
    # reads rows: a Fortran-ordered array gives it the pairs it means (a C-ordered one: RMSE 1.37).
    pred = engine.predict(np.asfortranarray(np.stack([tu, ti], axis=1).astype(np.float32)))
    rmse = float(np.sqrt(np.mean((pred - tr) ** 2)))
    print(json.dumps({"epoch_seconds": (took - one) / (a.iters - 1), "fit_epoch_seconds": took / a.iters,
                      "fit_seconds": took, "fit_1_seconds": one, "rmse": rmse,
                      "peer": f"libmf 0.9.2 ({a.threads} threads)",
                      "flags": f"k {a.k}, {a.iters} iterations, L2 {params['lambda_p2']}, "
                               f"eta {params['eta']}, {params['nr_bins']} bins; "
                               f"built {os.environ.get('PEREGRINE_LIBMF_CFLAGS', 'as pip builds it')}"}))


if __name__ == "__main__":
    main()
