/* test_model_family.c — the trainer runs a model only through its family's table
 * (models/model.h): a family defined here, outside models/ and the engine, registered as
 * "probe", is trained by a real run (debug model, sample corpus, 3 steps, 2 microbatches
 * a step) named by model.name alone:
 *   - every pass of the step reaches the probe's table: per step and microbatch, the
 *     forward of each unit in order, the I pass of every unit but the input one and the
 *     W pass of every unit, in reverse order;
 *   - the probe delegates the arithmetic to Llama's table, so its losses and gradient
 *     norms are the same bits as the same run with model.name = "llama3";
 *   - each run is a child process (a process initialises MPI once);
 *   - an unknown model.name is refused naming the registered families; a name is
 *     registered once; `tetra plan` refuses a family its cost model does not know.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/train.h"
#include "config/config.h"
#include "engine/job.h"
#include "models/llama3/family.h"
#include "models/model.h"
#include "plan/internal.h"
#include "tests/check.h"

static model_family probe;
static int n_built, n_forward, n_input, n_weight, order_ok = 1;
static int last_forward = -1; /* the unit the last forward ran, -1 before a microbatch */

static int probe_parallelize(model_stage *s, const model_args *a, int stage, int n_stages, int start, int end,
                             const model_parallel_env *env, char *err, size_t errlen) {
    const int rc = llama3_family.parallelize(s, a, stage, n_stages, start, end, env, err, errlen);
    if (rc == 0) {
        s->family = &probe; /* the trainer now reaches the stage through this table */
        n_built++;
    }
    return rc;
}

static double probe_forward(model_stage *s, model_acts *a, int unit, const int32_t *tokens, const model_loss_io *loss) {
    if (unit != (last_forward + 1) % s->n_units) order_ok = 0;
    last_forward = unit;
    n_forward++;
    return llama3_family.forward(s, a, unit, tokens, loss);
}

static void probe_backward_input(model_stage *s, model_acts *a, int unit) {
    if (unit == model_input_unit(s)) order_ok = 0; /* the trainer skips the input unit's I pass */
    n_input++;
    llama3_family.backward_input(s, a, unit);
}

static void probe_backward_weight(model_stage *s, model_acts *a, int unit) {
    n_weight++;
    llama3_family.backward_weight(s, a, unit);
}

/* metrics.jsonl's "loss" and "grad_norm" of every step, as written */
static int read_metrics(const char *dir, char *out, size_t n) {
    char path[600], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t o = 0;
    out[0] = 0;
    while (fgets(line, sizeof line, f)) {
        const char *keys[] = {"\"loss\":", "\"grad_norm\":"};
        for (int k = 0; k < 2; k++) {
            const char *p = strstr(line, keys[k]);
            const int len = p ? (int)strcspn(p, ",}") : 0;
            const int w = p && o < n ? snprintf(out + o, n - o, "%.*s ", len, p) : 0;
            if (w > 0) o += (size_t)w;
        }
    }
    fclose(f);
    return 0;
}

static int train(const char *name, const char *dump) {
    char *argv[] = {"train",
                    "--job.config_file",
                    "configs/debug_model.toml",
                    "--job.dump_folder",
                    (char *)dump,
                    "--model.name",
                    (char *)name,
                    "--training.steps",
                    "3",
                    "--training.seq_len",
                    "64",
                    "--training.local_batch_size",
                    "2",
                    "--training.global_batch_size",
                    "4",
                    "--model.n_layers",
                    "2",
                    "--training.device",
                    "cpu",
                    "--metrics.log_freq",
                    "1",
                    NULL};
    return train_main((int)(sizeof argv / sizeof argv[0]) - 1, argv);
}

/* The probe's run: every pass reached its table. */
static void check_probe_counts(void) {
    /* 3 steps x 2 microbatches (no warm-up microbatch on the CPU); units: the embedding,
     * 2 blocks, the head */
    const int units = 4, mbs = 3 * 2;
    CHECK(n_built == 1, "one stage built through the probe's parallelize (%d)", n_built);
    CHECK(n_forward == mbs * units, "forward of every unit of every microbatch (%d, want %d)", n_forward, mbs * units);
    CHECK(n_input == mbs * (units - 1), "the I pass of every unit but the input one (%d, want %d)", n_input,
          mbs * (units - 1));
    CHECK(n_weight == mbs * units, "the W pass of every unit (%d, want %d)", n_weight, mbs * units);
    CHECK(order_ok, "forward in unit order, no I pass of the input unit");
    printf("the probe's table ran %d forwards, %d I passes, %d W passes\n", n_forward, n_input, n_weight);
}

/* A training run of model.name in a child process (the llama3 run must not reach the
 * probe): 0 when it trained and its checks passed. */
static int run_child(const char *name, const char *dump) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        const int rc = train(name, dump);
        CHECK(rc == 0, "training %s exited %d", name, rc);
        if (!strcmp(name, "probe")) check_probe_counts();
        else CHECK(n_forward == 0 && n_built == 0, "model.name = %s does not reach the probe", name);
        fflush(NULL);
        _exit(failures ? 1 : 0);
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    probe = llama3_family;
    probe.name = "probe";
    probe.parallelize = probe_parallelize;
    probe.forward = probe_forward;
    probe.backward_input = probe_backward_input;
    probe.backward_weight = probe_backward_weight;
    CHECK(model_family_register(&probe) == 0, "register the probe family");
    CHECK(model_family_register(&probe) != 0, "a name is registered once");
    CHECK(model_family_find("probe") == &probe && model_family_find("llama3") == &llama3_family, "find by name");

    tetra_config c;
    tetra_job job;
    char err[1024];
    cfg_init(&c);
    CHECK(cfg_set_string(&c, "model.name", "gpt2", err, sizeof err) == 0, "set: %s", err);
    CHECK(job_resolve(&c, 1, &job, err, sizeof err) != 0 && strstr(err, "\"gpt2\"") && strstr(err, "llama3") &&
              strstr(err, "probe"),
          "an unknown model.name is refused naming the families: %s", err);
    cfg_free(&c);
    cfg_init(&c);
    CHECK(cfg_set_string(&c, "model.name", "probe", err, sizeof err) == 0, "set: %s", err);
    CHECK(job_resolve(&c, 1, &job, err, sizeof err) == 0 && job.model.family == &probe, "model.name picks the probe");
    CHECK(plan_check_llama(&job, err, sizeof err) != 0 && strstr(err, "\"probe\""),
          "tetra plan refuses a family its cost model does not know: %s", err);
    cfg_free(&c);

    const char *tmp = getenv("TMPDIR");
    char base[512], dump_probe[600], dump_llama[600];
    snprintf(base, sizeof base, "%s/tetra_test_model_family_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(dump_probe, sizeof dump_probe, "%s/probe", base);
    snprintf(dump_llama, sizeof dump_llama, "%s/llama3", base);
    CHECK(run_child("probe", dump_probe) == 0, "the probe family's run");
    CHECK(run_child("llama3", dump_llama) == 0, "the llama3 run");
    static char m_probe[8192], m_llama[8192];
    CHECK(read_metrics(dump_probe, m_probe, sizeof m_probe) == 0 &&
              read_metrics(dump_llama, m_llama, sizeof m_llama) == 0,
          "both runs wrote metrics.jsonl");
    CHECK(strstr(m_probe, "\"loss\":") && !strcmp(m_probe, m_llama),
          "the probe's losses and gradient norms are llama3's bits:\n  probe  %s\n  llama3 %s", m_probe, m_llama);

    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", base);
    if (failures) {
        fprintf(stderr, "test_model_family: %d failures\n", failures);
        return 1;
    }
    printf("test_model_family: ok\n");
    return 0;
}
