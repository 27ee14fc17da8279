/* readers_fuzz.c — libFuzzer targets for the readers of files a user hands to tetra,
 * chosen at build time with -DFUZZ_TARGET=...:
 *   FUZZ_SHARD  token-shard headers (shard_header_decode): any 64 bytes either decode to
 *               a header whose fields pass the documented checks, or are refused with a
 *               message naming the file;
 *   FUZZ_META   checkpoint metadata (JSON -> ck_meta_from_json): accepted metadata has a
 *               non-negative step, tensors with a name, 1..4 positive dims and chunks
 *               inside their files; anything else is refused with a message;
 *   FUZZ_TOK    tokenizer files (tiktoken tokenizer.model, or tokenizer.json when the
 *               input starts with '{'): a tokenizer that loads encodes a fixed text into
 *               ids below its vocabulary size that decode again; a refused one leaves a
 *               message.
 * AddressSanitizer and UBSan run throughout (tests/fuzz/run_fuzz_readers.sh). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REQUIRE(cond)                                                                     \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                      \
        }                                                                                 \
    } while (0)

#if defined(FUZZ_SHARD)
#include "data/shard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    shard_header h;
    char err[512] = "";
    const uint64_t file_size = size >= 8 ? (uint64_t)data[0] * 4099 : 0; /* sometimes 0 (not checked) */
    if (shard_header_decode(data, size, file_size, "fuzz.bin", &h, err, sizeof err) == 0) {
        REQUIRE(h.token_bytes == 2 || h.token_bytes == 4);
        REQUIRE(h.token_bytes == shard_token_bytes_for_vocab(h.vocab_size));
        REQUIRE(h.vocab_size > 0);
        REQUIRE(file_size == 0 || file_size == 64 + h.n_tokens * h.token_bytes);
    } else {
        REQUIRE(err[0] && strstr(err, "fuzz.bin"));
    }
    return 0;
}

#elif defined(FUZZ_META)
#include <jansson.h>

#include "checkpoint/ckpt_format.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_error_t jerr;
    json_t *root = json_loadb((const char *)data, size, 0, &jerr);
    if (!root) return 0;
    ck_meta m;
    ck_meta_init(&m);
    char err[1024] = "";
    if (ck_meta_from_json(&m, root, "fuzz/metadata.json", err, sizeof err) == 0) {
        REQUIRE(m.step >= 0);
        for (int i = 0; i < m.n_tensors; i++) {
            const ck_tensor *t = &m.tensors[i];
            REQUIRE(t->name[0]);
            REQUIRE(t->ndim >= 1 && t->ndim <= 4);
            for (int d = 0; d < t->ndim; d++) REQUIRE(t->shape[d] > 0);
        }
    } else {
        REQUIRE(err[0]);
    }
    ck_meta_free(&m);
    json_decref(root);
    return 0;
}

#elif defined(FUZZ_TOK)
#include "data/tokenizer.h"

static char dir[256];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/tetra_tok_fuzz_%ld", (long)getpid());
        mkdir(dir, 0755);
    }
    const int json = size > 0 && data[0] == '{';
    char path[320], other[320];
    snprintf(path, sizeof path, "%s/%s", dir, json ? "tokenizer.json" : "tokenizer.model");
    snprintf(other, sizeof other, "%s/%s", dir, json ? "tokenizer.model" : "tokenizer.json");
    unlink(other);
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    char err[1024] = "";
    tok_tokenizer *t = tok_load(dir, err, sizeof err);
    if (!t) {
        REQUIRE(err[0]);
        return 0;
    }
    /* a tokenizer that loads handles text it may not cover: encode, decode, no crash */
    static const char text[] = "Call me Ishmael. Some years ago \xe2\x80\x94 never mind how long precisely.";
    uint32_t *ids = NULL;
    size_t n = 0;
    if (tok_encode(t, text, sizeof text - 1, 0, 0, 0, &ids, &n, err, sizeof err) == 0) {
        for (size_t i = 0; i < n; i++) REQUIRE(ids[i] < tok_vocab_size(t));
        size_t bl = 0;
        char *back = tok_decode(t, ids, n, &bl, err, sizeof err);
        REQUIRE(back != NULL);
        free(back);
    }
    free(ids);
    tok_free(t);
    return 0;
}
#else
#error "define FUZZ_SHARD, FUZZ_META or FUZZ_TOK"
#endif
