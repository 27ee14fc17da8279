/* nccl.h — the device memory NCCL takes for itself on one rank: a model, not a
 * measurement (docs/plan.md, "NCCL's own memory").
 *
 * With more than one rank on GPUs, the trainer creates an NCCL communicator for the
 * world and splits one more for every other set of ranks that a mesh group of more than
 * one rank spans (groups of the same ranks, e.g. dp_shard_cp, dp, dp_cp and the world
 * under FSDP alone, share one), each with its own resources (parallel/comm.c). NCCL allocates outside the backend's allocator, in
 * cuMem blocks of at least 2 MiB:
 *   - at creation, per channel, its peer and ring tables (and its NVLink SHARP tables
 *     on an NVSwitch node with three or more of the group's ranks: NCCL leaves NVLS off
 *     for two);
 *   - at a group's first collective on the device, one ring's buffers per channel (LL,
 *     LL128 and SIMPLE protocols), and on an NVSwitch node its NVLS buffers;
 *   - at the first send/receive with a peer, that peer's buffers on every channel it
 *     uses (all-to-all: every peer of the group).
 * NCCL connects lazily (NCCL_RUNTIME_CONNECT=1, its default since 2.22), so which groups
 * run what on the device decides the connections; the table in nccl.c says it for
 * the trainer as it is (host scalars go over MPI and connect nothing). The constants are
 * NCCL 2.28's defaults on H100-class nodes (NVLink 4, 8 GPUs, NVSwitch); the
 * environment variables that change them (NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS,
 * NCCL_NVLS_ENABLE, ...) are not read.
 */
#ifndef TETRA_PLAN_NCCL_H
#define TETRA_PLAN_NCCL_H

#include "parallel/mesh.h"

typedef struct {
    int communicators;  /* NCCL communicators on this rank */
    double setup_bytes; /* channel tables, from creation on */
    double ring_bytes;  /* ring buffers of the groups that run collectives on the device */
    double nvls_bytes;  /* NVLink SHARP buffers of those inside one NVSwitch node */
    double p2p_bytes;   /* send/receive buffers: all-to-all, pipeline, ring attention */
    double total_bytes; /* the sum: NCCL's device memory on this rank once every group has run */
} plan_nccl;

/* NCCL's device memory on world rank `rank` of mesh m, its ranks placed in order
 * gpus_per_node (>= 1) to a node. nvswitch: the node's GPUs are joined by NVSwitches
 * with multicast (NCCL's NVLS algorithm); cp_ring: context parallel passes K/V blocks
 * around the ring by send/receive (context_parallel_rotate_method = "alltoall").
 * All zero for a world of one rank: the trainer starts no NCCL then. Pure arithmetic. */
void plan_nccl_estimate(plan_nccl *out, const mesh *m, int rank, int gpus_per_node, int nvswitch, int cp_ring);

#endif
