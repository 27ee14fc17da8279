/* prepare_spool.h — `tetra data prepare` on several ranks: each rank's tokens, then the
 * shards cut from all of them.
 *
 * The ranks tokenize consecutive ranges of the input files. A rank cannot write shards as
 * it goes, because where a shard starts depends on the tokens of every rank before it;
 * so it spools its token stream of each split to a file in the staging folder
 * (".rank-R.SPLIT.ids": the ids, little-endian, the shards' token width). When every rank
 * is done, the token counts tell each rank where its stream lies in the split's stream,
 * shard k (stream tokens [k*S, (k+1)*S), S = --shard-tokens) is written by rank k mod
 * size from the spools it overlaps, and the spools are removed. The shards are the ones
 * one rank would have written: byte for byte, whatever the number of ranks. */
#ifndef TETRA_PREPARE_SPOOL_H
#define TETRA_PREPARE_SPOOL_H

#include "data/prepare_dist.h"
#include "data/shard.h"

#include <stddef.h>
#include <stdint.h>

typedef struct {
    char *dir;
    int rank;
    uint32_t width;
    int fd[2];          /* train, val; -1 until the first token */
    uint64_t n[2];      /* tokens spooled */
    unsigned char *buf; /* ids waiting to be written */
    size_t buf_n, buf_cap;
    int buf_split;
} ps_spool;

void ps_spool_init(ps_spool *s, const char *dir, int rank, uint32_t width);
/* Append ids to split 0 (train) or 1 (val). */
int ps_spool_append(ps_spool *s, int split, const uint32_t *ids, size_t n, char *err, size_t errlen);
/* Write out what is buffered and close (before ps_write_shards). */
int ps_spool_close(ps_spool *s, char *err, size_t errlen);
/* Remove this rank's spool files (after ps_write_shards, or on failure) and free s. */
void ps_spool_remove(ps_spool *s);

/* Collective: cut both splits' shards from every rank's spools into dir/SPLIT/ (counts[r*2
 * + split] = tokens of rank r's spool). On return every rank has out[split] filled (file
 * names, token counts and CRCs of every shard; n_documents left 0); free them with
 * ps_splits_free. -1 with a message when this rank failed; the caller agrees with the
 * others (pd_any) before going on. */
int ps_write_shards(const pd_world *w, const char *dir, uint32_t vocab, int64_t bos, int64_t eos, uint64_t shard_tokens,
                    const uint64_t *counts, shard_index_split out[2], char *err, size_t errlen);
void ps_splits_free(shard_index_split out[2]);

#endif
