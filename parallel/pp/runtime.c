/* runtime.c — walk a rank's actions, post its messages, call the stage's callbacks
 * (see runtime.h). */
#include "parallel/pp/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A posted message: its kind (SEND_F, RECV_F, SEND_B, RECV_B), stage and microbatch. */
typedef struct {
    pp_action_type type;
    int stage, mb;
    comm_request *req;
} posted;

typedef struct {
    const pp_schedule *s;
    int rank;
    const pp_stage_ops *ops;
    const pp_p2p *p2p;
    pp_run_stats st;
    posted *msg;
    int n_msg, cap_msg;
    int *done_bw; /* [n_stages] B or W actions run per stage */
    char *err;
    size_t errlen;
    int pos; /* the action being run */
} run_ctx;

/* The list running on this thread, for pp_progress (the callbacks run inside it). */
static run_ctx *active;

void pp_progress(void) {
    run_ctx *c = active;
    if (!c) return;
    for (int i = 0; i < c->n_msg; i++)
        if (c->msg[i].req) comm_test(c->msg[i].req);
}

static int fail(run_ctx *c, const char *why) {
    char b[64];
    if (c->pos >= 0 && c->pos < c->s->len[c->rank])
        snprintf(c->err, c->errlen, "schedule: rank %d, action %d (%s): %s", c->rank, c->pos,
                 pp_action_str(&c->s->acts[c->rank][c->pos], b, sizeof b), why);
    else snprintf(c->err, c->errlen, "schedule: rank %d: %s", c->rank, why);
    return -1;
}

static int find_msg(const run_ctx *c, pp_action_type t, int stage, int mb) {
    for (int i = 0; i < c->n_msg; i++)
        if (c->msg[i].type == t && c->msg[i].stage == stage && c->msg[i].mb == mb) return i;
    return -1;
}

static void drop_msg(run_ctx *c, int i) { c->msg[i] = c->msg[--c->n_msg]; }

static pp_buffer buffer_of(pp_action_type t) {
    switch (t) {
    case PP_SEND_F: return PP_BUF_ACT_OUT;
    case PP_RECV_F: return PP_BUF_ACT_IN;
    case PP_SEND_B: return PP_BUF_GRAD_IN;
    default: return PP_BUF_GRAD_OUT;
    }
}

/* Check one message of a batch, ask for its buffer and record it (its request comes
 * when the batch is posted); its op for comm_batch_p2p in *op. */
static int add_msg(run_ctx *c, pp_action_type t, int stage, int mb, comm_p2p_op *op) {
    const pp_schedule *s = c->s;
    if (!c->p2p || !c->p2p->group || !c->ops->buffer) return fail(c, "a message without a pipeline group or buffers");
    const int peer_stage = (t == PP_SEND_F || t == PP_RECV_B) ? stage + 1 : stage - 1;
    if (peer_stage < 0 || peer_stage >= s->n_stages || !s->stage_rank || s->stage_rank[peer_stage] < 0)
        return fail(c, "the peer stage is not part of the schedule");
    const int peer = s->stage_rank[peer_stage];
    if (peer == c->rank) return fail(c, "a message to a stage on the same rank");
    if (find_msg(c, t, stage, mb) >= 0) return fail(c, "posted twice");
    if (c->n_msg == c->cap_msg) {
        int nc = c->cap_msg ? 2 * c->cap_msg : 16;
        posted *nm = realloc(c->msg, (size_t)nc * sizeof *nm);
        if (!nm) return fail(c, "out of host memory");
        c->msg = nm;
        c->cap_msg = nc;
    }
    const int recv = t == PP_RECV_F || t == PP_RECV_B;
    *op =
        (comm_p2p_op){recv, c->ops->buffer(c->ops->user, stage, mb, buffer_of(t)), c->p2p->count, c->p2p->dtype, peer};
    c->msg[c->n_msg++] = (posted){t, stage, mb, NULL};
    if (recv) c->st.recvs++;
    else c->st.sends++;
    return 0;
}

/* Post actions [first, end) of the list, one batch by pp_post_batch_end, as one
 * comm_batch_p2p: under NCCL a rank's point-to-point operations run one after the
 * other on one stream, so two ranks that each post a send first would wait for each
 * other for ever; inside one group they cannot. Every message keeps its own request. */
static int post_batch(run_ctx *c, int first, int end) {
    const int n = end - first, base = c->n_msg;
    comm_p2p_op *ops = malloc((size_t)n * sizeof *ops);
    comm_request **reqs = malloc((size_t)n * sizeof *reqs);
    int rc = ops && reqs ? 0 : fail(c, "out of host memory");
    for (int k = 0; k < n && rc == 0; k++) {
        const pp_action *a = &c->s->acts[c->rank][first + k];
        c->pos = first + k;
        rc = add_msg(c, a->type, a->stage, a->mb, &ops[k]);
    }
    if (rc == 0) {
        comm_batch_p2p(c->p2p->group, ops, n, reqs);
        for (int k = 0; k < n; k++) c->msg[base + k].req = reqs[k];
    } else {
        c->n_msg = base; /* nothing of a refused batch was posted */
    }
    free(ops);
    free(reqs);
    return rc;
}

static void finish_send(run_ctx *c, int i) {
    posted p = c->msg[i];
    double t0 = now_s();
    comm_wait(p.req);
    c->st.send_wait_s += now_s() - t0;
    drop_msg(c, i);
    if (c->ops->sent) c->ops->sent(c->ops->user, p.stage, p.mb, buffer_of(p.type));
}

/* Before a compute action: its input, if a receive brings it. */
static void await_input(run_ctx *c, pp_action_type t, int stage, int mb) {
    pp_action_type rt = t == PP_F ? PP_RECV_F : (t == PP_I || t == PP_B) ? PP_RECV_B : PP_IDLE;
    if (rt == PP_IDLE) return;
    int i = find_msg(c, rt, stage, mb);
    if (i < 0) return; /* produced on this rank, or a first or last stage */
    double t0 = now_s();
    comm_wait(c->msg[i].req);
    c->st.recv_wait_s += now_s() - t0;
    drop_msg(c, i);
}

static int compute(run_ctx *c, pp_action_type t, int stage, int mb) {
    const pp_stage_ops *o = c->ops;
    const int nst = c->s->n_stages;
    if (stage < 0 || stage >= nst) return fail(c, "stage out of range");
    await_input(c, t, stage, mb);
    int last = 0;
    if (t == PP_B || t == PP_W) last = ++c->done_bw[stage] == c->s->n_microbatches;
    double t0 = now_s();
    switch (t) {
    case PP_F:
        if (!o->forward) return fail(c, "this runtime has no handler for it");
        o->forward(o->user, stage, mb);
        break;
    case PP_I:
        if (!o->backward_input) return fail(c, "this runtime has no handler for it");
        o->backward_input(o->user, stage, mb);
        break;
    case PP_W:
        if (!o->backward_weight) return fail(c, "this runtime has no handler for it");
        o->backward_weight(o->user, stage, mb, last);
        break;
    case PP_B:
        if (!o->backward) return fail(c, "this runtime has no handler for it");
        o->backward(o->user, stage, mb, last);
        break;
    default: return fail(c, "not a compute action");
    }
    const double dt = now_s() - t0;
    c->st.compute_s += dt;
    c->st.type_s[t] += dt;
    c->st.type_n[t]++;
    return 0;
}

static int stage_action(run_ctx *c, void (*fn)(void *, int), int stage) {
    if (!fn) return fail(c, "this runtime has no handler for it");
    double t0 = now_s();
    fn(c->ops->user, stage);
    c->st.fsdp_s += now_s() - t0;
    return 0;
}

int pp_run_rank(const pp_schedule *s, int rank, const pp_stage_ops *ops, const pp_p2p *p2p, pp_run_stats *stats,
                char *err, size_t errlen) {
    if (rank < 0 || rank >= s->n_ranks) {
        snprintf(err, errlen, "schedule: no action list for rank %d (%d ranks)", rank, s->n_ranks);
        return -1;
    }
    run_ctx c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.rank = rank;
    c.ops = ops;
    c.p2p = p2p;
    c.err = err;
    c.errlen = errlen;
    c.pos = -1;
    c.done_bw = calloc((size_t)s->n_stages, sizeof *c.done_bw);
    if (!c.done_bw) {
        snprintf(err, errlen, "schedule: out of host memory");
        return -1;
    }
    const double t_start = now_s();
    run_ctx *outer = active;
    active = &c;
    int rc = 0;
    for (int i = 0; i < s->len[rank] && rc == 0; i++) {
        const pp_action *a = &s->acts[rank][i];
        c.pos = i;
        switch (a->type) {
        case PP_F:
        case PP_I:
        case PP_W:
        case PP_B: rc = compute(&c, a->type, a->stage, a->mb); break;
        case PP_OVERLAP_F_B:
            for (int k = 0; k < a->n_sub && rc == 0; k++)
                rc = compute(&c, a->sub[k].type, a->sub[k].stage, a->sub[k].mb);
            break;
        case PP_UNSHARD: rc = stage_action(&c, ops->unshard, a->stage); break;
        case PP_RESHARD: rc = stage_action(&c, ops->reshard, a->stage); break;
        case PP_REDUCE_GRAD: rc = stage_action(&c, ops->reduce_grad, a->stage); break;
        case PP_WAIT_REDUCE_GRAD: rc = stage_action(&c, ops->wait_reduce_grad, a->stage); break;
        case PP_SEND_F:
        case PP_RECV_F:
        case PP_SEND_B:
        case PP_RECV_B: {
            const int end = pp_post_batch_end(s->acts[rank], s->len[rank], i);
            rc = post_batch(&c, i, end);
            i = end - 1;
            break;
        }
        case PP_WAIT_SEND_F:
        case PP_WAIT_SEND_B: {
            int k = find_msg(&c, a->type == PP_WAIT_SEND_F ? PP_SEND_F : PP_SEND_B, a->stage, a->mb);
            if (k < 0) rc = fail(&c, "a wait for a send that was not posted (or was waited for already)");
            else finish_send(&c, k);
            break;
        }
        case PP_IDLE: break;
        default: rc = fail(&c, "unknown action"); break;
        }
    }
    c.pos = -1;
    if (rc == 0) {
        /* sends the list did not wait for; a receive left over is a malformed schedule */
        for (int i = c.n_msg - 1; i >= 0; i--)
            if (c.msg[i].type == PP_SEND_F || c.msg[i].type == PP_SEND_B) finish_send(&c, i);
        if (c.n_msg > 0) {
            char what[96];
            snprintf(what, sizeof what, "the receive %d%s%d was never consumed by a compute action", c.msg[0].stage,
                     pp_action_type_name(c.msg[0].type), c.msg[0].mb);
            rc = fail(&c, what);
            for (int i = 0; i < c.n_msg; i++) comm_wait(c.msg[i].req);
        }
    }
    active = outer;
    c.st.total_s = now_s() - t_start;
    if (stats) *stats = c.st;
    free(c.msg);
    free(c.done_bw);
    return rc;
}
