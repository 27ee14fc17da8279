/* Config schema: defaults, TOML loading, CLI precedence, errors with
 * file:line and suggestions, cross-key rules, print_config round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        checks++;                                                         \
        if (!(cond)) {                                                    \
            failures++;                                                   \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                 \
            fputc('\n', stderr);                                          \
        }                                                                 \
    } while (0)

static int load(tetra_config *c, const char *text, char *err, size_t n) {
    return cfg_load_string(c, "t.toml", text, strlen(text), err, n);
}

static void test_defaults(void) {
    tetra_config c;
    cfg_init(&c);
    CHECK(c.v.training.seq_len == 2048, "%lld", (long long)c.v.training.seq_len);
    CHECK(c.v.training.local_batch_size == 8, "lbs");
    CHECK(c.v.optimizer.lr == 8e-4, "lr %g", c.v.optimizer.lr);
    CHECK(c.v.optimizer.beta2 == 0.95, "beta2");
    CHECK(c.v.optimizer.weight_decay == 0.1, "wd");
    CHECK(c.v.lr_scheduler.warmup_steps == 200, "warmup");
    CHECK(isnan(c.v.lr_scheduler.decay_ratio), "decay_ratio unset by default");
    CHECK(c.v.parallelism.data_parallel_shard_degree == -1, "shard -1");
    CHECK(!strcmp(c.v.parallelism.pipeline_parallel_schedule, "1F1B"), "schedule");
    CHECK(!strcmp(c.v.activation_checkpoint.selective_ac_option, "2"), "sac");
    CHECK(c.v.compile.components.n == 2 && !strcmp(c.v.compile.components.items[1], "loss"), "components");
    CHECK(c.v.model.converters.n == 0, "converters empty");
    CHECK(c.v.checkpoint.keep_latest_k == 10, "keep");
    CHECK(c.v.comm.train_timeout_seconds == 100, "timeout");
    CHECK(c.v.job.config_file == NULL, "config_file unset");
    cfg_free(&c);
}

static void test_toml_and_cli(void) {
    tetra_config c;
    char err[1024];
    cfg_init(&c);
    const char *doc = "[training]\nseq_len = 512\nmax_norm = 2\n"
                      "[quantize.linear.float8]\nfilter_fqns = [\"output\", \"layers.0\"]\n"
                      "[model]\nconverters = [\"float8\"]\n";
    CHECK(load(&c, doc, err, sizeof err) == 0, "%s", err);
    CHECK(c.v.training.seq_len == 512, "seq_len");
    CHECK(c.v.training.max_norm == 2.0, "int accepted for float");
    CHECK(c.v.quantize_linear_float8.filter_fqns.n == 2, "list");
    char buf[256];
    CHECK(!strcmp(cfg_origin_str(&c, "training", "seq_len", buf, sizeof buf), "t.toml:2"), "%s", buf);

    /* CLI overrides the file, in every syntax */
    char *argv[] = {"train", "--training.seq_len", "256", "--optimizer.lr=0.001", "--metrics.enable_tensorboard",
                    "--checkpoint.no_enable", "--model.converters", "float8", "--compile.components=model"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    CHECK(cfg_parse_args(&c, argc, argv, stdout, err, sizeof err) == 0, "%s", err);
    CHECK(c.v.training.seq_len == 256, "cli int");
    CHECK(c.v.optimizer.lr == 0.001, "cli float");
    CHECK(c.v.metrics.enable_tensorboard == 1, "flag");
    CHECK(c.v.checkpoint.enable == 0, "no_flag");
    CHECK(c.v.compile.components.n == 1, "cli list");
    CHECK(!strcmp(cfg_origin_str(&c, "training", "seq_len", buf, sizeof buf), "command line"), "%s", buf);
    char *argv2[] = {"train", "--metrics.enable_tensorboard=false"};
    CHECK(cfg_parse_args(&c, 2, argv2, stdout, err, sizeof err) == 0, "%s", err);
    CHECK(c.v.metrics.enable_tensorboard == 0, "flag=false");
    cfg_free(&c);
}

static void expect_load_error(const char *doc, const char *needle1, const char *needle2) {
    tetra_config c;
    char err[1024] = "";
    cfg_init(&c);
    int rc = load(&c, doc, err, sizeof err);
    CHECK(rc != 0, "document should be rejected: %s", doc);
    CHECK(strstr(err, needle1) != NULL, "error '%s' lacks '%s'", err, needle1);
    if (needle2) CHECK(strstr(err, needle2) != NULL, "error '%s' lacks '%s'", err, needle2);
    cfg_free(&c);
}

static void test_errors(void) {
    expect_load_error("[training]\nsequence_len = 4\n", "t.toml:2", "did you mean training.seq_len");
    /* TorchTitan's paper-era key moved sections: point to the new home */
    expect_load_error("[training]\nwarmup_steps = 4\n", "t.toml:2", "lr_scheduler.warmup_steps");
    expect_load_error("\n\n[trainig]\nsteps = 4\n", "t.toml:3", "did you mean [training]");
    expect_load_error("[training]\nseq_len = \"2048\"\n", "t.toml:2", "expects an integer, got string");
    expect_load_error("[optimizer]\nlr = true\n", "expects a number", NULL);
    expect_load_error("[parallelism]\npipeline_parallel_schedule = \"ZBV\"\n", "must be one of", "t.toml:2");
    expect_load_error("[model]\nconverters = [1]\n", "array of strings", NULL);
    expect_load_error("[training]\nsteps = 1\nsteps = 2\n", "t.toml:3", NULL); /* TOML duplicate key */
    expect_load_error("steps = 1\n", "inside a section", "training.steps");
    expect_load_error("[quantize.linear.float9]\nemulate = true\n", "unknown section", "quantize.linear.float8");

    tetra_config c;
    char err[1024];
    cfg_init(&c);
    char *argv[] = {"train", "--training.seqlen", "4"};
    CHECK(cfg_parse_args(&c, 3, argv, stdout, err, sizeof err) == -1, "unknown cli");
    CHECK(strstr(err, "--training.seq_len") != NULL, "%s", err);
    char *argv2[] = {"train", "--training.steps", "ten"};
    CHECK(cfg_parse_args(&c, 3, argv2, stdout, err, sizeof err) == -1, "bad int");
    CHECK(strstr(err, "expects an integer") != NULL, "%s", err);
    char *argv3[] = {"train", "--training.steps"};
    CHECK(cfg_parse_args(&c, 2, argv3, stdout, err, sizeof err) == -1, "missing value");
    char *argv4[] = {"train", "--job.config_file", "/nonexistent/x.toml"};
    CHECK(cfg_parse_args(&c, 3, argv4, stdout, err, sizeof err) == -1, "missing file");
    CHECK(strstr(err, "/nonexistent/x.toml") != NULL, "%s", err);
    cfg_free(&c);
}

static void expect_validate(const char *doc, int world, int ok, const char *needle) {
    tetra_config c;
    char err[1024] = "";
    cfg_init(&c);
    CHECK(load(&c, doc, err, sizeof err) == 0, "%s", err);
    cfg_parallel_dims d;
    int rc = cfg_validate(&c, world, &d, err, sizeof err);
    CHECK((rc == 0) == ok, "validate(%s, world %d) rc %d: %s", doc, world, rc, err);
    if (needle) CHECK(strstr(err, needle) != NULL, "error '%s' lacks '%s'", err, needle);
    cfg_free(&c);
}

static void test_validate(void) {
    tetra_config c;
    char err[1024];
    cfg_parallel_dims d;
    cfg_init(&c);
    CHECK(load(&c, "[parallelism]\ntensor_parallel_degree = 2\ndata_parallel_replicate_degree = 2\n", err,
               sizeof err) == 0, "%s", err);
    CHECK(cfg_validate(&c, 8, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.dp_shard == 2 && d.tp == 2 && d.dp_replicate == 2 && d.dp == 4, "shard -1 takes the rest: %d", d.dp_shard);
    CHECK(d.grad_accum_steps == 1 && d.global_batch_size == 32, "gbs %lld", (long long)d.global_batch_size);
    cfg_free(&c);

    expect_validate("[parallelism]\ntensor_parallel_degree = 3\n", 4, 0, "not divisible");
    expect_validate("[parallelism]\ndata_parallel_shard_degree = 2\n", 4, 0, "world size is 4");
    expect_validate("[parallelism]\ncontext_parallel_degree = 2\n[training]\nseq_len = 102\n", 2, 0,
                    "divisible by 2 x context_parallel_degree");
    expect_validate("[parallelism]\ntensor_parallel_degree = 3\n[model]\nflavor = \"8B\"\n", 3, 0, "n_kv_heads");
    expect_validate("[training]\nglobal_batch_size = 12\nlocal_batch_size = 8\n", 1, 0, "multiple of");
    expect_validate("[training]\nglobal_batch_size = 32\nlocal_batch_size = 8\n", 2, 1, NULL);
    expect_validate("[checkpoint]\nkeep_latest_k = 1\n", 1, 0, "keep_latest_k");
    expect_validate("[model]\nflavor = \"7B\"\n", 1, 0, "flavor");
    expect_validate("[model]\nconverters = [\"int4\"]\n", 1, 0, "unknown converter");
    expect_validate("[activation_checkpoint]\nselective_ac_option = \"every\"\n", 1, 0, "selective_ac_option");
    expect_validate("[lr_scheduler]\ndecay_ratio = 1.5\n", 1, 0, "t.toml:2");

    cfg_init(&c);
    CHECK(load(&c, "[training]\nglobal_batch_size = 64\n", err, sizeof err) == 0, "%s", err);
    CHECK(cfg_validate(&c, 4, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.grad_accum_steps == 2, "accumulation %d", d.grad_accum_steps);
    cfg_free(&c);
}

static void test_print_roundtrip(void) {
    tetra_config a, b;
    char err[1024];
    cfg_init(&a);
    CHECK(load(&a, "[job]\ndescription = \"quote \\\" and \\\\ tab\\t\"\n[lr_scheduler]\ndecay_ratio = 0.8\n"
                   "[optimizer]\nlr = 3e-4\n[quantize.linear.float8]\nfilter_fqns = [\"output\"]\n",
               err, sizeof err) == 0, "%s", err);
    char *t1 = NULL, *t2 = NULL;
    size_t n1 = 0, n2 = 0;
    FILE *f = open_memstream(&t1, &n1);
    cfg_print_toml(&a, f);
    fclose(f);
    cfg_init(&b);
    CHECK(cfg_load_string(&b, "printed", t1, n1, err, sizeof err) == 0, "printed config must parse: %s", err);
    f = open_memstream(&t2, &n2);
    cfg_print_toml(&b, f);
    fclose(f);
    /* identical apart from the header line naming the source */
    const char *s1 = strchr(t1, '\n'), *s2 = strchr(t2, '\n');
    CHECK(s1 && s2 && !strcmp(s1, s2), "round trip differs:\n%s\n---\n%s", t1, t2);
    CHECK(b.v.optimizer.lr == 3e-4 && b.v.lr_scheduler.decay_ratio == 0.8, "values survive");
    CHECK(!strcmp(b.v.job.description, "quote \" and \\ tab\t"), "string escapes survive: %s", b.v.job.description);
    free(t1);
    free(t2);

    /* --help lists every key */
    char *h = NULL;
    size_t hn = 0;
    f = open_memstream(&h, &hn);
    cfg_print_help(f);
    fclose(f);
    for (int i = 0; i < cfg_n_keys; i++) {
        char opt[256];
        snprintf(opt, sizeof opt, "--%s.%s ", cfg_keys[i].section, cfg_keys[i].key);
        CHECK(strstr(h, opt) != NULL, "help lacks %s", opt);
    }
    free(h);
    cfg_free(&a);
    cfg_free(&b);
}

static void test_shipped_configs(void) {
    const char *files[] = {"configs/debug_model.toml", "configs/llama3_8b.toml", "configs/llama3_70b.toml",
                           "configs/llama3_405b.toml"};
    const int worlds[] = {1, 8, 8, 8};
    for (int i = 0; i < 4; i++) {
        tetra_config c;
        char err[1024];
        cfg_init(&c);
        CHECK(cfg_load_file(&c, files[i], err, sizeof err) == 0, "%s", err);
        cfg_parallel_dims d;
        CHECK(cfg_validate(&c, worlds[i], &d, err, sizeof err) == 0, "%s: %s", files[i], err);
        cfg_free(&c);
    }
    tetra_config c;
    char err[1024];
    cfg_init(&c);
    CHECK(cfg_load_file(&c, "configs/llama3_405b.toml", err, sizeof err) == 0, "%s", err);
    CHECK(c.v.optimizer.lr == 8e-5 && c.v.lr_scheduler.warmup_steps == 600 && c.v.training.steps == 3000,
          "405B preset values");
    CHECK(c.v.model.converters.n == 1 && c.v.quantize_linear_float8.enable_fsdp_float8_all_gather, "405B float8");
    cfg_free(&c);
}

int main(void) {
    test_defaults();
    test_toml_and_cli();
    test_errors();
    test_validate();
    test_print_roundtrip();
    test_shipped_configs();
    printf("test_config: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
