/* nccl.c — NCCL's own device memory per rank (nccl.h). The constants are
 * NCCL 2.28's (github.com/NVIDIA/nccl at v2.28.9-1, the version this build links);
 * docs/plan.md derives each and cites the reports that check them. */
#include "plan/nccl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB (1024.0 * 1024.0)

/* cuMem allocation granularity on H100: every device allocation NCCL makes is rounded up
 * to it (src/include/alloc.h, CU_MEM_ALLOC_GRANULARITY_MINIMUM; CUDA_IPC_MIN for p2p). */
#define NCCL_GRAIN (2.0 * MIB)
/* NCCL_STEPS slots per buffer (src/include/device.h). */
#define NCCL_STEPS 8.0
/* Receive buffers of one connection, one per protocol (src/init.cc, DEFAULT_*BUFFSIZE):
 * LL: 8 lines x 512 threads x 8 steps x 16 bytes; LL128: 120 elements x 640 threads x 8
 * steps x 8 bytes; SIMPLE: NCCL_BUFFSIZE, 4 MiB. */
#define NCCL_LL_BYTES (8.0 * 512.0 * NCCL_STEPS * 16.0)
#define NCCL_LL128_BYTES (120.0 * 640.0 * NCCL_STEPS * 8.0)
#define NCCL_SIMPLE_BYTES (4.0 * MIB)
/* Channels: inside an NVSwitch node NCCL runs twice the 16 rings its search finds, and
 * sends to each peer on as many; across nodes 16 rings, and 2 channels per peer. */
#define NCCL_CHANNELS_NODE 32
#define NCCL_CHANNELS_NET 16
#define NCCL_P2P_PEER_CHANNELS_NET 2
/* NVLS (src/transport/nvls.cc, sm90): 16 channels, 2 buffers per channel and head (one
 * head per rank of the node), each NCCL_NVLS_CHUNKSIZE 128 KiB x 8 steps. */
#define NCCL_NVLS_CHANNELS 16
#define NCCL_NVLS_BUFFER (128.0 * 1024.0 * NCCL_STEPS)
/* Send/receive over the network: one pool per direction of NCCL_SHARED_STEPS 16 slots of
 * NCCL_P2P_NET_CHUNKSIZE 128 KiB per channel (src/transport/net.cc). */
#define NCCL_NET_POOL_PER_CHANNEL (16.0 * 128.0 * 1024.0)

/* What the trainer runs on each group on the device: collectives (bandwidth-bound ones
 * may take NVLS), send/receive with every peer (all-to-all) or with its ring neighbours. */
enum { USE_COLL = 1, USE_NVLS = 2, USE_P2P_ALL = 4, USE_P2P_RING = 8 };

static unsigned group_use(mesh_group_id g, int cp_ring) {
    switch (g) {
    case MESH_G_PP: return USE_P2P_RING;                                        /* activations between stages */
    case MESH_G_DP_REPLICATE: return USE_COLL | USE_NVLS;                       /* HSDP gradient all-reduce */
    case MESH_G_CP: return USE_COLL | USE_NVLS | (cp_ring ? USE_P2P_RING : 0u); /* K/V */
    case MESH_G_TP: return USE_COLL | USE_NVLS | USE_P2P_ALL;                   /* reduce-scatter as all-to-all */
    case MESH_G_FSDP: return USE_COLL | USE_NVLS;                               /* all-gather, reduce-scatter */
    default: return 0; /* dp_shard alone, batch, loss, world: host scalars and barriers over MPI */
    }
}

/* One connection to a peer on one channel, as this rank holds it: its receive buffers
 * for the three protocols in one block (H100 writes into the receiver; P2P read is
 * sm80's), and the control block of its send side. */
static double connection_bytes(void) {
    const double recv = NCCL_LL_BYTES + NCCL_LL128_BYTES + NCCL_SIMPLE_BYTES + 1.0; /* + its header */
    return NCCL_GRAIN * ceil(recv / NCCL_GRAIN) + NCCL_GRAIN;
}

typedef struct {
    int size, local; /* ranks in the group; of them, on this rank's node */
    int index;       /* this rank's place in the group */
    int *members;
} group_at;

static int same_node(int a, int b, int gpn) { return a / gpn == b / gpn; }

/* Send/receive buffers with `peers` (all, or the two ring neighbours). */
static double p2p_bytes(const group_at *ga, int rank, int gpn, int all, int channels_node) {
    const int n = ga->size, spans = ga->local < n;
    const int chans = spans ? NCCL_P2P_PEER_CHANNELS_NET : channels_node;
    double b = 0;
    int remote = 0;
    for (int j = 1; j < n; j++) {
        const int peer = ga->members[(ga->index + j) % n];
        if (!all && j != 1 && j != n - 1) continue; /* ring: next and previous */
        if (same_node(rank, peer, gpn)) b += chans * connection_bytes();
        else {
            b += chans * 2.0 * NCCL_GRAIN; /* send and receive control blocks; data goes through the pools */
            remote = 1;
        }
    }
    if (remote) b += 2.0 * NCCL_CHANNELS_NET * NCCL_NET_POOL_PER_CHANNEL;
    return b;
}

/* Adds one communicator over group `ga` that runs `use` on the device. */
static void add_comm(plan_nccl *o, const group_at *ga, unsigned use, int rank, int gpn, int nvswitch) {
    /* NCCL turns NVLS off for a communicator with two or fewer GPUs on the node
     * (ncclNvlsInit: gpuCount <= 2) */
    const int spans = ga->local < ga->size, nvls = nvswitch && ga->local >= 3;
    const int chans = spans ? NCCL_CHANNELS_NET : NCCL_CHANNELS_NODE;
    o->communicators++;
    /* three tables per channel (shared peers, peers, ring order) and the device
     * communicator with its rank map; NVLS: one table per NVLS channel and the credits */
    o->setup_bytes += (3.0 * chans + 2.0) * NCCL_GRAIN + (nvls ? (NCCL_NVLS_CHANNELS + 1.0) * NCCL_GRAIN : 0.0);
    if (use & USE_COLL) o->ring_bytes += chans * connection_bytes();
    /* NVLS all-gather and reduce-scatter run inside one node only */
    if ((use & USE_NVLS) && nvls && !spans) o->nvls_bytes += NCCL_NVLS_CHANNELS * 2.0 * NCCL_NVLS_BUFFER * ga->local;
    if (use & (USE_P2P_ALL | USE_P2P_RING))
        o->p2p_bytes += p2p_bytes(ga, rank, gpn, (use & USE_P2P_ALL) != 0, NCCL_CHANNELS_NODE);
}

static void group_init(group_at *ga, const mesh *m, unsigned dims, int rank, int gpn, int *buf) {
    ga->size = mesh_group_size(m, dims);
    ga->members = buf;
    mesh_group_members(m, dims, rank, buf);
    ga->local = 0;
    ga->index = 0;
    for (int i = 0; i < ga->size; i++) {
        ga->local += same_node(rank, buf[i], gpn);
        if (buf[i] == rank) ga->index = i;
    }
}

/* The dimensions that make a group's membership: those of more than one rank (groups
 * with the same ones have the same ranks and share one communicator, parallel/comm.c). */
static unsigned member_dims(const mesh *m, mesh_group_id g) {
    unsigned d = 0;
    for (int k = 0; k < MESH_NDIMS; k++)
        if ((mesh_group_dims(g) & MESH_BIT(k)) && m->size[k] > 1) d |= MESH_BIT(k);
    return d;
}

void plan_nccl_estimate(plan_nccl *out, const mesh *m, int rank, int gpus_per_node, int nvswitch, int cp_ring) {
    memset(out, 0, sizeof *out);
    if (m->world <= 1) return;
    const int gpn = gpus_per_node > 0 ? gpus_per_node : 1;
    int *buf = malloc((size_t)m->world * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "tetra plan: out of host memory\n");
        abort();
    }
    /* one communicator per set of ranks, the world's first; each runs what all the
     * groups of its ranks run */
    int owner[MESH_N_GROUPS];
    unsigned use[MESH_N_GROUPS] = {0};
    for (int g = 0; g < MESH_N_GROUPS; g++) {
        const unsigned d = member_dims(m, (mesh_group_id)g);
        owner[g] = -1;
        if (mesh_group_size(m, mesh_group_dims((mesh_group_id)g)) <= 1) continue;
        owner[g] = d == member_dims(m, MESH_G_WORLD) ? MESH_G_WORLD : g;
        for (int j = 0; j < g && owner[g] == g; j++)
            if (owner[j] >= 0 && member_dims(m, (mesh_group_id)j) == d) owner[g] = owner[j];
        use[owner[g]] |= group_use((mesh_group_id)g, cp_ring);
    }
    group_at ga;
    /* the world communicator every split comes from */
    group_init(&ga, m, mesh_group_dims(MESH_G_WORLD), rank, gpn, buf);
    add_comm(out, &ga, use[MESH_G_WORLD], rank, gpn, nvswitch);
    for (int g = 0; g < MESH_N_GROUPS; g++) {
        if (g == MESH_G_WORLD || owner[g] != g) continue;
        group_init(&ga, m, mesh_group_dims((mesh_group_id)g), rank, gpn, buf);
        add_comm(out, &ga, use[g], rank, gpn, nvswitch);
    }
    free(buf);
    out->total_bytes = out->setup_bytes + out->ring_bytes + out->nvls_bytes + out->p2p_bytes;
}
