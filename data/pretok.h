/* pretok.h — the pre-tokenizer: split text into pieces with a regex (PCRE2).
 *
 * The pattern is compiled with PCRE2_UTF | PCRE2_UCP and JIT-compiled. Before
 * compiling, every \s is rewritten to the explicit Unicode White_Space class
 * (and \S to its complement), because PCRE2's \s differs from the engines the
 * reference tokenizers use (tiktoken: Rust regex; Hugging Face: Oniguruma) on
 * U+180E; the letters and digits classes (\p{L}, \p{N}) are PCRE2's own
 * (Unicode 14 in PCRE2 10.42).
 *
 * The caller validates UTF-8 once per input; matching never re-checks it.
 * Text between matches (none for the Llama 3 pattern) is kept as its own piece,
 * as Hugging Face's Split(behavior=Isolated) does. */
#ifndef TETRA_PRETOK_H
#define TETRA_PRETOK_H

#include <stddef.h>
#include <stdint.h>

/* Llama 3's (= cl100k_base's) pattern, as written in Meta's tokenizer.py and
 * in Llama 3's tokenizer.json. */
extern const char PRETOK_LLAMA3_PATTERN[];
/* GPT-2's pattern, used by a ByteLevel pre-tokenizer with use_regex = true. */
extern const char PRETOK_GPT2_PATTERN[];

typedef struct pretok pretok;         /* compiled pattern, shareable between threads */
typedef struct pretok_ctx pretok_ctx; /* match state, one per thread */

/* NULL with a message in err when the pattern does not compile. */
pretok *pretok_compile(const char *pattern, char *err, size_t errlen);
void pretok_free(pretok *p);
const char *pretok_pattern(const pretok *p); /* the pattern as given */

pretok_ctx *pretok_ctx_new(const pretok *p);
void pretok_ctx_free(pretok_ctx *c);

/* Calls fn for each piece of the (already validated) UTF-8 text, in order;
 * the pieces tile the text. fn returns non-zero to stop (returned as is).
 * Returns 0, the callback's non-zero value, or -1 with err set when matching
 * fails. */
typedef int (*pretok_fn)(const uint8_t *piece, size_t len, void *user);
int pretok_split(const pretok *p, pretok_ctx *c, const uint8_t *text, size_t len, pretok_fn fn, void *user, char *err,
                 size_t errlen);

/* Rewrite \s and \S as explicit White_Space classes. Returns a malloc'ed
 * pattern, or NULL with err set (\S inside a character class is not supported). */
char *pretok_translate(const char *pattern, char *err, size_t errlen);

#endif
