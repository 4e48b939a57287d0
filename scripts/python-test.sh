#!/usr/bin/env bash
# The Python binding (issue #43): builds and installs `dckpt` with pip into a
# virtual environment (target/python-venv; PYTHON picks the interpreter),
# then, under mpirun, its tests with 1, 2 and 3 ranks (write, a restart in a
# new job, byte-exact, a read on another rank count) and the mpi4py + NumPy
# stencil example killed and restarted: the same plate as a run never
# interrupted. Needs pip's index (numpy, mpi4py, maturin) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
venv=target/python-venv
if [ ! -x "$venv/bin/python" ]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
"$venv/bin/pip" install -q --upgrade pip >/dev/null
"$venv/bin/pip" install -q numpy mpi4py
"$venv/bin/pip" install -q ./python
py="$PWD/$venv/bin/python"   # not resolved: the link is what makes it the environment
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for np in 1 2 3; do
    d="$work/t$np"
    for phase in write restart; do
        timeout 300 mpirun --oversubscribe -np "$np" "$py" python/tests/test_runtime.py "$phase" "$d"
    done
    timeout 300 mpirun --oversubscribe -np 1 "$py" python/tests/test_runtime.py resize "$d" "$np"
done
stencil() { timeout 300 mpirun --oversubscribe -np 3 "$py" examples/python/stencil.py --rows 64 --cols 256 "$@"; }
want=$(stencil --dir "$work/clean" | grep -o 'digest [0-9a-f]*')
crash=$((30 + RANDOM % 150))
stencil --dir "$work/crashed" --crash-at "$crash" >/dev/null 2>&1 && { echo "FAILED: the stencil meant to die finished"; exit 1; }
out=$(stencil --dir "$work/crashed")
got=$(echo "$out" | grep -o 'digest [0-9a-f]*')
[ "$got" = "$want" ] || { echo "FAILED: stencil killed at step $crash: $got, uninterrupted: $want"; echo "$out"; exit 1; }
echo "python: the stencil killed at step $crash, $(echo "$out" | grep -o 'restarted from the checkpoint of step [0-9]*'): same plate"
# Ctrl-C: SIGINT to the job (mpirun and its ranks) mid-run; it ends, and
# the next run restarts from a checkpoint and ends with the same plate.
want=$(stencil --dir "$work/clean-long" --steps 20000 --every 100 | grep -o 'digest [0-9a-f]*')
(stencil --dir "$work/sigint" --steps 20000 --every 100 >/dev/null 2>&1 || true) &
job=$!
sleep "$((1 + RANDOM % 2)).$((RANDOM % 10))"
pkill -INT -f "$work/sigint" || true
wait "$job"
out=$(stencil --dir "$work/sigint" --steps 20000 --every 100)
got=$(echo "$out" | grep -o 'digest [0-9a-f]*')
[ "$got" = "$want" ] || { echo "FAILED: the stencil after SIGINT: $got, uninterrupted: $want"; echo "$out"; exit 1; }
echo "python: the stencil interrupted by SIGINT, $(echo "$out" | grep -o 'restarted from the checkpoint of step [0-9]*' || echo 'from the start'): same plate"
