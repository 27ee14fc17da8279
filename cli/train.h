/* train.h — `tetra train`: configuration, launch checks and the training loop. */
#ifndef TETRA_TRAIN_H
#define TETRA_TRAIN_H

/* argv[0] is "train". Returns the process exit code. */
int train_main(int argc, char **argv);

#endif
