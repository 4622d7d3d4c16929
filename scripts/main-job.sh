#!/usr/bin/env bash
# The main job: builds Peregrine with MPI and runs the transport conformance demo on 4 MPI ranks
# (`mpirun -n 4 peregrine conformance`). Installs what it needs on a fresh Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_packages "${MPI_BUILD_PACKAGES[@]}"
step "cargo build --release --features mpi"
cargo build --release --locked -p peregrine --features mpi
step "mpirun -n 4 peregrine conformance"
mpirun -n 4 target/release/peregrine conformance "$@"
