/* comm_nccl.cu — the NCCL backend of comm.h (C interface in comm_nccl.h).
 *
 * Communicators are created in NCCL's nonblocking mode (ncclConfig_t.blocking
 * = 0), so initialisation and splits can be polled against a deadline and
 * aborted instead of hanging. Each communicator runs on a stream of its own (of the
 * device's highest priority, so communication kernels are scheduled ahead of compute
 * kernels queued at the same time): collectives of different mesh groups never queue
 * behind each other. An operation waits for an event recorded on the compute stream
 * when it is issued, and leaves an event from a pool behind it; the front makes the
 * compute stream wait for that event (comm_wait) and polls it, together with
 * ncclCommGetAsyncError, for the stuck-collective watchdog; a stuck or failed
 * communicator is ended with ncclCommAbort (comm.c). Built only when CMake finds
 * NCCL (cmake/nccl.cmake defines TETRA_HAVE_NCCL). */
#include "parallel/comm_nccl.h"

#ifdef TETRA_HAVE_NCCL

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mutex>
#include <new>
#include <vector>

static_assert(sizeof(ncclUniqueId) == TETRA_NCCL_ID_BYTES, "ncclUniqueId size");

namespace {

struct tnccl {
    ncclComm_t comm;
    float *scratch;      /* one element: what a barrier reduces */
    cudaEvent_t dep;     /* orders the communication stream after the compute stream */
    cudaStream_t stream; /* where this communicator's operations run */
};

/* Completion events, reused: creating and destroying one per operation costs a driver
 * call each. The watchdog thread only queries events, so the lock guards the list. */
std::mutex g_pool_mutex;
std::vector<cudaEvent_t> g_pool;

cudaEvent_t event_get(char *err, size_t errlen) {
    {
        std::lock_guard<std::mutex> lock(g_pool_mutex);
        if (!g_pool.empty()) {
            cudaEvent_t e = g_pool.back();
            g_pool.pop_back();
            return e;
        }
    }
    cudaEvent_t e = nullptr;
    cudaError_t ce = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "CUDA event: %s", cudaGetErrorString(ce));
        return nullptr;
    }
    return e;
}

void event_put(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(g_pool_mutex);
    g_pool.push_back(e);
}

double now_s() {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void nap() {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, nullptr);
}

/* Wait until a nonblocking communicator has finished its pending call. */
int settle(ncclComm_t c, double timeout_s, const char *what, char *err, size_t errlen) {
    const double t0 = now_s();
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(c, &st);
        if (r != ncclSuccess) {
            snprintf(err, errlen, "%s: ncclCommGetAsyncError: %s", what, ncclGetErrorString(r));
            return -1;
        }
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) {
            snprintf(err, errlen, "%s: %s (%s)", what, ncclGetErrorString(st), ncclGetLastError(c));
            return -1;
        }
        if (now_s() - t0 > timeout_s) {
            snprintf(err, errlen, "%s timed out after %.0f s (a rank did not join)", what, timeout_s);
            return -1;
        }
        nap();
    }
}

ncclDataType_t nccl_type(comm_dtype t) {
    switch (t) {
    case COMM_F32: return ncclFloat32;
    case COMM_F64: return ncclFloat64;
    case COMM_I32: return ncclInt32;
    case COMM_I64: return ncclInt64;
    case COMM_BF16: return ncclBfloat16;
    case COMM_U8: return ncclUint8;
    }
    return ncclUint8;
}

ncclRedOp_t nccl_op(comm_redop op) {
    switch (op) {
    case COMM_SUM: return ncclSum;
    case COMM_MAX: return ncclMax;
    case COMM_MIN: return ncclMin;
    case COMM_AVG: return ncclAvg;
    }
    return ncclSum;
}

tnccl *wrap(ncclComm_t c, char *err, size_t errlen) {
    tnccl *t = new (std::nothrow) tnccl;
    if (!t) {
        snprintf(err, errlen, "out of host memory");
        ncclCommAbort(c);
        return nullptr;
    }
    t->comm = c;
    t->scratch = nullptr;
    t->dep = nullptr;
    t->stream = nullptr;
    int least = 0, greatest = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&t->stream, cudaStreamNonBlocking, greatest);
    if (e == cudaSuccess) e = cudaMalloc(&t->scratch, sizeof(float));
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&t->dep, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMemsetAsync(t->scratch, 0, sizeof(float), t->stream);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "CUDA: %s", cudaGetErrorString(e));
        if (t->scratch) cudaFree(t->scratch);
        if (t->dep) cudaEventDestroy(t->dep);
        if (t->stream) cudaStreamDestroy(t->stream);
        ncclCommAbort(c);
        delete t;
        return nullptr;
    }
    return t;
}

} // namespace

extern "C" int tetra_nccl_built(void) { return 1; }

extern "C" int tetra_nccl_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int tetra_nccl_set_device(int device, char *err, size_t errlen) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaSetDevice(%d): %s", device, cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int tetra_nccl_get_unique_id(void *id, char *err, size_t errlen) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) {
        snprintf(err, errlen, "ncclGetUniqueId: %s", ncclGetErrorString(r));
        return -1;
    }
    memcpy(id, &u, sizeof u);
    return 0;
}

extern "C" size_t tetra_nccl_device_free(void) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return fr;
}

extern "C" void *tetra_nccl_comm_init(const void *id, int nranks, int rank, double timeout_s, char *err,
                                      size_t errlen) {
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&c, nranks, u, rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(err, errlen, "ncclCommInitRankConfig (rank %d of %d): %s", rank, nranks, ncclGetErrorString(r));
        if (c) ncclCommAbort(c);
        return nullptr;
    }
    if (settle(c, timeout_s, "NCCL communicator initialisation", err, errlen)) {
        ncclCommAbort(c);
        return nullptr;
    }
    return wrap(c, err, errlen);
}

extern "C" void *tetra_nccl_comm_split(void *parent, int color, int key, double timeout_s, char *err, size_t errlen) {
    tnccl *p = (tnccl *)parent;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t c = nullptr;
    ncclResult_t r = ncclCommSplit(p->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &c, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        snprintf(err, errlen, "ncclCommSplit: %s", ncclGetErrorString(r));
        return nullptr;
    }
    if (settle(p->comm, timeout_s, "ncclCommSplit (parent)", err, errlen)) return nullptr;
    if (!c) {
        snprintf(err, errlen, "ncclCommSplit returned no communicator");
        return nullptr;
    }
    if (settle(c, timeout_s, "ncclCommSplit", err, errlen)) {
        ncclCommAbort(c);
        return nullptr;
    }
    return wrap(c, err, errlen);
}

extern "C" void tetra_nccl_comm_destroy(void *comm) {
    tnccl *t = (tnccl *)comm;
    if (!t) return;
    char err[256];
    if (t->comm) { /* NULL once aborted */
        ncclResult_t r = ncclCommFinalize(t->comm);
        if ((r == ncclSuccess || r == ncclInProgress) &&
            settle(t->comm, 60.0, "ncclCommFinalize", err, sizeof err) == 0)
            ncclCommDestroy(t->comm);
        else ncclCommAbort(t->comm);
        if (t->stream) cudaStreamSynchronize(t->stream);
    }
    if (t->scratch) cudaFree(t->scratch);
    if (t->dep) cudaEventDestroy(t->dep);
    if (t->stream) cudaStreamDestroy(t->stream);
    delete t;
}

extern "C" void tetra_nccl_comm_abort(void *comm) {
    tnccl *t = (tnccl *)comm;
    if (t && t->comm) {
        ncclCommAbort(t->comm);
        t->comm = nullptr;
    }
}

namespace {

/* The communicator's stream after the work queued so far on `after`: only the
 * producer's stream is waited for, not every blocking stream (the legacy default
 * stream would be). */
int order_after(tnccl *c, void *after, char *err, size_t errlen) {
    cudaError_t ce = cudaEventRecord(c->dep, (cudaStream_t)after);
    if (ce == cudaSuccess) ce = cudaStreamWaitEvent(c->stream, c->dep, 0);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "CUDA stream dependency: %s", cudaGetErrorString(ce));
        return -1;
    }
    return 0;
}

/* After an enqueue: a nonblocking communicator may still be launching. */
int enqueued(tnccl *c, ncclResult_t r, char *err, size_t errlen) {
    if (r == ncclInProgress) return settle(c->comm, 600.0, "NCCL enqueue", err, errlen);
    if (r != ncclSuccess) {
        snprintf(err, errlen, "%s (%s)", ncclGetErrorString(r), ncclGetLastError(c->comm));
        return -1;
    }
    return 0;
}

void *record_behind(tnccl *c, char *err, size_t errlen) {
    cudaEvent_t ev = event_get(err, errlen);
    if (!ev) return nullptr;
    cudaError_t ce = cudaEventRecord(ev, c->stream);
    if (ce != cudaSuccess) {
        snprintf(err, errlen, "CUDA event: %s", cudaGetErrorString(ce));
        event_put(ev);
        return nullptr;
    }
    return (void *)ev;
}

ncclResult_t enqueue(tnccl *c, comm_kind kind, void *recv, const void *send, size_t count, comm_dtype t, comm_redop op,
                     int peer, int peer2, int nranks) {
    cudaStream_t s = c->stream;
    const ncclDataType_t dt = nccl_type(t);
    const size_t es = comm_dtype_size(t);
    ncclResult_t r = ncclSuccess;
    switch (kind) {
    case COMMK_ALL_REDUCE: return ncclAllReduce(send, recv, count, dt, nccl_op(op), c->comm, s);
    case COMMK_REDUCE_SCATTER: return ncclReduceScatter(send, recv, count, dt, nccl_op(op), c->comm, s);
    case COMMK_ALL_GATHER: return ncclAllGather(send, recv, count, dt, c->comm, s);
    case COMMK_BROADCAST: return ncclBroadcast(send, recv, count, dt, peer, c->comm, s);
    case COMMK_SEND: return ncclSend(send, count, dt, peer, c->comm, s);
    case COMMK_RECV: return ncclRecv(recv, count, dt, peer, c->comm, s);
    case COMMK_BARRIER: return ncclAllReduce(c->scratch, c->scratch, 1, ncclFloat32, ncclSum, c->comm, s);
    case COMMK_SENDRECV: { /* grouped, so ranks exchanging in a permutation never wait on each other's order */
        r = ncclGroupStart();
        if (r == ncclSuccess) r = ncclSend(send, count, dt, peer, c->comm, s);
        if (r == ncclSuccess) r = ncclRecv(recv, count, dt, peer2, c->comm, s);
        ncclResult_t e = ncclGroupEnd();
        return r == ncclSuccess ? e : r;
    }
    case COMMK_ALL_TO_ALL: {
        r = ncclGroupStart();
        for (int p = 0; p < nranks && r == ncclSuccess; p++) {
            r = ncclSend((const char *)send + (size_t)p * count * es, count, dt, p, c->comm, s);
            if (r == ncclSuccess) r = ncclRecv((char *)recv + (size_t)p * count * es, count, dt, p, c->comm, s);
        }
        ncclResult_t e = ncclGroupEnd();
        return r == ncclSuccess ? e : r;
    }
    }
    return ncclInvalidArgument;
}

} // namespace

extern "C" void *tetra_nccl_start(void *comm, comm_kind kind, void *recv, const void *send, size_t count, comm_dtype t,
                                  comm_redop op, int peer, int peer2, int nranks, void *after, char *err,
                                  size_t errlen) {
    tnccl *c = (tnccl *)comm;
    if (order_after(c, after, err, errlen)) return nullptr;
    if (enqueued(c, enqueue(c, kind, recv, send, count, t, op, peer, peer2, nranks), err, errlen)) return nullptr;
    return record_behind(c, err, errlen);
}

extern "C" int tetra_nccl_start_p2p(void *comm, int n, const comm_p2p_op *ops, void *after, void **events, char *err,
                                    size_t errlen) {
    tnccl *c = (tnccl *)comm;
    if (order_after(c, after, err, errlen)) return -1;
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < n && r == ncclSuccess; i++) {
        const comm_p2p_op *o = &ops[i];
        r = o->recv ? ncclRecv(o->buf, o->count, nccl_type(o->dtype), o->peer, c->comm, c->stream)
                    : ncclSend(o->buf, o->count, nccl_type(o->dtype), o->peer, c->comm, c->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    if (enqueued(c, r == ncclSuccess ? e : r, err, errlen)) return -1;
    for (int i = 0; i < n; i++) {
        events[i] = record_behind(c, err, errlen);
        if (!events[i]) {
            while (i-- > 0) event_put((cudaEvent_t)events[i]);
            return -1;
        }
    }
    return 0;
}

extern "C" int tetra_nccl_copy(void *dst, const void *src, size_t bytes, void *stream, char *err, size_t errlen) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int tetra_nccl_order(void *event, void *stream, char *err, size_t errlen) {
    cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "cudaStreamWaitEvent: %s", cudaGetErrorString(e));
        return -1;
    }
    return 0;
}

extern "C" int tetra_nccl_poll(void *comm, void *event, char *err, size_t errlen) {
    cudaError_t e = cudaEventQuery((cudaEvent_t)event);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) {
        snprintf(err, errlen, "CUDA: %s", cudaGetErrorString(e));
        return -1;
    }
    tnccl *c = (tnccl *)comm;
    if (c && c->comm) {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
            snprintf(err, errlen, "NCCL: %s (%s)", ncclGetErrorString(st), ncclGetLastError(c->comm));
            return -1;
        }
    }
    return 0;
}

extern "C" void tetra_nccl_event_release(void *event) {
    if (event) event_put((cudaEvent_t)event);
}

// The library's entry point for comm.c.
extern "C" __attribute__((visibility("default"))) const tetra_nccl_api *tetra_cuda_nccl_v1(void) {
    static const tetra_nccl_api api = {
        TETRA_NCCL_ABI,          tetra_nccl_built,         tetra_nccl_device_count, tetra_nccl_set_device,
        tetra_nccl_device_free,  tetra_nccl_get_unique_id, tetra_nccl_comm_init,    tetra_nccl_comm_split,
        tetra_nccl_comm_destroy, tetra_nccl_comm_abort,    tetra_nccl_start,        tetra_nccl_start_p2p,
        tetra_nccl_copy,         tetra_nccl_order,         tetra_nccl_poll,         tetra_nccl_event_release};
    return &api;
}

#else

/* Built without NCCL: comm.c never calls into this file (TETRA_HAVE_NCCL is unset). */
extern "C" int tetra_nccl_built(void) { return 0; }

extern "C" __attribute__((visibility("default"))) const tetra_nccl_api *tetra_cuda_nccl_v1(void) { return NULL; }

#endif
