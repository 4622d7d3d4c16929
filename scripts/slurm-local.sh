#!/usr/bin/env bash
# A real single-node Slurm cluster on loopback, for tests and trying `peregrine slurm sbatch`.
#
#   scripts/slurm-local.sh start   # install (Debian packages), configure, start munged, slurmctld, slurmd
#   scripts/slurm-local.sh stop    # stop the daemons started by `start`
#   scripts/slurm-local.sh env     # print `export SLURM_CONF=...` for this cluster
#
# No systemd: the daemons are started by hand, with their config, state, spool, logs and pid files
# in $PEREGRINE_SLURM_DIR (default /tmp/peregrine-slurm). The node declares CPUs=4 whatever the
# machine has, so that `srun -n 4` starts on a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

dir="${PEREGRINE_SLURM_DIR:-/tmp/peregrine-slurm}"
conf="$dir/slurm.conf"
host="$(hostname -s)"

write_conf() {
    mkdir -p "$dir"/{state,spool,log}
    {
        cat <<CONF
# Single-node Slurm on loopback, written by scripts/slurm-local.sh.
ClusterName=peregrine
SlurmctldHost=$host(127.0.0.1)
CONF
        slurm_conf_common
        cat <<CONF
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    } > "$conf"
}

start() {
    ensure_packages slurmctld slurmd slurm-client munge
    write_conf
    export SLURM_CONF="$conf"
    start_munge
    stop
    /usr/sbin/slurmctld -f "$conf"
    /usr/sbin/slurmd -f "$conf"
    # Wait until the node accepts jobs.
    for _ in $(seq 1 60); do
        if sinfo -h -N -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
            echo "slurm is up: export SLURM_CONF=$conf"
            return 0
        fi
        scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "slurm did not come up; logs in $dir/log:" >&2
    tail -n 20 "$dir"/log/*.log >&2 || true
    return 1
}

# Stops only the daemons of this configuration (never a real cluster's).
stop() {
    local d
    for d in slurmd slurmctld; do
        pkill -f "^/usr/sbin/$d -f $conf\$" 2>/dev/null || true
    done
    for _ in $(seq 1 50); do
        pgrep -f "^/usr/sbin/slurm(ctld|d) -f $conf\$" >/dev/null || return 0
        sleep 0.1
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$conf" ;;
    *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
