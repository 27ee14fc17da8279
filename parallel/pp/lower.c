/* lower.c — compute-only schedule to the lists ranks run, and the check of such
 * lists (see lower.h).
 *
 * The passes are PyTorch's (torch/distributed/pipelining/schedules.py, 2.15:
 * _add_unshard_reshard, _add_reduce_grad, _add_send_recv, _add_wait_send with the
 * defaults of _PipelineScheduleRuntime), kept step for step so that the output
 * equals PyTorch's compute_comms CSV; tests/assets/pp_schedules holds PyTorch's
 * own output for a grid of schedules.
 */
#include "parallel/pp/lower.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/pp/sim.h"

static void fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(char *err, size_t errlen, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* The compute leaves of an action: its parts for OVERLAP_F_B, else itself. */
static int leaves(const pp_action *a, pp_op *out) {
    if (a->type == PP_OVERLAP_F_B) {
        for (int k = 0; k < a->n_sub; k++) out[k] = a->sub[k];
        return a->n_sub;
    }
    out[0] = (pp_op){a->type, a->stage, a->mb};
    return 1;
}

static int push(pp_schedule *s, int r, pp_action_type t, int stage, int mb, int *oom) {
    if (!*oom && pp_schedule_push(s, r, t, stage, mb)) *oom = 1;
    return *oom;
}

/* ---- 2. UNSHARD / RESHARD --------------------------------------------------------- */

/* The next `count` distinct stages that compute actions from position i on use;
 * an overlapped action's stages all count, even past `count`. `avail` is how many
 * distinct stages appear from i on: once all are found the scan stops (without it a
 * rank with fewer stages than `count`, as every 1F1B rank, scans to its end from
 * every action). */
static int next_stages(const pp_action *acts, int len, int i, int count, int avail, int *out, int cap) {
    int n = 0;
    for (; i < len && n < avail; i++) {
        if (acts[i].type == PP_IDLE) continue;
        pp_op l[PP_MAX_SUB];
        int nl = leaves(&acts[i], l);
        for (int k = 0; k < nl; k++) {
            int seen = 0;
            for (int j = 0; j < n; j++) seen |= out[j] == l[k].stage;
            if (!seen && n < cap) out[n++] = l[k].stage;
        }
        if (n >= count) break;
    }
    return n;
}

static int add_unshard_reshard(const pp_schedule *c, int r, int max_active, pp_schedule *out, char *err,
                               size_t errlen) {
    const pp_action *acts = c->acts[r];
    const int len = c->len[r], cap = max_active + PP_MAX_SUB;
    int *active = malloc((size_t)c->n_stages * sizeof *active), n_active = 0; /* in unshard order */
    int *resident = malloc((size_t)cap * sizeof *resident);
    int *last = malloc((size_t)c->n_stages * sizeof *last); /* the last action using each stage, or -1 */
    int oom = 0, rc = -1;
    char a[96];
    if (!active || !resident || !last) {
        fail(err, errlen, "lower: out of host memory");
        goto done;
    }
    for (int s = 0; s < c->n_stages; s++) last[s] = -1;
    for (int i = 0; i < len; i++) {
        if (acts[i].type == PP_IDLE) continue;
        pp_op l[PP_MAX_SUB];
        int nl = leaves(&acts[i], l);
        for (int k = 0; k < nl; k++)
            if (l[k].stage >= 0 && l[k].stage < c->n_stages) last[l[k].stage] = i;
    }
    for (int i = 0; i < len; i++) {
        const pp_action *x = &acts[i];
        if (x->type == PP_IDLE) continue;
        pp_op l[PP_MAX_SUB];
        int nl = leaves(x, l), distinct = 0, avail = 0;
        for (int s = 0; s < c->n_stages; s++) avail += last[s] >= i;
        for (int k = 0; k < nl; k++) {
            int dup = 0;
            for (int j = 0; j < k; j++) dup |= l[j].stage == l[k].stage;
            distinct += !dup;
        }
        if (distinct > max_active) {
            fail(err, errlen,
                 "lower: rank %d, action %d (%s): needs %d stages at once, more than max_active_stages = %d", r, i,
                 pp_action_str(x, a, sizeof a), distinct, max_active);
            goto done;
        }
        /* residency and prefetch windows are the same ("full" lookahead) */
        int nres = next_stages(acts, len, i, max_active, avail, resident, cap);
        for (int j = 0; j < n_active;) { /* evict what the window no longer holds, oldest first */
            int keep = 0;
            for (int k = 0; k < nres; k++) keep |= resident[k] == active[j];
            if (keep) {
                j++;
                continue;
            }
            if (push(out, r, PP_RESHARD, active[j], -1, &oom)) goto nomem;
            memmove(&active[j], &active[j + 1], (size_t)(n_active - j - 1) * sizeof *active);
            n_active--;
        }
        for (int k = 0; k < nres; k++) {
            int on = 0;
            for (int j = 0; j < n_active; j++) on |= active[j] == resident[k];
            if (on) continue;
            if (push(out, r, PP_UNSHARD, resident[k], -1, &oom)) goto nomem;
            active[n_active++] = resident[k];
        }
        if (pp_schedule_push_action(out, r, x)) goto nomem;
    }
    for (int j = 0; j < n_active; j++)
        if (push(out, r, PP_RESHARD, active[j], -1, &oom)) goto nomem;
    rc = 0;
    goto done;
nomem:
    fail(err, errlen, "lower: out of host memory");
done:
    free(active);
    free(resident);
    free(last);
    return rc;
}

/* ---- 3. REDUCE_GRAD / WAIT_REDUCE_GRAD --------------------------------------------- */

static int add_reduce_grad(const pp_schedule *in, int r, pp_schedule *out) {
    int *cnt = calloc((size_t)in->n_stages, sizeof *cnt), oom = 0;
    if (!cnt) return -1;
    for (int i = 0; i < in->len[r] && !oom; i++) {
        const pp_action *x = &in->acts[r][i];
        if (x->type == PP_IDLE) continue;
        if (pp_schedule_push_action(out, r, x)) oom = 1;
        pp_op l[PP_MAX_SUB];
        int nl = leaves(x, l);
        for (int k = 0; k < nl; k++) /* after the m-th B or W of a stage, its gradients are final */
            if ((l[k].type == PP_B || l[k].type == PP_W) && ++cnt[l[k].stage] == in->n_microbatches) {
                push(out, r, PP_REDUCE_GRAD, l[k].stage, -1, &oom);
                push(out, r, PP_WAIT_REDUCE_GRAD, l[k].stage, -1, &oom);
            }
    }
    free(cnt);
    return oom ? -1 : 0;
}

/* ---- 4. SEND / RECV ----------------------------------------------------------------- */

/* What has been placed, by (type, stage, mb). Each of these actions lives on the
 * rank of its stage, so one table serves all ranks; "on the same rank" is asked
 * explicitly where PyTorch looks at a rank's own set. */
enum { K_F, K_I, K_W, K_B, K_SEND_F, K_RECV_F, K_SEND_B, K_RECV_B, K_N };

typedef struct {
    int S, M;
    unsigned char *t; /* [K_N][S][M] */
} done_table;

static int done_init(done_table *d, int S, int M) {
    d->S = S;
    d->M = M;
    d->t = calloc((size_t)K_N * (size_t)S * (size_t)M, 1);
    return d->t ? 0 : -1;
}

static int kind_of(pp_action_type t) {
    switch (t) {
    case PP_F: return K_F;
    case PP_I: return K_I;
    case PP_W: return K_W;
    case PP_B: return K_B;
    case PP_SEND_F: return K_SEND_F;
    case PP_RECV_F: return K_RECV_F;
    case PP_SEND_B: return K_SEND_B;
    case PP_RECV_B: return K_RECV_B;
    default: return -1;
    }
}

static unsigned char *done_at(const done_table *d, int k, int stage, int mb) {
    if (k < 0 || stage < 0 || stage >= d->S || mb < 0 || mb >= d->M) return NULL;
    return &d->t[((size_t)k * (size_t)d->S + (size_t)stage) * (size_t)d->M + (size_t)mb];
}

static int is_done(const done_table *d, int k, int stage, int mb) {
    unsigned char *p = done_at(d, k, stage, mb);
    return p && *p;
}

static void mark(done_table *d, pp_action_type t, int stage, int mb) {
    unsigned char *p = done_at(d, kind_of(t), stage, mb);
    if (p) *p = 1;
}

/* A compute leaf's input is here: the first stage's F and the last stage's
 * backward need nothing; otherwise a receive on this stage, or the neighbour
 * stage's output produced on the same rank. */
static int input_ready(const done_table *d, const int *stage_rank, int S, pp_op o) {
    if (o.type == PP_F) {
        if (o.stage == 0) return 1;
        return is_done(d, K_RECV_F, o.stage, o.mb) ||
            (stage_rank[o.stage - 1] == stage_rank[o.stage] && is_done(d, K_F, o.stage - 1, o.mb));
    }
    if (o.type == PP_I || o.type == PP_B) {
        if (o.stage == S - 1) return 1;
        int local = stage_rank[o.stage + 1] == stage_rank[o.stage];
        return is_done(d, K_RECV_B, o.stage, o.mb) || (local && is_done(d, K_I, o.stage + 1, o.mb)) ||
            (local && is_done(d, K_B, o.stage + 1, o.mb));
    }
    return 1;
}

/* Whether a compute leaf's output crosses to another rank. */
static int has_comms(const int *stage_rank, int S, pp_op o) {
    if (o.type == PP_F) return o.stage != S - 1 && stage_rank[o.stage + 1] != stage_rank[o.stage];
    if (o.type == PP_I || o.type == PP_B) return o.stage != 0 && stage_rank[o.stage - 1] != stage_rank[o.stage];
    return 0;
}

/* Round robin over the ranks: place each rank's next action once its input is
 * there; a cross-rank output appends the send here and the receive on the peer. */
static int add_send_recv(const pp_schedule *in, pp_schedule *out, char *err, size_t errlen) {
    const int P = in->n_ranks, S = in->n_stages;
    const int *sr = in->stage_rank;
    int *head = calloc((size_t)P, sizeof *head), oom = 0, rc = -1;
    done_table d = {0, 0, NULL};
    if (!head || done_init(&d, S, in->n_microbatches)) {
        fail(err, errlen, "lower: out of host memory");
        goto done;
    }
    for (;;) {
        int left = 0, progress = 0;
        for (int r = 0; r < P; r++) {
            if (head[r] >= in->len[r]) continue;
            left = 1;
            const pp_action *x = &in->acts[r][head[r]];
            pp_op l[PP_MAX_SUB];
            int nl = leaves(x, l), ready = 1;
            if (pp_action_is_compute(x->type))
                for (int k = 0; k < nl; k++) ready &= input_ready(&d, sr, S, l[k]);
            if (!ready) continue;
            if (x->type != PP_IDLE) {
                if (pp_schedule_push_action(out, r, x)) oom = 1;
                if (pp_action_is_compute(x->type))
                    for (int k = 0; k < nl; k++) {
                        mark(&d, l[k].type, l[k].stage, l[k].mb);
                        if (!has_comms(sr, S, l[k])) continue;
                        int fwd = l[k].type == PP_F, peer_stage = fwd ? l[k].stage + 1 : l[k].stage - 1;
                        pp_action_type st = fwd ? PP_SEND_F : PP_SEND_B, rt = fwd ? PP_RECV_F : PP_RECV_B;
                        push(out, r, st, l[k].stage, l[k].mb, &oom);
                        mark(&d, st, l[k].stage, l[k].mb);
                        push(out, sr[peer_stage], rt, peer_stage, l[k].mb, &oom);
                        mark(&d, rt, peer_stage, l[k].mb);
                    }
            }
            head[r]++;
            progress = 1;
        }
        if (oom) {
            fail(err, errlen, "lower: out of host memory");
            goto done;
        }
        if (!left) break;
        if (!progress) {
            size_t k = (size_t)snprintf(err, errlen, "lower: malformed compute schedule, no rank can go on:");
            for (int r = 0; r < P && k < errlen; r++) {
                if (head[r] >= in->len[r]) continue;
                char a[96];
                k += (size_t)snprintf(err + k, errlen - k, " rank %d waits at action %d (%s) for its input;", r,
                                      head[r], pp_action_str(&in->acts[r][head[r]], a, sizeof a));
            }
            goto done;
        }
    }
    rc = 0;
done:
    free(head);
    free(d.t);
    return rc;
}

/* ---- 5. WAIT_SEND --------------------------------------------------------------------- */

/* A forward send is waited for right after the local backward of the same stage
 * and microbatch (the peer has consumed it by then); every other send at the end
 * of the list, in the order sent. */
static int add_wait_send(const pp_schedule *in, int r, pp_schedule *out) {
    const int S = in->n_stages, M = in->n_microbatches;
    int n = in->len[r], n_pend = 0, oom = 0;
    pp_action *pend = malloc((size_t)(n ? n : 1) * sizeof *pend); /* sends in order; type IDLE once waited */
    int *slot = malloc((size_t)S * (size_t)M * sizeof *slot);     /* SEND_F (stage, mb) -> index in pend */
    if (!pend || !slot) {
        free(pend), free(slot);
        return -1;
    }
    for (size_t i = 0; i < (size_t)S * (size_t)M; i++) slot[i] = -1;
    for (int i = 0; i < n && !oom; i++) {
        const pp_action *x = &in->acts[r][i];
        if (pp_schedule_push_action(out, r, x)) oom = 1;
        if (x->type == PP_SEND_F || x->type == PP_SEND_B) {
            if (x->type == PP_SEND_F) slot[(size_t)x->stage * (size_t)M + (size_t)x->mb] = n_pend;
            pend[n_pend++] = *x;
        }
        pp_op l[PP_MAX_SUB];
        int nl = pp_action_is_compute(x->type) ? leaves(x, l) : 0;
        for (int k = 0; k < nl; k++) {
            if (l[k].type != PP_B && l[k].type != PP_I) continue;
            int *sl = &slot[(size_t)l[k].stage * (size_t)M + (size_t)l[k].mb];
            if (*sl < 0) continue;
            push(out, r, PP_WAIT_SEND_F, l[k].stage, l[k].mb, &oom);
            pend[*sl].type = PP_IDLE;
            *sl = -1;
        }
    }
    for (int j = 0; j < n_pend; j++)
        if (pend[j].type != PP_IDLE)
            push(out, r, pend[j].type == PP_SEND_F ? PP_WAIT_SEND_F : PP_WAIT_SEND_B, pend[j].stage, pend[j].mb, &oom);
    free(pend), free(slot);
    return oom ? -1 : 0;
}

/* ---- the lowering ------------------------------------------------------------------------ */

pp_schedule *pp_schedule_lower(const pp_schedule *compute, const pp_lower_options *o, char *err, size_t errlen) {
    const int max_active = o ? o->max_active_stages : 3;
    const int P = compute->n_ranks, S = compute->n_stages, M = compute->n_microbatches;
    pp_schedule *a = NULL, *b = NULL, *c = NULL, *d = NULL;
    char why[400], txt[96];
    if (max_active < 1) {
        fail(err, errlen, "lower: max_active_stages must be >= 1, got %d", max_active);
        return NULL;
    }
    for (int r = 0; r < P; r++)
        for (int i = 0; i < compute->len[r]; i++) {
            const pp_action *x = &compute->acts[r][i];
            if (x->type != PP_IDLE && !pp_action_is_compute(x->type)) {
                fail(
                    err, errlen,
                    "lower: rank %d, action %d (%s): a compute-only schedule holds compute actions and idle slots only",
                    r, i, pp_action_str(x, txt, sizeof txt));
                return NULL;
            }
        }
    if (pp_schedule_validate(compute, why, sizeof why)) {
        fail(err, errlen, "lower: %s", why);
        return NULL;
    }
    a = pp_schedule_new(P, S, M);
    b = pp_schedule_new(P, S, M);
    c = pp_schedule_new(P, S, M);
    d = pp_schedule_new(P, S, M);
    if (!a || !b || !c || !d) {
        fail(err, errlen, "lower: out of host memory");
        goto fail;
    }
    pp_schedule *all[4] = {a, b, c, d};
    for (int k = 0; k < 4; k++) memcpy(all[k]->stage_rank, compute->stage_rank, (size_t)S * sizeof *a->stage_rank);
    for (int r = 0; r < P; r++) {
        if (add_unshard_reshard(compute, r, max_active, a, err, errlen)) goto fail;
        if (add_reduce_grad(a, r, b)) {
            fail(err, errlen, "lower: out of host memory");
            goto fail;
        }
    }
    if (add_send_recv(b, c, err, errlen)) goto fail;
    for (int r = 0; r < P; r++)
        if (add_wait_send(c, r, d)) {
            fail(err, errlen, "lower: out of host memory");
            goto fail;
        }
    pp_schedule_free(a);
    pp_schedule_free(b);
    pp_schedule_free(c);
    return d;
fail:
    pp_schedule_free(a);
    pp_schedule_free(b);
    pp_schedule_free(c);
    pp_schedule_free(d);
    return NULL;
}

/* ---- the check ---------------------------------------------------------------------------- */

/* The peer of a send or receive: (its stage, its rank). */
static int peer_stage(const pp_action *x) {
    return x->type == PP_SEND_F || x->type == PP_RECV_B ? x->stage + 1 : x->stage - 1;
}

#define BAD(r, i, ...)                                                                                                 \
    do {                                                                                                               \
        char a_[96], m_[300];                                                                                          \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                                          \
        fail(err, errlen, "lowered schedule: rank %d, action %d (%s): %s", (r), (i),                                   \
             pp_action_str(&s->acts[(r)][(i)], a_, sizeof a_), m_);                                                    \
        goto done;                                                                                                     \
    } while (0)

/* Every action in place on its own list: stages on this rank, inputs before compute,
 * sends after what they send, waits after what they wait for. */
static int check_rank(const pp_schedule *s, int r, done_table *seen, char *err, size_t errlen) {
    const int S = s->n_stages, M = s->n_microbatches;
    const int *sr = s->stage_rank;
    int rc = -1, pending_reduce = -1, pending_reduce_at = -1;
    unsigned char *waited = calloc((size_t)2 * (size_t)S * (size_t)M, 1); /* [F/B][stage][mb] */
    if (!waited) {
        fail(err, errlen, "lowered schedule: out of host memory");
        return -1;
    }
    for (int i = 0; i < s->len[r]; i++) {
        const pp_action *x = &s->acts[r][i];
        if (x->type == PP_IDLE) BAD(r, i, "an idle slot in a lowered schedule (its lists hold actions only)");
        if (pp_action_is_compute(x->type)) {
            pp_op l[PP_MAX_SUB];
            int nl = leaves(x, l);
            for (int k = 0; k < nl; k++)
                if (!input_ready(seen, sr, S, l[k])) {
                    int f = l[k].type == PP_F, nb = f ? l[k].stage - 1 : l[k].stage + 1;
                    if (sr[nb] == r)
                        BAD(r, i,
                            "its input is not there: stage %d's %s of microbatch %d (on this rank) has not run "
                            "before it",
                            nb, f ? "forward" : "backward", l[k].mb);
                    BAD(r, i, "its input has not arrived: no %d%s%d before it on this rank", l[k].stage,
                        f ? "RECV_F" : "RECV_B", l[k].mb);
                }
            for (int k = 0; k < nl; k++) mark(seen, l[k].type, l[k].stage, l[k].mb);
            continue;
        }
        if (x->stage < 0 || x->stage >= S) BAD(r, i, "stage %d outside 0..%d", x->stage, S - 1);
        if (sr[x->stage] != r) BAD(r, i, "stage %d runs on rank %d, not here", x->stage, sr[x->stage]);
        if (pp_action_stage_only(x->type)) {
            if (x->type == PP_REDUCE_GRAD) {
                if (pending_reduce >= 0)
                    BAD(r, i, "a second reduction starts while stage %d's (action %d) is still pending", pending_reduce,
                        pending_reduce_at);
                pending_reduce = x->stage;
                pending_reduce_at = i;
            } else if (x->type == PP_WAIT_REDUCE_GRAD) {
                if (pending_reduce != x->stage)
                    BAD(r, i, "waits for a reduction of stage %d that is not pending here", x->stage);
                pending_reduce = -1;
            }
            continue;
        }
        if (x->mb < 0 || x->mb >= M) BAD(r, i, "microbatch %d outside 0..%d", x->mb, M - 1);
        if (x->type == PP_WAIT_SEND_F || x->type == PP_WAIT_SEND_B) {
            int fwd = x->type == PP_WAIT_SEND_F;
            unsigned char *w = &waited[((size_t)!fwd * (size_t)S + (size_t)x->stage) * (size_t)M + (size_t)x->mb];
            if (!is_done(seen, fwd ? K_SEND_F : K_SEND_B, x->stage, x->mb) || *w)
                BAD(r, i, "waits for a send that is not pending here (no %d%s%d before it, or already waited for)",
                    x->stage, fwd ? "SEND_F" : "SEND_B", x->mb);
            *w = 1;
            continue;
        }
        /* sends and receives */
        int ps = peer_stage(x);
        if (ps < 0 || ps >= S) BAD(r, i, "no stage %d to exchange with", ps);
        if (sr[ps] == r) BAD(r, i, "stage %d is on this rank too: it gets its data without a message", ps);
        int k = kind_of(x->type);
        if (is_done(seen, k, x->stage, x->mb)) BAD(r, i, "a second time");
        if (x->type == PP_SEND_F && !is_done(seen, K_F, x->stage, x->mb))
            BAD(r, i, "sends before its forward %dF%d", x->stage, x->mb);
        if (x->type == PP_SEND_B && !is_done(seen, K_I, x->stage, x->mb) && !is_done(seen, K_B, x->stage, x->mb))
            BAD(r, i, "sends before its backward %dI%d or %dB%d", x->stage, x->mb, x->stage, x->mb);
        mark(seen, x->type, x->stage, x->mb);
    }
    if (pending_reduce >= 0)
        BAD(r, pending_reduce_at, "the reduction of stage %d is never waited for (no WAIT_REDUCE_GRAD)",
            pending_reduce);
    for (int i = 0; i < s->len[r]; i++) {
        const pp_action *x = &s->acts[r][i];
        if (x->type != PP_SEND_F && x->type != PP_SEND_B) continue;
        int fwd = x->type == PP_SEND_F;
        if (!waited[((size_t)!fwd * (size_t)S + (size_t)x->stage) * (size_t)M + (size_t)x->mb])
            BAD(r, i, "never waited for (no %d%s%d after it)", x->stage, fwd ? "WAIT_SEND_F" : "WAIT_SEND_B", x->mb);
    }
    rc = 0;
done:
    free(waited);
    return rc;
}

/* Messages between two ranks match in order: the runtime pairs them first in,
 * first out on one tag. */
static int check_pairs(const pp_schedule *s, char *err, size_t errlen) {
    const int P = s->n_ranks;
    const int *sr = s->stage_rank;
    char ta[96], tb[96];
    for (int A = 0; A < P; A++)
        for (int B = 0; B < P; B++) {
            if (A == B) continue;
            int i = 0, j = 0, n = 0;
            for (;;) {
                while (i < s->len[A] &&
                       !((s->acts[A][i].type == PP_SEND_F || s->acts[A][i].type == PP_SEND_B) &&
                         sr[peer_stage(&s->acts[A][i])] == B))
                    i++;
                while (j < s->len[B] &&
                       !((s->acts[B][j].type == PP_RECV_F || s->acts[B][j].type == PP_RECV_B) &&
                         sr[peer_stage(&s->acts[B][j])] == A))
                    j++;
                if (i == s->len[A] && j == s->len[B]) break;
                if (i == s->len[A]) {
                    fail(err, errlen,
                         "lowered schedule: rank %d, action %d (%s): receives from rank %d, which sends it no "
                         "message #%d (it sends only %d)",
                         B, j, pp_action_str(&s->acts[B][j], tb, sizeof tb), A, n + 1, n);
                    return -1;
                }
                const pp_action *x = &s->acts[A][i];
                if (j == s->len[B]) {
                    fail(err, errlen,
                         "lowered schedule: rank %d, action %d (%s): sends to rank %d, which posts no "
                         "receive #%d (it receives only %d)",
                         A, i, pp_action_str(x, ta, sizeof ta), B, n + 1, n);
                    return -1;
                }
                const pp_action *y = &s->acts[B][j];
                int match = ((x->type == PP_SEND_F && y->type == PP_RECV_F) ||
                             (x->type == PP_SEND_B && y->type == PP_RECV_B)) &&
                    peer_stage(x) == y->stage && x->mb == y->mb;
                if (!match) {
                    fail(err, errlen,
                         "lowered schedule: message #%d from rank %d to rank %d: rank %d sends %s (action %d) "
                         "but rank %d receives %s (action %d) there; the two lists must order their messages alike",
                         n + 1, A, B, A, pp_action_str(x, ta, sizeof ta), i, B, pp_action_str(y, tb, sizeof tb), j);
                    return -1;
                }
                i++, j++, n++;
            }
        }
    return 0;
}

/* PyTorch's _simulate_comms_compute: every step, each rank runs its next action if
 * it can; a second sweep lets a rank use what a higher rank just did. Sends
 * complete once the peer posted the receive; FSDP actions are local. */
static int sim_ready(const pp_schedule *s, const done_table *d, const pp_action *x) {
    const int S = s->n_stages;
    const int *sr = s->stage_rank;
    if (pp_action_is_compute(x->type)) {
        pp_op l[PP_MAX_SUB];
        int nl = leaves(x, l);
        for (int k = 0; k < nl; k++)
            if (!input_ready(d, sr, S, l[k])) return 0;
        return 1;
    }
    switch (x->type) {
    case PP_SEND_F: return is_done(d, K_F, x->stage, x->mb);
    case PP_SEND_B: return is_done(d, K_I, x->stage, x->mb) || is_done(d, K_B, x->stage, x->mb);
    case PP_RECV_F: return is_done(d, K_SEND_F, x->stage - 1, x->mb);
    case PP_RECV_B: return is_done(d, K_SEND_B, x->stage + 1, x->mb);
    case PP_WAIT_SEND_F: return is_done(d, K_SEND_F, x->stage, x->mb) && is_done(d, K_RECV_F, x->stage + 1, x->mb);
    case PP_WAIT_SEND_B: return is_done(d, K_SEND_B, x->stage, x->mb) && is_done(d, K_RECV_B, x->stage - 1, x->mb);
    default: return 1;
    }
}

static void sim_run(done_table *d, const pp_action *x) {
    pp_op l[PP_MAX_SUB];
    int nl = pp_action_is_compute(x->type) ? leaves(x, l) : 0;
    for (int k = 0; k < nl; k++) mark(d, l[k].type, l[k].stage, l[k].mb);
    if (!nl) mark(d, x->type, x->stage, x->mb);
}

static int dry_run(const pp_schedule *s, int *steps, char *err, size_t errlen) {
    const int P = s->n_ranks;
    int *head = calloc((size_t)P, sizeof *head), *idle_now = calloc((size_t)P, sizeof *idle_now), rc = -1, t = 0;
    done_table d = {0, 0, NULL};
    if (!head || !idle_now || done_init(&d, s->n_stages, s->n_microbatches)) {
        fail(err, errlen, "lowered schedule: out of host memory");
        goto done;
    }
    for (;;) {
        int left = 0, progress = 0;
        for (int r = 0; r < P; r++) {
            idle_now[r] = 0;
            if (head[r] >= s->len[r]) continue;
            left = 1;
            const pp_action *x = &s->acts[r][head[r]];
            if (sim_ready(s, &d, x)) {
                sim_run(&d, x);
                head[r]++;
                progress = 1;
            } else {
                idle_now[r] = 1;
            }
        }
        if (!left) break;
        t++;
        for (int r = 0; r < P; r++) {
            if (!idle_now[r] || head[r] >= s->len[r]) continue;
            const pp_action *x = &s->acts[r][head[r]];
            if (sim_ready(s, &d, x)) {
                sim_run(&d, x);
                head[r]++;
            }
        }
        if (!progress) {
            size_t k = (size_t)snprintf(err, errlen, "lowered schedule: deadlock at step %d, no rank can go on:", t);
            for (int r = 0; r < P && k < errlen; r++) {
                if (head[r] >= s->len[r]) continue;
                char a[96];
                k += (size_t)snprintf(err + k, errlen - k, " rank %d waits at action %d (%s);", r, head[r],
                                      pp_action_str(&s->acts[r][head[r]], a, sizeof a));
            }
            goto done;
        }
    }
    if (steps) *steps = t;
    rc = 0;
done:
    free(head);
    free(idle_now);
    free(d.t);
    return rc;
}

int pp_schedule_check_lowered_in(const pp_schedule *s, int models, int *steps, char *err, size_t errlen) {
    char why[400];
    if (models < 1 || models > PP_P2P_ALL) {
        fail(err, errlen, "lowered schedule: unknown point-to-point models %d", models);
        return -1;
    }
    if (pp_schedule_validate(s, why, sizeof why)) {
        fail(err, errlen, "lowered schedule: %s", why);
        return -1;
    }
    done_table seen = {0, 0, NULL};
    if (done_init(&seen, s->n_stages, s->n_microbatches)) {
        fail(err, errlen, "lowered schedule: out of host memory");
        return -1;
    }
    /* each rank on its own: a table per rank, cleared between them */
    for (int r = 0; r < s->n_ranks; r++) {
        memset(seen.t, 0, (size_t)K_N * (size_t)s->n_stages * (size_t)s->n_microbatches);
        if (check_rank(s, r, &seen, err, errlen)) {
            free(seen.t);
            return -1;
        }
    }
    free(seen.t);
    if (check_pairs(s, err, errlen)) return -1;
    if ((models & PP_P2P_MPI) && dry_run(s, steps, err, errlen)) return -1;
    if (models & PP_P2P_STREAMS) {
        char e[2048];
        if (pp_sim_streams(s, models & PP_P2P_MPI ? NULL : steps, e, sizeof e)) {
            fail(err, errlen, "lowered schedule: %s", e);
            return -1;
        }
    }
    return 0;
}

int pp_schedule_check_lowered(const pp_schedule *s, int *steps, char *err, size_t errlen) {
    return pp_schedule_check_lowered_in(s, PP_P2P_ALL, steps, err, errlen);
}
