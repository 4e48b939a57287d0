#!/usr/bin/env bash
# A real scheduler in the tests (issue #44): a single-node SLURM (munged,
# slurmctld, slurmd of the distribution's slurm-wlm, configured for this
# machine under a scratch directory, started and stopped here) runs
# scripts/slurm/heat.sbatch (CPU backend, 2 ranks) with a 10-minute limit.
# Its first run keeps 595 s in reserve (DCKPT_HALT_SECONDS): rank 0 reads
# the walltime left from the real `squeue`, should_exit says stop a few
# seconds in, heat takes its last checkpoint, the job script requeues the
# job; SLURM runs it again (SLURM_RESTART_COUNT 1, no reserve) from that
# checkpoint to the end, and the plate is the uninterrupted run's.
#   scripts/slurm-test.sh [DCKPT] [HEAT]     (after cargo build --release --examples)
# Where SLURM cannot start (not root, no packages and no apt, the daemons
# refuse) it says why and exits 0; SLURM_TEST=require makes that a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
dckpt=$(realpath "${1:-target/release/dckpt}")
heat=$(realpath "${2:-target/release/examples/heat}")
skip() {
    echo "slurm-test: skipped: $*"
    [ "${SLURM_TEST:-}" = require ] && exit 1
    exit 0
}

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null || skip "no slurm-wlm and munge, and no root apt-get to install them"
    echo "slurm-test: installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null 2>&1 ||
        { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            --no-install-recommends slurm-wlm munge >/dev/null 2>&1; } || skip "apt-get could not install slurm-wlm munge"
fi
[ "$(id -u)" -eq 0 ] || skip "the daemons of a test cluster run as root here"

work=$(mktemp -d)
export SLURM_CONF=$work/slurm.conf OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
stop_all() {
    for p in slurmd slurmctld; do
        [ -f "$work/$p.pid" ] && kill "$(cat "$work/$p.pid")" 2>/dev/null || true
    done
    [ -f "$work/munged.pid" ] && kill "$(cat "$work/munged.pid")" 2>/dev/null || true
    sleep 1
    rm -rf "$work"
}
trap stop_all EXIT
mkdir -p "$work/state" "$work/spool" "$work/log" "$work/job"
head -c 1024 /dev/urandom >"$work/munge.key"
chmod 400 "$work/munge.key"
munged -f --socket="$work/munge.socket" --key-file="$work/munge.key" --log-file="$work/log/munged.log" \
    --pid-file="$work/munged.pid" --seed-file="$work/munge.seed" || skip "munged did not start"
host=$(hostname -s)
port=$((20000 + RANDOM % 20000))
cat >"$SLURM_CONF" <<EOF
ClusterName=dckpttest
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$work/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
slurmctld -i >/dev/null 2>&1 || skip "slurmctld did not start ($(tail -2 "$work/log/slurmctld.log" 2>/dev/null))"
slurmd >/dev/null 2>&1 || skip "slurmd did not start ($(tail -2 "$work/log/slurmd.log" 2>/dev/null))"
for _ in $(seq 60); do
    sinfo -h -o %t 2>/dev/null | grep -q idle && break
    sleep 0.5
done
sinfo -h -o %t | grep -q idle || skip "the node did not come up ($(sinfo 2>&1 | tail -1))"
echo "slurm-test: a one-node SLURM is up ($(sinfo -h -o '%N: %c CPUs, %t'))"

size=(--device cpu --rows 32 --cols 256 --steps 400000 --every 1000)
want=$(timeout 300 mpirun --oversubscribe -np 2 "$heat" "${size[@]}" --dir "$work/whole" 2>/dev/null |
    grep -o 'digest [0-9a-f]*')

# The job: heat.sbatch as it is, the reserve only on the first run.
cat >"$work/job/job.sh" <<EOF
#!/bin/bash
export DCKPT_HALT_SECONDS=\$(( \${SLURM_RESTART_COUNT:-0} == 0 ? 595 : 0 ))
exec bash "$repo/scripts/slurm/heat.sbatch"
EOF
cd "$work/job"
id=$(DCKPT="$dckpt" HEAT="$heat" DEVICE=cpu ROWS=32 COLS=256 STEPS=400000 EVERY=1000 CKPT_DIR="$work/job/ckpt" SCRATCH="$work/job/scratch" \
    sbatch --parsable --nodes=1 --ntasks-per-node=2 --time=10 --requeue --open-mode=append \
    --output="$work/job/job.out" --export=ALL job.sh)
echo "slurm-test: submitted job $id (10 min limit, 595 s reserve on its first run)"
# Up to the first run's stop, a requeue (SLURM holds it about two minutes) and the second run.
for _ in $(seq 900); do
    state=$(squeue -h -j "$id" -o %T 2>/dev/null || true)
    [ -z "$state" ] && break
    sleep 0.5
done
[ -z "$state" ] || { echo "FAILED: job $id still $state after 7.5 minutes"; cat "$work/job/job.out"; exit 1; }
out=$work/job/job.out
stopped=$(grep -o 'stopping after step [0-9]* ([0-9]* s of walltime left' "$out") ||
    { echo "FAILED: the first run did not stop for the walltime"; cat "$out"; exit 1; }
grep -q "requeued" "$out" || { echo "FAILED: the job script did not requeue"; cat "$out"; exit 1; }
grep -q "(restart count 1)" "$out" || { echo "FAILED: SLURM did not run the job again"; cat "$out"; exit 1; }
step=$(echo "$stopped" | grep -o 'step [0-9]*' | grep -o '[0-9]*')
grep -q "restarted from the checkpoint of step $step" "$out" ||
    { echo "FAILED: the requeued run did not go on from step $step"; cat "$out"; exit 1; }
got=$(grep -o 'digest [0-9a-f]*' "$out" | tail -1)
[ "$got" = "$want" ] || { echo "FAILED: requeued: $got, uninterrupted: $want"; cat "$out"; exit 1; }
left=$(echo "$stopped" | grep -o '([0-9]*' | tr -d '(')
echo "slurm-test: job $id stopped after step $step with $left s of walltime left, was requeued and went on from" \
    "step $step to the uninterrupted plate"
