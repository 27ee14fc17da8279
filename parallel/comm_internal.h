/* comm_internal.h — what comm.c (the front: groups, requests, deadlines) shares
 * with its backends comm_mpi.c and, through comm_nccl.h, comm_nccl.cu. Not for
 * use outside parallel/. */
#ifndef TETRA_PARALLEL_COMM_INTERNAL_H
#define TETRA_PARALLEL_COMM_INTERNAL_H

#include <mpi.h>
#include <stdint.h>

#include "parallel/comm.h"
#include "parallel/comm_nccl.h"

const char *commi_kind_name(comm_kind k);

struct comm_group {
    comm_world *w;
    mesh_group_id id;
    int size, rank;
    MPI_Comm mpi;        /* always built: host-side scalars and the MPI backend */
    void *nccl;          /* tetra_nccl_comm * under the NCCL backend */
    uint64_t seq;        /* operations issued on this group by this rank */
};

struct comm_world {
    mesh m;
    int rank;
    comm_options opt;
    double timeout_s;
    int64_t step;
    void *stream;        /* NCCL stream (cudaStream_t) */
    void *nccl_world;    /* tetra_nccl_comm * of the whole world */
    comm_group groups[MESH_N_GROUPS];
    comm_observer_fn observer; /* profiling: told of every completed operation */
    void *observer_user;
};

/* One operation in flight. */
struct comm_request {
    comm_group *g;
    comm_kind kind;
    size_t count;
    comm_dtype dtype;
    int peer2;           /* SENDRECV: the rank received from */
    double t_start;      /* seconds, monotonic */
    int64_t step;
    uint64_t seq;
    /* MPI: one request per chunk (counts above INT_MAX are split) */
    int nreq;
    MPI_Request *reqs;
    MPI_Request inline_reqs[2];
    /* AVG: divide after the sum arrives */
    void *avg_buf;
    size_t avg_count;
    /* NCCL: the CUDA event recorded after the operation */
    void *event;
    int host;            /* runs over MPI on host buffers whatever the backend (scalars) */
    int heap;            /* allocated for an asynchronous caller; freed by comm_wait */
    int done;
};

double commi_now(void);
/* Print the one-line failure and end the job. */
void commi_fail(const comm_request *r, const char *what) __attribute__((noreturn));
void commi_fail_group(const comm_group *g, const char *op, const char *what) __attribute__((noreturn));

/* ---- MPI backend (comm_mpi.c) ---- */
int commi_mpi_group_init(comm_world *w, comm_group *g, char *err, size_t errlen);
void commi_mpi_group_free(comm_group *g);
/* Issue r->kind with the given buffers; fills r->reqs. */
void commi_mpi_start(comm_request *r, void *recv, const void *send, comm_redop op, int peer);
/* 1 when every chunk has finished. */
int commi_mpi_test(comm_request *r);
MPI_Datatype commi_mpi_type(comm_dtype t);

#endif
