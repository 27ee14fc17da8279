/* test_converter.c — model.converters is an extension point: two converters defined
 * here (not in the core) are registered, listed in the config around the built-in
 * float8, and a real training run (debug model, sample corpus, 3 steps) calls their
 * hooks in the listed order:
 *   - "before" converts ahead of float8 and sees the default linears; "after" converts
 *     after it and sees float8 on every linear but the filtered output projection;
 *   - parallelized runs once FSDP wraps the stage; post_optimizer once before the first
 *     step (parameters initialised), then pre_optimizer and post_optimizer once per step,
 *     before and after the update (the gradients are there before; the parameters
 *     changed after);
 *   - an unknown converter is refused naming the registered ones, a duplicate too;
 *   - destroy runs once per converter at teardown.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "engine/converter.h"
#include "engine/job.h"
#include "cli/train.h"
#include "models/llama3/family.h"
#include "tests/check.h"

/* what the hooks saw, in order */
static char trace[4096];
static void note(const char *s) {
    strncat(trace, s, sizeof trace - strlen(trace) - 1);
    strncat(trace, " ", sizeof trace - strlen(trace) - 1);
}

typedef struct {
    const char *who;
    int float8_linears, default_linears;
    double w_before; /* a weight element at pre_optimizer, to see post_optimizer after the update */
    int changed_steps, pre_calls, parallelized;
} rec;
static rec recs[2] = {{"before", 0, 0, 0.0, 0, 0, 0}, {"after", 0, 0, 0.0, 0, 0, 0}};
static int destroyed;

static int rec_convert(int which, void **state, model_stage *stage, const converter_env *env, char *err, size_t n) {
    (void)err;
    (void)n;
    rec *r = &recs[which];
    const llama3_model *m = llama3_stage_model(stage);
    CHECK(m != NULL, "%s: the stage is a Llama model", r->who);
    for (int i = 0; i < m->n_params; i++) {
        if (!m->is_linear[i]) continue;
        if (!strcmp(m->linears[i].impl->name, "float8")) r->float8_linears++;
        else r->default_linears++;
    }
    CHECK(env->max_rows > 0 && env->cfg && env->ops, "%s: converter_env filled", r->who);
    *state = r;
    note(which ? "convert:after" : "convert:before");
    return 0;
}
static int conv_before(void **s, model_stage *m, const converter_env *e, char *err, size_t n) {
    return rec_convert(0, s, m, e, err, n);
}
static int conv_after(void **s, model_stage *m, const converter_env *e, char *err, size_t n) {
    return rec_convert(1, s, m, e, err, n);
}
static void rec_pre(void *state, model_stage *m, fsdp *fs) {
    (void)m;
    rec *r = state;
    CHECK(fsdp_grad(fs) && fsdp_master(fs), "%s: shards at pre_optimizer", r->who);
    r->w_before = fsdp_master(fs)[0];
    r->pre_calls++;
    note(r == &recs[0] ? "pre:before" : "pre:after");
}
static void rec_post(void *state, model_stage *m, fsdp *fs) {
    (void)m;
    rec *r = state;
    if (r->pre_calls && fsdp_master(fs)[0] != r->w_before) r->changed_steps++;
    note(r == &recs[0] ? "post:before" : "post:after");
}
static int rec_parallelized(void *state, model_stage *m, fsdp *fs, char *err, size_t n) {
    (void)m;
    (void)err;
    (void)n;
    rec *r = state;
    CHECK(fs && fsdp_local_numel(fs) > 0, "%s: FSDP exists at parallelized", r->who);
    r->parallelized++;
    note(r == &recs[0] ? "parallelized:before" : "parallelized:after");
    return 0;
}
static void rec_destroy(void *state) {
    (void)state;
    destroyed++;
}

static const tetra_converter before = {"record_before", conv_before, rec_parallelized, rec_pre,
                                       rec_post,        NULL,        rec_destroy,      NULL};
static const tetra_converter after = {"record_after", conv_after, rec_parallelized, rec_pre,
                                      rec_post,       NULL,       rec_destroy,      NULL};

int main(void) {
    CHECK(converter_register(&before) == 0 && converter_register(&after) == 0, "register");
    CHECK(converter_register(&after) != 0, "a name is registered once");
    CHECK(converter_find("float8") != NULL, "float8 is built in");

    /* the config refuses an unknown name, naming every registered converter, and a duplicate */
    tetra_config c;
    char err[1024];
    tetra_job job;
    cfg_init(&c);
    CHECK(cfg_set_string(&c, "model.converters", "float8,int4", err, sizeof err) == 0, "set: %s", err);
    CHECK(job_resolve(&c, 1, &job, err, sizeof err) != 0 && strstr(err, "\"int4\"") && strstr(err, "record_before") &&
              strstr(err, "float8"),
          "unknown converter refused: %s", err);
    cfg_free(&c);
    cfg_init(&c);
    CHECK(cfg_set_string(&c, "model.converters", "float8,float8", err, sizeof err) == 0, "set: %s", err);
    CHECK(job_resolve(&c, 1, &job, err, sizeof err) != 0 && strstr(err, "twice"), "duplicate refused: %s", err);
    cfg_free(&c);

    const char *tmp = getenv("TMPDIR");
    char dump[512];
    snprintf(dump, sizeof dump, "%s/tetra_test_converter_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dump)) {
        perror("mkdtemp");
        return 1;
    }
    char *argv[] = {"train",
                    "--job.config_file",
                    "configs/debug_model.toml",
                    "--job.dump_folder",
                    dump,
                    "--training.steps",
                    "3",
                    "--training.seq_len",
                    "64",
                    "--training.local_batch_size",
                    "2",
                    "--model.n_layers",
                    "2",
                    "--training.device",
                    "cpu",
                    "--metrics.log_freq",
                    "1",
                    "--model.converters",
                    "record_before,float8,record_after",
                    NULL};
    int argc = (int)(sizeof argv / sizeof argv[0]) - 1;
    int rc = train_main(argc, argv);
    CHECK(rc == 0, "training with the converters exited %d", rc);

    const int linears = 2 * 7 + 1;
    CHECK(recs[0].default_linears == linears && recs[0].float8_linears == 0,
          "the first converter sees the default linears (%d default, %d float8)", recs[0].default_linears,
          recs[0].float8_linears);
    CHECK(recs[1].float8_linears == linears - 1 && recs[1].default_linears == 1,
          "the last sees float8 on all but the output (%d float8, %d default)", recs[1].float8_linears,
          recs[1].default_linears);
    const char *want = "convert:before convert:after parallelized:before parallelized:after "
                       "post:before post:after "
                       "pre:before pre:after post:before post:after "
                       "pre:before pre:after post:before post:after "
                       "pre:before pre:after post:before post:after ";
    CHECK(!strcmp(trace, want), "hook order:\n  got  %s\n  want %s", trace, want);
    CHECK(recs[0].changed_steps == 3 && recs[1].changed_steps == 3,
          "post_optimizer runs after the update (%d, %d of 3 steps saw new weights)", recs[0].changed_steps,
          recs[1].changed_steps);
    CHECK(destroyed == 2, "destroy once per converter (%d)", destroyed);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dump);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dump);
    if (failures) {
        fprintf(stderr, "test_converter: %d failures\n", failures);
        return 1;
    }
    printf("test_converter: ok\n");
    return 0;
}
