#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs on a fresh Debian machine, checks
# formatting and lints, builds the default (no native libraries) and the all-features builds, runs
# every unit and integration test (local backend), then the MPI and Slurm tests (a real
# single-node Slurm and a 4-node Slurm in network namespaces, started here) under OpenMPI and, as a
# second leg, MPICH.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

# gdb: a Slurm test tells Slurm 22.05's own hang of srun from ours by srun's backtrace.
# python3-sklearn: the quality tests fit scikit-learn on their judged problems in the same run.
ensure_packages "${MPI_BUILD_PACKAGES[@]}" mpich libmpich-dev dataset-fashion-mnist libhwloc-dev libudev-dev fonts-dejavu-core gdb python3-sklearn

fetch_movielens
fetch_lda_reference

step "cargo fmt --check"
cargo fmt --all -- --check

step "no import circles between source files (scripts/circles.py)"
python3 scripts/circles.py

# The book (docs/book) rendered into target/book (never into the source tree), after every relative
# link and anchor of README.md and docs/ is checked.
step "documentation: links and anchors (scripts/doc-links.py), and the book (mdbook)"
python3 scripts/doc-links.py
command -v mdbook >/dev/null || cargo install --locked mdbook --version ^0.4
mdbook build docs/book --dest-dir "$PWD/target/book"

step "build and test, default features (local backend only, no native libraries)"
cargo test --locked --workspace

step "clippy and the API docs, all features"
cargo clippy --locked --workspace --all-targets --all-features -- -D warnings
# The API docs build without a warning (broken or private links included).
RUSTDOCFLAGS="-D warnings" cargo doc --locked --no-deps --workspace --all-features

step "a single-node Slurm on loopback, and a 4-node one in network namespaces, for the Slurm tests"
# Their state under target/, not /tmp: the suite leaves nothing behind outside the tree.
export PEREGRINE_SLURM_DIR="$PWD/target/slurm-local" PEREGRINE_CLUSTER_DIR="$PWD/target/cluster-local"
trap 'scripts/slurm-local.sh stop; scripts/cluster-local.sh stop' EXIT
scripts/slurm-local.sh start
eval "$(scripts/slurm-local.sh env)"
scripts/cluster-local.sh start

step "build and test, all features (MPI under OpenMPI: $(mpirun --version | head -n 1); Slurm $(sinfo --version))"
cargo test --locked --workspace --all-features

# MPICH beside OpenMPI: its own compiler wrapper and target directory (mpi-sys does not rebuild
# when only MPICC changes), and its own launcher for the tests.
step "MPI tests under MPICH ($(mpichversion | head -n 1 | tr -s ' \t' ' '))"
export MPICC=mpicc.mpich CARGO_TARGET_DIR=target/mpich PEREGRINE_MPIRUN=mpirun.mpich PEREGRINE_SRUN_MPI=pmi2
# One test at a time: MPICH ranks busy-poll, and two mpirun worlds at once on two cores starve
# each other (a slowed rank's peers then never get the CPU while it still has chunks to take).
cargo test --locked --all-features -p peregrine-tests -p peregrine --test mpi --test cli -- --test-threads=1
# Under srun (pmi2), on one node and across two; the requeue tests (and the heterogeneous job) are
# left to the OpenMPI leg: MPICH busy-polls, and 300 oversubscribed rounds would take minutes.
# One test at a time here too: the two-node conformance and BSP tests at once (8 busy-polling
# ranks on two cores) once took 20 minutes, a BSP iteration 8 minutes, on an Intel Xeon host.
cargo test --locked --all-features -p peregrine --test slurm -- --test-threads=1 srun_ an_sbatch_job \
    cluster::conformance_across cluster::bsp_training cluster::rma_bench

# The straggler experiment's small configuration, end to end (release build, tables and plots).
unset MPICC CARGO_TARGET_DIR PEREGRINE_MPIRUN PEREGRINE_SRUN_MPI
step "straggler experiment, small configuration"
bash scripts/experiment.sh small --out target/experiment/small-ci --force
test -s target/experiment/small-ci/summary.csv
test -s target/experiment/small-ci/plots/mlp-persistent_rank_0_speed_0_5-loss.png

# The README's main job (the first command of its quick start), as a user runs it: MPI build,
# Fashion-MNIST, every scheme with a straggler next to Ideal.
step "the main job (scripts/main-job.sh)"
bash scripts/main-job.sh

# Every parser of outside input fuzzed for 30 s (scripts/fuzz.sh; nightly and cargo-fuzz are
# installed by it).
step "fuzzing, 30 s per target"
bash scripts/fuzz.sh 30

step "all tests passed"
