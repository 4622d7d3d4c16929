#!/usr/bin/env bash
# The simulator against real runs of many ranks on this machine's few cores: the synthetic
# workload (every chunk a 2 ms sleep, a dense model of 101,770 values pulled and pushed whole each
# iteration) with 8, 16 and 32 ranks of 2 threads, under BSP, BSP with taking over, SSP, FlexRR and
# Falcon, without and with rank 0 at half speed, on the local backend and (mpi, both) under
# mpirun; replays each run with `peregrine simulate --replay` and prints a Markdown table of
# measured and simulated time per iteration.
#   scripts/sim-validate-many.sh [local|mpi|both] [RANKS...]     (default: local 8 16 32)
# THREADS sets the threads a rank (default 2); SCHEMES, the schemes (default "bsp bsp+steal
# ssp:3+steal flexrr falcon"; a `+steal` suffix takes over, a scheme without it under BSP-like
# schemes does not); PEREGRINE, a built `peregrine` to run instead of building one (e.g. on a
# machine without the toolchain).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

which=${1:-local}
shift || true
rank_counts=("$@")
[ ${#rank_counts[@]} -gt 0 ] || rank_counts=(8 16 32)
features=()
backends=()
case "$which" in
local) backends=(local) ;;
mpi) backends=(mpi) ;;
both) backends=(local mpi) ;;
*) echo "usage: scripts/sim-validate-many.sh [local|mpi|both] [RANKS...]" >&2; exit 2 ;;
esac
if [ "$which" != local ]; then
    ensure_packages "${MPI_BUILD_PACKAGES[@]}"
    features=(--features mpi)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fi
if [ -n "${PEREGRINE:-}" ]; then
    P=$(realpath "$PEREGRINE")
else
    cargo build --release --locked -p peregrine "${features[@]}"
    P=$PWD/target/release/peregrine
fi
d=target/sim-validate-many
mkdir -p "$d"
[ -f "$d/rows.pgd" ] || "$P" data gen dense "$d/rows.pgd" --rows 200000 --features 4 --classes 2
read -r -a schemes <<<"${SCHEMES:-bsp bsp+steal ssp:3+steal flexrr falcon}"
patterns=(ideal persistent:rank=0,speed=0.5)
threads=${THREADS:-2}

table=$d/table.md
{
    echo "| backend | ranks | straggler | scheme | s/iteration measured | simulated | ratio |"
    echo "|---|---|---|---|---|---|---|"
} >"$table"
for backend in "${backends[@]}"; do
    for ranks in "${rank_counts[@]}"; do
        # 4 chunks of 64 rows a thread.
        batch=$((ranks * threads * 4 * 64))
        for pattern in "${patterns[@]}"; do
            for spec in "${schemes[@]}"; do
                scheme=${spec%+steal}
                steal=()
                case "${scheme%%:*}" in flexrr | falcon) ;; *) [ "$scheme" = "$spec" ] && steal=(--no-steal) ;; esac
                name="$backend-$ranks-${pattern%%:*}-${spec//[:+]/_}"
                run=$d/runs/$name
                rm -rf "$run"
                args=(train --model synthetic --data "$d/rows.pgd" --chunk-cost 2ms --batch "$batch" --chunk 64
                    --iterations 100 --checkpoint-every 0 --scheme "$scheme" "${steal[@]}" --straggler "$pattern"
                    --threads "$threads" --run-dir "$run" --quiet)
                if [ "$backend" = mpi ]; then
                    OMPI_MCA_osc=sm,pt2pt mpirun -n "$ranks" --bind-to none "$P" "${args[@]}"
                else
                    "$P" "${args[@]}" --ranks "$ranks"
                fi
                out=$("$P" simulate --replay "$run" 2>&1) || { echo "replay failed: $out" >&2; out=""; }
                it=$(grep '^time per iteration' <<<"$out" | sed -E 's/.*measured ([0-9.]+) s, simulated ([0-9.]+) s, ratio ([0-9.]+)/\1 | \2 | \3/')
                echo "| $backend | $ranks | $pattern | $spec | $it |" | tee -a "$table"
            done
        done
    done
done
step "table in $table"
awk -F'|' 'NR > 2 { if ($8 + 0 > 0) { n++; e = $8 - 1; if (e < 0) e = -e; if (e > m) m = e; if (e <= 0.15) ok++ } }
    END { printf "%d of %d ratios within 15%%, largest error %.1f%%\n", ok, n, 100 * m }' "$table"
