/* tetra — one executable, one subcommand per job. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/ckpt_cli.h"
#include "cli/data_cli.h"
#include "config/config.h"
#include "cli/info.h"
#include "plan/plan.h"
#include "cli/train.h"
#include "kernels/ops.h"

#define TETRA_VERSION "0.1.0"

static void usage(FILE *f) {
    fprintf(f,
            "tetra %s — 4D-parallel Llama 3 pretraining in C\n"
            "\n"
            "usage: tetra <command> [options]\n"
            "\n"
            "commands:\n"
            "  train    train a model from a TOML config (tetra train --help lists every key)\n"
            "  data     tokenizers and token shards (encode, decode, train-tokenizer, prepare)\n"
            "  checkpoint  inspect checkpoints, export/import Hugging Face safetensors\n"
            "  plan     memory, communication and step time of a config at any GPU count; the layouts\n"
            "           that fit best; pipeline schedules (plan pp)\n"
            "  info     build configuration and visible devices\n"
            "  version  the version (also -V, --version)\n"
            "\n"
            "Most runs start from ./run_train.sh, which builds, picks the rank count\n"
            "(NGPU) and launches ranks with mpirun.\n",
            TETRA_VERSION);
}

/* OpenBLAS chose its kernels when it was loaded, before main: where it fell back to its
 * SSE3 ones on a CPU it does not know (Debian 12's 0.3.21 on Sapphire and Emerald Rapids),
 * start again with OPENBLAS_CORETYPE naming the kernels the CPU runs. The emulated float8
 * GEMMs run 2-5x faster. The restart keeps the process (and its MPI rank); if exec fails,
 * the run goes on with the slower kernels. */
static void blas_restart(char **argv) {
    const char *core = ops_cpu_blas_coretype();
    if (!core) return;
    /* the executable's own path, not /proc/self/exe: the process keeps its name (ps,
     * pgrep and the launcher's kill find "tetra") */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || n >= (ssize_t)sizeof self - 1) return;
    self[n] = '\0';
    if (setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    execv(self, argv);
    unsetenv("OPENBLAS_CORETYPE"); /* not restarted: say nothing untrue to child processes */
}

/* The command a typo most likely meant ("trian" -> "train"), or NULL when none is close. */
static const char *nearest_command(const char *cmd) {
    static const char *const commands[] = {"train", "data", "checkpoint", "plan", "info", "version"};
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        size_t d = cfg_edit_distance(cmd, commands[i]);
        if (d < best_d) {
            best_d = d;
            best = commands[i];
        }
    }
    return best_d <= 2 && 2 * best_d <= strlen(cmd) ? best : NULL; /* "trian", "plna"; not "foo" */
}

/* A stop signal that arrives before `tetra train` has its handlers stays pending instead of
 * killing the rank: run_guard_catch_signals unblocks it. Run from .preinit_array, before the
 * shared libraries' constructors (OpenBLAS, oneDNN, MPI take tens of ms), and kept across the
 * blas_restart exec (a blocked, pending signal survives execve). */
static void hold_stop_signals(int argc, char **argv, char **envp) {
    (void)envp;
    if (argc < 2 || strcmp(argv[1], "train") != 0) return;
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGTERM);
    sigaddset(&s, SIGINT);
    sigaddset(&s, SIGUSR1);
    sigprocmask(SIG_BLOCK, &s, NULL);
}

__attribute__((section(".preinit_array"), used)) static void (*const hold_early)(int, char **,
                                                                                 char **) = hold_stop_signals;

int main(int argc, char **argv) {
    blas_restart(argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) {
        printf("tetra %s\n", TETRA_VERSION);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return train_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return data_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "checkpoint")) return ckpt_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return plan_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return info_main(argc - 1, argv + 1);
    const char *near = nearest_command(cmd);
    if (near) fprintf(stderr, "tetra: unknown command '%s' (did you mean '%s'?)\n\n", cmd, near);
    else fprintf(stderr, "tetra: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
