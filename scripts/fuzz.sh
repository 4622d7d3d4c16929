#!/usr/bin/env bash
# Fuzzes every parser of outside input (cargo fuzz, libFuzzer):
#   scripts/fuzz.sh [SECONDS] [TARGET...]   each target for SECONDS (default 600), all by default
# Targets: the dataset file (open, verify, per-rank checks), LIBSVM, IDX, ratings text, CSV, npy,
# bag-of-words (UCI docword, LDA-C),
# training and experiment TOML, checkpoints, model files, Slurm hostlists/task counts/environment.
# Seeds: the files in fuzz/seeds/<target>/, and files made here from the repository's real data
# (Adult, heart_scale, MovieLens-100k) and from the malformed cases of the tests. The
# corpus grows in target/fuzz/corpus/<target>; crashes land in target/fuzz/artifacts/<target>
# (and make the script exit 1: each becomes a regression test). Needs the nightly toolchain
# (installed here if missing) and cargo-fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

seconds=${1:-600}
shift || true
all=(dataset libsvm idx ratings csv npy bow train_config experiment_config checkpoint model_file slurm)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
ensure_packages g++

step "cargo fuzz build (nightly, release, with debug assertions)"
(cd fuzz && cargo +nightly fuzz build --debug-assertions)
cargo build --release --locked -p peregrine
P=$PWD/target/release/peregrine

work=$PWD/target/fuzz
export TMPDIR=$work/tmp
rm -rf "$TMPDIR"
mkdir -p "$TMPDIR" "$work/seeds"
trap 'rm -rf "$TMPDIR"' EXIT

# Seeds made from real data and the tests' malformed cases (binary files are not kept in git).
seed() { mkdir -p "$work/seeds/$1"; cp "$2" "$work/seeds/$1/${3:-$(basename "$2")}"; }
s=$TMPDIR/seedwork
mkdir -p "$s"
(zcat tests/data/adult.libsvm.gz || true) | head -n 40 >"$s/adult40.libsvm"
head -n 40 tests/data/heart_scale >"$s/heart40.libsvm"
gzip -c "$s/heart40.libsvm" >"$s/heart40.libsvm.gz"
for f in adult40.libsvm heart40.libsvm heart40.libsvm.gz; do seed libsvm "$s/$f"; done
"$P" data convert libsvm "$s/heart40.libsvm" "$s/heart.pgd" >/dev/null
"$P" data standardize "$s/heart.pgd" "$s/heart-std.pgd" >/dev/null
"$P" data gen sparse "$s/gs.pgd" --rows 30 --features 40 --nnz-per-row 4 >/dev/null
"$P" data gen dense "$s/gd.pgd" --rows 20 --features 6 --classes 3 >/dev/null
"$P" data gen ratings "$s/gr.pgd" --ratings 40 --users 8 --items 6 --rank 2 >/dev/null
for f in heart.pgd heart-std.pgd gs.pgd gd.pgd gr.pgd; do seed dataset "$s/$f"; done
python3 - "$s" <<'EOF'
import struct, sys, zlib
d = sys.argv[1]
b = bytearray(open(d + "/heart.pgd", "rb").read())
def keep(name, data):
    open(f"{d}/{name}", "wb").write(data)
# A valid header (checksum recomputed) saying fewer columns than the indices use.
for cols in (0, 1):
    c = bytearray(b)
    c[24:32] = struct.pack("<Q", cols)
    c[156:160] = struct.pack("<I", zlib.crc32(bytes(c[:156])))
    keep(f"cols{cols}.pgd", c)
flip = bytearray(b); flip[len(flip) - 60] ^= 0x40; keep("flipped.pgd", flip)
keep("short.pgd", b[:100]); keep("cut.pgd", b[:-8])
# IDX: two 3x3 images and their labels, gzipped or not; the split prefix is the images' length.
images = struct.pack(">IIII", 0x803, 2, 3, 3) + bytes(range(18))
labels = struct.pack(">II", 0x801, 2) + bytes([1, 7])
keep("idx.bin", struct.pack("<H", len(images)) + images + labels)
# npy: 3x2 float32 features and 3 int64 labels.
def npy(descr, shape, payload):
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    h += " " * (63 - (10 + len(h)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + payload
x = npy("<f4", "(3, 2)", struct.pack("<6f", 1, 2, 3, 4, 5, 6))
y = npy("<i8", "(3,)", struct.pack("<3q", 0, 1, 0))
keep("npy.bin", struct.pack("<H", len(x)) + x + y)
EOF
for f in cols0.pgd cols1.pgd flipped.pgd short.pgd cut.pgd; do seed dataset "$s/$f"; done
seed idx "$s/idx.bin"
fm=${PEREGRINE_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ -f "$fm/t10k-images-idx3-ubyte.gz" ]; then
    # The first three Fashion-MNIST test images and labels, with their counts set to 3.
    python3 - "$fm" "$s/fmnist3.bin" <<'EOF'
import gzip, struct, sys
fm, out = sys.argv[1], sys.argv[2]
img = gzip.open(fm + "/t10k-images-idx3-ubyte.gz").read(16 + 3 * 784)
lab = gzip.open(fm + "/t10k-labels-idx1-ubyte.gz").read(8 + 3)
img = img[:4] + struct.pack(">I", 3) + img[8:]
lab = lab[:4] + struct.pack(">I", 3) + lab[8:]
open(out, "wb").write(struct.pack("<H", len(img)) + img + lab)
EOF
    seed idx "$s/fmnist3.bin"
fi
seed npy "$s/npy.bin"
fetch_movielens
head -n 60 "$PEREGRINE_ML100K" >"$s/ml100k-60.inter"
seed ratings "$s/ml100k-60.inter"
for f in configs/*.toml; do
    case "$f" in
    configs/experiment-*) seed experiment_config "$f" ;;
    *) seed train_config "$f" ;;
    esac
done
# A real checkpoint and model file from a short run.
"$P" train --ranks 1 --model lr --data "$s/heart.pgd" --iterations 4 --checkpoint-every 2 --run-dir "$s/run" -q \
    --force >/dev/null
seed checkpoint "$s/run/checkpoint.safetensors"
seed model_file "$s/run/model.safetensors"
"$P" train --ranks 1 --model mlp --data "$s/gd.pgd" --hidden 4 --iterations 2 --checkpoint-every 1 --run-dir "$s/mlp" \
    -q --force >/dev/null
seed checkpoint "$s/mlp/checkpoint.safetensors" mlp.safetensors
seed model_file "$s/mlp/model.safetensors" mlp.safetensors

step "fuzzing ${targets[*]}: $seconds s each, two at a time"
failed=()
run_one() {
    local t=$1 corpus=$work/corpus/$1 artifacts=$work/artifacts/$1/
    mkdir -p "$corpus" "$artifacts" "$work/seeds/$t"
    # -timeout: an input taking over 10 s is a hang; -rss_limit_mb: 2 GiB is a leak or a bomb.
    (cd fuzz && cargo +nightly fuzz run --debug-assertions "$t" "$corpus" "$work/seeds/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$artifacts" \
        -print_final_stats=1) >"$work/$t.log" 2>&1
}
i=0
pids=()
names=()
for t in "${targets[@]}"; do
    mkdir -p "fuzz/seeds/$t"
    run_one "$t" &
    pids+=($!)
    names+=("$t")
    i=$((i + 1))
    if [ $((i % 2)) -eq 0 ]; then
        for k in "${!pids[@]}"; do wait "${pids[$k]}" || failed+=("${names[$k]}"); done
        pids=()
        names=()
    fi
done
for k in "${!pids[@]}"; do wait "${pids[$k]}" || failed+=("${names[$k]}"); done

printf '%-18s %12s %8s %8s %6s\n' target executions seconds crashes slow
for t in "${targets[@]}"; do
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | awk '{print $2}' | tail -n 1 || true)
    secs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$work/$t.log" | awk '{print $5}' | tail -n 1 || true)
    # crash-, timeout-, oom- and leak- files are findings; slow-unit- files are inputs slower than
    # the rest (reported, not failures).
    crashes=$(find "$work/artifacts/$t" -type f ! -name 'slow-unit-*' | wc -l)
    slow=$(find "$work/artifacts/$t" -type f -name 'slow-unit-*' | wc -l)
    printf '%-18s %12s %8s %8s %6s\n' "$t" "${runs:-?}" "${secs:-?}" "$crashes" "$slow"
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: findings in ${failed[*]} (logs: $work/<target>.log, inputs: $work/artifacts/)" >&2
    exit 1
fi
