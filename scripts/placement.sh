# Sourced by the benchmark scripts: how to start NP ranks so that each has
# its own CPUs. dckpt's threads (de-duplication, the collective step, the
# flush workers) run beside the application's; OpenMPI's default binds each
# of one or two ranks to a single core, where they time-slice against the
# application (BENCHMARKS.md, "Placement"). Oversubscribed ranks (more than
# the cores) must yield the CPU while they wait, or they starve each other;
# otherwise each rank gets its share of the cores (PE = cores / NP).
#   $(mpirun_for NP) PROGRAM ARGS...       MPIRUN_FLAGS replaces the placement flags
mpirun_for() {
    local np=$1 cores
    cores=$(nproc)
    if [ -n "${MPIRUN_FLAGS:-}" ]; then
        # shellcheck disable=SC2086 # the flags are words
        echo mpirun $MPIRUN_FLAGS -np "$np"
    elif [ "$np" -gt "$cores" ]; then
        echo mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np "$np"
    else
        echo mpirun --map-by "slot:PE=$((cores / np))" -np "$np"
    fi
}
