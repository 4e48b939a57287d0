#!/usr/bin/env bash
# The Python binding (issue #43): builds and installs `dckpt` with pip into a
# virtual environment (target/python-venv, which sees the interpreter's own
# packages: a machine's PyTorch and CuPy; PYTHON picks the interpreter;
# DCKPT_WHEEL=path uses a wheel built elsewhere instead, beside the
# interpreter's packages, on a machine without Rust), then,
# under mpirun, its tests with 1, 2 and 3 ranks (write, a restart in a new
# job, byte-exact, a read on another rank count), the mpi4py + NumPy stencil
# killed and restarted (the same plate as a run never interrupted), and
# where CuPy, PyTorch and a GPU are: the GPU tests (1 and 2 ranks) and the
# PyTorch data-parallel example killed and restarted (the same weights, bit
# for bit). Needs pip's index (numpy, mpi4py, maturin) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheel=${DCKPT_WHEEL:-}
unset DCKPT_WHEEL # not a setting: the runtime refuses unknown DCKPT_* variables
if [ -n "$wheel" ]; then
    # A machine without Rust (or pip's index): the wheel beside the
    # interpreter's own packages (NumPy, mpi4py, PyTorch, CuPy), and pytest
    # from the wheel's folder where the interpreter has none.
    py=$(command -v "${PYTHON:-python3}")
    "$py" -m pip install -q --no-deps --target "$work/site" "$wheel"
    "$py" -c "import pytest" 2>/dev/null ||
        "$py" -m pip install -q --no-deps --no-index --find-links "$(dirname "$wheel")" --target "$work/site" \
            pytest pluggy iniconfig packaging pygments
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
else
    venv=target/python-venv
    if [ ! -x "$venv/bin/python" ]; then
        "${PYTHON:-python3}" -m venv --system-site-packages "$venv"
    fi
    "$venv/bin/pip" install -q --upgrade pip >/dev/null
    "$venv/bin/pip" install -q numpy mpi4py pytest
    "$venv/bin/pip" install -q ./python
    py="$PWD/$venv/bin/python" # not resolved: the link is what makes it the environment
fi
# pytest under mpirun, one phase a job (python/tests/conftest.py); every
# rank's pytest reports, rank 0's line is kept.
pytest() {
    local log="$work/pytest.log" rc=0
    timeout 300 mpirun --oversubscribe -np "$1" "$py" -m pytest -q --color=no "${@:2}" >"$log" 2>&1 || rc=$?
    # 5: nothing collected, as when a module skips itself (no GPU here).
    if [ "$rc" != 0 ] && ! { [ "$rc" = 5 ] && grep -q skipped "$log"; }; then
        cat "$log"
        echo "FAILED: $1 rank(s): pytest ${*:2}"
        exit 1
    fi
    echo "pytest, $1 rank(s), ${*:2}: $(grep -m1 -E 'passed|skipped' "$log")"
}
for np in 1 2 3; do
    d="$work/t$np"
    for phase in write restart; do
        pytest "$np" python/tests/test_runtime.py -k "test_$phase" --store "$d"
    done
    pytest 1 python/tests/test_runtime.py -k test_resize --store "$d" --old-ranks "$np"
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
# mpirun may return before its ranks have ended: a restart meanwhile is
# refused (the store is in use by another writer), so wait for them.
for _ in $(seq 100); do pgrep -f "$work/sigint" >/dev/null || break; sleep 0.1; done
out=$(stencil --dir "$work/sigint" --steps 20000 --every 100)
got=$(echo "$out" | grep -o 'digest [0-9a-f]*')
[ "$got" = "$want" ] || { echo "FAILED: the stencil after SIGINT: $got, uninterrupted: $want"; echo "$out"; exit 1; }
echo "python: the stencil interrupted by SIGINT, $(echo "$out" | grep -o 'restarted from the checkpoint of step [0-9]*' || echo 'from the start'): same plate"
# The GPU: CuPy and PyTorch arrays where they live (the test says
# `skipped` without them), and the PyTorch example killed (SIGKILL) mid-run.
for np in 1 2; do
    for phase in write restart; do
        pytest "$np" python/tests/test_gpu.py -k "test_$phase" --store "$work/g$np"
    done
done
if "$py" -c "import torch" 2>/dev/null; then
    train() { timeout 300 mpirun --oversubscribe -np "${TRAIN_RANKS:-2}" "$py" examples/python/train.py --steps 30 "$@"; }
    # Killed at a random step, then run again: the weights of a run never
    # interrupted, bit for bit; with NCCL summing the gradients too, where
    # there are GPUs for it.
    variants=("")
    "$py" -c "import torch, sys; sys.exit(torch.cuda.device_count() < 2)" 2>/dev/null && variants+=("--torch-distributed")
    for v in "${variants[@]}"; do
        want=$(train $v --dir "$work/train-clean$v" | grep -o 'weights digest [0-9a-f]*')
        kill_at=$((6 + RANDOM % 20))
        train $v --dir "$work/train-killed$v" --kill-at "$kill_at" >/dev/null 2>&1 && { echo "FAILED: the training meant to die finished"; exit 1; }
        out=$(train $v --dir "$work/train-killed$v")
        got=$(echo "$out" | grep -o 'weights digest [0-9a-f]*')
        [ -n "$want" ] && [ "$got" = "$want" ] || { echo "FAILED: training $v killed at step $kill_at: $got, uninterrupted: $want"; echo "$out"; exit 1; }
        echo "python: training ${v:-(MPI all-reduce)} killed at step $kill_at, $(echo "$out" | grep -o 'restarted from the checkpoint of step [0-9]*' || echo 'from the start'): the same weights"
    done
else
    echo "python: the PyTorch example skipped (no torch here)"
fi
