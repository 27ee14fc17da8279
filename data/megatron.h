/* megatron.h — Megatron-LM's indexed datasets (.bin + .idx, "MMIDIDX") read in place.
 *
 * A dataset is two files with one prefix: PREFIX.bin holds the token ids of every sequence
 * back to back, PREFIX.idx describes them (all integers little-endian; Megatron-LM
 * megatron/core/datasets/indexed_dataset.py):
 *
 *   offset        size  field
 *        0           9  magic "MMIDIDX\0\0"
 *        9           8  version, 1
 *       17           1  dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
 *                       6 float64, 7 float32, 8 uint16
 *       18           8  S, the number of sequences
 *       26           8  D, the number of document indices (documents + 1)
 *       34         4*S  sequence lengths, int32, in tokens
 *    34+4S         8*S  sequence pointers, int64, byte offsets into .bin
 *   34+12S         8*D  document indices, int64: document k is sequences [d[k], d[k+1])
 *  (34+12S+8D      S    sequence modes, int8: multimodal datasets only — refused)
 *
 * The token stream is the sequences in index order. Megatron's writer stores them back to
 * back from byte 0, so the stream is the .bin file itself; that is required here (a
 * pointer that is not the previous one plus its length is refused), and so is a .bin
 * exactly as long as the sequences. Float dtypes hold no token ids and are refused.
 * Nothing is copied: both files are memory-mapped read-only, and opening checks the
 * whole index in one pass without allocating.
 */
#ifndef TETRA_MEGATRON_H
#define TETRA_MEGATRON_H

#include <stddef.h>
#include <stdint.h>

#include "data/doclen.h"

typedef struct {
    char *prefix; /* the path without .bin / .idx */
    const unsigned char *idx, *bin;
    size_t idx_len, bin_len;
    int dtype; /* the code */
    int width; /* bytes per id */
    uint64_t n_sequences, n_documents;
    uint64_t n_tokens;
    uint32_t idx_crc; /* CRC-32C of the .idx file: which dataset this is */
} mg_dataset;

/* Is path a Megatron dataset: PREFIX with PREFIX.idx beside it, or PREFIX.idx / PREFIX.bin? */
int mg_is_dataset(const char *path);

/* Open and check the dataset at path (a prefix, or either file). -1 with a message naming
 * the file and what is wrong. */
int mg_open(mg_dataset *d, const char *path, char *err, size_t errlen);
void mg_close(mg_dataset *d);

const char *mg_dtype_name(int code);
/* The largest id the dtype holds (0 for the float dtypes). */
uint64_t mg_dtype_max(int code);

/* ids[i] for stream tokens [first, first+n): the index of the document (the index's
 * document indices group sequences into documents) holding token first+i, less that of
 * token first: 0 at the first token, +1 at each document start. Empty documents and
 * sequences take no token and leave no gap. */
void mg_doc_ids(const mg_dataset *d, uint64_t first, size_t n, int32_t *ids);

/* Its documents' lengths in tokens, into h (data/doclen.h): what `tetra plan` models
 * document-masked attention with. */
void mg_doc_lengths(const mg_dataset *d, doclen_hist *h);

/* Copy stream tokens [first, first+n) into out, each checked to be in [0, vocab): 0, or -1
 * with a message naming the .bin file, the token, its sequence and the id. */
int mg_read(const mg_dataset *d, uint64_t first, size_t n, uint32_t vocab, int32_t *out, char *err, size_t errlen);

#endif
