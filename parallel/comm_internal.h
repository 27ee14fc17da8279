/* comm_internal.h — what comm.c (the front: groups, requests, deadlines) shares
 * with its backends comm_mpi.c and, through comm_nccl.h, comm_nccl.cu. Not for
 * use outside parallel/. */
#ifndef TETRA_PARALLEL_COMM_INTERNAL_H
#define TETRA_PARALLEL_COMM_INTERNAL_H

#include <mpi.h>
#include <pthread.h>
#include <stdint.h>

#include "parallel/comm.h"
#include "parallel/comm_nccl.h"

const char *commi_kind_name(comm_kind k);

struct comm_group {
    comm_world *w;
    mesh_group_id id;
    int size, rank;
    MPI_Comm mpi;   /* always built: host-side scalars and the MPI backend */
    void *nccl;     /* tetra_nccl_comm * under the NCCL backend (shared by groups of the same ranks) */
    int nccl_owner; /* 1 when this group created it (and destroys it) */
    uint64_t seq;   /* operations issued on this group by this rank */
};

struct comm_world {
    mesh m;
    int rank;
    comm_options opt;
    double timeout_s;
    int64_t step;
    void *nccl_world;  /* tetra_nccl_comm * of the whole world */
    size_t nccl_bytes; /* device memory the communicators took at creation */
    comm_group groups[MESH_N_GROUPS];
    comm_observer_fn observer; /* profiling: told of every completed operation */
    void *observer_user;
    /* flight recorder (comm_trace.c): a ring of opt.trace_buf_size entries */
    struct commi_trace_entry *trace;
    uint64_t trace_total;           /* operations recorded since the start */
    double trace_wall_offset;       /* wall clock minus commi_now(), for the dump's timestamps */
    double run_id;                  /* rank 0's start time, shared: tells this run's dumps from older ones */
    char *trace_dir, *trace_prefix; /* owned copies; opt.trace_dir / trace_prefix point here */
    /* MPI on device buffers (comm_stage.c): page-locked blocks, reused */
    struct commi_stage_block *stage_pool;
    int n_stage, cap_stage;
    /* NCCL operations comm_wait ordered the compute stream after but the host has not
     * seen complete (comm_watch.c): finished by the next call on this thread, watched
     * for their deadline by a second thread */
    pthread_mutex_t watch_mutex;
    pthread_cond_t watch_cond;
    struct comm_request *pending;
    int n_pending, cap_pending;
    pthread_t watchdog;
    int watchdog_running, watchdog_stop;
};

/* One operation in flight. */
struct comm_request {
    comm_group *g;
    comm_kind kind;
    size_t count;
    comm_dtype dtype;
    int peer2;      /* SENDRECV: the rank received from */
    double t_start; /* seconds, monotonic */
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
    /* MPI on device buffers: the staging block, and where the result goes back */
    int stage_block; /* 1 + its index in the world's staging pool; 0: none */
    void *host_recv, *dev_recv;
    size_t recv_bytes;
    double deadline_s; /* NCCL, deferred by comm_wait: the timeout it ends at */
    int host;          /* runs over MPI on host buffers whatever the backend (scalars) */
    int heap;          /* allocated for an asynchronous caller; freed by comm_wait */
    int done;
    uint64_t trace_id; /* 1 + its index in the flight recorder; 0 when not recorded */
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

/* ---- MPI on device buffers (comm_stage.c) ---- */
/* 1 when r's buffers are device memory that MPI reaches through the host. */
int commi_staged(const comm_request *r);
/* Copy r's input to a page-locked block and point *recv / *send at the block's halves. */
void commi_stage_in(comm_request *r, void **recv, const void **send, int peer);
/* After completion: the result back to device memory, the block back to the pool. */
void commi_stage_out(comm_request *r);
void commi_stage_free(comm_world *w);

/* ---- NCCL operations ordered but not yet seen complete (comm_watch.c) ---- */
/* Take over r (comm_wait found it running): it completes in a later sweep. */
void commi_watch_defer(const comm_request *r);
/* Finish the deferred operations that have completed (this thread; cheap). */
void commi_watch_sweep(comm_world *w);
/* Wait on the host until none is left (deadlines apply). */
void commi_watch_drain(comm_world *w);
void commi_watch_stop(comm_world *w);
/* comm.c's completion of a request (trace, observer, event back to the pool). */
void commi_finish(comm_request *r);
/* comm.c's poll of a request's backend: 1 done, 0 running (fails the job on errors). */
int commi_backend_test(comm_request *r);
void commi_fail_timeout(const comm_request *r, double waited) __attribute__((noreturn));

/* ---- MPI backend (comm_mpi.c) ---- */
int commi_mpi_group_init(comm_world *w, comm_group *g, char *err, size_t errlen);
void commi_mpi_group_free(comm_group *g);
/* Issue r->kind with the given buffers; fills r->reqs. */
void commi_mpi_start(comm_request *r, void *recv, const void *send, comm_redop op, int peer);
/* 1 when every chunk has finished. */
int commi_mpi_test(comm_request *r);
MPI_Datatype commi_mpi_type(comm_dtype t);

#endif
