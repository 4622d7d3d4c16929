#!/usr/bin/env bash
# The straggler experiment: prepares its data and runs `peregrine experiment`.
#   scripts/experiment.sh small        generated data, every scheme and pattern (what CI runs)
#   scripts/experiment.sh full         Adult, MovieLens-100k, Fashion-MNIST (a benchmark)
#   scripts/experiment.sh predictors   LB-BSP's predictors under speed traces (Fashion-MNIST MLP)
#   scripts/experiment.sh dbw          decentralized DBW on a ring of 4, dynamic vs static backups
#   scripts/experiment.sh lda          LDA (Reuters, the lda package's corpus) under stragglers
# Extra arguments go to `peregrine experiment` (e.g. --out DIR, --no-plots).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

size=${1:-small}
shift || true
ensure_packages fonts-dejavu-core
cargo build --release --locked -p peregrine
P=target/release/peregrine
d=target/experiment
mkdir -p "$d"
case "$size" in
small)
    [ -f "$d/sparse.pgd" ] || "$P" data gen sparse "$d/sparse.pgd" --rows 20000 --features 500 --nnz-per-row 12
    [ -f "$d/ratings.pgd" ] || "$P" data gen ratings "$d/ratings.pgd" --ratings 40000 --users 400 --items 300 --rank 4
    [ -f "$d/dense.pgd" ] || "$P" data gen dense "$d/dense.pgd" --rows 8000 --features 64 --classes 4 --noise 0.3
    ;;
full | predictors | dbw)
    ensure_packages dataset-fashion-mnist
    fm=${PEREGRINE_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
    [ -f "$d/fmnist-train.pgd" ] || "$P" data convert idx --images "$fm/train-images-idx3-ubyte.gz" \
        --labels "$fm/train-labels-idx1-ubyte.gz" "$d/fmnist-train.pgd"
    if [ "$size" = full ]; then
        fetch_movielens
        [ -f "$d/adult.pgd" ] || "$P" data convert libsvm tests/data/adult.libsvm.gz "$d/adult.pgd"
        if [ ! -f "$d/ml100k-train.pgd" ]; then
            "$P" data convert ratings "$PEREGRINE_ML100K" "$d/ml100k.pgd"
            "$P" data split "$d/ml100k.pgd" --train "$d/ml100k-train.pgd" --test "$d/ml100k-test.pgd"
        fi
    fi
    ;;
lda)
    fetch_lda_reference
    [ -f "$d/reuters.pgd" ] || "$P" data convert ldac "$PEREGRINE_REUTERS" "$d/reuters.pgd"
    ;;
*)
    echo "usage: scripts/experiment.sh small|full|predictors|dbw|lda [peregrine experiment flags]" >&2
    exit 2
    ;;
esac
step "peregrine experiment configs/experiment-$size.toml"
"$P" experiment "configs/experiment-$size.toml" "$@"
