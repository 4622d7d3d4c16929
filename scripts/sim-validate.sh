#!/usr/bin/env bash
# The simulator against real runs: trains an MLP 784-128-10 on generated data to a target loss
# under every scheme, with 2 and 4 ranks, with and without a straggler, on the local backend and
# (if built and installed) under mpirun; replays each run with `peregrine simulate --replay`, and
# prints a Markdown table of measured and simulated time per iteration and time to target.
#   scripts/sim-validate.sh [local|mpi|both]     (default: local)
# RANKS sets the rank counts (default "2 4"); PEREGRINE, a built `peregrine` to run instead of
# building one (e.g. on a machine without the toolchain).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

which=${1:-local}
features=()
if [ "$which" != local ]; then
    ensure_packages "${MPI_BUILD_PACKAGES[@]}"
    features=(--features mpi)
fi
if [ -n "${PEREGRINE:-}" ]; then
    P=$(realpath "$PEREGRINE")
else
    cargo build --release --locked -p peregrine "${features[@]}"
    P=$PWD/target/release/peregrine
fi
d=target/sim-validate
mkdir -p "$d"
[ -f "$d/dense.pgd" ] || "$P" data gen dense "$d/dense.pgd" --rows 20000 --features 784 --classes 10
schemes=(bsp bsp+steal ssp:2+steal asp+steal dynsgd+steal backup:1 backup-dynamic lb-bsp speculative flexrr:2 falcon falcon:slack:2)
patterns=(ideal persistent:rank=0,speed=0.5)
backends=()
case "$which" in
local) backends=(local) ;;
mpi) backends=(mpi) ;;
both) backends=(local mpi) ;;
*) echo "usage: scripts/sim-validate.sh [local|mpi|both]" >&2; exit 2 ;;
esac

table=$d/table.md
{
    echo "| backend | ranks | straggler | scheme | s/iteration measured | simulated | ratio | to target measured | simulated | ratio |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
} >"$table"
for backend in "${backends[@]}"; do
    for ranks in ${RANKS:-2 4}; do
        for pattern in "${patterns[@]}"; do
            for spec in "${schemes[@]}"; do
                scheme=${spec%+steal}
                steal=()
                [ "$scheme" = "$spec" ] && steal=(--no-steal)
                name="$backend-$ranks-${pattern%%:*}-${spec//[:+]/_}"
                run=$d/runs/$name
                rm -rf "$run"
                # The workload the validation was measured on (plain SGD, no L2), without
                # checkpoints (each lines the ranks up, which the simulator does not model).
                args=(train --model mlp --data "$d/dense.pgd" --batch 1024 --iterations 250 --eval-every 10 --target-loss 1.7
                    --optimizer sgd --lr 0.2 --lr-decay 1 --l2 0 --checkpoint-every 0
                    --scheme "$scheme" "${steal[@]}" --straggler "$pattern" --threads 1 --run-dir "$run" --quiet)
                if [ "$backend" = mpi ]; then
                    mpirun -n "$ranks" "$P" "${args[@]}"
                else
                    "$P" "${args[@]}" --ranks "$ranks"
                fi
                out=$("$P" simulate --replay "$run" 2>&1) || { echo "replay failed: $out" >&2; out=""; }
                it=$(grep '^time per iteration' <<<"$out" | sed -E 's/.*measured ([0-9.]+) s, simulated ([0-9.]+) s, ratio ([0-9.]+)/\1 | \2 | \3/')
                tt=$(grep '^time to target' <<<"$out" | sed -E 's/.*measured ([0-9.]+) s, simulated ([0-9.]+) s, ratio ([0-9.]+)/\1 | \2 | \3/' || true)
                [ -n "$tt" ] || tt="- | - | -"
                echo "| $backend | $ranks | $pattern | $spec | $it | $tt |" | tee -a "$table"
            done
        done
    done
done
step "table in $table"
awk -F'|' 'NR > 2 { for (i = 8; i <= 11; i += 3) if ($i + 0 > 0) { n++; e = $i - 1; if (e < 0) e = -e; if (e > m) m = e; if (e <= 0.15) ok++ } }
    END { printf "%d of %d ratios within 15%%, largest error %.1f%%\n", ok, n, 100 * m }' "$table"
