/* mesh.c — rank <-> coordinate arithmetic of the device mesh (see mesh.h). */
#include "parallel/mesh.h"

#include <stdio.h>

static const char *const dim_names[MESH_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

const char *mesh_dim_name(int dim) { return dim >= 0 && dim < MESH_NDIMS ? dim_names[dim] : "?"; }

unsigned mesh_group_dims(mesh_group_id g) {
    switch (g) {
    case MESH_G_PP: return MESH_BIT(MESH_PP);
    case MESH_G_DP_REPLICATE: return MESH_BIT(MESH_DP_REPLICATE);
    case MESH_G_DP_SHARD: return MESH_BIT(MESH_DP_SHARD);
    case MESH_G_CP: return MESH_BIT(MESH_CP);
    case MESH_G_TP: return MESH_BIT(MESH_TP);
    case MESH_G_FSDP: return MESH_BIT(MESH_DP_SHARD) | MESH_BIT(MESH_CP);
    case MESH_G_BATCH: return MESH_BIT(MESH_DP_REPLICATE) | MESH_BIT(MESH_DP_SHARD);
    case MESH_G_LOSS: return MESH_BIT(MESH_DP_REPLICATE) | MESH_BIT(MESH_DP_SHARD) | MESH_BIT(MESH_CP);
    case MESH_G_WORLD: return (1u << MESH_NDIMS) - 1;
    case MESH_N_GROUPS: break;
    }
    return 0;
}

const char *mesh_group_name(mesh_group_id g) {
    switch (g) {
    case MESH_G_PP: return "pp";
    case MESH_G_DP_REPLICATE: return "dp_replicate";
    case MESH_G_DP_SHARD: return "dp_shard";
    case MESH_G_CP: return "cp";
    case MESH_G_TP: return "tp";
    case MESH_G_FSDP: return "dp_shard_cp";
    case MESH_G_BATCH: return "dp";
    case MESH_G_LOSS: return "dp_cp";
    case MESH_G_WORLD: return "world";
    case MESH_N_GROUPS: break;
    }
    return "?";
}

int mesh_init(mesh *m, int world, int pp, int dp_replicate, int dp_shard, int cp, int tp, char *err, size_t errlen) {
    if (world < 1) {
        snprintf(err, errlen, "mesh: world size must be >= 1 (got %d)", world);
        return -1;
    }
    const int deg[MESH_NDIMS] = {pp, dp_replicate, dp_shard, cp, tp};
    long long others = 1;
    for (int d = 0; d < MESH_NDIMS; d++) {
        if (d == MESH_DP_SHARD) continue;
        if (deg[d] < 1) {
            snprintf(err, errlen, "mesh: %s degree must be >= 1 (got %d)", dim_names[d], deg[d]);
            return -1;
        }
        others *= deg[d];
    }
    int shard = dp_shard;
    if (shard == -1) {
        if (world % others != 0) {
            snprintf(err, errlen,
                     "mesh: world size %d is not divisible by pp %d x dp_replicate %d x cp %d x tp %d = %lld, so "
                     "dp_shard = -1 cannot take the rest",
                     world, pp, dp_replicate, cp, tp, others);
            return -1;
        }
        shard = (int)(world / others);
    } else if (shard < 1) {
        snprintf(err, errlen, "mesh: dp_shard degree must be -1 or >= 1 (got %d)", shard);
        return -1;
    }
    if (others * shard != world) {
        snprintf(err, errlen,
                 "mesh: pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d = %lld ranks, but the world size is %d",
                 pp, dp_replicate, shard, cp, tp, others * shard, world);
        return -1;
    }
    m->world = world;
    for (int d = 0; d < MESH_NDIMS; d++) m->size[d] = deg[d];
    m->size[MESH_DP_SHARD] = shard;
    return 0;
}

void mesh_coords(const mesh *m, int rank, int coord[MESH_NDIMS]) {
    for (int d = MESH_NDIMS - 1; d >= 0; d--) {
        coord[d] = rank % m->size[d];
        rank /= m->size[d];
    }
}

int mesh_rank(const mesh *m, const int coord[MESH_NDIMS]) {
    int r = 0;
    for (int d = 0; d < MESH_NDIMS; d++) r = r * m->size[d] + coord[d];
    return r;
}

int mesh_group_size(const mesh *m, unsigned dims) {
    int n = 1;
    for (int d = 0; d < MESH_NDIMS; d++)
        if (dims & MESH_BIT(d)) n *= m->size[d];
    return n;
}

int mesh_group_rank(const mesh *m, unsigned dims, int rank) {
    int c[MESH_NDIMS], r = 0;
    mesh_coords(m, rank, c);
    for (int d = 0; d < MESH_NDIMS; d++)
        if (dims & MESH_BIT(d)) r = r * m->size[d] + c[d];
    return r;
}

int mesh_group_color(const mesh *m, unsigned dims, int rank) {
    int c[MESH_NDIMS], r = 0;
    mesh_coords(m, rank, c);
    for (int d = 0; d < MESH_NDIMS; d++)
        if (!(dims & MESH_BIT(d))) r = r * m->size[d] + c[d];
    return r;
}

void mesh_group_members(const mesh *m, unsigned dims, int rank, int *out) {
    int base[MESH_NDIMS], c[MESH_NDIMS];
    mesh_coords(m, rank, base);
    const int n = mesh_group_size(m, dims);
    for (int i = 0; i < n; i++) {
        /* decode i row-major over the group's dimensions, keep the others */
        int rem = i;
        for (int d = MESH_NDIMS - 1; d >= 0; d--) {
            if (dims & MESH_BIT(d)) {
                c[d] = rem % m->size[d];
                rem /= m->size[d];
            } else {
                c[d] = base[d];
            }
        }
        out[i] = mesh_rank(m, c);
    }
}

void mesh_describe(const mesh *m, char *buf, size_t n) {
    snprintf(buf, n, "world %d = pp %d x dp_replicate %d x dp_shard %d x cp %d x tp %d", m->world, m->size[MESH_PP],
             m->size[MESH_DP_REPLICATE], m->size[MESH_DP_SHARD], m->size[MESH_CP], m->size[MESH_TP]);
}
