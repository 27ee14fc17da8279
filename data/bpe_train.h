/* bpe_train.h — learn a byte-level BPE tokenizer (tetra data train-tokenizer).
 *
 * Training: the input files are split into pieces by the Llama 3 pre-tokenizer
 * (data/pretok.h), each file on its own; the distinct pieces are counted; then,
 * starting from the 256 single bytes, the most frequent adjacent pair of
 * tokens (counted over all pieces, weighted by piece frequency) is merged into
 * a new token, repeatedly. Ties go to the pair with the smaller (left id,
 * right id). Pair counts are updated incrementally from the pieces that hold
 * the merged pair, so each merge costs time in proportion to those pieces.
 *
 * Ids: 0..255 are the single bytes in GPT-2 order (as in cl100k_base and
 * Llama 3), then learned tokens in the order they were learned, then the
 * special tokens at the top. vocab_size counts all of them.
 *
 * Output folder (written under a temporary name and renamed into place when
 * complete; an existing folder is never overwritten):
 *   tokenizer.model        tiktoken ranks (base64 token, space, rank)
 *   tokenizer.json         Hugging Face BPE, Llama 3 layout: Split(Llama 3
 *                          regex) + ByteLevel, ignore_merges, the specials as
 *                          added_tokens; merges list every split of each
 *                          token into two tokens, ordered by the token's rank
 *                          (what transformers' tiktoken converter writes), so
 *                          both files encode alike.
 *   tokenizer_config.json  bos_token, eos_token and added_tokens_decoder. */
#ifndef TETRA_BPE_TRAIN_H
#define TETRA_BPE_TRAIN_H

#include <stddef.h>
#include <stdint.h>

typedef struct bpe_train_opts {
    const char *const *inputs; /* text files (UTF-8) */
    size_t n_inputs;
    uint32_t vocab_size;         /* total ids, special tokens included */
    const char *const *specials; /* NULL: the default list below */
    size_t n_specials;
    const char *output_dir;
    int verbose; /* progress lines on stderr */
} bpe_train_opts;

typedef struct bpe_train_stats {
    uint64_t bytes;  /* training text */
    uint64_t pieces; /* pre-tokenizer pieces */
    uint64_t unique_pieces;
    uint64_t tokens;           /* the training text encoded with the result */
    uint32_t merges;           /* learned tokens */
    uint32_t duplicate_merges; /* merges whose result already was a token */
    double seconds;
} bpe_train_stats;

/* Default special tokens: the first 11 of Llama 3.1's, in its order
 * (<|begin_of_text|>, <|end_of_text|>, ..., <|eot_id|>, <|python_tag|>). */
extern const char *const BPE_TRAIN_DEFAULT_SPECIALS[];
extern const size_t BPE_TRAIN_N_DEFAULT_SPECIALS;

/* 0 on success; -1 with a message in err (nothing is left behind). */
int bpe_train(const bpe_train_opts *o, bpe_train_stats *stats, char *err, size_t errlen);

#endif
