/* generate.c — the named schedules, order for order as PyTorch builds them (see generate.h).
 *
 * Each generator follows the corresponding schedule class of
 * torch/distributed/pipelining/schedules.py (PyTorch 2.15): same phases, same
 * microbatch counters, same idle slots. The fixtures in tests/assets/pp_schedules
 * (written by PyTorch itself) hold the two to the same output.
 */
#include "parallel/pp/generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const kind_names[PP_N_SCHEDULE_KINDS] = {
    "GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"};

const char *pp_schedule_kind_name(pp_schedule_kind k) {
    return (int)k >= 0 && k < PP_N_SCHEDULE_KINDS ? kind_names[k] : "?";
}

int pp_schedule_kind_parse(const char *name, pp_schedule_kind *out) {
    for (int k = 0; k < PP_N_SCHEDULE_KINDS; k++)
        if (!strcasecmp(name, kind_names[k])) {
            *out = (pp_schedule_kind)k;
            return 0;
        }
    return -1;
}

const char *pp_schedule_kind_list(void) {
    return "GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV";
}

int pp_schedule_kind_single_stage(pp_schedule_kind k) { return k == PP_SCHED_GPIPE || k == PP_SCHED_1F1B; }
int pp_schedule_kind_v(pp_schedule_kind k) { return k == PP_SCHED_ZBV || k == PP_SCHED_DUALPIPEV; }

int pp_stage_to_rank(pp_schedule_kind k, int n_ranks, int n_stages, int stage) {
    if (n_ranks < 1 || stage < 0 || stage >= n_stages) return -1;
    if (!pp_schedule_kind_v(k)) return stage % n_ranks;
    /* V: down the ranks and back up, one pass per block of n_ranks stages */
    int block = stage / n_ranks, off = stage % n_ranks;
    return block % 2 == 0 ? off : n_ranks - 1 - off;
}

/* ---- building lists ---------------------------------------------------------- */

typedef struct {
    pp_schedule *s;
    int oom;
} builder;

static void put(builder *b, int rank, pp_action_type t, int stage, int mb) {
    if (!b->oom && pp_schedule_push(b->s, rank, t, stage, mb)) b->oom = 1;
}

static void idle(builder *b, int rank, int n) {
    for (int i = 0; i < n; i++) put(b, rank, PP_IDLE, -1, -1);
}

/* ---- single-stage kinds (stage r on rank r) ---------------------------------- */

/* All forwards, then all backwards. PyTorch's IR has idle slots here too, but its
 * _get_pipeline_order drops them (with _add_reduce_grad); so do we. */
static void gen_gpipe(builder *b, int p, int m) {
    for (int r = 0; r < p; r++) {
        for (int i = 0; i < m; i++) put(b, r, PP_F, r, i);
        for (int i = 0; i < m; i++) put(b, r, PP_B, r, i);
    }
}

/* p-1-r warm-up forwards, then forward/backward pairs, then the remaining
 * backwards. PyTorch 2.15's IR numbers the last rank's forwards from 1 (an order
 * its own validator refuses); its runtime runs them from 0, as here. */
static void gen_1f1b(builder *b, int p, int m) {
    for (int r = 0; r < p; r++) {
        int nf = p - 1 - r, f = 0, bw = 0;
        for (; f < nf; f++) put(b, r, PP_F, r, f);
        while (f < m) {
            put(b, r, PP_F, r, f++);
            put(b, r, PP_B, r, bw++);
        }
        while (bw < m) put(b, r, PP_B, r, bw++);
    }
}

/* ---- looped kinds (stage s on rank s mod p) ---------------------------------- */

static void gen_looped_bfs(builder *b, int p, int v, int m) {
    for (int r = 0; r < p; r++) {
        idle(b, r, r);
        for (int l = 0; l < v; l++)
            for (int i = 0; i < m; i++) put(b, r, PP_F, l * p + r, i);
        idle(b, r, 2 * (p - 1 - r));
        for (int l = v - 1; l >= 0; l--)
            for (int i = m - 1; i >= 0; i--) put(b, r, PP_B, l * p + r, i);
    }
}

/* The shared rank-ops builder of Interleaved1F1B and InterleavedZeroBubble
 * (PyTorch's _get_1f1b_rank_ops): warm-up forwards, forward/backward pairs,
 * cool-down backwards; the zero-bubble variant splits backwards into I and W,
 * holding each rank's first r weight passes back. */
static int gen_interleaved_rank(builder *b, int p, int v, int m, int r, int zero_bubble, char *err, size_t errlen) {
    const int rounds = m / p > 1 ? m / p : 1, mpr = m / rounds;
    int warmup = (v - 1) * mpr + (zero_bubble ? 1 : 2) * (p - 1 - r);
    if (warmup > m * v) warmup = m * v;
    const int mb_ops = v * m, fwd_bwd = mb_ops - warmup, cooldown = mb_ops - fwd_bwd;
    const int total = warmup + fwd_bwd + cooldown;
    int post_warmup = zero_bubble ? p - r - 1 : (v * p + 2 * (p - 1 - r)) - (warmup + r);
    if (post_warmup < 0) post_warmup = 0;
    const int S = p * v;
    int *fcnt = calloc((size_t)S, sizeof *fcnt), *bcnt = calloc((size_t)S, sizeof *bcnt);
    int *wcnt = calloc((size_t)S, sizeof *wcnt), *bops = malloc((size_t)(total > 0 ? total : 1) * sizeof *bops);
    if (!fcnt || !bcnt || !wcnt || !bops) {
        free(fcnt), free(bcnt), free(wcnt), free(bops);
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    const pp_action_type bwd = zero_bubble ? PP_I : PP_B;
    int n_bops = 0, n_w = 0;
#define FWD_STAGE(op) ((((op) / mpr) % v) * p + r)
#define BWD_STAGE(op) ((v - 1 - (((op)-warmup) / mpr) % v) * p + r)
    idle(b, r, r);
    for (int op = 0; op < total; op++) {
        if (op < warmup) {
            int st = FWD_STAGE(op);
            put(b, r, PP_F, st, fcnt[st]++);
            if (op == warmup - 1) idle(b, r, post_warmup);
            continue;
        }
        if (op < warmup + fwd_bwd) {
            int st = FWD_STAGE(op);
            put(b, r, PP_F, st, fcnt[st]++);
        } else if (!zero_bubble) {
            idle(b, r, 1); /* keeps the cool-down in step with the other ranks' pairs */
        }
        int st = BWD_STAGE(op);
        put(b, r, bwd, st, bcnt[st]++);
        bops[n_bops++] = op;
        if (zero_bubble && op - warmup >= r) {
            int ws = BWD_STAGE(bops[n_w]);
            put(b, r, PP_W, ws, wcnt[ws]++);
            n_w++;
        }
    }
    while (zero_bubble && n_w < n_bops) {
        int ws = BWD_STAGE(bops[n_w]);
        put(b, r, PP_W, ws, wcnt[ws]++);
        n_w++;
    }
#undef FWD_STAGE
#undef BWD_STAGE
    free(fcnt), free(bcnt), free(wcnt), free(bops);
    return 0;
}

/* PyTorch's _add_bubbles_to_actions for InterleavedZeroBubble: replay all ranks
 * in lock step and insert an idle slot wherever an action's producer has not run
 * in an earlier step. As in PyTorch only F (and full-backward B) dependencies are
 * looked at: I waits for nothing here, so the pass only matters when m < p. */
static pp_schedule *add_bubbles(const pp_schedule *in, char *err, size_t errlen) {
    const int P = in->n_ranks, S = in->n_stages, M = in->n_microbatches;
    pp_schedule *out = pp_schedule_new(P, S, M);
    unsigned char *seen = calloc((size_t)4 * (size_t)S * (size_t)M, 1); /* [F,I,W,B][stage][mb] */
    int *ptr = calloc((size_t)P, sizeof *ptr);
    int *fresh = malloc((size_t)P * 3 * sizeof *fresh);
    if (!out || !seen || !ptr || !fresh) {
        snprintf(err, errlen, "schedule: out of host memory");
        goto fail;
    }
#define SEEN(t, st, mb) seen[((size_t)(t) * (size_t)S + (size_t)(st)) * (size_t)M + (size_t)(mb)]
    for (;;) {
        int running = 0, moved = 0, n_fresh = 0;
        for (int r = 0; r < P; r++) {
            if (ptr[r] >= in->len[r]) continue;
            running = 1;
            const pp_action *a = &in->acts[r][ptr[r]];
            int need = 0;
            if (a->type == PP_F) need = a->stage != 0 && !SEEN(PP_F, a->stage - 1, a->mb);
            else if (a->type == PP_B)
                need = a->stage == S - 1 ? !SEEN(PP_F, a->stage, a->mb) : !SEEN(PP_B, a->stage + 1, a->mb);
            if (a->type == PP_IDLE || !need) {
                if (pp_schedule_push_action(out, r, a)) goto oom;
                if (a->type != PP_IDLE) {
                    fresh[3 * n_fresh] = a->type;
                    fresh[3 * n_fresh + 1] = a->stage;
                    fresh[3 * n_fresh + 2] = a->mb;
                    n_fresh++;
                }
                ptr[r]++;
                moved = 1;
            } else if (pp_schedule_push(out, r, PP_IDLE, -1, -1)) {
                goto oom;
            }
        }
        if (!running) break;
        if (!moved) {
            snprintf(err, errlen, "schedule: InterleavedZeroBubble: a forward waits for one that never runs");
            goto fail;
        }
        /* what ran in this step becomes visible from the next one */
        for (int i = 0; i < n_fresh; i++)
            if (fresh[3 * i] <= PP_B) SEEN(fresh[3 * i], fresh[3 * i + 1], fresh[3 * i + 2]) = 1;
    }
#undef SEEN
    free(seen), free(ptr), free(fresh);
    return out;
oom:
    snprintf(err, errlen, "schedule: out of host memory");
fail:
    pp_schedule_free(out);
    free(seen), free(ptr), free(fresh);
    return NULL;
}

/* ---- V kinds (rank r owns stages r and 2p-1-r) -------------------------------- */

static void gen_zbv(builder *b, int p, int m) {
    const int n = m > 2 * p - 1 ? m : 2 * p - 1; /* enough microbatches to fill the V; extras become idle */
    for (int r = 0; r < p; r++) {
        const int c0 = r, c1 = 2 * p - 1 - r;
        int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
        pp_schedule *s = b->s;
        const int start = s->len[r];
        idle(b, r, r);
        for (int i = 0; i < 2 * (p - r) - 1; i++) put(b, r, PP_F, c0, f0++);
        for (int i = 0; i < r; i++) {
            put(b, r, PP_F, c1, f1++);
            put(b, r, PP_F, c0, f0++);
        }
        for (int i = 0; i < p - r; i++) {
            put(b, r, PP_F, c1, f1);
            put(b, r, PP_I, c1, b1);
            put(b, r, PP_W, c1, b1);
            f1++, b1++;
        }
        while (f1 < f0 || f0 < n) {
            if (f0 < n) put(b, r, PP_F, c0, f0++);
            put(b, r, PP_I, c0, b0);
            put(b, r, PP_W, c0, b0);
            b0++;
            put(b, r, PP_F, c1, f1++);
            put(b, r, PP_I, c1, b1);
            put(b, r, PP_W, c1, b1);
            b1++;
        }
        int w0 = b0, w1 = b1;
        for (int i = 0; i < r; i++) {
            put(b, r, PP_I, c0, b0++);
            put(b, r, PP_I, c1, b1++);
        }
        for (int i = 0; i < p - r; i++) {
            put(b, r, PP_I, c0, b0++);
            put(b, r, PP_W, c0, w0++);
        }
        while (w1 < b1) put(b, r, PP_W, c1, w1++);
        while (w0 < b0) put(b, r, PP_W, c0, w0++);
        if (b->oom) return;
        for (int i = start; i < s->len[r]; i++)
            if (s->acts[r][i].type != PP_IDLE && s->acts[r][i].mb >= m)
                s->acts[r][i] = (pp_action){.type = PP_IDLE, .stage = -1, .mb = -1};
    }
}

/* DualPipeV: counters per (stage, F/I/W) and a FIFO of weight passes owed, as
 * in PyTorch's ScheduleDualPipeV. */
typedef struct {
    builder *b;
    int r;
    int *cnt; /* [stage][3]: F, I, W */
    int *wq;  /* (stage, mb) pairs */
    int wq_head, wq_tail;
} dpv;

static int *dcnt(dpv *d, int stage, pp_action_type t) {
    return &d->cnt[stage * 3 + (t == PP_F ? 0 : t == PP_I ? 1 : 2)];
}

static void dpv_add(dpv *d, int stage, pp_action_type t) {
    int *c = dcnt(d, stage, t == PP_B ? PP_I : t);
    int mb = *c;
    put(d->b, d->r, t, stage, mb);
    if (t == PP_B) { /* a full backward settles both its I and W counts */
        (*c)++;
        (*dcnt(d, stage, PP_W))++;
        return;
    }
    if (t == PP_I) {
        d->wq[2 * d->wq_tail] = stage;
        d->wq[2 * d->wq_tail + 1] = mb;
        d->wq_tail++;
    }
    (*c)++;
}

static void dpv_overlap(dpv *d, int fstage, int bstage) {
    pp_action a;
    memset(&a, 0, sizeof a);
    a.type = PP_OVERLAP_F_B;
    a.stage = a.mb = -1;
    a.n_sub = 2;
    a.sub[0] = (pp_op){PP_F, fstage, (*dcnt(d, fstage, PP_F))++};
    a.sub[1] = (pp_op){PP_B, bstage, *dcnt(d, bstage, PP_I)};
    (*dcnt(d, bstage, PP_I))++;
    (*dcnt(d, bstage, PP_W))++;
    if (!d->b->oom && pp_schedule_push_action(d->b->s, d->r, &a)) d->b->oom = 1;
}

static void dpv_weight(dpv *d) {
    if (d->wq_head == d->wq_tail) return;
    int st = d->wq[2 * d->wq_head], mb = d->wq[2 * d->wq_head + 1];
    d->wq_head++;
    put(d->b, d->r, PP_W, st, mb);
    (*dcnt(d, st, PP_W))++;
}

static int gen_dualpipev(builder *b, int p, int m, char *err, size_t errlen) {
    const int S = 2 * p;
    int *cnt = malloc((size_t)S * 3 * sizeof *cnt), *wq = malloc((size_t)(S * m + 1) * 2 * sizeof *wq);
    if (!cnt || !wq) {
        free(cnt), free(wq);
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    for (int r = 0; r < p; r++) {
        memset(cnt, 0, (size_t)S * 3 * sizeof *cnt);
        dpv d = {b, r, cnt, wq, 0, 0};
        const int s0 = r, s1 = 2 * p - 1 - r;
        for (int i = 0; i < 2 * (p - r - 1); i++) dpv_add(&d, s0, PP_F);
        for (int i = 0; i < r + 1; i++) {
            dpv_add(&d, s0, PP_F);
            dpv_add(&d, s1, PP_F);
        }
        for (int i = 0; i < p - r - 1; i++) {
            dpv_add(&d, s1, PP_I);
            dpv_weight(&d);
            dpv_add(&d, s1, PP_F);
        }
        for (int i = 0; i < m - 2 * p + r + 1; i++) {
            if (i == 0 && r == p - 1) { /* the last rank runs its first pair back to back, not overlapped */
                dpv_add(&d, s0, PP_F);
                dpv_add(&d, s1, PP_B);
            } else {
                dpv_overlap(&d, s0, s1);
            }
            dpv_overlap(&d, s1, s0);
        }
        for (int i = 0; i < p - r - 1; i++) {
            dpv_add(&d, s1, PP_B);
            dpv_overlap(&d, s1, s0);
        }
        /* the second half of the cool-down splits backwards to fill the bubble */
        const int n6 = r + 1;
        int zb = 0;
        for (int i = 0; i < n6; i++) {
            if (i == n6 / 2 && r % 2 == 1) zb = 1;
            dpv_add(&d, s1, zb ? PP_I : PP_B);
            if (i == n6 / 2 && r % 2 == 0) zb = 1;
            dpv_add(&d, s0, zb ? PP_I : PP_B);
        }
        for (int i = 0; i < p - r - 1; i++) {
            dpv_weight(&d);
            dpv_add(&d, s0, zb ? PP_I : PP_B);
        }
        for (int i = 0; i < r + 1; i++) dpv_weight(&d);
    }
    free(cnt), free(wq);
    return 0;
}

/* ---- entry point --------------------------------------------------------------- */

pp_schedule *pp_schedule_generate(pp_schedule_kind k, int n_ranks, int stages_per_rank, int n_microbatches, char *err,
                                  size_t errlen) {
    const char *name = pp_schedule_kind_name(k);
    const int p = n_ranks, v = stages_per_rank, m = n_microbatches;
    if ((int)k < 0 || k >= PP_N_SCHEDULE_KINDS) {
        snprintf(err, errlen, "schedule: unknown schedule kind %d (one of %s)", (int)k, pp_schedule_kind_list());
        return NULL;
    }
    if (p < 1 || v < 1 || m < 1) {
        snprintf(err, errlen,
                 "schedule %s: pipeline ranks (%d), stages per rank (%d) and microbatches (%d) must be >= 1", name, p,
                 v, m);
        return NULL;
    }
    if (pp_schedule_kind_single_stage(k) && v != 1) {
        snprintf(err, errlen,
                 "schedule %s: runs one stage per rank, got %d stages per rank (use Interleaved1F1B, LoopedBFS or "
                 "InterleavedZeroBubble for several)",
                 name, v);
        return NULL;
    }
    if (pp_schedule_kind_v(k) && v != 2) {
        snprintf(err, errlen, "schedule %s: needs exactly 2 stages per rank (V placement), got %d", name, v);
        return NULL;
    }
    if (k == PP_SCHED_1F1B && m < p) {
        snprintf(err, errlen,
                 "schedule %s: needs at least as many microbatches as stages, got %d microbatches for %d stages", name,
                 m, p);
        return NULL;
    }
    if (k == PP_SCHED_INTERLEAVED_1F1B || k == PP_SCHED_INTERLEAVED_ZB) {
        const int rounds = m / p > 1 ? m / p : 1;
        if (m % rounds) {
            snprintf(
                err, errlen,
                "schedule %s: microbatches (%d) must be a multiple of the rounds max(1, microbatches / ranks) = %d",
                name, m, rounds);
            return NULL;
        }
    }
    if (k == PP_SCHED_DUALPIPEV && m < p * v) {
        snprintf(err, errlen,
                 "schedule %s: needs at least as many microbatches as stages, got %d microbatches for %d stages", name,
                 m, p * v);
        return NULL;
    }
    builder b = {pp_schedule_new(p, p * v, m), 0};
    if (!b.s) {
        snprintf(err, errlen, "schedule: out of host memory");
        return NULL;
    }
    int rc = 0;
    switch (k) {
    case PP_SCHED_GPIPE: gen_gpipe(&b, p, m); break;
    case PP_SCHED_1F1B: gen_1f1b(&b, p, m); break;
    case PP_SCHED_LOOPED_BFS: gen_looped_bfs(&b, p, v, m); break;
    case PP_SCHED_INTERLEAVED_1F1B:
    case PP_SCHED_INTERLEAVED_ZB:
        for (int r = 0; r < p && !rc; r++)
            rc = gen_interleaved_rank(&b, p, v, m, r, k == PP_SCHED_INTERLEAVED_ZB, err, errlen);
        break;
    case PP_SCHED_ZBV: gen_zbv(&b, p, m); break;
    case PP_SCHED_DUALPIPEV: rc = gen_dualpipev(&b, p, m, err, errlen); break;
    default: break;
    }
    if (!rc && b.oom) {
        snprintf(err, errlen, "schedule: out of host memory");
        rc = -1;
    }
    if (!rc && k == PP_SCHED_INTERLEAVED_ZB) {
        pp_schedule *bubbled = add_bubbles(b.s, err, errlen);
        pp_schedule_free(b.s);
        b.s = bubbled;
        if (!bubbled) rc = -1;
    }
    if (rc) {
        pp_schedule_free(b.s);
        return NULL;
    }
    char why[400];
    if (pp_schedule_validate(b.s, why, sizeof why)) {
        snprintf(err, errlen, "schedule %s with %d ranks, %d stages per rank, %d microbatches: %s", name, p, v, m, why);
        pp_schedule_free(b.s);
        return NULL;
    }
    return b.s;
}
