/* The schedule IR (parallel/pp/schedule.h): action strings both ways, the
 * degenerate gradient-accumulation schedule, the validator's rules with the
 * rank, action and rule named, peak in-flight counts, and the runtime's
 * dispatch (which stage/microbatch each callback sees, and the "last backward"
 * flag FSDP reduces on). */
#include <stdio.h>
#include <string.h>

#include "parallel/pp/runtime.h"
#include "parallel/pp/schedule.h"

static int failures = 0, checks = 0;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        checks++;                                                           \
        if (!(cond)) {                                                      \
            failures++;                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

static void test_strings(void) {
    const char *good[] = {"0F0", "3I12", "1W7", "2B0", "0UNSHARD", "5RESHARD", "1REDUCE_GRAD", "10F100"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        pp_action a;
        char buf[48];
        CHECK(pp_action_parse(good[i], &a) == 0, "%s parses", good[i]);
        CHECK(!strcmp(pp_action_str(&a, buf, sizeof buf), good[i]), "%s prints back as %s", good[i], buf);
    }
    const char *bad[] = {"", "F0", "0F", "0X1", "0UNSHARD3", "-1F0", "0F1x", "0 F1", "0W"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pp_action a;
        CHECK(pp_action_parse(bad[i], &a) != 0, "'%s' is refused", bad[i]);
    }
}

static pp_schedule *from_strings(int ranks, int stages, int m, const char *const *rows[]) {
    pp_schedule *s = pp_schedule_new(ranks, stages, m);
    for (int r = 0; r < ranks; r++)
        for (int i = 0; rows[r][i]; i++) {
            pp_action a;
            if (pp_action_parse(rows[r][i], &a)) return NULL;
            pp_schedule_push(s, r, a.type, a.stage, a.mb);
        }
    return s;
}

static void expect_invalid(const char *what, int ranks, int stages, int m, const char *const *rows[],
                           const char *want) {
    char err[256] = "";
    pp_schedule *s = from_strings(ranks, stages, m, rows);
    CHECK(s && pp_schedule_validate(s, err, sizeof err) != 0 && strstr(err, want), "%s: got '%s', want '%s'", what,
          err, want);
    pp_schedule_free(s);
}

static void test_validate(void) {
    char err[256];
    pp_schedule *acc = pp_schedule_accumulate(4);
    CHECK(acc && acc->len[0] == 8 && pp_schedule_validate(acc, err, sizeof err) == 0, "accumulate(4): %s", err);
    CHECK(pp_schedule_max_in_flight(acc) == 1 && pp_schedule_max_deferred_w(acc) == 0, "one microbatch at a time");
    pp_schedule_free(acc);

    /* GPipe-like on one rank (all F, then I, then W): four in flight, four W deferred */
    static const char *const gp[] = {"0F0", "0F1", "0F2", "0F3", "0I3", "0I2", "0I1", "0I0",
                                     "0W3", "0W2", "0W1", "0W0", NULL};
    const char *const *rows1[] = {gp};
    pp_schedule *g = from_strings(1, 1, 4, rows1);
    CHECK(g && pp_schedule_validate(g, err, sizeof err) == 0, "split I/W schedule: %s", err);
    CHECK(pp_schedule_max_in_flight(g) == 4 && pp_schedule_max_deferred_w(g) == 4, "peaks %d %d",
          pp_schedule_max_in_flight(g), pp_schedule_max_deferred_w(g));
    pp_schedule_free(g);

    static const char *const r0[] = {"0F0", "0B0", "0F1", "0B1", NULL};
    static const char *const b_before_f[] = {"0B0", "0F0", NULL};
    static const char *const w_before_i[] = {"0F0", "0W0", "0I0", NULL};
    static const char *const twice[] = {"0F0", "0F0", "0B0", NULL};
    static const char *const no_w[] = {"0F0", "0I0", NULL};
    static const char *const two_bw[] = {"0F0", "0B0", "0I0", "0W0", NULL};
    static const char *const stage1[] = {"1F0", "1B0", NULL};
    static const char *const stage0[] = {"0F0", "0B0", NULL};
    const char *const *a1[] = {b_before_f};
    expect_invalid("B before F", 1, 1, 1, a1, "rank 0, action 0 (0B0): backward before the forward");
    const char *const *a2[] = {w_before_i};
    expect_invalid("W before I", 1, 1, 1, a2, "action 1 (0W0): backward-weight before backward-input");
    const char *const *a3[] = {twice};
    expect_invalid("two F", 1, 1, 1, a3, "action 1 (0F0): a second forward");
    const char *const *a4[] = {no_w};
    expect_invalid("missing W", 1, 1, 1, a4, "stage 0 microbatch 0 has no backward-weight");
    const char *const *a5[] = {two_bw};
    expect_invalid("B and I", 1, 1, 1, a5, "a second backward");
    const char *const *a6[] = {r0};
    expect_invalid("missing microbatch", 1, 1, 3, a6, "stage 0 microbatch 2 has no forward");
    const char *const *a7[] = {stage0, stage0};
    expect_invalid("stage on two ranks", 2, 1, 1, a7, "rank 1, action 0 (0F0): stage 0 already runs on rank 0");
    const char *const *a8[] = {stage1};
    expect_invalid("stage out of range", 1, 1, 1, a8, "stage 1 outside 0..0");
    const char *const *a9[] = {stage0, stage1};
    char e2[256];
    pp_schedule *two = from_strings(2, 2, 1, a9);
    CHECK(two && pp_schedule_validate(two, e2, sizeof e2) == 0, "two stages on two ranks: %s", e2);
    pp_schedule_free(two);
}

typedef struct {
    char log[512];
} trace;

static void add(trace *t, const char *s) { strncat(t->log, s, sizeof t->log - strlen(t->log) - 1); }
static void t_f(void *u, int s, int m) {
    char b[32];
    snprintf(b, sizeof b, "F%d.%d ", s, m);
    add(u, b);
}
static void t_i(void *u, int s, int m) {
    char b[32];
    snprintf(b, sizeof b, "I%d.%d ", s, m);
    add(u, b);
}
static void t_w(void *u, int s, int m, int last) {
    char b[32];
    snprintf(b, sizeof b, "W%d.%d%s ", s, m, last ? "!" : "");
    add(u, b);
}
static void t_b(void *u, int s, int m, int last) {
    char b[32];
    snprintf(b, sizeof b, "B%d.%d%s ", s, m, last ? "!" : "");
    add(u, b);
}
static void t_stage(void *u, int s) {
    char b[32];
    snprintf(b, sizeof b, "S%d ", s);
    add(u, b);
}

static void test_runtime(void) {
    static const char *const row[] = {"0UNSHARD", "0F0", "0F1", "0I1", "0B0", "0W1", "0REDUCE_GRAD", "0RESHARD", NULL};
    const char *const *rows[] = {row};
    pp_schedule *s = from_strings(1, 1, 2, rows);
    trace tr;
    memset(&tr, 0, sizeof tr);
    pp_stage_ops o = {&tr, t_f, t_i, t_w, t_b, t_stage, t_stage, t_stage};
    char err[256];
    CHECK(pp_run_rank(s, 0, &o, err, sizeof err) == 0, "%s", err);
    CHECK(!strcmp(tr.log, "S0 F0.0 F0.1 I0.1 B0.0 W0.1! S0 S0 "), "dispatch: %s", tr.log);
    o.reduce_grad = NULL;
    CHECK(pp_run_rank(s, 0, &o, err, sizeof err) != 0 && strstr(err, "action 6 (0REDUCE_GRAD)"),
          "an action without a handler is named: %s", err);
    CHECK(pp_run_rank(s, 3, &o, err, sizeof err) != 0 && strstr(err, "rank 3"), "unknown rank: %s", err);
    pp_schedule_free(s);
}

int main(void) {
    test_strings();
    test_validate();
    test_runtime();
    printf("test_pp_schedule: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
