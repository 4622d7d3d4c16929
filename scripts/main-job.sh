#!/usr/bin/env bash
# The main job: trains a 784-128-10 MLP on Fashion-MNIST with 2 MPI ranks to training loss 0.40,
# once without a straggler (Ideal) and then with rank 0 slowed to half its speed (an injected
# persistent straggler) under each scheme, and prints the time each took next to Ideal.
# Installs what it needs on a fresh Debian machine (MPI, Fashion-MNIST from Debian).
#
#   scripts/main-job.sh [extra `peregrine train` flags, e.g. --target-loss 0.45]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_packages "${MPI_BUILD_PACKAGES[@]}" dataset-fashion-mnist
step "cargo build --release --features mpi"
cargo build --release --locked -p peregrine --features mpi
P=target/release/peregrine
out=target/main-job
mkdir -p "$out"
fm=${PEREGRINE_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$out/fmnist-train.pgd" ]; then
    step "peregrine data convert idx (Fashion-MNIST, 60,000 training images)"
    "$P" data convert idx --images "$fm/train-images-idx3-ubyte.gz" --labels "$fm/train-labels-idx1-ubyte.gz" \
        "$out/fmnist-train.pgd"
fi

# name | scheme flags | straggler flags
runs=(
    "ideal (bsp, no straggler)|--scheme bsp|"
    "bsp, no taking over|--scheme bsp --no-steal|--straggler persistent:rank=0,speed=0.5"
    "bsp + taking over|--scheme bsp|--straggler persistent:rank=0,speed=0.5"
    "ssp:2 + taking over|--scheme ssp:2|--straggler persistent:rank=0,speed=0.5"
    "asp + taking over|--scheme asp|--straggler persistent:rank=0,speed=0.5"
    "flexrr:2|--scheme flexrr:2|--straggler persistent:rank=0,speed=0.5"
    "falcon (enforced)|--scheme falcon|--straggler persistent:rank=0,speed=0.5"
    "falcon:slack:2|--scheme falcon:slack:2|--straggler persistent:rank=0,speed=0.5"
)
# One unrecorded warm-up run: the first run pays for faulting in the mapped dataset.
step "warm-up run (not recorded)"
mpirun -n 2 "$P" train --model mlp --data "$out/fmnist-train.pgd" --chunk 16 --epochs 1 -q \
    --optimizer sgd --checkpoint-every 0 --force --run-dir "$out/runs/warm-up"

# Plain SGD (0.2, decay 1, no L2), the workload these comparisons have always used: the MLP's default
# heavy-ball momentum compounds the staleness of SSP and ASP (they then need 2-3x Ideal's time).
# No checkpoints either: each is a point where every rank lines up, which would change what the
# asynchronous schemes are compared on.
# --force: each run replaces the previous main job's in its directory.
sgd=(--optimizer sgd --lr 0.2 --lr-decay 1 --l2 0 --checkpoint-every 0 --force)
table=()
ideal=""
for r in "${runs[@]}"; do
    IFS='|' read -r name scheme straggler <<<"$r"
    dir="$out/runs/$(echo "$name" | tr -c 'a-z0-9:\n' '-' | tr -s '-')"
    step "mpirun -n 2 peregrine train --model mlp $scheme $straggler"
    # shellcheck disable=SC2086
    mpirun -n 2 "$P" train --model mlp --data "$out/fmnist-train.pgd" --chunk 16 --epochs 8 "${sgd[@]}" \
        --target-loss 0.40 --eval-every 235 $scheme $straggler --run-dir "$dir" "$@"
    t=$(summary_field "$dir" time_to_target | awk '{printf "%.3f", $1}')
    t=${t:-none}
    [ -z "$ideal" ] && ideal=$t
    ratio=$(awk -v t="$t" -v i="$ideal" 'BEGIN { if (t == "none" || i == "none") print "-"; else printf "%.2fx", t / i }')
    table+=("$(printf '%-28s %12s %9s %10s %8s' "$name" "$t" "$ratio" "$(per_rank_sum "$dir" wait)" \
        "$(per_rank_sum "$dir" taken | cut -d. -f1)")")
done

step "time to training loss 0.40, 2 ranks, rank 0 at half speed (runs in $out/runs)"
printf '%-28s %12s %9s %10s %8s\n' "run" "seconds" "vs ideal" "wait s" "taken"
printf '%s\n' "${table[@]}"
