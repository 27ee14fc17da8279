/* prepare.h — `tetra data prepare`: tokenize a corpus into token shards.
 *
 *   tetra data prepare --tokenizer DIR --input PATH --output DIR
 *                      [--val-fraction F] [--threads N] [--shard-tokens N]
 *                      [--text-field NAME] [--vocab-size N] [--quiet]
 *
 * Documents: a .txt file is one document; a .jsonl file holds one document per
 * non-blank line (the "text" string field of a JSON object); a .parquet file
 * holds one document per row (the "text" column, parquet.h; a null value is a
 * document without text, skipped like an empty string); a folder contributes
 * every such file inside it, recursively, in byte order of their paths (names
 * starting with '.' are skipped). Each document becomes BOS tokens EOS in the
 * output (shard.h has the format).
 *
 * Validation split: the last round(F * D) of the D documents (at least one,
 * at most D - 1) form the "val" split; with a single document, the document is
 * cut at the paragraph start nearest to (1 - F) of its bytes and the tail is
 * the "val" document. F = 0: no val split.
 *
 * Output is written into a temporary folder beside --output and renamed when
 * complete; on any error (or Ctrl-C) the temporary folder is removed, so either
 * the whole corpus exists or nothing does. An existing --output is refused.
 * The result does not depend on --threads.
 *
 * Under mpirun / srun every rank tokenizes a run of consecutive input files and the
 * shards are cut from all of them (prepare_dist.h, prepare_spool.h): the output is byte for
 * byte one rank's, whatever the number of ranks.
 */
#ifndef TETRA_PREPARE_H
#define TETRA_PREPARE_H

#include <stddef.h>

/* argv[0] = "prepare". Returns the process exit status (0 ok, 1 error,
 * 2 usage error, 130 interrupted). */
int data_prepare_main(int argc, char **argv);

/* Where a single document is cut for the val split: the start of the
 * paragraph nearest to (1 - val_fraction) * len (else of a line, else of a
 * word, else a UTF-8 character boundary). Returns p with 0 < p < len, or 0
 * when the text is too short to cut. */
size_t data_prepare_split_point(const char *text, size_t len, double val_fraction);

/* Long documents are tokenized in pieces, in parallel. A piece ends at the
 * first position p >= start + target where text[p] is ' ', text[p-1] is not
 * whitespace and text[p+1] is an ASCII letter: a pre-token boundary of the
 * Llama 3 (and GPT-2) pre-tokenizer regex, so encoding the pieces one by one
 * gives the same ids as encoding the whole text. Returns len when there is no
 * such position. */
size_t data_prepare_piece_end(const char *text, size_t len, size_t start, size_t target);

/* Offset of the first byte that is not valid UTF-8 (overlong forms,
 * surrogates and code points above U+10FFFF are invalid), or len. */
size_t data_prepare_utf8_check(const unsigned char *s, size_t len);

#endif
