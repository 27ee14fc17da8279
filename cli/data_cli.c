/* data_cli.c — `tetra data encode | decode | train-tokenizer | prepare`. */
#include "cli/data_cli.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/bpe_train.h"
#include "data/tokenizer.h"

#include "data/prepare.h"

static void usage_data(FILE *f) {
    fprintf(f,
            "usage: tetra data <command> [options]\n"
            "\n"
            "commands:\n"
            "  encode            UTF-8 text on stdin -> token ids on stdout\n"
            "  decode            token ids on stdin -> text on stdout\n"
            "  train-tokenizer   learn a byte-level BPE tokenizer from text files\n"
            "  prepare           tokenize a corpus into token shards\n"
            "\n"
            "`tetra data <command> --help` describes each command.\n");
}

static void usage_encode(FILE *f) {
    fprintf(f,
            "usage: tetra data encode --tokenizer PATH [--bos] [--eos] [--special] [--input FILE]\n"
            "                         [--output FILE] [--stats]\n"
            "\n"
            "Reads UTF-8 text (stdin by default) and prints its token ids, space-separated, on one line.\n"
            "\n"
            "  --tokenizer PATH  folder with tokenizer.json or tokenizer.model (model.hf_assets_path),\n"
            "                    or one such file (a .json file is read as tokenizer.json, any other\n"
            "                    file as tiktoken ranks)\n"
            "  --bos, --eos      add the tokenizer's BOS / EOS token\n"
            "  --special         turn special-token text in the input (e.g. <|eot_id|>) into its id;\n"
            "                    by default such text is encoded as ordinary text\n"
            "  --input FILE      read FILE instead of stdin\n"
            "  --output FILE     write the ids to FILE instead of stdout\n"
            "  --stats           print bytes, tokens, bytes/token and encode speed on stderr\n"
            "\n"
            "Empty input and invalid UTF-8 are errors (exit status 1).\n");
}

static void usage_decode(FILE *f) {
    fprintf(f,
            "usage: tetra data decode --tokenizer PATH [--input FILE] [--output FILE]\n"
            "\n"
            "Reads token ids (decimal, separated by spaces, newlines or commas; [ and ] are ignored)\n"
            "and writes the text they stand for. Byte sequences that are not valid UTF-8 become\n"
            "U+FFFD. An id the tokenizer does not have is an error (exit status 1).\n"
            "\n"
            "  --tokenizer PATH  as for encode\n"
            "  --input FILE      read FILE instead of stdin\n"
            "  --output FILE     write to FILE instead of stdout\n");
}

static void usage_train(FILE *f) {
    fprintf(f,
            "usage: tetra data train-tokenizer --input FILE... --vocab-size N --output DIR\n"
            "                                  [--special-tokens LIST] [--quiet]\n"
            "\n"
            "Learns byte-level BPE merges over the Llama 3 pre-tokenizer and writes DIR/tokenizer.json\n"
            "(Hugging Face), DIR/tokenizer.model (tiktoken) and DIR/tokenizer_config.json.\n"
            "\n"
            "  --input FILE...        one or more UTF-8 text files (each split on its own)\n"
            "  --vocab-size N         total ids: 256 bytes + learned tokens + special tokens\n"
            "  --output DIR           new folder (an existing one is never overwritten)\n"
            "  --special-tokens LIST  comma-separated special tokens placed at the top ids; default\n"
            "                         the first 11 of Llama 3.1's: <|begin_of_text|> (BOS),\n"
            "                         <|end_of_text|> (EOS), ..., <|eot_id|>, <|python_tag|>\n"
            "  --quiet                no progress lines\n");
}

static int is_help(const char *a) { return !strcmp(a, "--help") || !strcmp(a, "-h"); }

/* ---- I/O helpers ------------------------------------------------------------- */
static char *read_all(const char *path, size_t *len) {
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "tetra data: %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, 2 * cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int bad = ferror(f);
    if (path) fclose(f);
    if (!buf || bad) {
        free(buf);
        fprintf(stderr, "tetra data: %s: %s\n", path ? path : "stdin", bad ? "read error" : "out of memory");
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static FILE *open_out(const char *path) {
    if (!path) return stdout;
    FILE *f = fopen(path, "wb");
    if (!f) fprintf(stderr, "tetra data: %s: %s\n", path, strerror(errno));
    return f;
}

static int close_out(FILE *f, const char *path) {
    int bad = ferror(f) != 0;
    bad |= (f == stdout ? fflush(f) : fclose(f)) != 0;
    if (bad) fprintf(stderr, "tetra data: %s: write error: %s\n", path ? path : "stdout", strerror(errno));
    return bad;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tok_tokenizer *load_tok(const char *cmd, const char *path) {
    if (!path) {
        fprintf(stderr, "tetra data %s: --tokenizer PATH is required\n", cmd);
        return NULL;
    }
    char err[1024];
    tok_tokenizer *t = tok_load(path, err, sizeof err);
    if (!t) fprintf(stderr, "tetra data %s: %s\n", cmd, err);
    return t;
}

/* ---- encode ------------------------------------------------------------------- */
static int cmd_encode(int argc, char **argv) {
    const char *tokp = NULL, *in = NULL, *outp = NULL;
    int bos = 0, eos = 0, special = 0, stats = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (is_help(a)) {
            usage_encode(stdout);
            return 0;
        } else if (!strcmp(a, "--bos")) {
            bos = 1;
        } else if (!strcmp(a, "--eos")) {
            eos = 1;
        } else if (!strcmp(a, "--special")) {
            special = 1;
        } else if (!strcmp(a, "--stats")) {
            stats = 1;
        } else if (!strcmp(a, "--tokenizer") && more) {
            tokp = argv[++i];
        } else if ((!strcmp(a, "--input") || !strcmp(a, "-i")) && more) {
            in = argv[++i];
        } else if ((!strcmp(a, "--output") || !strcmp(a, "-o")) && more) {
            outp = argv[++i];
        } else {
            fprintf(stderr, "tetra data encode: unknown or incomplete option '%s'\n\n", a);
            usage_encode(stderr);
            return 2;
        }
    }
    tok_tokenizer *t = load_tok("encode", tokp);
    if (!t) return 1;
    size_t len;
    char *text = read_all(in, &len);
    if (!text) {
        tok_free(t);
        return 1;
    }
    if (!len) {
        fprintf(stderr, "tetra data encode: empty input (%s): nothing to encode\n", in ? in : "stdin");
        free(text);
        tok_free(t);
        return 1;
    }
    char err[1024];
    uint32_t *ids;
    size_t n;
    double t0 = now_s();
    int r = tok_encode(t, text, len, bos, eos, special, &ids, &n, err, sizeof err);
    double dt = now_s() - t0;
    free(text);
    if (r) {
        fprintf(stderr, "tetra data encode: %s: %s\n", in ? in : "stdin", err);
        tok_free(t);
        return 1;
    }
    FILE *f = open_out(outp);
    int rc = 1;
    if (f) {
        char *buf = malloc(1 << 16);
        size_t o = 0;
        if (buf) {
            for (size_t i = 0; i < n; i++) {
                if (o > (1 << 16) - 16) {
                    fwrite(buf, 1, o, f);
                    o = 0;
                }
                /* decimal, fast */
                char tmp[12];
                int k = 0;
                uint32_t v = ids[i];
                do {
                    tmp[k++] = (char)('0' + v % 10);
                    v /= 10;
                } while (v);
                if (i) buf[o++] = ' ';
                while (k) buf[o++] = tmp[--k];
            }
            buf[o++] = '\n';
            fwrite(buf, 1, o, f);
            free(buf);
        }
        rc = close_out(f, outp) || !buf;
    }
    if (stats)
        fprintf(stderr, "encode: %zu bytes -> %zu tokens, %.3f bytes/token, %.4f s, %.1f MB/s\n", len, n,
                n ? (double)len / (double)n : 0.0, dt, dt > 0 ? (double)len / dt / 1e6 : 0.0);
    free(ids);
    tok_free(t);
    return rc;
}

/* ---- decode ------------------------------------------------------------------- */
static int cmd_decode(int argc, char **argv) {
    const char *tokp = NULL, *in = NULL, *outp = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (is_help(a)) {
            usage_decode(stdout);
            return 0;
        } else if (!strcmp(a, "--tokenizer") && more) {
            tokp = argv[++i];
        } else if ((!strcmp(a, "--input") || !strcmp(a, "-i")) && more) {
            in = argv[++i];
        } else if ((!strcmp(a, "--output") || !strcmp(a, "-o")) && more) {
            outp = argv[++i];
        } else {
            fprintf(stderr, "tetra data decode: unknown or incomplete option '%s'\n\n", a);
            usage_decode(stderr);
            return 2;
        }
    }
    tok_tokenizer *t = load_tok("decode", tokp);
    if (!t) return 1;
    size_t len;
    char *text = read_all(in, &len);
    if (!text) {
        tok_free(t);
        return 1;
    }
    size_t n = 0, cap = len / 2 + 1;
    uint32_t *ids = malloc(cap * sizeof *ids);
    int rc = 1;
    if (!ids) {
        fprintf(stderr, "tetra data decode: out of memory\n");
        goto out;
    }
    for (size_t i = 0; i < len;) {
        char c = text[i];
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == ',' || c == '[' || c == ']') {
            i++;
            continue;
        }
        if (c < '0' || c > '9') {
            fprintf(stderr, "tetra data decode: %s: byte %zu: expected a token id, found '%c'\n", in ? in : "stdin", i,
                    c >= 32 && c < 127 ? c : '?');
            goto out;
        }
        uint64_t v = 0;
        size_t s = i;
        while (i < len && text[i] >= '0' && text[i] <= '9') {
            v = v * 10 + (uint64_t)(text[i] - '0');
            if (v > UINT32_MAX) {
                fprintf(stderr, "tetra data decode: %s: byte %zu: id too large\n", in ? in : "stdin", s);
                goto out;
            }
            i++;
        }
        ids[n++] = (uint32_t)v;
    }
    if (!n) {
        fprintf(stderr, "tetra data decode: empty input (%s): no token ids\n", in ? in : "stdin");
        goto out;
    }
    char err[1024];
    size_t olen;
    char *s = tok_decode(t, ids, n, &olen, err, sizeof err);
    if (!s) {
        fprintf(stderr, "tetra data decode: %s\n", err);
        goto out;
    }
    FILE *f = open_out(outp);
    if (f) {
        fwrite(s, 1, olen, f);
        rc = close_out(f, outp);
    }
    free(s);
out:
    free(ids);
    free(text);
    tok_free(t);
    return rc;
}

/* ---- train-tokenizer ------------------------------------------------------------ */
static int cmd_train(int argc, char **argv) {
    bpe_train_opts o;
    memset(&o, 0, sizeof o);
    o.verbose = 1;
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    char **specials = NULL;
    char *splist = NULL;
    int rc = 2;
    if (!inputs) return 1;
    size_t ni = 0;
    long long vs = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (is_help(a)) {
            usage_train(stdout);
            rc = 0;
            goto out;
        } else if (!strcmp(a, "--input")) {
            int k = 0;
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2)) inputs[ni++] = argv[++i], k++;
            if (!k) {
                fprintf(stderr, "tetra data train-tokenizer: --input needs at least one file\n");
                goto out;
            }
        } else if (!strcmp(a, "--vocab-size") && i + 1 < argc) {
            char *end;
            errno = 0;
            vs = strtoll(argv[++i], &end, 10);
            if (*end || errno || vs <= 0 || vs >= (long long)UINT32_MAX) {
                fprintf(stderr, "tetra data train-tokenizer: --vocab-size needs a positive integer, got '%s'\n",
                        argv[i]);
                goto out;
            }
        } else if (!strcmp(a, "--output") && i + 1 < argc) {
            o.output_dir = argv[++i];
        } else if (!strcmp(a, "--special-tokens") && i + 1 < argc) {
            splist = strdup(argv[++i]);
            if (!splist) goto out;
        } else if (!strcmp(a, "--quiet")) {
            o.verbose = 0;
        } else {
            fprintf(stderr, "tetra data train-tokenizer: unknown or incomplete option '%s'\n\n", a);
            usage_train(stderr);
            goto out;
        }
    }
    if (!ni || vs < 0 || !o.output_dir) {
        fprintf(stderr, "tetra data train-tokenizer: --input, --vocab-size and --output are required\n\n");
        usage_train(stderr);
        goto out;
    }
    if (splist) {
        size_t cnt = 1;
        for (char *p = splist; *p; p++) cnt += *p == ',';
        specials = calloc(cnt, sizeof *specials);
        if (!specials) goto out;
        size_t k = 0;
        for (char *tok = strtok(splist, ","); tok; tok = strtok(NULL, ",")) specials[k++] = tok;
        o.specials = (const char *const *)specials;
        o.n_specials = k;
    }
    o.inputs = inputs;
    o.n_inputs = ni;
    o.vocab_size = (uint32_t)vs;
    bpe_train_stats st;
    char err[1024];
    if (bpe_train(&o, &st, err, sizeof err)) {
        fprintf(stderr, "tetra data train-tokenizer: %s\n", err);
        rc = 1;
        goto out;
    }
    fprintf(stderr,
            "train-tokenizer: wrote %s: vocab %u (%u learned, %u duplicate merges skipped), %.2f s; on the input: "
            "%llu bytes -> %llu tokens, %.3f bytes/token\n",
            o.output_dir, o.vocab_size, st.merges, st.duplicate_merges, st.seconds, (unsigned long long)st.bytes,
            (unsigned long long)st.tokens, st.tokens ? (double)st.bytes / (double)st.tokens : 0.0);
    rc = 0;
out:
    free(inputs);
    free(specials);
    free(splist);
    return rc;
}

/* ---- dispatch ------------------------------------------------------------------- */
int data_cli_main(int argc, char **argv) {
    if (argc < 2) {
        usage_data(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (is_help(cmd) || !strcmp(cmd, "help")) {
        usage_data(stdout);
        return 0;
    }
    if (!strcmp(cmd, "encode")) return cmd_encode(argc - 1, argv + 1);
    if (!strcmp(cmd, "decode")) return cmd_decode(argc - 1, argv + 1);
    if (!strcmp(cmd, "train-tokenizer")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "prepare")) return data_prepare_main(argc - 1, argv + 1);
    fprintf(stderr, "tetra data: unknown command '%s'\n\n", cmd);
    usage_data(stderr);
    return 2;
}
