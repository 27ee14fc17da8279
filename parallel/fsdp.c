/* fsdp.c — sharded data parallel over units of parameters (see fsdp.h).
 *
 * Buffers per rank, one allocation per category:
 *   "parameters"  master[local] fp32 shard and, under mixed precision, its bf16
 *                 copy compute[local] (each unit's s_u elements at a 16-element
 *                 aligned local offset; padding stays 0)
 *   "gradients"   grad[local] fp32 shard
 *   "working parameters"  each resident unit's padded buffer, then two rotating
 *                 slots of the largest transient unit (compute dtype)
 *   "working gradients"   two rotating padded fp32 buffers of the largest unit,
 *                 or (reduce_at_last_microbatch) one padded buffer per unit (in the
 *                 caller's memory with external_work_grads)
 *   "reduce staging"      two shard-sized fp32 receive buffers: a reduce-scatter
 *                 into a shard that already holds this step's gradient lands
 *                 there and is added
 * With shard degree 1 there are no working buffers: master, its bf16 copy and
 * grad cover the whole layout and stay bound; only the replicate all-reduce
 * remains (DDP).
 *
 * Every decision (which slot, whether to prefetch) depends only on the sequence
 * of hook calls, which is the same on every rank of the shard group, so all
 * ranks issue the same collectives in the same order.
 */
#include "parallel/fsdp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* commi_now is the comm module's clock; declared here to keep comm.h public-only */
double commi_now(void);

#define N_PSLOTS 2
#define N_GSLOTS 2
#define N_RS 2
#define N_CODED 2 /* coded all-gathers in flight at once (staging buffers) */

typedef struct {
    size_t offset, numel; /* range in the flat index space */
    size_t shard;         /* s_u = ceil(numel / S) */
    size_t padded;        /* S * s_u */
    size_t local_offset;  /* in master / grad */
    size_t valid;         /* elements of the shard that are real (not padding) */
    int resident;         /* own working parameter buffer (kept gathered after forward) */
    void *own_params;     /* resident: [padded] compute dtype */
    float *own_grads;     /* reduce_at_last_microbatch: [padded] fp32 */
    int pslot;            /* transient: the parameter slot holding it, or -1 */
    int gathered;         /* unit_params[u] holds the current parameters */
    comm_request *ag;     /* all-gather in flight into its buffer */
    int pinned;           /* between a pre-hook and its post-hook: its slot may not be taken */
    int gslot;            /* gradient slot bound (rotating mode), or -1 */
    int grads_bound;      /* unit_grads[u] set */
    int grad_fresh;       /* nothing reduced into the shard yet this step */
    int needs_params_bwd;
    comm_request *ar; /* replicate all-reduce in flight */
    /* coded all-gather (fsdp_enable_coded_gather): the unit holds coded parameters; each
     * rank's block is blk bytes: the codes of its shard (codec->bytes per element), then (at
     * align16(shard * codec->bytes)) hp_pad elements in the compute dtype for its other
     * parameters */
    int coded;
    size_t blk, hp_pad;
    int cgslot; /* the staging slot of its gather in flight, or -1 */
} unit_state;

typedef struct {
    uint8_t *send; /* [max blk] this rank's block */
    uint8_t *recv; /* [S * max blk] every rank's */
    int unit;      /* -1 = free */
} coded_slot;

typedef struct {
    void *buf; /* [max padded transient unit], compute dtype */
    int unit;  /* -1 = free */
    long used; /* last time it was bound, to evict the least recent */
} pslot;

typedef struct {
    float *buf; /* [max padded unit] fp32 */
    int unit;   /* -1 = free (a unit whose reduce-scatter is in flight still holds it) */
} gslot;

typedef struct {
    float *recv; /* [max shard] */
    comm_request *req;
    int unit;   /* -1 = free */
    int direct; /* received straight into the shard (no accumulate) */
    int last;   /* last microbatch: all-reduce over the replicate group afterwards */
    long ticket;
} rs_slot;

struct fsdp {
    fsdp_config cfg;
    const tetra_ops *ops;
    int S, R, k;          /* shard degree, replicate degree, index in the shard group */
    int tp_size, tp_rank; /* tensor parallel */
    size_t esz;           /* bytes of a gathered element */
    unit_state *units;
    dt_tensor *tensors;
    float *master, *grad; /* backend memory; master: under offload the device's fp32 copy, or NULL */
    uint16_t *compute;    /* bf16 copy of the master shard (or the whole layout at S = 1), or NULL */
    float *host_master;   /* offload: the master shard in page-locked host memory */
    void *host_stage;     /* offload: two units' gradients (fp32) and updated parameters (compute dtype) */
    size_t max_range;     /* offload: the largest unit range of the local shard */
    void *param_mem, *work_param_mem, *work_grad_mem; /* the allocations */
    float *grad_mem, *rs_mem;
    size_t local_numel;
    size_t max_padded, max_transient_padded, max_shard;
    pslot ps[N_PSLOTS];
    gslot gs[N_GSLOTS];
    rs_slot rs[N_RS];
    long clock, ticket;
    float *scalar; /* [1] backend memory for norms */
    /* coded all-gather */
    const fsdp_gather_codec *codec;
    char *cg_param; /* [n_params] 1: travels coded */
    int *cg_order;  /* [n_params] parameter indices by unit, then offset */
    coded_slot cgs[N_CODED];
    void *cg_mem;
    fsdp_memory mem;
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
static size_t align64b(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static void timed_wait(fsdp *f, comm_request *r) {
    if (!r) return;
    double t0 = commi_now();
    comm_wait(r);
    f->st.wait_s += commi_now() - t0;
}

static int reshards_after_forward(const fsdp_config *c, int S, int u) {
    if (S == 1) return 0;
    switch (c->reshard) {
    case FSDP_RESHARD_ALWAYS: return 1;
    case FSDP_RESHARD_NEVER: return 0;
    case FSDP_RESHARD_DEFAULT:
        /* TorchTitan: reshard unless pipeline parallel; the last unit (norm + output)
         * never, since backward would gather it again at once */
        return !c->pipeline_parallel && u != c->n_units - 1;
    }
    return 1;
}

int fsdp_reshards_after_forward(const fsdp *f, int u) { return reshards_after_forward(&f->cfg, f->S, u); }

static void *unit_buf_params(const fsdp *f, int u) {
    const unit_state *x = &f->units[u];
    if (f->S == 1) return f->compute ? (void *)(f->compute + x->offset) : (void *)(f->master + x->offset);
    return x->resident ? x->own_params : x->pslot >= 0 ? f->ps[x->pslot].buf : NULL;
}

/* Each unit's shard size, padding and local offset, and the largest sizes the buffers are cut to. */
static void layout_units(fsdp *f) {
    const fsdp_config *cfg = &f->cfg;
    size_t local = 0, total = 0;
    for (int u = 0; u < cfg->n_units; u++) {
        unit_state *x = &f->units[u];
        x->offset = cfg->unit_offset[u];
        x->numel = cfg->unit_numel[u];
        if (x->offset + x->numel > total) total = x->offset + x->numel;
        x->shard = (x->numel + (size_t)f->S - 1) / (size_t)f->S;
        x->padded = x->shard * (size_t)f->S;
        size_t lo = (size_t)f->k * x->shard;
        x->valid = lo >= x->numel ? 0 : (x->numel - lo < x->shard ? x->numel - lo : x->shard);
        if (f->S == 1) {
            x->local_offset = x->offset; /* the whole layout is the shard */
        } else {
            x->local_offset = local;
            local = align16(local + x->shard);
        }
        x->pslot = -1;
        x->gslot = -1;
        x->cgslot = -1;
        x->needs_params_bwd = 1;
        x->resident = f->S > 1 && !reshards_after_forward(cfg, f->S, u);
        if (x->padded > f->max_padded) f->max_padded = x->padded;
        if (!x->resident && x->padded > f->max_transient_padded) f->max_transient_padded = x->padded;
        if (x->shard > f->max_shard) f->max_shard = x->shard;
    }
    f->local_numel = f->S == 1 ? total : local;
}

/* Parameter i's tensor: its shape and box, and its piece — the part of its box that falls in this
 * rank's shard. */
static int place_param(fsdp *f, int i, char *err, size_t errlen) {
    const fsdp_config *cfg = &f->cfg;
    const dt_param_decl *d = &cfg->params_decl[i];
    dt_tensor *t = &f->tensors[i];
    if (d->unit < 0 || d->unit >= cfg->n_units || d->ndim < 1 || d->ndim > DT_MAX_DIMS) {
        snprintf(err, errlen, "fsdp: parameter %s: unit %d or rank %d out of range", d->name, d->unit, d->ndim);
        return -1;
    }
    const unit_state *x = &f->units[d->unit];
    if (d->offset < x->offset || d->offset + d->numel > x->offset + x->numel) {
        snprintf(err, errlen, "fsdp: parameter %s [%zu, %zu) lies outside its unit %d", d->name, d->offset,
                 d->offset + d->numel, d->unit);
        return -1;
    }
    snprintf(t->name, sizeof t->name, "%s", d->name);
    t->dtype = TETRA_F32;
    t->ndim = d->ndim;
    t->unit = d->unit;
    size_t numel = 1, box = 1;
    for (int j = 0; j < d->ndim; j++) {
        t->shape[j] = d->shape[j];
        t->box_start[j] = d->box_shape[0] ? d->box_start[j] : 0;
        t->box_shape[j] = d->box_shape[0] ? d->box_shape[j] : d->shape[j];
        numel *= (size_t)d->shape[j];
        box *= (size_t)t->box_shape[j];
    }
    t->numel = numel;
    if (box != d->numel) {
        snprintf(err, errlen, "fsdp: parameter %s: its box holds %zu elements but %zu are declared", d->name, box,
                 d->numel);
        return -1;
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
    return 0;
}

/* Offload staging: buffer b (0 or 1) holds one unit's gradient, then its updated parameters. */
static size_t stage_bytes(const fsdp *f) {
    return align64b(f->max_range * sizeof(float)) + align64b(f->max_range * f->esz);
}
static float *stage_grad(const fsdp *f, int b) { return (float *)((char *)f->host_stage + (size_t)b * stage_bytes(f)); }
static void *stage_params(const fsdp *f, int b) {
    return (char *)f->host_stage + (size_t)b * stage_bytes(f) + align64b(f->max_range * sizeof(float));
}

/* The memory plan (f->mem): shard, optimizer and, at S > 1, working and staging bytes. */
static void plan_memory(fsdp *f) {
    const fsdp_config *cfg = &f->cfg;
    const int mixed = cfg->compute_dtype == TETRA_BF16;
    fsdp_memory *mr = &f->mem;
    mr->param_bytes = f->local_numel * sizeof(float);
    mr->compute_bytes = mixed ? f->local_numel * sizeof(uint16_t) : 0;
    if (cfg->offload) {
        for (int u = 0; u < cfg->n_units; u++) {
            const size_t n = f->S == 1 ? f->units[u].numel : f->units[u].shard;
            if (n > f->max_range) f->max_range = n;
        }
        mr->compute_bytes = f->local_numel * f->esz;
        mr->host_bytes = align64b(mr->param_bytes) + 2 * stage_bytes(f);
    }
    mr->grad_bytes = f->local_numel * sizeof(float);
    mr->optim_bytes = 2 * f->local_numel * sizeof(float);
    for (int u = 0; u < cfg->n_units; u++) {
        const unit_state *x = &f->units[u];
        if (x->numel * sizeof(float) > mr->max_unit_bytes) mr->max_unit_bytes = x->numel * sizeof(float);
    }
    if (f->S == 1) return;
    size_t work_p = 0, work_g = 0;
    for (int u = 0; u < cfg->n_units; u++) {
        const unit_state *x = &f->units[u];
        if (x->resident) {
            work_p += align64b(x->padded * f->esz);
            mr->resident_units++;
        }
        if (cfg->reduce_at_last_microbatch) work_g += align64b(x->padded * sizeof(float));
    }
    if (f->max_transient_padded) work_p += N_PSLOTS * align64b(f->max_transient_padded * f->esz);
    if (!cfg->reduce_at_last_microbatch) work_g += N_GSLOTS * align64b(f->max_padded * sizeof(float));
    mr->work_param_bytes = work_p;
    mr->work_grad_bytes = work_g;
    mr->reduce_bytes = N_RS * align64b(f->max_shard * sizeof(float));
}

/* Offload: the device keeps the shard in the compute dtype, the host the fp32 master and
 * one unit's staging. */
static int alloc_offloaded(fsdp *f, char *err, size_t errlen) {
    const tetra_ops *ops = f->ops;
    f->param_mem = ops->alloc(f->mem.compute_bytes);
    f->host_master = ops->host_alloc ? ops->host_alloc(f->local_numel * sizeof(float) + 4) : NULL;
    f->host_stage = ops->host_alloc ? ops->host_alloc(2 * stage_bytes(f)) : NULL;
    if (!f->param_mem || !f->host_master || !f->host_stage) {
        snprintf(err, errlen,
                 "fsdp: cannot allocate the offloaded shards (%.1f MiB of page-locked host memory, "
                 "%.1f MiB on the device)",
                 (double)f->mem.host_bytes / 1048576.0, (double)f->mem.compute_bytes / 1048576.0);
        return -1;
    }
    if (f->cfg.compute_dtype == TETRA_BF16) f->compute = f->param_mem;
    else f->master = f->param_mem;
    memset(f->host_master, 0, f->local_numel * sizeof(float));
    if (f->master) ops->fill(f->master, 0.0f, f->local_numel);
    return 0;
}

/* The norm scalar, the master shard (with its bf16 copy under mixed precision) and the gradient shard,
 * zeroed. */
static int alloc_shards(fsdp *f, char *err, size_t errlen) {
    const tetra_ops *ops = f->ops;
    f->scalar = ops->alloc(sizeof(float));
    if (!f->scalar) {
        snprintf(err, errlen, "fsdp: cannot allocate a 4-byte scalar");
        return -1;
    }
    const size_t master_b = align64b(f->local_numel * sizeof(float));
    if (f->cfg.offload) {
        if (alloc_offloaded(f, err, errlen)) return -1;
    } else {
        f->param_mem = ops->alloc(master_b + f->mem.compute_bytes);
    }
    f->grad_mem = ops->alloc(f->local_numel * sizeof(float) + 4);
    if (!f->param_mem || !f->grad_mem) {
        snprintf(err, errlen, "fsdp: cannot allocate the parameter and gradient %s (%.1f MiB each)",
                 f->S > 1 ? "shards" : "buffers", (double)f->local_numel * 4.0 / (1024.0 * 1024.0));
        return -1;
    }
    if (!f->cfg.offload) {
        f->master = f->param_mem;
        if (f->cfg.compute_dtype == TETRA_BF16) f->compute = (uint16_t *)((char *)f->param_mem + master_b);
        ops->fill(f->master, 0.0f, f->local_numel);
    }
    f->grad = f->grad_mem;
    ops->fill(f->grad, 0.0f, f->local_numel);
    return 0;
}

/* Cut the working allocations (S > 1) into the resident units' buffers, the parameter and gradient
 * slots and the reduce staging buffers, in the order plan_memory counted them. */
static void carve_working(fsdp *f, int external) {
    const fsdp_config *cfg = &f->cfg;
    char *p = f->work_param_mem;
    for (int u = 0; u < cfg->n_units; u++) {
        unit_state *x = &f->units[u];
        if (!x->resident) continue;
        x->own_params = p;
        p += align64b(x->padded * f->esz);
    }
    if (f->max_transient_padded)
        for (int i = 0; i < N_PSLOTS; i++) {
            f->ps[i].buf = p;
            p += align64b(f->max_transient_padded * f->esz);
        }
    char *g = f->work_grad_mem;
    if (cfg->reduce_at_last_microbatch) {
        if (!external) fsdp_set_work_grads(f, g);
    } else {
        for (int i = 0; i < N_GSLOTS; i++) {
            f->gs[i].buf = (float *)g;
            g += align64b(f->max_padded * sizeof(float));
        }
    }
    char *r = (char *)f->rs_mem;
    for (int i = 0; i < N_RS; i++) {
        f->rs[i].recv = (float *)r;
        r += align64b(f->max_shard * sizeof(float));
    }
}

/* The working buffers of S > 1 (working gradients live in the caller's memory with
 * external_work_grads). */
static int alloc_working(fsdp *f, char *err, size_t errlen) {
    const fsdp_config *cfg = &f->cfg;
    const tetra_ops *ops = f->ops;
    const fsdp_memory *mr = &f->mem;
    const size_t work_p = mr->work_param_bytes, work_g = mr->work_grad_bytes;
    f->work_param_mem = work_p ? ops->alloc(work_p) : NULL;
    const int external = cfg->reduce_at_last_microbatch && cfg->external_work_grads;
    f->work_grad_mem = work_g && !external ? ops->alloc(work_g) : NULL;
    f->rs_mem = ops->alloc(mr->reduce_bytes);
    if ((work_p && !f->work_param_mem) || (work_g && !external && !f->work_grad_mem) || !f->rs_mem) {
        snprintf(err, errlen,
                 "fsdp: cannot allocate the working buffers (%.1f MiB parameters, %.1f MiB "
                 "gradients, %.1f MiB staging)",
                 (double)work_p / 1048576.0, (double)work_g / 1048576.0, (double)mr->reduce_bytes / 1048576.0);
        return -1;
    }
    carve_working(f, external);
    return 0;
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
    f->tp_size = cfg->tp ? comm_group_size(cfg->tp) : 1;
    f->tp_rank = cfg->tp ? comm_group_rank(cfg->tp) : 0;
    f->esz = cfg->compute_dtype == TETRA_BF16 ? sizeof(uint16_t) : sizeof(float);
    f->units = calloc((size_t)(cfg->n_units > 0 ? cfg->n_units : 1), sizeof *f->units);
    f->tensors = calloc((size_t)(cfg->n_params > 0 ? cfg->n_params : 1), sizeof *f->tensors);
    if (!f->units || !f->tensors) {
        snprintf(err, errlen, "fsdp: out of host memory");
        fsdp_free(f);
        return NULL;
    }
    for (int i = 0; i < N_PSLOTS; i++) f->ps[i].unit = -1;
    for (int i = 0; i < N_GSLOTS; i++) f->gs[i].unit = -1;
    for (int i = 0; i < N_RS; i++) f->rs[i].unit = -1;
    for (int i = 0; i < N_CODED; i++) f->cgs[i].unit = -1;

    layout_units(f);
    for (int i = 0; i < cfg->n_params; i++)
        if (place_param(f, i, err, errlen)) goto fail;
    plan_memory(f);
    if (cfg->plan_only) return f;

    /* storage */
    if (alloc_shards(f, err, errlen)) goto fail;
    if (f->S > 1 && alloc_working(f, err, errlen)) goto fail;
    /* the caller's tables: nothing gathered yet (S > 1), or bound for good (S = 1) */
    for (int u = 0; u < cfg->n_units; u++) {
        f->units[u].gathered = f->S == 1;
        cfg->unit_params[u] = f->S == 1 ? unit_buf_params(f, u) : NULL;
        cfg->unit_grads[u] = f->S == 1 ? f->grad + f->units[u].offset : NULL;
        f->units[u].grads_bound = f->S == 1;
    }
    return f;
fail:
    fsdp_free(f);
    return NULL;
}

void fsdp_set_work_grads(fsdp *f, void *mem) {
    if (f->S == 1 || !f->cfg.reduce_at_last_microbatch) return;
    char *g = mem;
    for (int u = 0; u < f->cfg.n_units; u++) {
        f->units[u].own_grads = (float *)g;
        g += align64b(f->units[u].padded * sizeof(float));
    }
}

void fsdp_free(fsdp *f) {
    if (!f) return;
    /* nothing may still be writing into the buffers (e.g. a prefetch nobody used) */
    if (f->units && !f->cfg.plan_only) {
        for (int u = 0; u < f->cfg.n_units; u++) {
            if (f->units[u].ag) comm_wait(f->units[u].ag);
            if (f->units[u].ar) comm_wait(f->units[u].ar);
        }
        for (int i = 0; i < N_RS; i++)
            if (f->rs[i].unit >= 0) comm_wait(f->rs[i].req);
    }
    const tetra_ops *ops = f->ops;
    if (ops) {
        if (f->param_mem) ops->release(f->param_mem);
        if (f->grad_mem) ops->release(f->grad_mem);
        if (f->work_param_mem) ops->release(f->work_param_mem);
        if (f->work_grad_mem) ops->release(f->work_grad_mem);
        if (f->rs_mem) ops->release(f->rs_mem);
        if (f->scalar) ops->release(f->scalar);
        if (f->cg_mem) ops->release(f->cg_mem);
        if (f->host_master) ops->host_release(f->host_master);
        if (f->host_stage) ops->host_release(f->host_stage);
    }
    free(f->cg_param);
    free(f->cg_order);
    free(f->units);
    free(f->tensors);
    free(f);
}

int fsdp_shard_degree(const fsdp *f) { return f->S; }
int fsdp_replicate_degree(const fsdp *f) { return f->R; }
float *fsdp_master(fsdp *f) { return f->cfg.offload ? f->host_master : f->master; }
float *fsdp_device_master(fsdp *f) { return f->master; }
int fsdp_offloaded(const fsdp *f) { return f->cfg.offload; }
float *fsdp_grad(fsdp *f) { return f->grad; }
uint16_t *fsdp_compute_shard(fsdp *f) { return f->compute; }
size_t fsdp_local_numel(const fsdp *f) { return f->local_numel; }
const dt_tensor *fsdp_tensors(const fsdp *f) { return f->tensors; }

void fsdp_set_backward_needs_params(fsdp *f, int u, int needs) {
    if (u >= 0 && u < f->cfg.n_units) f->units[u].needs_params_bwd = needs != 0;
}

/* ----------------------------------------------------------------------------
 * all-gather into working buffers */

static void unbind_params(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    if (x->ag) timed_wait(f, x->ag); /* a gather in flight still writes the buffer */
    x->ag = NULL;
    if (x->cgslot >= 0) { /* its codes are not needed: the unit is dropped */
        f->cgs[x->cgslot].unit = -1;
        x->cgslot = -1;
    }
    x->gathered = 0;
    f->cfg.unit_params[u] = NULL;
    if (x->pslot >= 0) {
        f->ps[x->pslot].unit = -1;
        x->pslot = -1;
    }
}

/* A parameter slot for transient unit u: a free one, else (evict) the least recently
 * used one whose unit is not pinned; -1 when none may be taken. */
static int take_pslot(fsdp *f, int u, int evict) {
    int best = -1;
    for (int i = 0; i < N_PSLOTS; i++)
        if (f->ps[i].unit < 0) {
            best = i;
            break;
        }
    if (best < 0 && evict) {
        for (int i = 0; i < N_PSLOTS; i++) {
            const int v = f->ps[i].unit;
            if (f->units[v].pinned) continue;
            if (best < 0 || f->ps[i].used < f->ps[best].used) best = i;
        }
        if (best >= 0) unbind_params(f, f->ps[best].unit);
    }
    if (best >= 0) {
        f->ps[best].unit = u;
        f->ps[best].used = ++f->clock;
        f->units[u].pslot = best;
    }
    return best;
}

/* ---- coded all-gather: pack this rank's block, unpack every rank's ---- */

/* The part [lo, hi) of unit-relative range [o, o + n) that lies in rank r's shard. */
static int piece_of(const unit_state *x, size_t o, size_t n, int r, size_t *lo, size_t *hi) {
    const size_t s_lo = (size_t)r * x->shard, s_hi = s_lo + x->shard < x->numel ? s_lo + x->shard : x->numel;
    *lo = o > s_lo ? o : s_lo;
    *hi = o + n < s_hi ? o + n : s_hi;
    return *hi > *lo;
}

static void coded_pack(fsdp *f, int u, uint8_t *send) {
    const unit_state *x = &f->units[u];
    const size_t cb = (size_t)f->codec->bytes;
    uint8_t *hp = send + align16(x->shard * cb);
    size_t cur = 0;
    for (int j = 0; j < f->cfg.n_params; j++) {
        const int i = f->cg_order[j];
        const dt_param_decl *d = &f->cfg.params_decl[i];
        if (d->unit != u) continue;
        size_t lo, hi;
        if (!piece_of(x, d->offset - x->offset, d->numel, f->k, &lo, &hi)) continue;
        const size_t n = hi - lo, local = x->local_offset + (lo - (size_t)f->k * x->shard);
        /* what the compute copy holds, as a plain gather would send it */
        const void *src = f->compute ? (const void *)(f->compute + local) : (const void *)(f->master + local);
        if (f->cg_param[i]) {
            f->codec->encode(f->codec, i, send + (lo - (size_t)f->k * x->shard) * cb, src,
                             f->compute ? TETRA_BF16 : TETRA_F32, n);
        } else {
            f->ops->copy(hp + cur * f->esz, src, n * f->esz);
            cur += n;
        }
    }
}

static void coded_unpack(fsdp *f, int u, const uint8_t *recv, void *buf) {
    const unit_state *x = &f->units[u];
    const size_t cb = (size_t)f->codec->bytes;
    for (int r = 0; r < f->S; r++) {
        const uint8_t *blk = recv + (size_t)r * x->blk, *hp = blk + align16(x->shard * cb);
        size_t cur = 0;
        for (int j = 0; j < f->cfg.n_params; j++) {
            const int i = f->cg_order[j];
            const dt_param_decl *d = &f->cfg.params_decl[i];
            if (d->unit != u) continue;
            size_t lo, hi;
            if (!piece_of(x, d->offset - x->offset, d->numel, r, &lo, &hi)) continue;
            const size_t n = hi - lo;
            char *dst = (char *)buf + lo * f->esz;
            if (f->cg_param[i]) {
                const size_t at = d->offset - x->offset; /* the parameter's first element in the unit */
                f->codec->decode(f->codec, i, (char *)buf + at * f->esz, lo - at, f->compute ? TETRA_BF16 : TETRA_F32,
                                 blk + (lo - (size_t)r * x->shard) * cb, n);
            } else {
                f->ops->copy(dst, hp + cur * f->esz, n * f->esz);
                cur += n;
            }
        }
    }
}

/* Unit u's coded gather is done: its parameters into its buffer, its slot free. */
static void coded_complete(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    timed_wait(f, x->ag);
    x->ag = NULL;
    coded_unpack(f, u, f->cgs[x->cgslot].recv, unit_buf_params(f, u));
    f->cgs[x->cgslot].unit = -1;
    x->cgslot = -1;
    x->gathered = 1;
    f->cfg.unit_params[u] = unit_buf_params(f, u);
}

static int coded_free_slot(const fsdp *f) {
    for (int i = 0; i < N_CODED; i++)
        if (f->cgs[i].unit < 0) return i;
    return -1;
}

/* Start gathering unit u (no-op if gathered or in flight). blocking: may evict a slot;
 * returns 0 when the gather was not started (no slot free: prefetch only). */
static int ag_start(fsdp *f, int u, int blocking) {
    if (u < 0 || u >= f->cfg.n_units || f->S == 1) return 1;
    unit_state *x = &f->units[u];
    if (x->gathered || x->ag) return 1;
    int cs = -1;
    if (x->coded) { /* a staging slot first: without one a prefetch waits for a later call */
        cs = coded_free_slot(f);
        if (cs < 0 && !blocking) return 0;
        if (cs < 0) {
            coded_complete(f, f->cgs[0].unit);
            cs = 0;
        }
    }
    if (!x->resident && x->pslot < 0 && take_pslot(f, u, blocking) < 0) {
        if (!blocking) return 0;
        fprintf(stderr,
                "fsdp: unit %d needs its parameters but both working slots hold units in use (a schedule "
                "with more than two transient units in flight at once)\n",
                u);
        abort();
    }
    if (cs >= 0) {
        coded_slot *sl = &f->cgs[cs];
        coded_pack(f, u, sl->send);
        comm_all_gather(f->cfg.shard, sl->recv, sl->send, x->blk, COMM_U8, &x->ag);
        sl->unit = u;
        x->cgslot = cs;
        f->st.all_gathers++;
        return 1;
    }
    void *buf = unit_buf_params(f, u);
    if (f->compute) comm_all_gather(f->cfg.shard, buf, f->compute + x->local_offset, x->shard, COMM_BF16, &x->ag);
    else comm_all_gather(f->cfg.shard, buf, f->master + x->local_offset, x->shard, COMM_F32, &x->ag);
    f->st.all_gathers++;
    return 1;
}

static void unshard(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    if (f->S == 1 || x->gathered) {
        if (x->pslot >= 0) f->ps[x->pslot].used = ++f->clock;
        return;
    }
    ag_start(f, u, 1);
    if (x->cgslot >= 0) {
        coded_complete(f, u);
        return;
    }
    timed_wait(f, x->ag);
    x->ag = NULL;
    x->gathered = 1;
    f->cfg.unit_params[u] = unit_buf_params(f, u);
}

static void reshard(fsdp *f, int u) {
    if (f->S == 1) return;
    unbind_params(f, u);
}

/* Let MPI move the operations in flight along (it progresses only inside calls). */
static void progress(fsdp *f) {
    for (int u = 0; u < f->cfg.n_units; u++)
        if (f->units[u].ag) comm_test(f->units[u].ag);
    for (int i = 0; i < N_RS; i++)
        if (f->rs[i].unit >= 0) comm_test(f->rs[i].req);
}

/* ----------------------------------------------------------------------------
 * gradients: reduce-scatter and the replicate all-reduce */

static void replicate_all_reduce(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    if (f->R == 1) return;
    size_t n = f->S == 1 ? x->numel : x->shard;
    if (x->ar) timed_wait(f, x->ar);
    x->ar = NULL;
    comm_all_reduce(f->cfg.replicate, f->grad + x->local_offset, n, COMM_F32, COMM_SUM, &x->ar);
    f->st.all_reduces++;
}

/* The partial gradients of the unit's replicated parameters, summed over tensor parallel:
 * the pieces of the shard (or, at shard degree 1, the whole parameters). */
static void tp_reduce_replicated(fsdp *f, int u) {
    if (f->tp_size == 1) return;
    for (int i = 0; i < f->cfg.n_params; i++) {
        const dt_param_decl *d = &f->cfg.params_decl[i];
        if (d->unit != u || !d->replicated) continue;
        const dt_tensor *t = &f->tensors[i];
        if (f->S == 1) comm_all_reduce(f->cfg.tp, f->grad + d->offset, d->numel, COMM_F32, COMM_SUM, NULL);
        else if (t->n_pieces)
            comm_all_reduce(f->cfg.tp, f->grad + t->piece.local_offset, t->piece.count, COMM_F32, COMM_SUM, NULL);
        f->st.all_reduces++;
    }
}

static void rs_complete(fsdp *f, int s) {
    rs_slot *slot = &f->rs[s];
    if (slot->unit < 0) return;
    timed_wait(f, slot->req);
    const int u = slot->unit;
    unit_state *x = &f->units[u];
    if (!slot->direct) f->ops->axpy(f->grad + x->local_offset, slot->recv, 1.0f, x->shard);
    if (slot->last) {
        tp_reduce_replicated(f, u);
        replicate_all_reduce(f, u);
    }
    if (x->gslot >= 0) { /* the rotating gradient buffer is free again */
        f->gs[x->gslot].unit = -1;
        x->gslot = -1;
        x->grads_bound = 0;
        f->cfg.unit_grads[u] = NULL;
    }
    slot->unit = -1;
    slot->req = NULL;
}

static int oldest_rs(const fsdp *f) {
    int best = -1;
    for (int i = 0; i < N_RS; i++)
        if (f->rs[i].unit >= 0 && (best < 0 || f->rs[i].ticket < f->rs[best].ticket)) best = i;
    return best;
}

static void rs_start(fsdp *f, int u, int last) {
    unit_state *x = &f->units[u];
    int s = -1;
    for (int i = 0; i < N_RS && s < 0; i++)
        if (f->rs[i].unit < 0) s = i;
    if (s < 0) {
        s = oldest_rs(f);
        rs_complete(f, s);
    }
    rs_slot *slot = &f->rs[s];
    float *send = f->cfg.unit_grads[u]; /* padded; the padding is zero */
    slot->direct = x->grad_fresh;
    x->grad_fresh = 0;
    float *recv = slot->direct ? f->grad + x->local_offset : slot->recv;
    comm_reduce_scatter(f->cfg.shard, recv, send, x->shard, COMM_F32, COMM_SUM, &slot->req);
    slot->unit = u;
    slot->last = last;
    slot->ticket = ++f->ticket;
    f->st.reduce_scatters++;
}

/* Bind a zeroed gradient buffer for unit u's W pass. */
static void bind_grads(fsdp *f, int u) {
    unit_state *x = &f->units[u];
    if (f->S == 1 || x->grads_bound) return;
    if (f->cfg.reduce_at_last_microbatch) {
        /* bound from the first W pass of the step to fsdp_finish_grads: the memory may have
         * been another stage's until then */
        x->grads_bound = 1;
        f->ops->fill(x->own_grads, 0.0f, x->padded);
        f->cfg.unit_grads[u] = x->own_grads;
        return;
    }
    int s = -1;
    for (;;) {
        for (int i = 0; i < N_GSLOTS && s < 0; i++)
            if (f->gs[i].unit < 0) s = i;
        if (s >= 0) break;
        int r = oldest_rs(f);
        if (r < 0) {
            fprintf(stderr,
                    "fsdp: unit %d needs a gradient buffer but both are bound to units whose W pass has "
                    "not finished\n",
                    u);
            abort();
        }
        rs_complete(f, r);
    }
    f->gs[s].unit = u;
    x->gslot = s;
    x->grads_bound = 1;
    f->ops->fill(f->gs[s].buf, 0.0f, x->padded); /* the model accumulates (+=); the padding is sent */
    f->cfg.unit_grads[u] = f->gs[s].buf;
}

/* ----------------------------------------------------------------------------
 * the hooks */

static void begin_step(fsdp *f, int zero) {
    if (zero) f->ops->fill(f->grad, 0.0f, f->local_numel);
    for (int u = 0; u < f->cfg.n_units; u++) {
        unit_state *x = &f->units[u];
        x->grad_fresh = 1;
    }
}

void fsdp_begin_step(fsdp *f) { begin_step(f, 1); }

int fsdp_begin_step_unzeroed(fsdp *f) {
    const int keep = f->S == 1 && !f->cfg.offload;
    begin_step(f, !keep);
    return keep;
}

void fsdp_pre_forward(fsdp *f, int u) {
    if (f->S == 1) return;
    progress(f);
    unshard(f, u);
    f->units[u].pinned = 1;
    ag_start(f, u + 1, 0); /* prefetch: runs while unit u computes */
}

void fsdp_post_forward(fsdp *f, int u) {
    if (f->S == 1) return;
    f->units[u].pinned = 0;
    if (reshards_after_forward(&f->cfg, f->S, u)) reshard(f, u);
}

void fsdp_pre_backward(fsdp *f, int u) {
    if (f->S == 1) return;
    progress(f);
    unit_state *x = &f->units[u];
    if (x->needs_params_bwd) {
        unshard(f, u);
        x->pinned = 1;
    }
    for (int v = u - 1; v >= 0; v--) { /* prefetch the next unit backward that reads its parameters */
        if (f->units[v].needs_params_bwd) {
            ag_start(f, v, 0);
            break;
        }
    }
}

void fsdp_pre_backward_weight(fsdp *f, int u) {
    if (f->S == 1) return;
    unit_state *x = &f->units[u];
    if (x->needs_params_bwd) {
        unshard(f, u);
        x->pinned = 1;
    }
    bind_grads(f, u);
}

void fsdp_post_backward_weight(fsdp *f, int u, int last_microbatch) {
    unit_state *x = &f->units[u];
    if (f->S == 1) {
        if (last_microbatch) {
            tp_reduce_replicated(f, u);
            replicate_all_reduce(f, u);
        }
        return;
    }
    x->pinned = 0;
    if (!f->cfg.reduce_at_last_microbatch || last_microbatch) rs_start(f, u, last_microbatch);
    /* parameters are not needed again this microbatch; under pipeline parallel they stay
     * gathered for the step's other microbatches */
    if (!f->cfg.pipeline_parallel || last_microbatch) reshard(f, u);
}

void fsdp_finish_grads(fsdp *f) {
    if (f->S > 1)
        for (int s; (s = oldest_rs(f)) >= 0;) rs_complete(f, s);
    for (int u = 0; u < f->cfg.n_units; u++) {
        unit_state *x = &f->units[u];
        if (x->ar) timed_wait(f, x->ar);
        x->ar = NULL;
        if (f->S > 1 && f->cfg.reduce_at_last_microbatch && x->grads_bound) {
            x->grads_bound = 0;
            f->cfg.unit_grads[u] = NULL;
        }
    }
}

void fsdp_grad_sq_norm_local(fsdp *f, float *dev_out) {
    f->ops->fill(dev_out, 0.0f, 1);
    if (f->tp_size == 1) {
        f->ops->sum_squares(dev_out, f->grad, f->local_numel);
    } else {
        /* tensor parallel: each rank's boxes once, the replicated parameters from one rank */
        for (int i = 0; i < f->cfg.n_params; i++) {
            const dt_param_decl *d = &f->cfg.params_decl[i];
            const dt_tensor *t = &f->tensors[i];
            if (d->replicated && f->tp_rank != 0) continue;
            if (f->S == 1) f->ops->sum_squares(dev_out, f->grad + d->offset, d->numel);
            else if (t->n_pieces) f->ops->sum_squares(dev_out, f->grad + t->piece.local_offset, t->piece.count);
        }
    }
}

void fsdp_grad_sq_norm_global_dev(fsdp *f, double *dev) {
    /* replicas hold identical shards after the all-reduce: count each shard once */
    if (f->S > 1) comm_all_reduce(f->cfg.shard, dev, 1, COMM_F64, COMM_SUM, NULL);
    if (f->tp_size > 1) comm_all_reduce(f->cfg.tp, dev, 1, COMM_F64, COMM_SUM, NULL);
}

double fsdp_grad_sq_norm(fsdp *f) {
    float local = 0.0f;
    fsdp_grad_sq_norm_local(f, f->scalar);
    f->ops->copy_d2h(&local, f->scalar, sizeof local);
    /* the same reductions as fsdp_grad_sq_norm_global_dev, on a host value */
    double sq = (double)local;
    if (f->S > 1) sq = comm_all_reduce_f64(f->cfg.shard, sq, COMM_SUM);
    if (f->tp_size > 1) sq = comm_all_reduce_f64(f->cfg.tp, sq, COMM_SUM);
    return sq;
}

void fsdp_params_updated(fsdp *f) {
    if (f->S == 1) return;
    for (int u = 0; u < f->cfg.n_units; u++) { /* a gather in flight carries old values */
        f->units[u].pinned = 0;
        reshard(f, u);
    }
}

/* Offload: the host master to the device's copy in the compute dtype, a staging buffer at a time. */
static void push_master(fsdp *f) {
    void *stage = stage_params(f, 0);
    for (size_t off = 0; off < f->local_numel; off += f->max_range) {
        const size_t n = f->local_numel - off < f->max_range ? f->local_numel - off : f->max_range;
        if (f->compute) {
            f->cfg.host_ops->cast_f32_to_bf16(stage, f->host_master + off, n);
            f->ops->copy_h2d(f->compute + off, stage, n * sizeof(uint16_t));
        } else {
            f->ops->copy_h2d(f->master + off, f->host_master + off, n * sizeof(float));
        }
    }
}

void fsdp_master_changed(fsdp *f) {
    if (f->cfg.offload) push_master(f);
    else if (f->compute) f->ops->cast_f32_to_bf16(f->compute, f->master, f->local_numel);
    fsdp_params_updated(f);
}

/* One unit's host update, on a thread of its own while the copies of its neighbours run. */
typedef struct {
    fsdp_host_update_fn update;
    void *user;
    size_t off, n;
    const float *grad;
    void *params;
} host_job;

static void *run_host_job(void *arg) {
    const host_job *j = arg;
    j->update(j->user, j->off, j->n, j->grad, j->params);
    return NULL;
}

static void unit_range(const fsdp *f, int u, size_t *off, size_t *n) {
    *off = f->units[u].local_offset;
    *n = f->S == 1 ? f->units[u].numel : f->units[u].shard;
}

/* Unit u's updated parameters (staging buffer b) to the device's shard. */
static void put_params(fsdp *f, int u, int b) {
    size_t off, n;
    unit_range(f, u, &off, &n);
    f->ops->copy_h2d(f->compute ? (void *)(f->compute + off) : (void *)(f->master + off), stage_params(f, b),
                     n * f->esz);
}

/* Two staging buffers: while the host updates unit u, the device copies unit u + 1's
 * gradient out and unit u - 1's parameters back. */
void fsdp_offload_update(fsdp *f, fsdp_host_update_fn update, void *user) {
    const int nu = f->cfg.n_units;
    size_t off, n;
    if (nu > 0) {
        unit_range(f, 0, &off, &n);
        f->ops->copy_d2h(stage_grad(f, 0), f->grad + off, n * sizeof(float));
    }
    for (int u = 0; u < nu; u++) {
        host_job j = {update, user, 0, 0, stage_grad(f, u & 1), stage_params(f, u & 1)};
        unit_range(f, u, &j.off, &j.n);
        pthread_t th;
        const int threaded = pthread_create(&th, NULL, run_host_job, &j) == 0;
        if (!threaded) run_host_job(&j);
        if (u + 1 < nu) {
            unit_range(f, u + 1, &off, &n);
            f->ops->copy_d2h(stage_grad(f, (u + 1) & 1), f->grad + off, n * sizeof(float));
        }
        if (u > 0) put_params(f, u - 1, (u - 1) & 1);
        if (threaded) pthread_join(th, NULL);
    }
    if (nu > 0) put_params(f, nu - 1, (nu - 1) & 1);
    fsdp_params_updated(f);
}

void fsdp_prefetch(fsdp *f, int u) {
    if (f->S == 1) return;
    progress(f);
    ag_start(f, u, 0);
}

void fsdp_reshard_all(fsdp *f) {
    for (int u = 0; u < f->cfg.n_units; u++) reshard(f, u);
}

int fsdp_init_shards(fsdp *f, fsdp_fill_fn fill, void *user) {
    const size_t chunk = (size_t)1 << 20;
    float *host = malloc(chunk * sizeof(float));
    if (!host) return -1;
    int rc = 0;
    for (int i = 0; i < f->cfg.n_params && rc == 0; i++) {
        const dt_tensor *t = &f->tensors[i];
        if (!t->n_pieces) continue;
        for (size_t k = 0; k < t->piece.count && rc == 0;) {
            size_t run = 0;
            size_t g = dt_piece_global_run(t, k, &run);
            if (run > chunk) run = chunk;
            rc = fill(user, i, g, run, host) != 0 ? -1 : 0;
            float *dst = fsdp_master(f) + t->piece.local_offset + k;
            if (rc == 0 && f->cfg.offload) memcpy(dst, host, run * sizeof(float));
            else if (rc == 0) f->ops->copy_h2d(dst, host, run * sizeof(float));
            k += run;
        }
    }
    free(host);
    fsdp_master_changed(f);
    return rc;
}

int fsdp_enable_coded_gather(fsdp *f, int n, const int *params, const fsdp_gather_codec *codec, char *err,
                             size_t errlen) {
    if (f->S == 1 || n <= 0) return 0;
    if (f->codec) {
        snprintf(err, errlen, "fsdp: a coded all-gather (%s) is already enabled", f->codec->name);
        return -1;
    }
    if (!codec || codec->bytes < 1 || !codec->encode || !codec->decode) {
        snprintf(err, errlen, "fsdp: coded all-gather: an incomplete codec");
        return -1;
    }
    const int np = f->cfg.n_params;
    f->cg_param = calloc((size_t)np, sizeof *f->cg_param);
    f->cg_order = calloc((size_t)np, sizeof *f->cg_order);
    if (!f->cg_param || !f->cg_order) {
        snprintf(err, errlen, "fsdp: out of host memory");
        return -1;
    }
    for (int j = 0; j < n; j++) {
        if (params[j] < 0 || params[j] >= np) {
            snprintf(err, errlen, "fsdp: %s all-gather: parameter %d invalid", codec->name, params[j]);
            return -1;
        }
        f->cg_param[params[j]] = 1;
    }
    f->codec = codec;
    /* pack and unpack walk a unit's parameters in the order of their offsets */
    for (int i = 0; i < np; i++) f->cg_order[i] = i;
    for (int i = 1; i < np; i++)
        for (int j = i; j > 0; j--) {
            const dt_param_decl *a = &f->cfg.params_decl[f->cg_order[j - 1]], *b = &f->cfg.params_decl[f->cg_order[j]];
            if (a->unit < b->unit || (a->unit == b->unit && a->offset <= b->offset)) break;
            const int t = f->cg_order[j - 1];
            f->cg_order[j - 1] = f->cg_order[j];
            f->cg_order[j] = t;
        }
    size_t max_blk = 0;
    for (int u = 0; u < f->cfg.n_units; u++) {
        unit_state *x = &f->units[u];
        size_t hp_pad = 0;
        int any = 0;
        for (int r = 0; r < f->S; r++) {
            size_t hp = 0;
            for (int i = 0; i < np; i++) {
                const dt_param_decl *d = &f->cfg.params_decl[i];
                size_t lo, hi;
                if (d->unit != u) continue;
                any |= f->cg_param[i];
                if (!f->cg_param[i] && piece_of(x, d->offset - x->offset, d->numel, r, &lo, &hi)) hp += hi - lo;
            }
            if (hp > hp_pad) hp_pad = hp;
        }
        if (!any) continue;
        x->coded = 1;
        x->hp_pad = hp_pad;
        x->blk = align16(align16(x->shard * (size_t)codec->bytes) + hp_pad * f->esz);
        if (x->blk > max_blk) max_blk = x->blk;
    }
    if (!max_blk) return 0;
    const size_t bytes = N_CODED * ((size_t)(f->S + 1) * max_blk);
    f->mem.work_param_bytes += bytes;
    if (f->cfg.plan_only) return 0;
    f->cg_mem = f->ops->alloc(bytes);
    if (!f->cg_mem) {
        snprintf(err, errlen, "fsdp: cannot allocate %.1f MiB for the %s all-gather", (double)bytes / 1048576.0,
                 codec->name);
        return -1;
    }
    uint8_t *p = f->cg_mem;
    for (int i = 0; i < N_CODED; i++) {
        f->cgs[i].unit = -1;
        f->cgs[i].send = p;
        p += max_blk;
        f->cgs[i].recv = p;
        p += (size_t)f->S * max_blk;
    }
    return 0;
}

fsdp_traffic fsdp_step_traffic(const fsdp *f, int microbatches) {
    fsdp_traffic t = {0, 0, 0};
    for (int u = 0; u < f->cfg.n_units; u++) {
        const unit_state *x = &f->units[u];
        if (f->S > 1) {
            const double ag = (double)(f->S - 1) * (x->coded ? (double)x->blk : (double)x->shard * (double)f->esz);
            const int gathers = 1 + (x->needs_params_bwd && reshards_after_forward(&f->cfg, f->S, u));
            t.all_gather += (double)microbatches * gathers * ag;
            const int rs = f->cfg.reduce_at_last_microbatch ? 1 : microbatches;
            t.reduce_scatter += (double)rs * (double)(f->S - 1) * (double)x->shard * sizeof(float);
        }
        /* ring all-reduce: each rank sends 2 (R - 1) / R of the buffer */
        const double n = f->S > 1 ? (double)x->shard : (double)x->numel;
        if (f->R > 1) t.all_reduce += 2.0 * (double)(f->R - 1) / (double)f->R * n * sizeof(float);
    }
    return t;
}

fsdp_memory fsdp_memory_report(const fsdp *f) { return f->mem; }

fsdp_stats fsdp_get_stats(const fsdp *f) { return f->st; }
