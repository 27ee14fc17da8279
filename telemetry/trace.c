/* trace.c — Chrome-trace profiling of training steps (trace.h). */
#define _POSIX_C_SOURCE 200809L

#include "telemetry/trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { TRACE_DEPTH = 32, TRACE_LANES = 16 };

typedef struct {
    char name[72];
    char cat[12];
    double t0, t1; /* seconds, CLOCK_MONOTONIC */
    int tid;
    size_t bytes;   /* comm: this rank's buffer */
    char group[16]; /* comm */
    double flops;   /* gemm: 2 m n k (x batch) */
} trace_event;

struct trace {
    char dir[4096];
    int rank;
    int64_t freq, active;
    const tetra_ops *ops;
    comm_world *cw;
    int recording;
    trace_event *ev;
    size_t n, cap;
    int open[TRACE_DEPTH]; /* indices of the open spans */
    int depth;
    int too_deep; /* spans begun past TRACE_DEPTH (not recorded) still open */
    double lane_end[TRACE_LANES];
};

/* the trace that the wrapped ops (trace_ops, at the end) report to */
static trace *op_trace;

static double mono(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static trace_event *push(trace *t) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 4096;
        trace_event *e = realloc(t->ev, cap * sizeof *e);
        if (!e) return NULL; /* a trace short of memory loses events, never the run */
        t->ev = e;
        t->cap = cap;
    }
    trace_event *e = &t->ev[t->n++];
    memset(e, 0, sizeof *e);
    return e;
}

/* Collectives complete asynchronously: each goes to the first comm lane free at its start. */
static void on_comm(void *user, const char *op, const char *group, size_t bytes, double t0, double t1) {
    trace *t = user;
    if (!t->recording) return;
    trace_event *e = push(t);
    if (!e) return;
    int lane = 0;
    while (lane < TRACE_LANES - 1 && t->lane_end[lane] > t0) lane++;
    if (t1 > t->lane_end[lane]) t->lane_end[lane] = t1;
    snprintf(e->name, sizeof e->name, "%s %s", op, group);
    snprintf(e->cat, sizeof e->cat, "comm");
    snprintf(e->group, sizeof e->group, "%s", group);
    e->bytes = bytes;
    e->t0 = t0;
    e->t1 = t1;
    e->tid = 1 + lane;
}

trace *trace_create(const char *dir, int rank, int64_t freq, int64_t active, const tetra_ops *ops, comm_world *cw,
                    char *err, size_t errlen) {
    if (freq < 1 || active < 1) {
        snprintf(err, errlen, "profiling: profile_freq (%lld) and profiler_active (%lld) must be >= 1", (long long)freq,
                 (long long)active);
        return NULL;
    }
    trace *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, errlen, "profiling: out of host memory");
        return NULL;
    }
    snprintf(t->dir, sizeof t->dir, "%s", dir ? dir : "");
    t->rank = rank;
    t->freq = freq;
    t->active = active < freq ? active : freq;
    t->ops = ops;
    t->cw = cw;
    op_trace = t;
    return t;
}

void trace_free(trace *t) {
    if (!t) return;
    if (op_trace == t) op_trace = NULL;
    if (t->cw) comm_set_observer(t->cw, NULL, NULL);
    free(t->ev);
    free(t);
}

/* a trace without a folder only names the spans (trace.h): nothing is timed */
static int timed(const trace *t) { return t->dir[0] != 0; }

static const tetra_ops *op_base; /* trace_ops' backend, and its wrapped table */
static tetra_ops op_wrapped;

/* The trace's own synchronisation goes to the backend itself: through the wrapped table it
 * would be reported as a host wait of the step. */
static void sync_device(const trace *t) {
    if (!timed(t) || !t->ops || t->ops->host_memory) return;
    if (t->ops == &op_wrapped && op_base) op_base->synchronize();
    else t->ops->synchronize();
}

int trace_timing(const trace *t) { return t && t->recording && timed(t) && t->ops && !t->ops->host_memory; }

void trace_step_begin(trace *t, int64_t step) {
    if (!t) return;
    /* the window: the `active` steps that end at a multiple of freq */
    t->recording = (step - 1) % t->freq >= t->freq - t->active;
    if (!t->recording) return;
    if (t->cw) comm_set_observer(t->cw, on_comm, t);
    sync_device(t);
    trace_begin(t, "step", "step %lld", (long long)step);
}

static int mkdirs(const char *path) {
    char p[4400];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s >= 0x20) fputc(*s, f);
    }
    fputc('"', f);
}

static int write_file(trace *t, int64_t step, char *err, size_t errlen) {
    char dir[4200], path[4300], tmp[4400];
    snprintf(dir, sizeof dir, "%s/iteration_%lld", t->dir, (long long)step);
    if (mkdirs(dir)) {
        snprintf(err, errlen, "profiling: cannot create %s: %s", dir, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/rank%d_trace.json", dir, t->rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, errlen, "profiling: cannot write %s: %s", tmp, strerror(errno));
        return -1;
    }
    const double origin = t->n ? t->ev[0].t0 : 0.0;
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    fprintf(f, "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": %d, \"args\": {\"name\": \"rank %d\"}},\n",
            t->rank, t->rank);
    fprintf(f, "{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"train\"}}",
            t->rank);
    int max_tid = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->ev[i].tid > max_tid) max_tid = t->ev[i].tid;
    for (int k = 1; k <= max_tid; k++)
        fprintf(f,
                ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
                "\"comm %d\"}}",
                t->rank, k, k);
    for (size_t i = 0; i < t->n; i++) {
        const trace_event *e = &t->ev[i];
        if (e->t1 < e->t0) continue; /* a span left open (an error path): not written */
        fprintf(f, ",\n{\"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"cat\": ", t->rank,
                e->tid, (e->t0 - origin) * 1e6, (e->t1 - e->t0) * 1e6);
        json_str(f, e->cat);
        fprintf(f, ", \"name\": ");
        json_str(f, e->name);
        if (e->tid > 0) {
            fprintf(f, ", \"args\": {\"group\": ");
            json_str(f, e->group);
            fprintf(f, ", \"bytes\": %zu}", e->bytes);
        } else if (e->flops > 0) {
            fprintf(f, ", \"args\": {\"flops\": %.0f}", e->flops);
        }
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
    if (fclose(f) || rename(tmp, path)) {
        snprintf(err, errlen, "profiling: cannot write %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int trace_step_end(trace *t, int64_t step, char *err, size_t errlen) {
    if (!t || !t->recording) return 0;
    t->too_deep = 0;
    while (t->depth > 0) trace_end(t); /* the step span, and any a failed path left open */
    t->recording = 0;
    if (t->cw) comm_set_observer(t->cw, NULL, NULL);
    if (step % t->freq) return 0;
    int rc = timed(t) ? write_file(t, step, err, errlen) : 0;
    t->n = 0;
    memset(t->lane_end, 0, sizeof t->lane_end);
    return rc;
}

void trace_begin(trace *t, const char *cat, const char *fmt, ...) {
    if (!t || !t->recording) return;
    if (t->depth == TRACE_DEPTH) {
        t->too_deep++;
        return;
    }
    sync_device(t);
    trace_event *e = push(t);
    if (!e) {
        t->open[t->depth++] = -1;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof e->name, fmt, ap);
    va_end(ap);
    snprintf(e->cat, sizeof e->cat, "%s", cat);
    e->flops = 0;
    if (t->ops && t->ops->range_push) t->ops->range_push(e->name);
    e->t0 = mono();
    e->t1 = e->t0 - 1.0; /* open */
    t->open[t->depth++] = (int)(e - t->ev);
}

void trace_end(trace *t) {
    if (!t || !t->recording || t->depth == 0) return;
    if (t->too_deep) {
        t->too_deep--;
        return;
    }
    sync_device(t);
    const int i = t->open[--t->depth];
    if (i >= 0) {
        t->ev[i].t1 = mono();
        if (t->ops && t->ops->range_pop) t->ops->range_pop();
    }
}

/* ---- op spans: the backend's table with its heavy ops wrapped ----
 * One trace per process reports them (the training thread's); outside a recorded step a
 * wrapper costs a branch. */

static int op_on(void) { return op_trace && op_trace->recording; }

static void w_gemm(void *c, const void *a, const void *b, const ops_gemm_desc *g) {
    if (!op_on()) {
        op_base->gemm(c, a, b, g);
        return;
    }
    const int batch = g->batch > 1 ? g->batch : 1;
    char xb[16] = "";
    if (batch > 1) snprintf(xb, sizeof xb, " x%d", batch);
    trace_begin(op_trace, "gemm", "gemm %dx%dx%d%s %s", g->m, g->n, g->k, xb, tetra_dtype_name(g->a_type));
    if (op_trace->depth > 0 && op_trace->open[op_trace->depth - 1] >= 0)
        op_trace->ev[op_trace->open[op_trace->depth - 1]].flops = 2.0 * g->m * (double)g->n * g->k * batch;
    op_base->gemm(c, a, b, g);
    trace_end(op_trace);
}

static void attn_begin(const char *what, const ops_attn_shape *s) {
    trace_begin(op_trace, "attention", "attention %s b%d h%d/%d sq%d sk%d d%d%s", what, s->b, s->h, s->kv, s->sq, s->sk,
                s->d, s->causal ? " causal" : "");
}

static void w_attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v, const ops_attn_shape *s,
                       void *ws) {
    if (!op_on()) {
        op_base->attention_forward(out, lse, q, k, v, s, ws);
        return;
    }
    attn_begin("forward", s);
    op_base->attention_forward(out, lse, q, k, v, s, ws);
    trace_end(op_trace);
}

static void w_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                       const float *v, const float *out, const float *lse, const ops_attn_shape *s, void *ws) {
    if (!op_on()) {
        op_base->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, ws);
        return;
    }
    attn_begin("backward", s);
    op_base->attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, ws);
    trace_end(op_trace);
}

static void w_attn_fwd_bf16(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                            const ops_attn_shape *s, void *ws) {
    if (!op_on()) {
        op_base->attention_forward_bf16(out, lse, q, k, v, s, ws);
        return;
    }
    attn_begin("forward bf16", s);
    op_base->attention_forward_bf16(out, lse, q, k, v, s, ws);
    trace_end(op_trace);
}

static void w_attn_bwd_bf16(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout, const uint16_t *q,
                            const uint16_t *k, const uint16_t *v, const uint16_t *out, const float *lse,
                            const ops_attn_shape *s, void *ws) {
    if (!op_on()) {
        op_base->attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, ws);
        return;
    }
    attn_begin("backward bf16", s);
    op_base->attention_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, s, ws);
    trace_end(op_trace);
}

static void w_ce(float *dlogits, float *losses, const float *logits, const int32_t *targets, int n, int v,
                 float dloss_scale) {
    if (!op_on()) {
        op_base->cross_entropy(dlogits, losses, logits, targets, n, v, dloss_scale);
        return;
    }
    trace_begin(op_trace, "loss", "cross_entropy %dx%d", n, v);
    op_base->cross_entropy(dlogits, losses, logits, targets, n, v, dloss_scale);
    trace_end(op_trace);
}

static void w_ce_bf16(uint16_t *dlogits, float *losses, const uint16_t *logits, const int32_t *targets, int n, int v,
                      float dloss_scale) {
    if (!op_on()) {
        op_base->cross_entropy_bf16(dlogits, losses, logits, targets, n, v, dloss_scale);
        return;
    }
    trace_begin(op_trace, "loss", "cross_entropy %dx%d", n, v);
    op_base->cross_entropy_bf16(dlogits, losses, logits, targets, n, v, dloss_scale);
    trace_end(op_trace);
}

/* Host waits (a backend whose memory is not the host's): a span "host wait: ..." inside
 * the span that asked for it, which says why. */
static int wait_on(void) { return op_on() && !op_base->host_memory; }

static void w_copy_h2d(void *dst, const void *src, size_t bytes) {
    if (!wait_on()) {
        op_base->copy_h2d(dst, src, bytes);
        return;
    }
    trace_begin(op_trace, "host_wait", "host wait: copy_h2d %zu B", bytes);
    op_base->copy_h2d(dst, src, bytes);
    trace_end(op_trace);
}

static void w_copy_d2h(void *dst, const void *src, size_t bytes) {
    if (!wait_on()) {
        op_base->copy_d2h(dst, src, bytes);
        return;
    }
    trace_begin(op_trace, "host_wait", "host wait: copy_d2h %zu B", bytes);
    op_base->copy_d2h(dst, src, bytes);
    trace_end(op_trace);
}

static void w_synchronize(void) {
    if (!wait_on()) {
        op_base->synchronize();
        return;
    }
    trace_begin(op_trace, "host_wait", "host wait: synchronize");
    op_base->synchronize();
    trace_end(op_trace);
}

const tetra_ops *trace_ops(const tetra_ops *base) {
    if (!base) return NULL;
    op_base = base;
    op_wrapped = *base;
    if (base->gemm) op_wrapped.gemm = w_gemm;
    if (base->attention_forward) op_wrapped.attention_forward = w_attn_fwd;
    if (base->attention_backward) op_wrapped.attention_backward = w_attn_bwd;
    if (base->attention_forward_bf16) op_wrapped.attention_forward_bf16 = w_attn_fwd_bf16;
    if (base->attention_backward_bf16) op_wrapped.attention_backward_bf16 = w_attn_bwd_bf16;
    if (base->cross_entropy) op_wrapped.cross_entropy = w_ce;
    if (base->cross_entropy_bf16) op_wrapped.cross_entropy_bf16 = w_ce_bf16;
    if (base->copy_h2d) op_wrapped.copy_h2d = w_copy_h2d;
    if (base->copy_d2h) op_wrapped.copy_d2h = w_copy_d2h;
    if (base->synchronize) op_wrapped.synchronize = w_synchronize;
    return &op_wrapped;
}
