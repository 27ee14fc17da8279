// tests/unit/test_plan_nccl.c — the NCCL memory model of `tetra plan` (plan/nccl.h)
// against its formula worked by hand (docs/plan.md, "NCCL's own memory"), in MiB:
// - one rank: nothing;
// - FSDP 8 in one NVSwitch node: one communicator (dp_shard, dp_shard_cp, dp, dp_cp and
//   the world hold the same 8 ranks and share it), (3 x 32 + 2) x 2 MiB of tables + 17 x 2
//   MiB for NVLS; one ring (32 x 12 MiB) for fsdp (barriers go over MPI); NVLS buffers
//   (16 x 2 x 1 MiB x 8) for fsdp; and the same without NVSwitch;
// - TP 8 x FSDP 2 on two nodes: the tp all-to-all's buffers to 7 peers on 32 channels,
//   groups across nodes on 16 channels;
// - PP 2 across nodes: the network pools and the control blocks of one peer;
// - more groups of more than one rank, more communicators and more memory.
#include <stdio.h>

#include "plan/nccl.h"
#include "parallel/mesh.h"
#include "tests/check.h"

#define MIB (1024.0 * 1024.0)

static plan_nccl model(int pp, int rep, int shard, int cp, int tp, int gpn, int nvswitch, int cp_ring) {
    mesh m;
    char err[256];
    plan_nccl o = {0};
    const int world = pp * rep * shard * cp * tp;
    if (mesh_init(&m, world, pp, rep, shard, cp, tp, err, sizeof err)) {
        CHECK(0, "mesh_init: %s", err);
        return o;
    }
    plan_nccl_estimate(&o, &m, 0, gpn, nvswitch, cp_ring);
    return o;
}

static void expect(const char *what, const plan_nccl *o, int comms, double setup, double ring, double nvls,
                   double p2p) {
    CHECK(o->communicators == comms, "%s: %d communicators, want %d", what, o->communicators, comms);
    CHECK(o->setup_bytes == setup * MIB, "%s: setup %.1f MiB, want %.1f", what, o->setup_bytes / MIB, setup);
    CHECK(o->ring_bytes == ring * MIB, "%s: ring %.1f MiB, want %.1f", what, o->ring_bytes / MIB, ring);
    CHECK(o->nvls_bytes == nvls * MIB, "%s: nvls %.1f MiB, want %.1f", what, o->nvls_bytes / MIB, nvls);
    CHECK(o->p2p_bytes == p2p * MIB, "%s: p2p %.1f MiB, want %.1f", what, o->p2p_bytes / MIB, p2p);
    CHECK(o->total_bytes == (setup + ring + nvls + p2p) * MIB, "%s: total %.1f MiB", what, o->total_bytes / MIB);
}

int main(void) {
    plan_nccl o = model(1, 1, 1, 1, 1, 8, 1, 0);
    expect("one rank", &o, 0, 0, 0, 0, 0);

    const double node_tables = (3 * 32 + 2) * 2, net_tables = (3 * 16 + 2) * 2, nvls_tables = 17 * 2;
    o = model(1, 1, 8, 1, 1, 8, 1, 0);
    expect("fsdp 8, NVSwitch", &o, 1, node_tables + nvls_tables, 32 * 12, 16 * 2 * 8, 0);
    o = model(1, 1, 8, 1, 1, 8, 0, 0);
    expect("fsdp 8, no NVSwitch", &o, 1, node_tables, 32 * 12, 0, 0);

    /* the world spans the nodes with 8 ranks on each (NVLS tables); dp_shard (with
     * dp_shard_cp, dp and dp_cp, the same 2 ranks): two nodes; tp: 8 ranks in one node */
    o = model(1, 1, 2, 1, 8, 8, 1, 0);
    expect("tp 8 x fsdp 2", &o, 3, (net_tables + nvls_tables) + net_tables + node_tables + nvls_tables,
           32 * 12 + 16 * 12, 16 * 2 * 8, 7 * 32 * 12);

    /* one peer over the network (the world is the pipeline group): 2 channels x send and
     * receive control blocks, and two pools of 16 channels x 16 slots x 128 KiB */
    o = model(2, 1, 1, 1, 1, 1, 1, 0);
    expect("pp 2 over the network", &o, 1, net_tables, 0, 0, 2 * 2 * 2 + 2 * 16 * 2);

    /* ring attention: cp sends to its two neighbours; all-gather does not */
    plan_nccl ag = model(1, 1, 1, 4, 1, 8, 1, 0), ring = model(1, 1, 1, 4, 1, 8, 1, 1);
    CHECK(ag.p2p_bytes == 0 && ring.p2p_bytes == 2 * 32 * 12 * MIB, "cp 4 send/receive: %.0f, %.0f MiB",
          ag.p2p_bytes / MIB, ring.p2p_bytes / MIB);

    /* more communicators, more memory */
    plan_nccl f4 = model(1, 1, 4, 1, 1, 8, 1, 0), h22 = model(1, 2, 2, 1, 1, 8, 1, 0);
    plan_nccl h22t2 = model(1, 2, 2, 1, 2, 8, 1, 0);
    CHECK(f4.communicators < h22.communicators && h22.communicators < h22t2.communicators, "communicators %d %d %d",
          f4.communicators, h22.communicators, h22t2.communicators);
    CHECK(f4.total_bytes < h22.total_bytes && h22.total_bytes < h22t2.total_bytes, "totals %.0f %.0f %.0f MiB",
          f4.total_bytes / MIB, h22.total_bytes / MIB, h22t2.total_bytes / MIB);

    printf("test_plan_nccl: %d checks, %d failed (fsdp 8: %.2f GiB; tp 8 x fsdp 2: %.2f GiB)\n", checks, failures,
           model(1, 1, 8, 1, 1, 8, 1, 0).total_bytes / (1024 * MIB),
           model(1, 1, 2, 1, 8, 8, 1, 0).total_bytes / (1024 * MIB));
    return failures ? 1 : 0;
}
