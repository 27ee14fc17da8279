#include "util/host.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int running(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    if (!init) return 0;
    MPI_Finalized(&fin);
    return !fin;
}

int host_start(int *argc, char ***argv) {
    int init = 0;
    MPI_Initialized(&init);
    if (init) return 0;
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    return 1;
}

void host_end(void) {
    if (running()) MPI_Finalize();
}

void host_end_at_exit(void) { atexit(host_end); }

int host_rank(void) {
    int r = 0;
    if (running()) MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int host_world(void) {
    int w = 1;
    if (running()) MPI_Comm_size(MPI_COMM_WORLD, &w);
    return w;
}

/* rank 0 of the ranks that share this node's memory */
static int node_query(int want_size) {
    if (!running()) return want_size ? 1 : 0;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int v = 0;
    if (want_size) MPI_Comm_size(node, &v);
    else MPI_Comm_rank(node, &v);
    MPI_Comm_free(&node);
    return v;
}

int host_node_ranks(void) { return node_query(1); }
int host_node_rank(void) { return node_query(0); }

static int reduce_int(int v, MPI_Op op) {
    if (host_world() == 1) return v;
    int out = v;
    MPI_Allreduce(&v, &out, 1, MPI_INT, op, MPI_COMM_WORLD);
    return out;
}

int host_max_int(int v) { return reduce_int(v, MPI_MAX); }
int host_min_int(int v) { return reduce_int(v, MPI_MIN); }

void host_sum_u64(uint64_t *v, size_t n) {
    if (host_world() == 1) return;
    for (size_t at = 0; at < n;) { /* MPI counts are ints */
        int k = n - at > (size_t)1 << 24 ? 1 << 24 : (int)(n - at);
        MPI_Allreduce(MPI_IN_PLACE, v + at, k, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
        at += (size_t)k;
    }
}

void host_bcast(void *buf, size_t bytes, int root) {
    if (host_world() == 1) return;
    for (size_t at = 0; at < bytes;) {
        int k = bytes - at > (size_t)1 << 30 ? 1 << 30 : (int)(bytes - at);
        MPI_Bcast((char *)buf + at, k, MPI_BYTE, root, MPI_COMM_WORLD);
        at += (size_t)k;
    }
}

int host_gather_text(const char *mine, int len, char **all, int *lens) {
    const int world = host_world(), rank = host_rank();
    *all = NULL;
    if (world == 1) {
        lens[0] = len;
        *all = malloc((size_t)len + 1);
        if (!*all) return -1;
        memcpy(*all, mine, (size_t)len);
        (*all)[len] = 0;
        return 0;
    }
    int *displs = NULL;
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    long tot = 0;
    if (rank == 0) {
        displs = calloc((size_t)world, sizeof *displs);
        for (int r = 0; r < world && displs; r++) {
            displs[r] = (int)tot;
            tot += lens[r];
        }
        *all = displs ? malloc((size_t)tot + 1) : NULL;
        /* the other ranks are already sending: a rank 0 that cannot receive ends the job */
        if (!*all) {
            fprintf(stderr, "tetra: out of memory gathering %ld bytes of text from %d ranks\n", tot, world);
            host_abort(1);
        }
    }
    MPI_Gatherv(mine, len, MPI_CHAR, *all, lens, displs, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) (*all)[tot] = 0;
    free(displs);
    return 0;
}

void host_abort(int code) {
    if (running()) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

void host_mpi_version(char *buf, size_t n) {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    char *comma = strchr(v, ',');
    if (comma) *comma = 0;
    snprintf(buf, n, "%s", v);
}
