/* train_ckpt.c — the training job's checkpoint state (checkpoint/checkpoint.h has
 * the protocol, docs/checkpoint.md the user's view): which checkpoint a run starts
 * from, what a save holds, and loading it back under any layout. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "models/model.h"
#include "telemetry/log.h"
#include "engine/trainer_internal.h"
#include "util/host.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ----------------------------------------------------------------------------
 * checkpoints (checkpoint/checkpoint.h has the protocol, docs/checkpoint.md the
 * user's view). Tensors: "model/<name>" (the fp32 master parameters: on the
 * CPU the parameters are the master weights), "optimizer/exp_avg/<name>" and
 * "optimizer/exp_avg_sq/<name>", each rank's FSDP piece; the rest of the
 * training state is JSON in metadata.json. */

int train_ckpt_excluded(const tetra_config_values *c, const char *what) {
    for (int i = 0; i < c->checkpoint.exclude_from_loading.n; i++)
        if (!strcmp(c->checkpoint.exclude_from_loading.items[i], what)) return 1;
    return 0;
}

/* <dump_folder>/<folder>; an absolute folder is used as is (as os.path.join). */
static void checkpoint_dir(const tetra_config_values *c, char *out, size_t n) {
    const char *f = c->checkpoint.folder && c->checkpoint.folder[0] ? c->checkpoint.folder : "checkpoint";
    if (f[0] == '/') snprintf(out, n, "%s", f);
    else ck_snprintf(out, n, "%s/%s", c->job.dump_folder && c->job.dump_folder[0] ? c->job.dump_folder : ".", f);
}

static int has_metadata(const char *dir) {
    char p[4200];
    ck_snprintf(p, sizeof p, "%s/metadata.json", dir);
    return access(p, F_OK) == 0;
}

/* Rank 0 looks, every rank learns the answer: 1 = path set, 0 = none, -1 = error. */
static int find_agreed(int rank, const char *dir, int64_t load_step, int newest_only, char *path, size_t n, char *err,
                       size_t errlen) {
    int rc = 0;
    char buf[4096 + 2048], note[2048] = "";
    memset(buf, 0, sizeof buf);
    if (rank == 0) {
        if (newest_only && has_metadata(dir)) { /* a step folder itself */
            ck_snprintf(path, n, "%s", dir);
            rc = 1;
        } else {
            rc = ckpt_find(dir, load_step, path, n, note, sizeof note, err, errlen);
        }
        ck_snprintf(buf, sizeof buf, "%s", rc == 1 ? path : rc < 0 ? err : "");
        if (note[0]) log_info("checkpoint: %s", note);
    }
    host_bcast(&rc, sizeof rc, 0);
    host_bcast(buf, sizeof buf, 0);
    buf[sizeof buf - 1] = '\0';
    if (rc == 1) ck_snprintf(path, n, "%s", buf);
    if (rc < 0) ck_snprintf(err, errlen, "%s", buf);
    return rc;
}

static char *hex_encode(const unsigned char *p, size_t n) {
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    for (size_t i = 0; i < n; i++) sprintf(s + 2 * i, "%02x", p[i]);
    s[2 * n] = '\0';
    return s;
}

static int hex_decode(const char *s, unsigned char *out, size_t n) {
    if (!s || strlen(s) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

/* The state objects stored next to the tensors (rank 0's are used). */
static json_t *state_json(const trainer *t, int model_only) {
    const tetra_config_values *c = t->c;
    const cfg_parallel_dims *dims = &t->job.dims;
    const train_counters *tc = &t->tc;
    const dl_loader *train = t->train;
    const int T = t->shape.seq_len, B = (int)c->training.local_batch_size, accum = t->shape.accum;
    json_t *st = json_object(), *o;
    o = json_object();
    json_object_set_new(o, "step", json_integer(tc->step));
    json_object_set_new(o, "tokens_seen", json_integer(tc->tokens_seen));
    json_object_set_new(st, "train_state", o);
    json_object_set_new(st, "model", t->args.family->checkpoint_json(&t->args, T));
    o = json_object();
    json_object_set_new(o, "world", json_integer(dims->world));
    json_object_set_new(o, "pp", json_integer(dims->pp));
    json_object_set_new(o, "dp_replicate", json_integer(dims->dp_replicate));
    json_object_set_new(o, "dp_shard", json_integer(dims->dp_shard));
    json_object_set_new(o, "cp", json_integer(dims->cp));
    json_object_set_new(o, "tp", json_integer(dims->tp));
    json_object_set_new(st, "parallelism", o);
    o = json_object();
    json_object_set_new(o, "seed", json_integer(c->training.seed));
    json_object_set_new(o, "note",
                        json_string("initial weights are a counter-based function of (seed, parameter "
                                    "name, element index) and training draws no random numbers (no "
                                    "dropout, no shuffling RNG state): there is no generator state"));
    json_object_set_new(st, "rng", o);
    o = json_object();
    int64_t bos = train ? dl_bos_id(train) : -1, eos = train ? dl_eos_id(train) : -1;
    if (bos >= 0) json_object_set_new(o, "bos_id", json_integer(bos));
    if (eos >= 0) json_object_set_new(o, "eos_id", json_integer(eos));
    json_object_set_new(st, "tokenizer", o);
    if (model_only) return st;
    o = json_object();
    json_object_set_new(o, "count", json_integer(tc->lr_count));
    json_object_set_new(o, "warmup_steps", json_integer(c->lr_scheduler.warmup_steps));
    json_object_set_new(
        o, "total_steps",
        json_integer(c->lr_scheduler.total_steps > 0 ? c->lr_scheduler.total_steps : c->training.steps));
    json_object_set_new(o, "decay_type", json_string(c->lr_scheduler.decay_type));
    json_object_set_new(st, "lr_scheduler", o);
    o = json_object();
    json_object_set_new(o, "name", json_string("AdamW"));
    json_object_set_new(o, "step", json_integer(tc->opt_step));
    json_object_set_new(o, "lr", json_real(c->optimizer.lr));
    json_object_set_new(o, "beta1", json_real(c->optimizer.beta1));
    json_object_set_new(o, "beta2", json_real(c->optimizer.beta2));
    json_object_set_new(o, "eps", json_real(c->optimizer.eps));
    json_object_set_new(o, "weight_decay", json_real(c->optimizer.weight_decay));
    json_object_set_new(st, "optimizer", o);
    unsigned char dl[DL_STATE_BYTES];
    o = json_object();
    if (train && dl_state_save(train, dl, sizeof dl) == 0) {
        char *hex = hex_encode(dl, sizeof dl);
        json_object_set_new(o, "state", json_string(hex ? hex : ""));
        free(hex);
    }
    json_object_set_new(o, "position", json_integer(train ? (json_int_t)dl_position(train) : 0));
    json_object_set_new(o, "global_batch_size", json_integer(dims->global_batch_size));
    json_object_set_new(o, "seq_len", json_integer(T));
    json_object_set_new(o, "dp_degree", json_integer(dims->dp));
    json_object_set_new(o, "local_batch_size", json_integer(B));
    json_object_set_new(o, "grad_accum_steps", json_integer(accum));
    json_object_set_new(st, "dataloader", o);
    return st;
}

static int64_t state_int(const ck_meta *m, const char *obj, const char *key, int64_t def) {
    json_t *v = json_object_get(json_object_get(m->state, obj), key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : def;
}

/* Load a checkpoint on every rank (collective). model_only: restore the
 * weights alone (initial_load_model_only, or a model-only checkpoint). */
/* The checkpoint's model tensors are this model's, all of them and no more (the
 * family's rule); each is also checked by name and shape as it loads. */
static int check_model_tensors(const trainer *t, const ck_meta *m, const char *path, char *err, size_t errlen) {
    const char **names = malloc((size_t)(m->n_tensors > 0 ? m->n_tensors : 1) * sizeof *names);
    if (!names) {
        snprintf(err, errlen, "checkpoint %s: out of host memory", path);
        return -1;
    }
    int n = 0;
    for (int i = 0; i < m->n_tensors; i++)
        if (!strncmp(m->tensors[i].name, "model/", 6)) names[n++] = m->tensors[i].name + 6;
    char why[1024];
    const int rc = t->args.family->check_checkpoint(&t->args, names, n, why, sizeof why);
    free(names);
    if (rc) snprintf(err, errlen, "checkpoint %s %s", path, why);
    return rc;
}

int train_load_checkpoint(trainer *t, const char *path, int model_only, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    const cfg_parallel_dims *dims = &t->job.dims;
    const ckpt_group *groups = t->groups;
    dl_loader *train = t->train;
    const tetra_ops *ops = t->ops;
    const int rank = t->rank;
    train_counters *tc = &t->tc;
    double t0 = now_s();
    ckpt_reader *r = ckpt_reader_open(path, err, errlen);
    if (ckpt_agree(r == NULL, err, errlen)) {
        ckpt_reader_close(r);
        return -1;
    }
    const ck_meta *m = ckpt_reader_meta(r);
    int rest = !model_only && !m->model_only;
    if (!model_only && m->model_only && rank == 0 && m->step > 0)
        log_warn("checkpoint %s holds model weights only (a final model-only save): the optimizer, LR schedule, "
                 "data position and step start fresh",
                 path);
    int failed = 0;
    const int nl = t->n_local;
    /* the checkpoint's model must be this model: every tensor is checked by name and shape
     * as it loads, and here nothing is left over (a deeper model's extra blocks) */
    if (!train_ckpt_excluded(c, "model")) {
        failed = check_model_tensors(t, m, path, err, errlen) != 0;
        if (ckpt_agree(failed, err, errlen)) goto fail;
    }
    if (!train_ckpt_excluded(c, "model"))
        for (int i = 0; i < nl && !failed; i++)
            failed = ckpt_reader_load(r, &groups[G_MODEL * nl + i], ops, err, errlen) != 0;
    if (ckpt_agree(failed, err, errlen)) goto fail;
    if (rest && !train_ckpt_excluded(c, "optimizer")) {
        for (int i = 0; i < nl && !failed; i++)
            failed = ckpt_reader_load(r, &groups[G_EXP_AVG * nl + i], ops, err, errlen) != 0 ||
                ckpt_reader_load(r, &groups[G_EXP_AVG_SQ * nl + i], ops, err, errlen) != 0;
        if (ckpt_agree(failed, err, errlen)) goto fail;
        tc->opt_step = state_int(m, "optimizer", "step", 0);
    }
    if (rest && !train_ckpt_excluded(c, "lr_scheduler")) tc->lr_count = state_int(m, "lr_scheduler", "count", 0);
    if (rest && !train_ckpt_excluded(c, "train_state")) {
        tc->step = state_int(m, "train_state", "step", m->step);
        tc->tokens_seen = state_int(m, "train_state", "tokens_seen", 0);
    }
    if (rest && train && !train_ckpt_excluded(c, "dataloader")) {
        json_t *dl = json_object_get(m->state, "dataloader");
        unsigned char buf[DL_STATE_BYTES];
        if (hex_decode(json_string_value(json_object_get(dl, "state")), buf, sizeof buf) != 0) {
            ck_snprintf(err, errlen, "checkpoint %s: the data loader state is missing or malformed", path);
            failed = 1;
        } else if (dl_state_load(train, buf, sizeof buf, err, errlen) != 0) {
            char why[1024];
            ck_snprintf(why, sizeof why, "%s", err);
            ck_snprintf(err, errlen,
                        "checkpoint %s: %s (exclude it with checkpoint.exclude_from_loading = "
                        "[\"dataloader\"] to start the data from the beginning)",
                        path, why);
            failed = 1;
        }
        if (ckpt_agree(failed, err, errlen)) goto fail;
        int64_t g = state_int(m, "dataloader", "global_batch_size", dims->global_batch_size);
        int64_t saved_dp = state_int(m, "dataloader", "dp_degree", dims->dp);
        if (rank == 0 && g != dims->global_batch_size)
            log_warn("data loader: the global batch changed from %" PRId64 " to %lld sequences; the data continues "
                     "at global window %llu, so no window is skipped or repeated, but steps now consume %lld windows",
                     g, (long long)dims->global_batch_size, (unsigned long long)dl_position(train),
                     (long long)dims->global_batch_size);
        else if (rank == 0 && saved_dp != dims->dp)
            log_info("data loader: saved under %" PRId64 " data-parallel ranks, resumed under %d; the position "
                     "(global window %llu) is global, so every step reads the same global batch as before",
                     saved_dp, dims->dp, (unsigned long long)dl_position(train));
    }
    if (rank == 0) {
        uint64_t bytes = 0;
        for (int i = 0; i < m->n_files; i++) bytes += m->files[i].size;
        double dt = now_s() - t0;
        log_info("checkpoint: loaded %s (step %" PRId64 ", %s) in %.2f s: %.1f MiB, %.0f MB/s; saved under world "
                 "%" PRId64 " (pp %" PRId64 " x dp_replicate %" PRId64 " x dp_shard %" PRId64 " x tp %" PRId64
                 "), now world %d "
                 "(pp %d x dp_replicate %d x dp_shard %d x tp %d)",
                 path, m->step, rest ? "full state" : "model weights", dt, (double)bytes / (1024.0 * 1024.0),
                 dt > 0 ? (double)bytes / dt / 1e6 : 0.0, state_int(m, "parallelism", "world", -1),
                 state_int(m, "parallelism", "pp", 1), state_int(m, "parallelism", "dp_replicate", -1),
                 state_int(m, "parallelism", "dp_shard", -1), state_int(m, "parallelism", "tp", 1), dims->world,
                 dims->pp, dims->dp_replicate, dims->dp_shard, dims->tp);
    }
    ckpt_reader_close(r);
    for (int i = 0; i < nl; i++) fsdp_master_changed(t->st[i].fs);
    return 0;
fail:
    ckpt_reader_close(r);
    return -1;
}

void train_log_save(const ckpt_saver *sv, int async_done) {
    ckpt_save_report rep = ckpt_last_report(sv);
    double mib = (double)rep.total_bytes / (1024.0 * 1024.0);
    if (async_done)
        log_info("checkpoint: step-%" PRId64 " complete (async): %.1f MiB written in %.2f s behind training "
                 "(%.0f MB/s); staging stalled training %.3f s",
                 rep.step, mib, rep.write_s, rep.write_s > 0 ? (double)rep.total_bytes / rep.write_s / 1e6 : 0.0,
                 rep.stage_s);
    else
        log_info("checkpoint: saved step-%" PRId64 ": %.1f MiB in %.2f s (%.0f MB/s written, %.2f s until published)",
                 rep.step, mib, rep.write_s, rep.write_s > 0 ? (double)rep.total_bytes / rep.write_s / 1e6 : 0.0,
                 rep.total_s);
}

/* Which checkpoint (if any) this run starts from: the run's own newest complete
 * checkpoint (or checkpoint.load_step) when checkpoint.enable; otherwise, or when
 * there is none, initial_load_path (a tetra checkpoint; Hugging Face safetensors are
 * read by the caller). Stale step-N.tmp-* folders of runs that died mid-save are
 * removed first. 1 with the path, 0 for none, -1 with a message. */
int train_find_checkpoint(trainer *t, char *load_path, size_t n, int *model_only, int *initial, char *err,
                          size_t errlen) {
    const tetra_config_values *c = t->c;
    checkpoint_dir(c, t->ckpt_dir, sizeof t->ckpt_dir);
    *model_only = 0;
    *initial = 0;
    int found = 0;
    if (c->checkpoint.enable) {
        if (t->rank == 0) {
            char kept[1024];
            int k = ckpt_cleanup_stale_report(t->ckpt_dir, kept, sizeof kept);
            if (k > 0)
                log_info("checkpoint: removed %d incomplete save folder%s (step-*.tmp-*) of an earlier run in %s", k,
                         k == 1 ? "" : "s", t->ckpt_dir);
            if (kept[0])
                log_warn("checkpoint: left %s in %s alone: the save of a run that is still running (two live runs "
                         "must not share a checkpoint folder)",
                         kept, t->ckpt_dir);
        }
        found = find_agreed(t->rank, t->ckpt_dir, c->checkpoint.load_step, 0, load_path, n, err, errlen);
        if (found < 0) return -1;
    }
    if (!found && c->checkpoint.initial_load_path && !c->checkpoint.initial_load_in_hf) {
        char why[2048];
        found = find_agreed(t->rank, c->checkpoint.initial_load_path, -1, 1, load_path, n, why, sizeof why);
        if (found <= 0) {
            ck_snprintf(err, errlen, "checkpoint.initial_load_path '%s': %s", c->checkpoint.initial_load_path,
                        found < 0 ? why
                                  : "no complete tetra checkpoint there (for Hugging Face safetensors set "
                                    "checkpoint.initial_load_in_hf = true)");
            return -1;
        }
        *initial = 1;
        *model_only = c->checkpoint.initial_load_model_only;
    }
    return found;
}

/* The final save as Hugging Face safetensors (checkpoint.last_save_in_hf): ctx is the
 * trainer's hf_export (the family and the dtype), which outlives any save. */
static int export_hf(const char *step_dir, const char *out_dir, const void *ctx, char *err, size_t errlen) {
    const train_hf_export *x = ctx;
    return x->family->hf_export(step_dir, out_dir, x->dtype, err, errlen);
}

int train_save_checkpoint(trainer *t, int64_t step, int model_only, int last, char *err, size_t errlen) {
    const tetra_config_values *c = t->c;
    tetra_dtype edt = TETRA_F32;
    ck_dtype_parse(c->checkpoint.export_dtype, &edt);
    json_t *st = state_json(t, model_only);
    ckpt_save_request rq;
    memset(&rq, 0, sizeof rq);
    rq.step = step;
    rq.groups = t->save_groups;
    rq.n_groups = (model_only ? 1 : N_GROUPS) * t->n_local;
    rq.dtype = model_only && !(last && c->checkpoint.last_save_in_hf) && step > 0 ? edt : TETRA_F32;
    rq.model_only = model_only;
    rq.state = st;
    if (last && c->checkpoint.last_save_in_hf) {
        t->hf_export = (train_hf_export){t->args.family, edt};
        rq.convert = export_hf;
        rq.convert_ctx = &t->hf_export;
    }
    rq.sync = last || step == 0;
    double ts = now_s();
    int rc = 0;
    if (ckpt_in_flight(t->saver)) { /* at most one save in flight: finish the previous one first */
        int pr = ckpt_poll(t->saver, 1, err, errlen);
        if (pr > 0 && t->rank == 0) train_log_save(t->saver, 1);
        rc = pr < 0 ? -1 : 0;
    }
    if (rc == 0) rc = ckpt_save(t->saver, &rq, err, errlen) ? -1 : 0;
    json_decref(st);
    if (rc == 0 && t->rank == 0) {
        if (ckpt_in_flight(t->saver))
            log_info("checkpoint: step %lld staged for an async save in %.3f s (%.3f s in ckpt_save); training "
                     "continues while it is written",
                     (long long)step, ckpt_last_stage_s(t->saver), now_s() - ts);
        else train_log_save(t->saver, 0);
    }
    return rc;
}
