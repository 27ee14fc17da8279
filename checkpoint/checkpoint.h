/* checkpoint.h — sharded save and resharding load of distributed tensors.
 *
 * The engine hands over groups of distributed tensors (parallel/dtensor.h:
 * name, global shape, this rank's piece and where it lies in local storage)
 * plus JSON objects for the rest of the training state; this module never
 * knows the model. Format: checkpoint/ckpt_format.h. Protocol:
 *
 *   save (collective over MPI_COMM_WORLD; every rank calls ckpt_save)
 *     1. rank 0 creates <dir>/step-N.tmp-<pid of rank 0>; all ranks learn it did.
 *     2. each writing rank (one replica of every piece: dp_replicate index 0)
 *        writes its pieces to rank_<world rank>.bin there, with a CRC-32C per
 *        chunk, and fsyncs the file. Synchronous mode does this inside
 *        ckpt_save; async mode copies the pieces to a host staging buffer
 *        (the only time training stalls) and a background thread writes and
 *        fsyncs while training goes on.
 *     3. finalise (ckpt_save in sync mode; ckpt_poll in async mode once every
 *        rank's writer is done): the ranks' chunk lists and statuses are
 *        gathered at rank 0, which writes metadata.json, fsyncs it and the
 *        folder, renames step-N.tmp-<pid> to step-N, fsyncs the parent, then
 *        prunes to keep_latest_k complete checkpoints (never the new one), and
 *        broadcasts the outcome. Any rank's failure fails the save on every
 *        rank with that rank's message (which names the file); the temporary
 *        folder is removed and nothing is pruned.
 *   A checkpoint is complete iff step-N/metadata.json exists. A kill at any
 *   moment leaves either the previous state or a step-N.tmp-* folder, which
 *   readers ignore and ckpt_cleanup_stale removes at the next start.
 *
 *   async: at most one save in flight. ckpt_poll runs at every step boundary:
 *   one all-reduce of "my writer is done" over the world while a save is in
 *   flight; when all are done it finalises. A write error surfaces at the
 *   first step boundary after it happened, naming the file. ckpt_save waits
 *   for (and finalises) the previous save before staging a new one.
 *
 *   load: every rank reads metadata.json itself, then for each piece it holds
 *   reads the overlapping parts of whichever chunks (from any rank's file)
 *   cover it, verifying each chunk's CRC-32C before use. So any layout loads
 *   any other's checkpoint (different FSDP degree, HSDP, a single rank).
 *
 * MPI is used only when it is initialised and the world has more than one
 * rank (the command-line tools run without it). All MPI calls come from the
 * thread that calls these functions; the writer thread does file I/O only.
 */
#ifndef TETRA_CHECKPOINT_H
#define TETRA_CHECKPOINT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "checkpoint/ckpt_format.h"
#include "kernels/ops.h"
#include "parallel/dtensor.h"

/* Tensors that share local storage: piece.local_offset indexes `storage`
 * (backend memory, float32). Saved as prefix + name. */
typedef struct {
    const char *prefix; /* "model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/" */
    const dt_tensor *tensors;
    int n;
    float *storage;
    int host; /* storage is host memory (CPU offload), read and written without the op table */
} ckpt_group;

/* ---- saving ---------------------------------------------------------------- */

typedef struct {
    const char *dir; /* the checkpoint folder: <dump_folder>/<checkpoint.folder> */
    const tetra_ops *ops;
    int rank, world;   /* in MPI_COMM_WORLD */
    int writer;        /* this rank writes its pieces (1 for one replica of each) */
    int async;         /* writes on a background thread */
    int pinned;        /* async_with_pinned_mem (see docs/checkpoint.md) */
    int keep_latest_k; /* 0 = keep all */
} ckpt_saver_options;

/* A final save published in another format: convert(step_dir, out_dir, ctx, ...) reads
 * the complete tetra checkpoint in step_dir and writes out_dir, which is then published
 * as step-N in its place. The model provides it (Hugging Face safetensors:
 * models/llama3/hf_checkpoint.h), so this module never knows the model. */
typedef int (*ckpt_convert_fn)(const char *step_dir, const char *out_dir, const void *ctx, char *err, size_t errlen);

typedef struct {
    int64_t step;
    const ckpt_group *groups;
    int n_groups;
    tetra_dtype dtype; /* stored element type (float32; export dtype for model-only saves) */
    int model_only;
    const json_t *state;     /* rank 0's: top-level objects stored verbatim (train_state, ...) */
    ckpt_convert_fn convert; /* NULL: step-N is the tetra checkpoint itself */
    const void *convert_ctx;
    int sync; /* synchronous even in async mode (the last save of a run) */
} ckpt_save_request;

typedef struct {
    int64_t step;
    double stage_s;       /* async: copying to the staging buffer (the training stall) */
    double write_s;       /* writing + fsync (sync: the stall; async: in the background) */
    double total_s;       /* from ckpt_save to the rename */
    uint64_t bytes;       /* this rank's file */
    uint64_t total_bytes; /* every rank's files (rank 0, after finalising) */
} ckpt_save_report;

typedef struct ckpt_saver ckpt_saver;

/* Collective. NULL with a message on failure. */
ckpt_saver *ckpt_saver_create(const ckpt_saver_options *o, char *err, size_t errlen);
/* Not collective: a save still in flight is abandoned once its writer thread
 * stops (call ckpt_poll(s, 1, ...) first to complete it). */
void ckpt_saver_free(ckpt_saver *s);

/* Collective. Sync: returns when step-N is complete. Async: returns after
 * staging (and after finalising the previous save). 0, or -1 with the same
 * message on every rank. */
int ckpt_save(ckpt_saver *s, const ckpt_save_request *r, char *err, size_t errlen);
/* Collective, at every step boundary (cheap when nothing is in flight).
 * wait = 1 blocks until the save in flight is complete. Returns 1 when a save
 * was completed by this call, 0 when nothing completed, -1 with a message
 * (the same on every rank) when the save failed. */
int ckpt_poll(ckpt_saver *s, int wait, char *err, size_t errlen);
int ckpt_in_flight(const ckpt_saver *s);
/* The report of the last completed save. */
ckpt_save_report ckpt_last_report(const ckpt_saver *s);
/* Seconds the last ckpt_save spent staging (async) — the training stall. */
double ckpt_last_stage_s(const ckpt_saver *s);

/* ---- folders ------------------------------------------------------------- */

typedef enum { CKPT_COMPLETE = 0, CKPT_HF, CKPT_DAMAGED } ckpt_kind;

typedef struct {
    int64_t step;
    ckpt_kind kind; /* metadata.json present / an HF export / neither */
    int model_only; /* complete, holding model weights only */
    char name[64];  /* "step-12" */
} ckpt_entry;

/* Step folders of dir (never *.tmp-* ones), ascending by step. 0 with *n = 0
 * when dir does not exist. */
int ckpt_scan(const char *dir, ckpt_entry **out, int *n, char *err, size_t errlen);
/* Remove step-*.tmp-* folders left by runs that died mid-save (rank 0, at start). Returns how many.
 * A folder whose owner (the pid its name ends with) still runs tetra on this host is a save in
 * progress of another live run: it is kept, and named in kept ("step-8.tmp-4711 (process 4711)"). */
int ckpt_cleanup_stale(const char *dir);
int ckpt_cleanup_stale_report(const char *dir, char *kept, size_t keptlen);
/* The pid that named a step-*.tmp-* folder when it is alive on this host as tetra (not this
 * process), else 0. */
long ckpt_tmp_live_owner(const char *name);
/* The checkpoint to resume from: load_step >= 0 picks that step, -1 the newest
 * step folder (Hugging Face exports skipped). A newest checkpoint that holds
 * model weights only (a final last_save_model_only save, step > 0) gives way
 * to the newest one with the full training state, if there is one (a line in
 * note says so; note may be NULL). 1 with the folder's path in out, 0 when
 * there is none, -1 when the chosen folder is not a complete checkpoint (the
 * message names its missing metadata.json). */
int ckpt_find(const char *dir, int64_t load_step, char *out, size_t n, char *note, size_t notelen, char *err,
              size_t errlen);
/* rm -rf of a folder; 0 or -1. */
int ckpt_remove_tree(const char *path);

/* ---- reading ------------------------------------------------------------- */

typedef struct ckpt_reader ckpt_reader;

/* Reads and validates metadata.json and checks every file is there with exactly
 * its recorded size (a truncated file is named with the first tensor it cuts, a
 * longer one with its recorded size), that a folder named step-N holds step N,
 * and the training counters (ck_meta_check_state). */
ckpt_reader *ckpt_reader_open(const char *step_dir, char *err, size_t errlen);
void ckpt_reader_close(ckpt_reader *r);
const ck_meta *ckpt_reader_meta(const ckpt_reader *r);
const char *ckpt_reader_dir(const ckpt_reader *r);
/* Fill every piece of the group from the checkpoint (converting to float32).
 * A missing tensor or a shape mismatch names the tensor; a checksum mismatch
 * or a short read names the file and the tensor. */
int ckpt_reader_load(ckpt_reader *r, const ckpt_group *g, const tetra_ops *ops, char *err, size_t errlen);
/* A region (see ckpt_format.h) of tensor t into host memory, float32. */
int ckpt_reader_read_region(ckpt_reader *r, const ck_tensor *t, const ck_region *want, float *out, char *err,
                            size_t errlen);
/* Read chunk c of tensor t and check its CRC. */
int ckpt_reader_verify_chunk(ckpt_reader *r, const ck_tensor *t, int c, char *err, size_t errlen);

/* ---- agreement ------------------------------------------------------------ */

/* Collective: -1 on every rank when any rank passes failed != 0, with the
 * lowest failing rank's err copied to every rank; 0 otherwise. */
int ckpt_agree(int failed, char *err, size_t errlen);

#endif
