#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine: each node a network namespace with its own
# hostname (UTS namespace), address and slurmd; the controller in a namespace of its own holding
# the bridge that joins them. MPI between nodes goes over TCP on that bridge, as between the nodes
# of a cluster without RDMA.
#
#   scripts/cluster-local.sh start   # install (Debian packages), create namespaces, start munged,
#                                    # slurmctld and one slurmd per node; waits until all are idle
#   scripts/cluster-local.sh stop    # stop the daemons, delete the namespaces and links
#   scripts/cluster-local.sh env     # print the exports that make srun/sbatch/... talk to it
#   scripts/cluster-local.sh status  # sinfo of the cluster
#
# Nodes: pgr-n1 .. pgr-n$PEREGRINE_CLUSTER_NODES (default 4, at most 9): the first half is node
# type `type-a` (2 CPUs), the rest `type-b` (4 CPUs), so that heterogeneous jobs have two node
# types. Addresses 10.213.0.0/24 (controller .1, node k .10+k) exist only inside the namespaces
# this script creates; nothing is added to the machine's own network. Each namespace's /etc/hosts
# (/etc/netns/<ns>/hosts, which `ip netns exec` mounts over /etc/hosts) names every node.
#
# Client commands must run inside the controller's namespace: `env` prints a PATH whose srun,
# sbatch, sinfo, squeue, scontrol, scancel, salloc and sacct are wrappers doing that (from a node's
# namespace, inside a job, they run the real command in place). State, spool, logs and pid files
# are under $PEREGRINE_CLUSTER_DIR (default target/cluster-local), and so is each node's /tmp
# (tmp/<node>): a job's working directory must be elsewhere, on the shared file system (as on a
# cluster). Needs root (namespaces).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

dir="$(realpath -m "${PEREGRINE_CLUSTER_DIR:-target/cluster-local}")"
conf="$dir/slurm.conf"
nodes="${PEREGRINE_CLUSTER_NODES:-4}"
net=10.213.0
ctl=pgr-ctl
bridge=pgrbr0

node_names() { local k; for k in $(seq 1 "$nodes"); do echo "pgr-n$k"; done; }

write_conf() {
    mkdir -p "$dir"/{state,log,bin} "$dir"/spool
    local half=$(((nodes + 1) / 2)) k
    {
        cat <<CONF
# Multi-node Slurm in network namespaces, written by scripts/cluster-local.sh.
ClusterName=peregrine-ns
SlurmctldHost=$ctl($net.1)
CONF
        slurm_conf_common
        cat <<CONF
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
CONF
        for k in $(seq 1 "$nodes"); do
            if [ "$k" -le "$half" ]; then
                echo "NodeName=pgr-n$k NodeAddr=$net.$((10 + k)) CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=2000 Feature=type-a State=UNKNOWN"
            else
                echo "NodeName=pgr-n$k NodeAddr=$net.$((10 + k)) CPUs=4 Sockets=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=4000 Feature=type-b State=UNKNOWN"
            fi
        done
        echo "PartitionName=cluster Nodes=pgr-n[1-$nodes] Default=YES MaxTime=INFINITE State=UP"
    } > "$conf"
    local c
    for c in srun sbatch salloc sinfo squeue scontrol scancel sacct; do
        cat > "$dir/bin/$c" <<WRAP
#!/bin/sh
# $c of the namespaced cluster (scripts/cluster-local.sh): run in the controller's network
# namespace, unless already inside one of the cluster's namespaces (a job's batch script).
case "\$(ip netns identify \$\$ 2>/dev/null)" in
    pgr-*) exec /usr/bin/$c "\$@" ;;
    *) exec ip netns exec $ctl /usr/bin/$c "\$@" ;;
esac
WRAP
        chmod +x "$dir/bin/$c"
    done
}

hosts_file() {
    echo "127.0.0.1 localhost"
    echo "$net.1 $ctl $(hostname -s)"
    local k
    for k in $(seq 1 "$nodes"); do echo "$net.$((10 + k)) pgr-n$k"; done
}

# add_ns NAME ADDRESS: a namespace with loopback and a veth into the bridge, and its hosts file.
add_ns() {
    local ns=$1 addr=$2
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    hosts_file > "/etc/netns/$ns/hosts"
    if [ "$ns" = "$ctl" ]; then
        ip -n "$ns" link add "$bridge" type bridge
        ip -n "$ns" addr add "$addr/24" dev "$bridge"
        ip -n "$ns" link set "$bridge" up
        return
    fi
    # The veth pair is created inside the controller's namespace (its names never appear in the
    # machine's own), then one end is moved into the node's.
    ip -n "$ctl" link add "v-$ns" type veth peer name eth0 netns "$ns"
    ip -n "$ctl" link set "v-$ns" master "$bridge" up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
}

# in_ns NAMESPACE HOSTNAME COMMAND...: COMMAND in that network namespace, with that hostname (a
# UTS namespace), the namespace's hosts file bound over /etc/hosts and, on a node, a /tmp of its
# own (in a mount namespace of its own: as on real nodes, PMIx and OpenMPI keep per-job files
# there whose names would collide between nodes). Not `ip netns exec`: it remounts /sys, which
# hides the cgroup mounts slurmd needs.
in_ns() {
    local ns=$1 host=$2 tmp=/tmp
    shift 2
    if [ "$ns" != "$ctl" ]; then
        tmp="$dir/tmp/$ns"
        mkdir -p "$tmp"
        chmod 1777 "$tmp"
    fi
    nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation slave \
        sh -c 'mount --bind "$0" /etc/hosts && mount --bind "$1" /tmp && hostname "$2" && shift 2 && exec "$@"' \
        "/etc/netns/$ns/hosts" "$tmp" "$host" "$@"
}

start() {
    [ "$(id -u)" -eq 0 ] || { echo "$0: needs root (network namespaces)" >&2; return 1; }
    if ! [[ "$nodes" =~ ^[2-9]$ ]]; then
        echo "$0: PEREGRINE_CLUSTER_NODES=$nodes: between 2 and 9 nodes" >&2
        return 1
    fi
    ensure_packages slurmctld slurmd slurm-client munge iproute2
    stop
    trap 'echo "$0: start failed; tearing down" >&2; stop' ERR
    write_conf
    add_ns "$ctl" "$net.1"
    local k
    for k in $(seq 1 "$nodes"); do add_ns "pgr-n$k" "$net.$((10 + k))"; done
    start_munge
    in_ns "$ctl" "$ctl" /usr/sbin/slurmctld -f "$conf"
    for k in $(seq 1 "$nodes"); do
        mkdir -p "$dir/spool/pgr-n$k"
        in_ns "pgr-n$k" "pgr-n$k" /usr/sbin/slurmd -f "$conf"
    done
    export SLURM_CONF="$conf" PATH="$dir/bin:$PATH"
    local _ idle
    for _ in $(seq 1 90); do
        idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -cE ' (idle|mixed|allocated)$' || true)
        if [ "$idle" -eq "$nodes" ]; then
            trap - ERR
            echo "cluster is up: $nodes nodes; eval \"\$($0 env)\" to use it"
            return 0
        fi
        scontrol update nodename="pgr-n[1-$nodes]" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    echo "$0: the nodes did not come up; logs in $dir/log:" >&2
    tail -n 20 "$dir"/log/*.log >&2 || true
    sinfo -N >&2 || true
    trap - ERR
    stop
    return 1
}

# Stops only what `start` made: the daemons of this configuration and the pgr-* namespaces.
stop() {
    local d ns
    for d in slurmd slurmctld; do
        pkill -f "^/usr/sbin/$d -f $conf\$" 2>/dev/null || true
    done
    for _ in $(seq 1 50); do
        pgrep -f "^/usr/sbin/slurm(ctld|d) -f $conf\$" >/dev/null || break
        sleep 0.1
    done
    pkill -9 -f "^/usr/sbin/slurm(ctld|d) -f $conf\$" 2>/dev/null || true
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^pgr-(ctl|n[0-9]+)$' || true); do
        # Whatever a job left running in the namespace goes with it.
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$conf PATH=$dir/bin:\$PATH" ;;
    status) SLURM_CONF="$conf" "$dir/bin/sinfo" -N -o '%N %T %c %f' ;;
    *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
