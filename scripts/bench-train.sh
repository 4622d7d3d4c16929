#!/usr/bin/env bash
# Training benchmarks of issue 4's targets, 2 ranks on this machine, same data and target as the
# peer tools quoted in ../shared/data/README.md (their figures were measured here):
#   softmax on Fashion-MNIST: samples/s (PyTorch DDP/gloo, 2 ranks: ~80k)
#   MLP 784-128-10 on Fashion-MNIST: seconds to training loss <= 0.40 (PyTorch DDP: 2.5 s)
#   MF k=40 on MovieLens-100k (90/10 split): ms per epoch (libmf, 2 threads: 5.1 ms) and test RMSE
#   LR on Adult: ms per full pass, full-batch gradient descent (MPI + numpy: ~1.0 ms)
#   memory: a 10M-row synthetic sparse set (1.5 GB, generated once, ~80 s): heap vs mapped pages
#
#   scripts/bench-train.sh [local|mpi] [--no-big]     (default: mpi)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

backend=${1:-mpi}
big=1
[ "${2:-}" = "--no-big" ] && big=0
ensure_packages "${MPI_BUILD_PACKAGES[@]}" dataset-fashion-mnist
fetch_movielens
step "cargo build --release --features mpi"
cargo build --release --locked -p peregrine --features mpi
P=target/release/peregrine
d=target/bench-train
bench_datasets "$P" "$d"

# train NAME FLAGS...: one run on 2 ranks of the chosen backend, quiet, into $d/runs/NAME.
train() {
    local name=$1
    shift
    if [ "$backend" = mpi ]; then
        mpirun -n 2 "$P" train -q --checkpoint-every 0 --force --run-dir "$d/runs/$name" "$@"
    else
        "$P" train --ranks 2 -q --checkpoint-every 0 --force --run-dir "$d/runs/$name" "$@"
    fi
}
rows=()
row() { rows+=("$(printf '%-44s %-18s %-14s %s' "$@")"); }

step "softmax, Fashion-MNIST, 3 epochs"
# The workloads the peers' figures compare with: plain SGD, no L2 (and MF without biases, as
# libmf), whatever the defaults (docs/defaults.md); no checkpoints (the peers take none); --force
# replaces the previous measurement's run.
train softmax --model softmax --data "$d/fm-train.pgd" --eval "$d/fm-test.pgd" --epochs 3 \
    --optimizer sgd --lr 0.5 --lr-decay 1 --l2 0
sps=$(summary_field "$d/runs/softmax" samples_per_second | awk '{printf "%.0f", $1}')
row "softmax F-MNIST samples/s" "$sps" ">= 800000" "PyTorch DDP ~80k"

step "MLP 784-128-10, Fashion-MNIST, to training loss 0.40"
train mlp --model mlp --data "$d/fm-train.pgd" --target-loss 0.40 --eval-every 117 --epochs 8 \
    --optimizer sgd --lr 0.2 --lr-decay 1 --l2 0
ttt=$(summary_field "$d/runs/mlp" time_to_target | awk '{printf "%.3f", $1}')
row "MLP seconds to training loss <= 0.40" "${ttt:-not reached}" "<= 1.25" "PyTorch DDP 2.5 s"

step "MF k=40, MovieLens-100k 90/10, 20 epochs"
train mf --model mf --data "$d/ml-train.pgd" --eval "$d/ml-test.pgd" --epochs 20 --eval-every 1000 --no-intercept
ms=$(summary_field "$d/runs/mf" train_seconds | awk '{printf "%.2f", $1 * 1000 / 20}')
rmse=$(sed -n 's/^ *"metric": \([0-9.]*\),\{0,1\}$/\1/p' "$d/runs/mf/summary.json" | tail -1)
row "MF ms per epoch (test RMSE $(printf '%.4f' "$rmse"))" "$ms" "<= 10" "libmf 5.1 ms"

step "LR, Adult, 100 full-batch passes"
train lr --model lr --data "$d/adult.pgd" --batch 48842 --chunk 2048 --iterations 100 --lr 4 --optimizer sgd --l2 0 --eval-every 1000
ms=$(summary_field "$d/runs/lr" train_seconds | awk '{printf "%.3f", $1 * 1000 / 100}')
row "LR ms per full pass" "$ms" "<= 1" "MPI+numpy ~1.0 ms"

if [ "$big" = 1 ]; then
    [ -f "$d/big.pgd" ] || { step "generating 10M rows x 1M features (once)"; "$P" data gen sparse "$d/big.pgd" \
        --rows 10000000 --features 1000000 --nnz-per-row 20; }
    step "LR, 10M-row synthetic sparse set, 1 epoch"
    train big --model lr --data "$d/big.pgd" --batch 100000 --chunk 2000 --epochs 1 --eval-every 1000 --lr 1 --optimizer sgd --l2 0
    anon=$(per_rank_sum "$d/runs/big" rss_anon_kib | cut -d. -f1)
    file=$(per_rank_sum "$d/runs/big" rss_file_kib | cut -d. -f1)
    size=$(($(stat -c %s "$d/big.pgd") / 1024))
    # Model-sized buffers of one rank: shard, replica, update, evaluation copy, and per thread a
    # gradient and a taken-over-chunk copy (1M f32 each, 4 MiB): an upper bound of the heap.
    model_kib=$((1000000 * 4 / 1024))
    bound=$((model_kib * 6 + file))
    row "10M rows: rank 0 heap (RssAnon) KiB" "$anon" "<< $size (file)" "dataset not in heap"
    row "10M rows: RSS / (6 models + pages touched)" \
        "$(awk -v a="$anon" -v f="$file" -v b="$bound" 'BEGIN {printf "%.2f", (a + f) / b}')" "<= 1.5" ""
fi

step "results ($backend, 2 ranks; runs in $d/runs)"
printf '%-44s %-18s %-14s %s\n' "figure" "measured" "target" "peer"
printf '%s\n' "${rows[@]}"
