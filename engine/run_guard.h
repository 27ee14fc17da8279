/* run_guard.h — what keeps a training run safe from its surroundings.
 *
 * - Stop signals (Slurm's SIGTERM or --signal=USR1, Ctrl-C, run_train.sh passing one
 *   on): caught from the first moment of `tetra train`. The first one asks the run to
 *   stop after the step in progress and save it; each rank that receives it says so at
 *   once ("saving step N ..."). A second SIGINT abandons the save and exits 130 at once,
 *   saying so. Repeated SIGTERM/SIGUSR1 (a job scheduler, a launcher and a process
 *   group may each deliver one) change nothing.
 * - Standard streams: a closed stdin/stdout/stderr is reopened on /dev/null, so a log
 *   line can never land in a file the run opened later.
 * - One live run per dump folder: rank 0 holds an flock on <dump_folder>/.tetra.lock
 *   (and on <checkpoint folder>/.tetra.lock when that folder lies elsewhere) for the
 *   whole run; the lock dies with its process, a file left by a killed run is taken
 *   over, saying whose it was.
 * - Every output folder the run will write (dump, checkpoint, TensorBoard, profiling and
 *   memory-snapshot traces, the flight recorder's dumps) is checked for writability at
 *   start-up, so a bad path fails in the first second, not at the first save.
 */
#ifndef TETRA_RUN_GUARD_H
#define TETRA_RUN_GUARD_H

#include <stddef.h>
#include <stdint.h>

#include "config/config.h"

/* Reopen closed fds 0, 1, 2 on /dev/null. Call first. */
void run_guard_fix_std_fds(void);
/* Catch SIGTERM, SIGINT, SIGUSR1 (and start the thread that reports them). */
void run_guard_catch_signals(int rank);
/* The first stop signal received, 0 if none. */
int run_guard_stop_signal(void);
/* What this rank contributes to the stop decision at a step's end (all-reduced with max):
 * RUN_GUARD_FROM_LAUNCHER + the signal the launcher was asked to stop with (rank 0 reads
 * $TETRA_STOP_FILE, written by run_train.sh), else the first stop signal received, else 0.
 * run_guard_signal_name names either. */
#define RUN_GUARD_FROM_LAUNCHER 64
int run_guard_stop_request(int rank);
/* The all-reduced decision that followed run_guard_stop_request: stop after the current step,
 * or go on to next_step. Until it is known, a signal's "saving step N" waits (a signal that
 * came after this rank's request may still stop the run at this step, if another rank's
 * request carried it, or else at the next). */
void run_guard_stop_decided(int stop, int64_t next_step);
const char *run_guard_signal_name(int sig);
/* What a stop will do, for the message printed when a signal arrives: the checkpoint
 * folder a stop saves to, or NULL when nothing will be saved. */
void run_guard_set_stop_target(const char *ckpt_dir);
/* The step in progress (0 during start-up). */
void run_guard_set_step(int64_t step);
/* Lock the output folders (rank 0) and check that every rank can write them.
 * Collective over MPI_COMM_WORLD; 0, or 1 after the failing rank logged why. */
int run_guard_start(const tetra_config_values *c, int rank);
/* Release the locks (rank 0): the next run in the folder starts without a takeover. */
void run_guard_end(void);

#endif
