/* comm.h — collective communication over the mesh's process groups.
 *
 * One interface, two backends:
 *   - MPI (Open MPI; host buffers): every group is an MPI_Comm_split of
 *     MPI_COMM_WORLD; asynchronous operations are MPI nonblocking collectives.
 *     With comm_options.staging, the buffers are device memory (several ranks
 *     sharing one GPU, where NCCL refuses to run): each operation copies its
 *     input to page-locked host memory, runs over MPI there, and copies the result
 *     back when it completes. A test and fallback path: slow, but every layout can
 *     then run on one device.
 *   - NCCL (device buffers): a world communicator initialised from a unique id
 *     that rank 0 broadcasts over MPI, one ncclCommSplit per group, each group
 *     with its own high-priority CUDA stream (FSDP's collectives never queue behind
 *     TP's, nor pipeline messages behind either). An operation starts after the
 *     work queued so far on the compute stream (comm_options.compute_stream);
 *     comm_wait makes the compute stream wait for it (cudaStreamWaitEvent) and
 *     returns without waiting on the host. A watchdog thread polls the operations
 *     still running against the deadline below, which is where a stuck collective
 *     is caught. Built only with CUDA and NCCL (comm_backend_available).
 *
 * Every operation takes `req`: NULL runs it to completion before returning;
 * otherwise *req receives a handle and the operation runs while the caller
 * computes, until comm_wait. Reductions are in the buffer's own type; AVG is
 * SUM divided by the group size (floating types only).
 *
 * Nothing hangs silently: every wait has a deadline, comm.init_timeout_seconds
 * until the trainer calls comm_set_phase_training (after the first step), then
 * comm.train_timeout_seconds. A collective that does not finish in time ends
 * the job (MPI_Abort, exit code 1) after one line on stderr naming the
 * operation, the group, the rank and the step, e.g.
 *   comm: all_gather on group dp_shard_cp (4 ranks) timed out after 100 s on
 *   rank 2 (collective #31 on this group, issued during step 7); ...; flight recorder:
 *   rank 3 left no dump (stopped, dead, or busy outside any collective)
 * Backend errors end the job the same way.
 *
 * Groups of one rank run locally (copies), like TorchTitan's fake backend for
 * degree-1 mesh dimensions. The calling thread must be the one that
 * initialised MPI (MPI_THREAD_FUNNELED is enough).
 */
#ifndef TETRA_PARALLEL_COMM_H
#define TETRA_PARALLEL_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "parallel/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { COMM_F32 = 0, COMM_F64, COMM_I32, COMM_I64, COMM_BF16, COMM_U8 } comm_dtype;
typedef enum { COMM_SUM = 0, COMM_MAX, COMM_MIN, COMM_AVG } comm_redop;
typedef enum { COMM_BACKEND_MPI = 0, COMM_BACKEND_NCCL } comm_backend;

typedef struct comm_world comm_world;
typedef struct comm_group comm_group;
typedef struct comm_request comm_request;

/* How the MPI backend reaches device memory (comm_options.staging): the ops backend's
 * copies, given by the caller so this module needs no CUDA. */
typedef struct {
    void *(*host_alloc)(size_t bytes); /* page-locked host memory; NULL on failure */
    void (*host_release)(void *p);
    /* device to host, after the work queued that writes src; returns when dst holds it */
    void (*to_host)(void *dst, const void *src, size_t bytes);
    /* host to device, ordered before later work; returns when src may be reused */
    void (*to_device)(void *dst, const void *src, size_t bytes);
    /* device to device, ordered with the work around it (groups of one rank) */
    void (*device_copy)(void *dst, const void *src, size_t bytes);
} comm_device_staging;

typedef struct {
    comm_backend backend;
    /* MPI on device buffers (see the top of the file); NULL: host buffers. The table
     * must outlive the world. Ignored by NCCL. */
    const comm_device_staging *staging;
    /* NCCL: the stream the ops run on (a cudaStream_t; NULL = the legacy default stream).
     * Collectives start after the work queued on it; comm_wait makes it wait for them. */
    void *compute_stream;
    double init_timeout_s;  /* deadline of any wait until comm_set_phase_training */
    double train_timeout_s; /* afterwards */
    int cuda_device;        /* NCCL: device of this rank; -1 = node-local rank mod device count */
    /* A planned world (`tetra plan`): one process stands for rank `rank` of the mesh.
     * Groups know their sizes and ranks; nothing touches MPI (which need not be
     * initialised), and a collective on a group of more than one rank ends the
     * process naming it — planning code must not communicate. */
    int virtual_world;
    /* Flight recorder (TorchTitan's comm.trace_buf_size): the last trace_buf_size
     * operations (group, op, bytes, peer, the group's sequence number, step, issue and
     * completion times) in a ring, written as JSON to <trace_dir>/<trace_prefix><rank>.json
     * when a wait times out (the message then names the group's ranks that never issued
     * the operation or dumped seconds late, read from their dumps), when an operation fails, and on SIGUSR2
     * (the run goes on). 0 = off. */
    int trace_buf_size;
    const char *trace_dir;
    const char *trace_prefix;
} comm_options;

size_t comm_dtype_size(comm_dtype t);
const char *comm_dtype_name(comm_dtype t);
const char *comm_backend_name(comm_backend b);
/* 1 when this build has the backend (MPI always; NCCL with CUDA + NCCL). */
int comm_backend_available(comm_backend b);
/* GPUs the NCCL backend sees on this host (0 without it, or without a driver). */
int comm_nccl_device_count(void);

/* End every rank of the job with exit status `code`, from a rank that has already said why
 * (not collective; MPI initialised). Under Open MPI it leaves out the MPI_ABORT banner that
 * MPI_Abort prints first, so the failure's own message stays the last thing a user reads;
 * any other MPI aborts with MPI_Abort. Never returns. */
void comm_abort_explained(int code) __attribute__((noreturn));

/* Collective over MPI_COMM_WORLD (MPI must be initialised): builds a
 * communicator for every mesh_group_id. `rank` is this process' world rank.
 * Returns NULL with a message in err on failure (every rank fails alike for
 * layout errors; backend errors name the rank). */
comm_world *comm_world_create(const mesh *m, int rank, const comm_options *opt, char *err, size_t errlen);
void comm_world_free(comm_world *w);

comm_group *comm_get(comm_world *w, mesh_group_id id);
int comm_group_size(const comm_group *g);
int comm_group_rank(const comm_group *g);
const char *comm_group_name(const comm_group *g);
comm_world *comm_group_world(const comm_group *g);
comm_backend comm_world_backend(const comm_world *w);
int comm_world_rank(const comm_world *w);
const mesh *comm_world_mesh(const comm_world *w);

/* The step the trainer is in (0 = start-up): quoted in timeout messages. */
void comm_set_step(comm_world *w, int64_t step);
/* Switch the deadline from init_timeout_s to train_timeout_s. */
void comm_set_phase_training(comm_world *w);
/* Override the current deadline (seconds > 0). */
void comm_set_timeout(comm_world *w, double seconds);
double comm_timeout(const comm_world *w);

/* NCCL: device memory the communicators took, measured as the drop in free device
 * memory across their creation (NCCL may connect more buffers at a group's first
 * collective, which this does not see); 0 under MPI. */
size_t comm_world_device_bytes(const comm_world *w);
/* Wait on the host (with the deadline) until every operation comm_wait left to the
 * compute stream has finished (NCCL); a no-op under MPI. */
void comm_world_sync(comm_world *w);

/* Profiling: fn hears of every operation of w when it completes (on the rank that waited
 * for it): its kind ("all_reduce", ...), the group ("tp", ...), the bytes of this rank's
 * buffer (count x element size), and when it started and was seen complete (seconds,
 * CLOCK_MONOTONIC). NULL stops it. */
typedef void (*comm_observer_fn)(void *user, const char *op, const char *group, size_t bytes, double t_start,
                                 double t_end);
void comm_set_observer(comm_world *w, comm_observer_fn fn, void *user);

/* ---- operations (see the top of the file for `req`) ---- */

/* buf[count] reduced in place over the group. */
void comm_all_reduce(comm_group *g, void *buf, size_t count, comm_dtype t, comm_redop op, comm_request **req);
/* send[size * count] reduced over the group; rank i receives block i into recv[count]. */
void comm_reduce_scatter(comm_group *g, void *recv, const void *send, size_t count, comm_dtype t, comm_redop op,
                         comm_request **req);
/* Every rank's send[count] into recv[size * count], rank-major. send may be
 * recv + rank * count (in place). */
void comm_all_gather(comm_group *g, void *recv, const void *send, size_t count, comm_dtype t, comm_request **req);
/* buf[count] from group rank root to all. */
void comm_broadcast(comm_group *g, void *buf, size_t count, comm_dtype t, int root, comm_request **req);
/* Block i of send[size * count] goes to rank i; block j of recv[size * count] comes from rank j. */
void comm_all_to_all(comm_group *g, void *recv, const void *send, size_t count, comm_dtype t, comm_request **req);
/* Point to point inside the group (peer is a group rank, not itself). */
void comm_send(comm_group *g, const void *buf, size_t count, comm_dtype t, int peer, comm_request **req);
void comm_recv(comm_group *g, void *buf, size_t count, comm_dtype t, int peer, comm_request **req);
/* Send send[count] to group rank `to` and receive recv[count] from `from` as one
 * operation (NCCL: grouped), so ranks exchanging in a permutation (a ring step) never
 * wait on each other's order. A group of one copies. */
void comm_sendrecv(comm_group *g, void *recv, int from, const void *send, int to, size_t count, comm_dtype t,
                   comm_request **req);
/* Every rank of the group has reached it (on the host: over MPI under either backend). */
void comm_barrier(comm_group *g, comm_request **req);

/* Point-to-point messages issued as one group (NCCL: between ncclGroupStart and
 * ncclGroupEnd, as torch.distributed.batch_isend_irecv), so two ranks whose lists post
 * sends and receives in different orders never wait on each other's order, and no
 * send blocks a stream ahead of the receive its peer needs first. reqs[i] is op i's
 * handle (as `req` above); reqs NULL runs the whole batch to completion. */
typedef struct {
    int recv; /* 0: send buf[count] to peer; 1: receive it from peer */
    void *buf;
    size_t count;
    comm_dtype dtype;
    int peer; /* a group rank other than this one */
} comm_p2p_op;
void comm_batch_p2p(comm_group *g, const comm_p2p_op *ops, int n, comm_request **reqs);

/* Finish the operation (deadline as above) and free the handle. NULL is a no-op.
 * MPI: returns when the result is in place (device buffers: copied back). NCCL: returns
 * once the compute stream is ordered after the operation; the host has not waited for
 * it (work queued afterwards on the compute stream sees the result; a host read goes
 * through that stream, or comm_world_sync first). */
void comm_wait(comm_request *r);
/* Drive progress without blocking: 1 when the operation has finished (the
 * handle stays valid until comm_wait). */
int comm_test(comm_request *r);

/* Scalar helpers (host values; blocking), for counts and metrics. */
double comm_all_reduce_f64(comm_group *g, double x, comm_redop op);
int64_t comm_all_reduce_i64(comm_group *g, int64_t x, comm_redop op);

#ifdef __cplusplus
}
#endif

#endif
