/* prepare_dist.h — the ranks of `tetra data prepare` under mpirun / srun.
 *
 * Launched by an MPI launcher (its environment says so: Open MPI's OMPI_COMM_WORLD_SIZE,
 * MPICH's and Slurm's PMI_SIZE, PMIx's PMIX_RANK), prepare runs as one rank of several:
 * MPI is started and the few collective steps below go through it. Started by hand it is
 * one rank and MPI is never started. The exchanges go through the host control plane
 * (util/host.h). */
#ifndef TETRA_PREPARE_DIST_H
#define TETRA_PREPARE_DIST_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int rank, size;
    int mpi; /* MPI was started here (and is finalised by pd_finalize) */
} pd_world;

void pd_init(pd_world *w, int *argc, char ***argv);
void pd_finalize(pd_world *w);

/* 1 when `bad` is non-zero on any rank (collective). */
int pd_any(const pd_world *w, int bad);
/* Element-wise sum over the ranks, in place (collective). */
void pd_sum_u64(const pd_world *w, uint64_t *v, size_t n);
/* Rank 0's string (NUL-terminated, at most n bytes) to every rank (collective). */
void pd_bcast_str(const pd_world *w, char *buf, size_t n);

#endif
