/* ckpt_cli.h — `tetra checkpoint`: inspect, export and import checkpoints.
 *
 *   tetra checkpoint inspect PATH [--chunks] [--no-verify]
 *   tetra checkpoint export --hf OUT_DIR [--dtype float32|bfloat16|float16]
 *                           [--max-shard-size 5GB] PATH
 *   tetra checkpoint import --hf SRC OUT_FOLDER [--flavor NAME] [--step N]
 *
 * PATH is a step folder (step-N) or a checkpoint folder (inspect lists its
 * steps and checks each; export takes the newest complete one). */
#ifndef TETRA_CKPT_CLI_H
#define TETRA_CKPT_CLI_H

/* argv[0] = "checkpoint". Returns the exit code. */
int ckpt_cli_main(int argc, char **argv);

#endif
