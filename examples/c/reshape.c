/* Reads the checkpoint the C heat example wrote with any number of ranks,
 * from a job of another size (issue #45: C at parity with Rust's
 * old_regions / committed_versions / read_region): lists the old job's
 * regions, takes its newest committed version and prints the same plate
 * digest heat-c printed, computed from the old ranks' plates (region 0).
 *   DCKPT_PERSISTENT=/tmp/ckpt mpirun -np 3 ./reshape      (after heat-c on 2 ranks)
 */
#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include "dckpt.h"

#define CHECK(call)                                                                           \
    do {                                                                                      \
        int rc_ = (call);                                                                     \
        if (rc_ != DCKPT_OK) {                                                                \
            fprintf(stderr, "reshape: %s: error %d: %s\n", #call, rc_, dckpt_last_error());   \
            MPI_Abort(MPI_COMM_WORLD, 1);                                                     \
        }                                                                                     \
    } while (0)

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    DckptRuntime *ck;
    CHECK(dckpt_init(MPI_COMM_WORLD, NULL, &ck));
    size_t count = 0, nversions = 0;
    CHECK(dckpt_old_regions(ck, "heat-c", NULL, 0, &count));  /* collective: the count first */
    DckptOldRegion *regions = malloc((count ? count : 1) * sizeof *regions);
    CHECK(dckpt_old_regions(ck, "heat-c", regions, count, &count));
    CHECK(dckpt_committed_versions(ck, "heat-c", NULL, 0, &nversions));
    uint64_t *versions = malloc((nversions ? nversions : 1) * sizeof *versions);
    CHECK(dckpt_committed_versions(ck, "heat-c", versions, nversions, &nversions));
    if (nversions == 0) {
        if (rank == 0) fprintf(stderr, "reshape: no committed version of heat-c\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    uint64_t version = versions[nversions - 1];
    /* Every old rank's plate (region 0), read here by rank 0 alone. */
    uint32_t old_ranks = 0;
    for (size_t i = 0; i < count; i++)
        if (regions[i].rank + 1 > old_ranks) old_ranks = regions[i].rank + 1;
    if (rank == 0) {
        uint64_t *digests = calloc(old_ranks, sizeof *digests);
        for (size_t i = 0; i < count; i++) {
            if (regions[i].id != 0) continue;
            void *plate = malloc(regions[i].len);
            CHECK(dckpt_read_region(ck, "heat-c", regions[i].rank, 0, version, 0, plate, regions[i].len));
            digests[regions[i].rank] = fnv(plate, regions[i].len, 0xcbf29ce484222325ULL);
            free(plate);
        }
        printf("reshape: %d ranks read %" PRIu32 " old ranks' regions (%zu) at version %" PRIu64
               ", plate digest %016" PRIx64 "\n",
               size, old_ranks, count, version, fnv(digests, old_ranks * sizeof *digests, 0xcbf29ce484222325ULL));
        free(digests);
    }
    free(regions);
    free(versions);
    CHECK(dckpt_finalize(ck));
    MPI_Finalize();
    return 0;
}
