/* comm_stage.c — the MPI backend on device buffers (comm_options.staging).
 *
 * NCCL refuses two ranks of one communicator on one GPU, so ranks that share a device
 * communicate through MPI, which needs host memory: each operation copies its input
 * into a page-locked block, MPI runs on the block, and when the operation completes
 * its result is copied back. The copies go through the ops backend's functions (the
 * staging table), so this module needs no CUDA, and the CUDA-kernel simulator runs
 * the same path. Blocks are reused: after the first step every operation finds one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/comm_internal.h"

struct commi_stage_block {
    void *p;
    size_t bytes;
    int busy;
};

int commi_staged(const comm_request *r) {
    const comm_world *w = r->g->w;
    return !r->host && w->opt.backend == COMM_BACKEND_MPI && w->opt.staging != NULL;
}

/* The smallest free block that holds `bytes`, else a new one; its index (a request
 * keeps the index, which survives the pool's growth). */
static int take_block(comm_request *r, size_t bytes) {
    comm_world *w = r->g->w;
    int best = -1;
    for (int i = 0; i < w->n_stage; i++) {
        const struct commi_stage_block *b = &w->stage_pool[i];
        if (!b->busy && b->bytes >= bytes && (best < 0 || b->bytes < w->stage_pool[best].bytes)) best = i;
    }
    if (best >= 0) {
        w->stage_pool[best].busy = 1;
        return best;
    }
    if (w->n_stage == w->cap_stage) {
        int cap = w->cap_stage ? 2 * w->cap_stage : 8;
        struct commi_stage_block *np = realloc(w->stage_pool, (size_t)cap * sizeof *np);
        if (!np) commi_fail(r, "out of host memory for the staging pool");
        w->stage_pool = np;
        w->cap_stage = cap;
    }
    /* rounded up to 1 MiB, so blocks of nearby sizes serve each other */
    const size_t mib = (size_t)1 << 20, size = (bytes + mib - 1) / mib * mib;
    void *p = w->opt.staging->host_alloc(size);
    if (!p) {
        char what[128];
        snprintf(what, sizeof what, "cannot allocate %.1f MiB of page-locked host memory for staging",
                 (double)size / (double)mib);
        commi_fail(r, what);
    }
    struct commi_stage_block *b = &w->stage_pool[w->n_stage];
    b->p = p;
    b->bytes = size;
    b->busy = 1;
    return w->n_stage++;
}

/* Bytes of the operation's send and receive buffers on this rank. */
static void extents(const comm_request *r, size_t *send_bytes, size_t *recv_bytes) {
    const size_t b = r->count * comm_dtype_size(r->dtype), p = (size_t)r->g->size;
    size_t s = 0, v = 0;
    switch (r->kind) {
    case COMMK_ALL_REDUCE: v = b; break; /* in place: the receive half is the buffer */
    case COMMK_BROADCAST: v = b; break;
    case COMMK_REDUCE_SCATTER:
        s = p * b;
        v = b;
        break;
    case COMMK_ALL_GATHER: v = p * b; break; /* the send goes to this rank's block of it */
    case COMMK_ALL_TO_ALL:
        s = p * b;
        v = p * b;
        break;
    case COMMK_SEND: s = b; break;
    case COMMK_RECV: v = b; break;
    case COMMK_SENDRECV:
        s = b;
        v = b;
        break;
    case COMMK_BARRIER: break;
    }
    *send_bytes = s;
    *recv_bytes = v;
}

void commi_stage_in(comm_request *r, void **recv, const void **send, int peer) {
    const comm_device_staging *st = r->g->w->opt.staging;
    size_t sb = 0, rb = 0;
    extents(r, &sb, &rb);
    r->stage_block = 0;
    r->recv_bytes = 0;
    if (sb + rb == 0) return;
    const size_t align = 256, soff = (rb + align - 1) / align * align;
    const int i = take_block(r, soff + sb);
    r->stage_block = i + 1;
    char *base = r->g->w->stage_pool[i].p, *hrecv = base, *hsend = base + soff;
    const size_t es = comm_dtype_size(r->dtype), b = r->count * es;
    switch (r->kind) {
    case COMMK_ALL_REDUCE:
        st->to_host(hrecv, *recv, b);
        *send = hrecv;
        break;
    case COMMK_BROADCAST:
        if (r->g->rank == peer) st->to_host(hrecv, *recv, b);
        *send = hrecv;
        break;
    case COMMK_ALL_GATHER:
        st->to_host(hrecv + (size_t)r->g->rank * b, *send, b);
        *send = hrecv + (size_t)r->g->rank * b; /* in place */
        break;
    default:
        if (sb) st->to_host(hsend, *send, sb);
        *send = sb ? hsend : NULL;
        break;
    }
    /* a broadcast's root keeps its buffer; everyone else receives into it */
    if (rb && !(r->kind == COMMK_BROADCAST && r->g->rank == peer)) {
        r->dev_recv = *recv;
        r->host_recv = hrecv;
        r->recv_bytes = rb;
    }
    *recv = rb ? hrecv : NULL;
}

void commi_stage_out(comm_request *r) {
    if (!r->stage_block) return;
    comm_world *w = r->g->w;
    if (r->recv_bytes) w->opt.staging->to_device(r->dev_recv, r->host_recv, r->recv_bytes);
    w->stage_pool[r->stage_block - 1].busy = 0;
    r->stage_block = 0;
    r->recv_bytes = 0;
}

void commi_stage_free(comm_world *w) {
    for (int i = 0; i < w->n_stage; i++) w->opt.staging->host_release(w->stage_pool[i].p);
    free(w->stage_pool);
    w->stage_pool = NULL;
    w->n_stage = w->cap_stage = 0;
}
