/* trainer_plan.c — what a rank lays out: its memory plan (a dry run's, `tetra plan`'s,
 * the start-up lines), the memory snapshots made from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/trainer_internal.h"
#include "telemetry/log.h"
#include "telemetry/memsnap.h"

void train_fmt_bytes(char *buf, size_t n, double bytes) {
    if (bytes >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    else snprintf(buf, n, "%.1f MiB", bytes / (1024.0 * 1024));
}

/* ----------------------------------------------------------------------------
 * what this run is, and its memory per rank */

/* Validation runs forward only: its activations keep nothing beyond the residual
 * stream and the head, on a workspace of its own shape. */
unsigned *train_keep_none(const train_stage *s) {
    const int nb = s->model.block_end - s->model.block_start;
    unsigned *k = calloc((size_t)(nb > 0 ? nb : 1), sizeof *k); /* keep mask 0: only each block's input */
    return k;
}

static size_t validation_bytes(const trainer *t, const train_stage *s) {
    unsigned *none = train_keep_none(s);
    const model_family *f = s->model.family;
    size_t b = none ? f->acts_bytes(&s->model, none, t->vshape.batch, t->vshape.rows) +
            f->workspace_bytes(&s->model, t->vshape.batch, t->vshape.rows, 1, 0)
                    : 0;
    free(none);
    return b;
}

/* "layers 0-3 + embedding" */
static void describe_stage(const train_stage *s, char *buf, size_t n) {
    const model_stage *L = &s->model;
    if (L->block_end > L->block_start)
        snprintf(buf, n, "stage %d: blocks %d-%d%s%s", s->index, L->block_start, L->block_end - 1,
                 L->has_input ? " + embedding" : "", L->has_output ? " + norm/output" : "");
    else
        snprintf(buf, n, "stage %d: no blocks%s%s", s->index, L->has_input ? ", embedding" : "",
                 L->has_output ? ", norm/output" : "");
}

/* One gradient of a stage's input, as the pipeline sends it back: [B, Tl / tp, dim]. */
size_t train_send_bytes(const trainer *t, const train_stage *s) {
    return t->shape.tokens / (size_t)s->model.tp_size * s->model.residual_width *
        tetra_dtype_size(s->model.compute_dtype);
}

/* What this rank's dry run lays out (trainer.h). */
void train_fill_plan(const trainer *t, trainer_plan *p) {
    const tetra_config_values *c = t->c;
    memset(p, 0, sizeof *p);
    for (int i = 0; i < t->n_local; i++) {
        const train_stage *s = &t->st[i];
        fsdp_memory m = fsdp_memory_report(s->fs);
        if (c->training.enable_cpu_offload) { /* the master and the moments live on the host */
            p->param_bytes += (double)m.compute_bytes;
            p->host_bytes += (double)(m.host_bytes + m.optim_bytes);
            p->offload = 1;
        } else {
            p->param_bytes += (double)(m.param_bytes + m.compute_bytes);
            p->optim_bytes += (double)m.optim_bytes;
        }
        p->grad_bytes += (double)m.grad_bytes;
        p->work_param_bytes += (double)m.work_param_bytes;
        if (s->grad_arena < 0) p->work_grad_bytes += (double)m.work_grad_bytes;
        else p->grad_arena_stages++;
        p->reduce_bytes += (double)m.reduce_bytes;
        p->resident_units += m.resident_units;
        const model_family *f = s->model.family;
        const size_t a1 = f->acts_bytes(&s->model, s->keep, t->shape.batch, t->shape.rows);
        /* the rank's one workspace, counted with the stage that lays it out */
        const size_t w = s->ws_owner
            ? f->workspace_bytes(&s->model, t->shape.batch, t->shape.rows, s->fwd_scratch, s->recompute_slots)
            : 0;
        p->act_bytes += (double)((size_t)s->n_acts * a1 + w + (size_t)s->n_send * train_send_bytes(t, s));
        p->act_mb_bytes += (double)a1;
        p->workspace_bytes += (double)w;
        p->act_mb_full_bytes += (double)f->acts_bytes(&s->model, NULL, t->shape.batch, t->shape.rows);
        p->n_acts += s->n_acts;
        p->n_dropping += s->n_dropping;
        const model_stage *L = &s->model;
        p->n_blocks += L->block_end - L->block_start;
        if (s->ws_owner) p->recompute_slots = s->recompute_slots;
        if (c->validation.enable && (t->vshape.batch != t->shape.batch || t->vshape.rows != t->shape.rows))
            p->validation_bytes += (double)validation_bytes(t, s);
        for (int q = 0; q < t->n_conv; q++)
            if (t->conv[q]->backend_bytes && s->conv_state[q])
                p->converter_bytes += (double)t->conv[q]->backend_bytes(s->conv_state[q]);
        if (i < TRAINER_PLAN_MAX_STAGES) {
            p->stage[i] = s->index;
            p->stage_blocks[i] = L->block_end - L->block_start;
            p->stage_embedding[i] = L->has_input;
            p->stage_head[i] = L->has_output;
            for (int k = 0; k < L->block_end - L->block_start; k++) {
                int att = 0;
                p->stage_recompute_flops[i] += f->recompute_flops(L, s->keep[k], &att);
                p->stage_recompute_attention[i] += att;
            }
        }
    }
    if (t->grad_arena_off) p->work_grad_bytes += (double)t->grad_arena_off[t->n_grad_arenas];
    p->grad_arenas = t->n_grad_arenas;
    p->act_bytes += p->validation_bytes;
    /* the step's scalars: optimizer state, loss sums and gradient norms (train_step.c) */
    p->act_bytes += (double)train_step_scalar_bytes(t);
    p->total_bytes = p->param_bytes + p->grad_bytes + p->optim_bytes + p->work_param_bytes + p->work_grad_bytes +
        p->reduce_bytes + p->act_bytes + p->converter_bytes;
    /* what this rank sends per step, by parallelism */
    const train_stage *s0 = &t->st[0];
    const int mbs = t->shape.n_mb * (t->pp_size > 1 ? t->shape.accum : 1);
    for (int i = 0; i < t->n_local; i++) {
        fsdp_traffic x = fsdp_step_traffic(t->st[i].fs, mbs);
        p->fsdp_all_gather += x.all_gather;
        p->fsdp_reduce_scatter += x.reduce_scatter;
        p->replicate_all_reduce += x.all_reduce;
        const model_stage *m = &t->st[i].model;
        p->tp_bytes += (double)mbs * m->family->tp_traffic_bytes(m, t->st[i].keep, t->shape.batch, t->shape.rows);
    }
    if (t->pp_size > 1) {
        const double msg = (double)t->shape.tokens / s0->model.tp_size * (double)s0->model.residual_width *
            (double)tetra_dtype_size(s0->model.compute_dtype);
        for (int i = 0; i < t->n_local; i++)
            p->pp_bytes += (double)mbs * msg * (t->st[i].remote_next + t->st[i].remote_prev);
    }
    p->pp_rank = t->pp_rank;
    p->n_local = t->n_local;
    p->n_stages = t->n_stages;
    p->n_microbatches = t->shape.n_mb;
    p->accum = t->shape.accum;
    p->local_batch = t->shape.batch;
    p->rows = t->shape.rows;
    p->mixed = t->mixed;
    p->n_params = t->n_params;
    p->flops_per_token = t->flops_per_token;
}

/* profiling.enable_memory_snapshot: <dump>/<folder>/iteration_<step>[_exit]/rank<r>_memory_snapshot.json */
void train_memory_snapshot(const trainer *t, int64_t step, const char *reason, int at_exit) {
    const tetra_config_values *c = t->c;
    if (!c->profiling.enable_memory_snapshot || t->opt.dry_run) return;
    trainer_plan p;
    train_fill_plan(t, &p);
    char dir[8400], err[512];
    const char *f = c->profiling.save_memory_snapshot_folder;
    if (f[0] == '/') snprintf(dir, sizeof dir, "%s/iteration_%lld%s", f, (long long)step, at_exit ? "_exit" : "");
    else
        snprintf(dir, sizeof dir, "%s/%s/iteration_%lld%s", c->job.dump_folder, f, (long long)step,
                 at_exit ? "_exit" : "");
    /* the plan's categories, as train_fill_plan adds them up to total_bytes */
    const double acts = p.act_bytes - p.workspace_bytes - p.validation_bytes;
    const memsnap_category cat[] = {
        {"parameters", p.param_bytes,
         p.mixed ? "this rank's fp32 shard of the parameters and its bf16 copy"
                 : "this rank's fp32 shard of the parameters"},
        {"gradients", p.grad_bytes, "this rank's shard of the gradients (fp32)"},
        {"optimizer_state", p.optim_bytes, "AdamW's two moments for this rank's shard (fp32)"},
        {"gathered_parameters", p.work_param_bytes, "whole units' parameters gathered for compute (FSDP working set)"},
        {"unsharded_gradients", p.work_grad_bytes, "whole units' gradients before the reduce-scatter"},
        {"reduce_staging", p.reduce_bytes, "reduce-scatter and all-reduce staging"},
        {"activations", acts,
         "activations kept for backward, every microbatch alive at once, and pipeline send buffers"},
        {"workspace", p.workspace_bytes, "recompute slots and per-op scratch shared by the blocks"},
        {"validation", p.validation_bytes, "validation activations (when its batch shape differs)"},
        {"converters", p.converter_bytes, "model converters' state (Float8 scales, amax history)"},
    };
    const memsnap_plan mp = {cat, (int)(sizeof cat / sizeof cat[0]), p.mixed};
    if (memsnap_write(dir, t->rank, step, reason, &mp, t->ops, err, sizeof err)) log_warn("%s", err);
    else if (t->rank == 0) log_info("memory snapshot (%s): %s/rank<r>_memory_snapshot.json", reason, dir);
}

void train_log_plan(trainer *t) {
    const tetra_config_values *c = t->c;
    const train_stage *s0 = &t->st[0];
    const int S = fsdp_shard_degree(s0->fs), R = fsdp_replicate_degree(s0->fs);
    const char *mode = t->world == 1 ? "single rank"
        : S == 1 && R == 1           ? "no data parallel"
        : S == 1                     ? "DDP (replicated)"
        : R == 1                     ? "FSDP (sharded)"
                                     : "HSDP (sharded x replicated)";
    char mdesc[160];
    mesh_describe(&t->msh, mdesc, sizeof mdesc);
    log_info("model %s %s: %.3fM parameters, %.3g FLOPs/token at seq_len %d", c->model.name, c->model.flavor,
             t->n_params / 1e6, t->flops_per_token, t->shape.seq_len);
    if (t->opt.dry_run)
        log_info("dry run: backend %s (planned, nothing allocated), %d threads per rank; %s: %s; gradient "
                 "accumulation %d",
                 t->ops->name, t->threads, mdesc, mode, t->shape.accum);
    else
        log_info("backend %s, %d threads per rank; %s: %s, comm %s; gradient accumulation %d; peak %.1f %s "
                 "per rank (%s)",
                 t->ops->name, t->threads, mdesc, mode,
                 t->comm_staged ? "mpi (device buffers staged through host memory)"
                                : comm_backend_name(comm_world_backend(t->cw)),
                 t->shape.accum, t->peak >= 1e13 ? t->peak / 1e12 : t->peak / 1e9,
                 t->peak >= 1e13 ? "TFLOP/s" : "GFLOP/s", t->peak_src);
    if (t->pp_size > 1) {
        const char *csv = c->parallelism.pipeline_parallel_schedule_csv;
        char stages[512] = "";
        for (int i = 0; i < t->n_local; i++) {
            char d[128];
            describe_stage(&t->st[i], d, sizeof d);
            snprintf(stages + strlen(stages), sizeof stages - strlen(stages), "%s%s", i ? "; " : "", d);
        }
        log_info("pipeline: schedule %s%s%s, %d stages (%d per rank), %d microbatch%s of %d sequence%s per round, "
                 "%d round%s per step; pipeline rank %d runs %s",
                 c->parallelism.pipeline_parallel_schedule, csv && csv[0] ? " from " : "", csv && csv[0] ? csv : "",
                 t->n_stages, t->n_local, t->shape.n_mb, t->shape.n_mb == 1 ? "" : "es", t->shape.batch,
                 t->shape.batch == 1 ? "" : "s", t->shape.accum, t->shape.accum == 1 ? "" : "s", t->pp_rank, stages);
    }
    trainer_plan p;
    train_fill_plan(t, &p);
    char pb[32], gb[32], ob[32], wpb[32], wgb[80], rb[32], ab[32], a1s[32], wb[32], vbs[32], tot[32];
    train_fmt_bytes(pb, sizeof pb, p.param_bytes);
    train_fmt_bytes(gb, sizeof gb, p.grad_bytes);
    train_fmt_bytes(ob, sizeof ob, p.optim_bytes);
    train_fmt_bytes(wpb, sizeof wpb, p.work_param_bytes);
    train_fmt_bytes(wgb, sizeof wgb, p.work_grad_bytes);
    if (p.grad_arena_stages > p.grad_arenas)
        snprintf(wgb + strlen(wgb), sizeof wgb - strlen(wgb), " (%d stages taking turns in %d)", p.grad_arena_stages,
                 p.grad_arenas);
    train_fmt_bytes(rb, sizeof rb, p.reduce_bytes);
    train_fmt_bytes(ab, sizeof ab, p.act_bytes);
    train_fmt_bytes(a1s, sizeof a1s, p.act_mb_bytes);
    train_fmt_bytes(wb, sizeof wb, p.workspace_bytes);
    train_fmt_bytes(vbs, sizeof vbs, p.validation_bytes);
    train_fmt_bytes(tot, sizeof tot, p.total_bytes);
    char cpart[64] = "", cvb[32];
    train_fmt_bytes(cvb, sizeof cvb, p.converter_bytes);
    if (p.converter_bytes > 0) snprintf(cpart, sizeof cpart, "; model converters %s", cvb);
    const char *prec = t->mixed ? "bf16 compute: parameters include their bf16 copy; fp32 master weights, gradients "
                                  "and optimizer state"
                                : "fp32";
    char who[300], tpw[48] = "", ppw[48] = "";
    if (s0->model.tp_size > 1) snprintf(tpw, sizeof tpw, "tp %d of %d, ", s0->model.tp_rank, s0->model.tp_size);
    if (t->pp_size > 1) snprintf(ppw, sizeof ppw, "pp %d of %d, ", t->pp_rank, t->pp_size);
    if (S > 1)
        snprintf(who, sizeof who, "%s%sshard %d of %d, %s", ppw, tpw, comm_group_rank(comm_get(t->cw, MESH_G_FSDP)), S,
                 prec);
    else snprintf(who, sizeof who, "%s%s%s", ppw, tpw, prec);
    char vpart[80] = "", mbpart[96];
    if (p.validation_bytes > 0) snprintf(vpart, sizeof vpart, " + validation %s", vbs);
    if (t->n_local == 1)
        snprintf(mbpart, sizeof mbpart, "%d microbatch%s x %s", p.n_acts, p.n_acts == 1 ? "" : "es", a1s);
    else
        snprintf(mbpart, sizeof mbpart, "%d stage-microbatches, %s per microbatch of all %d stages", p.n_acts, a1s,
                 t->n_local);
    if (S > 1)
        log_info("memory rank %d (%s): persistent: parameters %s, gradients %s, optimizer state %s; working: gathered "
                 "parameters %s (%d resident unit%s + 2 slots%s), unsharded gradients %s, reduce staging %s; "
                 "activations %s (%s + workspace %s%s)%s; total %s",
                 t->rank, who, pb, gb, ob, wpb, p.resident_units, p.resident_units == 1 ? "" : "s",
                 t->n_local > 1 ? " per stage" : "", wgb, rb, ab, mbpart, wb, vpart, cpart, tot);
    else
        log_info("memory rank %d (%s): persistent: parameters %s, gradients %s, optimizer state %s; activations %s "
                 "(%s + workspace %s%s)%s; total %s",
                 t->rank, who, pb, gb, ob, ab, mbpart, wb, vpart, cpart, tot);
    {
        const double mib = 1024.0 * 1024.0;
        if (S > 1 || R > 1 || p.tp_bytes > 0 || p.pp_bytes > 0)
            log_info("communication per step, rank %d sends: fsdp all-gather %.2f MiB, reduce-scatter %.2f MiB, "
                     "replicate all-reduce %.2f MiB; tensor parallel %.2f MiB; pipeline %.2f MiB",
                     t->rank, p.fsdp_all_gather / mib, p.fsdp_reduce_scatter / mib, p.replicate_all_reduce / mib,
                     p.tp_bytes / mib, p.pp_bytes / mib);
    }
    if (p.n_dropping > 0) {
        char full[32];
        train_fmt_bytes(full, sizeof full, p.act_mb_full_bytes);
        log_info("activation checkpointing: mode %s%s%s: %d of %d blocks recompute in backward; %s per microbatch "
                 "instead of %s, %d recompute slot%s in the workspace",
                 c->activation_checkpoint.mode, strcmp(c->activation_checkpoint.mode, "selective") ? "" : ", option ",
                 strcmp(c->activation_checkpoint.mode, "selective") ? "" : c->activation_checkpoint.selective_ac_option,
                 p.n_dropping, p.n_blocks, a1s, full, p.recompute_slots, p.recompute_slots == 1 ? "" : "s");
    }
    if (p.offload) {
        char hb[32];
        train_fmt_bytes(hb, sizeof hb, p.host_bytes);
        log_info("cpu offload rank %d: %s of page-locked host memory (fp32 master weights, AdamW moments, two "
                 "units' staging); the device keeps the %s parameters and the fp32 gradients; AdamW runs on the "
                 "host, unit by unit, while the neighbouring units' copies run",
                 t->rank, hb, t->mixed ? "bf16" : "fp32");
    }
    if (S > 1)
        log_info("fsdp: %d units sharded over %s (%d ranks), reshard_after_forward = %s%s", s0->model.n_units,
                 comm_group_name(comm_get(t->cw, MESH_G_FSDP)), S, c->parallelism.fsdp_reshard_after_forward,
                 R > 1 ? ", gradients all-reduced over dp_replicate" : "");
}
