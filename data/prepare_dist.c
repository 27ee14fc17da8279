/* prepare_dist.c — MPI for `tetra data prepare` (see prepare_dist.h). */
#include "data/prepare_dist.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

static int launched_by_mpi(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

void pd_init(pd_world *w, int *argc, char ***argv) {
    memset(w, 0, sizeof *w);
    w->size = 1;
    if (!launched_by_mpi()) return;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        MPI_Init(argc, argv);
        w->mpi = 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
}

void pd_finalize(pd_world *w) {
    if (w->mpi) MPI_Finalize();
    w->mpi = 0;
}

int pd_any(const pd_world *w, int bad) {
    if (w->size == 1) return bad != 0;
    int in = bad != 0, out = 0;
    MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

void pd_sum_u64(const pd_world *w, uint64_t *v, size_t n) {
    if (w->size == 1 || n == 0) return;
    for (size_t at = 0; at < n;) { /* counts are ints */
        int k = n - at > (size_t)1 << 24 ? 1 << 24 : (int)(n - at);
        MPI_Allreduce(MPI_IN_PLACE, v + at, k, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        at += (size_t)k;
    }
}

void pd_bcast_str(const pd_world *w, char *buf, size_t n) {
    if (w->size == 1) return;
    int len = w->rank == 0 ? (int)strnlen(buf, n - 1) : 0;
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(buf, len, MPI_CHAR, 0, MPI_COMM_WORLD);
    buf[len] = 0;
}
