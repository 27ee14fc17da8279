/* prepare_dist.c — MPI for `tetra data prepare` (see prepare_dist.h). */
#include "data/prepare_dist.h"

#include <stdlib.h>
#include <string.h>

#include "util/host.h"

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
    w->mpi = host_start(argc, argv);
    w->rank = host_rank();
    w->size = host_world();
}

void pd_finalize(pd_world *w) {
    if (w->mpi) host_end();
    w->mpi = 0;
}

int pd_any(const pd_world *w, int bad) {
    if (w->size == 1) return bad != 0;
    return host_max_int(bad != 0);
}

void pd_sum_u64(const pd_world *w, uint64_t *v, size_t n) {
    if (w->size > 1) host_sum_u64(v, n);
}

void pd_bcast_str(const pd_world *w, char *buf, size_t n) {
    if (w->size == 1) return;
    int len = w->rank == 0 ? (int)strnlen(buf, n - 1) : 0;
    host_bcast(&len, sizeof len, 0);
    host_bcast(buf, (size_t)len, 0);
    buf[len] = 0;
}
