/* schedule.c — the action IR, the degenerate schedule and the validator (see schedule.h). */
#include "parallel/pp/schedule.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[PP_N_ACTION_TYPES] = {"F", "I", "W", "B", "UNSHARD", "RESHARD", "REDUCE_GRAD"};

const char *pp_action_type_name(pp_action_type t) {
    return (int)t >= 0 && t < PP_N_ACTION_TYPES ? type_names[t] : "?";
}

static int stage_only(pp_action_type t) { return t == PP_UNSHARD || t == PP_RESHARD || t == PP_REDUCE_GRAD; }

char *pp_action_str(const pp_action *a, char *buf, size_t n) {
    if (stage_only(a->type)) snprintf(buf, n, "%d%s", a->stage, pp_action_type_name(a->type));
    else snprintf(buf, n, "%d%s%d", a->stage, pp_action_type_name(a->type), a->mb);
    return buf;
}

int pp_action_parse(const char *s, pp_action *out) {
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    long stage = 0;
    while (*p >= '0' && *p <= '9') {
        stage = stage * 10 + (*p++ - '0');
        if (stage > 1000000) return -1;
    }
    /* the longest type name that matches (REDUCE_GRAD before R..., no prefix ambiguity) */
    int type = -1;
    size_t tl = 0;
    for (int t = 0; t < PP_N_ACTION_TYPES; t++) {
        size_t l = strlen(type_names[t]);
        if (l > tl && !strncmp(p, type_names[t], l)) {
            type = t;
            tl = l;
        }
    }
    if (type < 0) return -1;
    p += tl;
    long mb = -1;
    if (*p) {
        if (stage_only((pp_action_type)type)) return -1;
        mb = 0;
        while (*p >= '0' && *p <= '9') {
            mb = mb * 10 + (*p++ - '0');
            if (mb > 100000000) return -1;
        }
        if (*p) return -1;
    } else if (!stage_only((pp_action_type)type)) {
        return -1;
    }
    out->type = (pp_action_type)type;
    out->stage = (int)stage;
    out->mb = (int)mb;
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
    if (!s->len || !s->acts) {
        pp_schedule_free(s);
        return NULL;
    }
    return s;
}

int pp_schedule_push(pp_schedule *s, int rank, pp_action_type t, int stage, int mb) {
    if (rank < 0 || rank >= s->n_ranks) return -1;
    int n = s->len[rank];
    if ((n & (n - 1)) == 0) { /* grow at powers of two */
        pp_action *na = realloc(s->acts[rank], (size_t)(n ? 2 * n : 8) * sizeof *na);
        if (!na) return -1;
        s->acts[rank] = na;
    }
    s->acts[rank][n] = (pp_action){t, stage, stage_only(t) ? -1 : mb};
    s->len[rank] = n + 1;
    return 0;
}

void pp_schedule_free(pp_schedule *s) {
    if (!s) return;
    if (s->acts)
        for (int r = 0; r < s->n_ranks; r++) free(s->acts[r]);
    free(s->acts);
    free(s->len);
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
    return s;
}

/* per (stage, mb): what has run */
enum { SEEN_F = 1, SEEN_I = 2, SEEN_W = 4, SEEN_B = 8 };

int pp_schedule_validate(const pp_schedule *s, char *err, size_t errlen) {
    const int S = s->n_stages, M = s->n_microbatches;
    int *owner = malloc((size_t)S * sizeof *owner);
    unsigned char *seen = calloc((size_t)S * (size_t)M, 1);
    int rc = -1;
    char a[48];
    if (!owner || !seen) {
        snprintf(err, errlen, "schedule: out of host memory");
        goto done;
    }
    for (int i = 0; i < S; i++) owner[i] = -1;
    for (int r = 0; r < s->n_ranks; r++) {
        for (int i = 0; i < s->len[r]; i++) {
            const pp_action *x = &s->acts[r][i];
            pp_action_str(x, a, sizeof a);
            if (x->stage < 0 || x->stage >= S) {
                snprintf(err, errlen, "schedule: rank %d, action %d (%s): stage %d outside 0..%d", r, i, a, x->stage,
                         S - 1);
                goto done;
            }
            if (owner[x->stage] >= 0 && owner[x->stage] != r) {
                snprintf(err, errlen, "schedule: rank %d, action %d (%s): stage %d already runs on rank %d", r, i, a,
                         x->stage, owner[x->stage]);
                goto done;
            }
            owner[x->stage] = r;
            if (stage_only(x->type)) continue;
            if (x->mb < 0 || x->mb >= M) {
                snprintf(err, errlen, "schedule: rank %d, action %d (%s): microbatch %d outside 0..%d", r, i, a, x->mb,
                         M - 1);
                goto done;
            }
            unsigned char *st = &seen[(size_t)x->stage * (size_t)M + (size_t)x->mb];
            const char *why = NULL;
            switch (x->type) {
            case PP_F: why = *st ? "a second forward of the same microbatch" : NULL; *st |= SEEN_F; break;
            case PP_I:
                why = !(*st & SEEN_F) ? "backward-input before the forward"
                      : (*st & (SEEN_I | SEEN_B)) ? "a second backward" : NULL;
                *st |= SEEN_I;
                break;
            case PP_W:
                why = !(*st & SEEN_I) ? "backward-weight before backward-input" : (*st & SEEN_W) ? "a second W" : NULL;
                *st |= SEEN_W;
                break;
            case PP_B:
                why = !(*st & SEEN_F) ? "backward before the forward" : (*st & (SEEN_I | SEEN_B)) ? "a second backward" : NULL;
                *st |= SEEN_B;
                break;
            default: break;
            }
            if (why) {
                snprintf(err, errlen, "schedule: rank %d, action %d (%s): %s", r, i, a, why);
                goto done;
            }
        }
    }
    for (int st = 0; st < S; st++) {
        if (owner[st] < 0) {
            snprintf(err, errlen, "schedule: stage %d runs on no rank", st);
            goto done;
        }
        for (int mb = 0; mb < M; mb++) {
            unsigned char x = seen[(size_t)st * (size_t)M + (size_t)mb];
            if (!(x & SEEN_F) || !((x & SEEN_B) || ((x & SEEN_I) && (x & SEEN_W)))) {
                snprintf(err, errlen, "schedule: rank %d: stage %d microbatch %d has %s", owner[st], st, mb,
                         !(x & SEEN_F) ? "no forward" : (x & SEEN_I) ? "no backward-weight" : "no backward");
                goto done;
            }
        }
    }
    rc = 0;
done:
    free(owner);
    free(seen);
    return rc;
}

int pp_schedule_max_in_flight(const pp_schedule *s) {
    int best = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        int live = 0;
        for (int i = 0; i < s->len[r]; i++) {
            const pp_action *x = &s->acts[r][i];
            if (x->type == PP_F) live++;
            else if (x->type == PP_B || x->type == PP_W) live--;
            if (live > best) best = live;
        }
    }
    return best;
}

int pp_schedule_max_deferred_w(const pp_schedule *s) {
    int best = 0;
    for (int r = 0; r < s->n_ranks; r++) {
        int open = 0;
        for (int i = 0; i < s->len[r]; i++) {
            const pp_action *x = &s->acts[r][i];
            if (x->type == PP_I) open++;
            else if (x->type == PP_W) open--;
            if (open > best) best = open;
        }
    }
    return best;
}
