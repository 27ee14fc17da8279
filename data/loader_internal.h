/* loader_internal.h — the loader's state, shared by loader.c (one corpus) and
 * loader_mix.c (a weighted mixture of corpora). Not part of the contract: loader.h is. */
#ifndef TETRA_LOADER_INTERNAL_H
#define TETRA_LOADER_INTERNAL_H

#include "data/loader.h"
#include "data/megatron.h"
#include "data/mixture.h"
#include "data/shard.h"

#define FEISTEL_ROUNDS 6

typedef struct {
    uint64_t n;
    unsigned half;
    uint64_t mask;
    uint64_t key[FEISTEL_ROUNDS];
} feistel;

void dl_feistel_init(feistel *f, uint64_t n, uint64_t seed, uint64_t epoch);
uint64_t dl_feistel_apply(const feistel *f, uint64_t i);

struct dl_loader {
    char *dir, *split;
    dl_config cfg;
    int n_shards;
    shard_file *shards;
    mg_dataset *mg;          /* instead of shards: a Megatron indexed dataset */
    uint64_t *starts;        /* [n_shards+1]: first stream index of each shard */
    uint64_t n_tokens, W, G; /* tokens, windows per epoch, windows per step */
    uint64_t position;
    uint32_t vocab;
    int64_t bos, eos;
    uint32_t fingerprint;
    int32_t *window; /* [seq_len+1] */
    feistel perm;
    uint64_t perm_epoch;
    int perm_ready;
    char error[640]; /* why dl_next returned -1 */
    /* a mixture (loader_mix.c): n_src > 0 sources, each a loader of its own */
    int n_src;
    dl_loader **src;
    char **src_name;
    mix_plan mix;
    uint64_t *counted;     /* looping: samples of each source before position */
    int cur_src, last_src; /* single pass: the source being read, the last batch's */
};

/* The window of the stream that global window g is (epoch order, shuffling). */
uint64_t dl_window_of(dl_loader *dl, uint64_t g);
/* Copy stream tokens [first, first+n), ids checked: 0, or -1 with dl->error set. */
int dl_read_stream(dl_loader *dl, uint64_t first, size_t n, int32_t *out);

/* The document ids of the window that starts at stream token `first` (dl_next_docs). */
void dl_window_docs(const dl_loader *dl, uint64_t first, const int32_t *window, int n, int32_t *ids);

int dl_mix_next(dl_loader *dl, int32_t *inputs, int32_t *labels, int32_t *docs);
void dl_mix_rewind(dl_loader *dl);
void dl_mix_free(dl_loader *dl);

#endif
