/* host.h — the host control plane: the few whole-job exchanges outside the training
 * communicators (start-up, the config every rank must agree on, checkpoint bookkeeping,
 * the run guard, `tetra data prepare`), over MPI's world, from this one file. The
 * trainer's collectives go through parallel/comm.h; only parallel/ and this file name
 * MPI (scripts/check_includes.cmake checks it).
 *
 * Every function works without MPI started (or after it ended): a world of one rank. */
#ifndef TETRA_UTIL_HOST_H
#define TETRA_UTIL_HOST_H

#include <stddef.h>
#include <stdint.h>

/* Starts MPI (threads: the calling thread alone makes MPI calls) unless it runs already;
 * 1 when this call started it (the caller ends it with host_end), else 0. */
int host_start(int *argc, char ***argv);
/* Ends MPI if it runs and has not ended. */
void host_end(void);
/* Ends MPI at exit (a library's start: Python loads libtetra.so and never calls back). */
void host_end_at_exit(void);
int host_rank(void);  /* in the world; 0 without MPI */
int host_world(void); /* 1 without MPI */
/* Ranks on this node, and this rank's index among them. */
int host_node_ranks(void);
int host_node_rank(void);

/* Collectives over every rank (each rank calls them in the same order). */
int host_max_int(int v);
int host_min_int(int v);
void host_sum_u64(uint64_t *v, size_t n);
void host_bcast(void *buf, size_t bytes, int root);
/* Rank 0 receives every rank's text (NUL-free, len bytes) end to end in *all (malloc'd,
 * NUL-terminated), their lengths in lens[world]; NULL on the other ranks. 0, or -1 out of
 * memory with one rank (a rank 0 without memory ends the job: the others are sending). */
int host_gather_text(const char *mine, int len, char **all, int *lens);
/* Ends every rank of the job at once (a failure a rank cannot report to the others). */
void host_abort(int code) __attribute__((noreturn));
/* MPI's library name and version ("Open MPI v4.1.4"), cut at its first comma. */
void host_mpi_version(char *buf, size_t n);

#endif
