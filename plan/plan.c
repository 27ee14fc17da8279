/* plan.c — `tetra plan` (see plan.h). */
#include "plan/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/internal.h"
#include "telemetry/png.h"
#include "parallel/pp/chart.h"
#include "parallel/pp/csv.h"
#include "parallel/pp/generate.h"
#include "parallel/pp/lower.h"
#include "parallel/pp/schedule.h"
#include "parallel/pp/sim.h"

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

static void usage_plan(FILE *f) {
    fprintf(f,
            "usage: tetra plan --job.config_file FILE [--section.key VALUE ...] --ngpu N [--hardware NAME] [--json]\n"
            "       tetra plan --job.config_file FILE --recommend --ngpu N\n"
            "       tetra plan --job.config_file FILE --ops [--block N]   (every op of a step on the GPU)\n"
            "       tetra plan --calibrate [--out FILE]\n"
            "       tetra plan pp [options]\n"
            "\n"
            "Look at a run before paying for it: memory per rank, communication, pipeline bubble,\n"
            "step time, tokens/s/GPU and MFU of a config at any GPU count, or the layouts that fit\n"
            "best (tetra plan --help-config for every option).\n"
            "\n"
            "subcommands:\n"
            "  pp    simulate a pipeline schedule: per-rank timeline, bubble, peak in-flight microbatches\n"
            "\n"
            "tetra plan pp --help shows its options.\n");
}

static void usage_pp(FILE *f) {
    fprintf(f,
            "usage: tetra plan pp --schedule NAME --pp P --microbatches M [options]\n"
            "       tetra plan pp --schedule-csv FILE --pp P --microbatches M [options]\n"
            "\n"
            "Build a pipeline schedule as PyTorch builds it (or load one from PyTorch's CSV form),\n"
            "simulate one training step with fixed action times and print each rank's timeline,\n"
            "the step time, the bubble and the peak number of microbatches whose activations are alive.\n"
            "\n"
            "  --schedule NAME        %s\n"
            "  --pp P                 pipeline ranks (>= 1)\n"
            "  --microbatches M       microbatches per step (>= 1)\n"
            "  --stages-per-rank V    default 1 for GPipe and 1F1B, 2 for the others\n"
            "                         (InterleavedZeroBubble with 1 is ZB-H1)\n"
            "  --schedule-csv FILE    load this schedule instead (compute_only or compute_comms cells;\n"
            "                         a compute_comms one is first checked by a dry run)\n"
            "  --tf X --tb X --tw X   time of one stage's forward, backward-input, backward-weight\n"
            "                         (default 1 each; a full backward B takes tb + tw)\n"
            "  --tcomm X              added to each dependency between ranks (default 0)\n"
            "  --csv FILE             write the schedule as CSV (compute_only)\n"
            "  --with-comms           ... lowered instead (compute_comms: FSDP, send/receive actions)\n"
            "  --png FILE             draw the timeline as a PNG chart\n"
            "  --width N              columns of the text timeline (default 100)\n"
            "\n"
            "An OVERLAP_F_B action is charged the sum of its parts: no credit for overlap.\n",
            pp_schedule_kind_list());
}

const char *plan_nearest_option(const char *arg, const char *const *names, size_t n) {
    char name[128];
    snprintf(name, sizeof name, "%s", arg + strspn(arg, "-")); /* the dashes match any option */
    char *eq = strchr(name, '=');
    if (eq) *eq = '\0'; /* --ngpus=8 */
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        size_t d = cfg_edit_distance(name, names[i] + strspn(names[i], "-"));
        if (d < best_d) {
            best_d = d;
            best = names[i];
        }
    }
    return best_d <= 2 && 2 * best_d < strlen(name) ? best : NULL;
}

/* A value for option `name`: "--name V" or "--name=V". Returns the value or NULL. */
static const char *opt_value(int argc, char **argv, int *i, const char *name, int *matched) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    *matched = 0;
    if (strncmp(a, name, n)) return NULL;
    if (a[n] == '=') {
        *matched = 1;
        return a + n + 1;
    }
    if (a[n]) return NULL;
    *matched = 1;
    if (*i + 1 >= argc) return NULL;
    return argv[++*i];
}

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        if (hi == 1 << 20) fprintf(stderr, "tetra plan pp: %s needs an integer >= %d, got '%s'\n", opt, lo, s);
        else fprintf(stderr, "tetra plan pp: %s needs an integer from %d to %d, got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_time(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(v) || v < 0) {
        fprintf(stderr, "tetra plan pp: %s needs a time >= 0, got '%s'\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

typedef struct {
    const char *schedule, *schedule_csv, *csv, *png;
    int pp, microbatches, stages_per_rank, width, with_comms;
    pp_sim_times times;
} pp_opts;

/* 0, 1 (help shown), or 2 (bad argument, reported). */
static int parse_pp(int argc, char **argv, pp_opts *o) {
    memset(o, 0, sizeof *o);
    o->pp = o->microbatches = o->stages_per_rank = -1;
    o->width = 100;
    o->times = (pp_sim_times){1, 1, 1, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        int m;
        if (is_help(a)) {
            usage_pp(stdout);
            return 1;
        }
        if (!strcmp(a, "--with-comms")) {
            o->with_comms = 1;
            continue;
        }
        static const char *const names[] = {"--schedule-csv",    "--schedule", "--pp",  "--microbatches",
                                            "--stages-per-rank", "--tf",       "--tb",  "--tw",
                                            "--tcomm",           "--csv",      "--png", "--width"};
        int k = -1;
        for (int j = 0; j < (int)(sizeof names / sizeof *names) && k < 0; j++) {
            v = opt_value(argc, argv, &i, names[j], &m);
            if (m) k = j;
        }
        if (k < 0) {
            const char *near = plan_nearest_option(a, names, sizeof names / sizeof *names);
            if (!near && plan_nearest_option(a, (const char *const[]){"--with-comms"}, 1)) near = "--with-comms";
            if (near) fprintf(stderr, "tetra plan pp: unknown option '%s' (did you mean %s?)\n\n", a, near);
            else fprintf(stderr, "tetra plan pp: unknown option '%s'\n\n", a);
            usage_pp(stderr);
            return 2;
        }
        if (!v) {
            fprintf(stderr, "tetra plan pp: %s needs a value\n", names[k]);
            return 2;
        }
        int bad = 0;
        switch (k) {
        case 0: o->schedule_csv = v; break;
        case 1: o->schedule = v; break;
        case 2: bad = parse_int("--pp", v, 1, 1 << 20, &o->pp); break;
        case 3: bad = parse_int("--microbatches", v, 1, 1 << 20, &o->microbatches); break;
        case 4: bad = parse_int("--stages-per-rank", v, 1, 1 << 20, &o->stages_per_rank); break;
        case 5: bad = parse_time("--tf", v, &o->times.tf); break;
        case 6: bad = parse_time("--tb", v, &o->times.tb); break;
        case 7: bad = parse_time("--tw", v, &o->times.tw); break;
        case 8: bad = parse_time("--tcomm", v, &o->times.tcomm); break;
        case 9: o->csv = v; break;
        case 10: o->png = v; break;
        case 11: bad = parse_int("--width", v, 10, 10000, &o->width); break;
        }
        if (bad) return 2;
    }
    if (!o->schedule && !o->schedule_csv) {
        fprintf(stderr, "tetra plan pp: give --schedule NAME (%s) or --schedule-csv FILE\n", pp_schedule_kind_list());
        return 2;
    }
    if (o->pp < 0 || o->microbatches < 0) {
        fprintf(stderr, "tetra plan pp: %s required\n",
                o->pp < 0 && o->microbatches < 0 ? "--pp and --microbatches are"
                    : o->pp < 0                  ? "--pp is"
                                                 : "--microbatches is");
        return 2;
    }
    return 0;
}

/* The compute actions of a lowered schedule (what --csv writes without --with-comms). */
static pp_schedule *compute_only(const pp_schedule *s) {
    pp_schedule *c = pp_schedule_new(s->n_ranks, s->n_stages, s->n_microbatches);
    if (!c) return NULL;
    for (int r = 0; r < s->n_ranks; r++)
        for (int i = 0; i < s->len[r]; i++)
            if (pp_action_is_compute(s->acts[r][i].type) && pp_schedule_push_action(c, r, &s->acts[r][i])) {
                pp_schedule_free(c);
                return NULL;
            }
    return c;
}

static int write_csv(const pp_opts *o, const pp_schedule *s, int lowered) {
    char err[1024];
    pp_schedule *out = NULL;
    const pp_schedule *w = s;
    if (o->with_comms && !lowered) {
        pp_lower_options lo = {3};
        out = pp_schedule_lower(s, &lo, err, sizeof err);
        if (!out) {
            fprintf(stderr, "tetra plan pp: cannot lower the schedule: %s\n", err);
            return 1;
        }
        w = out;
    } else if (!o->with_comms && lowered) {
        out = compute_only(s);
        if (!out) {
            fprintf(stderr, "tetra plan pp: out of memory\n");
            return 1;
        }
        w = out;
    }
    int rc = pp_csv_dump(w, o->csv, err, sizeof err);
    if (rc) fprintf(stderr, "tetra plan pp: %s\n", err);
    else printf("wrote %s (%s)\n", o->csv, o->with_comms ? "compute_comms" : "compute_only");
    pp_schedule_free(out);
    return rc ? 1 : 0;
}

static int write_png(const pp_opts *o, const pp_sim_result *res) {
    char err[1024];
    pp_chart_image img;
    if (pp_chart_raster(res, 0, &img, err, sizeof err)) {
        fprintf(stderr, "tetra plan pp: %s\n", err);
        return 1;
    }
    int rc = png_file_write_rgb(o->png, img.rgb, img.width, img.height, err, sizeof err);
    if (rc) fprintf(stderr, "tetra plan pp: %s\n", err);
    else printf("wrote %s (%d x %d)\n", o->png, img.width, img.height);
    pp_chart_image_free(&img);
    return rc ? 1 : 0;
}

static void print_report(const pp_opts *o, const char *what, const pp_sim_result *res) {
    const pp_sim_times *t = &res->times;
    int v = res->max_stages_per_rank;
    printf("%s: %d rank%s, %d stage%s (%d per rank), %d microbatch%s\n", what, res->n_ranks,
           res->n_ranks > 1 ? "s" : "", res->n_stages, res->n_stages > 1 ? "s" : "", v, res->n_microbatches,
           res->n_microbatches > 1 ? "es" : "");
    printf("times per stage action: tf=%g tb=%g tw=%g tcomm=%g (B = tb+tw", t->tf, t->tb, t->tw, t->tcomm);
    printf("%s)\n\n", res->has_overlap ? "; OVERLAP_F_B = the sum of its parts, no overlap credit" : "");
    pp_chart_text(res, o->width, stdout);
    printf("\n%-6s %6s %10s %10s %8s  %s\n", "rank", "stages", "busy", "idle", "idle %",
           "peak in flight (stage-microbatches = model microbatches)");
    int worst = 0;
    for (int r = 0; r < res->n_ranks; r++) {
        printf("%-6d %6d %10g %10g %7.2f%%  %d = %g\n", r, res->rank_stages[r], res->busy[r], res->idle[r],
               res->makespan > 0 ? 100 * res->idle[r] / res->makespan : 0.0, res->peak_in_flight[r],
               pp_sim_peak_model_mb(res, r));
        if (pp_sim_peak_model_mb(res, r) > pp_sim_peak_model_mb(res, worst)) worst = r;
    }
    printf("\nmakespan          %g\n", res->makespan);
    printf("ideal per rank    %g  (m x (tf+tb+tw) x stages per rank = %d x %g x %d)\n", res->ideal, res->n_microbatches,
           t->tf + t->tb + t->tw, v);
    printf("bubble per rank   %g  (makespan - ideal)\n", res->makespan - res->ideal);
    printf("bubble fraction   %.6f  (idle / (ranks x makespan))\n", res->bubble_fraction);
    printf("peak in flight    %g model microbatches (rank %d: %d stage-microbatches)\n",
           pp_sim_peak_model_mb(res, worst), worst, res->peak_in_flight[worst]);
}

static int plan_pp(int argc, char **argv) {
    pp_opts o;
    int rc = parse_pp(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    char err[4096], what[1200];
    pp_schedule *s = NULL;
    int lowered = 0;
    if (o.schedule_csv) {
        if (o.schedule) fprintf(stderr, "tetra plan pp: --schedule-csv given: --schedule %s is not used\n", o.schedule);
        pp_csv_format fmt;
        s = pp_csv_load(o.schedule_csv, o.pp, o.microbatches, &fmt, err, sizeof err);
        if (!s) {
            fprintf(stderr, "tetra plan pp: %s\n", err);
            return 1;
        }
        lowered = fmt == PP_CSV_COMPUTE_COMMS;
        snprintf(what, sizeof what, "schedule %s (%s)", o.schedule_csv, lowered ? "compute_comms" : "compute_only");
        if (lowered) {
            int steps = 0;
            if (pp_schedule_check_lowered(s, &steps, err, sizeof err)) {
                fprintf(stderr, "tetra plan pp: %s: %s\n", o.schedule_csv, err);
                pp_schedule_free(s);
                return 1;
            }
            printf("%s: lowered schedule checked, its dry run finishes in %d steps; simulating its compute actions\n",
                   o.schedule_csv, steps);
        }
    } else {
        pp_schedule_kind k;
        if (pp_schedule_kind_parse(o.schedule, &k)) {
            fprintf(stderr, "tetra plan pp: unknown schedule '%s' (known: %s)\n", o.schedule, pp_schedule_kind_list());
            return 2;
        }
        int v = o.stages_per_rank > 0 ? o.stages_per_rank : pp_schedule_kind_single_stage(k) ? 1 : 2;
        s = pp_schedule_generate(k, o.pp, v, o.microbatches, err, sizeof err);
        if (!s) {
            fprintf(stderr, "tetra plan pp: %s\n", err);
            return 2;
        }
        snprintf(what, sizeof what, "schedule %s", pp_schedule_kind_name(k));
    }
    pp_sim_result *res = pp_sim_run(s, &o.times, err, sizeof err);
    if (!res) {
        fprintf(stderr, "tetra plan pp: %s\n", err);
        pp_schedule_free(s);
        return 1;
    }
    print_report(&o, what, res);
    rc = 0;
    if (o.csv && write_csv(&o, s, lowered)) rc = 1;
    if (o.png && write_png(&o, res)) rc = 1;
    pp_sim_free(res);
    pp_schedule_free(s);
    return rc;
}

int plan_main(int argc, char **argv) {
    if (argc < 2) {
        usage_plan(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (is_help(cmd) || !strcmp(cmd, "help")) {
        usage_plan(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--help-config")) {
        char *h[] = {"plan", "--help", NULL};
        return plan_config_main(2, h);
    }
    if (!strcmp(cmd, "pp")) return plan_pp(argc - 1, argv + 1);
    if (!strncmp(cmd, "--", 2)) return plan_config_main(argc, argv);
    fprintf(stderr, "tetra plan: unknown subcommand '%s'\n\n", cmd);
    usage_plan(stderr);
    return 2;
}
