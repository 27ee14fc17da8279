/* loader.h — the stateful packing data loader over prepared token shards.
 *
 * Packing (TorchTitan's): a split's token stream (its shards concatenated, every
 * document wrapped BOS ... EOS) is cut into consecutive, non-overlapping windows
 * of seq_len+1 tokens: window j = stream[j*(T+1) .. (j+1)*(T+1)), T = seq_len.
 * A window gives one sequence: input = window[0:T], labels = window[1:T+1].
 * Documents cross window boundaries; nothing is padded. An epoch has
 * W = floor(n_tokens / (T+1)) windows; the last n_tokens mod (T+1) tokens of
 * the split are not used.
 *
 * Global order: the loader keeps one global counter, position = windows consumed
 * by all ranks together. Global window g belongs to epoch g / W and is window
 * perm_e(g mod W) of the stream, where perm_e is the identity without shuffling
 * and a seeded pseudo-random permutation of 0..W-1 per epoch with it (a keyed
 * Feistel network: no memory, same on every rank and every machine).
 *
 * Data parallelism: a step consumes G = dp_size * local_batch_size windows
 * g = position .. position+G-1. Rank r takes g = position + k*dp_size + r for
 * row k = 0..local_batch_size-1. So the union of the ranks' batches is the same
 * global batch for every DP degree with the same G, and a resumed run may use
 * a different DP degree (the state is global, the same on every rank).
 *
 * Epochs: in looping mode (training) the window order runs on into the next
 * epoch; a step may hold windows of two epochs. When a step reaches into a new
 * epoch the loader says so (the epoch callback, or a line on stderr from
 * dp_rank 0). In single-pass mode (validation) dl_next returns 0 once fewer
 * than G windows are left in the epoch (the last partial global batch is
 * dropped on every rank alike); dl_rewind starts over.
 *
 * The shards are memory-mapped read-only, so any number of ranks may read the
 * same files. dl_open validates index.json and every shard (magic, version,
 * header checksum, size, payload CRC-32C) and checks that the corpus' vocab
 * size equals the model's.
 *
 * Megatron-LM indexed datasets (megatron.h): when dir is a Megatron dataset (PREFIX with
 * PREFIX.idx and PREFIX.bin, or either file) its token stream is the .bin's sequences in
 * index order, read in place, packed the same way; "train" and "val" both read all of it.
 * The index records no tokenizer: expected_vocab_size is required, a dtype that cannot
 * hold its ids is refused at open, and every id is checked as windows are read (dl_next
 * returns -1 naming the .bin, the token, its sequence and the id). BOS/EOS are unknown
 * (-1); Megatron's preprocessing ends each document with EOD when asked to.
 *
 * Mixtures (dl_open_mix, loader_mix.c): several corpora with weights behind the same
 * interface. In looping mode global window g is sample j of source i as mix_map gives
 * (mixture.h: blocks of 4096 samples with fixed per-source quotas in a seeded order), and
 * source i's sample j is its own stream's window j in its own epoch order; so the state
 * is still the one position, and resuming under any DP degree continues the same sample
 * stream. In single-pass mode (validation) the sources' splits are read one after
 * another, each in whole global batches; dl_last_source tells whose the last batch was.
 *
 * Resume: dl_state_save writes the position, seed, shuffle flag, seq_len and a
 * fingerprint of the split (DL_STATE_BYTES bytes). dl_state_load on a loader
 * opened on the same split with the same seq_len, shuffle and seed continues
 * with exactly the batches the uninterrupted run would have produced.
 */
#ifndef TETRA_LOADER_H
#define TETRA_LOADER_H

#include <stddef.h>
#include <stdint.h>

typedef struct dl_loader dl_loader;

/* Called when a step crosses into a new epoch: finished_epoch counts from 1;
 * msg is a one-line description. */
typedef void (*dl_epoch_fn)(void *user, uint64_t finished_epoch, const char *msg);

typedef struct {
    int seq_len;                  /* T */
    int local_batch_size;         /* B: rows per rank per dl_next */
    int dp_rank, dp_size;         /* this rank's place among the data-parallel ranks */
    int shuffle;                  /* permute the window order of each epoch */
    uint64_t seed;                /* the permutation's key */
    uint32_t expected_vocab_size; /* the model's vocab_size; 0 = do not check */
    int single_pass;              /* 1 = validation: stop at the end of the epoch */
    int skip_verify;              /* 1 = do not verify payload checksums at open */
    dl_epoch_fn on_epoch;         /* NULL = print to stderr on dp_rank 0 */
    void *on_epoch_user;
} dl_config;

/* Open split ("train" or "val") of the prepared corpus in dir. NULL with a
 * message in err on failure (missing index, unknown or empty split, a
 * truncated / corrupt / foreign shard named by path, vocab mismatch, a split
 * shorter than seq_len+1 tokens). */
dl_loader *dl_open_config(const char *dir, const char *split, const dl_config *cfg, char *err, size_t errlen);

/* A weighted mixture: entries[i] = "PATH:WEIGHT" (mixture.h), PATH a prepared corpus or a
 * Megatron dataset, each opened on `split` with cfg. NULL with a message naming the source
 * when an entry is malformed or listed twice, a source cannot be opened, the sources were
 * tokenized differently, a weight is too small for one sample per block, or (single pass)
 * a source's split holds less than one global batch. */
dl_loader *dl_open_mix(const char *const *entries, int n, const char *split, const dl_config *cfg, char *err,
                       size_t errlen);

/* Looping loader with checksum verification and the default epoch message. */
dl_loader *dl_open(const char *dir, const char *split, int seq_len, int local_batch_size, int dp_rank, int dp_size,
                   int shuffle, uint64_t seed, uint32_t expected_vocab_size, char *err, size_t errlen);

void dl_close(dl_loader *dl);

/* Fill this rank's local batch: inputs and labels are [local_batch_size][seq_len]
 * int32, row-major. Returns 1, or 0 in single-pass mode when the split is
 * exhausted (the buffers are then untouched), or -1 when a token id read is outside
 * the vocabulary (dl_error names the shard and the token). */
int dl_next(dl_loader *dl, int32_t *inputs, int32_t *labels);
/* dl_next, and the document id of every input token into docs [local_batch_size][seq_len]
 * (NULL: none), for document-masked attention (model.attn_mask_type = "block_causal") and
 * positions that restart at document boundaries. Ids count documents from 0 at each row's
 * first token and rise by one at every boundary inside the row, so they are nondecreasing:
 * in prepared shards a document starts after an EOS and at a BOS (dl_doc_ids); in a
 * Megatron dataset at the first token of each document of its index (sequences grouped by
 * its document indices), whatever the tokens. */
int dl_next_docs(dl_loader *dl, int32_t *inputs, int32_t *labels, int32_t *docs);
/* Does this corpus mark its documents (BOS or EOS known, or a Megatron index)? Without,
 * every row is one document. */
int dl_has_documents(const dl_loader *dl);
/* ids[i] for tokens[0, n): 0 at i = 0, +1 wherever a document starts: after an EOS
 * (TorchTitan's block_causal: a document ends at its EOS) or at a BOS not right after an
 * EOS. bos, eos: ids, or -1 when the corpus has none. */
void dl_doc_ids(const int32_t *tokens, int n, int64_t bos, int64_t eos, int32_t *ids);
const char *dl_error(const dl_loader *dl);

/* Single-pass mode: start the split again from its first window. */
void dl_rewind(dl_loader *dl);

/* ---- checkpoint state --------------------------------------------------------- */

#define DL_STATE_BYTES 64
size_t dl_state_size(const dl_loader *dl); /* DL_STATE_BYTES */
/* Write the state into buf (at least dl_state_size bytes). Same on every rank. */
int dl_state_save(const dl_loader *dl, void *buf, size_t n);
/* Restore a saved state; -1 with err when it is corrupt or was saved for
 * another split, seq_len, shuffle setting or seed. */
int dl_state_load(dl_loader *dl, const void *buf, size_t n, char *err, size_t errlen);

/* ---- facts ------------------------------------------------------------------ */

uint64_t dl_position(const dl_loader *dl);          /* global windows consumed */
uint64_t dl_epoch(const dl_loader *dl);             /* completed epochs: position / W */
uint64_t dl_windows_per_epoch(const dl_loader *dl); /* W */
uint64_t dl_steps_per_epoch(const dl_loader *dl);   /* W / G: whole global batches per epoch */
uint64_t dl_num_tokens(const dl_loader *dl);        /* tokens in the split */
uint32_t dl_vocab_size(const dl_loader *dl);
int64_t dl_bos_id(const dl_loader *dl); /* -1 = none */
int64_t dl_eos_id(const dl_loader *dl); /* -1 = none */

/* ---- mixtures (a single corpus is a mixture of one) -------------------------------- */

int dl_num_sources(const dl_loader *dl);
const char *dl_source_name(const dl_loader *dl, int i); /* the path given */
double dl_source_weight(const dl_loader *dl, int i);    /* normalised */
uint64_t dl_source_windows(const dl_loader *dl, int i); /* its windows per epoch */
int dl_last_source(const dl_loader *dl);                /* single pass: the last batch's source */
void dl_skip_source(dl_loader *dl);                     /* single pass: go on with the next source */
/* counts[i] = samples of source i among the first n global samples (n = dl_position: so far). */
void dl_source_counts(const dl_loader *dl, uint64_t n, uint64_t *counts);
/* "NAME: weight W, realised S (K of N samples, E epochs); ..." for the first n samples;
 * -1 when buf is too short. */
int dl_mix_summary(const dl_loader *dl, uint64_t n, char *buf, size_t len);
/* {"samples":N,"sources":{"NAME":{"weight":W,"samples":K,"share":S},...}} for the samples
 * consumed so far; -1 when buf is too short. */
int dl_mix_json(const dl_loader *dl, char *buf, size_t len);

/* ---- the tokenizer of a corpus ------------------------------------------------------ */

/* Does the tokenizer at tok_path (model.hf_assets_path: a folder with tokenizer.json,
 * tokenizer.model or original/tokenizer.model, or one such file) give token ids the meaning
 * they have in the corpora prepared in dirs[0..n)? The tokenizer is read once. Compared:
 * the tokenizer fingerprint that `tetra data prepare` records in index.json
 * (tok_fingerprint), or, for an index without one, the vocab size and the BOS/EOS ids.
 * Returns 0 when they agree; 1 when tok_path holds no tokenizer file (nothing compared; err
 * says so); -1 when one differs or the tokenizer cannot be read (err names both sides). */
int dl_check_tokenizer(const char *const *dirs, int n, const char *tok_path, char *err, size_t errlen);

/* ---- dataset names -------------------------------------------------------------- */

/* Resolve the config keys training.dataset / training.dataset_path (or the
 * [validation] ones) to a prepared corpus folder:
 *   - dataset_path, when set (not NULL, not ""), wins: out_dir = dataset_path.
 *   - dataset "sample" (alias "c4_test", TorchTitan's name for the role) is the
 *     shipped corpus (Moby Dick) that the build prepares into <build>/data/sample:
 *     found next to the executable (<dir of /proc/self/exe>/../data/sample), else
 *     under $TETRA_DATA_DIR (as $TETRA_DATA_DIR/sample).
 *   - "c4" is C4 prepared by `tetra data prepare` into <build>/data/c4 or
 *     $TETRA_DATA_DIR/c4; when absent the error says how to make it.
 *     "c4_validation" is that folder where it exists, else the sample.
 *   - any other name is an error that says how to prepare a corpus.
 * The split ("train" / "val") is chosen by the caller at dl_open. */
int dl_resolve_dataset(const char *dataset, const char *dataset_path, char *out_dir, size_t n, char *err,
                       size_t errlen);

/* Is path a Megatron indexed dataset rather than a folder of token shards? */
int dl_is_megatron(const char *path);

/* The permutation used for shuffling (exposed for tests): a bijection of
 * 0..n-1 keyed by (seed, epoch). */
uint64_t dl_permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch);

#endif
