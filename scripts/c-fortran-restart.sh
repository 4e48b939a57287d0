#!/usr/bin/env bash
# The heat example in C and in Fortran through dckpt's C ABI (src/ffi):
# compiled with mpicc against libdckpt.so and with mpifort against
# libdckpt.a (cargo build --release makes both), run under mpirun with 2
# ranks uninterrupted, then killed mid-run (the last rank aborts) and
# started again: the restarted job must resume from a checkpoint and end
# with the same plate, bit for bit.
#   scripts/c-fortran-restart.sh [RANKS]   (default 2; after cargo build --release)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-2}
lib=$PWD/target/release
[ -f "$lib/libdckpt.so" ] && [ -f "$lib/libdckpt.a" ] || { echo "run cargo build --release first" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mpicc -O2 -std=c11 -Wall -Wextra -Werror examples/c/heat.c -Isrc/ffi -L"$lib" -ldckpt -Wl,-rpath,"$lib" \
    -o "$work/heat-c"
# The static library needs what Rust's std and the crates link against.
mpifort -O2 -Wall -J"$work" src/ffi/dckpt.f90 examples/fortran/heat.f90 "$lib/libdckpt.a" \
    -lffi -lgcc_s -lutil -lrt -lpthread -lm -ldl -o "$work/heat-f"

# A configuration file that does not exist: a clear error on every rank, no hang.
if DCKPT_CONFIG="$work/missing.toml" timeout 60 mpirun --oversubscribe -np "$ranks" "$work/heat-c" >"$work/log" 2>&1; then
    echo "FAILED: heat-c ran without its configuration file"; exit 1
fi
grep -q "dckpt_init.*failed (code 1).*missing.toml" "$work/log" ||
    { echo "FAILED: no clear error for a missing configuration file"; cat "$work/log"; exit 1; }
echo "heat-c: a missing configuration file is refused on every rank (code 1, the path named)"

for lang in c f; do
    run() { DCKPT_PERSISTENT="$work/$lang-$1" timeout 300 mpirun --oversubscribe -np "$ranks" "$work/heat-$lang" \
        --steps 200 --every 20 "${@:2}"; }
    want=$(run clean | grep -o 'digest [0-9a-fA-F]*')
    [ "$lang" = c ] && want_c=$want
    # Synchronous checkpoints: the one of step 120 is durable when the job dies at 130.
    if DCKPT_MODE=sync run sync --crash-at 130 >/dev/null 2>&1; then
        echo "FAILED: heat-$lang meant to die at step 130 finished"; exit 1
    fi
    got=$(run sync | tee "$work/log" | grep -o 'digest [0-9a-fA-F]*')
    grep -q "restarted from the checkpoint of step 120" "$work/log" ||
        { echo "FAILED: heat-$lang did not restart from step 120"; cat "$work/log"; exit 1; }
    [ "$got" = "$want" ] || { echo "FAILED: heat-$lang restarted: $got, uninterrupted: $want"; exit 1; }
    # Asynchronous checkpoints: whatever was durable when the job died.
    run async --crash-at 75 >/dev/null 2>&1 && { echo "FAILED: heat-$lang meant to die at step 75 finished"; exit 1; }
    got=$(run async | tee "$work/log" | grep -o 'digest [0-9a-fA-F]*')
    [ "$got" = "$want" ] || { echo "FAILED: heat-$lang restarted (async): $got, uninterrupted: $want"; exit 1; }
    echo "heat-$lang: killed at step 130 (sync) and 75 (async), restarted ($(grep -o 'from the checkpoint of step [0-9]*' "$work/log" || echo 'from the start')): same plate"
done

# Another rank count, from C (dckpt_old_regions, dckpt_committed_versions,
# dckpt_read_region): a job of RANKS + 1 ranks reads the old ranks' plates
# at the newest committed version and gets heat-c's digest.
mpicc -O2 -std=c11 -Wall -Wextra -Werror examples/c/reshape.c -Isrc/ffi -L"$lib" -ldckpt -Wl,-rpath,"$lib" \
    -o "$work/reshape"
got=$(DCKPT_PERSISTENT="$work/c-clean" timeout 120 mpirun --oversubscribe -np "$((ranks + 1))" "$work/reshape" |
    tee "$work/log" | grep -o 'digest [0-9a-fA-F]*')
[ "$got" = "$want_c" ] || { echo "FAILED: reshape on $((ranks + 1)) ranks: $got, heat-c: $want_c"; cat "$work/log"; exit 1; }
echo "reshape: $((ranks + 1)) ranks read heat-c's $ranks old ranks' regions from C: the same plate digest"

# The Fortran module's generic interfaces: a default-kind integer step is
# taken as well as a c_int64_t one (compiled only).
cat >"$work/kinds.f90" <<'F90'
program kinds
    use dckpt
    implicit none
    type(c_ptr) :: ck
    integer :: step, ierr
    integer(c_int64_t) :: step8
    type(dckpt_old_region) :: regions(4)
    integer(c_size_t) :: count
    step = 10
    step8 = 20
    ck = c_null_ptr
    ierr = dckpt_config("mode = sync")
    ierr = dckpt_checkpoint(ck, "kinds", step)
    ierr = dckpt_checkpoint(ck, "kinds", step8)
    ierr = dckpt_restart(ck, "kinds", step)
    ierr = dckpt_wait(ck, "kinds", step8)
    ierr = dckpt_old_regions(ck, "kinds", regions, count)
end program
F90
mpifort -fsyntax-only -I"$work" "$work/kinds.f90" ||
    { echo "FAILED: the Fortran module's generic interfaces (a default-kind integer step)"; exit 1; }
echo "dckpt.f90: dckpt_checkpoint, dckpt_restart and dckpt_wait take a default-kind or a c_int64_t step"

# A scheduler's signal (SIGUSR1 to mpirun, which forwards it; SLURM's
# --signal, PBS's kill_delay): dckpt_should_exit says stop on every rank, the
# example takes a last checkpoint, waits for it and exits 0; the same command
# goes on from that step and ends with the uninterrupted plate.
for lang in c f; do
    run() { DCKPT_PERSISTENT="$work/$lang-$1" timeout 120 mpirun --oversubscribe -np "$ranks" "$work/heat-$lang" \
        --steps 200000 --every 1000; }
    want=$(run whole | grep -o 'digest [0-9a-fA-F]*')
    run signalled >"$work/log" 2>&1 &
    job=$!
    # Once a checkpoint is stored, every rank watches the signals (from its first should_exit).
    scripts/wait-for-checkpoint.sh "$work/$lang-signalled" || true
    pkill -USR1 -x mpirun || true
    wait "$job" || { echo "FAILED: heat-$lang exited non-zero after SIGUSR1"; cat "$work/log"; exit 1; }
    stopped=$(grep -o 'stopping after step [0-9]*' "$work/log") ||
        { echo "FAILED: heat-$lang did not stop on SIGUSR1"; cat "$work/log"; exit 1; }
    got=$(run signalled | tee "$work/log" | grep -o 'digest [0-9a-fA-F]*')
    grep -q "restarted from the checkpoint of step ${stopped##* }" "$work/log" ||
        { echo "FAILED: heat-$lang did not go on from step ${stopped##* }"; cat "$work/log"; exit 1; }
    [ "$got" = "$want" ] || { echo "FAILED: heat-$lang signalled and resumed: $got, uninterrupted: $want"; exit 1; }
    echo "heat-$lang: SIGUSR1 to mpirun: $stopped (exit 0), then resumed: same plate"
done
