#!/usr/bin/env bash
# A private, throw-away Slurm cluster on this host, for tests (never for production).
#
#   scripts/slurm.sh start DIR   install Slurm if missing, then start munged, slurmctld and two
#                                slurmd (nodes n1 and n2, 4 fake GPUs each) with every file
#                                under DIR; prints the environment to use, e.g.
#                                SLURM_CONF=DIR/slurm.conf
#   scripts/slurm.sh stop DIR    cancel its jobs and stop its daemons (DIR is left as it is)
#
# The cluster:
#   * Debian's slurmctld, slurmd, slurm-client and munge, installed with apt-get when missing
#     (needs root, as in CI). Every daemon runs as root, without systemd, on its own port, with
#     -f DIR/slurm.conf (never /etc/slurm) and a munged of its own (socket and key under DIR).
#   * Two nodes, n1 and n2, on this host (NodeHostname=$(hostname), NodeAddr=127.0.0.1, each
#     slurmd started with -N and listening on its own Port=), 8 CPUs and 4 GPUs of type h100
#     each, features "fast" (n1) and "slow" (n2), under one leaf switch "leaf1" (topology.conf)
#     and one partition "gpu".
#   * The GPUs are fake devices: DIR/dev/nvidia0..7, made with `mknod ... c 195 N`, named by
#     gres.conf (AutoDetect=off, File=...). slurmd drops a GRES without files; with them, a job
#     sees the GPUs Slurm gave it in CUDA_VISIBLE_DEVICES (0,1,... on each node).
#   * ReturnToService=1: a node set DOWN by scontrol stays down until resumed.
#   * SchedulerParameters=bf_interval=1, or $GPUSCHED_SLURM_SCHEDULER_PARAMETERS when set (read
#     when DIR's slurm.conf is written: at a start with no slurmctld running there).
#   * Finished jobs stay readable with `scontrol show job` for MinJobAge (1 h): there is no
#     slurmdbd, so no sacct.
#
# Exit status: 0 on success; 3 if Slurm cannot be installed or started here (tests skip on 3,
# or fail with GPUSCHED_REQUIRE_SLURM=1), with the reason (and the daemons' logs) on stderr;
# 2 for a usage error.
set -euo pipefail

NODES=(n1 n2)
GPUS_PER_NODE=4
TIMEOUT=${GPUSCHED_SLURM_START_TIMEOUT:-60} # seconds until both nodes must be idle
# slurm.conf's SchedulerParameters (e.g. bf_interval=1,sched_interval=5 for short jobs)
SCHEDULER_PARAMETERS=${GPUSCHED_SLURM_SCHEDULER_PARAMETERS:-bf_interval=1}

usage() {
    echo "usage: $0 start DIR | $0 stop DIR" >&2
    exit 2
}

unavailable() {
    echo "slurm.sh: $*" >&2
    exit 3
}

have_slurm() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
        command -v sbatch >/dev/null && command -v munged >/dev/null
}

ensure_installed() {
    have_slurm && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        unavailable "Slurm is not installed, and cannot be (needs root and apt-get):" \
            "apt-get install slurmctld slurmd slurm-client munge"
    fi
    echo "slurm.sh: installing slurmctld slurmd slurm-client munge with apt-get ..." >&2
    # policy-rc.d keeps the packages' own daemons (systemd units, init scripts) from starting
    local policy=/usr/sbin/policy-rc.d created=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        created=1
    fi
    local ok=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends slurmctld slurmd slurm-client munge; } >&2 || ok=$?
    ((created)) && rm -f "$policy"
    ((ok == 0)) || unavailable "apt-get install slurmctld slurmd slurm-client munge failed"
    have_slurm || unavailable "Slurm's programs are still missing after apt-get install"
}

free_ports() { # N free TCP ports of 127.0.0.1
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

pid_of() { # the pid in pid file $1, if that process is alive
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 1
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

logs() {
    local file
    for file in "$DIR"/log/*.log; do
        [[ -f $file ]] || continue
        echo "--- $file (last lines)" >&2
        tail -n 15 "$file" >&2
    done
}

write_config() {
    local hostname ports ctld_port i node
    hostname=$(hostname)
    read -r -a ports <<<"$(free_ports $((1 + ${#NODES[@]})))"
    ctld_port=${ports[0]}
    mkdir -p "$DIR"/{dev,spool,log,run,munge}
    # users other than root submit jobs too: they need the way to munged's socket
    chmod 755 "$DIR" "$DIR/munge"
    for ((i = 0; i < ${#NODES[@]} * GPUS_PER_NODE; i++)); do
        [[ -c $DIR/dev/nvidia$i ]] || mknod "$DIR/dev/nvidia$i" c 195 "$i" ||
            unavailable "cannot make fake GPU devices (mknod $DIR/dev/nvidia$i c 195 $i)"
    done
    if [[ ! -f $DIR/munge/munge.key ]]; then
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 400 "$DIR/munge/munge.key"

    {
        cat <<EOF
# Written by scripts/slurm.sh: a test cluster on one host. Not for production.
ClusterName=gpusched
SlurmctldHost=$hostname(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=${ports[1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
TopologyPlugin=topology/tree
# 1, not 2: with 2 a node an admin set DOWN comes back as soon as its slurmd answers a ping
# (seen here within a second), and the tests down a node on purpose.
ReturnToService=1
# heterogeneous jobs (gangs with different GPU counts per node) are started by the backfill
# scheduler: look every second, not every 30 (GPUSCHED_SLURM_SCHEDULER_PARAMETERS replaces it)
SchedulerParameters=$SCHEDULER_PARAMETERS
MinJobAge=3600
KillWait=5
InactiveLimit=0
SlurmdTimeout=60
MessageTimeout=10
EOF
        i=0
        for node in "${NODES[@]}"; do
            local feature=fast
            ((i == 0)) || feature=slow
            echo "NodeName=$node NodeHostname=$hostname NodeAddr=127.0.0.1" \
                "Port=${ports[$((i + 1))]} CPUs=8 RealMemory=4096" \
                "Gres=gpu:h100:$GPUS_PER_NODE Feature=$feature State=UNKNOWN"
            i=$((i + 1))
        done
        echo "PartitionName=gpu Nodes=$(
            IFS=,
            echo "${NODES[*]}"
        ) Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    } >"$DIR/slurm.conf"

    {
        echo "AutoDetect=off"
        i=0
        for node in "${NODES[@]}"; do
            echo "NodeName=$node Name=gpu Type=h100" \
                "File=$DIR/dev/nvidia[$((i * GPUS_PER_NODE))-$(((i + 1) * GPUS_PER_NODE - 1))]"
            i=$((i + 1))
        done
    } >"$DIR/gres.conf"

    echo "SwitchName=leaf1 Nodes=$(
        IFS=,
        echo "${NODES[*]}"
    )" >"$DIR/topology.conf"
}

wait_idle() {
    local waited=0 idle
    while :; do
        idle=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle"' | wc -l) || idle=0
        ((idle >= ${#NODES[@]})) && return 0
        if ((waited >= TIMEOUT * 5)); then
            echo "slurm.sh: the nodes are not idle after $TIMEOUT s:" >&2
            sinfo -N >&2 || true
            logs
            stop_daemons
            exit 3
        fi
        sleep 0.2
        waited=$((waited + 1))
    done
}

start() {
    ensure_installed
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    export SLURM_CONF=$DIR/slurm.conf
    if [[ -f $SLURM_CONF ]] && pid_of "$DIR/run/slurmctld.pid" >/dev/null; then
        wait_idle
        echo "SLURM_CONF=$SLURM_CONF"
        return 0
    fi
    [[ $(id -u) -eq 0 ]] || unavailable "the test cluster's daemons run as root; run as root"
    write_config

    munged --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munge.seed" --force >&2 ||
        {
            logs
            unavailable "munged did not start"
        }
    slurmctld -c -f "$SLURM_CONF" >&2 || {
        logs
        stop_daemons
        unavailable "slurmctld did not start"
    }
    local node
    for node in "${NODES[@]}"; do
        slurmd -N "$node" -f "$SLURM_CONF" >&2 || {
            logs
            stop_daemons
            unavailable "slurmd -N $node did not start"
        }
    done
    wait_idle
    echo "SLURM_CONF=$SLURM_CONF"
}

# The job processes of this cluster: slurmstepd and its children, found by the spool directory
# slurmstepd runs in (under DIR; a slurmd's jobs outlive it).
stepd_pids() {
    local pid cwd
    for pid in $(pgrep -x slurmstepd 2>/dev/null || true); do
        cwd=$(readlink "/proc/$pid/cwd" 2>/dev/null) || continue
        [[ $cwd == "$DIR"/* ]] && echo "$pid"
    done
    return 0
}

tree_pids() { # $1 and its descendants
    local child
    echo "$1"
    for child in $(pgrep -P "$1" 2>/dev/null || true); do
        tree_pids "$child"
    done
}

stop_daemons() {
    local file pid pids=() waited=0
    for file in "$DIR"/run/slurmd-*.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
        pid=$(pid_of "$file") || continue
        pids+=("$pid")
    done
    for pid in $(stepd_pids); do
        # shellcheck disable=SC2207
        pids+=($(tree_pids "$pid"))
    done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    while ((waited < 100)); do
        local alive=0
        for pid in "${pids[@]}"; do
            kill -0 "$pid" 2>/dev/null && alive=1
        done
        ((alive)) || return 0
        sleep 0.1
        waited=$((waited + 1))
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
}

stop() {
    [[ -d $DIR ]] || return 0
    DIR=$(cd "$DIR" && pwd)
    export SLURM_CONF=$DIR/slurm.conf
    if pid_of "$DIR/run/slurmctld.pid" >/dev/null; then
        # cancel every job first, so that slurmd ends its job processes
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            local waited=0
            while [[ -n $(squeue -h -o %i 2>/dev/null || true) ]] && ((waited < 50)); do
                sleep 0.2
                waited=$((waited + 1))
            done
        fi
    fi
    stop_daemons
}

[[ $# -eq 2 ]] || usage
DIR=$2
case $1 in
start) start ;;
stop) stop ;;
*) usage ;;
esac
