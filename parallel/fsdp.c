/* fsdp.c — sharded data parallel over units of parameters (see fsdp.h).
 *
 * Buffers per rank:
 *   master[local_numel], grad[local_numel]  persistent shards (each unit's
 *       s_u elements at a 16-element aligned local offset; padding stays 0)
 *   ag[2]    all-gather staging, padded unit size each: the prefetched unit
 *            lands here, then is copied into the unsharded parameter range
 *   rs[2]    reduce-scatter staging (padded send + shard recv): two gradient
 *            reductions may be in flight while the next unit's backward runs
 * With shard degree 1 none of these exist: master/grad alias the model's
 * buffers and only the replicate all-reduce remains (DDP).
 *
 * Mixed precision (cfg.compute_params set): each rank also keeps a bf16 copy of
 * its master shard (written by the optimizer's bf16 AdamW, or cast after the
 * master changed otherwise); the all-gather moves bf16 into the model's bf16
 * compute buffer, half the bytes of fp32. Gradients stay fp32 end to end, so
 * the reductions are fp32 (mixed_precision_reduce = float32).
 *
 * Allocations, one per category: the master shard with its bf16 copy
 * ("parameters"), the gradient shard ("gradients"), and the staging of both
 * all-gather and reduce-scatter slots ("communication").
 */
#include "parallel/fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* commi_now is the comm module's clock; declared here to keep comm.h public-only */
double commi_now(void);

typedef struct {
    size_t offset, numel;      /* range in the unsharded buffers */
    size_t shard;              /* s_u = ceil(numel / S) */
    size_t padded;             /* S * s_u */
    size_t local_offset;       /* in master / grad */
    size_t valid;              /* elements of the shard that are real (not padding) */
    int gathered;              /* the unsharded range holds the current parameters */
    int ag_slot;               /* staging slot of an all-gather in flight, or -1 */
    int needs_params_bwd;
    int grad_fresh;            /* no gradient reduced into the shard yet this step */
    comm_request *ar;          /* replicate all-reduce in flight */
} unit_state;

typedef struct {
    void *buf;                 /* padded unit, fp32 or bf16 (the gathered dtype) */
    comm_request *req;
    int unit;                  /* -1 = free */
    long ticket;               /* issue order, to complete the oldest first */
} ag_slot;

typedef struct {
    float *send, *recv;
    comm_request *req;
    int unit;                  /* -1 = free */
    int direct;                /* received straight into the shard (no accumulate) */
    int last;                  /* last microbatch: all-reduce over the replicate group afterwards */
} rs_slot;

struct fsdp {
    fsdp_config cfg;
    const tetra_ops *ops;
    int S, R, k;               /* shard degree, replicate degree, index in the shard group */
    unit_state *units;
    dt_tensor *tensors;
    float *master, *grad;
    uint16_t *compute;         /* bf16 copy of the master shard, or NULL (fp32 compute) */
    void *comm_mem;            /* the one staging allocation (S > 1) */
    size_t local_numel;
    size_t max_padded, max_shard;
    ag_slot ag[2];
    rs_slot rs[2];
    int rs_next;
    long ticket;
    float *scalar;             /* [1] backend memory for norms */
    fsdp_stats st;
};

int fsdp_parse_reshard(const char *s, fsdp_reshard_mode *out) {
    if (!s) return -1;
    if (!strcmp(s, "default")) *out = FSDP_RESHARD_DEFAULT;
    else if (!strcmp(s, "always")) *out = FSDP_RESHARD_ALWAYS;
    else if (!strcmp(s, "never")) *out = FSDP_RESHARD_NEVER;
    else return -1;
    return 0;
}

static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

static void timed_wait(fsdp *f, comm_request *r) {
    if (!r) return;
    double t0 = commi_now();
    comm_wait(r);
    f->st.wait_s += commi_now() - t0;
}

fsdp *fsdp_create(const fsdp_config *cfg, char *err, size_t errlen) {
    fsdp *f = calloc(1, sizeof *f);
    if (!f) {
        snprintf(err, errlen, "fsdp: out of host memory");
        return NULL;
    }
    f->cfg = *cfg;
    f->ops = cfg->ops;
    f->S = comm_group_size(cfg->shard);
    f->R = comm_group_size(cfg->replicate);
    f->k = comm_group_rank(cfg->shard);
    f->units = calloc((size_t)cfg->n_units, sizeof *f->units);
    f->tensors = calloc((size_t)(cfg->n_params > 0 ? cfg->n_params : 1), sizeof *f->tensors);
    if (!f->units || !f->tensors) {
        snprintf(err, errlen, "fsdp: out of host memory");
        fsdp_free(f);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        f->ag[i].unit = -1;
        f->rs[i].unit = -1;
    }

    /* unit layout */
    size_t local = 0;
    for (int u = 0; u < cfg->n_units; u++) {
        unit_state *x = &f->units[u];
        x->offset = cfg->unit_offset[u];
        x->numel = cfg->unit_numel[u];
        if (x->offset + x->numel > cfg->total_numel) {
            snprintf(err, errlen, "fsdp: unit %d [%zu, %zu) lies outside the %zu-element buffer", u, x->offset,
                     x->offset + x->numel, cfg->total_numel);
            fsdp_free(f);
            return NULL;
        }
        x->shard = (x->numel + (size_t)f->S - 1) / (size_t)f->S;
        x->padded = x->shard * (size_t)f->S;
        size_t lo = (size_t)f->k * x->shard;
        x->valid = lo >= x->numel ? 0 : (x->numel - lo < x->shard ? x->numel - lo : x->shard);
        if (f->S == 1) {
            x->local_offset = x->offset; /* the unsharded buffers are the shards */
        } else {
            x->local_offset = local;
            local = align16(local + x->shard);
        }
        x->ag_slot = -1;
        x->needs_params_bwd = 1;
        x->gathered = f->S == 1;
        if (x->padded > f->max_padded) f->max_padded = x->padded;
        if (x->shard > f->max_shard) f->max_shard = x->shard;
    }
    f->local_numel = f->S == 1 ? cfg->total_numel : local;

    /* each parameter's piece */
    for (int i = 0; i < cfg->n_params; i++) {
        const dt_param_decl *d = &cfg->params_decl[i];
        dt_tensor *t = &f->tensors[i];
        if (d->unit < 0 || d->unit >= cfg->n_units || d->ndim < 1 || d->ndim > DT_MAX_DIMS) {
            snprintf(err, errlen, "fsdp: parameter %s: unit %d or rank %d out of range", d->name, d->unit, d->ndim);
            fsdp_free(f);
            return NULL;
        }
        const unit_state *x = &f->units[d->unit];
        if (d->offset < x->offset || d->offset + d->numel > x->offset + x->numel) {
            snprintf(err, errlen, "fsdp: parameter %s [%zu, %zu) lies outside its unit %d", d->name, d->offset,
                     d->offset + d->numel, d->unit);
            fsdp_free(f);
            return NULL;
        }
        snprintf(t->name, sizeof t->name, "%s", d->name);
        t->dtype = TETRA_F32;
        t->ndim = d->ndim;
        t->numel = d->numel;
        t->unit = d->unit;
        for (int j = 0; j < d->ndim; j++) {
            t->shape[j] = d->shape[j];
            t->box_start[j] = 0;
            t->box_shape[j] = d->shape[j];
        }
        const size_t rel = d->offset - x->offset; /* parameter start inside the unit */
        const size_t s_lo = (size_t)f->k * x->shard, s_hi = s_lo + x->valid;
        size_t lo = rel > s_lo ? rel : s_lo, hi = rel + d->numel < s_hi ? rel + d->numel : s_hi;
        if (hi > lo) {
            t->n_pieces = 1;
            t->piece.start = lo - rel;
            t->piece.count = hi - lo;
            t->piece.local_offset = x->local_offset + (lo - s_lo);
        }
    }

    /* storage */
    const tetra_ops *ops = f->ops;
    const size_t esz = cfg->compute_params ? sizeof(uint16_t) : sizeof(float); /* gathered dtype */
    f->scalar = ops->alloc(sizeof(float));
    if (!f->scalar) goto oom;
    if (f->S == 1) {
        f->master = cfg->params;
        f->grad = cfg->grads;
        f->compute = cfg->compute_params;
    } else {
        const size_t master_bytes = align16(f->local_numel) * sizeof(float);
        f->master = ops->alloc(master_bytes + (cfg->compute_params ? f->local_numel * sizeof(uint16_t) : 0));
        if (!f->master) {
            snprintf(err, errlen, "fsdp: cannot allocate the parameter shard (%.1f MiB)",
                     (double)master_bytes / (1024.0 * 1024.0));
            goto fail;
        }
        if (cfg->compute_params) f->compute = (uint16_t *)((char *)f->master + master_bytes);
        f->grad = ops->alloc(f->local_numel * sizeof(float));
        if (!f->grad) {
            snprintf(err, errlen, "fsdp: cannot allocate the gradient shard (%.1f MiB)",
                     (double)f->local_numel * 4.0 / (1024.0 * 1024.0));
            goto fail;
        }
        ops->fill(f->master, 0.0f, f->local_numel);
        ops->fill(f->grad, 0.0f, f->local_numel);
        /* staging: 2 gather slots (padded unit, gathered dtype), 2 reduce-scatter slots
         * (padded fp32 send + fp32 shard recv); 64-byte aligned views */
        const size_t ag_b = (f->max_padded * esz + 63) & ~(size_t)63;
        const size_t snd_b = (f->max_padded * sizeof(float) + 63) & ~(size_t)63;
        const size_t rcv_b = (f->max_shard * sizeof(float) + 63) & ~(size_t)63;
        f->comm_mem = ops->alloc(2 * (ag_b + snd_b + rcv_b));
        if (!f->comm_mem) {
            snprintf(err, errlen, "fsdp: cannot allocate the communication staging (%.1f MiB)",
                     (double)(2 * (ag_b + snd_b + rcv_b)) / (1024.0 * 1024.0));
            goto fail;
        }
        char *p = f->comm_mem;
        for (int i = 0; i < 2; i++) {
            f->ag[i].buf = p;
            p += ag_b;
            f->rs[i].send = (float *)p;
            p += snd_b;
            f->rs[i].recv = (float *)p;
            p += rcv_b;
        }
    }
    return f;
oom:
    snprintf(err, errlen, "fsdp: cannot allocate a 4-byte scalar");
fail:
    fsdp_free(f);
    return NULL;
}

void fsdp_free(fsdp *f) {
    if (!f) return;
    /* nothing may still be writing into the buffers (e.g. a prefetch nobody used) */
    if (f->units) {
        for (int i = 0; i < 2; i++) {
            if (f->ag[i].unit >= 0) comm_wait(f->ag[i].req);
            if (f->rs[i].unit >= 0) comm_wait(f->rs[i].req);
        }
        for (int u = 0; u < f->cfg.n_units; u++)
            if (f->units[u].ar) comm_wait(f->units[u].ar);
    }
    const tetra_ops *ops = f->ops;
    if (ops) {
        if (f->S > 1) {
            if (f->master) ops->release(f->master);
            if (f->grad) ops->release(f->grad);
            if (f->comm_mem) ops->release(f->comm_mem);
        }
        if (f->scalar) ops->release(f->scalar);
    }
    free(f->units);
    free(f->tensors);
    free(f);
}

int fsdp_shard_degree(const fsdp *f) { return f->S; }
int fsdp_replicate_degree(const fsdp *f) { return f->R; }
float *fsdp_master(fsdp *f) { return f->master; }
float *fsdp_grad(fsdp *f) { return f->grad; }
uint16_t *fsdp_compute_shard(fsdp *f) { return f->compute; }
size_t fsdp_local_numel(const fsdp *f) { return f->local_numel; }
const dt_tensor *fsdp_tensors(const fsdp *f) { return f->tensors; }

int fsdp_reshards_after_forward(const fsdp *f, int u) {
    if (f->S == 1) return 0;
    switch (f->cfg.reshard) {
    case FSDP_RESHARD_ALWAYS: return 1;
    case FSDP_RESHARD_NEVER: return 0;
    case FSDP_RESHARD_DEFAULT:
        /* TorchTitan: reshard unless pipeline parallel; the last unit (norm + output)
         * never, since backward would gather it again at once */
        return !f->cfg.pipeline_parallel && u != f->cfg.n_units - 1;
    }
    return 1;
}

void fsdp_set_backward_needs_params(fsdp *f, int u, int needs) {
    if (u >= 0 && u < f->cfg.n_units) f->units[u].needs_params_bwd = needs != 0;
}

/* ----------------------------------------------------------------------------
 * all-gather */

static void ag_complete(fsdp *f, int s) {
    ag_slot *slot = &f->ag[s];
    if (slot->unit < 0) return;
    timed_wait(f, slot->req);
    unit_state *x = &f->units[slot->unit];
    if (f->compute)
        f->ops->copy(f->cfg.compute_params + x->offset, slot->buf, x->numel * sizeof(uint16_t));
    else
        f->ops->copy(f->cfg.params + x->offset, slot->buf, x->numel * sizeof(float));
    x->gathered = 1;
    x->ag_slot = -1;
    slot->unit = -1;
    slot->req = NULL;
}

static void ag_start(fsdp *f, int u) {
    if (u < 0 || u >= f->cfg.n_units || f->S == 1) return;
    unit_state *x = &f->units[u];
    if (x->gathered || x->ag_slot >= 0) return;
    int s = f->ag[0].unit < 0 ? 0 : f->ag[1].unit < 0 ? 1 : -1;
    if (s < 0) {
        s = f->ag[0].ticket < f->ag[1].ticket ? 0 : 1; /* both busy: finish the older */
        ag_complete(f, s);
    }
    ag_slot *slot = &f->ag[s];
    if (f->compute)
        comm_all_gather(f->cfg.shard, slot->buf, f->compute + x->local_offset, x->shard, COMM_BF16, &slot->req);
    else
        comm_all_gather(f->cfg.shard, slot->buf, f->master + x->local_offset, x->shard, COMM_F32, &slot->req);
    slot->unit = u;
    slot->ticket = ++f->ticket;
    x->ag_slot = s;
    f->st.all_gathers++;
}

static void unshard(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    if (f->S == 1 || x->gathered) return;
    if (x->ag_slot < 0) ag_start(f, u);
    ag_complete(f, x->ag_slot);
}

static void reshard(fsdp *f, int u) {
    if (f->S == 1) return;
    unit_state *x = &f->units[u];
    if (x->ag_slot >= 0) ag_complete(f, x->ag_slot);
    x->gathered = 0;
}

/* Let MPI move the operations in flight along (it progresses only inside calls). */
static void progress(fsdp *f) {
    for (int i = 0; i < 2; i++) {
        if (f->ag[i].unit >= 0) comm_test(f->ag[i].req);
        if (f->rs[i].unit >= 0) comm_test(f->rs[i].req);
    }
}

/* ----------------------------------------------------------------------------
 * reduce-scatter and the replicate all-reduce */

static void replicate_all_reduce(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    if (f->R == 1) return;
    size_t n = f->S == 1 ? x->numel : x->shard;
    if (x->ar) timed_wait(f, x->ar);
    x->ar = NULL;
    comm_all_reduce(f->cfg.replicate, f->grad + x->local_offset, n, COMM_F32, COMM_SUM, &x->ar);
    f->st.all_reduces++;
}

static void rs_complete(fsdp *f, int s) {
    rs_slot *slot = &f->rs[s];
    if (slot->unit < 0) return;
    timed_wait(f, slot->req);
    unit_state *x = &f->units[slot->unit];
    if (!slot->direct) f->ops->axpy(f->grad + x->local_offset, slot->recv, 1.0f, x->shard);
    if (slot->last) replicate_all_reduce(f, slot->unit);
    slot->unit = -1;
    slot->req = NULL;
}

void fsdp_begin_step(fsdp *f) {
    if (f->S == 1) {
        f->ops->fill(f->grad, 0.0f, f->local_numel);
    } else {
        f->ops->fill(f->grad, 0.0f, f->local_numel);
        for (int u = 0; u < f->cfg.n_units; u++) f->units[u].grad_fresh = 1;
    }
}

void fsdp_pre_forward(fsdp *f, int u) {
    if (f->S == 1) return;
    progress(f);
    unshard(f, u);
    ag_start(f, u + 1); /* prefetch: runs while unit u computes */
}

void fsdp_post_forward(fsdp *f, int u) {
    if (fsdp_reshards_after_forward(f, u)) reshard(f, u);
}

void fsdp_pre_backward(fsdp *f, int u) {
    if (f->S == 1) return;
    progress(f);
    unit_state *x = &f->units[u];
    if (x->needs_params_bwd) unshard(f, u);
    for (int v = u - 1; v >= 0; v--) { /* prefetch the next unit backward that reads its parameters */
        if (f->units[v].needs_params_bwd) {
            ag_start(f, v);
            break;
        }
    }
    f->ops->fill(f->cfg.grads + x->offset, 0.0f, x->numel); /* the model accumulates (+=) */
}

void fsdp_post_backward(fsdp *f, int u, int last_microbatch) {
    unit_state *x = &f->units[u];
    if (f->S == 1) {
        if (last_microbatch) replicate_all_reduce(f, u);
        return;
    }
    const int s = f->rs_next;
    f->rs_next ^= 1;
    rs_slot *slot = &f->rs[s];
    rs_complete(f, s);
    const tetra_ops *ops = f->ops;
    ops->copy(slot->send, f->cfg.grads + x->offset, x->numel * sizeof(float));
    if (x->padded > x->numel) ops->fill(slot->send + x->numel, 0.0f, x->padded - x->numel);
    slot->direct = x->grad_fresh;
    x->grad_fresh = 0;
    float *recv = slot->direct ? f->grad + x->local_offset : slot->recv;
    comm_reduce_scatter(f->cfg.shard, recv, slot->send, x->shard, COMM_F32, COMM_SUM, &slot->req);
    slot->unit = u;
    slot->last = last_microbatch;
    f->st.reduce_scatters++;
    reshard(f, u); /* parameters are not needed again this step */
}

void fsdp_finish_grads(fsdp *f) {
    if (f->S > 1) {
        /* oldest first */
        rs_complete(f, f->rs_next);
        rs_complete(f, f->rs_next ^ 1);
    }
    for (int u = 0; u < f->cfg.n_units; u++) {
        unit_state *x = &f->units[u];
        if (x->ar) timed_wait(f, x->ar);
        x->ar = NULL;
    }
}

double fsdp_grad_sq_norm(fsdp *f) {
    float local = 0.0f;
    f->ops->fill(f->scalar, 0.0f, 1);
    f->ops->sum_squares(f->scalar, f->grad, f->local_numel);
    f->ops->copy_d2h(&local, f->scalar, sizeof local);
    /* replicas hold identical shards after the all-reduce: count each shard once */
    if (f->S == 1) return (double)local;
    return comm_all_reduce_f64(f->cfg.shard, (double)local, COMM_SUM);
}

void fsdp_params_updated(fsdp *f) {
    if (f->S == 1) return;
    for (int i = 0; i < 2; i++) ag_complete(f, i); /* a gather in flight carries old values */
    for (int u = 0; u < f->cfg.n_units; u++) f->units[u].gathered = 0;
}

void fsdp_master_changed(fsdp *f) {
    if (f->compute) f->ops->cast_f32_to_bf16(f->compute, f->master, f->local_numel);
    fsdp_params_updated(f);
}

void fsdp_reshard_all(fsdp *f) {
    for (int u = 0; u < f->cfg.n_units; u++) reshard(f, u);
}

int fsdp_init_shards(fsdp *f, fsdp_fill_fn fill, void *user) {
    const size_t chunk = (size_t)1 << 20;
    float *host = malloc(chunk * sizeof(float));
    if (!host) return -1;
    for (int i = 0; i < f->cfg.n_params; i++) {
        const dt_tensor *t = &f->tensors[i];
        if (!t->n_pieces) continue;
        for (size_t c = 0; c < t->piece.count; c += chunk) {
            size_t cnt = t->piece.count - c < chunk ? t->piece.count - c : chunk;
            fill(user, i, t->piece.start + c, cnt, host);
            f->ops->copy_h2d(f->master + t->piece.local_offset + c, host, cnt * sizeof(float));
        }
    }
    free(host);
    fsdp_master_changed(f);
    return 0;
}

void fsdp_shard_from_unsharded(fsdp *f) {
    if (f->S == 1) {
        fsdp_master_changed(f);
        return;
    }
    for (int u = 0; u < f->cfg.n_units; u++) {
        unit_state *x = &f->units[u];
        if (x->valid)
            f->ops->copy(f->master + x->local_offset, f->cfg.params + x->offset + (size_t)f->k * x->shard,
                         x->valid * sizeof(float));
    }
    /* the compute copy is gathered again from the shards before its next use */
    fsdp_master_changed(f);
}

fsdp_memory fsdp_memory_report(const fsdp *f) {
    fsdp_memory m;
    memset(&m, 0, sizeof m);
    m.param_bytes = f->local_numel * sizeof(float);
    m.compute_bytes = f->compute ? f->local_numel * sizeof(uint16_t) : 0;
    m.grad_bytes = f->local_numel * sizeof(float);
    m.optim_bytes = 2 * f->local_numel * sizeof(float);
    for (int u = 0; u < f->cfg.n_units; u++)
        if (f->units[u].numel * sizeof(float) > m.max_unit_bytes) m.max_unit_bytes = f->units[u].numel * sizeof(float);
    if (f->S > 1) {
        m.gather_bytes = 2 * f->max_padded * (f->compute ? sizeof(uint16_t) : sizeof(float));
        m.reduce_bytes = 2 * (f->max_padded + f->max_shard) * sizeof(float);
        m.unsharded_bytes = 2 * f->cfg.total_numel * sizeof(float) +
                            (f->compute ? f->cfg.total_numel * sizeof(uint16_t) : 0);
    }
    return m;
}

fsdp_stats fsdp_get_stats(const fsdp *f) { return f->st; }
