/* schedule.c — the action IR, the degenerate schedule and the validator (see schedule.h). */
#include "parallel/pp/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[PP_N_ACTION_TYPES] = {
    "F",      "I",      "W",      "B",      "UNSHARD",     "RESHARD",     "REDUCE_GRAD", "WAIT_REDUCE_GRAD",
    "SEND_F", "RECV_F", "SEND_B", "RECV_B", "WAIT_SEND_F", "WAIT_SEND_B", "OVERLAP_F_B", ""};

const char *pp_action_type_name(pp_action_type t) { return (int)t >= 0 && t < PP_N_ACTION_TYPES ? type_names[t] : "?"; }

int pp_action_is_compute(pp_action_type t) {
    return t == PP_F || t == PP_I || t == PP_W || t == PP_B || t == PP_OVERLAP_F_B;
}

int pp_action_is_comm(pp_action_type t) {
    return t == PP_SEND_F || t == PP_RECV_F || t == PP_SEND_B || t == PP_RECV_B || t == PP_WAIT_SEND_F ||
        t == PP_WAIT_SEND_B;
}

int pp_action_stage_only(pp_action_type t) {
    return t == PP_UNSHARD || t == PP_RESHARD || t == PP_REDUCE_GRAD || t == PP_WAIT_REDUCE_GRAD;
}

int pp_action_posts(pp_action_type t) { return t == PP_SEND_F || t == PP_RECV_F || t == PP_SEND_B || t == PP_RECV_B; }

int pp_post_batch_end(const pp_action *acts, int len, int i) {
    while (i >= 0 && i < len && pp_action_posts(acts[i].type)) i++;
    return i;
}

static int is_leaf_compute(pp_action_type t) { return t == PP_F || t == PP_I || t == PP_W || t == PP_B; }

char *pp_action_str(const pp_action *a, char *buf, size_t n) {
    if (!n) return buf;
    if (a->type == PP_IDLE) {
        buf[0] = '\0';
    } else if (a->type == PP_OVERLAP_F_B) {
        size_t k = 0;
        int w = snprintf(buf, n, "(");
        k = w > 0 ? (size_t)w : 0;
        for (int i = 0; i < a->n_sub && k < n; i++) {
            w = snprintf(buf + k, n - k, "%s%d%s%d", i ? ";" : "", a->sub[i].stage, pp_action_type_name(a->sub[i].type),
                         a->sub[i].mb);
            if (w > 0) k += (size_t)w;
        }
        if (k < n) snprintf(buf + k, n - k, ")%s", type_names[PP_OVERLAP_F_B]);
    } else if (pp_action_stage_only(a->type)) {
        snprintf(buf, n, "%d%s", a->stage, pp_action_type_name(a->type));
    } else {
        snprintf(buf, n, "%d%s%d", a->stage, pp_action_type_name(a->type), a->mb);
    }
    return buf;
}

static int parse_uint(const char **pp, const char *end, long limit, long *out) {
    const char *p = *pp;
    long v = 0;
    if (p >= end || *p < '0' || *p > '9') return -1;
    while (p < end && *p >= '0' && *p <= '9') {
        v = v * 10 + (*p++ - '0');
        if (v > limit) return -1;
    }
    *pp = p;
    *out = v;
    return 0;
}

/* "{stage}{type}{mb}" over [p, end), exactly; OVERLAP_F_B and IDLE are not plain actions. */
static int parse_plain(const char *p, const char *end, pp_action *out) {
    long stage, mb = -1;
    if (parse_uint(&p, end, 1000000, &stage)) return -1;
    /* the longest name that matches: W against WAIT_SEND_F, R... against RECV_F, RESHARD, REDUCE_GRAD */
    int type = -1;
    size_t tl = 0;
    for (int t = 0; t < PP_N_ACTION_TYPES; t++) {
        if (t == PP_OVERLAP_F_B || t == PP_IDLE) continue;
        size_t l = strlen(type_names[t]);
        if (l > tl && (size_t)(end - p) >= l && !strncmp(p, type_names[t], l)) {
            type = t;
            tl = l;
        }
    }
    if (type < 0) return -1;
    p += tl;
    if (pp_action_stage_only((pp_action_type)type)) {
        if (p != end) return -1;
    } else {
        if (parse_uint(&p, end, 100000000, &mb) || p != end) return -1;
    }
    memset(out, 0, sizeof *out);
    out->type = (pp_action_type)type;
    out->stage = (int)stage;
    out->mb = (int)mb;
    return 0;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

int pp_action_parse(const char *s, pp_action *out) {
    const char *b = s, *e = s + strlen(s);
    while (b < e && is_blank(*b)) b++;
    while (e > b && is_blank(e[-1])) e--;
    if (b == e) {
        memset(out, 0, sizeof *out);
        out->type = PP_IDLE;
        out->stage = -1;
        out->mb = -1;
        return 0;
    }
    if (*b != '(') return parse_plain(b, e, out);
    /* "(sub;sub)OVERLAP_F_B" */
    const char *close = memchr(b, ')', (size_t)(e - b));
    if (!close) return -1;
    const char *tail = close + 1;
    size_t nl = strlen(type_names[PP_OVERLAP_F_B]);
    if ((size_t)(e - tail) != nl || strncmp(tail, type_names[PP_OVERLAP_F_B], nl)) return -1;
    pp_action r;
    memset(&r, 0, sizeof r);
    r.type = PP_OVERLAP_F_B;
    r.stage = -1;
    r.mb = -1;
    const char *p = b + 1;
    for (;;) {
        const char *q = p;
        while (q < close && *q != ';') q++;
        const char *sb = p, *se = q;
        while (sb < se && is_blank(*sb)) sb++;
        while (se > sb && is_blank(se[-1])) se--;
        pp_action sub;
        if (r.n_sub == PP_MAX_SUB || parse_plain(sb, se, &sub) || !is_leaf_compute(sub.type)) return -1;
        r.sub[r.n_sub++] = (pp_op){sub.type, sub.stage, sub.mb};
        if (q == close) break;
        p = q + 1;
    }
    *out = r;
    return 0;
}

pp_schedule *pp_schedule_new(int n_ranks, int n_stages, int n_microbatches) {
    if (n_ranks < 1 || n_stages < 1 || n_microbatches < 1) return NULL;
    pp_schedule *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->n_ranks = n_ranks;
    s->n_stages = n_stages;
    s->n_microbatches = n_microbatches;
    s->len = calloc((size_t)n_ranks, sizeof *s->len);
    s->acts = calloc((size_t)n_ranks, sizeof *s->acts);
    s->stage_rank = malloc((size_t)n_stages * sizeof *s->stage_rank);
    if (!s->len || !s->acts || !s->stage_rank) {
        pp_schedule_free(s);
        return NULL;
    }
    for (int i = 0; i < n_stages; i++) s->stage_rank[i] = -1;
    return s;
}

int pp_schedule_push_action(pp_schedule *s, int rank, const pp_action *a) {
    if (rank < 0 || rank >= s->n_ranks) return -1;
    int n = s->len[rank];
    if (n == 0 || (n >= 8 && (n & (n - 1)) == 0)) { /* capacity: 8, then doubled when full */
        pp_action *na = realloc(s->acts[rank], (n ? 2 * (size_t)n : 8) * sizeof *na);
        if (!na) return -1;
        s->acts[rank] = na;
    }
    pp_action *d = &s->acts[rank][n];
    *d = *a;
    if (a->type == PP_IDLE) {
        d->stage = -1;
        d->mb = -1;
        d->n_sub = 0;
    } else if (a->type == PP_OVERLAP_F_B) {
        d->stage = -1;
        d->mb = -1;
    } else {
        d->n_sub = 0;
        if (pp_action_stage_only(a->type)) d->mb = -1;
    }
    s->len[rank] = n + 1;
    return 0;
}

int pp_schedule_push(pp_schedule *s, int rank, pp_action_type t, int stage, int mb) {
    pp_action a;
    memset(&a, 0, sizeof a);
    a.type = t;
    a.stage = stage;
    a.mb = mb;
    return pp_schedule_push_action(s, rank, &a);
}

pp_schedule *pp_schedule_copy(const pp_schedule *s) {
    pp_schedule *c = pp_schedule_new(s->n_ranks, s->n_stages, s->n_microbatches);
    if (!c) return NULL;
    memcpy(c->stage_rank, s->stage_rank, (size_t)s->n_stages * sizeof *c->stage_rank);
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < s->len[r]; i++)
            if (pp_schedule_push_action(c, r, &s->acts[r][i])) {
                pp_schedule_free(c);
                return NULL;
            }
    return c;
}

void pp_schedule_free(pp_schedule *s) {
    if (!s) return;
    if (s->acts)
        for (int r = 0; r < s->n_ranks; r++) free(s->acts[r]);
    free(s->acts);
    free(s->len);
    free(s->stage_rank);
    free(s);
}

pp_schedule *pp_schedule_accumulate(int m) {
    pp_schedule *s = pp_schedule_new(1, 1, m);
    if (!s) return NULL;
    for (int i = 0; i < m; i++)
        if (pp_schedule_push(s, 0, PP_F, 0, i) || pp_schedule_push(s, 0, PP_B, 0, i)) {
            pp_schedule_free(s);
            return NULL;
        }
    s->stage_rank[0] = 0;
    return s;
}

/* per (stage, mb): what has run */
enum { SEEN_F = 1, SEEN_I = 2, SEEN_W = 4, SEEN_B = 8 };

/* One compute leaf of rank r at position i: updates owner/seen, or the broken rule in why. */
static int check_leaf(const pp_schedule *s, int r, pp_action_type t, int stage, int mb, int *owner, unsigned char *seen,
                      char *why, size_t n) {
    const int S = s->n_stages, M = s->n_microbatches;
    if (stage < 0 || stage >= S) {
        snprintf(why, n, "stage %d outside 0..%d", stage, S - 1);
        return -1;
    }
    if (owner[stage] >= 0 && owner[stage] != r) {
        snprintf(why, n, "stage %d already runs on rank %d", stage, owner[stage]);
        return -1;
    }
    owner[stage] = r;
    if (mb < 0 || mb >= M) {
        snprintf(why, n, "microbatch %d outside 0..%d", mb, M - 1);
        return -1;
    }
    unsigned char *st = &seen[(size_t)stage * (size_t)M + (size_t)mb];
    const char *w = NULL;
    switch (t) {
    case PP_F:
        w = *st ? "a second forward of the same microbatch" : NULL;
        *st |= SEEN_F;
        break;
    case PP_I:
        w = !(*st & SEEN_F)             ? "backward-input before the forward"
            : (*st & (SEEN_I | SEEN_B)) ? "a second backward"
                                        : NULL;
        *st |= SEEN_I;
        break;
    case PP_W:
        w = !(*st & SEEN_I) ? "backward-weight before backward-input" : (*st & SEEN_W) ? "a second W" : NULL;
        *st |= SEEN_W;
        break;
    case PP_B:
        w = !(*st & SEEN_F) ? "backward before the forward" : (*st & (SEEN_I | SEEN_B)) ? "a second backward" : NULL;
        *st |= SEEN_B;
        break;
    default: break;
    }
    if (w) {
        snprintf(why, n, "%s", w);
        return -1;
    }
    return 0;
}

int pp_schedule_validate_at(const pp_schedule *s, int *bad_rank, int *bad_pos, char *rule, size_t rulelen) {
    const int S = s->n_stages, M = s->n_microbatches;
    int *owner = malloc((size_t)S * sizeof *owner);
    unsigned char *seen = calloc((size_t)S * (size_t)M, 1);
    int rc = -1;
    *bad_rank = -1;
    *bad_pos = -1;
    if (!owner || !seen) {
        snprintf(rule, rulelen, "out of host memory");
        goto done;
    }
    for (int i = 0; i < S; i++) owner[i] = -1;
    for (int r = 0; r < s->n_ranks; r++) {
        for (int i = 0; i < s->len[r]; i++) {
            const pp_action *x = &s->acts[r][i];
            *bad_rank = r;
            *bad_pos = i;
            if (x->type == PP_IDLE) continue;
            if (x->type == PP_OVERLAP_F_B) {
                if (x->n_sub < 1 || x->n_sub > PP_MAX_SUB) {
                    snprintf(rule, rulelen, "an overlapped action needs 1 to %d parts", PP_MAX_SUB);
                    goto done;
                }
                for (int k = 0; k < x->n_sub; k++) {
                    const pp_op *o = &x->sub[k];
                    if (!is_leaf_compute(o->type)) {
                        snprintf(rule, rulelen, "part %d of an overlapped action is not F, I, W or B", k + 1);
                        goto done;
                    }
                    if (check_leaf(s, r, o->type, o->stage, o->mb, owner, seen, rule, rulelen)) goto done;
                }
                continue;
            }
            if (!is_leaf_compute(x->type)) {
                /* communication and FSDP actions: only their stage is checked here */
                if (x->stage < 0 || x->stage >= S) {
                    snprintf(rule, rulelen, "stage %d outside 0..%d", x->stage, S - 1);
                    goto done;
                }
                continue;
            }
            if (check_leaf(s, r, x->type, x->stage, x->mb, owner, seen, rule, rulelen)) goto done;
        }
    }
    *bad_pos = -1;
    for (int st = 0; st < S; st++) {
        *bad_rank = owner[st];
        if (owner[st] < 0) {
            snprintf(rule, rulelen, "stage %d runs on no rank (no compute action names it)", st);
            goto done;
        }
        for (int mb = 0; mb < M; mb++) {
            unsigned char x = seen[(size_t)st * (size_t)M + (size_t)mb];
            if (!(x & SEEN_F) || !((x & SEEN_B) || ((x & SEEN_I) && (x & SEEN_W)))) {
                snprintf(rule, rulelen, "stage %d microbatch %d has %s", st, mb,
                         !(x & SEEN_F)      ? "no forward"
                             : (x & SEEN_I) ? "no backward-weight"
                                            : "no backward");
                goto done;
            }
        }
    }
    *bad_rank = -1;
    memcpy(s->stage_rank, owner, (size_t)S * sizeof *owner);
    rc = 0;
done:
    free(owner);
    free(seen);
    return rc;
}

int pp_schedule_validate(const pp_schedule *s, char *err, size_t errlen) {
    int r, i;
    char rule[160], a[96];
    if (pp_schedule_validate_at(s, &r, &i, rule, sizeof rule) == 0) return 0;
    if (r >= 0 && i >= 0)
        snprintf(err, errlen, "schedule: rank %d, action %d (%s): %s", r, i, pp_action_str(&s->acts[r][i], a, sizeof a),
                 rule);
    else if (r >= 0) snprintf(err, errlen, "schedule: rank %d: %s", r, rule);
    else snprintf(err, errlen, "schedule: %s", rule);
    return -1;
}

/* Live (stage, mb) activations of one rank: +1 at F, -1 at B or W, leaves in order. */
static int in_flight(const pp_schedule *s, int rank, int stage) {
    int live = 0, best = 0;
    for (int i = 0; i < s->len[rank]; i++) {
        const pp_action *x = &s->acts[rank][i];
        int n = x->type == PP_OVERLAP_F_B ? x->n_sub : 1;
        for (int k = 0; k < n; k++) {
            pp_action_type t = x->type == PP_OVERLAP_F_B ? x->sub[k].type : x->type;
            int st = x->type == PP_OVERLAP_F_B ? x->sub[k].stage : x->stage;
            if (stage >= 0 && st != stage) continue;
            if (t == PP_F) live++;
            else if (t == PP_B || t == PP_W) live--;
            if (live > best) best = live;
        }
    }
    return best;
}

int pp_schedule_rank_in_flight(const pp_schedule *s, int rank, int stage) {
    if (rank < 0 || rank >= s->n_ranks) return 0;
    return in_flight(s, rank, stage);
}

int pp_schedule_max_in_flight(const pp_schedule *s) {
    int best = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        int v = in_flight(s, r, -1);
        if (v > best) best = v;
    }
    return best;
}

int pp_schedule_max_deferred_w(const pp_schedule *s) {
    int best = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        int open = 0;
        for (int i = 0; i < s->len[r]; i++) {
            const pp_action *x = &s->acts[r][i];
            int n = x->type == PP_OVERLAP_F_B ? x->n_sub : 1;
            for (int k = 0; k < n; k++) {
                pp_action_type t = x->type == PP_OVERLAP_F_B ? x->sub[k].type : x->type;
                if (t == PP_I) open++;
                else if (t == PP_W) open--;
                if (open > best) best = open;
            }
        }
    }
    return best;
}
