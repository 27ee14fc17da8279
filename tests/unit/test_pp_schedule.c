/* The schedule IR (parallel/pp/schedule.h) and its producers: action strings both
 * ways (OVERLAP_F_B and idle slots included), the degenerate gradient-accumulation
 * schedule, the validator's rules with the rank, action and rule named, peak
 * in-flight counts; the generators, the lowering and the CSV form against
 * PyTorch's own output (tests/assets/pp_schedules, written by generate.py there
 * from torch.distributed.pipelining), cell by cell; CSV round trips and errors;
 * the lowered-schedule check (deadlock and message-order mismatches found, on
 * MPI's semantics and on NCCL's serialised streams); every generated schedule at
 * pp 2, 4 and 8, lowered as the trainer lowers it, finishing on both.
 *
 * TETRA_PP_SCHEDULES=DIR points the fixture part at another folder (e.g. the wide
 * grid of generate.py --wide). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "parallel/pp/csv.h"
#include "parallel/pp/generate.h"
#include "parallel/pp/lower.h"
#include "parallel/pp/schedule.h"
#include "tests/check.h"

static char tmpdir[64];

static void test_strings(void) {
    const char *good[] = {"0F0",
                          "3I12",
                          "1W7",
                          "2B0",
                          "0UNSHARD",
                          "5RESHARD",
                          "1REDUCE_GRAD",
                          "10F100",
                          "2WAIT_REDUCE_GRAD",
                          "3SEND_F1",
                          "4RECV_F0",
                          "1SEND_B9",
                          "0RECV_B2",
                          "7WAIT_SEND_F3",
                          "6WAIT_SEND_B0",
                          "(2F3;5B1)OVERLAP_F_B",
                          "(0F1)OVERLAP_F_B",
                          ""};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        pp_action a;
        char buf[48] = "x";
        CHECK(pp_action_parse(good[i], &a) == 0, "'%s' parses", good[i]);
        CHECK(!strcmp(pp_action_str(&a, buf, sizeof buf), good[i]), "%s prints back as %s", good[i], buf);
    }
    pp_action a;
    CHECK(pp_action_parse("(2F3;5B1)OVERLAP_F_B", &a) == 0 && a.type == PP_OVERLAP_F_B && a.n_sub == 2 &&
              a.stage == -1 && a.mb == -1 && a.sub[0].type == PP_F && a.sub[0].stage == 2 && a.sub[0].mb == 3 &&
              a.sub[1].type == PP_B && a.sub[1].stage == 5 && a.sub[1].mb == 1,
          "overlap parts");
    CHECK(pp_action_parse("  ", &a) == 0 && a.type == PP_IDLE && a.stage == -1, "blank cell is idle");
    CHECK(pp_action_parse(" 1W2\r", &a) == 0 && a.type == PP_W && a.stage == 1 && a.mb == 2, "blanks around");
    CHECK(pp_action_parse("( 2F3 ; 5B1 )OVERLAP_F_B", &a) == 0 && a.n_sub == 2, "blanks inside an overlap");
    CHECK(pp_action_parse("3WAIT_SEND_F1", &a) == 0 && a.type == PP_WAIT_SEND_F, "WAIT_SEND_F is not W");
    CHECK(pp_action_parse("1REDUCE_GRAD", &a) == 0 && a.mb == -1 && a.type == PP_REDUCE_GRAD, "stage only");
    const char *bad[] = {"F0",
                         "0F",
                         "0X1",
                         "0UNSHARD3",
                         "-1F0",
                         "0F1x",
                         "0 F1",
                         "0W",
                         "0SEND_F",
                         "1WAIT_REDUCE_GRAD2",
                         "0OVERLAP_F_B",
                         "(2F3;5SEND_F1)OVERLAP_F_B",
                         "(2F3;5B1)B",
                         "(2F3;5B1",
                         "(2F3;5B1;1W0)OVERLAP_F_B",
                         "(2F3;)OVERLAP_F_B",
                         "()OVERLAP_F_B",
                         "0F1,0F2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(pp_action_parse(bad[i], &a) != 0, "'%s' is refused", bad[i]);
    CHECK(pp_action_is_compute(PP_OVERLAP_F_B) && pp_action_is_compute(PP_W) && !pp_action_is_compute(PP_SEND_F) &&
              !pp_action_is_compute(PP_IDLE),
          "compute kinds");
    CHECK(pp_action_is_comm(PP_WAIT_SEND_B) && !pp_action_is_comm(PP_REDUCE_GRAD) &&
              pp_action_stage_only(PP_WAIT_REDUCE_GRAD),
          "comm and stage-only kinds");
}

static pp_schedule *from_strings(int ranks, int stages, int m, const char *const *rows[]) {
    pp_schedule *s = pp_schedule_new(ranks, stages, m);
    for (int r = 0; r < ranks; r++)
        for (int i = 0; rows[r][i]; i++) {
            pp_action a;
            if (pp_action_parse(rows[r][i], &a)) {
                pp_schedule_free(s);
                return NULL;
            }
            pp_schedule_push_action(s, r, &a);
        }
    return s;
}

static void expect_invalid(const char *what, int ranks, int stages, int m, const char *const *rows[],
                           const char *want) {
    char err[256] = "";
    pp_schedule *s = from_strings(ranks, stages, m, rows);
    CHECK(s && pp_schedule_validate(s, err, sizeof err) != 0 && strstr(err, want), "%s: got '%s', want '%s'", what, err,
          want);
    pp_schedule_free(s);
}

static void test_validate(void) {
    char err[256];
    pp_schedule *acc = pp_schedule_accumulate(4);
    CHECK(acc && acc->len[0] == 8 && pp_schedule_validate(acc, err, sizeof err) == 0, "accumulate(4): %s", err);
    CHECK(pp_schedule_max_in_flight(acc) == 1 && pp_schedule_max_deferred_w(acc) == 0, "one microbatch at a time");
    CHECK(acc->stage_rank[0] == 0, "accumulate places stage 0");
    pp_schedule_free(acc);

    /* GPipe-like on one rank (all F, then I, then W): four in flight, four W deferred */
    static const char *const gp[] = {"0F0", "0F1", "0F2", "0F3", "0I3", "0I2", "0I1",
                                     "0I0", "0W3", "0W2", "0W1", "0W0", NULL};
    const char *const *rows1[] = {gp};
    pp_schedule *g = from_strings(1, 1, 4, rows1);
    CHECK(g && pp_schedule_validate(g, err, sizeof err) == 0, "split I/W schedule: %s", err);
    CHECK(pp_schedule_max_in_flight(g) == 4 && pp_schedule_max_deferred_w(g) == 4, "peaks %d %d",
          pp_schedule_max_in_flight(g), pp_schedule_max_deferred_w(g));
    pp_schedule_free(g);

    static const char *const r0[] = {"0F0", "0B0", "0F1", "0B1", NULL};
    static const char *const b_before_f[] = {"0B0", "0F0", NULL};
    static const char *const w_before_i[] = {"0F0", "0W0", "0I0", NULL};
    static const char *const w_after_b[] = {"0F0", "0B0", "0W0", NULL};
    static const char *const twice[] = {"0F0", "0F0", "0B0", NULL};
    static const char *const no_w[] = {"0F0", "0I0", NULL};
    static const char *const no_b[] = {"0F0", NULL};
    static const char *const two_bw[] = {"0F0", "0B0", "0I0", "0W0", NULL};
    static const char *const stage1[] = {"1F0", "1B0", NULL};
    static const char *const stage0[] = {"0F0", "0B0", NULL};
    static const char *const mb_out[] = {"0F0", "0B0", "0B1", NULL};
    const char *const *a1[] = {b_before_f};
    expect_invalid("B before F", 1, 1, 1, a1, "rank 0, action 0 (0B0): backward before the forward");
    const char *const *a2[] = {w_before_i};
    expect_invalid("W before I", 1, 1, 1, a2, "rank 0, action 1 (0W0): backward-weight before backward-input");
    const char *const *a2b[] = {w_after_b};
    expect_invalid("W after B", 1, 1, 1, a2b, "action 2 (0W0): backward-weight before backward-input");
    const char *const *a3[] = {twice};
    expect_invalid("two F", 1, 1, 1, a3, "action 1 (0F0): a second forward");
    const char *const *a4[] = {no_w};
    expect_invalid("missing W", 1, 1, 1, a4, "stage 0 microbatch 0 has no backward-weight");
    const char *const *a4b[] = {no_b};
    expect_invalid("missing backward", 1, 1, 1, a4b, "rank 0: stage 0 microbatch 0 has no backward");
    const char *const *a5[] = {two_bw};
    expect_invalid("B and I", 1, 1, 1, a5, "a second backward");
    const char *const *a6[] = {r0};
    expect_invalid("missing microbatch", 1, 1, 3, a6, "stage 0 microbatch 2 has no forward");
    const char *const *a7[] = {stage0, stage0};
    expect_invalid("stage on two ranks", 2, 1, 1, a7, "rank 1, action 0 (0F0): stage 0 already runs on rank 0");
    const char *const *a8[] = {stage1};
    expect_invalid("stage out of range", 1, 1, 1, a8, "stage 1 outside 0..0");
    const char *const *a8b[] = {mb_out};
    expect_invalid("B of a microbatch out of range", 1, 1, 1, a8b, "rank 0, action 2 (0B1): microbatch 1 outside 0..0");
    const char *const *a9[] = {stage0, stage1};
    char e2[256];
    pp_schedule *two = from_strings(2, 2, 1, a9);
    CHECK(two && pp_schedule_validate(two, e2, sizeof e2) == 0, "two stages on two ranks: %s", e2);
    CHECK(two && two->stage_rank[0] == 0 && two->stage_rank[1] == 1, "stage_rank filled");
    pp_schedule_free(two);

    /* overlapped parts are checked one by one; communication and FSDP actions only for their stage */
    static const char *const ov_ok[] = {"0F0", "", "(0F1;0B0)OVERLAP_F_B", "0UNSHARD", "0SEND_F1", "0B1", NULL};
    const char *const *b1[] = {ov_ok};
    pp_schedule *ov = from_strings(1, 1, 2, b1);
    CHECK(ov && pp_schedule_validate(ov, err, sizeof err) == 0, "overlap + comm actions: %s", err);
    CHECK(ov && pp_schedule_max_in_flight(ov) == 2 && pp_schedule_rank_in_flight(ov, 0, 0) == 2, "overlap's F counts");
    pp_schedule_free(ov);
    static const char *const ov_bad[] = {"(0F0;0B1)OVERLAP_F_B", "0F1", "0B0", NULL};
    const char *const *b2[] = {ov_bad};
    expect_invalid("overlap's B before its F", 1, 1, 2, b2,
                   "rank 0, action 0 ((0F0;0B1)OVERLAP_F_B): backward before the forward");
    static const char *const ov_twice[] = {"0F0", "0F1", "(0B0;0B0)OVERLAP_F_B", "0B1", NULL};
    const char *const *b2b[] = {ov_twice};
    expect_invalid("overlap's parts are checked in order", 1, 1, 2, b2b,
                   "action 2 ((0B0;0B0)OVERLAP_F_B): a second backward");
    static const char *const ov_bad2[] = {"0F0", "(1F0;0B0)OVERLAP_F_B", "1B0", NULL};
    static const char *const r1f[] = {"1F1", NULL};
    const char *const *b3[] = {ov_bad2, r1f};
    expect_invalid("overlap part on another rank's stage", 2, 2, 1, b3,
                   "rank 1, action 0 (1F1): stage 1 already runs on rank 0");
    static const char *const comm_out[] = {"0F0", "0B0", "3SEND_F0", NULL};
    const char *const *b4[] = {comm_out};
    expect_invalid("comm action stage out of range", 1, 1, 1, b4, "rank 0, action 2 (3SEND_F0): stage 3 outside 0..0");

    /* V rank: its two stages count separately */
    static const char *const vr[] = {"0F0", "1F0", "1B0", "0B0", NULL};
    const char *const *b5[] = {vr};
    pp_schedule *v = from_strings(1, 2, 1, b5);
    CHECK(v && pp_schedule_validate(v, err, sizeof err) == 0 && pp_schedule_max_in_flight(v) == 2 &&
              pp_schedule_rank_in_flight(v, 0, 1) == 1 && pp_schedule_rank_in_flight(v, 0, -1) == 2,
          "V rank in flight");
    pp_schedule_free(v);

    /* copy */
    pp_schedule *x = from_strings(1, 1, 2, b1), *c = x ? pp_schedule_copy(x) : NULL;
    int same = c && c->len[0] == x->len[0];
    for (int i = 0; same && i < x->len[0]; i++) {
        char p[64], q[64];
        same = !strcmp(pp_action_str(&x->acts[0][i], p, sizeof p), pp_action_str(&c->acts[0][i], q, sizeof q));
    }
    CHECK(same, "copy keeps every action");
    pp_schedule_free(x);
    pp_schedule_free(c);
}

/* ---- fixtures: PyTorch's orders -------------------------------------------------------- */

static int same_lists(const pp_schedule *a, const pp_schedule *b, char *why, size_t n) {
    if (a->n_ranks != b->n_ranks) {
        snprintf(why, n, "%d ranks vs %d", a->n_ranks, b->n_ranks);
        return 0;
    }
    for (int r = 0; r < a->n_ranks; r++) {
        int k = a->len[r] < b->len[r] ? a->len[r] : b->len[r];
        for (int i = 0; i < k; i++) {
            char p[64], q[64];
            pp_action_str(&a->acts[r][i], p, sizeof p);
            pp_action_str(&b->acts[r][i], q, sizeof q);
            if (strcmp(p, q)) {
                snprintf(why, n, "rank %d, cell %d: '%s' vs '%s'", r, i + 1, p, q);
                return 0;
            }
        }
        if (a->len[r] != b->len[r]) {
            snprintf(why, n, "rank %d: %d cells vs %d", r, a->len[r], b->len[r]);
            return 0;
        }
    }
    return 1;
}

static void round_trip(const char *what, const pp_schedule *s, int m, pp_csv_format want_fmt) {
    char path[128], err[512] = "", why[256] = "";
    snprintf(path, sizeof path, "%s/rt.csv", tmpdir);
    pp_csv_format fmt = (pp_csv_format)-1;
    int rc = pp_csv_dump(s, path, err, sizeof err);
    pp_schedule *back = rc ? NULL : pp_csv_load(path, s->n_ranks, m, &fmt, err, sizeof err);
    CHECK(back && fmt == want_fmt && same_lists(s, back, why, sizeof why), "%s: round trip: %s %s", what, err, why);
    pp_schedule_free(back);
}

/* A lowered schedule's lists without their FSDP actions (UNSHARD, RESHARD,
 * REDUCE_GRAD, WAIT_REDUCE_GRAD), as PyTorch's dry run knows them. */
static pp_schedule *without_fsdp(const pp_schedule *low) {
    pp_schedule *bare = pp_schedule_new(low->n_ranks, low->n_stages, low->n_microbatches);
    for (int r = 0; bare && r < low->n_ranks; r++)
        for (int i = 0; i < low->len[r]; i++)
            if (!pp_action_stage_only(low->acts[r][i].type)) pp_schedule_push_action(bare, r, &low->acts[r][i]);
    return bare;
}

static void test_fixtures(void) {
    const char *dir = getenv("TETRA_PP_SCHEDULES");
    if (!dir || !*dir) dir = "tests/assets/pp_schedules";
    char path[512], line[512];
    snprintf(path, sizeof path, "%s/MANIFEST", dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL, "cannot open %s (run from the repository root)", path);
    if (!f) return;
    int n = 0, n_refused = 0, n_bubbled = 0, n_simmed = 0, n_streams = 0, kinds_seen[PP_N_SCHEDULE_KINDS] = {0};
    long lowered_steps = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char kname[64], cfile[200], mfile[200], simcol[32];
        int p, v, m, bubbles;
        if (sscanf(line, "%63s %d %d %d %199s %199s %d %31s", kname, &p, &v, &m, cfile, mfile, &bubbles, simcol) != 8) {
            CHECK(0, "MANIFEST line '%s'", line);
            continue;
        }
        pp_schedule_kind k;
        CHECK(pp_schedule_kind_parse(kname, &k) == 0, "kind %s", kname);
        char err[1024] = "", why[256] = "", what[128];
        snprintf(what, sizeof what, "%s p=%d v=%d m=%d", kname, p, v, m);
        pp_schedule *gen = pp_schedule_generate(k, p, v, m, err, sizeof err);
        if (!strcmp(cfile, "-")) { /* PyTorch refuses it: so must we */
            CHECK(!gen && strstr(err, kname), "%s: PyTorch refuses it, we gave %s", what, gen ? "a schedule" : err);
            pp_schedule_free(gen);
            n_refused++;
            continue;
        }
        n++;
        kinds_seen[k]++;
        n_bubbled += bubbles > 0;
        CHECK(gen != NULL, "%s: %s", what, err);
        snprintf(path, sizeof path, "%s/%s", dir, cfile);
        pp_csv_format fmt = (pp_csv_format)-1;
        pp_schedule *want = pp_csv_load(path, p, m, &fmt, err, sizeof err);
        CHECK(want && fmt == PP_CSV_COMPUTE_ONLY, "%s: load %s: %s", what, cfile, err);
        if (gen && want) {
            CHECK(same_lists(gen, want, why, sizeof why), "%s: generated vs PyTorch: %s", what, why);
            CHECK(gen->n_stages == p * v && want->n_stages == p * v, "%s: %d stages", what, gen->n_stages);
            int ok = 1;
            for (int st = 0; st < p * v; st++)
                ok &= gen->stage_rank[st] == pp_stage_to_rank(k, p, p * v, st) &&
                    want->stage_rank[st] == gen->stage_rank[st];
            CHECK(ok, "%s: stage placement", what);
        }
        snprintf(path, sizeof path, "%s/%s", dir, mfile);
        pp_schedule *want_low = pp_csv_load(path, p, m, &fmt, err, sizeof err);
        CHECK(want_low && fmt == PP_CSV_COMPUTE_COMMS, "%s: load %s: %s", what, mfile, err);
        pp_schedule *low = gen ? pp_schedule_lower(gen, NULL, err, sizeof err) : NULL;
        CHECK(!gen || low, "%s: lower: %s", what, err);
        if (low && want_low) CHECK(same_lists(low, want_low, why, sizeof why), "%s: lowered vs PyTorch: %s", what, why);
        if (want_low) {
            int steps = -1, rounds = -1;
            CHECK(pp_schedule_check_lowered(want_low, &steps, err, sizeof err) == 0 && steps > 0,
                  "%s: PyTorch's lowered schedule fails the check: %s", what, err);
            CHECK(pp_schedule_check_lowered_in(want_low, PP_P2P_STREAMS, &rounds, err, sizeof err) == 0 && rounds > 0,
                  "%s: PyTorch's lowered schedule deadlocks on NCCL streams: %s", what, err);
            n_streams++;
            lowered_steps += steps;
            if (strcmp(simcol, "-")) { /* PyTorch's dry run, which knows no FSDP actions, over the lists without them */
                pp_schedule *bare = without_fsdp(want_low);
                int bsteps = -1;
                CHECK(bare && pp_schedule_check_lowered_in(bare, PP_P2P_MPI, &bsteps, err, sizeof err) == 0 &&
                          bsteps == atoi(simcol),
                      "%s: dry run without FSDP actions: %d steps, PyTorch's _simulate_comms_compute %s (%s)", what,
                      bsteps, simcol, err);
                CHECK(bare && pp_schedule_check_lowered_in(bare, PP_P2P_STREAMS, NULL, err, sizeof err) == 0,
                      "%s: without FSDP actions, deadlocks on NCCL streams: %s", what, err);
                pp_schedule_free(bare);
                n_simmed++;
            }
        }
        if (want) { /* the loaded compute-only CSV lowers the same way (how a CSV schedule runs) */
            pp_schedule *l2 = pp_schedule_lower(want, NULL, err, sizeof err);
            CHECK(l2 && want_low && same_lists(l2, want_low, why, sizeof why), "%s: lowering the CSV: %s %s", what, err,
                  why);
            pp_schedule_free(l2);
        }
        if (gen) round_trip(what, gen, m, PP_CSV_COMPUTE_ONLY);
        if (low) round_trip(what, low, m, PP_CSV_COMPUTE_COMMS);
        pp_schedule_free(gen);
        pp_schedule_free(want);
        pp_schedule_free(low);
        pp_schedule_free(want_low);
    }
    fclose(f);
    CHECK(n >= 1, "no fixtures in %s", dir);
    int all_kinds = 1;
    for (int k = 0; k < PP_N_SCHEDULE_KINDS; k++) all_kinds &= kinds_seen[k] > 0;
    CHECK(all_kinds, "every kind has fixtures");
    CHECK(n_bubbled > 0, "some fixture has bubbles added by InterleavedZeroBubble's pass");
    CHECK(n_simmed > 0, "some fixture has PyTorch's dry-run step count");
    CHECK(n_streams == n, "every lowered fixture run on NCCL streams: %d of %d", n_streams, n);
    printf("test_pp_schedule: %d PyTorch schedules matched (%d with zero-bubble bubbles added, %d refusals, %d dry "
           "runs step for step), %ld dry-run steps in all\n",
           n, n_bubbled, n_refused, n_simmed, lowered_steps);
}

/* ---- peak counts on known schedules ----------------------------------------------------- */

static void test_peaks(void) {
    char err[512];
    pp_schedule *s = pp_schedule_generate(PP_SCHED_GPIPE, 4, 1, 8, err, sizeof err);
    CHECK(s && pp_schedule_max_in_flight(s) == 8, "GPipe holds all m: %s", err);
    pp_schedule_free(s);
    s = pp_schedule_generate(PP_SCHED_1F1B, 4, 1, 8, err, sizeof err);
    CHECK(s && pp_schedule_max_in_flight(s) == 4 && pp_schedule_rank_in_flight(s, 3, -1) == 1 &&
              pp_schedule_rank_in_flight(s, 1, 1) == 3,
          "1F1B: rank r holds p-r: %s", err);
    pp_schedule_free(s);
    s = pp_schedule_generate(PP_SCHED_INTERLEAVED_ZB, 4, 2, 8, err, sizeof err);
    CHECK(s && pp_schedule_max_deferred_w(s) > 0 && pp_schedule_max_deferred_w(s) <= 4, "ZB defers W: %s", err);
    pp_schedule_free(s);
    s = pp_schedule_generate(PP_SCHED_ZBV, 4, 2, 8, err, sizeof err);
    int ok = s != NULL;
    for (int r = 0; s && r < 4; r++) ok &= pp_schedule_rank_in_flight(s, r, -1) == 8;
    CHECK(ok, "ZBV: 2p chunk-microbatches in flight on every rank: %s", err);
    pp_schedule_free(s);
    s = pp_schedule_generate(PP_SCHED_DUALPIPEV, 2, 2, 4, err, sizeof err);
    int overlaps = 0;
    for (int r = 0; s && r < 2; r++)
        for (int i = 0; i < s->len[r]; i++) overlaps += s->acts[r][i].type == PP_OVERLAP_F_B;
    CHECK(s && overlaps > 0, "DualPipeV overlaps: %s", err);
    pp_schedule_free(s);
}

/* ---- generator names, placement and refusals --------------------------------------------- */

static void expect_refused(pp_schedule_kind k, int p, int v, int m, const char *want) {
    char err[512] = "";
    pp_schedule *s = pp_schedule_generate(k, p, v, m, err, sizeof err);
    CHECK(!s && strstr(err, want), "%s p=%d v=%d m=%d: got '%s', want '%s'", pp_schedule_kind_name(k), p, v, m,
          s ? "a schedule" : err, want);
    pp_schedule_free(s);
}

static void test_generate_api(void) {
    pp_schedule_kind k;
    CHECK(pp_schedule_kind_parse("interleaved1f1b", &k) == 0 && k == PP_SCHED_INTERLEAVED_1F1B, "case-insensitive");
    CHECK(pp_schedule_kind_parse("ZBVZeroBubble", &k) == 0 && k == PP_SCHED_ZBV, "ZBV");
    CHECK(pp_schedule_kind_parse("dualpipev", &k) == 0 && k == PP_SCHED_DUALPIPEV, "DualPipeV");
    CHECK(pp_schedule_kind_parse("zbv", &k) != 0 && pp_schedule_kind_parse("", &k) != 0, "unknown names refused");
    for (int i = 0; i < PP_N_SCHEDULE_KINDS; i++) {
        CHECK(pp_schedule_kind_parse(pp_schedule_kind_name((pp_schedule_kind)i), &k) == 0 && (int)k == i, "name %d", i);
        CHECK(strstr(pp_schedule_kind_list(), pp_schedule_kind_name((pp_schedule_kind)i)) != NULL, "listed %d", i);
    }
    CHECK(pp_schedule_kind_single_stage(PP_SCHED_1F1B) && !pp_schedule_kind_single_stage(PP_SCHED_LOOPED_BFS) &&
              pp_schedule_kind_v(PP_SCHED_DUALPIPEV) && !pp_schedule_kind_v(PP_SCHED_INTERLEAVED_ZB),
          "kind classes");
    static const int v4[] = {0, 1, 2, 3, 3, 2, 1, 0};
    int ok = 1;
    for (int st = 0; st < 8; st++)
        ok &= pp_stage_to_rank(PP_SCHED_ZBV, 4, 8, st) == v4[st] &&
            pp_stage_to_rank(PP_SCHED_INTERLEAVED_1F1B, 4, 8, st) == st % 4;
    CHECK(ok, "V and loop placement");

    expect_refused(PP_SCHED_GPIPE, 4, 2, 8, "one stage per rank");
    expect_refused(PP_SCHED_1F1B, 2, 2, 8, "one stage per rank");
    expect_refused(PP_SCHED_ZBV, 2, 3, 4, "exactly 2 stages per rank");
    expect_refused(PP_SCHED_DUALPIPEV, 2, 1, 4, "exactly 2 stages per rank");
    expect_refused(PP_SCHED_INTERLEAVED_1F1B, 2, 2, 5, "multiple of the rounds");
    expect_refused(PP_SCHED_INTERLEAVED_ZB, 4, 2, 9, "multiple of the rounds");
    expect_refused(PP_SCHED_DUALPIPEV, 2, 2, 3, "at least as many microbatches as stages");
    expect_refused(PP_SCHED_1F1B, 4, 1, 3, "at least as many microbatches as stages");
    expect_refused(PP_SCHED_GPIPE, 0, 1, 3, ">= 1");
    expect_refused(PP_SCHED_GPIPE, 2, 1, 0, ">= 1");

    /* one rank: gradient accumulation, F0 B0 F1 B1 ... */
    char err[256];
    pp_schedule *s = pp_schedule_generate(PP_SCHED_1F1B, 1, 1, 3, err, sizeof err), *acc = pp_schedule_accumulate(3);
    char why[128];
    CHECK(s && acc && same_lists(s, acc, why, sizeof why), "1F1B on one rank is accumulation: %s", why);
    pp_schedule_free(s);
    pp_schedule_free(acc);
}

/* ---- CSV errors ------------------------------------------------------------------------------ */

static const char *write_tmp(const char *name, const char *text) {
    static char path[160];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

static void expect_csv_error(const char *what, const char *text, int ranks, int m, const char *want1,
                             const char *want2) {
    const char *path = write_tmp("bad.csv", text);
    char err[512] = "";
    pp_csv_format fmt;
    pp_schedule *s = pp_csv_load(path, ranks, m, &fmt, err, sizeof err);
    CHECK(!s && strstr(err, path) && strstr(err, want1) && (!want2 || strstr(err, want2)),
          "%s: got '%s', want '%s' '%s'", what, err, want1, want2 ? want2 : "");
    pp_schedule_free(s);
}

static void test_csv(void) {
    char err[512] = "", why[256] = "";
    pp_csv_format fmt;
    /* CRLF, trailing empty cells and no final line end */
    const char *p = write_tmp("ok.csv", "0F0,,1F0,1B0,0F1,0B0,1F1,1B1,,0B1,,\r\n");
    pp_schedule *s = pp_csv_load(p, 1, 2, &fmt, err, sizeof err);
    CHECK(s && fmt == PP_CSV_COMPUTE_ONLY && s->len[0] == 12 && s->n_stages == 2 && s->acts[0][11].type == PP_IDLE,
          "CRLF + idle cells: %s", err);
    pp_schedule_free(s);
    p = write_tmp("ok2.csv", "0F0,0F1,0B0,0B1");
    s = pp_csv_load(p, 1, 2, &fmt, err, sizeof err);
    CHECK(s && s->len[0] == 4, "no final newline: %s", err);
    pp_schedule_free(s);
    p = write_tmp("ok3.csv", "\"0F0\",0B0\n");
    s = pp_csv_load(p, 1, 1, &fmt, err, sizeof err);
    CHECK(s && s->len[0] == 2, "a quoted cell: %s", err);
    pp_schedule_free(s);
    p = write_tmp("ok4.csv", "0UNSHARD,0F0,0B0,0REDUCE_GRAD,0WAIT_REDUCE_GRAD,0RESHARD,,\n");
    s = pp_csv_load(p, 1, 1, &fmt, err, sizeof err);
    CHECK(s && fmt == PP_CSV_COMPUTE_COMMS && s->len[0] == 6, "compute_comms, trailing empty cells dropped: %s", err);
    pp_schedule_free(s);

    expect_csv_error("too few rows", "0F0,0B0\n", 2, 1, "1 rows", "one row per pipeline rank (2 ranks)");
    expect_csv_error("too many rows", "0F0,0B0\n\n1F0,1B0\n", 2, 1, "3 rows", NULL);
    expect_csv_error("bad cell", "0F0,1B0\n1F0,1X0,0B0\n", 2, 1, "rank 1 (row 2), cell 2 '1X0': not an action", NULL);
    expect_csv_error("W before I", "0F0,0W0,0I0\n", 1, 1,
                     "rank 0 (row 1), cell 2 '0W0': backward-weight before backward-input", NULL);
    expect_csv_error("stage on two ranks", "0F0,0B0\n1F0,0F0\n", 2, 1,
                     "rank 1 (row 2), cell 2 '0F0': stage 0 already runs on rank 0", NULL);
    expect_csv_error("missing backward", "0F0,0B0,0F1\n", 1, 2, "rank 0 (row 1): stage 0 microbatch 1 has no backward",
                     NULL);
    expect_csv_error("microbatch out of range", "0F0,0B0,0F1,0B1\n", 1, 1,
                     "rank 0 (row 1), cell 3 '0F1': microbatch 1, but the step has 1", NULL);
    expect_csv_error("B of a microbatch out of range", "0F0,0B0,(0F1;0B2)OVERLAP_F_B\n", 1, 2,
                     "cell 3 '(0F1;0B2)OVERLAP_F_B': microbatch 2 outside 0..1", NULL);
    expect_csv_error("idle inside a lowered row", "0UNSHARD,,0F0,0B0,0RESHARD\n", 1, 1,
                     "rank 0 (row 1), cell 2 '': an empty cell", NULL);
    expect_csv_error("unclosed quote", "\"0F0,0B0\n", 1, 1, "cell 1: a quote that is never closed", NULL);
    expect_csv_error("empty file", "", 1, 1, "0 rows", NULL);
    expect_csv_error("idle only", ",,\n", 1, 1, "no actions", NULL);
    {
        char e[256] = "";
        char missing[200];
        snprintf(missing, sizeof missing, "%s/none.csv", tmpdir);
        CHECK(!pp_csv_load(missing, 1, 1, &fmt, e, sizeof e) && strstr(e, "none.csv") && strstr(e, "cannot open"),
              "missing file: %s", e);
    }

    /* dump: a failed write leaves the old file */
    pp_schedule *g = pp_schedule_generate(PP_SCHED_ZBV, 2, 2, 2, err, sizeof err);
    char target[200], bad[220];
    snprintf(target, sizeof target, "%s/keep.csv", tmpdir);
    write_tmp("keep.csv", "old\n");
    snprintf(bad, sizeof bad, "%s/nodir/x.csv", tmpdir);
    CHECK(g && pp_csv_dump(g, bad, err, sizeof err) != 0 && strstr(err, "nodir/x.csv"), "dump to a missing folder: %s",
          err);
    CHECK(g && pp_csv_dump(g, target, err, sizeof err) == 0, "dump: %s", err);
    pp_schedule *back = pp_csv_load(target, 2, 2, &fmt, err, sizeof err);
    CHECK(back && g && same_lists(g, back, why, sizeof why), "dump then load: %s %s", err, why);
    pp_schedule_free(back);
    pp_schedule_free(g);
}

/* ---- the lowered-schedule check ---------------------------------------------------------------- */

static void expect_lowered_error(const char *what, const char *text, int ranks, int m, const char *want1,
                                 const char *want2) {
    const char *path = write_tmp("low.csv", text);
    char err[1024] = "";
    pp_csv_format fmt;
    pp_schedule *s = pp_csv_load(path, ranks, m, &fmt, err, sizeof err);
    CHECK(s != NULL, "%s: load: %s", what, err);
    if (!s) return;
    CHECK(pp_schedule_check_lowered(s, NULL, err, sizeof err) != 0 && strstr(err, want1) &&
              (!want2 || strstr(err, want2)),
          "%s: got '%s', want '%s' '%s'", what, err, want1, want2 ? want2 : "");
    pp_schedule_free(s);
}

static void test_check_lowered(void) {
    /* PyTorch's lowering of 1F1B, p=2, m=2 (tests/assets/pp_schedules/1F1B_p2_v1_m2.comms.csv) */
    static const char good[] =
        "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1,0REDUCE_GRAD,"
        "0WAIT_REDUCE_GRAD,0RESHARD\n"
        "1UNSHARD,1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD,"
        "1WAIT_SEND_B0,1WAIT_SEND_B1\n";
    const char *path = write_tmp("good.csv", good);
    char err[1024] = "";
    pp_csv_format fmt;
    pp_schedule *s = pp_csv_load(path, 2, 2, &fmt, err, sizeof err);
    int steps = 0;
    CHECK(s && fmt == PP_CSV_COMPUTE_COMMS && pp_schedule_check_lowered(s, &steps, err, sizeof err) == 0 && steps > 0,
          "the good one: %s", err);
    pp_schedule_free(s);

    /* rank 0 waits for a gradient before sending the activation it comes from */
    expect_lowered_error(
        "deadlock",
        "0UNSHARD,0RECV_B0,0F0,0SEND_F0,0F1,0SEND_F1,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1,0REDUCE_GRAD,"
        "0WAIT_REDUCE_GRAD,0RESHARD\n"
        "1UNSHARD,1RECV_F0,1F0,1RECV_F1,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD,"
        "1WAIT_SEND_B0,1WAIT_SEND_B1\n",
        2, 2, "deadlock", "rank 0 waits at action 1 (0RECV_B0); rank 1 waits at action 1 (1RECV_F0)");
    /* both streams hold a send at their heads (rank 0 computes 0F2 between sending
     * 0F1 and posting the receive of 0B0, rank 1 runs 1W0 between sending 1B0 and
     * posting the receive of 1F1): MPI would finish it, NCCL's streams cannot */
    static const char crossed[] =
        "0F0,0SEND_F0,0F1,0SEND_F1,0F2,0RECV_B0,0SEND_F2,0B0,0RECV_B1,0B1,0RECV_B2,0B2,0WAIT_SEND_F0,0WAIT_SEND_F1,"
        "0WAIT_SEND_F2\n"
        "1RECV_F0,1F0,1I0,1SEND_B0,1W0,1RECV_F1,1F1,1I1,1SEND_B1,1W1,1RECV_F2,1F2,1I2,1SEND_B2,1W2,1WAIT_SEND_B0,"
        "1WAIT_SEND_B1,1WAIT_SEND_B2\n";
    expect_lowered_error("crossed sends", crossed, 2, 3, "lowered schedule: deadlock on serialised streams",
                         "rank 0 stuck at action 7 (0B0, waiting for 0RECV_B0): its stream's head is 0SEND_F1 to rank "
                         "1, whose head is 1SEND_B0 to rank 0; rank 1 stuck at action 6 (1F1, waiting for 1RECV_F1)");
    path = write_tmp("low.csv", crossed);
    s = pp_csv_load(path, 2, 3, &fmt, err, sizeof err);
    CHECK(s && pp_schedule_check_lowered_in(s, PP_P2P_MPI, &steps, err, sizeof err) == 0,
          "crossed sends: MPI's dry run finishes them: %s", err);
    CHECK(s && pp_schedule_check_lowered_in(s, 4, NULL, err, sizeof err) != 0 && strstr(err, "unknown point-to-point"),
          "a model that does not exist: %s", err);
    pp_schedule_free(s);
    /* rank 1 posts its receives in the other order than rank 0 sends */
    expect_lowered_error(
        "pair order",
        "0UNSHARD,0F0,0F1,0SEND_F0,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1,0REDUCE_GRAD,"
        "0WAIT_REDUCE_GRAD,0RESHARD\n"
        "1UNSHARD,1RECV_F1,1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1WAIT_REDUCE_GRAD,1RESHARD,"
        "1WAIT_SEND_B0,1WAIT_SEND_B1\n",
        2, 2,
        "message #1 from rank 0 to rank 1: rank 0 sends 0SEND_F0 (action 3) but rank 1 receives 1RECV_F1 (action 1)",
        NULL);
    expect_lowered_error("receive missing",
                         "0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0WAIT_SEND_F0,0RECV_B1,0B1,0WAIT_SEND_F1\n"
                         "1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,1SEND_B1,1WAIT_SEND_B0,1WAIT_SEND_B1\n",
                         2, 2, "rank 1, action 4 (1F1): its input has not arrived: no 1RECV_F1 before it", NULL);
    expect_lowered_error("gradient never received", "0F0,0SEND_F0,0B0,0WAIT_SEND_F0\n1F0,1B0\n", 2, 1,
                         "rank 0, action 2 (0B0): its input has not arrived: no 0RECV_B0 before it", NULL);
    expect_lowered_error("unmatched send", "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n",
                         2, 1, "rank 1, action 0 (1F0)", "input has not arrived");
    expect_lowered_error("send before forward",
                         "0SEND_F0,0F0,0RECV_B0,0B0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n", 2, 1,
                         "rank 0, action 0 (0SEND_F0): sends before its forward 0F0", NULL);
    expect_lowered_error("no wait for a send", "0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n",
                         2, 1, "rank 0, action 1 (0SEND_F0): never waited for", NULL);
    expect_lowered_error(
        "wait without send",
        "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,0WAIT_SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n", 2, 1,
        "rank 0, action 5 (0WAIT_SEND_F0): waits for a send that is not pending", NULL);
    expect_lowered_error("reduction never waited", "0F0,0B0,0REDUCE_GRAD\n", 1, 1,
                         "rank 0, action 2 (0REDUCE_GRAD): the reduction of stage 0 is never waited for", NULL);
    expect_lowered_error("two reductions pending", "0F0,1F0,1B0,0B0,0REDUCE_GRAD,1REDUCE_GRAD,1WAIT_REDUCE_GRAD\n", 1,
                         1, "action 5 (1REDUCE_GRAD): a second reduction starts", NULL);
    expect_lowered_error("FSDP action for another rank's stage",
                         "0F0,0SEND_F0,0RECV_B0,0B0,0WAIT_SEND_F0,1UNSHARD\n"
                         "1RECV_F0,1F0,1B0,1SEND_B0,1WAIT_SEND_B0\n",
                         2, 1, "rank 0, action 5 (1UNSHARD): stage 1 runs on rank 1, not here", NULL);
    expect_lowered_error("send to the same rank", "0F0,0SEND_F0,1RECV_F0,1F0,1B0,0B0,0WAIT_SEND_F0\n", 1, 1,
                         "action 1 (0SEND_F0): stage 1 is on this rank too", NULL);

    /* lowering refuses what is not compute-only */
    pp_schedule *c = pp_schedule_accumulate(2);
    pp_schedule_push(c, 0, PP_SEND_F, 0, 0);
    CHECK(!pp_schedule_lower(c, NULL, err, sizeof err) && strstr(err, "rank 0, action 4 (0SEND_F0)"),
          "lowering a lowered schedule: %s", err);
    pp_schedule_free(c);
    /* an overlapped action needing more stages than may be unsharded */
    pp_schedule *g = pp_schedule_generate(PP_SCHED_DUALPIPEV, 2, 2, 4, err, sizeof err);
    pp_lower_options one = {1};
    CHECK(g && !pp_schedule_lower(g, &one, err, sizeof err) && strstr(err, "max_active_stages = 1") &&
              strstr(err, "OVERLAP_F_B"),
          "max_active_stages: %s", err);
    pp_schedule_free(g);
    /* a compute order no round robin can place */
    static const char bad_order[] = "0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n";
    path = write_tmp("order.csv", bad_order);
    s = pp_csv_load(path, 2, 2, &fmt, err, sizeof err);
    pp_schedule *l = s ? pp_schedule_lower(s, NULL, err, sizeof err) : NULL;
    CHECK(s && !l && strstr(err, "malformed compute schedule") && strstr(err, "rank 1 waits at action"),
          "unplaceable order: %s", err);
    pp_schedule_free(l);
    pp_schedule_free(s);
}

/* ---- NCCL streams: every generated schedule as the trainer runs it ------------------------ */

/* Every kind at pp 2, 4 and 8, each stages-per-rank count it takes (1 to 3 for the
 * looped kinds), over microbatch counts around the multiples of p; those the
 * generator accepts are lowered as the trainer lowers them (max_active_stages 3)
 * and must finish under both point-to-point models, with and without their FSDP
 * actions. The minimum each kind accepts and a count that is no multiple of p must
 * be among them. */
static void test_streams_grid(void) {
    static const int ps[] = {2, 4, 8};
    const pp_lower_options lo = {3};
    int n_checked = 0;
    for (int k = 0; k < PP_N_SCHEDULE_KINDS; k++)
        for (size_t pi = 0; pi < sizeof ps / sizeof *ps; pi++) {
            const pp_schedule_kind kind = (pp_schedule_kind)k;
            const int p = ps[pi], single = pp_schedule_kind_single_stage(kind), vee = pp_schedule_kind_v(kind);
            const int v_lo = vee ? 2 : 1, v_hi = single ? 1 : vee ? 2 : 3;
            const int want_min = kind == PP_SCHED_1F1B ? p : kind == PP_SCHED_DUALPIPEV ? 2 * p : 1;
            for (int v = v_lo; v <= v_hi; v++) {
                const int ms[] = {1, 2, 3, p - 1, p, p + 1, 2 * p - 1, 2 * p, 2 * p + 1, 3 * p, 4 * p + 1};
                int accepted = 0, min_m = 0, odd = 0, last = 0;
                for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++) {
                    const int m = ms[mi];
                    if (m <= last) continue; /* p = 2 repeats some */
                    last = m;
                    char err[2048] = "", what[96];
                    snprintf(what, sizeof what, "%s p=%d v=%d m=%d", pp_schedule_kind_name(kind), p, v, m);
                    pp_schedule *g = pp_schedule_generate(kind, p, v, m, err, sizeof err);
                    if (!g) continue;
                    accepted++;
                    odd |= m % p != 0;
                    if (!min_m) min_m = m;
                    pp_schedule *low = pp_schedule_lower(g, &lo, err, sizeof err);
                    CHECK(low && pp_schedule_check_lowered_in(low, PP_P2P_ALL, NULL, err, sizeof err) == 0,
                          "%s, lowered: %s", what, err);
                    pp_schedule *bare = low ? without_fsdp(low) : NULL;
                    CHECK(bare && pp_schedule_check_lowered_in(bare, PP_P2P_ALL, NULL, err, sizeof err) == 0,
                          "%s, lowered without FSDP actions: %s", what, err);
                    n_checked += low && bare;
                    pp_schedule_free(bare);
                    pp_schedule_free(low);
                    pp_schedule_free(g);
                }
                CHECK(accepted >= 3 && min_m == want_min && odd,
                      "%s p=%d v=%d: %d microbatch counts accepted, the "
                      "least %d (want %d), one no multiple of p: %d",
                      pp_schedule_kind_name(kind), p, v, accepted, min_m, want_min, odd);
            }
        }
    printf("test_pp_schedule: %d generated schedules lowered and run on NCCL streams and MPI, with and without FSDP\n",
           n_checked);
}

static void cleanup_tmp(void) {
    static const char *names[] = {"rt.csv",  "ok.csv",   "ok2.csv", "ok3.csv",  "ok4.csv",
                                  "bad.csv", "keep.csv", "low.csv", "good.csv", "order.csv"};
    char p[200];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, names[i]);
        unlink(p);
    }
    rmdir(tmpdir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tetra_pp_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_strings();
    test_validate();
    test_generate_api();
    test_peaks();
    test_csv();
    test_check_lowered();
    test_fixtures();
    test_streams_grid();
    cleanup_tmp();
    printf("test_pp_schedule: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
