/* mesh.h — the device mesh: world = pp x dp_replicate x dp_shard x cp x tp.
 *
 * Ranks are laid out row-major over the five dimensions in that order, tp
 * innermost, so the ranks of one tensor-parallel group are neighbours (one
 * host, NVLink):
 *
 *   rank = (((pp_i * R + rep_i) * S + shard_i) * C + cp_i) * T + tp_i
 *
 * A process group is a set of mesh dimensions: the ranks that share every
 * coordinate outside the set. Its members are ordered row-major over the
 * set's dimensions (outer to inner), which is how TorchTitan flattens mesh
 * dimensions ("dp_shard_cp" = dp_shard x cp, index shard_i * C + cp_i).
 *
 * Everything here is pure arithmetic (no MPI), so layouts are testable
 * anywhere; parallel/comm.h turns groups into communicators.
 */
#ifndef TETRA_PARALLEL_MESH_H
#define TETRA_PARALLEL_MESH_H

#include <stddef.h>

enum { MESH_PP = 0, MESH_DP_REPLICATE, MESH_DP_SHARD, MESH_CP, MESH_TP, MESH_NDIMS };

#define MESH_BIT(d) (1u << (d))

/* The groups the engine uses. */
typedef enum {
    MESH_G_PP = 0,
    MESH_G_DP_REPLICATE,
    MESH_G_DP_SHARD,
    MESH_G_CP,
    MESH_G_TP,
    MESH_G_FSDP,  /* dp_shard x cp: FSDP shards parameters over it ("dp_shard_cp") */
    MESH_G_BATCH, /* dp_replicate x dp_shard: ranks that read different data ("dp") */
    MESH_G_LOSS,  /* dp_replicate x dp_shard x cp: loss and token counts ("dp_cp") */
    MESH_G_WORLD,
    MESH_N_GROUPS
} mesh_group_id;

typedef struct {
    int world;
    int size[MESH_NDIMS];
} mesh;

/* Resolve and check a layout for `world` ranks. dp_shard = -1 takes what the
 * other degrees leave (TorchTitan). Every other degree must be >= 1 and the
 * product must equal world. Returns 0, or -1 with a message in err. */
int mesh_init(mesh *m, int world, int pp, int dp_replicate, int dp_shard, int cp, int tp, char *err, size_t errlen);

const char *mesh_dim_name(int dim);           /* "pp", "dp_replicate", ... */
unsigned mesh_group_dims(mesh_group_id g);    /* set of MESH_BIT(dim) */
const char *mesh_group_name(mesh_group_id g); /* "dp_shard_cp", "dp", "dp_cp", "world", ... */

void mesh_coords(const mesh *m, int rank, int coord[MESH_NDIMS]);
int mesh_rank(const mesh *m, const int coord[MESH_NDIMS]);

/* Number of ranks in a group over `dims` (a set of MESH_BIT). */
int mesh_group_size(const mesh *m, unsigned dims);
/* This rank's index inside its group (row-major over dims). */
int mesh_group_rank(const mesh *m, unsigned dims, int rank);
/* Which of the world / group_size groups over `dims` holds the rank
 * (row-major over the other dimensions): the colour for MPI_Comm_split. */
int mesh_group_color(const mesh *m, unsigned dims, int rank);
/* World ranks of the rank's group, in group order (out[mesh_group_size]). */
void mesh_group_members(const mesh *m, unsigned dims, int rank, int *out);

/* "world 8 = pp 1 x dp_replicate 2 x dp_shard 4 x cp 1 x tp 1" */
void mesh_describe(const mesh *m, char *buf, size_t n);

#endif
