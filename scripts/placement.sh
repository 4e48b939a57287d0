# Sourced by the benchmark scripts: how to start NP ranks so that each has
# its own CPUs. dckpt's threads (de-duplication, the collective step, the
# flush workers) run beside the application's; OpenMPI's default binds each
# of one or two ranks to a single core, where they time-slice against the
# application (BENCHMARKS.md, "Placement"). Oversubscribed ranks (more than
# the CPUs) must yield the CPU while they wait, or they starve each other;
# otherwise each rank gets its share of the CPUs (PE = CPUs / NP, counted in
# hardware threads, as `nproc` counts them).
#   $(mpirun_for NP) PROGRAM ARGS...
# MPIRUN_FLAGS replaces the placement flags (all of them: add --oversubscribe
# yourself beyond the CPUs); its words are split on blanks, not quoted.
mpirun_for() {
    local np=$1 cpus
    # nproc honours OMP_NUM_THREADS: count the CPUs this process may use.
    cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
    if [ -n "${MPIRUN_FLAGS:-}" ]; then
        # shellcheck disable=SC2086 # the flags are words
        echo mpirun $MPIRUN_FLAGS -np "$np"
    elif [ "$np" -gt "$cpus" ]; then
        echo mpirun --oversubscribe --mca mpi_yield_when_idle 1 -np "$np"
    else
        echo mpirun --use-hwthread-cpus --map-by "slot:PE=$((cpus / np))" -np "$np"
    fi
}
