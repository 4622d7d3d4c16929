#!/usr/bin/env bash
# The unsafe code's audit under Miri (nightly): the unit tests of the local transport (windows
# shared between rank threads, their atomics and flushes), of the shard maps, and of the per-rank
# thread pool and the chunk queues. Miri cannot call sched_getcpu, so the test that checks where
# pinned threads run is skipped there; isolation is off for the affinity calls it does emulate.
# Takes about 10 minutes on 2 cores (Miri interprets, single-threaded).
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
rustup component add --toolchain nightly miri rust-src
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
cargo +nightly miri test -p peregrine-transport --lib
cargo +nightly miri test -p peregrine-core --lib -- pool:: queue::
