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
    # The README's lines as printed (`python-install`): ./venv, the package
    # built and installed, the NumPy stencil killed at step 130 and restarted.
    rm -rf target/stencil
    OMPI_MCA_rmaps_base_oversubscribe=1 bash -eo pipefail -c "$(scripts/readme-block.sh python-install)" >"$work/install.log" 2>&1 ||
        { cat "$work/install.log"; echo "FAILED: the README's Python install lines"; exit 1; }
    grep -q "a rank died at step 130, as asked" "$work/install.log" && grep -q "restarted from the checkpoint of step 120" "$work/install.log" ||
        { cat "$work/install.log"; echo "FAILED: the README's stencil did not die at 130 and go on from 120"; exit 1; }
    echo "python: the README's install lines: built, installed, the stencil killed at 130 went on from 120"
    venv/bin/pip install -q pytest
    py="$PWD/venv/bin/python" # not resolved: the link is what makes it the environment
fi
# The README's first Python program (`quick-python`) and its lines, as
# printed, where `venv` is the environment in use (or the wheel's interpreter).
quick="$work/quick"
mkdir -p "$quick"
if [ -f "$(dirname "$(dirname "$py")")/pyvenv.cfg" ]; then
    ln -s "$(dirname "$(dirname "$py")")" "$quick/venv"
else
    mkdir -p "$quick/venv/bin" && ln -s "$py" "$quick/venv/bin/python"
fi
scripts/readme-block.sh quick-python >"$quick/quick.py"
rm -rf /tmp/quick-ckpt-py
run_block=$(scripts/readme-block.sh quick-python-run)
(cd "$quick" && OMPI_MCA_rmaps_base_oversubscribe=1 bash -eo pipefail -c "$run_block") >"$work/quick.log" 2>&1 ||
    { cat "$work/quick.log"; echo "FAILED: the README's Python program"; exit 1; }
scripts/check-first-program.sh "$work/quick.log" "Python program" "field[6] = 600.0"
rm -rf /tmp/quick-ckpt-py
# The README's Runtime example (`python-runtime`) as printed, twice: a first
# job, then one that restarts from it (its directories: ckpt, /tmp/ckpt).
scripts/readme-block.sh python-runtime >"$quick/runtime.py"
for job in 1 2; do
    (cd "$quick" && timeout 120 mpirun --oversubscribe -np 2 venv/bin/python runtime.py) >"$work/runtime.log" 2>&1 ||
        { cat "$work/runtime.log"; echo "FAILED: the README's Python Runtime example, job $job"; exit 1; }
done
[ -d "$quick/ckpt/sim" ] || { ls -R "$quick" | head; echo "FAILED: the README's Python Runtime example stored nothing in ckpt/sim"; exit 1; }
rm -rf /tmp/ckpt
echo "python: the README's Runtime example ran twice (a checkpoint, then a restart)"
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
