/* data_cli.h — `tetra data ...`: encode, decode, train-tokenizer, prepare. */
#ifndef TETRA_DATA_CLI_H
#define TETRA_DATA_CLI_H

/* argv[0] is "data", argv[1] the subcommand. Returns the exit status:
 * 0 success, 1 failure (message on stderr), 2 usage error. */
int data_cli_main(int argc, char **argv);

#endif
