/* plan_recommend.c — `tetra plan --recommend`: search layouts for a model and a GPU
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/plan_internal.h"
#include "models/llama3/llama3_args.h"

typedef struct {
    char over[640];   /* the command-line overrides */
    double tps, step, peak_gib, mfu, bubble;
    int pp, dp_replicate, dp_shard, cp, tp;
    int accum, ac, f8, sched, atp;
    int mbs;          /* pipeline: 1, or local batch / pp (as many microbatches as ranks) */
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

int plan_recommend(const tetra_config *cfg, int ngpu, int gpn_opt, const plan_hw *hw, int top, int json) {
    const tetra_config_values *c = &cfg->v;
    const int gpn = gpn_opt > 0 ? gpn_opt : hw->gpus_per_node;
    char err[4096];
    /* the batch to keep: the config's own at this GPU count */
    static plan_result r;
    cfg_parallel_dims d0;
    if (cfg_validate(cfg, ngpu, &d0, err, sizeof err)) {
        fprintf(stderr, "tetra plan --recommend: the config at %d GPUs: %s\n", ngpu, err);
        return 1;
    }
    const long long G = (long long)d0.global_batch_size;
    llama3_args a;
    llama3_flavor(c->model.flavor, &a);
    if (c->model.n_layers > 0) a.n_layers = (int)c->model.n_layers;
    const int T = (int)c->training.seq_len;
    const int fp8_ok = hw->peak_fp8_flops > 0;
    int cfg_f8 = 0;
    for (int i = 0; i < c->model.converters.n; i++) cfg_f8 |= !strcmp(c->model.converters.items[i], "float8");

    size_t cap = 1024, n = 0;
    cand *cs = malloc(cap * sizeof *cs);
    if (!cs) return 1;
    int tried = 0, refused = 0, nofit = 0;
    const int tps_[] = {1, 2, 4, 8}, pps_[] = {1, 2, 4, 8, 16}, cps_[] = {1, 2, 4, 8}, accs_[] = {1, 2, 4};
    const char *acs[][2] = {{"none", "op"}, {"selective", "op"}, {"full", "op"}};
    const char *scheds[] = {"1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"};
    for (int ti = 0; ti < 4; ti++)
        for (int pi = 0; pi < 5; pi++)
            for (int ci = 0; ci < 4; ci++) {
                const int tp = tps_[ti], pp = pps_[pi], cp = cps_[ci];
                if (tp > gpn || a.n_heads % tp || a.n_kv_heads % tp || pp > a.n_layers / 2) continue;
                if (cp > 1 && (T < 16384 || T % (2 * cp))) continue;
                if (ngpu % (tp * pp * cp)) continue;
                const int dp = ngpu / (tp * pp * cp);
                int shards[2] = {dp, 0}, ns = 1;
                const int inner = gpn / (tp * cp);
                if (inner >= 1 && inner < dp && dp % inner == 0) shards[ns++] = inner;
                for (int si = 0; si < ns; si++)
                    for (int ai = 0; ai < 3; ai++) {
                        const int acc = accs_[ai];
                        if (G % ((long long)dp * acc)) continue;
                        const long long lbs = G / ((long long)dp * acc);
                        for (int sc = 0; sc < (pp > 1 ? 4 : 1); sc++)
                        for (int mi = 0; mi < (pp > 1 ? 2 : 1); mi++) {
                            if (pp > 1 && lbs < pp && sc != 0) continue;
                            /* microbatches of one sequence (the smallest bubble), or as many
                             * microbatches as pipeline ranks (TorchTitan's default) */
                            const int mbs = pp == 1 ? (int)c->parallelism.pipeline_parallel_microbatch_size
                                            : mi == 0 ? 1 : (int)(lbs / pp);
                            if (mi == 1 && (lbs % pp || mbs <= 1)) continue;
                            for (int ac = 0; ac < 3; ac++)
                                for (int f8 = 0; f8 <= fp8_ok; f8++)
                                for (int atp = 0; atp <= (tp > 1); atp++) {
                                    char v[12][32];
                                    const char *kv[32];
                                    int k = 0;
#define SET(key, ...)                                                                                                  \
    do {                                                                                                               \
        snprintf(v[k / 2 % 12], 32, __VA_ARGS__);                                                                      \
        kv[k] = key;                                                                                                   \
        kv[k + 1] = v[k / 2 % 12];                                                                                     \
        k += 2;                                                                                                        \
    } while (0)
                                    SET("parallelism.tensor_parallel_degree", "%d", tp);
                                    SET("parallelism.pipeline_parallel_degree", "%d", pp);
                                    SET("parallelism.context_parallel_degree", "%d", cp);
                                    SET("parallelism.data_parallel_shard_degree", "%d", shards[si]);
                                    SET("parallelism.data_parallel_replicate_degree", "%d", dp / shards[si]);
                                    SET("training.local_batch_size", "%lld", lbs);
                                    SET("training.global_batch_size", "%lld", G);
                                    SET("activation_checkpoint.mode", "%s", acs[ac][0]);
                                    SET("parallelism.pipeline_parallel_microbatch_size", "%d", mbs);
#undef SET
                                    /* the last two pairs use string constants */
                                    kv[k++] = "activation_checkpoint.selective_ac_option";
                                    kv[k++] = acs[ac][1];
                                    kv[k++] = "parallelism.pipeline_parallel_schedule";
                                    kv[k++] = scheds[sc];
                                    kv[k++] = "model.converters";
                                    kv[k++] = f8 ? "float8" : "";
                                    kv[k++] = "parallelism.enable_async_tensor_parallel";
                                    kv[k++] = atp ? "true" : "false";
                                    tried++;
                                    if (plan_try(&r, cfg, kv, k / 2, ngpu, gpn, hw, err, sizeof err)) {
                                        refused++;
                                        continue;
                                    }
                                    if (!r.fits) {
                                        nofit++;
                                        continue;
                                    }
                                    if (n == cap) {
                                        cand *m = realloc(cs, 2 * cap * sizeof *cs);
                                        if (!m) {
                                            free(cs);
                                            return 1;
                                        }
                                        cs = m;
                                        cap *= 2;
                                    }
                                    cand *x = &cs[n++];
                                    char ov[640] = "";
                                    snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                             "--parallelism.data_parallel_shard_degree %d", shards[si]);
                                    /* a degree is given where it differs from the config's (a
                                     * config may set tp 8: its 1 must then be said) */
                                    if (dp / shards[si] != c->parallelism.data_parallel_replicate_degree)
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.data_parallel_replicate_degree %d", dp / shards[si]);
                                    if (tp != c->parallelism.tensor_parallel_degree)
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.tensor_parallel_degree %d", tp);
                                    if (pp != c->parallelism.pipeline_parallel_degree)
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.pipeline_parallel_degree %d", pp);
                                    if (pp > 1)
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.pipeline_parallel_schedule %s", scheds[sc]);
                                    if (mbs != c->parallelism.pipeline_parallel_microbatch_size)
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.pipeline_parallel_microbatch_size %d", mbs);
                                    if (cp != c->parallelism.context_parallel_degree)
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.context_parallel_degree %d", cp);
                                    if (atp != (c->parallelism.enable_async_tensor_parallel != 0))
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                                 " --parallelism.enable_async_tensor_parallel %s",
                                                 atp ? "true" : "false");
                                    snprintf(ov + strlen(ov), sizeof ov - strlen(ov),
                                             " --training.local_batch_size %lld --training.global_batch_size %lld"
                                             " --activation_checkpoint.mode %s%s%s",
                                             lbs, G, acs[ac][0], ac == 1 ? " --activation_checkpoint.selective_ac_option " : "",
                                             ac == 1 ? acs[ac][1] : "");
                                    if (f8 != cfg_f8) /* only when it differs from the config */
                                        snprintf(ov + strlen(ov), sizeof ov - strlen(ov), " --model.converters %s",
                                                 f8 ? "float8" : "''");
                                    snprintf(x->over, sizeof x->over, "%s", ov);
                                    x->tps = r.tokens_per_s_per_gpu;
                                    x->step = r.step_time_s;
                                    x->peak_gib = r.peak_bytes / (1024.0 * 1024.0 * 1024.0);
                                    x->mfu = r.mfu;
                                    x->bubble = r.bubble_fraction;
                                    x->pp = pp;
                                    x->tp = tp;
                                    x->cp = cp;
                                    x->dp_shard = shards[si];
                                    x->dp_replicate = dp / shards[si];
                                    x->accum = acc;
                                    x->ac = ac;
                                    x->f8 = f8;
                                    x->sched = pp > 1 ? sc : 0;
                                    x->atp = atp;
                                    x->mbs = mbs;
                                }
                        }
                    }
            }
    qsort(cs, n, sizeof *cs, by_tps);
    /* one entry per layout: its best batch split */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        int dup = 0;
        for (size_t j = 0; j < kept && !dup; j++) dup = same_layout(&cs[j], &cs[i]);
        if (!dup) cs[kept++] = cs[i];
    }
    const size_t n_fit = n;
    n = kept;
    /* the config's own layout, for comparison */
    const int own_ok = plan_estimate(&r, cfg, ngpu, gpn, hw, err, sizeof err) == 0;
    if (json) {
        json_t *o = json_object(), *arr = json_array();
        for (size_t i = 0; i < n && (int)i < top; i++)
            json_array_append_new(arr, json_pack("{s:s,s:b,s:f,s:f,s:f,s:f,s:f,s:{s:i,s:i,s:i,s:i,s:i,s:i}}", "overrides",
                                                 cs[i].over, "async_tensor_parallel", cs[i].atp,
                                                 "tokens_per_s_per_gpu", cs[i].tps, "step_time_s",
                                                 cs[i].step, "peak_memory_gib", cs[i].peak_gib, "mfu", cs[i].mfu,
                                                 "bubble_fraction", cs[i].bubble, "layout", "pp", cs[i].pp,
                                                 "dp_replicate", cs[i].dp_replicate, "dp_shard", cs[i].dp_shard,
                                                 "cp", cs[i].cp, "tp", cs[i].tp,
                                                 "pipeline_microbatch_size", cs[i].mbs));
        json_object_set_new(o, "recommended", arr);
        json_object_set_new(o, "searched", json_integer(tried));
        json_object_set_new(o, "fit", json_integer((json_int_t)n_fit));
        json_object_set_new(o, "do_not_fit", json_integer(nofit));
        json_object_set_new(o, "refused", json_integer(refused));
        if (own_ok) json_object_set_new(o, "config", plan_result_json(&r, cfg, hw));
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        printf("%s %s on %d x %s (%d per node), global batch %lld x seq_len %d: %d layouts searched, %zu fit, %d do "
               "not fit, %d cannot run; the best of each layout:\n",
               c->model.name, c->model.flavor, ngpu, hw->name, gpn, G, T, tried, n_fit, nofit, refused);
        for (size_t i = 0; i < n && (int)i < top; i++)
            printf("%2zu. %7.0f tokens/s/GPU  MFU %5.1f%%  step %.3f s  peak %.1f GiB  pp %d dp_replicate %d "
                   "dp_shard %d cp %d tp %d%s\n    %s\n",
                   i + 1, cs[i].tps, 100.0 * cs[i].mfu, cs[i].step, cs[i].peak_gib, cs[i].pp, cs[i].dp_replicate,
                   cs[i].dp_shard, cs[i].cp, cs[i].tp, cs[i].atp ? " async" : "", cs[i].over);
        if (own_ok)
            printf("the config as given: %.0f tokens/s/GPU, MFU %.1f%%, peak %.1f GiB (%s)\n", r.tokens_per_s_per_gpu,
                   100.0 * r.mfu, r.peak_bytes / (1024.0 * 1024.0 * 1024.0), r.fits ? "fits" : "does not fit");
        else printf("the config as given cannot run at %d GPUs: %s\n", ngpu, err);
    }
    free(cs);
    return n > 0 ? 0 : 1;
}
