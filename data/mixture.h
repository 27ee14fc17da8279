/* mixture.h — a deterministic weighted interleaving of several sources' samples.
 *
 * Global sample g (a window of seq_len+1 tokens; the loader's position counts them) is
 * taken from one source. The samples are dealt in blocks of MIX_BLOCK: each block holds
 * a fixed quota of every source, q_i = MIX_BLOCK * w_i rounded by largest remainder (so
 * the quotas add up to the block and each differs from its exact share by less than
 * one sample), placed in an order drawn from the seed, a new order per block (the
 * loader's keyed Feistel permutation). So:
 *   - the map g -> (source i, the source's own sample index j) is a pure function of
 *     (weights, seed, g), the same on every rank (a block's table is built once, for its
 *     first sample, and kept); a run resumed at any position, under any data-parallel
 *     degree, continues the same sample stream;
 *   - after whole blocks each source's count differs from n * w_i by less than one
 *     sample per block (1/4096 of its share); within a block the order is random;
 *   - j counts source i's samples in order (block b holds its samples b*q_i ...
 *     (b+1)*q_i - 1, in that order), so each source is read as it would be alone: its
 *     own windows, epoch after epoch, independently of the others.
 *
 * Sources are given as "PATH:WEIGHT" (the last ':' separates them): a weight is a
 * positive finite number, the weights are normalised to sum to 1, and one too small for
 * a single sample per block is refused.
 */
#ifndef TETRA_MIXTURE_H
#define TETRA_MIXTURE_H

#include <stddef.h>
#include <stdint.h>

#define MIX_BLOCK 4096u
#define MIX_MAX_SOURCES 256

typedef struct {
    int n;
    double *weight;  /* normalised */
    uint32_t *quota; /* samples per block */
    uint32_t *first; /* [n+1]: first slot of each source in a block */
    uint64_t seed;
    /* the table of one block: each sample's source and its rank among that source's */
    uint64_t table_block;
    int table_ready;
    uint8_t *table_src;
    uint16_t *table_rank;
} mix_plan;

/* Split "PATH:WEIGHT" into path (a copy in buf) and weight. -1 with a message naming the
 * entry when there is no ':', no path, or the weight is not a positive finite number. */
int mix_parse_entry(const char *entry, char *path, size_t pathlen, double *weight, char *err, size_t errlen);

/* Quotas from the weights (n >= 1). -1 with a message when a weight is not positive and
 * finite, or so small that its source would get no sample in a block. */
int mix_plan_init(mix_plan *m, const double *weights, int n, uint64_t seed, char *err, size_t errlen);
void mix_plan_free(mix_plan *m);

/* The source of global sample g and its index among that source's samples (fills the
 * block's table when g is in another block than the last call's). */
void mix_map(mix_plan *m, uint64_t g, int *src, uint64_t *j);

/* counts[i] = how many of the first n samples come from source i. */
void mix_counts(const mix_plan *m, uint64_t n, uint64_t *counts);

#endif
