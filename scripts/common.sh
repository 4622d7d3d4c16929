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
