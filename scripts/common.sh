# Shared by the scripts in this folder: sourced, not run.

export PATH="$HOME/.cargo/bin:$PATH"

# OpenMPI as root on a small machine: allow root, allow more ranks than cores, and use one-sided
# components that work (the default osc/rdma crashes in MPI_Compare_and_swap on OpenMPI 4.1).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_osc="${OMPI_MCA_osc:-sm,pt2pt}"

step() { printf '\n==> %s\n' "$*"; }

# ensure_packages PKG...: installs the Debian packages that are missing (apt-get; root or sudo).
ensure_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    step "installing ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What building the `mpi` feature needs: an MPI (OpenMPI, the default `mpicc`/`mpirun`), libclang
# for rsmpi's bindgen, and pkg-config.
MPI_BUILD_PACKAGES=(openmpi-bin libopenmpi-dev libclang-dev clang pkg-config)

# fetch_movielens: exports PEREGRINE_ML100K, the MovieLens-100k ratings file. The data may be used
# but not redistributed: fetched (once) from the PyPI wheel that carries it, never committed.
fetch_movielens() {
    local ml_dir=target/datasets/recbole-1.2.1
    export PEREGRINE_ML100K="$PWD/$ml_dir/recbole/dataset_example/ml-100k/ml-100k.inter"
    [ -f "$PEREGRINE_ML100K" ] && return 0
    step "fetching MovieLens-100k (PyPI wheel recbole==1.2.1)"
    mkdir -p "$ml_dir"
    python3 -m pip download --quiet --no-deps --dest "$ml_dir" recbole==1.2.1
    python3 - "$ml_dir" <<'PY'
import pathlib, sys, zipfile
d = pathlib.Path(sys.argv[1])
wheel = next(d.glob("recbole-1.2.1-*.whl"))
zipfile.ZipFile(wheel).extract("recbole/dataset_example/ml-100k/ml-100k.inter", d)
PY
}

# fetch_lda_reference: the `lda` package (PyPI lda==3.0.2, collapsed Gibbs sampling for LDA),
# the LDA tests' reference, and the Reuters corpus its wheel carries (395 documents, LDA-C).
# Exports PEREGRINE_REUTERS (the corpus), PEREGRINE_LDA_PYTHONPATH (where the package is) and
# PEREGRINE_LDA_PYTHON (Debian's python3, whose python3-numpy the package needs).
fetch_lda_reference() {
    local dir=target/datasets/lda-3.0.2
    export PEREGRINE_REUTERS="$PWD/$dir/site/lda/tests/reuters.ldac"
    export PEREGRINE_LDA_PYTHONPATH="$PWD/$dir/site" PEREGRINE_LDA_PYTHON=/usr/bin/python3
    ensure_packages python3-numpy python3-pip
    [ -f "$PEREGRINE_REUTERS" ] && return 0
    step "fetching the lda package and its Reuters corpus (PyPI wheel lda==3.0.2)"
    mkdir -p "$dir/site"
    "$PEREGRINE_LDA_PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dir" lda==3.0.2
    # A wheel is a zip of what an install puts in site-packages.
    "$PEREGRINE_LDA_PYTHON" -m zipfile -e "$dir"/lda-3.0.2-*.whl "$dir/site"
}

# bench_datasets PEREGRINE DIR: the benchmarks' real datasets in DIR, converted once by the
# binary PEREGRINE: Fashion-MNIST (fm-train.pgd, fm-test.pgd), Adult (adult.pgd), MovieLens-100k
# split 90/10 with seed 1 (ml-train.pgd, ml-test.pgd; needs fetch_movielens first).
bench_datasets() {
    local P=$1 d=$2
    local fm=${PEREGRINE_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
    mkdir -p "$d"
    [ -f "$d/fm-train.pgd" ] || "$P" data convert idx --images "$fm/train-images-idx3-ubyte.gz" \
        --labels "$fm/train-labels-idx1-ubyte.gz" "$d/fm-train.pgd"
    [ -f "$d/fm-test.pgd" ] || "$P" data convert idx --images "$fm/t10k-images-idx3-ubyte.gz" \
        --labels "$fm/t10k-labels-idx1-ubyte.gz" "$d/fm-test.pgd"
    [ -f "$d/adult.pgd" ] || "$P" data convert libsvm tests/data/adult.libsvm.gz "$d/adult.pgd"
    if [ ! -f "$d/ml-train.pgd" ]; then
        "$P" data convert ratings "$PEREGRINE_ML100K" "$d/ml.pgd"
        "$P" data split "$d/ml.pgd" --train "$d/ml-train.pgd" --test "$d/ml-test.pgd" --test-fraction 0.1 --seed 1
    fi
}

# summary_field RUN_DIR NAME: a top-level number of RUN_DIR/summary.json (empty if null).
summary_field() { sed -n "s/^  \"$2\": \([0-9.e+-]*\),\{0,1\}$/\1/p" "$1/summary.json"; }

# per_rank_sum RUN_DIR NAME: the sum over ranks of a per-rank number of RUN_DIR/summary.json.
per_rank_sum() {
    sed -n "s/^ *\"$2\": \([0-9.e+-]*\),\{0,1\}$/\1/p" "$1/summary.json" | awk '{s += $1} END {printf "%.3f", s}'
}

# Slurm without systemd, shared by slurm-local.sh and cluster-local.sh.
# slurm_conf_common: the slurm.conf lines both test clusters share (root daemons, munge, no
# cgroups, no accounting, requeue allowed; the backfill scheduler, the only one that starts
# heterogeneous jobs, every 2 s rather than 30).
slurm_conf_common() {
    cat <<'CONF'
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=pmix
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
ReturnToService=2
MinJobAge=600
SchedulerParameters=bf_interval=2
SlurmctldPort=6817
SlurmdPort=6818
CONF
}

# start_munge: munged, unless one runs (its key is created when the package is installed).
start_munge() {
    pgrep -x munged >/dev/null && return 0
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    runuser -u munge -- /usr/sbin/munged
}
