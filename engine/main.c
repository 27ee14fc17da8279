/* tetra — one executable, one subcommand per job. */
#include <stdio.h>
#include <string.h>

#include "checkpoint/ckpt_cli.h"
#include "data/data_cli.h"
#include "engine/info.h"
#include "engine/plan.h"
#include "engine/train.h"

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
            "\n"
            "Most runs start from ./run_train.sh, which builds, picks the rank count\n"
            "(NGPU) and launches ranks with mpirun.\n",
            TETRA_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tetra %s\n", TETRA_VERSION);
        return 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "train")) return train_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "data")) return data_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "checkpoint")) return ckpt_cli_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan")) return plan_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return info_main(argc - 1, argv + 1);
    fprintf(stderr, "tetra: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
