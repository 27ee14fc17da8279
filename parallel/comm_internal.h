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
    /* flight recorder (comm_trace.c): a ring of opt.trace_buf_size entries */
    struct commi_trace_entry *trace;
    uint64_t trace_total;      /* operations recorded since the start */
    double trace_wall_offset;  /* wall clock minus commi_now(), for the dump's timestamps */
    double run_id;             /* rank 0's start time, shared: tells this run's dumps from older ones */
    char *trace_dir, *trace_prefix; /* owned copies; opt.trace_dir / trace_prefix point here */
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
    uint64_t trace_id;   /* 1 + its index in the flight recorder; 0 when not recorded */
};

double commi_now(void);

/* The flight recorder (comm_trace.c). */
int commi_trace_init(comm_world *w, char *err, size_t errlen);
void commi_trace_free(comm_world *w);
void commi_trace_issue(comm_request *r);
void commi_trace_peer(const comm_request *r, int peer);
void commi_trace_done(const comm_request *r);
/* Write <trace_dir>/<prefix><rank>.json (temporary name, then rename); its path into path.
 * Returns 0, or -1 when the recorder is off or the file cannot be written. */
int commi_trace_dump(comm_world *w, const char *reason, const comm_request *waiting, char *path, size_t pathlen);
/* A pending SIGUSR2: dump and go on. */
void commi_trace_poll(comm_world *w);
/* After a timeout: the ranks of r's group that did not issue it, from their dumps. */
void commi_trace_blame(const comm_request *r, char *buf, size_t n);
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
