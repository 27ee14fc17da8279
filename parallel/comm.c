/* comm.c — the front of comm.h: groups from the mesh, requests, deadlines and
 * the messages that end a stuck or failed job. The MPI backend is comm_mpi.c,
 * the NCCL backend comm_nccl.cu. */
#include <dlfcn.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include "kernels/cuda_plugin.h"
#include "parallel/comm_internal.h"

const char *comm_backend_name(comm_backend b) { return b == COMM_BACKEND_NCCL ? "nccl" : "mpi"; }

#ifdef TETRA_HAVE_NCCL
/* The NCCL backend lives in lib/libtetra_cuda.so, loaded on first use. Only this
 * table is called, and only after comm_backend_available said it is there. */
static const tetra_nccl_api *nccl_api(void) {
    static const tetra_nccl_api *api;
    static int tried;
    if (!tried) {
        tried = 1;
        const tetra_nccl_api *(*get)(void) =
            (const tetra_nccl_api *(*)(void))cuda_plugin_symbol("tetra_cuda_nccl_v1", NULL, 0);
        const tetra_nccl_api *a = get ? get() : NULL;
        api = a && a->abi == TETRA_NCCL_ABI && a->built() ? a : NULL;
    }
    return api;
}
#define NCCL (nccl_api())
#endif

int comm_backend_available(comm_backend b) {
    if (b == COMM_BACKEND_MPI) return 1;
#ifdef TETRA_HAVE_NCCL
    return nccl_api() != NULL;
#else
    return 0;
#endif
}

int comm_nccl_device_count(void) {
#ifdef TETRA_HAVE_NCCL
    return nccl_api() ? NCCL->device_count() : 0;
#else
    return 0;
#endif
}

const char *commi_kind_name(comm_kind k) {
    switch (k) {
    case COMMK_ALL_REDUCE: return "all_reduce";
    case COMMK_REDUCE_SCATTER: return "reduce_scatter";
    case COMMK_ALL_GATHER: return "all_gather";
    case COMMK_BROADCAST: return "broadcast";
    case COMMK_ALL_TO_ALL: return "all_to_all";
    case COMMK_SEND: return "send";
    case COMMK_RECV: return "recv";
    case COMMK_BARRIER: return "barrier";
    case COMMK_SENDRECV: return "sendrecv";
    }
    return "?";
}

double commi_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int use_nccl(const comm_request *r) { return !r->host && r->g->w->opt.backend == COMM_BACKEND_NCCL; }

void comm_abort_explained(int code) {
    fflush(stdout);
    fflush(stderr);
#ifdef OPEN_MPI
    /* MPI_Abort is this banner ("MPI_ABORT was invoked on rank 0 ... You may or may not see
     * output from other processes") followed by ompi_mpi_abort(comm, code), which ends the job
     * and sets mpirun's exit status; called directly where Open MPI exports it. */
    void *self = dlopen(NULL, RTLD_LAZY);
    int (*ompi_abort)(MPI_Comm, int) = NULL;
    if (self) *(void **)&ompi_abort = dlsym(self, "ompi_mpi_abort");
    if (ompi_abort) ompi_abort(MPI_COMM_WORLD, code);
#endif
    MPI_Abort(MPI_COMM_WORLD, code);
    exit(code); /* not reached */
}

static void abort_job(comm_world *w) __attribute__((noreturn));
static void abort_job(comm_world *w) {
    fflush(stdout);
    fflush(stderr);
#ifdef TETRA_HAVE_NCCL
    /* NCCL kernels may be spinning on the device: abort the communicators first */
    if (w && w->opt.backend == COMM_BACKEND_NCCL) {
        for (int i = 0; i < MESH_N_GROUPS; i++)
            if (w->groups[i].nccl_owner) NCCL->comm_abort(w->groups[i].nccl);
        if (w->nccl_world) NCCL->comm_abort(w->nccl_world);
    }
#else
    (void)w;
#endif
    comm_abort_explained(1); /* the caller's line says why */
}

/* A failure line with the log's prefix, "[tetra|rank N] 2026-11-28 06:12:40,761 - ERROR - comm: ...",
 * so that it reads and greps like every other line of the run (the format of telemetry/log.c,
 * written here because parallel/ does not depend on the engine). */
static void fail_line(const comm_world *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_line(const comm_world *w, const char *fmt, ...) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char ts[32], prefix[48];
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
    if (w->m.world > 1) snprintf(prefix, sizeof prefix, "[tetra|rank %d]", w->rank);
    else snprintf(prefix, sizeof prefix, "[tetra]");
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s,%03d - ERROR - %s\n", prefix, ts, (int)(tv.tv_usec / 1000), msg); /* one write per line */
    fflush(stderr);
}

static void describe_issue(const comm_request *r, char *buf, size_t n) {
    char when[64];
    if (r->step > 0) snprintf(when, sizeof when, "issued during step %lld", (long long)r->step);
    else snprintf(when, sizeof when, "issued at start-up");
    if (r->kind == COMMK_BARRIER)
        snprintf(buf, n, "collective #%llu on this group, %s", (unsigned long long)r->seq, when);
    else
        snprintf(buf, n, "collective #%llu on this group, %zu x %s, %s", (unsigned long long)r->seq, r->count,
                 comm_dtype_name(r->dtype), when);
}

void commi_fail(const comm_request *r, const char *what) {
    char issue[200], path[4096];
    describe_issue(r, issue, sizeof issue);
    fail_line(r->g->w, "comm: %s on group %s (%d ranks) failed on rank %d: %s (%s)", commi_kind_name(r->kind),
              mesh_group_name(r->g->id), r->g->size, r->g->w->rank, what, issue);
    if (commi_trace_dump(r->g->w, "failure", r, path, sizeof path) == 0)
        fail_line(r->g->w, "comm: rank %d: flight recorder written to %s", r->g->w->rank, path);
    abort_job(r->g->w);
}

void commi_fail_group(const comm_group *g, const char *op, const char *what) {
    fail_line(g->w, "comm: %s on group %s (%d ranks) failed on rank %d: %s", op, mesh_group_name(g->id), g->size,
              g->w->rank, what);
    abort_job(g->w);
}

void commi_fail_timeout(const comm_request *r, double waited) {
    char issue[200], path[4096], blame[2048] = "";
    describe_issue(r, issue, sizeof issue);
    const int dumped = commi_trace_dump(r->g->w, "timeout", r, path, sizeof path) == 0;
    if (dumped) commi_trace_blame(r, blame, sizeof blame);
    fail_line(r->g->w,
              "comm: %s on group %s (%d ranks) timed out after %.0f s on rank %d (%s); another rank of the "
              "group did not reach it (crashed, stuck, or running a different sequence of collectives)%s%s",
              commi_kind_name(r->kind), mesh_group_name(r->g->id), r->g->size, waited, r->g->w->rank, issue,
              *blame ? "; flight recorder: " : "", blame);
    if (dumped) fail_line(r->g->w, "comm: rank %d: flight recorder written to %s", r->g->w->rank, path);
    abort_job(r->g->w);
}

/* ----------------------------------------------------------------------------
 * world and groups */

/* Every group's size and rank in w's mesh, no communicator yet. */
static void init_groups(comm_world *w) {
    for (int i = 0; i < MESH_N_GROUPS; i++) {
        comm_group *g = &w->groups[i];
        g->w = w;
        g->id = (mesh_group_id)i;
        g->mpi = MPI_COMM_NULL;
        g->size = mesh_group_size(&w->m, mesh_group_dims(g->id));
        g->rank = mesh_group_rank(&w->m, mesh_group_dims(g->id), w->rank);
    }
}

static comm_world *world_alloc(const mesh *m, int rank, const comm_options *opt, char *err, size_t errlen) {
    comm_world *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, errlen, "comm: out of host memory");
        return NULL;
    }
    w->m = *m;
    w->rank = rank;
    w->opt = *opt;
    pthread_mutex_init(&w->watch_mutex, NULL);
    pthread_cond_init(&w->watch_cond, NULL);
    if (!(w->opt.init_timeout_s > 0)) w->opt.init_timeout_s = 300;
    if (!(w->opt.train_timeout_s > 0)) w->opt.train_timeout_s = 100;
    return w;
}

/* A planned world: sizes and ranks from the mesh, no communicators. */
static comm_world *virtual_world_create(const mesh *m, int rank, const comm_options *opt, char *err, size_t errlen) {
    if (rank < 0 || rank >= m->world) {
        snprintf(err, errlen, "comm: rank %d is outside the planned world of %d ranks", rank, m->world);
        return NULL;
    }
    comm_world *w = world_alloc(m, rank, opt, err, errlen);
    if (!w) return NULL;
    w->opt.backend = COMM_BACKEND_MPI;
    w->timeout_s = w->opt.init_timeout_s;
    init_groups(w);
    return w;
}

#ifdef TETRA_HAVE_NCCL /* only the NCCL start-up shares communicators */
/* The dimensions that make a group's membership: those of more than one rank. */
static unsigned member_dims(const mesh *m, mesh_group_id id) {
    unsigned d = 0;
    for (int k = 0; k < MESH_NDIMS; k++)
        if ((mesh_group_dims(id) & MESH_BIT(k)) && m->size[k] > 1) d |= MESH_BIT(k);
    return d;
}

/* The world, or an earlier group, with exactly group i's ranks (in the same order:
 * both are row-major over the same dimensions); NULL when none. */
static const comm_group *same_members(const comm_world *w, int i) {
    const unsigned d = member_dims(&w->m, (mesh_group_id)i);
    if (d == member_dims(&w->m, MESH_G_WORLD)) return &w->groups[MESH_G_WORLD];
    for (int j = 0; j < i; j++)
        if (w->groups[j].size > 1 && member_dims(&w->m, (mesh_group_id)j) == d) return &w->groups[j];
    return NULL;
}
#endif

comm_world *comm_world_create(const mesh *m, int rank, const comm_options *opt, char *err, size_t errlen) {
    if (opt->virtual_world) return virtual_world_create(m, rank, opt, err, errlen);
    int inited = 0, size = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        snprintf(err, errlen, "comm: MPI is not initialised");
        return NULL;
    }
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != m->world || rank < 0 || rank >= size) {
        snprintf(err, errlen, "comm: the mesh has %d ranks but MPI_COMM_WORLD has %d (rank %d)", m->world, size, rank);
        return NULL;
    }
    if (!comm_backend_available(opt->backend)) {
        snprintf(err, errlen, "comm: the %s backend is not in this build (NCCL needs CUDA and libnccl at build time)",
                 comm_backend_name(opt->backend));
        return NULL;
    }
    const comm_device_staging *st = opt->staging;
    if (st && (!st->host_alloc || !st->host_release || !st->to_host || !st->to_device || !st->device_copy)) {
        snprintf(err, errlen, "comm: the staging table for device buffers is incomplete");
        return NULL;
    }
    comm_world *w = world_alloc(m, rank, opt, err, errlen);
    if (!w) return NULL;
    w->timeout_s = w->opt.init_timeout_s;
    init_groups(w);
    for (int i = 0; i < MESH_N_GROUPS; i++)
        if (commi_mpi_group_init(w, &w->groups[i], err, errlen)) {
            comm_world_free(w);
            return NULL;
        }
    if (commi_trace_init(w, err, errlen)) {
        comm_world_free(w);
        return NULL;
    }
    {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        w->run_id = (double)ts.tv_sec + 1e-6 * (double)(ts.tv_nsec / 1000);
        MPI_Bcast(&w->run_id, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
#ifdef TETRA_HAVE_NCCL
    if (opt->backend == COMM_BACKEND_NCCL && !nccl_api()) {
        snprintf(err, errlen, "comm: the NCCL backend is not available (lib/libtetra_cuda.so not loadable)");
        comm_world_free(w);
        return NULL;
    }
    if (opt->backend == COMM_BACKEND_NCCL) {
        int ndev = NCCL->device_count();
        int dev = opt->cuda_device;
        if (dev < 0) {
            MPI_Comm node;
            int local = 0;
            MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
            MPI_Comm_rank(node, &local);
            MPI_Comm_free(&node);
            dev = ndev > 0 ? local % ndev : 0;
        }
        int ok = ndev > 0 && NCCL->set_device(dev, err, errlen) == 0;
        if (ndev <= 0) snprintf(err, errlen, "comm: the NCCL backend needs a GPU, and rank %d sees none", rank);
        unsigned char id[TETRA_NCCL_ID_BYTES];
        memset(id, 0, sizeof id);
        int any_bad = !ok;
        if (rank == 0 && ok && NCCL->get_unique_id(id, err, errlen)) any_bad = 1;
        /* every rank learns whether start-up failed anywhere, so none waits on NCCL alone */
        MPI_Allreduce(MPI_IN_PLACE, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any_bad) {
            if (ok) snprintf(err, errlen, "comm: NCCL start-up failed on another rank");
            comm_world_free(w);
            return NULL;
        }
        MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        const size_t free0 = NCCL->device_free();
        w->nccl_world = NCCL->comm_init(id, m->world, rank, w->timeout_s, err, errlen);
        int bad = w->nccl_world == NULL;
        for (int i = 0; i < MESH_N_GROUPS && !bad; i++) {
            comm_group *g = &w->groups[i];
            if (g->size == 1) continue; /* the same on every rank: every rank skips the split alike */
            const comm_group *same = same_members(w, i);
            if (same) { /* one communicator per set of ranks: the split would duplicate its buffers */
                g->nccl = same->nccl ? same->nccl : w->nccl_world;
                continue;
            }
            const unsigned dims = mesh_group_dims(g->id);
            g->nccl =
                NCCL->comm_split(w->nccl_world, mesh_group_color(m, dims, rank), g->rank, w->timeout_s, err, errlen);
            g->nccl_owner = 1;
            bad = g->nccl == NULL;
        }
        MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (bad) {
            if (!err[0]) snprintf(err, errlen, "comm: NCCL communicator set-up failed on another rank");
            comm_world_free(w);
            return NULL;
        }
        const size_t free1 = NCCL->device_free();
        w->nccl_bytes = free0 > free1 ? free0 - free1 : 0;
    }
#endif
    return w;
}

void comm_world_free(comm_world *w) {
    if (!w) return;
    commi_watch_drain(w);
    commi_watch_stop(w);
    for (int i = 0; i < MESH_N_GROUPS; i++) {
#ifdef TETRA_HAVE_NCCL
        if (w->groups[i].nccl_owner) NCCL->comm_destroy(w->groups[i].nccl);
#endif
        commi_mpi_group_free(&w->groups[i]);
    }
#ifdef TETRA_HAVE_NCCL
    if (w->nccl_world) NCCL->comm_destroy(w->nccl_world);
#endif
    if (w->opt.staging) commi_stage_free(w);
    commi_trace_free(w);
    free(w->pending);
    pthread_cond_destroy(&w->watch_cond);
    pthread_mutex_destroy(&w->watch_mutex);
    free(w);
}

comm_group *comm_get(comm_world *w, mesh_group_id id) { return &w->groups[id]; }
int comm_group_size(const comm_group *g) { return g->size; }
int comm_group_rank(const comm_group *g) { return g->rank; }
const char *comm_group_name(const comm_group *g) { return mesh_group_name(g->id); }
comm_world *comm_group_world(const comm_group *g) { return g->w; }
comm_backend comm_world_backend(const comm_world *w) { return w->opt.backend; }
int comm_world_rank(const comm_world *w) { return w->rank; }
const mesh *comm_world_mesh(const comm_world *w) { return &w->m; }

void comm_set_step(comm_world *w, int64_t step) { w->step = step; }
void comm_set_phase_training(comm_world *w) { w->timeout_s = w->opt.train_timeout_s; }
void comm_set_timeout(comm_world *w, double seconds) {
    if (seconds > 0) w->timeout_s = seconds;
}
double comm_timeout(const comm_world *w) { return w->timeout_s; }
size_t comm_world_device_bytes(const comm_world *w) { return w->nccl_bytes; }
void comm_world_sync(comm_world *w) { commi_watch_drain(w); }

/* ----------------------------------------------------------------------------
 * requests */

static void request_init(comm_request *r, comm_group *g, comm_kind kind, size_t count, comm_dtype t) {
    memset(r, 0, sizeof *r);
    r->g = g;
    r->kind = kind;
    r->count = count;
    r->dtype = t;
    r->t_start = commi_now();
    r->step = g->w->step;
    r->seq = ++g->seq;
    commi_trace_issue(r);
    commi_watch_sweep(g->w);
}

int commi_backend_test(comm_request *r) {
    if (r->done) return 1;
#ifdef TETRA_HAVE_NCCL
    if (use_nccl(r)) {
        if (!r->event) return 1;
        char err[512];
        int s = NCCL->poll(r->g->nccl ? r->g->nccl : r->g->w->nccl_world, r->event, err, sizeof err);
        if (s < 0) commi_fail(r, err);
        return s;
    }
#endif
    if (r->nreq == 0) return 1;
    return commi_mpi_test(r);
}

void commi_finish(comm_request *r) {
    if (r->avg_buf && !use_nccl(r)) {
        const double inv = 1.0 / (double)r->g->size;
        if (r->dtype == COMM_F32) {
            float *x = r->avg_buf;
            const float f = (float)r->g->size;
            for (size_t i = 0; i < r->avg_count; i++) x[i] /= f;
        } else if (r->dtype == COMM_F64) {
            double *x = r->avg_buf;
            for (size_t i = 0; i < r->avg_count; i++) x[i] *= inv;
        }
    }
    commi_stage_out(r); /* after AVG, which divides the host copy */
#ifdef TETRA_HAVE_NCCL
    if (r->event) NCCL->event_release(r->event);
    r->event = NULL;
#endif
    r->done = 1;
    commi_trace_done(r);
    comm_world *w = r->g->w;
    if (w->observer)
        w->observer(w->observer_user, commi_kind_name(r->kind), comm_group_name(r->g),
                    r->count * comm_dtype_size(r->dtype), r->t_start, commi_now());
}

void comm_set_observer(comm_world *w, comm_observer_fn fn, void *user) {
    w->observer = fn;
    w->observer_user = user;
}

int comm_test(comm_request *r) {
    if (!r) return 1;
    if (!r->done && commi_backend_test(r)) commi_finish(r);
    return r->done;
}

/* NCCL: the compute stream waits for r's event instead of the host; r moves to the
 * deferred list (comm_watch.c). */
static int defer_nccl(comm_request *r) {
#ifdef TETRA_HAVE_NCCL
    if (use_nccl(r) && r->event) {
        char err[512];
        if (NCCL->order(r->event, r->g->w->opt.compute_stream, err, sizeof err)) commi_fail(r, err);
        commi_watch_defer(r);
        return 1;
    }
#endif
    (void)r;
    return 0;
}

void comm_wait(comm_request *r) {
    if (!r) return;
    if (!r->done && !commi_backend_test(r) && defer_nccl(r)) {
        if (r->heap) free(r);
        return;
    }
    if (!r->done) {
        /* Poll with a deadline. For the first second the loop only yields the
         * core (what MPI_Wait does, and MPI progress needs frequent calls);
         * after that a slow or stuck peer is waited for with 1 ms sleeps. */
        const double timeout = r->g->w->timeout_s;
        for (;;) {
            if (commi_backend_test(r)) break;
            commi_trace_poll(r->g->w);
            double waited = commi_now() - r->t_start;
            if (waited > timeout) commi_fail_timeout(r, waited);
            if (waited < 1.0) {
                sched_yield();
            } else {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        }
        commi_finish(r);
    }
    if (r->heap) free(r);
}

/* Bytes a group of one copies from send to recv (0: nothing to move). */
static size_t local_copy_bytes(comm_request *r) {
    switch (r->kind) {
    case COMMK_REDUCE_SCATTER:
    case COMMK_ALL_GATHER:
    case COMMK_ALL_TO_ALL:
    case COMMK_SENDRECV: return r->count * comm_dtype_size(r->dtype);
    case COMMK_SEND:
    case COMMK_RECV: commi_fail(r, "a rank cannot send to itself");
    default: return 0;
    }
}

/* A group of one: local copies, no backend call; on device memory through the device
 * (ordered on the compute stream, so complete for everything issued after it). */
static void run_local(comm_request *r, void *recv, const void *send) {
    const size_t bytes = local_copy_bytes(r);
    if (!bytes || !recv || !send || recv == send) return;
#ifdef TETRA_HAVE_NCCL
    if (use_nccl(r)) {
        char err[512];
        if (NCCL->copy(recv, send, bytes, r->g->w->opt.compute_stream, err, sizeof err)) commi_fail(r, err);
        return;
    }
#endif
    if (commi_staged(r)) r->g->w->opt.staging->device_copy(recv, send, bytes);
    else memmove(recv, send, bytes);
}

static void run_backend(comm_request *r, void *recv, const void *send, comm_redop op, int peer) {
#ifdef TETRA_HAVE_NCCL
    if (use_nccl(r)) {
        char err[512];
        comm_group *g = r->g;
        r->event = NCCL->start(g->nccl, r->kind, recv, send, r->count, r->dtype, op, peer, r->peer2, g->size,
                               g->w->opt.compute_stream, err, sizeof err);
        if (!r->event) commi_fail(r, err);
        return;
    }
#endif
    if (commi_staged(r)) commi_stage_in(r, &recv, &send, peer);
    commi_mpi_start(r, recv, send, op, peer);
    if (op == COMM_AVG) { /* divided on the host when it completes (the staged copy, if staged) */
        r->avg_buf = recv;
        r->avg_count = r->count;
    }
}

/* r as the caller's handle (heap) or run to completion. */
static void hand_over(comm_request *r, comm_request **req) {
    if (!req) {
        comm_wait(r);
        return;
    }
    comm_request *h = malloc(sizeof *h);
    if (!h) commi_fail(r, "out of host memory");
    *h = *r;
    if (r->reqs == r->inline_reqs) h->reqs = h->inline_reqs;
    h->heap = 1;
    *req = h;
}

/* Start r (already initialised); blocking when req is NULL. */
static void run(comm_request *r, comm_request **req, void *recv, const void *send, comm_redop op, int peer) {
    comm_group *g = r->g;
    if (op == COMM_AVG && r->kind != COMMK_BARRIER && r->dtype != COMM_F32 && r->dtype != COMM_F64 &&
        !(use_nccl(r) && r->dtype == COMM_BF16))
        commi_fail(r, "AVG needs a floating-point type");
    if ((r->kind == COMMK_ALL_REDUCE || r->kind == COMMK_REDUCE_SCATTER) && !use_nccl(r) &&
        (r->dtype == COMM_BF16 || r->dtype == COMM_U8))
        commi_fail(r, "the MPI backend reduces float32, float64, int32 and int64 only");
    if (r->kind == COMMK_SEND || r->kind == COMMK_RECV || r->kind == COMMK_SENDRECV) commi_trace_peer(r, peer);
    if (g->w->opt.virtual_world && g->size > 1) {
        fprintf(stderr,
                "comm: %s on group %s (%d ranks) in a planned world (rank %d): planning does not "
                "communicate\n",
                commi_kind_name(r->kind), mesh_group_name(g->id), g->size, g->w->rank);
        exit(1);
    }
    if (g->size == 1) run_local(r, recv, send);
    else run_backend(r, recv, send, op, peer);
    hand_over(r, req);
}

static void check_peer(comm_request *r, int peer) {
    if (peer < 0 || peer >= r->g->size) {
        char what[96];
        snprintf(what, sizeof what, "peer %d is not a rank of the group", peer);
        commi_fail(r, what);
    }
}

void comm_all_reduce(comm_group *g, void *buf, size_t count, comm_dtype t, comm_redop op, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_ALL_REDUCE, count, t);
    run(&r, req, buf, buf, op, 0);
}

void comm_reduce_scatter(comm_group *g, void *recv, const void *send, size_t count, comm_dtype t, comm_redop op,
                         comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_REDUCE_SCATTER, count, t);
    run(&r, req, recv, send, op, 0);
}

void comm_all_gather(comm_group *g, void *recv, const void *send, size_t count, comm_dtype t, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_ALL_GATHER, count, t);
    /* the group-of-one copy is from send to recv, which is where rank 0's block goes */
    run(&r, req, recv, send, COMM_SUM, 0);
}

void comm_broadcast(comm_group *g, void *buf, size_t count, comm_dtype t, int root, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_BROADCAST, count, t);
    check_peer(&r, root);
    run(&r, req, buf, buf, COMM_SUM, root);
}

void comm_all_to_all(comm_group *g, void *recv, const void *send, size_t count, comm_dtype t, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_ALL_TO_ALL, count, t);
    run(&r, req, recv, send, COMM_SUM, 0);
}

void comm_send(comm_group *g, const void *buf, size_t count, comm_dtype t, int peer, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_SEND, count, t);
    if (g->size > 1) check_peer(&r, peer);
    run(&r, req, NULL, buf, COMM_SUM, peer);
}

void comm_recv(comm_group *g, void *buf, size_t count, comm_dtype t, int peer, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_RECV, count, t);
    if (g->size > 1) check_peer(&r, peer);
    run(&r, req, buf, NULL, COMM_SUM, peer);
}

void comm_sendrecv(comm_group *g, void *recv, int from, const void *send, int to, size_t count, comm_dtype t,
                   comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_SENDRECV, count, t);
    check_peer(&r, to);
    check_peer(&r, from);
    r.peer2 = from;
    run(&r, req, recv, send, COMM_SUM, to);
}

#ifdef TETRA_HAVE_NCCL
/* One NCCL group on the communicator's stream; a request (and event) per op. */
static void batch_nccl(comm_group *g, const comm_p2p_op *ops, int n, comm_request **rq) {
    comm_request *rs = calloc((size_t)n, sizeof *rs);
    void **ev = calloc((size_t)n, sizeof *ev);
    if (!rs || !ev) commi_fail_group(g, "batch_p2p", "out of host memory");
    for (int i = 0; i < n; i++) {
        request_init(&rs[i], g, ops[i].recv ? COMMK_RECV : COMMK_SEND, ops[i].count, ops[i].dtype);
        check_peer(&rs[i], ops[i].peer);
        commi_trace_peer(&rs[i], ops[i].peer);
    }
    char err[512];
    if (NCCL->start_p2p(g->nccl, n, ops, g->w->opt.compute_stream, ev, err, sizeof err)) commi_fail(&rs[0], err);
    for (int i = 0; i < n; i++) {
        rs[i].event = ev[i];
        hand_over(&rs[i], &rq[i]);
    }
    free(ev);
    free(rs);
}
#endif

void comm_batch_p2p(comm_group *g, const comm_p2p_op *ops, int n, comm_request **reqs) {
    comm_request *local[16], **rq = reqs;
    if (!rq) rq = n <= 16 ? local : malloc((size_t)n * sizeof *rq);
    if (!rq) commi_fail_group(g, "batch_p2p", "out of host memory");
#ifdef TETRA_HAVE_NCCL
    if (g->w->opt.backend == COMM_BACKEND_NCCL && g->size > 1 && n > 0) {
        batch_nccl(g, ops, n, rq);
    } else
#endif
    {
        /* MPI's nonblocking sends and receives never wait on each other's posting order:
         * every op is started before any is waited for */
        for (int i = 0; i < n; i++) {
            if (ops[i].recv) comm_recv(g, ops[i].buf, ops[i].count, ops[i].dtype, ops[i].peer, &rq[i]);
            else comm_send(g, ops[i].buf, ops[i].count, ops[i].dtype, ops[i].peer, &rq[i]);
        }
    }
    if (reqs) return;
    for (int i = 0; i < n; i++) comm_wait(rq[i]);
    if (rq != local) free(rq);
}

/* Over MPI whatever the backend: a barrier is about where the hosts are, and an NCCL
 * one would only order the compute streams (comm_wait does not wait on the host). */
void comm_barrier(comm_group *g, comm_request **req) {
    comm_request r;
    request_init(&r, g, COMMK_BARRIER, 0, COMM_F32);
    r.host = 1;
    run(&r, req, NULL, NULL, COMM_SUM, 0);
}

/* ----------------------------------------------------------------------------
 * host scalars: always over MPI, whatever the backend */

double comm_all_reduce_f64(comm_group *g, double x, comm_redop op) {
    comm_request r;
    request_init(&r, g, COMMK_ALL_REDUCE, 1, COMM_F64);
    r.host = 1;
    run(&r, NULL, &x, &x, op, 0);
    return x;
}

int64_t comm_all_reduce_i64(comm_group *g, int64_t x, comm_redop op) {
    comm_request r;
    request_init(&r, g, COMMK_ALL_REDUCE, 1, COMM_I64);
    r.host = 1;
    run(&r, NULL, &x, &x, op, 0);
    return x;
}
