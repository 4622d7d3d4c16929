#!/usr/bin/env python3
"""The `lda` package (PyPI, collapsed Gibbs sampling) on an LDA-C corpus: the reference the LDA
tests compare Peregrine's log-likelihood with.

    python3 scripts/lda_reference.py CORPUS.ldac TOPICS ITERATIONS ALPHA ETA SEED...

Prints one JSON object: the package's version, the corpus' tokens, and per seed the joint
log-likelihood log p(w, z) per token after ITERATIONS sweeps (the package's `loglikelihood()`).
`scripts/common.sh`'s fetch_lda_reference installs the package and says where (PYTHONPATH).
"""

import json
import sys

import lda
import lda.utils


def main():
    corpus, topics, iterations, alpha, eta = sys.argv[1:6]
    seeds = [int(s) for s in sys.argv[6:]]
    with open(corpus) as f:
        x = lda.utils.ldac2dtm(f, offset=0)
    tokens = int(x.sum())
    per_token = {}
    for seed in seeds:
        m = lda.LDA(n_topics=int(topics), n_iter=int(iterations), alpha=float(alpha), eta=float(eta),
                    random_state=seed, refresh=max(1, int(iterations)))
        m.fit(x)
        per_token[seed] = m.loglikelihood() / tokens
    version = getattr(lda, "__version__", "unknown")
    print(json.dumps({"lda": version, "tokens": tokens, "docs": x.shape[0], "vocabulary": x.shape[1],
                      "loglikelihood_per_token": per_token}))


if __name__ == "__main__":
    main()
