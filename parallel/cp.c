/* cp.c — context-parallel sharding and attention over the cp group (see cp.h). */
#include "parallel/cp.h"

#include <math.h>
#include <string.h>

int cp_parse_rotate(const char *s, cp_rotate *out) {
    if (!strcmp(s, "allgather")) *out = CP_ROTATE_ALLGATHER;
    else if (!strcmp(s, "alltoall")) *out = CP_ROTATE_ALLTOALL;
    else return -1;
    return 0;
}

int cp_parse_balancer(const char *s, int *balanced) {
    if (!strcmp(s, "headtail")) *balanced = 1;
    else if (!strcmp(s, "none")) *balanced = 0;
    else return -1;
    return 0;
}

int cp_n_chunks(int cp, int balanced) { return balanced ? 2 * cp : cp; }
int cp_n_segments(int balanced) { return balanced ? 2 : 1; }
int cp_segment_chunk(int cp, int balanced, int r, int i) { return i == 0 ? r : 2 * cp - 1 - r; }

void cp_positions(int cp, int balanced, int r, int T, int32_t *pos) {
    const int c = T / cp_n_chunks(cp, balanced), ns = cp_n_segments(balanced);
    for (int i = 0; i < ns; i++) {
        const int j = cp_segment_chunk(cp, balanced, r, i);
        for (int x = 0; x < c; x++) pos[i * c + x] = j * c + x;
    }
}

void cp_shard_tokens(int cp, int balanced, int r, int32_t *out, const int32_t *in, int b, int T) {
    const int c = T / cp_n_chunks(cp, balanced), ns = cp_n_segments(balanced), t = T / cp;
    for (int s = 0; s < b; s++)
        for (int i = 0; i < ns; i++)
            memcpy(out + (size_t)s * t + (size_t)i * c,
                   in + (size_t)s * T + (size_t)cp_segment_chunk(cp, balanced, r, i) * c, (size_t)c * sizeof(int32_t));
}

/* ----------------------------------------------------------------------------
 * the workspace: one layout for both directions (they never run at once) */

typedef struct {
    /* allgather */
    void *kg, *vg;    /* [cp][B t KV D] gathered, rank-major (compute dtype) */
    void *kf, *vf;    /* [B T KV D] in sequence order */
    float *dkf, *dvf; /* [B T KV D] fp32 gradient of the whole sequence's K, V */
    float *dkg, *dvg; /* [cp][B t KV D] fp32, rank-major for the reduce-scatter */
    float *dkl, *dvl; /* [B t KV D] fp32 this rank's rows after it */
    float *acc;       /* bf16: [c H D] fp32 a split call's merged output, then its dq */
    float *lse_acc;   /* bf16: [H c] its merged lse */
    /* alltoall (the ring) */
    void *kv[2];    /* [2][B t KV D] a rank's K then V, current and arriving */
    float *dkv[2];  /* [2][B t KV D] fp32 dK, dV accumulators travelling with them */
    float *out_acc; /* [B t H D] fp32 merged output */
    float *lse_seg; /* [B][segments][H][c] fp32 lse, segment-major */
    void *part;     /* [c H D] one block's output (compute dtype) */
    float *dq32;    /* [B t H D] fp32 dq accumulator (bf16) */
    /* both */
    void *tmp16[3];   /* bf16 block gradients [rows_max max(H,KV) D] */
    float *tmp32;     /* [rows_max max(H,KV) D] */
    float *lse_stage; /* [H c] one call's lse */
    void *attn_ws;
    size_t attn_bytes;
} cp_buffers;

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* One call on sequence b. Under a document mask the call is causal whatever the block
 * pair (the op's document mask requires it; for a pair below the diagonal it masks
 * nothing more) and reads sequence b's ids. */
static ops_attn_shape call_shape(const cp_ctx *c, const cp_attn_dims *d, int b, int sq, int sk, int causal, int q_off,
                                 int k_off) {
    ops_attn_shape s;
    memset(&s, 0, sizeof s);
    s.b = 1;
    s.sq = sq;
    s.sk = sk;
    s.h = d->h;
    s.kv = d->kv;
    s.d = d->d;
    s.scale = d->scale;
    s.causal = causal || d->doc;
    s.q_offset = q_off;
    s.k_offset = k_off;
    if (d->doc) {
        s.doc_len = d->t * comm_group_size(c->g);
        s.doc = d->doc + (size_t)b * (size_t)s.doc_len;
    }
    return s;
}

/* Lay the buffers out over base (NULL: measure only); returns the bytes. */
static size_t layout(const cp_ctx *c, const tetra_ops *ops, const cp_attn_dims *d, int bf16, char *base,
                     cp_buffers *b) {
    const int cp = comm_group_size(c->g), ns = cp_n_segments(c->balanced);
    const size_t es = bf16 ? 2 : 4, t = (size_t)d->t, T = t * (size_t)cp, ch = T / (size_t)cp_n_chunks(cp, c->balanced);
    const size_t nkv = (size_t)d->b * t * (size_t)d->kv * (size_t)d->d; /* elements of the local K */
    const size_t nq = (size_t)d->b * t * (size_t)d->h * (size_t)d->d;
    const size_t wide = (size_t)(d->h > d->kv ? d->h : d->kv) * (size_t)d->d;
    size_t off = 0;
#define TAKE(field, bytes)                                                                                             \
    do {                                                                                                               \
        off = align64(off);                                                                                            \
        if (base) (field) = (void *)(base + off);                                                                      \
        off += (bytes);                                                                                                \
    } while (0)
    memset(b, 0, sizeof *b);
    size_t rows_max;
    ops_attn_shape s;
    if (c->rotate == CP_ROTATE_ALLGATHER) {
        TAKE(b->kg, (size_t)cp * nkv * es);
        TAKE(b->vg, (size_t)cp * nkv * es);
        TAKE(b->kf, (size_t)cp * nkv * es);
        TAKE(b->vf, (size_t)cp * nkv * es);
        TAKE(b->dkf, (size_t)cp * nkv * 4);
        TAKE(b->dvf, (size_t)cp * nkv * 4);
        TAKE(b->dkg, (size_t)cp * nkv * 4);
        TAKE(b->dvg, (size_t)cp * nkv * 4);
        TAKE(b->dkl, nkv * 4);
        TAKE(b->dvl, nkv * 4);
        if (bf16 && !d->doc) { /* the split calls (ag_split) */
            TAKE(b->acc, ch * (size_t)d->h * (size_t)d->d * 4);
            TAKE(b->lse_acc, (size_t)d->h * ch * 4);
        }
        rows_max = T;
        s = call_shape(c, d, 0, (int)ch, (int)T, 1, (int)(T - ch), 0);
    } else {
        for (int k = 0; k < 2; k++) {
            TAKE(b->kv[k], 2 * nkv * es);
            TAKE(b->dkv[k], 2 * nkv * 4);
        }
        TAKE(b->out_acc, nq * 4);
        TAKE(b->lse_seg, (size_t)d->b * (size_t)ns * (size_t)d->h * ch * 4);
        TAKE(b->part, ch * (size_t)d->h * (size_t)d->d * es);
        if (bf16) TAKE(b->dq32, nq * 4);
        rows_max = ch;
        s = call_shape(c, d, 0, (int)ch, (int)ch, 1, 0, 0);
    }
    if (bf16)
        for (int k = 0; k < 3; k++) TAKE(b->tmp16[k], rows_max * wide * 2);
    TAKE(b->tmp32, rows_max * wide * 4);
    TAKE(b->lse_stage, (size_t)d->h * ch * 4);
    b->attn_bytes = bf16 ? ops->attention_workspace_size_bf16(&s) : ops->attention_workspace_size(&s);
    if (bf16 && c->rotate == CP_ROTATE_ALLGATHER && T > ch) { /* the split calls' shapes too */
        const ops_attn_shape parts[2] = {call_shape(c, d, 0, (int)ch, (int)(T - ch), 0, (int)(T - ch), 0),
                                         call_shape(c, d, 0, (int)ch, (int)ch, 1, (int)(T - ch), (int)(T - ch))};
        for (int k = 0; k < 2; k++) {
            const size_t pb = ops->attention_workspace_size_bf16(&parts[k]);
            if (pb > b->attn_bytes) b->attn_bytes = pb;
        }
    }
    if (b->attn_bytes) TAKE(b->attn_ws, b->attn_bytes);
#undef TAKE
    return off;
}

size_t cp_workspace_bytes(const cp_ctx *c, const tetra_ops *ops, const cp_attn_dims *dim, int bf16) {
    cp_buffers b;
    return layout(c, ops, dim, bf16, NULL, &b);
}

/* ----------------------------------------------------------------------------
 * helpers */

static void *at(const void *p, size_t elems, size_t es) { return (char *)p + elems * es; }

static void attn_fwd(const tetra_ops *ops, int bf16, void *out, float *lse, const void *q, const void *k, const void *v,
                     const ops_attn_shape *s, void *ws) {
    if (bf16) ops->attention_forward_bf16(out, lse, q, k, v, s, ws);
    else ops->attention_forward(out, lse, q, k, v, s, ws);
}

/* lse [B, H, t] rows (b, segment i) <-> a contiguous [H, c] */
static void lse_get(const tetra_ops *ops, float *dst, const float *lse, const cp_attn_dims *d, int b, int i, int ch) {
    for (int h = 0; h < d->h; h++)
        ops->copy(dst + (size_t)h * ch, lse + ((size_t)b * d->h + h) * d->t + (size_t)i * ch, (size_t)ch * 4);
}
static void lse_put(const tetra_ops *ops, float *lse, const float *src, const cp_attn_dims *d, int b, int i, int ch) {
    for (int h = 0; h < d->h; h++)
        ops->copy(lse + ((size_t)b * d->h + h) * d->t + (size_t)i * ch, src + (size_t)h * ch, (size_t)ch * 4);
}

/* Rank-major gathered rows (source rank s, its segment i) <-> sequence order. */
static void to_sequence(const cp_ctx *c, const tetra_ops *ops, void *seq, const void *gathered, const cp_attn_dims *d,
                        size_t es, int back) {
    const int cp = comm_group_size(c->g), ns = cp_n_segments(c->balanced);
    const size_t row = (size_t)d->kv * d->d, t = (size_t)d->t, T = t * (size_t)cp,
                 ch = T / (size_t)cp_n_chunks(cp, c->balanced), nkv = (size_t)d->b * t * row;
    for (int s = 0; s < cp; s++)
        for (int i = 0; i < ns; i++) {
            const size_t j = (size_t)cp_segment_chunk(cp, c->balanced, s, i);
            for (int b = 0; b < d->b; b++) {
                void *g = at(gathered, (size_t)s * nkv + ((size_t)b * t + (size_t)i * ch) * row, es);
                void *q = at(seq, ((size_t)b * T + j * ch) * row, es);
                if (back) ops->copy(g, q, ch * row * es);
                else ops->copy(q, g, ch * row * es);
            }
        }
}

/* ----------------------------------------------------------------------------
 * allgather */

static void gather_kv(const cp_ctx *c, const tetra_ops *ops, int bf16, cp_buffers *w, const void *k, const void *v,
                      const cp_attn_dims *d) {
    const size_t es = bf16 ? 2 : 4, nkv = (size_t)d->b * d->t * d->kv * d->d;
    const comm_dtype dt = bf16 ? COMM_BF16 : COMM_F32;
    comm_all_gather(c->g, w->kg, k, nkv, dt, NULL);
    comm_all_gather(c->g, w->vg, v, nkv, dt, NULL);
    to_sequence(c, ops, w->kf, w->kg, d, es, 0);
    to_sequence(c, ops, w->vf, w->vg, d, es, 0);
}

/* dst (compute dtype) = src (fp32) */
static void store(const tetra_ops *ops, int bf16, void *dst, const float *src, size_t n) {
    if (bf16) ops->cast_f32_to_bf16(dst, src, n);
    else ops->copy(dst, src, n * 4);
}

/* acc (fp32) += x (bf16), through tmp32 */
static void add_bf16(const tetra_ops *ops, float *acc, const void *x, float *tmp32, size_t n) {
    ops->cast_bf16_to_f32(tmp32, x, n);
    ops->axpy(acc, tmp32, 1.0f, n);
}

/* bf16 without a document mask: chunk j > 0 attends to keys [0, (j+1) c) causally with
 * the query block at offset j c, a shape cuDNN's fused SDPA refuses (causal with unequal
 * offsets). It runs as two calls cuDNN takes: every query against the keys before the
 * chunk, unmasked ([0, j c)), and the chunk's own keys with the causal diagonal; their
 * outputs merge by log-sum-exp as ring attention's blocks do. */
static int ag_split(int bf16, const cp_attn_dims *d, size_t j) { return bf16 && !d->doc && j > 0; }

/* The two calls' shapes: part 0 the keys before the chunk, part 1 its diagonal. */
static ops_attn_shape split_shape(const cp_ctx *c, const cp_attn_dims *d, int b, int j, int ch, int part) {
    return part ? call_shape(c, d, b, ch, ch, 1, j * ch, j * ch) : call_shape(c, d, b, ch, j * ch, 0, j * ch, 0);
}

/* out [c H D] bf16 and w->lse_stage [H c] of chunk j against kb/vb (the sequence's keys) */
static void ag_split_forward(const cp_ctx *c, const tetra_ops *ops, cp_buffers *w, void *out, const void *q,
                             const void *kb, const void *vb, const cp_attn_dims *d, int b, int j, int ch) {
    const size_t n = (size_t)ch * d->h * d->d, krow = (size_t)d->kv * d->d, diag = (size_t)j * ch * krow;
    ops_attn_shape s0 = split_shape(c, d, b, j, ch, 0), s1 = split_shape(c, d, b, j, ch, 1);
    /* the merged lse accumulates in lse_stage, where the caller reads it */
    ops->attention_forward_bf16(w->tmp16[0], w->lse_stage, q, kb, vb, &s0, w->attn_ws);
    ops->cast_bf16_to_f32(w->acc, w->tmp16[0], n);
    ops->attention_forward_bf16(w->tmp16[0], w->lse_acc, q, at(kb, diag, 2), at(vb, diag, 2), &s1, w->attn_ws);
    ops->cast_bf16_to_f32(w->tmp32, w->tmp16[0], n);
    ops->attention_merge(w->acc, w->lse_stage, w->tmp32, w->lse_acc, 1, ch, d->h, d->d);
    ops->cast_f32_to_bf16(out, w->acc, n);
}

/* The gradients of chunk j's split calls, from the merged out and lse (w->lse_stage): dq
 * (bf16, written), and dK, dV added into dkb/dvb (fp32, the sequence's). */
static void ag_split_backward(const cp_ctx *c, const tetra_ops *ops, cp_buffers *w, void *dq, float *dkb, float *dvb,
                              const void *dout, const void *q, const void *kb, const void *vb, const void *out,
                              const cp_attn_dims *d, int b, int j, int ch) {
    const size_t n = (size_t)ch * d->h * d->d, krow = (size_t)d->kv * d->d;
    ops->fill(w->acc, 0.0f, n);
    for (int part = 0; part < 2; part++) {
        const ops_attn_shape s = split_shape(c, d, b, j, ch, part);
        const size_t k0 = part ? (size_t)j * ch * krow : 0, nk = (size_t)s.sk * krow;
        ops->attention_backward_bf16(w->tmp16[0], w->tmp16[1], w->tmp16[2], dout, q, at(kb, k0, 2), at(vb, k0, 2), out,
                                     w->lse_stage, &s, w->attn_ws);
        add_bf16(ops, w->acc, w->tmp16[0], w->tmp32, n);
        add_bf16(ops, dkb + k0, w->tmp16[1], w->tmp32, nk);
        add_bf16(ops, dvb + k0, w->tmp16[2], w->tmp32, nk);
    }
    ops->cast_f32_to_bf16(dq, w->acc, n);
}

static void ag_forward(const cp_ctx *c, const tetra_ops *ops, int bf16, cp_buffers *w, void *out, float *lse,
                       const void *q, const void *k, const void *v, const cp_attn_dims *d) {
    const int cp = comm_group_size(c->g), r = comm_group_rank(c->g), ns = cp_n_segments(c->balanced);
    const size_t es = bf16 ? 2 : 4, t = (size_t)d->t, T = t * (size_t)cp, ch = T / (size_t)cp_n_chunks(cp, c->balanced);
    const size_t qrow = (size_t)d->h * d->d, krow = (size_t)d->kv * d->d;
    gather_kv(c, ops, bf16, w, k, v, d);
    for (int b = 0; b < d->b; b++)
        for (int i = 0; i < ns; i++) {
            const size_t j = (size_t)cp_segment_chunk(cp, c->balanced, r, i);
            const size_t qo = ((size_t)b * t + (size_t)i * ch) * qrow;
            const void *kb = at(w->kf, (size_t)b * T * krow, es), *vb = at(w->vf, (size_t)b * T * krow, es);
            if (ag_split(bf16, d, j)) {
                ag_split_forward(c, ops, w, at(out, qo, es), at(q, qo, es), kb, vb, d, b, (int)j, (int)ch);
            } else {
                ops_attn_shape s = call_shape(c, d, b, (int)ch, (int)((j + 1) * ch), 1, (int)(j * ch), 0);
                attn_fwd(ops, bf16, at(out, qo, es), w->lse_stage, at(q, qo, es), kb, vb, &s, w->attn_ws);
            }
            lse_put(ops, lse, w->lse_stage, d, b, i, (int)ch);
        }
}

static void ag_backward(const cp_ctx *c, const tetra_ops *ops, int bf16, cp_buffers *w, void *dq, void *dk, void *dv,
                        const void *dout, const void *q, const void *k, const void *v, const void *out,
                        const float *lse, const cp_attn_dims *d) {
    const int cp = comm_group_size(c->g), r = comm_group_rank(c->g), ns = cp_n_segments(c->balanced);
    const size_t es = bf16 ? 2 : 4, t = (size_t)d->t, T = t * (size_t)cp, ch = T / (size_t)cp_n_chunks(cp, c->balanced);
    const size_t qrow = (size_t)d->h * d->d, krow = (size_t)d->kv * d->d, nkv = (size_t)d->b * t * krow;
    gather_kv(c, ops, bf16, w, k, v, d);
    ops->fill(w->dkf, 0.0f, (size_t)cp * nkv);
    ops->fill(w->dvf, 0.0f, (size_t)cp * nkv);
    if (!bf16) ops->fill(dq, 0.0f, (size_t)d->b * t * qrow); /* the fp32 op accumulates */
    for (int b = 0; b < d->b; b++)
        for (int i = 0; i < ns; i++) {
            const size_t j = (size_t)cp_segment_chunk(cp, c->balanced, r, i), sk = (j + 1) * ch;
            ops_attn_shape s = call_shape(c, d, b, (int)ch, (int)sk, 1, (int)(j * ch), 0);
            const size_t qo = ((size_t)b * t + (size_t)i * ch) * qrow, ko = (size_t)b * T * krow;
            lse_get(ops, w->lse_stage, lse, d, b, i, (int)ch);
            if (ag_split(bf16, d, j)) {
                ag_split_backward(c, ops, w, at(dq, qo, es), w->dkf + ko, w->dvf + ko, at(dout, qo, es), at(q, qo, es),
                                  at(w->kf, ko, es), at(w->vf, ko, es), at(out, qo, es), d, b, (int)j, (int)ch);
            } else if (bf16) {
                ops->attention_backward_bf16(at(dq, qo, es), w->tmp16[0], w->tmp16[1], at(dout, qo, es), at(q, qo, es),
                                             at(w->kf, ko, es), at(w->vf, ko, es), at(out, qo, es), w->lse_stage, &s,
                                             w->attn_ws);
                add_bf16(ops, w->dkf + ko, w->tmp16[0], w->tmp32, sk * krow);
                add_bf16(ops, w->dvf + ko, w->tmp16[1], w->tmp32, sk * krow);
            } else {
                ops->attention_backward(at(dq, qo, es), w->dkf + ko, w->dvf + ko, at(dout, qo, es), at(q, qo, es),
                                        at(w->kf, ko, es), at(w->vf, ko, es), at(out, qo, es), w->lse_stage, &s,
                                        w->attn_ws);
            }
        }
    /* every rank's contribution to each rank's K/V rows: back to rank-major, summed */
    to_sequence(c, ops, w->dkf, w->dkg, d, 4, 1);
    to_sequence(c, ops, w->dvf, w->dvg, d, 4, 1);
    comm_reduce_scatter(c->g, w->dkl, w->dkg, nkv, COMM_F32, COMM_SUM, NULL);
    comm_reduce_scatter(c->g, w->dvl, w->dvg, nkv, COMM_F32, COMM_SUM, NULL);
    store(ops, bf16, dk, w->dkl, nkv);
    store(ops, bf16, dv, w->dvl, nkv);
}

/* ----------------------------------------------------------------------------
 * alltoall: the ring */

static void ring_forward(const cp_ctx *c, const tetra_ops *ops, int bf16, cp_buffers *w, void *out, float *lse,
                         const void *q, const void *k, const void *v, const cp_attn_dims *d) {
    const int cp = comm_group_size(c->g), r = comm_group_rank(c->g), ns = cp_n_segments(c->balanced);
    const size_t es = bf16 ? 2 : 4, t = (size_t)d->t, T = t * (size_t)cp, ch = T / (size_t)cp_n_chunks(cp, c->balanced);
    const size_t qrow = (size_t)d->h * d->d, krow = (size_t)d->kv * d->d, nkv = (size_t)d->b * t * krow,
                 nq = (size_t)d->b * t * qrow;
    const comm_dtype dt = bf16 ? COMM_BF16 : COMM_F32;
    ops->copy(w->kv[0], k, nkv * es);
    ops->copy(at(w->kv[0], nkv, es), v, nkv * es);
    ops->fill(w->out_acc, 0.0f, nq);
    ops->fill(w->lse_seg, -INFINITY, (size_t)d->b * ns * d->h * ch);
    int cur = 0;
    for (int step = 0; step < cp; step++) {
        const int src = (r - step + cp) % cp;
        comm_request *req = NULL;
        if (step < cp - 1) /* the next block travels while this one is computed */
            comm_sendrecv(c->g, w->kv[1 - cur], (r - 1 + cp) % cp, w->kv[cur], (r + 1) % cp, 2 * nkv, dt, &req);
        for (int b = 0; b < d->b; b++)
            for (int i = 0; i < ns; i++) {
                const int jq = cp_segment_chunk(cp, c->balanced, r, i);
                const size_t qo = ((size_t)b * t + (size_t)i * ch) * qrow;
                float *lse_i = w->lse_seg + ((size_t)b * ns + i) * d->h * ch;
                for (int i2 = 0; i2 < ns; i2++) {
                    const int jk = cp_segment_chunk(cp, c->balanced, src, i2);
                    if (jk > jq) continue; /* in the future of every query of the chunk */
                    ops_attn_shape s = call_shape(c, d, b, (int)ch, (int)ch, jk == jq, (int)(jq * ch), (int)(jk * ch));
                    const size_t ko = ((size_t)b * t + (size_t)i2 * ch) * krow;
                    attn_fwd(ops, bf16, w->part, w->lse_stage, at(q, qo, es), at(w->kv[cur], ko, es),
                             at(w->kv[cur], nkv + ko, es), &s, w->attn_ws);
                    const float *p32 = w->part;
                    if (bf16) {
                        ops->cast_bf16_to_f32(w->tmp32, w->part, ch * qrow);
                        p32 = w->tmp32;
                    }
                    ops->attention_merge(w->out_acc + qo, lse_i, p32, w->lse_stage, 1, (int)ch, d->h, d->d);
                }
            }
        comm_wait(req);
        if (step < cp - 1) cur = 1 - cur;
    }
    store(ops, bf16, out, w->out_acc, nq);
    for (int b = 0; b < d->b; b++)
        for (int i = 0; i < ns; i++) lse_put(ops, lse, w->lse_seg + ((size_t)b * ns + i) * d->h * ch, d, b, i, (int)ch);
}

static void ring_backward(const cp_ctx *c, const tetra_ops *ops, int bf16, cp_buffers *w, void *dq, void *dk, void *dv,
                          const void *dout, const void *q, const void *k, const void *v, const void *out,
                          const float *lse, const cp_attn_dims *d) {
    const int cp = comm_group_size(c->g), r = comm_group_rank(c->g), ns = cp_n_segments(c->balanced);
    const size_t es = bf16 ? 2 : 4, t = (size_t)d->t, T = t * (size_t)cp, ch = T / (size_t)cp_n_chunks(cp, c->balanced);
    const size_t qrow = (size_t)d->h * d->d, krow = (size_t)d->kv * d->d, nkv = (size_t)d->b * t * krow,
                 nq = (size_t)d->b * t * qrow;
    const comm_dtype dt = bf16 ? COMM_BF16 : COMM_F32;
    const int next = (r + 1) % cp, prev = (r - 1 + cp) % cp;
    ops->copy(w->kv[0], k, nkv * es);
    ops->copy(at(w->kv[0], nkv, es), v, nkv * es);
    ops->fill(w->dkv[0], 0.0f, 2 * nkv);
    float *dq_acc = bf16 ? w->dq32 : (float *)dq; /* the fp32 op accumulates into dq itself */
    ops->fill(dq_acc, 0.0f, nq);
    for (int b = 0; b < d->b; b++)
        for (int i = 0; i < ns; i++) lse_get(ops, w->lse_seg + ((size_t)b * ns + i) * d->h * ch, lse, d, b, i, (int)ch);
    int ckv = 0, cdk = 0;
    for (int step = 0; step < cp; step++) {
        const int src = (r - step + cp) % cp;
        comm_request *req = NULL;
        if (step < cp - 1) comm_sendrecv(c->g, w->kv[1 - ckv], prev, w->kv[ckv], next, 2 * nkv, dt, &req);
        float *dka = w->dkv[cdk], *dva = w->dkv[cdk] + nkv;
        for (int b = 0; b < d->b; b++)
            for (int i = 0; i < ns; i++) {
                const int jq = cp_segment_chunk(cp, c->balanced, r, i);
                const size_t qo = ((size_t)b * t + (size_t)i * ch) * qrow;
                const float *lse_i = w->lse_seg + ((size_t)b * ns + i) * d->h * ch;
                for (int i2 = 0; i2 < ns; i2++) {
                    const int jk = cp_segment_chunk(cp, c->balanced, src, i2);
                    if (jk > jq) continue;
                    ops_attn_shape s = call_shape(c, d, b, (int)ch, (int)ch, jk == jq, (int)(jq * ch), (int)(jk * ch));
                    const size_t ko = ((size_t)b * t + (size_t)i2 * ch) * krow;
                    if (bf16) {
                        ops->attention_backward_bf16(w->tmp16[0], w->tmp16[1], w->tmp16[2], at(dout, qo, es),
                                                     at(q, qo, es), at(w->kv[ckv], ko, es),
                                                     at(w->kv[ckv], nkv + ko, es), at(out, qo, es), lse_i, &s,
                                                     w->attn_ws);
                        add_bf16(ops, dq_acc + qo, w->tmp16[0], w->tmp32, ch * qrow);
                        add_bf16(ops, dka + ko, w->tmp16[1], w->tmp32, ch * krow);
                        add_bf16(ops, dva + ko, w->tmp16[2], w->tmp32, ch * krow);
                    } else {
                        ops->attention_backward(dq_acc + qo, dka + ko, dva + ko, at(dout, qo, es), at(q, qo, es),
                                                at(w->kv[ckv], ko, es), at(w->kv[ckv], nkv + ko, es), at(out, qo, es),
                                                lse_i, &s, w->attn_ws);
                    }
                }
            }
        /* the accumulators follow their block; after the last step they are home */
        comm_sendrecv(c->g, w->dkv[1 - cdk], prev, w->dkv[cdk], next, 2 * nkv, COMM_F32, NULL);
        cdk = 1 - cdk;
        comm_wait(req);
        if (step < cp - 1) ckv = 1 - ckv;
    }
    if (bf16) store(ops, 1, dq, w->dq32, nq);
    store(ops, bf16, dk, w->dkv[cdk], nkv);
    store(ops, bf16, dv, w->dkv[cdk] + nkv, nkv);
}

/* ---------------------------------------------------------------------------- */

void cp_attention_forward(const cp_ctx *c, const tetra_ops *ops, int bf16, void *out, float *lse, const void *q,
                          const void *k, const void *v, const cp_attn_dims *dim, void *ws) {
    cp_buffers w;
    layout(c, ops, dim, bf16, ws, &w);
    if (c->rotate == CP_ROTATE_ALLGATHER) ag_forward(c, ops, bf16, &w, out, lse, q, k, v, dim);
    else ring_forward(c, ops, bf16, &w, out, lse, q, k, v, dim);
}

void cp_attention_backward(const cp_ctx *c, const tetra_ops *ops, int bf16, void *dq, void *dk, void *dv,
                           const void *dout, const void *q, const void *k, const void *v, const void *out,
                           const float *lse, const cp_attn_dims *dim, void *ws) {
    cp_buffers w;
    layout(c, ops, dim, bf16, ws, &w);
    if (c->rotate == CP_ROTATE_ALLGATHER) ag_backward(c, ops, bf16, &w, dq, dk, dv, dout, q, k, v, out, lse, dim);
    else ring_backward(c, ops, bf16, &w, dq, dk, dv, dout, q, k, v, out, lse, dim);
}
