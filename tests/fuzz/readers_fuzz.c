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
 *   FUZZ_ST     Hugging Face safetensors (llama3_hf_open / llama3_hf_read) against a tiny
 *               Llama (dim 8, 1 block, 2 heads, 1 KV head, vocab 16): a file that opens
 *               has every tensor, and each reads whole, or fails with a message naming
 *               the file; a refused file leaves a message.
 *   FUZZ_PARQUET Parquet files (pq_open_mem / pq_read_column, column "text") under limits of
 *               64 MiB per column chunk: a file that opens yields, for every row group
 *               that decodes, one value per row whose bytes all lie in readable memory
 *               (each is read) and add up to the chunk's text_bytes, within the limits;
 *               every refusal names the file. `fuzz -write_seed DIR` (an
 *               argument the harness reads before libFuzzer) writes valid fp32 and bf16
 *               files of that model as seeds.
 * AddressSanitizer and UBSan run throughout (tests/fuzz/run_fuzz_readers.sh). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define REQUIRE(cond)                                                                                                  \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                               \
            abort();                                                                                                   \
        }                                                                                                              \
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
#elif defined(FUZZ_ST)
#include "models/llama3/hf.h"
#include "models/llama3/model.h"

static void tiny_args(llama3_args *a) {
    llama3_flavor("tiny", a);
    a->dim = 8;
    a->n_layers = 1;
    a->n_heads = 2;
    a->n_kv_heads = 1;
    a->vocab_size = 16;
    a->multiple_of = 8;
}

static void write_seeds(const char *dir) {
    llama3_args a;
    tiny_args(&a);
    llama3_model m;
    char err[1024], path[512];
    REQUIRE(llama3_model_init(&m, &a, 16, ops_cpu(), err, sizeof err) == 0);
    llama3_init_weights(&m, 1);
    snprintf(path, sizeof path, "%s/f32.safetensors", dir);
    REQUIRE(llama3_save_hf(&m, path, "float32", err, sizeof err) == 0);
    snprintf(path, sizeof path, "%s/bf16.safetensors", dir);
    REQUIRE(llama3_save_hf(&m, path, "bfloat16", err, sizeof err) == 0);
    llama3_model_free(&m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    for (int i = 1; i + 1 < *argc; i++)
        if (!strcmp((*argv)[i], "-write_seed")) {
            write_seeds((*argv)[i + 1]);
            exit(0);
        }
    return 0;
}

static char path[256];
static llama3_model decl; /* the names and sizes the file must hold */
static float *buf;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024] = "";
    llama3_args a;
    tiny_args(&a);
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/tetra_st_fuzz_%ld.safetensors", (long)getpid());
        llama3_layout full = llama3_layout_full(&a);
        REQUIRE(llama3_model_init_layout(&decl, &a, &full, LLAMA3_STORAGE_NONE, 16, ops_cpu(), err, sizeof err) == 0);
        buf = malloc(4096 * sizeof *buf);
        REQUIRE(buf);
    }
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    llama3_hf_reader *r = llama3_hf_open(&a, path, err, sizeof err);
    if (!r) {
        REQUIRE(err[0]);
        return 0;
    }
    for (int i = 0; i < decl.n_params; i++) {
        const llama3_param *p = &decl.params[i];
        REQUIRE(p->numel <= 4096);
        err[0] = 0;
        if (llama3_hf_read(r, p->name, 0, p->numel, buf, err, sizeof err) != 0) REQUIRE(err[0] && strstr(err, path));
    }
    llama3_hf_close(r);
    return 0;
}
#elif defined(FUZZ_PARQUET)
#include "data/parquet.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const pq_limits lim = {64u << 20, 64u << 20};
    char err[1024] = "";
    pq_file *f = pq_open_mem(data, size, "fuzz.parquet", "text", &lim, err, sizeof err);
    if (!f) {
        REQUIRE(err[0] && strstr(err, "fuzz.parquet"));
        return 0;
    }
    REQUIRE(pq_num_rows(f) >= 0);
    for (int g = 0; g < pq_num_row_groups(f); g++) {
        pq_column col;
        memset(&col, 0, sizeof col);
        err[0] = 0;
        if (pq_read_column(f, g, &col, err, sizeof err) == 0) {
            REQUIRE(col.n == pq_row_group_rows(f, g));
            REQUIRE(col.mem <= lim.max_chunk_bytes && col.text_bytes <= lim.max_text_bytes);
            uint64_t sum = 0;
            unsigned acc = 0;
            for (int64_t i = 0; i < col.n; i++) {
                const pq_value *v = &col.values[i];
                REQUIRE(v->ptr || v->len == 0);
                for (uint32_t k = 0; k < v->len; k++) acc += (unsigned char)v->ptr[k]; /* ASan checks each byte */
                sum += v->len;
            }
            REQUIRE(sum == col.text_bytes);
            (void)acc;
        } else {
            REQUIRE(err[0] && strstr(err, "fuzz.parquet"));
        }
        pq_column_free(&col);
    }
    pq_close(f);
    return 0;
}
#else
#error "define FUZZ_SHARD, FUZZ_META, FUZZ_TOK, FUZZ_ST or FUZZ_PARQUET"
#endif
