#!/usr/bin/env bash
# A batch job's life without a scheduler (issue #44): the heat example on
# RANKS ranks (CPU backend) under `dckpt run`, as the job scripts in
# scripts/slurm and scripts/pbs launch it.
#  1. The first attempt dies at step 45 (--crash-at): `dckpt run` runs the
#     command again, which resumes from its newest durable checkpoint and
#     ends with the uninterrupted plate.
#  2. SIGUSR1 to `dckpt run` (SLURM's --signal=B:USR1, PBS's kill_delay):
#     passed on to mpirun and to the ranks; heat takes a last checkpoint,
#     waits for it and exits 0; `dckpt run` does not run it again; the same
#     command then goes on from that step to the uninterrupted plate.
#   scripts/batch-test.sh [RANKS] [DCKPT] [HEAT]   (after cargo build --release --examples)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
dckpt=$(realpath "${2:-target/release/dckpt}")
heat=$(realpath "${3:-target/release/examples/heat}")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --oversubscribe -np "$ranks")
size=(--device cpu --rows 256 --cols 2048)

want=$(timeout 300 "${mpi[@]}" "$heat" "${size[@]}" --steps 100 --every 10 --dir "$work/whole" 2>/dev/null |
    grep -o 'digest [0-9a-f]*')

# 1. A failure inside the allocation, rerun.
cat >"$work/job.sh" <<EOF
#!/bin/sh
if [ ! -e "$work/crashed" ]; then touch "$work/crashed"; set -- --crash-at 45; fi
exec ${mpi[*]} "$heat" ${size[*]} --steps 100 --every 10 --dir "$work/rerun" "\$@"
EOF
chmod +x "$work/job.sh"
timeout 300 "$dckpt" run --retries 2 -- "$work/job.sh" >"$work/log" 2>&1 ||
    { echo "FAILED: dckpt run did not recover the crashed heat"; cat "$work/log"; exit 1; }
grep -q "dckpt run: the command .* (attempt 1 of 3); running it again" "$work/log" ||
    { echo "FAILED: dckpt run did not say it ran the command again"; cat "$work/log"; exit 1; }
# Asynchronous checkpoints: the rerun goes on from whichever was durable (40 at most).
from=$(grep -o "restarted from the checkpoint of step [0-9]*" "$work/log") ||
    { echo "FAILED: the rerun did not resume from a checkpoint"; cat "$work/log"; exit 1; }
got=$(grep -o 'digest [0-9a-f]*' "$work/log")
[ "$got" = "$want" ] || { echo "FAILED: rerun: $got, uninterrupted: $want"; exit 1; }
echo "batch-test: crashed at step 45, dckpt run ran it again, $from: same plate"

# 2. The scheduler's signal, through dckpt run and mpirun to the ranks.
small=(--device cpu --rows 32 --cols 256 --steps 100000 --every 1000)
run() { timeout 300 "$dckpt" run --retries 2 -- "${mpi[@]}" "$heat" "${small[@]}" --dir "$work/signalled"; }
want=$(timeout 300 "${mpi[@]}" "$heat" "${small[@]}" --dir "$work/long" 2>/dev/null | grep -o 'digest [0-9a-f]*')
run >"$work/log" 2>&1 &
job=$!
# Once a checkpoint is stored, every rank watches the signals (from its first should_exit).
scripts/wait-for-checkpoint.sh "$work/signalled" || true
pkill -USR1 -x dckpt || true
wait "$job" || { echo "FAILED: the signalled job did not exit 0"; cat "$work/log"; exit 1; }
stopped=$(grep -o 'stopping after step [0-9]*' "$work/log") ||
    { echo "FAILED: heat did not stop on SIGUSR1 through dckpt run"; cat "$work/log"; exit 1; }
grep -q "dckpt run: the command succeeded (attempt 1 of" "$work/log" ||
    { echo "FAILED: dckpt run did not report the clean stop"; cat "$work/log"; exit 1; }
run >"$work/log" 2>&1
grep -q "restarted from the checkpoint of step ${stopped##* }" "$work/log" ||
    { echo "FAILED: the next job did not go on from step ${stopped##* }"; cat "$work/log"; exit 1; }
got=$(grep -o 'digest [0-9a-f]*' "$work/log")
[ "$got" = "$want" ] || { echo "FAILED: signalled and resumed: $got, uninterrupted: $want"; exit 1; }
echo "batch-test: SIGUSR1 to dckpt run: heat $stopped (exit 0, not rerun); the next job went on: same plate"

# 3. The SLURM job script itself, run by bash as sbatch would (no SLURM
#    here: a stand-in `scontrol` records the requeue): SIGUSR1 to the
#    script (what --signal=B:USR1@120 sends) reaches the ranks through its
#    trap; heat stops with its checkpoint durable; the script requeues.
mkdir -p "$work/bin" "$work/slurm"
printf '#!/bin/sh\necho "$@" >> %s/scontrol.log\n' "$work" >"$work/bin/scontrol"
chmod +x "$work/bin/scontrol"
script=$(realpath scripts/slurm/heat.sbatch)
(cd "$work/slurm" && PATH="$work/bin:$PATH" SLURM_JOB_ID=77 DCKPT="$dckpt" HEAT="$heat" DEVICE=cpu ROWS=32 \
    COLS=256 STEPS=100000 EVERY=1000 CKPT_DIR="$work/slurm/ckpt" SCRATCH="$work/slurm/scratch" timeout 300 bash "$script" >"$work/slurm.log" 2>&1) &
job=$!
scripts/wait-for-checkpoint.sh "$work/slurm/ckpt" || true
pkill -USR1 -f "^bash $script" || true
wait "$job" || { echo "FAILED: the SLURM job script exited non-zero after SIGUSR1"; cat "$work/slurm.log"; exit 1; }
grep -q "stopping after step" "$work/slurm.log" && grep -q "^requeue 77$" "$work/scontrol.log" ||
    { echo "FAILED: the SLURM job script did not stop heat and requeue"; cat "$work/slurm.log"; exit 1; }
echo "batch-test: scripts/slurm/heat.sbatch: SIGUSR1 to the script: $(grep -o 'stopping after step [0-9]*' "$work/slurm.log"), requeued"
