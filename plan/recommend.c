/* recommend.c — `tetra plan --recommend`: search layouts for a model and a GPU
 * count, keep those that fit, rank them by predicted tokens/s/GPU.
 *
 * The global batch stays the config's (global_batch_size, or local_batch_size times
 * the data-parallel degree the config gives at this GPU count): a layout changes how
 * a step is computed, not what is learned. Searched: tensor parallel 1..min(8, node)
 * (dividing the heads), pipeline 1..16 (with 1F1B, Interleaved1F1B, ZB-H1
 * (InterleavedZeroBubble with one stage per rank) and ZBVZeroBubble, microbatches
 * of one sequence or as many microbatches as pipeline ranks), context
 * parallel 1..8 (long sequences), async TP on or off (tp > 1), FSDP over all
 * data-parallel ranks or HSDP with shards inside a node, gradient accumulation 1, 2
 * or 4, AC none / selective op / full, float8 on or off (where the hardware has
 * fp8). Every candidate is laid out by
 * the trainer's dry run, so a layout the trainer would refuse is never recommended. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"
#include "models/llama3/family.h"

typedef struct {
    char over[640]; /* the command-line overrides */
    double tps, step, peak_gib, mfu, bubble;
    int pp, dp_replicate, dp_shard, cp, tp;
    int accum, ac, f8, sched, atp;
    int mbs; /* pipeline: 1, or local batch / pp (as many microbatches as ranks) */
} cand;

/* fastest first; among equals the fewest accumulation steps, then the least memory */
static int by_tps(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (fabs(x->tps - y->tps) > 1e-9 * (x->tps + y->tps)) return (x->tps < y->tps) - (x->tps > y->tps);
    if (x->accum != y->accum) return x->accum - y->accum;
    return (x->peak_gib > y->peak_gib) - (x->peak_gib < y->peak_gib);
}

/* the same layout with another local batch / accumulation split (how the pipeline
 * splits a round is part of the layout: it sets the bubble) */
static int same_layout(const cand *x, const cand *y) {
    return x->pp == y->pp && x->dp_replicate == y->dp_replicate && x->dp_shard == y->dp_shard && x->cp == y->cp &&
        x->tp == y->tp && x->ac == y->ac && x->f8 == y->f8 && x->sched == y->sched && x->atp == y->atp &&
        (x->mbs > 1) == (y->mbs > 1);
}

static const char *const ac_modes[][2] = {{"none", "op"}, {"selective", "op"}, {"full", "op"}};
static const char *const schedules[] = {"1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"};

/* The search's fixed inputs, its candidates and its tallies. */
typedef struct search {
    const tetra_config *cfg;
    const tetra_config_values *c;
    const plan_hw *hw;
    int ngpu, gpn;
    long long G; /* the global batch kept */
    int T, fp8_ok, cfg_f8;
    llama3_args a;
    plan_result *r; /* scratch for each estimate */
    char *err;
    size_t errlen;
    cand *cs; /* the layouts that fit */
    size_t n, cap;
    int tried, refused, nofit;
} search;

/* One point of the search. */
typedef struct layout {
    int tp, pp, cp, dp, shard; /* dp = shard x replicate */
    int acc;
    long long lbs;
    int sc, mbs, ac, f8, atp;
} layout;

/* The config overrides of layout L as key/value pairs for plan_try (v holds the formatted values);
 * returns the number of pairs. */
static int layout_kv(const search *S, const layout *L, const char *kv[32], char v[12][32]) {
    int k = 0;
#define SET(key, ...)                                                                                                  \
    do {                                                                                                               \
        snprintf(v[k / 2 % 12], 32, __VA_ARGS__);                                                                      \
        kv[k] = key;                                                                                                   \
        kv[k + 1] = v[k / 2 % 12];                                                                                     \
        k += 2;                                                                                                        \
    } while (0)
    SET("parallelism.tensor_parallel_degree", "%d", L->tp);
    SET("parallelism.pipeline_parallel_degree", "%d", L->pp);
    SET("parallelism.context_parallel_degree", "%d", L->cp);
    SET("parallelism.data_parallel_shard_degree", "%d", L->shard);
    SET("parallelism.data_parallel_replicate_degree", "%d", L->dp / L->shard);
    SET("training.local_batch_size", "%lld", L->lbs);
    SET("training.global_batch_size", "%lld", S->G);
    SET("activation_checkpoint.mode", "%s", ac_modes[L->ac][0]);
    SET("parallelism.pipeline_parallel_microbatch_size", "%d", L->mbs);
#undef SET
    /* the last two pairs use string constants */
    kv[k++] = "activation_checkpoint.selective_ac_option";
    kv[k++] = ac_modes[L->ac][1];
    kv[k++] = "parallelism.pipeline_parallel_schedule";
    kv[k++] = schedules[L->sc];
    kv[k++] = "model.converters";
    kv[k++] = L->f8 ? "float8" : "";
    kv[k++] = "parallelism.enable_async_tensor_parallel";
    kv[k++] = L->atp ? "true" : "false";
    return k / 2;
}

/* Append to ov (of size `size`) formatted text. */
static void append(char *ov, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void append(char *ov, size_t size, const char *fmt, ...) {
    size_t len = strlen(ov);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ov + len, size - len, fmt, ap);
    va_end(ap);
}

/* Layout L as command-line overrides of the config, into ov. */
static void layout_overrides(const search *S, const layout *L, char *ov, size_t size) {
    const tetra_config_values *c = S->c;
    const int replicate = L->dp / L->shard;
    append(ov, size, "--parallelism.data_parallel_shard_degree %d", L->shard);
    /* a degree is given where it differs from the config's (a
     * config may set tp 8: its 1 must then be said) */
    if (replicate != c->parallelism.data_parallel_replicate_degree)
        append(ov, size, " --parallelism.data_parallel_replicate_degree %d", replicate);
    if (L->tp != c->parallelism.tensor_parallel_degree)
        append(ov, size, " --parallelism.tensor_parallel_degree %d", L->tp);
    if (L->pp != c->parallelism.pipeline_parallel_degree)
        append(ov, size, " --parallelism.pipeline_parallel_degree %d", L->pp);
    if (L->pp > 1) append(ov, size, " --parallelism.pipeline_parallel_schedule %s", schedules[L->sc]);
    if (L->mbs != c->parallelism.pipeline_parallel_microbatch_size)
        append(ov, size, " --parallelism.pipeline_parallel_microbatch_size %d", L->mbs);
    if (L->cp != c->parallelism.context_parallel_degree)
        append(ov, size, " --parallelism.context_parallel_degree %d", L->cp);
    if (L->atp != (c->parallelism.enable_async_tensor_parallel != 0))
        append(ov, size, " --parallelism.enable_async_tensor_parallel %s", L->atp ? "true" : "false");
    append(ov, size,
           " --training.local_batch_size %lld --training.global_batch_size %lld"
           " --activation_checkpoint.mode %s%s%s",
           L->lbs, S->G, ac_modes[L->ac][0], L->ac == 1 ? " --activation_checkpoint.selective_ac_option " : "",
           L->ac == 1 ? ac_modes[L->ac][1] : "");
    if (L->f8 != S->cfg_f8) /* only when it differs from the config */
        append(ov, size, " --model.converters %s", L->f8 ? "float8" : "''");
}

/* Estimate layout L; keep it as a candidate when the trainer lays it out and it fits. -1 on
 * out-of-memory. */
static int try_layout(search *S, const layout *L) {
    char v[12][32];
    const char *kv[32];
    const int n_kv = layout_kv(S, L, kv, v);
    S->tried++;
    if (plan_try(S->r, S->cfg, kv, n_kv, S->ngpu, S->gpn, S->hw, S->err, S->errlen)) {
        S->refused++;
        return 0;
    }
    if (!S->r->fits) {
        S->nofit++;
        return 0;
    }
    if (S->n == S->cap) {
        cand *m = realloc(S->cs, 2 * S->cap * sizeof *S->cs);
        if (!m) return -1;
        S->cs = m;
        S->cap *= 2;
    }
    cand *x = &S->cs[S->n++];
    char ov[640] = "";
    layout_overrides(S, L, ov, sizeof ov);
    snprintf(x->over, sizeof x->over, "%s", ov);
    x->tps = S->r->tokens_per_s_per_gpu;
    x->step = S->r->step_time_s;
    x->peak_gib = S->r->peak_bytes / (1024.0 * 1024.0 * 1024.0);
    x->mfu = S->r->mfu;
    x->bubble = S->r->bubble_fraction;
    x->pp = L->pp;
    x->tp = L->tp;
    x->cp = L->cp;
    x->dp_shard = L->shard;
    x->dp_replicate = L->dp / L->shard;
    x->accum = L->acc;
    x->ac = L->ac;
    x->f8 = L->f8;
    x->sched = L->pp > 1 ? L->sc : 0;
    x->atp = L->atp;
    x->mbs = L->mbs;
    return 0;
}

/* For one mesh: every accumulation, pipeline schedule and microbatch split of the global batch,
 * then every AC mode, float8 and async TP setting. */
static int search_batches(search *S, layout *L) {
    static const int accs_[] = {1, 2, 4};
    const int pp = L->pp;
    for (int ai = 0; ai < 3; ai++) {
        L->acc = accs_[ai];
        if (S->G % ((long long)L->dp * L->acc)) continue;
        L->lbs = S->G / ((long long)L->dp * L->acc);
        for (int sc = 0; sc < (pp > 1 ? 4 : 1); sc++)
            for (int mi = 0; mi < (pp > 1 ? 2 : 1); mi++) {
                if (pp > 1 && L->lbs < pp && sc != 0) continue;
                /* microbatches of one sequence (the smallest bubble), or as many
                 * microbatches as pipeline ranks (TorchTitan's default) */
                L->mbs = pp == 1 ? (int)S->c->parallelism.pipeline_parallel_microbatch_size
                    : mi == 0    ? 1
                                 : (int)(L->lbs / pp);
                if (mi == 1 && (L->lbs % pp || L->mbs <= 1)) continue;
                L->sc = sc;
                for (L->ac = 0; L->ac < 3; L->ac++)
                    for (L->f8 = 0; L->f8 <= S->fp8_ok; L->f8++)
                        for (L->atp = 0; L->atp <= (L->tp > 1); L->atp++)
                            if (try_layout(S, L)) return -1;
            }
    }
    return 0;
}

/* Every mesh (tp x pp x cp, then FSDP over all data-parallel ranks or HSDP with shards inside a node). */
static int search_layouts(search *S) {
    static const int tps_[] = {1, 2, 4, 8}, pps_[] = {1, 2, 4, 8, 16}, cps_[] = {1, 2, 4, 8};
    const llama3_args *a = &S->a;
    for (int ti = 0; ti < 4; ti++)
        for (int pi = 0; pi < 5; pi++)
            for (int ci = 0; ci < 4; ci++) {
                const int tp = tps_[ti], pp = pps_[pi], cp = cps_[ci];
                if (tp > S->gpn || a->n_heads % tp || a->n_kv_heads % tp || pp > a->n_layers / 2) continue;
                if (cp > 1 && (S->T < 16384 || S->T % (2 * cp))) continue;
                if (S->ngpu % (tp * pp * cp)) continue;
                const int dp = S->ngpu / (tp * pp * cp);
                int shards[2] = {dp, 0}, ns = 1;
                const int inner = S->gpn / (tp * cp);
                if (inner >= 1 && inner < dp && dp % inner == 0) shards[ns++] = inner;
                for (int si = 0; si < ns; si++) {
                    layout L = {.tp = tp, .pp = pp, .cp = cp, .dp = dp, .shard = shards[si]};
                    if (search_batches(S, &L)) return -1;
                }
            }
    return 0;
}

/* Sorted candidates: one entry per layout, its best batch split; returns how many are kept. */
static size_t best_per_layout(cand *cs, size_t n) {
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        int dup = 0;
        for (size_t j = 0; j < kept && !dup; j++) dup = same_layout(&cs[j], &cs[i]);
        if (!dup) cs[kept++] = cs[i];
    }
    return kept;
}

/* The top candidates, the tallies and the config's own estimate (own: r is valid) as JSON. */
static void print_json(const search *S, size_t n, size_t n_fit, int top, int own) {
    const cand *cs = S->cs;
    json_t *o = json_object(), *arr = json_array();
    for (size_t i = 0; i < n && (int)i < top; i++)
        json_array_append_new(arr,
                              json_pack("{s:s,s:b,s:f,s:f,s:f,s:f,s:f,s:{s:i,s:i,s:i,s:i,s:i,s:i}}", "overrides",
                                        cs[i].over, "async_tensor_parallel", cs[i].atp, "tokens_per_s_per_gpu",
                                        cs[i].tps, "step_time_s", cs[i].step, "peak_memory_gib", cs[i].peak_gib, "mfu",
                                        cs[i].mfu, "bubble_fraction", cs[i].bubble, "layout", "pp", cs[i].pp,
                                        "dp_replicate", cs[i].dp_replicate, "dp_shard", cs[i].dp_shard, "cp", cs[i].cp,
                                        "tp", cs[i].tp, "pipeline_microbatch_size", cs[i].mbs));
    json_object_set_new(o, "recommended", arr);
    json_object_set_new(o, "searched", json_integer(S->tried));
    json_object_set_new(o, "fit", json_integer((json_int_t)n_fit));
    json_object_set_new(o, "do_not_fit", json_integer(S->nofit));
    json_object_set_new(o, "refused", json_integer(S->refused));
    if (own) json_object_set_new(o, "config", plan_result_json(S->r, S->cfg, S->hw));
    char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    if (s) puts(s);
    free(s);
    json_decref(o);
}

/* The same as a table. */
static void print_text(const search *S, size_t n, size_t n_fit, int top, int own) {
    const cand *cs = S->cs;
    const plan_result *r = S->r;
    printf("%s %s on %d x %s (%d per node), global batch %lld x seq_len %d: %d layouts searched, %zu fit, %d do "
           "not fit, %d cannot run; the best of each layout:\n",
           S->c->model.name, S->c->model.flavor, S->ngpu, S->hw->name, S->gpn, S->G, S->T, S->tried, n_fit, S->nofit,
           S->refused);
    for (size_t i = 0; i < n && (int)i < top; i++)
        printf("%2zu. %7.0f tokens/s/GPU  MFU %5.1f%%  step %.3f s  peak %.1f GiB  pp %d dp_replicate %d "
               "dp_shard %d cp %d tp %d%s\n    %s\n",
               i + 1, cs[i].tps, 100.0 * cs[i].mfu, cs[i].step, cs[i].peak_gib, cs[i].pp, cs[i].dp_replicate,
               cs[i].dp_shard, cs[i].cp, cs[i].tp, cs[i].atp ? " async" : "", cs[i].over);
    if (own)
        printf("the config as given: %.0f tokens/s/GPU, MFU %.1f%%, peak %.1f GiB (%s)\n", r->tokens_per_s_per_gpu,
               100.0 * r->mfu, r->peak_bytes / (1024.0 * 1024.0 * 1024.0), r->fits ? "fits" : "does not fit");
    else printf("the config as given cannot run at %d GPUs: %s\n", S->ngpu, S->err);
}

int plan_recommend(const tetra_config *cfg, int ngpu, int gpn_opt, const plan_hw *hw, int top, int json) {
    const tetra_config_values *c = &cfg->v;
    const int gpn = gpn_opt > 0 ? gpn_opt : hw->gpus_per_node;
    char err[4096];
    /* the batch to keep: the config's own at this GPU count */
    static plan_result r;
    tetra_job j0;
    if (job_resolve(cfg, ngpu, &j0, err, sizeof err) || plan_check_llama(&j0, err, sizeof err)) {
        fprintf(stderr, "tetra plan --recommend: the config at %d GPUs: %s\n", ngpu, err);
        return 1;
    }
    search S = {.cfg = cfg, .c = c, .hw = hw, .ngpu = ngpu, .gpn = gpn, .r = &r, .err = err, .errlen = sizeof err};
    S.G = (long long)j0.dims.global_batch_size;
    S.a = *llama3_args_of(&j0.model);
    S.T = (int)c->training.seq_len;
    S.fp8_ok = hw->peak_fp8_flops > 0;
    S.cfg_f8 = j0.float8;

    S.cap = 1024;
    S.cs = malloc(S.cap * sizeof *S.cs);
    if (!S.cs) return 1;
    if (search_layouts(&S)) {
        free(S.cs);
        return 1;
    }
    qsort(S.cs, S.n, sizeof *S.cs, by_tps);
    const size_t n_fit = S.n, n = best_per_layout(S.cs, S.n);
    /* the config's own layout, for comparison */
    const int own_ok = plan_estimate(&r, cfg, ngpu, gpn, hw, err, sizeof err) == 0;
    if (json) print_json(&S, n, n_fit, top, own_ok);
    else print_text(&S, n, n_fit, top, own_ok);
    free(S.cs);
    return n > 0 ? 0 : 1;
}
