/* comm_nccl.h — the C interface of the NCCL backend (comm_nccl.cu), used by
 * comm.c. It carries no MPI and no CUDA types, so nvcc needs neither MPI
 * headers nor the C side CUDA headers. Every function returns 0 / a handle on
 * success and -1 / NULL with a message in err otherwise. In a build without
 * CUDA + NCCL, tetra_nccl_built() is 0 and nothing else may be called. */
#ifndef TETRA_PARALLEL_COMM_NCCL_H
#define TETRA_PARALLEL_COMM_NCCL_H

#include <stddef.h>

#include "parallel/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The operations (shared by both backends). */
typedef enum {
    COMMK_ALL_REDUCE = 0,
    COMMK_REDUCE_SCATTER,
    COMMK_ALL_GATHER,
    COMMK_BROADCAST,
    COMMK_ALL_TO_ALL,
    COMMK_SEND,
    COMMK_RECV,
    COMMK_BARRIER,
    COMMK_SENDRECV /* send to `peer`, receive from `peer2`, as one grouped operation */
} comm_kind;

#define TETRA_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

int tetra_nccl_built(void);
int tetra_nccl_device_count(void);
int tetra_nccl_set_device(int device, char *err, size_t errlen);
/* Free memory of the current device now (cudaMemGetInfo); 0 when it cannot be read. */
size_t tetra_nccl_device_free(void);
int tetra_nccl_get_unique_id(void *id /*[TETRA_NCCL_ID_BYTES]*/, char *err, size_t errlen);

/* Nonblocking-mode communicators: initialisation and splits are polled until
 * timeout_s, then aborted with an error. Each communicator owns a non-blocking CUDA
 * stream of the device's highest priority, where its operations run. */
void *tetra_nccl_comm_init(const void *id, int nranks, int rank, double timeout_s, char *err, size_t errlen);
/* Collective over parent: every rank calls it; color < 0 takes no part. */
void *tetra_nccl_comm_split(void *parent, int color, int key, double timeout_s, char *err, size_t errlen);
void tetra_nccl_comm_destroy(void *comm);
void tetra_nccl_comm_abort(void *comm);

/* Enqueue one operation on the communicator's stream (buffers in device memory), after
 * the work queued so far on `after` (the compute stream; NULL: the legacy default
 * stream), and return an event recorded behind it (from a pool; give it back with
 * event_release). For COMMK_BARRIER the communicator's own one-element scratch buffer
 * is reduced. NULL with a message on failure. */
void *tetra_nccl_start(void *comm, comm_kind kind, void *recv, const void *send, size_t count, comm_dtype t,
                       comm_redop op, int peer, int peer2, int nranks, void *after, char *err, size_t errlen);
/* Sends and receives as one NCCL group on the communicator's stream, after `after`;
 * events[i] (one per op, all recorded behind the whole group). 0, or -1 with a message. */
int tetra_nccl_start_p2p(void *comm, int n, const comm_p2p_op *ops, void *after, void **events, char *err,
                         size_t errlen);
/* Device-to-device copy on stream (NULL: the legacy default stream); groups of one rank. */
int tetra_nccl_copy(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t errlen);
/* Make stream (NULL: the legacy default stream) wait for event; the host does not wait. */
int tetra_nccl_order(void *event, void *stream, char *err, size_t errlen);
/* 1 when the event has completed, 0 while pending, -1 on an asynchronous
 * communicator or CUDA error (message in err). Safe from a second thread. */
int tetra_nccl_poll(void *comm, void *event, char *err, size_t errlen);
/* The event back to the pool (a stream already ordered after it is unaffected). */
void tetra_nccl_event_release(void *event);

/* The same functions as a table: what lib/libtetra_cuda.so exports (as
 * tetra_cuda_nccl_v1) for comm.c, which loads it on first use
 * (kernels/cuda_plugin.h). */
#define TETRA_NCCL_ABI 3
typedef struct {
    int abi; /* TETRA_NCCL_ABI */
    int (*built)(void);
    int (*device_count)(void);
    int (*set_device)(int device, char *err, size_t errlen);
    size_t (*device_free)(void);
    int (*get_unique_id)(void *id, char *err, size_t errlen);
    void *(*comm_init)(const void *id, int nranks, int rank, double timeout_s, char *err, size_t errlen);
    void *(*comm_split)(void *parent, int color, int key, double timeout_s, char *err, size_t errlen);
    void (*comm_destroy)(void *comm);
    void (*comm_abort)(void *comm);
    void *(*start)(void *comm, comm_kind kind, void *recv, const void *send, size_t count, comm_dtype t, comm_redop op,
                   int peer, int peer2, int nranks, void *after, char *err, size_t errlen);
    int (*start_p2p)(void *comm, int n, const comm_p2p_op *ops, void *after, void **events, char *err, size_t errlen);
    int (*copy)(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t errlen);
    int (*order)(void *event, void *stream, char *err, size_t errlen);
    int (*poll)(void *comm, void *event, char *err, size_t errlen);
    void (*event_release)(void *event);
} tetra_nccl_api;

const tetra_nccl_api *tetra_cuda_nccl_v1(void);

#ifdef __cplusplus
}
#endif

#endif
