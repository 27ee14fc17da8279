#include "cli/train.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "config/compat.h"
#include "telemetry/log.h"
#include "engine/run_guard.h"
#include "engine/trainer.h"
#include "parallel/comm.h"
#include "util/host.h"

/* Write the merged config to `path` atomically: a crash never leaves half a file. */
static int save_config_file(const tetra_config *c, const char *path, char *err, size_t n) {
    char tmp[1100];
    if (strlen(path) > 1000) {
        snprintf(err, n, "job.save_config_file: path longer than 1000 bytes");
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%.1000s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        snprintf(err, n, "job.save_config_file: cannot write '%.1000s': %s", tmp, strerror(errno));
        return -1;
    }
    cfg_print_toml(c, f);
    int bad = ferror(f);
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        snprintf(err, n, "job.save_config_file: cannot write '%.1000s': %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Every rank must train the same configuration: rank 0's merged TOML is compared with each
 * rank's own, and a rank that differs names the first line that does (e.g. a launcher that
 * passed another batch size to one rank). Collective; 1 when they differ. */
static int configs_differ(const tetra_config *cfg, int rank) {
    char *mine = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mine, &len);
    if (!f) return 0;
    cfg_print_toml(cfg, f);
    fclose(f);
    long long n = rank == 0 ? (long long)len : 0;
    host_bcast(&n, sizeof n, 0);
    char *ref = malloc((size_t)n + 1);
    if (!ref) {
        free(mine);
        host_abort(1);
    }
    if (rank == 0) memcpy(ref, mine, (size_t)n);
    host_bcast(ref, (size_t)n, 0);
    ref[n] = 0;
    int differ = (size_t)n != len || memcmp(ref, mine, len) != 0;
    if (differ) { /* the first line that differs, and the section it is in */
        const char *a = ref, *b = mine, *section = "";
        char sec[128] = "";
        while (*a && *b) {
            const char *ea = strchr(a, '\n'), *eb = strchr(b, '\n');
            size_t la = ea ? (size_t)(ea - a) : strlen(a), lb = eb ? (size_t)(eb - b) : strlen(b);
            if (la != lb || memcmp(a, b, la) != 0) {
                log_error("rank %d's configuration differs from rank 0's: [%s] rank 0 has '%.*s', rank %d has '%.*s' "
                          "(every rank must get the same config file and options)",
                          rank, section, (int)la, a, rank, (int)lb, b);
                break;
            }
            if (la > 2 && a[0] == '[') {
                snprintf(sec, sizeof sec, "%.*s", (int)(la - 2), a + 1);
                section = sec;
            }
            a += la + (ea != NULL);
            b += lb + (eb != NULL);
        }
    }
    free(ref);
    free(mine);
    int any = host_max_int(differ);
    if (any && rank == 0 && !differ)
        log_error("the ranks were given different configurations (see the rank that differs)");
    return any;
}

/* run_train.sh's CPU quick start (TETRA_QUICK_START = "SEQ_LEN LOCAL_BATCH_SIZE", the values it
 * passes before the user's arguments): said with the values in effect, and not at all when the
 * command line overrode both, so the line never claims a batch the run does not train. */
static void log_quick_start(const tetra_config *cfg) {
    const char *q = getenv("TETRA_QUICK_START");
    long long qs = 0, qb = 0;
    if (!q || sscanf(q, "%lld %lld", &qs, &qb) != 2) return;
    const long long s = (long long)cfg->v.training.seq_len, b = (long long)cfg->v.training.local_batch_size;
    if (s != qs && b != qb) return;
    log_info("run_train.sh: no GPU: CPU quick start, %s at seq_len %lld%s x local_batch_size %lld%s (CONFIG_FILE=%s "
             "runs it as written)",
             cfg->file ? cfg->file : "the default config", s, s == qs ? "" : " (command line)", b,
             b == qb ? "" : " (command line)", cfg->file ? cfg->file : "FILE");
}

/* A failure that this rank, or another for a failure they all met, has explained in the log.
 * With several ranks the job ends through comm_abort_explained: no rank is left waiting, and
 * the explanation stays the last thing printed (ending through MPI_Finalize with a non-zero
 * status would make mpirun print its own banner after it). */
/* A key that is set but means nothing in C: said once, at start-up */
static void note_line(const char *line, void *ctx) {
    (void)ctx;
    log_info("note: %s", line);
}

static int end_failed(int world, int rc) {
    if (world > 1) {
        /* mpirun forwards each rank's output through its daemon, and an abort can overtake
         * the error line on its way: give it a moment to drain first */
        fflush(stdout);
        fflush(stderr);
        struct timespec pause = {0, 300000000};
        nanosleep(&pause, NULL);
        comm_abort_explained(rc);
    }
    host_end();
    return rc;
}

int train_main(int argc, char **argv) {
    /* a closed output pipe (./run_train.sh | head) must not end training: writes to it fail
     * quietly, the metrics files go on; a closed stream is reopened on /dev/null */
    run_guard_fix_std_fds();
    signal(SIGPIPE, SIG_IGN);
    /* stop signals are caught before MPI starts: one that arrives during start-up stops the
     * run cleanly instead of killing one rank (the launcher's rank, as MPI will number it) */
    const char *env_rank = getenv("OMPI_COMM_WORLD_RANK");
    if (!env_rank) env_rank = getenv("PMI_RANK");
    if (!env_rank) env_rank = getenv("SLURM_PROCID");
    run_guard_catch_signals(env_rank ? atoi(env_rank) : 0);
    host_start(&argc, &argv);
    const int rank = host_rank(), world = host_world();
    log_init(rank, world);

    /* --dry-run is an action, not a config key: taken out before the keys are parsed */
    trainer_options topt;
    memset(&topt, 0, sizeof topt);
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        if (i > 0 && (!strcmp(argv[i], "--dry-run") || !strcmp(argv[i], "--dry_run"))) topt.dry_run = 1;
        else argv[kept++] = argv[i];
    }
    argc = kept;

    tetra_config cfg;
    cfg_init(&cfg);
    char err[8192]; /* every key a ported config names wrongly, one line each */
    int rc = cfg_parse_args(&cfg, argc, argv, stdout, err, sizeof err);
    if (rc == 1) {
        cfg_free(&cfg);
        host_end();
        return 0;
    }
    if (rc == 0 && cfg.v.metrics.disable_color_printing) log_set_color(0);
    /* TorchTitan's memory_estimation: the dry run's estimate instead of training */
    if (rc == 0 && cfg.v.memory_estimation.enable) topt.dry_run = 1;
    tetra_job job;
    if (rc == 0) rc = job_resolve(&cfg, world, &job, err, sizeof err);
    /* a dry run only plans: it may plan for a GPU this build cannot drive */
    if (rc == 0 && !topt.dry_run) rc = cfg_check_build(&cfg, err, sizeof err);
    if (rc != 0) {
        /* Every rank parsed the same inputs, so every rank fails the same way;
         * one message is enough. */
        if (rank == 0) log_error("%s", err);
        cfg_free(&cfg);
        return end_failed(world, 1);
    }
    if (world > 1 && configs_differ(&cfg, rank)) {
        cfg_free(&cfg);
        return end_failed(world, 1);
    }
    /* one live run per dump folder, and every output folder writable, before anything is written */
    if (!topt.dry_run && run_guard_start(&cfg.v, rank)) {
        cfg_free(&cfg);
        return end_failed(world, 1);
    }
    if (rank == 0) log_quick_start(&cfg);
    if (rank == 0) cfg_compat_notices(&cfg, note_line, NULL);
    if (cfg.v.job.print_config && rank == 0) cfg_print_toml(&cfg, stdout);
    if (cfg.v.job.save_config_file && rank == 0) {
        if (save_config_file(&cfg, cfg.v.job.save_config_file, err, sizeof err)) {
            log_error("%s", err);
            run_guard_end();
            comm_abort_explained(1);
        }
    }
    log_info("%s: world %d = pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d; global batch %lld, "
             "gradient accumulation %d",
             cfg.v.job.description, job.dims.world, job.dims.pp, job.dims.dp_replicate, job.dims.dp_shard, job.dims.cp,
             job.dims.tp, (long long)job.dims.global_batch_size, job.dims.grad_accum_steps);
    rc = trainer_run(&cfg, &job, rank, world, &topt);
    cfg_free(&cfg);
    run_guard_end();
    /* a failing rank must not leave the others waiting: it ends the job */
    if (rc != 0) return end_failed(world, rc);
    host_end();
    return rc;
}
