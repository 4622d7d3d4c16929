#!/usr/bin/env bash
# Peregrine and its peers side by side, same data, same machine, same run (issue 18):
#   softmax and MLP on Fashion-MNIST: PyTorch DDP (gloo, 2 processes x 1 thread) and one PyTorch
#     process with 2 threads (Debian's python3-torch with OpenBLAS): samples/s at batch 128, and
#     seconds to a training loss of 0.40 (each with its usual optimizer: SGD with momentum for
#     PyTorch, Peregrine's defaults);
#   MF k=40 on MovieLens-100k (90/10): libmf (PyPI bindings, libmf's C++ built with AVX), 2 threads:
#     ms per epoch (the marginal epoch on both sides: (T(20) - T(1)) / 19) and test RMSE;
#   LR on Adult: Vowpal Wabbit, scikit-learn (lbfgs, SGD): seconds to a training log-loss of 0.345;
#   sparse LR at scale (2M x 100k, 20 nonzeros per row; 10M x 1M and the same hashed into 2^24
#     buckets with --big): communication
#     against computation per rank;
#   and the roofline figures of this machine in the same run (peregrine bench roofline).
# Peregrine runs as 2 MPI ranks (OpenMPI), the peers on the same 2 cores; each workload 5 times,
# alternating, medians and ratios. The peers go into a virtual environment under target/peers.
#
#   scripts/bench-peers.sh [--reps N] [--only roofline,fmnist,mf,lr,scale] [--big] [--peer-timeout S]
# A peer's run that takes over S seconds (default 300) counts as hung: it is killed, run again (up
# to 3 tries) and listed under the table (libmf 0.9.2's scheduler was seen to deadlock).
# Results: target/bench-peers/table.md (the README's table), results.json (every run), roofline.png
# and roofline.svg (the machine's roof and every workload on it).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

reps=5 only=roofline,fmnist,mf,lr,scale big=0 peer_timeout=300
while [ $# -gt 0 ]; do
    case $1 in
    --reps | --only | --peer-timeout)
        [ $# -ge 2 ] || { echo "bench-peers.sh: $1 needs a value" >&2; exit 2; }
        case $1 in --reps) reps=$2 ;; --only) only=$2 ;; *) peer_timeout=$2 ;; esac
        shift 2 ;;
    --big) big=1; shift ;;
    *) echo "bench-peers.sh: unknown option $1 (--reps N, --only PARTS, --big, --peer-timeout S)" >&2; exit 2 ;;
    esac
done
case $reps in '' | *[!0-9]* | 0) echo "bench-peers.sh: --reps $reps: a whole number from 1" >&2; exit 2 ;; esac
case $peer_timeout in '' | *[!0-9]* | 0)
    echo "bench-peers.sh: --peer-timeout $peer_timeout: whole seconds from 1" >&2; exit 2 ;;
esac
for part in ${only//,/ }; do
    case $part in roofline | fmnist | mf | lr | scale) ;;
    *) echo "bench-peers.sh: --only: unknown part '$part' (roofline, fmnist, mf, lr, scale)" >&2; exit 2 ;;
    esac
done

ensure_packages "${MPI_BUILD_PACKAGES[@]}" dataset-fashion-mnist python3-torch libopenblas0-pthread \
    python3-venv python3-pip python3-numpy g++
fetch_movielens
venv=target/peers/venv
libmf_cflags="-O3 -march=x86-64-v3 -DUSEAVX -fopenmp"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import libmf, vowpalwabbit, sklearn' 2>/dev/null; then
    step "installing the peers into $venv (PyPI: libmf, vowpalwabbit, scikit-learn; torch from Debian)"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    # numpy below 2: Debian's torch is built against numpy 1.x.
    "$venv/bin/pip" install -q "numpy<2" vowpalwabbit scikit-learn scipy
    # libmf's C++ as its authors build it (their Makefile: -O3, AVX, OpenMP), not pip's bare
    # -O2 SSE2 build of the bindings, at the level Peregrine's default build targets.
    CFLAGS="$libmf_cflags" LDFLAGS=-fopenmp "$venv/bin/pip" install -q --no-cache-dir --no-binary libmf libmf
fi
export PEREGRINE_LIBMF_CFLAGS="with $libmf_cflags"

# PEREGRINE_BIN: another build to measure (e.g. an earlier commit's, for a before/after): used as
# it is; this tree's build still makes the datasets and draws the roofline. PEREGRINE_BENCH_OUT:
# where the table, results and plot go (default: beside the data, target/bench-peers).
step "cargo build --release --features mpi"
cargo build --release --locked -p peregrine --features mpi
P=${PEREGRINE_BIN:-target/release/peregrine}
[ -x "$P" ] || { echo "bench-peers.sh: PEREGRINE_BIN=$P is not an executable" >&2; exit 2; }
d=target/bench-peers
bench_datasets target/release/peregrine "$d"
case ,$only, in *,scale,*)
    [ -f "$d/sparse-2m.pgd" ] || target/release/peregrine data gen sparse "$d/sparse-2m.pgd" --rows 2000000 --features 100000 --nnz-per-row 20
    if [ "$big" = 1 ] && [ ! -f "$d/sparse-10m.pgd" ]; then
        target/release/peregrine data gen sparse "$d/sparse-10m.pgd" --rows 10000000 --features 1000000 --nnz-per-row 20
    fi ;;
esac

step "versions"
"$P" --version
mpirun --version | head -n 1
"$venv/bin/python" -c 'import torch, sklearn, vowpalwabbit, numpy; print("torch", torch.__version__, "| scikit-learn", sklearn.__version__, "| vowpalwabbit", vowpalwabbit.__version__, "| numpy", numpy.__version__)'
grep -m1 'model name' /proc/cpuinfo

step "benchmarks ($reps repetitions, alternating)"
"$venv/bin/python" scripts/bench_peers.py --peregrine "$P" --data "$d" --reps "$reps" --only "$only" \
    --peer-timeout "$peer_timeout" --out "${PEREGRINE_BENCH_OUT:-$d}" \
    --plot-with target/release/peregrine \
    --launcher "mpirun -n 2" $([ "$big" = 1 ] && echo --big)
