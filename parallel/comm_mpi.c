/* comm_mpi.c — the MPI backend of comm.h: host buffers, MPI_Comm_split groups,
 * nonblocking collectives (MPI-3) tested by comm.c's deadline loop. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm_internal.h"

MPI_Datatype commi_mpi_type(comm_dtype t) {
    switch (t) {
    case COMM_F32: return MPI_FLOAT;
    case COMM_F64: return MPI_DOUBLE;
    case COMM_I32: return MPI_INT32_T;
    case COMM_I64: return MPI_INT64_T;
    case COMM_BF16: return MPI_UINT16_T; /* moved, never reduced */
    case COMM_U8: return MPI_UINT8_T;
    }
    return MPI_BYTE;
}

static MPI_Op mpi_op(comm_redop op) {
    switch (op) {
    case COMM_SUM:
    case COMM_AVG: return MPI_SUM; /* AVG divides afterwards */
    case COMM_MAX: return MPI_MAX;
    case COMM_MIN: return MPI_MIN;
    }
    return MPI_SUM;
}

int commi_mpi_group_init(comm_world *w, comm_group *g, char *err, size_t errlen) {
    const unsigned dims = mesh_group_dims(g->id);
    int color = mesh_group_color(&w->m, dims, w->rank), key = mesh_group_rank(&w->m, dims, w->rank);
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &g->mpi);
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        snprintf(err, errlen, "comm: MPI_Comm_split for group %s failed on rank %d: %s", mesh_group_name(g->id),
                 w->rank, msg);
        return -1;
    }
    /* errors come back to comm.c, which names the group, the operation and the rank */
    MPI_Comm_set_errhandler(g->mpi, MPI_ERRORS_RETURN);
    int size = 0, rank = 0;
    MPI_Comm_size(g->mpi, &size);
    MPI_Comm_rank(g->mpi, &rank);
    if (size != g->size || rank != g->rank) {
        snprintf(err, errlen, "comm: group %s on rank %d has %d ranks (index %d); the mesh says %d (index %d)",
                 mesh_group_name(g->id), w->rank, size, rank, g->size, g->rank);
        return -1;
    }
    return 0;
}

void commi_mpi_group_free(comm_group *g) {
    if (g->mpi != MPI_COMM_NULL) MPI_Comm_free(&g->mpi);
    g->mpi = MPI_COMM_NULL;
}

static MPI_Request *reserve(comm_request *r, int n) {
    if (n <= (int)(sizeof r->inline_reqs / sizeof r->inline_reqs[0])) {
        r->reqs = r->inline_reqs;
    } else {
        r->reqs = malloc((size_t)n * sizeof *r->reqs);
        if (!r->reqs) commi_fail(r, "out of host memory");
    }
    for (int i = 0; i < n; i++) r->reqs[i] = MPI_REQUEST_NULL;
    r->nreq = n;
    return r->reqs;
}

static int check_int_count(comm_request *r, size_t count) {
    if (count > (size_t)INT_MAX) {
        char what[160];
        snprintf(what, sizeof what, "a per-rank count of %zu elements exceeds MPI's int limit", count);
        commi_fail(r, what);
    }
    return (int)count;
}

#define MPI_CHECK(r, call)                                                                                             \
    do {                                                                                                               \
        int rc_ = (call);                                                                                              \
        if (rc_ != MPI_SUCCESS) {                                                                                      \
            char msg_[MPI_MAX_ERROR_STRING];                                                                           \
            int len_ = 0;                                                                                              \
            MPI_Error_string(rc_, msg_, &len_);                                                                        \
            commi_fail((r), msg_);                                                                                     \
        }                                                                                                              \
    } while (0)

void commi_mpi_start(comm_request *r, void *recv, const void *send, comm_redop op, int peer) {
    comm_group *g = r->g;
    MPI_Comm c = g->mpi;
    MPI_Datatype t = commi_mpi_type(r->dtype);
    const size_t es = comm_dtype_size(r->dtype);
    const size_t chunk = (size_t)1 << 30; /* elements per MPI call where the count may be split */
    switch (r->kind) {
    case COMMK_ALL_REDUCE: {
        int n = (int)((r->count + chunk - 1) / chunk);
        if (n < 1) n = 1;
        MPI_Request *q = reserve(r, n);
        for (int i = 0; i < n; i++) {
            size_t off = (size_t)i * chunk, cnt = r->count - off < chunk ? r->count - off : chunk;
            MPI_CHECK(r, MPI_Iallreduce(MPI_IN_PLACE, (char *)recv + off * es, (int)cnt, t, mpi_op(op), c, &q[i]));
        }
        break;
    }
    case COMMK_BROADCAST: {
        int n = (int)((r->count + chunk - 1) / chunk);
        if (n < 1) n = 1;
        MPI_Request *q = reserve(r, n);
        for (int i = 0; i < n; i++) {
            size_t off = (size_t)i * chunk, cnt = r->count - off < chunk ? r->count - off : chunk;
            MPI_CHECK(r, MPI_Ibcast((char *)recv + off * es, (int)cnt, t, peer, c, &q[i]));
        }
        break;
    }
    case COMMK_REDUCE_SCATTER: {
        int cnt = check_int_count(r, r->count);
        MPI_Request *q = reserve(r, 1);
        MPI_CHECK(r, MPI_Ireduce_scatter_block(send, recv, cnt, t, mpi_op(op), c, &q[0]));
        break;
    }
    case COMMK_ALL_GATHER: {
        int cnt = check_int_count(r, r->count);
        MPI_Request *q = reserve(r, 1);
        const void *sb = send == (const char *)recv + (size_t)g->rank * r->count * es ? MPI_IN_PLACE : send;
        MPI_CHECK(r, MPI_Iallgather(sb, cnt, t, recv, cnt, t, c, &q[0]));
        break;
    }
    case COMMK_ALL_TO_ALL: {
        int cnt = check_int_count(r, r->count);
        MPI_Request *q = reserve(r, 1);
        MPI_CHECK(r, MPI_Ialltoall(send, cnt, t, recv, cnt, t, c, &q[0]));
        break;
    }
    case COMMK_SEND: {
        int cnt = check_int_count(r, r->count);
        MPI_Request *q = reserve(r, 1);
        MPI_CHECK(r, MPI_Isend(send, cnt, t, peer, 0, c, &q[0]));
        break;
    }
    case COMMK_RECV: {
        int cnt = check_int_count(r, r->count);
        MPI_Request *q = reserve(r, 1);
        MPI_CHECK(r, MPI_Irecv(recv, cnt, t, peer, 0, c, &q[0]));
        break;
    }
    case COMMK_BARRIER: {
        MPI_Request *q = reserve(r, 1);
        MPI_CHECK(r, MPI_Ibarrier(c, &q[0]));
        break;
    }
    case COMMK_SENDRECV: {
        int cnt = check_int_count(r, r->count);
        MPI_Request *q = reserve(r, 2);
        MPI_CHECK(r, MPI_Irecv(recv, cnt, t, r->peer2, 0, c, &q[0]));
        MPI_CHECK(r, MPI_Isend(send, cnt, t, peer, 0, c, &q[1]));
        break;
    }
    }
}

int commi_mpi_test(comm_request *r) {
    int flag = 0;
    MPI_CHECK(r, MPI_Testall(r->nreq, r->reqs, &flag, MPI_STATUSES_IGNORE));
    if (flag && r->reqs != r->inline_reqs) {
        free(r->reqs);
        r->reqs = r->inline_reqs;
        r->nreq = 0;
    }
    return flag;
}
