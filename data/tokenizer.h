/* tokenizer.h — byte-level BPE (Llama 3 / tiktoken style) encode and decode.
 *
 * Contract (other modules rely on exactly these functions):
 *   - tok_load() reads a folder holding tokenizer.json (Hugging Face) and/or
 *     tokenizer.model (tiktoken ranks). tokenizer.json wins when both exist.
 *     On failure it returns NULL and writes a message naming the file (and
 *     line or JSON path) into err.
 *   - Ids are uint32. tok_vocab_size() counts every id the tokenizer can emit,
 *     special tokens included (max id + 1).
 *   - tok_encode() never fails on valid UTF-8; invalid UTF-8 is an error with
 *     the byte offset in err.
 *   - Special-token text inside input is encoded as ordinary text unless
 *     allow_special is set (tiktoken's encode_ordinary vs encode(allowed="all")).
 *
 * Where the tokenizer comes from (tok_load's path):
 *   - A folder (model.hf_assets_path, as in TorchTitan): tokenizer.json if
 *     present, else tokenizer.model, else original/tokenizer.model (the layout
 *     of a Hugging Face download of a Meta Llama repository).
 *   - A file: *.json is read as tokenizer.json, anything else as tiktoken
 *     ranks (e.g. cl100k_base.tiktoken).
 *   An optional tokenizer_config.json next to it (Hugging Face's) is read for
 *   bos_token, eos_token and, for tiktoken files only, added_tokens_decoder.
 *
 * Formats:
 *   - tiktoken: one "base64(token bytes) rank" per line; rank = id. Encoding
 *     is tiktoken's: a piece that is itself a token is emitted as is; else,
 *     starting from single bytes, merge the adjacent pair whose concatenation
 *     has the lowest rank (leftmost on ties) until none is a token.
 *   - tokenizer.json: model BPE (no dropout, byte_fallback or subword
 *     affixes), vocab strings in GPT-2's byte-to-unicode alphabet, merges as
 *     "a b" strings or ["a", "b"] pairs, ignore_merges honoured; normalizer
 *     none; pre_tokenizer Sequence[Split(Regex, Isolated), ByteLevel] (Llama 3)
 *     or ByteLevel with its GPT-2 regex. Encoding is Hugging Face's: merge the
 *     adjacent pair with the lowest merge index (leftmost on ties). Every
 *     added_tokens entry is a special token.
 *
 * Special tokens (matched in text only with allow_special, leftmost-longest,
 * never across them by the pre-tokenizer):
 *   - tokenizer.json: its added_tokens.
 *   - tiktoken with tokenizer_config.json carrying added_tokens_decoder: those.
 *   - tiktoken with exactly 128,000 ranks (Meta's Llama 3 tokenizer.model): the
 *     256 Llama 3 specials at 128000..128255 with Llama 3.1's names
 *     (<|begin_of_text|> 128000, <|end_of_text|> 128001, <|start_header_id|>
 *     128006, <|end_header_id|> 128007, <|eom_id|> 128008, <|eot_id|> 128009,
 *     <|python_tag|> 128010, reserved ones elsewhere).
 *   - tiktoken with exactly 100,256 ranks (cl100k_base): <|endoftext|> 100257,
 *     <|fim_prefix|> 100258, <|fim_middle|> 100259, <|fim_suffix|> 100260,
 *     <|endofprompt|> 100276 (id 100256 is unassigned).
 *   - otherwise none.
 * BOS/EOS: tokenizer_config.json's bos_token/eos_token when given; otherwise
 * BOS = <|begin_of_text|>, EOS = <|end_of_text|> or else <|endoftext|>, when
 * such a special exists (-1 when not).
 *
 * Pre-tokenizer: the file's regex (Llama 3's for tiktoken files) through
 * PCRE2 (UTF + UCP, JIT), \s spelled as the Unicode White_Space class. PCRE2
 * 10.42 knows Unicode 14: letters or digits assigned later are classified
 * differently than by newer reference tokenizers.
 *
 * Threads: a loaded tokenizer is read-only; tok_encode/tok_decode may run
 * concurrently. Each thread keeps its own match state and piece cache, freed
 * when the thread exits or by tok_free (call it after the threads are done). */
#ifndef TETRA_TOKENIZER_H
#define TETRA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tok_tokenizer tok_tokenizer;

tok_tokenizer *tok_load(const char *dir, char *err, size_t errlen);
/* The file tok_load would read for this path (the search above; a file is itself),
 * malloc'ed, or NULL when there is none (or no memory). */
char *tok_find_file(const char *path);
void tok_free(tok_tokenizer *t);

uint32_t tok_vocab_size(const tok_tokenizer *t);
int64_t tok_bos_id(const tok_tokenizer *t); /* -1 when the tokenizer has none */
int64_t tok_eos_id(const tok_tokenizer *t); /* -1 when the tokenizer has none */

/* Encode len bytes of UTF-8. On success returns 0 and sets *ids (malloc'ed,
 * caller frees) and *n_ids. Returns -1 with a message in err on failure. */
int tok_encode(const tok_tokenizer *t, const char *text, size_t len, int bos, int eos, int allow_special,
               uint32_t **ids, size_t *n_ids, char *err, size_t errlen);

/* Decode ids to bytes; invalid UTF-8 sequences become U+FFFD. Returns a
 * malloc'ed NUL-terminated string (length in *out_len) or NULL with err set
 * (an id out of range). */
char *tok_decode(const tok_tokenizer *t, const uint32_t *ids, size_t n_ids, size_t *out_len, char *err, size_t errlen);

/* ---- additional queries ---------------------------------------------------- */
enum { TOK_FORMAT_TIKTOKEN = 1, TOK_FORMAT_HF = 2 };
int tok_format(const tok_tokenizer *t);          /* TOK_FORMAT_* */
const char *tok_pattern(const tok_tokenizer *t); /* pre-tokenizer regex as declared */
uint32_t tok_num_special(const tok_tokenizer *t);
int tok_is_special(const tok_tokenizer *t, uint32_t id);
/* Bytes of one token (special tokens: their text); NULL for an unassigned id. */
const uint8_t *tok_token_bytes(const tok_tokenizer *t, uint32_t id, size_t *len);
/* Id of the special token or ordinary token with exactly these bytes, or -1. */
int64_t tok_token_id(const tok_tokenizer *t, const char *bytes, size_t len);
/* A 64-bit FNV-1a hash of what a token id means: the vocab size, each id's bytes, whether it
 * is special or unassigned, and the BOS/EOS ids. The same vocabulary read from tokenizer.json
 * or from tokenizer.model hashes alike; `tetra data prepare` records it in index.json so
 * training can tell whether model.hf_assets_path holds the tokenizer of its shards. */
uint64_t tok_fingerprint(const tok_tokenizer *t);
/* 0 when model_vocab_size equals tok_vocab_size(t); else -1 with an error
 * naming both sizes (a model must embed exactly the ids its tokenizer emits). */
int tok_check_vocab_size(const tok_tokenizer *t, int64_t model_vocab_size, char *err, size_t errlen);

/* Llama 3: 128,000 ranks + 256 special tokens = 128,256 ids. */
#define TOK_LLAMA3_NUM_RANKS 128000u
#define TOK_LLAMA3_NUM_SPECIAL 256u
/* Name of Llama 3 special token k (id 128000 + k, Llama 3.1 names); buf holds
 * generated names of reserved tokens. NULL when k >= 256. */
const char *tok_llama3_special_name(unsigned k, char *buf, size_t buflen);

#endif
