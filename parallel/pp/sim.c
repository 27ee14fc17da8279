/* sim.c — the pipeline timing simulator (see sim.h).
 *
 * Every action's start is max(its rank free, its inputs' ends [+ tcomm]); that is
 * a fixed point over the ranks' lists, so the ranks are swept repeatedly, each
 * advanced while its next action's inputs have known end times. A sweep that
 * advances no rank while some list is unfinished is a deadlock.
 *
 * The stream mode (pp_sim_streams) is a separate dry run, in rounds: every list
 * runs until an action waits for a message, then every head batch that can
 * complete does, all at once.
 */
#include "parallel/pp/sim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The three kinds of result a dependency can name: a forward, a backward (I or B:
 * either produces the input gradient the previous stage waits for), a W. */
enum { K_F = 0, K_BW, K_W, K_N };

typedef struct {
    int n_stages, n_mb;
    unsigned char *listed[K_N]; /* some rank lists it */
    unsigned char *is_i;        /* the K_BW entry is an I (so a W may follow and activations live on) */
    unsigned char *done[K_N];
    int *rank[K_N]; /* rank that listed / ran it */
    double *end[K_N];
} table;

static int key(const table *t, int stage, int mb) { return stage * t->n_mb + mb; }

static int kind_of(pp_action_type ty) { return ty == PP_F ? K_F : ty == PP_W ? K_W : K_BW; }

static double op_duration(pp_action_type ty, const pp_sim_times *t) {
    switch (ty) {
    case PP_F: return t->tf;
    case PP_I: return t->tb;
    case PP_W: return t->tw;
    case PP_B: return t->tb + t->tw;
    default: return 0;
    }
}

static void table_free(table *t) {
    for (int k = 0; k < K_N; k++) {
        free(t->listed[k]);
        free(t->done[k]);
        free(t->rank[k]);
        free(t->end[k]);
    }
    free(t->is_i);
}

static int table_init(table *t, int n_stages, int n_mb) {
    memset(t, 0, sizeof *t);
    t->n_stages = n_stages;
    t->n_mb = n_mb;
    size_t n = (size_t)n_stages * (size_t)n_mb;
    int ok = 1;
    for (int k = 0; k < K_N; k++) {
        t->listed[k] = calloc(n, 1);
        t->done[k] = calloc(n, 1);
        t->rank[k] = calloc(n, sizeof(int));
        t->end[k] = calloc(n, sizeof(double));
        ok = ok && t->listed[k] && t->done[k] && t->rank[k] && t->end[k];
    }
    t->is_i = calloc(n, 1);
    if (!ok || !t->is_i) {
        table_free(t);
        return -1;
    }
    return 0;
}

/* The compute ops of one action: itself, or an OVERLAP_F_B's parts. */
static int action_ops(const pp_action *a, pp_op *ops) {
    if (a->type == PP_OVERLAP_F_B) {
        for (int i = 0; i < a->n_sub; i++) ops[i] = a->sub[i];
        return a->n_sub;
    }
    if (a->type == PP_F || a->type == PP_I || a->type == PP_W || a->type == PP_B) {
        ops[0] = (pp_op){a->type, a->stage, a->mb};
        return 1;
    }
    return 0;
}

/* Dependencies of one op as (kind, stage, mb); returns how many. */
static int op_deps(const pp_op *o, int n_stages, int dk[2], int ds[2]) {
    int n = 0;
    switch (o->type) {
    case PP_F:
        if (o->stage > 0) dk[n] = K_F, ds[n++] = o->stage - 1;
        break;
    case PP_I:
    case PP_B:
        dk[n] = K_F, ds[n++] = o->stage;
        if (o->stage < n_stages - 1) dk[n] = K_BW, ds[n++] = o->stage + 1;
        break;
    case PP_W: dk[n] = K_BW, ds[n++] = o->stage; break;
    default: break;
    }
    return n;
}

static void dep_name(const table *t, int kind, int stage, int mb, char *buf, size_t n) {
    if (kind == K_F) snprintf(buf, n, "%dF%d", stage, mb);
    else if (kind == K_W) snprintf(buf, n, "%dW%d", stage, mb);
    else if (t->listed[K_BW][key(t, stage, mb)])
        snprintf(buf, n, "%d%s%d", stage, t->is_i[key(t, stage, mb)] ? "I" : "B", mb);
    else snprintf(buf, n, "%dI%d or %dB%d", stage, mb, stage, mb);
}

/* Append to err (a deadlock report grows one rank at a time). */
static void err_append(char *err, size_t errlen, const char *fmt, ...) {
    size_t used = strlen(err);
    if (used + 1 >= errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + used, errlen - used, fmt, ap);
    va_end(ap);
}

void pp_sim_free(pp_sim_result *r) {
    if (!r) return;
    if (r->slices)
        for (int i = 0; i < r->n_ranks; i++) free(r->slices[i]);
    free(r->slices);
    free(r->n_slices);
    free(r->rank_stages);
    free(r->busy);
    free(r->idle);
    free(r->peak_in_flight);
    free(r);
}

double pp_sim_peak_model_mb(const pp_sim_result *r, int rank) {
    int v = r->rank_stages[rank] > 0 ? r->rank_stages[rank] : 1;
    return (double)r->peak_in_flight[rank] / v;
}

/* First pass: what each rank lists, range and duplicate checks. */
static int scan(const pp_schedule *s, table *t, char *err, size_t errlen) {
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < s->len[r]; i++) {
            pp_op ops[PP_MAX_SUB];
            int n = action_ops(&s->acts[r][i], ops);
            for (int j = 0; j < n; j++) {
                char buf[64];
                pp_action one = {ops[j].type, ops[j].stage, ops[j].mb, 0, {{0, 0, 0}, {0, 0, 0}}};
                pp_action_str(&one, buf, sizeof buf);
                if (ops[j].type != PP_F && ops[j].type != PP_I && ops[j].type != PP_W && ops[j].type != PP_B) {
                    snprintf(err, errlen, "rank %d action %d: OVERLAP_F_B part %s is not F, I, W or B", r, i, buf);
                    return -1;
                }
                if (ops[j].stage < 0 || ops[j].stage >= s->n_stages || ops[j].mb < 0 ||
                    ops[j].mb >= s->n_microbatches) {
                    snprintf(err, errlen, "rank %d action %d: %s is outside the schedule's %d stages x %d microbatches",
                             r, i, buf, s->n_stages, s->n_microbatches);
                    return -1;
                }
                int k = kind_of(ops[j].type), q = key(t, ops[j].stage, ops[j].mb);
                if (t->listed[k][q]) {
                    snprintf(err, errlen, "rank %d action %d: %s is listed twice (first on rank %d)", r, i, buf,
                             t->rank[k][q]);
                    return -1;
                }
                t->listed[k][q] = 1;
                t->rank[k][q] = r;
                if (ops[j].type == PP_I) t->is_i[q] = 1;
            }
        }
    for (int q = 0; q < t->n_stages * t->n_mb; q++)
        if (t->listed[K_W][q] && !(t->listed[K_BW][q] && t->is_i[q])) {
            snprintf(err, errlen, "rank %d lists %dW%d without %dI%d (a W needs its I; a B already includes it)",
                     t->rank[K_W][q], q / t->n_mb, q % t->n_mb, q / t->n_mb, q % t->n_mb);
            return -1;
        }
    return 0;
}

/* The time one op's inputs are there, or -1 if one is not done yet (that
 * dependency's kind and stage in *mk, *ms). */
static double op_ready(const table *t, const pp_op *o, int rank, const pp_sim_times *tm, int *mk, int *ms) {
    int dk[2], ds[2];
    int n = op_deps(o, t->n_stages, dk, ds);
    double ready = 0;
    for (int d = 0; d < n; d++) {
        int q = key(t, ds[d], o->mb);
        if (!t->done[dk[d]][q]) {
            *mk = dk[d];
            *ms = ds[d];
            return -1;
        }
        double e = t->end[dk[d]][q] + (t->rank[dk[d]][q] != rank ? tm->tcomm : 0);
        if (e > ready) ready = e;
    }
    return ready;
}

typedef struct {
    double time;
    int delta;
} flight_event;

static int flight_cmp(const void *a, const void *b) {
    const flight_event *x = a, *y = b;
    if (x->time != y->time) return x->time < y->time ? -1 : 1;
    return x->delta - y->delta; /* releases before acquisitions at the same instant */
}

/* Peak (stage, mb) pairs alive per rank: from the F's start to the end of the B,
 * or of the W when the backward was split. */
static int peak_in_flight(pp_sim_result *res, const table *t) {
    for (int r = 0; r < res->n_ranks; r++) {
        int n = 0;
        flight_event *ev = malloc((size_t)(2 * res->n_slices[r] + 1) * sizeof *ev);
        if (!ev) return -1;
        for (int i = 0; i < res->n_slices[r]; i++) {
            const pp_sim_slice *sl = &res->slices[r][i];
            int q = key(t, sl->stage, sl->mb);
            if (sl->type == PP_F) ev[n++] = (flight_event){sl->start, +1};
            else if (sl->type == PP_B || sl->type == PP_W || (sl->type == PP_I && !t->listed[K_W][q]))
                ev[n++] = (flight_event){sl->end, -1};
        }
        qsort(ev, (size_t)n, sizeof *ev, flight_cmp);
        int cur = 0, peak = 0;
        for (int i = 0; i < n; i++) {
            cur += ev[i].delta;
            if (cur > peak) peak = cur;
        }
        res->peak_in_flight[r] = peak;
        free(ev);
    }
    return 0;
}

/* Each rank's stages in increasing order give the chunk index of a slice. */
static int fill_chunks(pp_sim_result *res, int n_stages) {
    unsigned char *has = calloc((size_t)n_stages, 1);
    if (!has) return -1;
    for (int r = 0; r < res->n_ranks; r++) {
        memset(has, 0, (size_t)n_stages);
        for (int i = 0; i < res->n_slices[r]; i++) has[res->slices[r][i].stage] = 1;
        int count = 0;
        for (int st = 0; st < n_stages; st++) count += has[st];
        res->rank_stages[r] = count;
        if (count > res->max_stages_per_rank) res->max_stages_per_rank = count;
        for (int i = 0; i < res->n_slices[r]; i++) {
            int c = 0;
            for (int st = 0; st < res->slices[r][i].stage; st++) c += has[st];
            res->slices[r][i].chunk = c;
        }
    }
    free(has);
    return 0;
}

static int check_times(const pp_sim_times *t, char *err, size_t errlen) {
    const char *names[4] = {"tf", "tb", "tw", "tcomm"};
    double v[4] = {t->tf, t->tb, t->tw, t->tcomm};
    for (int i = 0; i < 4; i++)
        if (!(v[i] >= 0)) { /* also NaN */
            snprintf(err, errlen, "%s must be a time >= 0, got %g", names[i], v[i]);
            return -1;
        }
    return 0;
}

pp_sim_result *pp_sim_run(const pp_schedule *s, const pp_sim_times *tm, char *err, size_t errlen) {
    if (errlen) err[0] = 0;
    if (!s || s->n_ranks < 1 || s->n_stages < 1 || s->n_microbatches < 1) {
        snprintf(err, errlen, "empty schedule");
        return NULL;
    }
    if (check_times(tm, err, errlen)) return NULL;
    table t;
    if (table_init(&t, s->n_stages, s->n_microbatches)) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    pp_sim_result *res = calloc(1, sizeof *res);
    int *pos = calloc((size_t)s->n_ranks, sizeof *pos), *part = calloc((size_t)s->n_ranks, sizeof *part);
    double *free_at = calloc((size_t)s->n_ranks, sizeof *free_at);
    if (!res || !pos || !part || !free_at) goto oom;
    res->n_ranks = s->n_ranks;
    res->n_stages = s->n_stages;
    res->n_microbatches = s->n_microbatches;
    res->times = *tm;
    res->n_slices = calloc((size_t)s->n_ranks, sizeof *res->n_slices);
    res->slices = calloc((size_t)s->n_ranks, sizeof *res->slices);
    res->rank_stages = calloc((size_t)s->n_ranks, sizeof *res->rank_stages);
    res->busy = calloc((size_t)s->n_ranks, sizeof *res->busy);
    res->idle = calloc((size_t)s->n_ranks, sizeof *res->idle);
    res->peak_in_flight = calloc((size_t)s->n_ranks, sizeof *res->peak_in_flight);
    if (!res->n_slices || !res->slices || !res->rank_stages || !res->busy || !res->idle || !res->peak_in_flight)
        goto oom;
    for (int r = 0; r < s->n_ranks; r++) {
        int n = 0;
        for (int i = 0; i < s->len[r]; i++) {
            pp_op ops[PP_MAX_SUB];
            n += action_ops(&s->acts[r][i], ops);
        }
        res->slices[r] = malloc((size_t)(n ? n : 1) * sizeof **res->slices);
        if (!res->slices[r]) goto oom;
    }
    if (scan(s, &t, err, errlen)) goto fail;

    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < s->n_ranks; r++) {
            while (pos[r] < s->len[r]) {
                const pp_action *a = &s->acts[r][pos[r]];
                pp_op ops[PP_MAX_SUB];
                int n = action_ops(a, ops), mk, ms;
                /* an OVERLAP_F_B's parts run in order, each once its own input is there */
                while (part[r] < n) {
                    const pp_op *o = &ops[part[r]];
                    double ready = op_ready(&t, o, r, tm, &mk, &ms);
                    if (ready < 0) break;
                    double at = free_at[r] > ready ? free_at[r] : ready, d = op_duration(o->type, tm);
                    pp_sim_slice *sl = &res->slices[r][res->n_slices[r]++];
                    *sl = (pp_sim_slice){o->type, o->stage, o->mb, 0, pos[r], a->type == PP_OVERLAP_F_B, at, at + d};
                    int k = kind_of(o->type), q = key(&t, o->stage, o->mb);
                    t.done[k][q] = 1;
                    t.end[k][q] = at + d;
                    res->busy[r] += d;
                    free_at[r] = at + d;
                    part[r]++;
                    progress = 1;
                }
                if (part[r] < n) break;
                if (a->type == PP_OVERLAP_F_B) res->has_overlap = 1;
                part[r] = 0;
                pos[r]++;
                progress = 1;
            }
        }
    }
    int stuck = 0;
    for (int r = 0; r < s->n_ranks; r++) stuck += pos[r] < s->len[r];
    if (stuck) {
        snprintf(err, errlen, "deadlock: %d rank%s cannot progress:", stuck, stuck > 1 ? "s" : "");
        for (int r = 0; r < s->n_ranks; r++) {
            if (pos[r] >= s->len[r]) continue;
            const pp_action *a = &s->acts[r][pos[r]];
            pp_op ops[PP_MAX_SUB];
            action_ops(a, ops);
            int mk = 0, ms = 0, mb = ops[part[r]].mb;
            op_ready(&t, &ops[part[r]], r, tm, &mk, &ms);
            char abuf[96], dbuf[64];
            pp_action_str(a, abuf, sizeof abuf);
            dep_name(&t, mk, ms, mb, dbuf, sizeof dbuf);
            int q = key(&t, ms, mb);
            if (t.listed[mk][q])
                err_append(err, errlen, " rank %d at %s (action %d) waits for %s on rank %d;", r, abuf, pos[r], dbuf,
                           t.rank[mk][q]);
            else
                err_append(err, errlen, " rank %d at %s (action %d) waits for %s, which no rank lists;", r, abuf,
                           pos[r], dbuf);
        }
        size_t l = strlen(err);
        if (l && err[l - 1] == ';') err[l - 1] = 0;
        goto fail;
    }

    double makespan = 0;
    for (int r = 0; r < s->n_ranks; r++)
        if (free_at[r] > makespan) makespan = free_at[r];
    res->makespan = makespan;
    for (int r = 0; r < s->n_ranks; r++) {
        res->idle[r] = makespan - res->busy[r];
        res->idle_total += res->idle[r];
    }
    res->bubble_fraction = makespan > 0 ? res->idle_total / (s->n_ranks * makespan) : 0;
    if (fill_chunks(res, s->n_stages) || peak_in_flight(res, &t)) goto oom;
    res->ideal = s->n_microbatches * (tm->tf + tm->tb + tm->tw) * res->max_stages_per_rank;
    table_free(&t);
    free(pos);
    free(part);
    free(free_at);
    return res;
oom:
    snprintf(err, errlen, "out of memory");
fail:
    table_free(&t);
    free(pos);
    free(part);
    free(free_at);
    pp_sim_free(res);
    return NULL;
}

/* ---- stream mode: a lowered schedule's messages on one FIFO per rank -------------------- */

/* The four posting kinds index the table of completed messages. */
enum { M_SEND_F = 0, M_RECV_F, M_SEND_B, M_RECV_B, M_N };

static int msg_kind(pp_action_type t) {
    return t == PP_SEND_F ? M_SEND_F : t == PP_RECV_F ? M_RECV_F : t == PP_SEND_B ? M_SEND_B : M_RECV_B;
}

typedef struct {
    const pp_schedule *s;
    int *pos;                /* [P] next action of each list (posting never blocks: a batch goes on at once) */
    int *head;               /* [P] first action of the batch at the head of the stream; >= pos: empty */
    unsigned char *complete; /* [M_N][S][M] */
} streams;

static unsigned char *msg_done(const streams *f, pp_action_type t, int stage, int mb) {
    const pp_schedule *s = f->s;
    return &f->complete[((size_t)msg_kind(t) * (size_t)s->n_stages + (size_t)stage) * (size_t)s->n_microbatches +
                        (size_t)mb];
}

/* The other end of a message: its action (type, stage, mb) on the peer's list. */
static pp_action partner(const pp_action *x) {
    switch (x->type) {
    case PP_SEND_F: return (pp_action){PP_RECV_F, x->stage + 1, x->mb, 0, {{0, 0, 0}, {0, 0, 0}}};
    case PP_RECV_F: return (pp_action){PP_SEND_F, x->stage - 1, x->mb, 0, {{0, 0, 0}, {0, 0, 0}}};
    case PP_SEND_B: return (pp_action){PP_RECV_B, x->stage - 1, x->mb, 0, {{0, 0, 0}, {0, 0, 0}}};
    default: return (pp_action){PP_SEND_B, x->stage + 1, x->mb, 0, {{0, 0, 0}, {0, 0, 0}}};
    }
}

static int is_send(pp_action_type t) { return t == PP_SEND_F || t == PP_SEND_B; }

static int peer_of(const streams *f, const pp_action *x) { return f->s->stage_rank[partner(x).stage]; }

static int batch_end(const streams *f, int r) { return pp_post_batch_end(f->s->acts[r], f->s->len[r], f->head[r]); }

/* Past the actions between batches that post nothing, up to what the list has posted. */
static void skip_to_head(streams *f, int r) {
    while (f->head[r] < f->pos[r] && !pp_action_posts(f->s->acts[r][f->head[r]].type)) f->head[r]++;
}

static int stream_empty(const streams *f, int r) { return f->head[r] >= f->pos[r]; }

/* The message action x of rank r must see completed before it runs: 1 with it in
 * *need, or 0 when x waits for nothing that is not done. */
static int blocked_on(const streams *f, int r, const pp_action *x, pp_action *need) {
    const pp_schedule *s = f->s;
    const int *sr = s->stage_rank;
    pp_op ops[PP_MAX_SUB];
    int n = action_ops(x, ops);
    for (int k = 0; k < n; k++) {
        const pp_op *o = &ops[k];
        pp_action_type t = PP_IDLE;
        if (o->type == PP_F && o->stage > 0 && sr[o->stage - 1] != r) t = PP_RECV_F;
        if ((o->type == PP_I || o->type == PP_B) && o->stage < s->n_stages - 1 && sr[o->stage + 1] != r) t = PP_RECV_B;
        if (t != PP_IDLE && !*msg_done(f, t, o->stage, o->mb)) {
            *need = (pp_action){t, o->stage, o->mb, 0, {{0, 0, 0}, {0, 0, 0}}};
            return 1;
        }
    }
    if (x->type == PP_WAIT_SEND_F || x->type == PP_WAIT_SEND_B) {
        pp_action_type t = x->type == PP_WAIT_SEND_F ? PP_SEND_F : PP_SEND_B;
        if (!*msg_done(f, t, x->stage, x->mb)) {
            *need = (pp_action){t, x->stage, x->mb, 0, {{0, 0, 0}, {0, 0, 0}}};
            return 1;
        }
    }
    return 0;
}

/* Run rank r's list until an action waits for a message; a batch goes on the stream
 * whole. 1 if it moved. */
static int advance(streams *f, int r) {
    const pp_action *acts = f->s->acts[r];
    const int start = f->pos[r];
    pp_action need;
    while (f->pos[r] < f->s->len[r]) {
        int p = f->pos[r];
        if (pp_action_posts(acts[p].type)) f->pos[r] = pp_post_batch_end(acts, f->s->len[r], p);
        else if (blocked_on(f, r, &acts[p], &need)) break;
        else f->pos[r]++;
    }
    skip_to_head(f, r);
    return f->pos[r] != start;
}

/* Whether rank r's action i, in its stream's head batch, may move now: its message is
 * not done and every earlier message of the batch to the same peer in the same
 * direction is (NCCL runs those in order; the rest of a group independently). */
static int head_op_ready(const streams *f, int r, int i) {
    const pp_action *x = &f->s->acts[r][i];
    if (*msg_done(f, x->type, x->stage, x->mb)) return 0;
    for (int j = f->head[r]; j < i; j++) {
        const pp_action *w = &f->s->acts[r][j];
        if (is_send(w->type) == is_send(x->type) && peer_of(f, w) == peer_of(f, x) &&
            !*msg_done(f, w->type, w->stage, w->mb))
            return 0;
    }
    return 1;
}

/* Index of action y in rank r's head batch, or -1. */
static int head_index(const streams *f, int r, const pp_action *y) {
    if (stream_empty(f, r)) return -1;
    for (int i = f->head[r], e = batch_end(f, r); i < e; i++) {
        const pp_action *x = &f->s->acts[r][i];
        if (x->type == y->type && x->stage == y->stage && x->mb == y->mb) return i;
    }
    return -1;
}

/* One round of the streams: every message whose two ends are both ready at the heads
 * of their streams completes; then every head batch whose messages are all done
 * leaves its stream. 1 if anything moved. */
static int complete_heads(streams *f) {
    const int P = f->s->n_ranks;
    int any = 0;
    for (int r = 0; r < P; r++)
        for (int i = f->head[r], e = stream_empty(f, r) ? i : batch_end(f, r); i < e; i++) {
            const pp_action *x = &f->s->acts[r][i];
            pp_action y = partner(x);
            int peer = peer_of(f, x), j = head_index(f, peer, &y);
            if (!is_send(x->type) || !head_op_ready(f, r, i) || j < 0 || !head_op_ready(f, peer, j)) continue;
            *msg_done(f, x->type, x->stage, x->mb) = 1; /* one message, both ends */
            *msg_done(f, y.type, y.stage, y.mb) = 1;
            any = 1;
        }
    for (int r = 0; r < P; r++) {
        if (stream_empty(f, r)) continue;
        int e = batch_end(f, r), all = 1;
        for (int i = f->head[r]; i < e; i++) {
            const pp_action *x = &f->s->acts[r][i];
            all &= *msg_done(f, x->type, x->stage, x->mb);
        }
        if (!all) continue;
        f->head[r] = e;
        skip_to_head(f, r);
        any = 1;
    }
    return any;
}

/* "0SEND_F2 to rank 1" */
static void op_text(const streams *f, const pp_action *x, char *buf, size_t n) {
    char a[64];
    snprintf(buf, n, "%s %s rank %d", pp_action_str(x, a, sizeof a), is_send(x->type) ? "to" : "from", peer_of(f, x));
}

/* The messages of rank r's head batch not done yet: one as op_text, several as
 * "the batch [a, b]". */
static void batch_text(const streams *f, int r, char *buf, size_t n) {
    const int e = batch_end(f, r);
    int open = 0;
    for (int i = f->head[r]; i < e; i++) {
        const pp_action *x = &f->s->acts[r][i];
        open += !*msg_done(f, x->type, x->stage, x->mb);
    }
    size_t k = 0;
    buf[0] = 0;
    if (open > 1) k += (size_t)snprintf(buf, n, "the batch [");
    for (int i = f->head[r], left = open; i < e && k < n; i++) {
        const pp_action *x = &f->s->acts[r][i];
        if (*msg_done(f, x->type, x->stage, x->mb)) continue;
        op_text(f, x, buf + k, n - k);
        k = strlen(buf);
        if (open > 1 && k < n) k += (size_t)snprintf(buf + k, n - k, --left ? ", " : "]");
    }
}

/* The first message of rank r's head batch not done: what holds the stream. */
static int holding_op(const streams *f, int r) {
    const int e = batch_end(f, r);
    for (int i = f->head[r]; i < e; i++) {
        const pp_action *x = &f->s->acts[r][i];
        if (!*msg_done(f, x->type, x->stage, x->mb)) return i;
    }
    return f->head[r];
}

static void report_rank(const streams *f, int r, char *err, size_t errlen) {
    const pp_schedule *s = f->s;
    char a[96], b[96] = "", h[96], ph[400];
    pp_action need;
    if (f->pos[r] < s->len[r]) {
        const pp_action *x = &s->acts[r][f->pos[r]];
        blocked_on(f, r, x, &need);
        err_append(err, errlen, " rank %d stuck at action %d (%s, waiting for %s)", r, f->pos[r],
                   pp_action_str(x, a, sizeof a), pp_action_str(&need, b, sizeof b));
    } else {
        err_append(err, errlen, " rank %d stuck at the end of its list", r);
    }
    if (stream_empty(f, r)) {
        err_append(err, errlen, ": its stream is empty, %s was never posted before;", b);
        return;
    }
    const int i = holding_op(f, r), n = batch_end(f, r) - f->head[r], peer = peer_of(f, &s->acts[r][i]);
    op_text(f, &s->acts[r][i], h, sizeof h);
    if (n > 1) snprintf(h + strlen(h), sizeof h - strlen(h), " (in a batch of %d)", n);
    if (stream_empty(f, peer)) snprintf(ph, sizeof ph, "whose stream is empty");
    else {
        char t[360];
        batch_text(f, peer, t, sizeof t);
        snprintf(ph, sizeof ph, "whose head is %s", t);
    }
    err_append(err, errlen, ": its stream's head is %s, %s;", h, ph);
}

/* Every message names a stage of this rank and a microbatch of the schedule, has its
 * peer stage on another rank, and is posted once. f->complete serves as the table
 * of what is posted and is cleared after. */
static int streams_check_input(streams *f, char *err, size_t errlen) {
    const pp_schedule *s = f->s;
    char why[400], a[96];
    if (pp_schedule_validate(s, why, sizeof why)) { /* which places every stage on its rank */
        snprintf(err, errlen, "stream mode: %s", why);
        return -1;
    }
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < s->len[r]; i++) {
            const pp_action *x = &s->acts[r][i];
            const int posts = pp_action_posts(x->type);
            if (!posts && x->type != PP_WAIT_SEND_F && x->type != PP_WAIT_SEND_B) continue;
            const int ps = posts ? partner(x).stage : 0;
            const char *why_not = NULL;
            if (x->stage < 0 || x->stage >= s->n_stages || x->mb < 0 || x->mb >= s->n_microbatches || ps < 0 ||
                ps >= s->n_stages || s->stage_rank[x->stage] != r || (posts && s->stage_rank[ps] == r))
                why_not = "not a message between this rank's stage and another rank's";
            else if (posts && *msg_done(f, x->type, x->stage, x->mb)) why_not = "posted a second time";
            if (why_not) {
                snprintf(err, errlen, "stream mode: rank %d, action %d (%s): %s", r, i, pp_action_str(x, a, sizeof a),
                         why_not);
                return -1;
            }
            if (posts) *msg_done(f, x->type, x->stage, x->mb) = 1;
        }
    memset(f->complete, 0, (size_t)M_N * (size_t)s->n_stages * (size_t)s->n_microbatches);
    return 0;
}

static int streams_run(streams *f, int *steps, char *err, size_t errlen) {
    const pp_schedule *s = f->s;
    for (int t = 0;; t++) {
        int moved = 0, left = 0;
        for (int r = 0; r < s->n_ranks; r++) moved |= advance(f, r);
        for (int r = 0; r < s->n_ranks; r++) left += f->pos[r] < s->len[r] || !stream_empty(f, r);
        if (!left) {
            if (steps) *steps = t + 1;
            return 0;
        }
        if (complete_heads(f) || moved) continue;
        snprintf(err, errlen,
                 "deadlock on serialised streams (NCCL: each rank runs its point-to-point batches one at a time, in "
                 "order): %d rank%s cannot progress:",
                 left, left > 1 ? "s" : "");
        for (int r = 0; r < s->n_ranks; r++)
            if (f->pos[r] < s->len[r] || !stream_empty(f, r)) report_rank(f, r, err, errlen);
        size_t l = strlen(err);
        if (l && err[l - 1] == ';') err[l - 1] = 0;
        return -1;
    }
}

int pp_sim_streams(const pp_schedule *s, int *steps, char *err, size_t errlen) {
    if (errlen) err[0] = 0;
    if (!s || s->n_ranks < 1 || s->n_stages < 1 || s->n_microbatches < 1) {
        snprintf(err, errlen, "stream mode: empty schedule");
        return -1;
    }
    const size_t P = (size_t)s->n_ranks;
    streams f = {s, calloc(P, sizeof(int)), calloc(P, sizeof(int)),
                 calloc((size_t)M_N * (size_t)s->n_stages * (size_t)s->n_microbatches, 1)};
    int rc = -1;
    if (!f.pos || !f.head || !f.complete) snprintf(err, errlen, "stream mode: out of memory");
    else if (!streams_check_input(&f, err, errlen)) rc = streams_run(&f, steps, err, errlen);
    free(f.pos);
    free(f.head);
    free(f.complete);
    return rc;
}
