/* The heat example in C through dckpt's C ABI (src/ffi/dckpt.h): a 2-D
 * Jacobi plate split by rows over the ranks, a halo exchange each step,
 * the plate and the step counter protected, a checkpoint every K steps;
 * at start, the newest checkpoint (if any) is restored. The directory
 * comes from the environment (DCKPT_PERSISTENT, DCKPT_SCRATCH, or a
 * configuration file in DCKPT_CONFIG).
 *
 *   mpicc -O2 examples/c/heat.c -Isrc/ffi -Ltarget/release -ldckpt -o heat-c
 *   DCKPT_PERSISTENT=/tmp/ckpt mpirun -np 2 ./heat-c --steps 200 --every 20 [--crash-at 130]
 *
 * Rank 0 prints a digest of the final plate: a run killed mid-way (--crash-at:
 * the last rank aborts at that step) and started again prints the same
 * digest as a run never interrupted. */
#include "dckpt.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                           \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != DCKPT_OK) {                                                                \
            fprintf(stderr, "heat-c: %s failed (code %d): %s\n", #call, rc_, dckpt_last_error()); \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
        }                                                                                     \
    } while (0)

static long arg(int argc, char **argv, const char *name, long dflt) {
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0) return strtol(argv[i + 1], NULL, 10);
    return dflt;
}

/* FNV-1a, 64 bits. */
static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

int main(int argc, char **argv) {
    /* MPI_THREAD_MULTIPLE lets dckpt run its collective step behind the
       application (with less, it runs in the checkpoint call). */
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const long steps = arg(argc, argv, "--steps", 200), every = arg(argc, argv, "--every", 20);
    const long rows = arg(argc, argv, "--rows", 64), cols = arg(argc, argv, "--cols", 256);
    const long crash_at = arg(argc, argv, "--crash-at", -1);
    const char *config = getenv("DCKPT_CONFIG");

    /* rows + 2 halo rows; the protected region is the interior. */
    double *u = calloc((size_t)(rows + 2) * cols, sizeof *u), *v = calloc((size_t)(rows + 2) * cols, sizeof *v);
    if (!u || !v) MPI_Abort(MPI_COMM_WORLD, 2);
    for (long i = 0; i < rows; i++)
        for (long j = 0; j < cols; j++) {
            long gi = rank * rows + i;
            u[(i + 1) * cols + j] = (gi == 0) ? 1.0 : (double)((gi * 31 + j * 17) % 100) / 100.0;
        }
    int64_t step = 0;

    DckptRuntime *ck = NULL;
    CHECK(dckpt_init(MPI_COMM_WORLD, config, &ck));
    CHECK(dckpt_protect(ck, 0, u + cols, (size_t)rows * cols * sizeof *u, DCKPT_HOST));
    CHECK(dckpt_protect(ck, 1, &step, sizeof step, DCKPT_HOST));
    uint64_t latest = 0;
    /* The newest version every rank restores (older ones where it is damaged); 0: none. */
    CHECK(dckpt_restart_latest(ck, "heat-c", &latest));
    if (latest > 0 && rank == 0) printf("heat-c: restarted from the checkpoint of step %" PRId64 "\n", step);
    /* What could be restarted from (oldest first). */
    size_t nversions = 0;
    CHECK(dckpt_versions(ck, "heat-c", NULL, 0, &nversions));
    if (latest > 0 && nversions == 0) {
        fprintf(stderr, "heat-c: restarted from step %" PRIu64 " but no version is listed\n", latest);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    const int up = rank > 0 ? rank - 1 : MPI_PROC_NULL, down = rank + 1 < size ? rank + 1 : MPI_PROC_NULL;
    while (step < steps) {
        MPI_Sendrecv(u + cols, (int)cols, MPI_DOUBLE, up, 0, u + (rows + 1) * cols, (int)cols, MPI_DOUBLE, down, 0,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Sendrecv(u + rows * cols, (int)cols, MPI_DOUBLE, down, 1, u, (int)cols, MPI_DOUBLE, up, 1, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (long i = 1; i <= rows; i++) {
            long gi = rank * rows + i - 1;
            for (long j = 0; j < cols; j++) {
                double *o = &v[i * cols + j];
                const double *c = &u[i * cols + j];
                if (gi == 0 || gi == size * rows - 1 || j == 0 || j == cols - 1)
                    *o = *c; /* fixed edges */
                else
                    *o = 0.25 * (c[-cols] + c[cols] + c[-1] + c[1]);
            }
        }
        memcpy(u + cols, v + cols, (size_t)rows * cols * sizeof *u); /* the region stays where it is */
        step++;
        if (step % every == 0) CHECK(dckpt_checkpoint(ck, "heat-c", (uint64_t)step));
        if (step == crash_at && rank == size - 1) {
            fprintf(stderr, "heat-c: rank %d dies at step %" PRId64 " (--crash-at)\n", rank, step);
            abort();
        }
        /* The scheduler's signal, or the walltime nearly spent (every rank agrees):
         * a last checkpoint, durable, then exit 0; the same command goes on from it. */
        int stop = 0;
        CHECK(dckpt_should_exit(ck, &stop));
        if (stop && step < steps) {
            if (step % every != 0) CHECK(dckpt_checkpoint(ck, "heat-c", (uint64_t)step));
            CHECK(dckpt_wait(ck, "heat-c", (uint64_t)step));
            if (rank == 0) printf("heat-c: stopping after step %" PRId64 ", its checkpoint durable\n", step);
            CHECK(dckpt_finalize(ck));
            free(u);
            free(v);
            MPI_Finalize();
            return 0;
        }
    }
    CHECK(dckpt_finalize(ck));

    uint64_t mine = fnv(u + cols, (size_t)rows * cols * sizeof *u, 0xcbf29ce484222325ULL), *all = NULL;
    if (rank == 0) all = malloc((size_t)size * sizeof *all);
    MPI_Gather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("heat-c: %d ranks, %ld steps, plate digest %016" PRIx64 "\n", size, steps,
               fnv(all, (size_t)size * sizeof *all, 0xcbf29ce484222325ULL));
        free(all);
    }
    free(u);
    free(v);
    MPI_Finalize();
    return 0;
}
