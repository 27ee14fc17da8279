/* ops.c — the report of `tetra plan --ops` (ops.h): the recorded step's ops
 * by phase, one block's in full, with launches, bytes, FLOPs and roofline time, and for
 * a float8 config what the conversion adds over the same step in bf16. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"
#include "plan/ops.h"
#include "kernels/op_costs.h"
#include "kernels/ops_record.h"
#include "models/llama3/family.h"
#include "util/host.h"

/* A launch's fixed cost on the device, an assumption (not a measurement): reported
 * beside the roofline, never added to it. */
#define LAUNCH_OVERHEAD_S 3e-6

enum {
    SEC_FWD = 0,
    SEC_BWD_I,
    SEC_BWD_W, /* the chosen block */
    SEC_HEAD_FWD,
    SEC_HEAD_BWD_I,
    SEC_HEAD_BWD_W,
    SEC_EMBEDDING,
    SEC_OPTIMIZER, /* the rows above are printed one by one */
    SEC_OTHER_BLOCKS,
    SEC_FSDP,
    SEC_REST, /* these as totals */
    SEC_COUNT
};

static const char *const sec_title[SEC_COUNT] = {"forward",
                                                 "backward input",
                                                 "backward weight",
                                                 "head forward (norm, output, loss)",
                                                 "head backward input",
                                                 "head backward weight",
                                                 "embedding (forward and backward)",
                                                 "optimizer (clip gradients and AdamW)",
                                                 "the other blocks",
                                                 "FSDP (unshard, reduce gradients)",
                                                 "the rest of the step (gradient zeroing, schedule)"};

typedef struct {
    int n_layers, block, microbatches;
    double doc_share;      /* block_causal: the share of the causal pairs the documents leave */
    char attn_source[512]; /* where the attention's pairs come from (plan_attention_pairs) */
    size_t n;
    ops_record_entry *rec; /* a copy of the recorder's */
    char **span;           /* [n] span names (copies) */
    int *sec;              /* [n] */
    op_cost total[SEC_COUNT], step;
    double time[SEC_COUNT], step_time;
} recording;

/* ---------------------------------------------------------------------------- time */

static double peak_of(const plan_hw *hw, op_flop_kind k) {
    switch (k) {
    case OPC_FLOP_GEMM_BF16: return hw->peak_bf16_flops;
    case OPC_FLOP_GEMM_FP8: return hw->peak_fp8_flops > 0 ? hw->peak_fp8_flops : hw->peak_bf16_flops;
    case OPC_FLOP_ATTN_TC: return hw->peak_bf16_flops;
    default: return hw->peak_fp32_flops;
    }
}

/* max(FLOPs / the unit's peak, bytes / HBM bandwidth) */
static double roofline(const op_cost *c, const plan_hw *hw) {
    double tc = 0.0;
    for (int k = 0; k < OPC_FLOP_KINDS; k++)
        if (c->flops[k] > 0) tc += c->flops[k] / peak_of(hw, (op_flop_kind)k);
    const double tm = (c->read + c->written) / hw->memory_bandwidth;
    return tc > tm ? tc : tm;
}

/* ---------------------------------------------------------------------------- the recording */

static void mark(void *user, int on) {
    (void)user;
    ops_record_set_active(on);
}

static int span_layer(const char *s, const char *prefix) {
    const size_t n = strlen(prefix);
    if (strncmp(s, prefix, n)) return -1;
    char *end;
    long l = strtol(s + n, &end, 10);
    return end != s + n && !*end ? (int)l : -1;
}

static int classify(const char *span, op_kind op, int block) {
    int l;
    if ((l = span_layer(span, "forward layers.")) >= 0) return l == block ? SEC_FWD : SEC_OTHER_BLOCKS;
    if ((l = span_layer(span, "backward input layers.")) >= 0) return l == block ? SEC_BWD_I : SEC_OTHER_BLOCKS;
    if ((l = span_layer(span, "backward weight layers.")) >= 0) return l == block ? SEC_BWD_W : SEC_OTHER_BLOCKS;
    /* the trainer names a unit's spans by the unit (Llama's "norm+output", "tok_embeddings") */
    if (!strcmp(span, "forward norm+output")) return SEC_HEAD_FWD;
    if (!strcmp(span, "backward input norm+output")) return SEC_HEAD_BWD_I;
    if (!strcmp(span, "backward weight norm+output")) return SEC_HEAD_BWD_W;
    /* the embedding's backward: its op, wherever it runs */
    if (!strcmp(span, "forward tok_embeddings") || op == OPK_EMBEDDING_BACKWARD || op == OPK_EMBEDDING_BACKWARD_BF16)
        return SEC_EMBEDDING;
    if (!strcmp(span, "clip gradients and AdamW")) return SEC_OPTIMIZER;
    if (!strncmp(span, "unshard ", 8) || !strncmp(span, "reduce gradients", 16) ||
        !strcmp(span, "finish gradient reductions"))
        return SEC_FSDP;
    return SEC_REST;
}

static void recording_free(recording *r) {
    for (size_t i = 0; i < r->n; i++) free(r->span[i]);
    free(r->span);
    free(r->rec);
    free(r->sec);
    memset(r, 0, sizeof *r);
}

/* cfg's step through the recording table; block < 0: the middle one. 0, -1 with err, or
 * -2 for a block outside the model. */
static int record(recording *r, const tetra_config *cfg, const tetra_job *job, const op_cost_device *dev,
                  const plan_hw *hw, int block, int weights_per_use, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    const tetra_ops *ops = ops_record_table(dev, NULL);
    if (!ops) {
        snprintf(err, errlen, "cannot reserve address space for the recording op table");
        return -1;
    }
    r->n_layers = llama3_args_of(&job->model)->n_layers;
    /* a document mask's attention at the pairs the corpus's documents leave, as the plan
     * estimates them (the recorder cannot read the ids the step hands the op) */
    plan_result pr;
    memset(&pr, 0, sizeof pr);
    pr.job = *job;
    const int T = (int)cfg->v.training.seq_len;
    plan_attention_pairs(&pr, &cfg->v, T);
    r->doc_share = pr.block_causal ? pr.attn_pairs_per_seq / (0.5 * (double)T * (T + 1.0)) : 1.0;
    snprintf(r->attn_source, sizeof r->attn_source, "%s", pr.attn_source);
    ops_record_set_doc_share(r->doc_share);
    r->block = block < 0 ? r->n_layers / 2 : block;
    if (r->block >= r->n_layers) {
        snprintf(err, errlen, "--block %d: the model has %d blocks (0 to %d)", block, r->n_layers, r->n_layers - 1);
        return -2;
    }
    if (plan_ops_run(cfg, ops, 0, weights_per_use, mark, NULL, err, errlen)) return -1;
    r->n = ops_record_count();
    r->rec = malloc((r->n ? r->n : 1) * sizeof *r->rec);
    r->span = calloc(r->n ? r->n : 1, sizeof *r->span);
    r->sec = malloc((r->n ? r->n : 1) * sizeof *r->sec);
    if (!r->rec || !r->span || !r->sec) {
        recording_free(r);
        snprintf(err, errlen, "out of host memory");
        return -1;
    }
    memcpy(r->rec, ops_record_entries(), r->n * sizeof *r->rec);
    for (size_t i = 0; i < r->n; i++) {
        r->span[i] = strdup(ops_record_span_name(r->rec[i].span));
        if (!r->span[i]) r->span[i] = strdup("");
        r->sec[i] = classify(r->span[i] ? r->span[i] : "", r->rec[i].cost.op, r->block);
        const op_cost *c = &r->rec[i].cost;
        const double t = roofline(c, hw);
        op_cost_add(&r->total[r->sec[i]], c);
        op_cost_add(&r->step, c);
        r->time[r->sec[i]] += t;
        r->step_time += t;
    }
    ops_record_clear();
    return 0;
}

/* the block's three phases together */
static void block_total(const recording *r, op_cost *c, double *t) {
    memset(c, 0, sizeof *c);
    *t = 0.0;
    for (int s = SEC_FWD; s <= SEC_BWD_W; s++) {
        op_cost_add(c, &r->total[s]);
        *t += r->time[s];
    }
}

/* GEMMs with an fp8 operand in the block's forward: one per converted linear */
static int converted_linears(const recording *r) {
    int n = 0;
    for (size_t i = 0; i < r->n; i++) {
        const op_cost *c = &r->rec[i].cost;
        if (r->sec[i] == SEC_FWD && c->op == OPK_GEMM && c->flops[OPC_FLOP_GEMM_FP8] > 0) n++;
    }
    return n;
}

/* ---------------------------------------------------------------------------- text */

static void fmt_time(char *b, size_t n, double s) {
    if (s >= 1.0) snprintf(b, n, "%.3f s", s);
    else if (s >= 1e-3) snprintf(b, n, "%.2f ms", s * 1e3);
    else snprintf(b, n, "%.1f us", s * 1e6);
}

static void fmt_bytes(char *b, size_t n, double bytes) {
    if (bytes >= 1e9) snprintf(b, n, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6) snprintf(b, n, "%.1f MB", bytes / 1e6);
    else if (bytes >= 1e3) snprintf(b, n, "%.1f kB", bytes / 1e3);
    else snprintf(b, n, "%.0f B", bytes);
}

static void print_row(const char *what, const char *path, const op_cost *c, double t) {
    char b[32], tm[32];
    fmt_bytes(b, sizeof b, c->read + c->written);
    fmt_time(tm, sizeof tm, t);
    printf("  %-62.62s %-13s %5d %10s %10.1f %10s\n", what, path, op_cost_launches(c), b, op_cost_flops(c) / 1e9, tm);
}

static void print_total(const char *what, const op_cost *c, double t) {
    char b[32], tm[32], ov[32];
    fmt_bytes(b, sizeof b, c->read + c->written);
    fmt_time(tm, sizeof tm, t);
    fmt_time(ov, sizeof ov, op_cost_launches(c) * LAUNCH_OVERHEAD_S);
    printf("  %-62.62s %-13s %5d %10s %10.1f %10s  +%s\n", what, "", op_cost_launches(c), b, op_cost_flops(c) / 1e9, tm,
           ov);
}

static void print_section(const recording *r, const plan_hw *hw, int s, const char *title) {
    printf("\n%s\n", title);
    printf("  %-62s %-13s %5s %10s %10s %10s\n", "op", "path", "launch", "bytes", "GFLOP", "roofline");
    for (size_t i = 0; i < r->n; i++)
        if (r->sec[i] == s)
            print_row(r->rec[i].cost.what, r->rec[i].cost.path, &r->rec[i].cost, roofline(&r->rec[i].cost, hw));
    print_total("total", &r->total[s], r->time[s]);
}

static void print_launch_kinds(const char *what, const op_cost *c) {
    printf("  %-22s %6d launches: %d kernels, %d cuBLASLt, %d cuDNN, %d CUB sorts, %d copies/memsets; %d host wait%s\n",
           what, op_cost_launches(c), c->kernels, c->gemms, c->cudnn, c->sorts, c->copies, c->syncs,
           c->syncs == 1 ? "" : "s");
}

static void print_header(const tetra_config *cfg, const recording *r, const plan_hw *hw, const op_cost_device *dev) {
    const tetra_config_values *c = &cfg->v;
    char ac[64];
    if (!strcmp(c->activation_checkpoint.mode, "selective"))
        snprintf(ac, sizeof ac, "selective %s", c->activation_checkpoint.selective_ac_option);
    else snprintf(ac, sizeof ac, "%s", c->activation_checkpoint.mode);
    printf("ops of one training step: %s %s, %d blocks, seq_len %lld x local batch %lld, %d microbatch%s per step, "
           "AC %s, %s%s%s\n",
           c->model.name, c->model.flavor, r->n_layers, (long long)c->training.seq_len,
           (long long)c->training.local_batch_size, r->microbatches, r->microbatches == 1 ? "" : "es", ac,
           strcmp(c->training.mixed_precision_param, "bfloat16") ? "fp32" : "bf16", c->model.converters.n ? " + " : "",
           c->model.converters.n ? c->model.converters.items[0] : "");
    for (int i = 0; i < c->model.converters.n; i++)
        if (!strcmp(c->model.converters.items[i], "float8"))
            printf("float8 recipe %s\n", c->quantize_linear_float8.recipe_name);
    printf(
        "one rank (parallel degrees 1), the CUDA backend as described by kernels/op_costs.h for sm_%d%d, cuDNN %d.%d "
        "(%s), cuBLASLt %s outer-vector fp8 scales\n",
        dev->sm_major, dev->sm_minor, dev->cudnn_version / 10000, (dev->cudnn_version / 100) % 100,
        dev->cudnn_version ? "fused attention" : "none", dev->outer_vector_scales ? "with" : "without");
    printf("roofline of an op on %s: max(FLOPs / its unit's peak, bytes / HBM bandwidth); peaks bf16 %.0f, fp8 %.0f, "
           "fp32 %.0f TFLOP/s, HBM %.2f TB/s (datasheet, no efficiency factors); totals add, after a +, an assumed "
           "%.0f us per launch (not in the roofline)\n",
           hw->name, hw->peak_bf16_flops / 1e12, hw->peak_fp8_flops / 1e12, hw->peak_fp32_flops / 1e12,
           hw->memory_bandwidth / 1e12, LAUNCH_OVERHEAD_S * 1e6);
    printf("attention: %s\n", r->attn_source);
    printf("every number is a prediction from the op sequence of the trainer's own step, not a measurement\n");
}

static void print_report(const tetra_config *cfg, const recording *r, const plan_hw *hw, const op_cost_device *dev) {
    char title[160];
    print_header(cfg, r, hw, dev);
    for (int s = SEC_FWD; s <= SEC_BWD_W; s++) {
        snprintf(title, sizeof title, "block %d of %d: %s (span \"%s layers.%d\")", r->block, r->n_layers, sec_title[s],
                 s == SEC_FWD         ? "forward"
                     : s == SEC_BWD_I ? "backward input"
                                      : "backward weight",
                 r->block);
        print_section(r, hw, s, title);
    }
    for (int s = SEC_HEAD_FWD; s <= SEC_OPTIMIZER; s++) print_section(r, hw, s, sec_title[s]);
    for (int s = SEC_FSDP; s <= SEC_REST; s++) /* few ops each, when there are any */
        if (op_cost_launches(&r->total[s]) || r->total[s].syncs) print_section(r, hw, s, sec_title[s]);
    op_cost b;
    double bt;
    block_total(r, &b, &bt);
    printf("\nper step\n");
    printf("  %-62s %-13s %5s %10s %10s %10s\n", "phase", "", "launch", "bytes", "GFLOP", "roofline");
    snprintf(title, sizeof title, "block %d (forward, backward input, backward weight)", r->block);
    print_total(title, &b, bt);
    for (int s = SEC_HEAD_FWD; s < SEC_COUNT; s++) print_total(sec_title[s], &r->total[s], r->time[s]);
    print_total("step", &r->step, r->step_time);
    printf("\n");
    print_launch_kinds("the step", &r->step);
    print_launch_kinds("the block", &b);
}

/* ---------------------------------------------------------------------------- float8 against bf16 */

static int has_float8(const tetra_config *cfg) {
    for (int i = 0; i < cfg->v.model.converters.n; i++)
        if (!strcmp(cfg->v.model.converters.items[i], "float8")) return 1;
    return 0;
}

typedef struct {
    op_cost block8, block16, step8, step16;
    double tb8, tb16, ts8, ts16;
    int converted;
    double per_linear, per_linear16;
} f8_delta;

static void float8_delta(const recording *f8, const recording *bf, f8_delta *d) {
    memset(d, 0, sizeof *d);
    block_total(f8, &d->block8, &d->tb8);
    block_total(bf, &d->block16, &d->tb16);
    d->step8 = f8->step;
    d->step16 = bf->step;
    d->ts8 = f8->step_time;
    d->ts16 = bf->step_time;
    d->converted = converted_linears(f8);
    /* what float8 leaves of the block's launches (its ops but the GEMMs) is not its linears';
     * the rest is, and in bf16 the block's GEMMs are (3 a linear, fewer where two linears
     * of one input share a batched GEMM) */
    if (d->converted) {
        const int other = op_cost_launches(&d->block16) - d->block16.gemms;
        d->per_linear = (double)(op_cost_launches(&d->block8) - other) / d->converted;
        d->per_linear16 = (double)d->block16.gemms / d->converted;
    }
}

static void print_delta_row(const char *what, double a, double b, int bytes) {
    char x[32], y[32], z[32];
    if (bytes) {
        fmt_bytes(x, sizeof x, b);
        fmt_bytes(y, sizeof y, a);
        fmt_bytes(z, sizeof z, fabs(a - b));
    } else {
        fmt_time(x, sizeof x, b);
        fmt_time(y, sizeof y, a);
        fmt_time(z, sizeof z, fabs(a - b));
    }
    printf("  %-28s %12s %12s %s%11s\n", what, x, y, a >= b ? "+" : "-", z);
}

static void print_float8(const f8_delta *d, int block) {
    char w[64];
    printf("\nfloat8 against the same step in bf16 (model.converters without float8)\n");
    printf("  %-28s %12s %12s %12s\n", "", "bf16", "float8", "difference");
    snprintf(w, sizeof w, "block %d launches", block);
    printf("  %-28s %12d %12d %+12d\n", w, op_cost_launches(&d->block16), op_cost_launches(&d->block8),
           op_cost_launches(&d->block8) - op_cost_launches(&d->block16));
    snprintf(w, sizeof w, "block %d bytes", block);
    print_delta_row(w, d->block8.read + d->block8.written, d->block16.read + d->block16.written, 1);
    snprintf(w, sizeof w, "block %d roofline", block);
    print_delta_row(w, d->tb8, d->tb16, 0);
    printf("  %-28s %12d %12d %+12d\n", "step launches", op_cost_launches(&d->step16), op_cost_launches(&d->step8),
           op_cost_launches(&d->step8) - op_cost_launches(&d->step16));
    print_delta_row("step bytes", d->step8.read + d->step8.written, d->step16.read + d->step16.written, 1);
    print_delta_row("step roofline", d->ts8, d->ts16, 0);
    if (d->converted)
        printf("  converted linears in block %d: %d; launches per converted linear per step: %.1f (bf16: %.1f GEMMs)\n",
               block, d->converted, d->per_linear, d->per_linear16);
}

/* ---------------------------------------------------------------------------- JSON */

static json_t *cost_json(const op_cost *c, double t) {
    json_t *o = json_object();
    json_object_set_new(o, "launches", json_integer(op_cost_launches(c)));
    json_object_set_new(o, "kernels", json_integer(c->kernels));
    json_object_set_new(o, "cublaslt", json_integer(c->gemms));
    json_object_set_new(o, "cudnn", json_integer(c->cudnn));
    json_object_set_new(o, "cub_sorts", json_integer(c->sorts));
    json_object_set_new(o, "copies", json_integer(c->copies));
    json_object_set_new(o, "host_waits", json_integer(c->syncs));
    json_object_set_new(o, "bytes_read", json_real(c->read));
    json_object_set_new(o, "bytes_written", json_real(c->written));
    json_object_set_new(o, "host_bytes", json_real(c->host_bytes));
    json_t *f = json_object();
    for (int k = 0; k < OPC_FLOP_KINDS; k++)
        if (c->flops[k] > 0) json_object_set_new(f, op_flop_kind_name((op_flop_kind)k), json_real(c->flops[k]));
    json_object_set_new(o, "flops", f);
    json_object_set_new(o, "roofline_s", json_real(t));
    return o;
}

static json_t *report_json(const tetra_config *cfg, const recording *r, const plan_hw *hw, const op_cost_device *dev,
                           const f8_delta *d) {
    static const char *const key[SEC_COUNT] = {"block_forward",
                                               "block_backward_input",
                                               "block_backward_weight",
                                               "head_forward",
                                               "head_backward_input",
                                               "head_backward_weight",
                                               "embedding",
                                               "optimizer",
                                               "other_blocks",
                                               "fsdp",
                                               "rest"};
    json_t *o = json_object();
    json_object_set_new(o, "model", json_sprintf("%s %s", cfg->v.model.name, cfg->v.model.flavor));
    json_object_set_new(o, "hardware", json_string(hw->name));
    json_object_set_new(o, "n_layers", json_integer(r->n_layers));
    json_object_set_new(o, "block", json_integer(r->block));
    json_object_set_new(o, "microbatches", json_integer(r->microbatches));
    json_object_set_new(o, "attention", json_pack("{s:s,s:f}", "source", r->attn_source, "doc_share", r->doc_share));
    json_object_set_new(o, "device",
                        json_pack("{s:i,s:i,s:i,s:b}", "sm_major", dev->sm_major, "sm_minor", dev->sm_minor,
                                  "cudnn_version", dev->cudnn_version, "outer_vector_scales",
                                  dev->outer_vector_scales));
    json_object_set_new(o, "launch_overhead_s", json_real(LAUNCH_OVERHEAD_S));
    json_t *secs = json_object();
    for (int s = 0; s < SEC_COUNT; s++) {
        json_t *so = cost_json(&r->total[s], r->time[s]);
        if (s != SEC_OTHER_BLOCKS) {
            json_t *rows = json_array();
            for (size_t i = 0; i < r->n; i++) {
                if (r->sec[i] != s) continue;
                const op_cost *c = &r->rec[i].cost;
                json_t *row = cost_json(c, roofline(c, hw));
                json_object_set_new(row, "op", json_string(op_kind_name(c->op)));
                json_object_set_new(row, "what", json_string(c->what));
                json_object_set_new(row, "path", json_string(c->path));
                json_array_append_new(rows, row);
            }
            json_object_set_new(so, "ops", rows);
        }
        json_object_set_new(secs, key[s], so);
    }
    json_object_set_new(o, "phases", secs);
    op_cost b;
    double bt;
    block_total(r, &b, &bt);
    json_object_set_new(o, "block_total", cost_json(&b, bt));
    json_object_set_new(o, "step", cost_json(&r->step, r->step_time));
    if (d) {
        json_t *f = json_object();
        json_object_set_new(f, "recipe", json_string(cfg->v.quantize_linear_float8.recipe_name));
        json_object_set_new(f, "block_bf16", cost_json(&d->block16, d->tb16));
        json_object_set_new(f, "step_bf16", cost_json(&d->step16, d->ts16));
        json_object_set_new(f, "block_extra_launches",
                            json_integer(op_cost_launches(&d->block8) - op_cost_launches(&d->block16)));
        json_object_set_new(f, "block_extra_bytes",
                            json_real(d->block8.read + d->block8.written - d->block16.read - d->block16.written));
        json_object_set_new(f, "step_extra_launches",
                            json_integer(op_cost_launches(&d->step8) - op_cost_launches(&d->step16)));
        json_object_set_new(f, "step_extra_bytes",
                            json_real(d->step8.read + d->step8.written - d->step16.read - d->step16.written));
        json_object_set_new(f, "converted_linears_per_block", json_integer(d->converted));
        json_object_set_new(f, "launches_per_converted_linear", json_real(d->per_linear));
        json_object_set_new(f, "gemm_launches_per_linear_bf16", json_real(d->per_linear16));
        json_object_set_new(o, "float8_vs_bf16", f);
    }
    return o;
}

/* ---------------------------------------------------------------------------- main */

/* cfg as one rank records it: parallel degrees 1, nothing written, no validation */
static int recording_config(tetra_config *out, const tetra_config *cfg, int without_float8, char *err, size_t errlen) {
    const char *kv[] = {"parallelism.data_parallel_replicate_degree",
                        "1",
                        "parallelism.data_parallel_shard_degree",
                        "1",
                        "parallelism.tensor_parallel_degree",
                        "1",
                        "parallelism.pipeline_parallel_degree",
                        "1",
                        "parallelism.context_parallel_degree",
                        "1",
                        "profiling.enable_profiling",
                        "false",
                        "profiling.enable_memory_snapshot",
                        "false",
                        "checkpoint.enable",
                        "false",
                        "validation.enable",
                        "false",
                        "metrics.enable_tensorboard",
                        "false",
                        "training.device",
                        "cuda",
                        "model.converters",
                        ""};
    const int n = (int)(sizeof kv / sizeof *kv) / 2;
    if (!without_float8) return plan_cfg_with(out, cfg, kv, n - 1, err, errlen);
    /* the same converters but float8 */
    char list[512] = "";
    for (int i = 0; i < cfg->v.model.converters.n; i++)
        if (strcmp(cfg->v.model.converters.items[i], "float8"))
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", list[0] ? "," : "",
                     cfg->v.model.converters.items[i]);
    /* ... and the float8 keys at their defaults, which the configuration asks without it */
    const char *f8keys[] = {"quantize.linear.float8.recipe_name",
                            "tensorwise",
                            "quantize.linear.float8.enable_fsdp_float8_all_gather",
                            "false",
                            "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp",
                            "false",
                            "quantize.linear.float8.filter_fqns",
                            "output",
                            "quantize.linear.float8.emulate",
                            "false"};
    const int nf = (int)(sizeof f8keys / sizeof *f8keys) / 2;
    const char *kv2[sizeof kv / sizeof *kv + sizeof f8keys / sizeof *f8keys];
    memcpy(kv2, kv, sizeof kv);
    kv2[2 * n - 1] = list;
    memcpy(kv2 + 2 * n, f8keys, sizeof f8keys);
    return plan_cfg_with(out, cfg, kv2, n + nf, err, errlen);
}

static int record_config(recording *r, const tetra_config *cfg, int without_float8, const op_cost_device *dev,
                         const plan_hw *hw, int block, char *err, size_t errlen) {
    tetra_config c;
    int rc = recording_config(&c, cfg, without_float8, err, errlen) ? -1 : 0;
    tetra_job job;
    if (!rc && (job_resolve(&c, 1, &job, err, errlen) || plan_check_llama(&job, err, errlen))) rc = -1;
    if (!rc) rc = record(r, &c, &job, dev, hw, block, 0, err, errlen);
    if (!rc) r->microbatches = job.dims.grad_accum_steps;
    cfg_free(&c);
    return rc;
}

/* ---------------------------------------------------------------------------- the step time's op costs */

/* An op at the profile's achieved rates: max(FLOPs / its unit's rate, bytes / bandwidth). */
static double achieved_time(const op_cost *c, const plan_hw *hw) {
    const double bf16 = hw->peak_bf16_flops * hw->gemm_efficiency;
    const double rate[OPC_FLOP_KINDS] = {
        [OPC_FLOP_GEMM_BF16] = bf16,
        [OPC_FLOP_GEMM_FP8] = hw->peak_fp8_flops > 0 ? hw->peak_fp8_flops * hw->fp8_gemm_efficiency : bf16,
        [OPC_FLOP_GEMM_F32] = hw->peak_fp32_flops * hw->gemm_efficiency,
        [OPC_FLOP_ATTN_TC] = hw->peak_bf16_flops * hw->attention_efficiency,
        [OPC_FLOP_ATTN_F32] = hw->peak_fp32_flops * hw->attention_efficiency,
        [OPC_FLOP_ELEMENT] = hw->peak_fp32_flops,
    };
    double tc = 0.0;
    for (int k = 0; k < OPC_FLOP_KINDS; k++)
        if (c->flops[k] > 0) tc += c->flops[k] / rate[k];
    const double tm = (c->read + c->written) / (hw->memory_bandwidth * hw->memory_efficiency);
    return tc > tm ? tc : tm;
}

static int is_attention(op_kind k) {
    return k == OPK_ATTENTION_FORWARD || k == OPK_ATTENTION_BACKWARD || k == OPK_ATTENTION_MERGE ||
        k == OPK_ATTENTION_FORWARD_BF16 || k == OPK_ATTENTION_BACKWARD_BF16;
}

/* One recording's time outside attention per unit and phase (seconds), and the block's
 * forward GEMM FLOPs. */
typedef struct {
    double t[3][PLAN_PHASES]; /* block, head, embedding */
    double gemm_fwd;
} unit_times;

static void unit_times_of(const recording *r, const plan_hw *hw, unit_times *u) {
    memset(u, 0, sizeof *u);
    for (size_t i = 0; i < r->n; i++) {
        const op_cost *c = &r->rec[i].cost;
        if (is_attention(c->op)) continue;
        const double t = achieved_time(c, hw);
        switch (r->sec[i]) {
        case SEC_FWD:
            u->t[0][PLAN_FWD] += t;
            if (c->op == OPK_GEMM)
                for (int k = OPC_FLOP_GEMM_BF16; k <= OPC_FLOP_GEMM_F32; k++) u->gemm_fwd += c->flops[k];
            break;
        case SEC_BWD_I: u->t[0][PLAN_BWD_I] += t; break;
        case SEC_BWD_W: u->t[0][PLAN_BWD_W] += t; break;
        case SEC_HEAD_FWD: u->t[1][PLAN_FWD] += t; break;
        case SEC_HEAD_BWD_I: u->t[1][PLAN_BWD_I] += t; break;
        case SEC_HEAD_BWD_W: u->t[1][PLAN_BWD_W] += t; break;
        case SEC_EMBEDDING: u->t[2][strncmp(r->span[i], "forward", 7) ? PLAN_BWD_I : PLAN_FWD] += t; break;
        default: break;
        }
    }
}

/* What changes the ops of a block, the head and the embedding, and their rates. */
static void op_times_key(char *key, size_t n, const tetra_config *cfg, const tetra_job *job, const plan_hw *hw) {
    const llama3_args *a = llama3_args_of(&job->model);
    const tetra_config_values *v = &cfg->v;
    int w = snprintf(key, n, "%s %d %d %d %d %d %a %a|%s %s|%s %s %d|%s %a %a %a %a %a %a %a %a", a->flavor, a->dim,
                     a->n_heads, a->n_kv_heads, a->vocab_size, a->multiple_of, a->ffn_dim_multiplier, a->norm_eps,
                     v->training.dtype, v->training.mixed_precision_param, v->quantize_linear_float8.recipe_name,
                     job->float8 ? "f8" : "-", v->quantize_linear_float8.emulate, hw->name, hw->peak_bf16_flops,
                     hw->peak_fp8_flops, hw->peak_fp32_flops, hw->memory_bandwidth, hw->gemm_efficiency,
                     hw->fp8_gemm_efficiency, hw->memory_efficiency, hw->attention_efficiency);
    for (int i = 0; i < v->quantize_linear_float8.filter_fqns.n && w > 0 && (size_t)w < n; i++)
        w += snprintf(key + w, n - (size_t)w, "|%s", v->quantize_linear_float8.filter_fqns.items[i]);
    for (int i = 0; i < v->model.converters.n && w > 0 && (size_t)w < n; i++)
        w += snprintf(key + w, n - (size_t)w, "|%s", v->model.converters.items[i]);
}

/* base (a recording config) cut to what the fit records: 3 blocks (the middle one is
 * measured), one sequence of `rows` tokens a step, AC none */
static int record_rows(recording *r, const tetra_config *base, int rows, int sharded, const op_cost_device *dev,
                       const plan_hw *hw, char *err, size_t errlen) {
    tetra_config c;
    char seq[32];
    snprintf(seq, sizeof seq, "%d", rows);
    const char *kv[] = {"model.n_layers", "3", "training.seq_len", seq, "training.local_batch_size", "1",
                        "training.global_batch_size", "-1", "activation_checkpoint.mode", "none",
                        /* offload moves the optimizer, not a block's ops, and pins real host memory */
                        "training.enable_cpu_offload", "false"};
    if (plan_cfg_with(&c, base, kv, (int)(sizeof kv / sizeof *kv) / 2, err, errlen)) return -1;
    tetra_job job;
    int rc = job_resolve(&c, 1, &job, err, errlen) || plan_check_llama(&job, err, errlen) ? -1 : 0;
    if (!rc) rc = record(r, &c, &job, dev, hw, 1, sharded, err, errlen) ? -1 : 0;
    cfg_free(&c);
    return rc;
}

int plan_op_times_record(const tetra_config *cfg, const plan_hw *hw, int sharded, plan_op_times *out, char *err,
                         size_t errlen) {
    /* a layout search alternates a few models (float8 on and off): keep several */
    static struct {
        char key[4096];
        plan_op_times t;
    } cache[8];
    static int next;
    tetra_config base;
    if (recording_config(&base, cfg, 0, err, errlen)) return -1;
    tetra_job job;
    if (job_resolve(&base, 1, &job, err, errlen) || plan_check_llama(&job, err, errlen)) {
        cfg_free(&base);
        return -1;
    }
    char key[4096];
    op_times_key(key, sizeof key, &base, &job, hw);
    snprintf(key + strlen(key), sizeof key - strlen(key), "|%d", sharded);
    for (int i = 0; i < (int)(sizeof cache / sizeof *cache); i++)
        if (cache[i].key[0] && !strcmp(key, cache[i].key)) {
            cfg_free(&base);
            *out = cache[i].t;
            return 0;
        }
    host_start(NULL, NULL);
    const op_cost_device dev = op_cost_device_h100();
    /* two row counts where every GEMM of a Llama block is compute-bound: the fit is exact
     * for ops linear in the rows, which all but attention are */
    const int R[2] = {4096, 8192};
    unit_times u[2];
    for (int k = 0; k < 2; k++) {
        recording r;
        const int rc = record_rows(&r, &base, R[k], sharded, &dev, hw, err, errlen);
        ops_record_release();
        if (rc) {
            recording_free(&r);
            cfg_free(&base);
            return -1;
        }
        unit_times_of(&r, hw, &u[k]);
        recording_free(&r);
    }
    memset(out, 0, sizeof *out);
    plan_unit_time *unit[3] = {&out->block, &out->head, &out->embedding};
    for (int x = 0; x < 3; x++)
        for (int ph = 0; ph < PLAN_PHASES; ph++) {
            const double b = (u[1].t[x][ph] - u[0].t[x][ph]) / (R[1] - R[0]);
            unit[x]->per_row[ph] = b;
            unit[x]->per_step[ph] = fmax(0.0, u[0].t[x][ph] - b * R[0]);
        }
    out->block_gemm_flops_fwd_row = u[1].gemm_fwd / R[1];
    cfg_free(&base);
    snprintf(cache[next].key, sizeof cache[next].key, "%s", key);
    cache[next].t = *out;
    next = (next + 1) % (int)(sizeof cache / sizeof *cache);
    return 0;
}

int plan_ops_main(const tetra_config *cfg, const plan_hw *hw, int block, int json) {
    if (plan_hw_is_host(hw)) {
        fprintf(stderr,
                "tetra plan --ops: %s is a CPU profile; the op table describes the CUDA backend (use a GPU "
                "profile, e.g. --hardware h100-sxm)\n",
                hw->name);
        return 2;
    }
    const int started = host_start(NULL, NULL);
    const op_cost_device dev = op_cost_device_h100();
    char err[4096];
    recording r, bf;
    memset(&r, 0, sizeof r);
    memset(&bf, 0, sizeof bf);
    int rc = record_config(&r, cfg, 0, &dev, hw, block, err, sizeof err);
    const int f8 = rc == 0 && has_float8(cfg);
    if (f8) rc = record_config(&bf, cfg, 1, &dev, hw, r.block, err, sizeof err);
    ops_record_release();
    if (rc) {
        fprintf(stderr, "tetra plan --ops: %s\n", err);
        recording_free(&r);
        recording_free(&bf);
        if (started) host_end();
        return rc == -2 ? 2 : 1;
    }
    f8_delta d;
    if (f8) float8_delta(&r, &bf, &d);
    if (json) {
        json_t *o = report_json(cfg, &r, hw, &dev, f8 ? &d : NULL);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(12));
        if (s) puts(s);
        free(s);
        json_decref(o);
    } else {
        print_report(cfg, &r, hw, &dev);
        if (f8) print_float8(&d, r.block);
    }
    recording_free(&r);
    recording_free(&bf);
    if (started) host_end();
    return 0;
}
