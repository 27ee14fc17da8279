/* pretok.c — regex pre-tokenizer on PCRE2 (UTF + UCP, JIT). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/pretok.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char PRETOK_LLAMA3_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char PRETOK_GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Unicode White_Space (what \s means in Rust's regex crate and Oniguruma). */
#define WS_ITEMS                                                                                                       \
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

struct pretok {
    pcre2_code *code;
    int jit;
    char *pattern;
};

struct pretok_ctx {
    pcre2_match_data *md;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
};

char *pretok_translate(const char *pat, char *err, size_t errlen) {
    size_t n = strlen(pat);
    size_t cap = n * 8 + sizeof WS_ITEMS * 4 + 16, o = 0;
    char *out = malloc(cap);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        if (o + sizeof WS_ITEMS + 8 >= cap) {
            cap *= 2;
            char *p = realloc(out, cap);
            if (!p) {
                free(out);
                snprintf(err, errlen, "out of memory");
                return NULL;
            }
            out = p;
        }
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char nx = pat[i + 1];
            if (nx == 's') {
                o += (size_t)sprintf(out + o, in_class ? "%s" : "[%s]", WS_ITEMS);
            } else if (nx == 'S') {
                if (in_class) {
                    free(out);
                    snprintf(err, errlen, "pre-tokenizer pattern: \\S inside a character class is not supported");
                    return NULL;
                }
                o += (size_t)sprintf(out + o, "[^%s]", WS_ITEMS);
            } else {
                out[o++] = c;
                out[o++] = nx;
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            out[o++] = c;
            if (i + 1 < n && pat[i + 1] == '^') out[o++] = pat[++i];
            if (i + 1 < n && pat[i + 1] == ']') out[o++] = pat[++i]; /* literal ] first in a class */
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && pat[i + 1] == ':') { /* POSIX [:name:] */
            const char *end = strstr(pat + i + 2, ":]");
            if (end) {
                size_t k = (size_t)(end + 2 - (pat + i));
                memcpy(out + o, pat + i, k);
                o += k;
                i += k - 1;
                continue;
            }
        }
        if (in_class && c == ']') in_class = 0;
        out[o++] = c;
    }
    out[o] = 0;
    return out;
}

pretok *pretok_compile(const char *pattern, char *err, size_t errlen) {
    char *tr = pretok_translate(pattern, err, errlen);
    if (!tr) return NULL;
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)tr, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    free(tr);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, errlen, "pre-tokenizer pattern does not compile: %s", (const char *)msg);
        return NULL;
    }
    pretok *p = calloc(1, sizeof *p);
    if (!p || !(p->pattern = strdup(pattern))) {
        pcre2_code_free(code);
        free(p);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->code = code;
    p->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return p;
}

void pretok_free(pretok *p) {
    if (!p) return;
    pcre2_code_free(p->code);
    free(p->pattern);
    free(p);
}

const char *pretok_pattern(const pretok *p) { return p->pattern; }

pretok_ctx *pretok_ctx_new(const pretok *p) {
    pretok_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->md = pcre2_match_data_create_from_pattern(p->code, NULL);
    c->mctx = pcre2_match_context_create(NULL);
    if (p->jit) {
        c->stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        if (c->stack && c->mctx) pcre2_jit_stack_assign(c->mctx, NULL, c->stack);
    }
    if (!c->md || !c->mctx) {
        pretok_ctx_free(c);
        return NULL;
    }
    return c;
}

void pretok_ctx_free(pretok_ctx *c) {
    if (!c) return;
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mctx);
    if (c->stack) pcre2_jit_stack_free(c->stack);
    free(c);
}

static size_t utf8_char_len(uint8_t b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

int pretok_split(const pretok *p, pretok_ctx *c, const uint8_t *text, size_t len, pretok_fn fn, void *user, char *err,
                 size_t errlen) {
    size_t pos = 0, gap = 0; /* gap: start of unmatched text not yet emitted */
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
    while (pos < len) {
        int rc;
        if (p->jit) rc = pcre2_jit_match(p->code, (PCRE2_SPTR)text, len, pos, 0, c->md, c->mctx);
        else rc = pcre2_match(p->code, (PCRE2_SPTR)text, len, pos, PCRE2_NO_UTF_CHECK, c->md, c->mctx);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT || rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
            rc == PCRE2_ERROR_HEAPLIMIT) {
            /* retry without JIT (the interpreter keeps its backtracking on the heap) */
            rc = pcre2_match(p->code, (PCRE2_SPTR)text, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, c->md, NULL);
        }
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            snprintf(err, errlen, "pre-tokenizer: regex match failed at byte %zu: %s", pos, (const char *)msg);
            return -1;
        }
        size_t s = ov[0], e = ov[1];
        if (e <= s) { /* empty match: step over one character, which joins the gap */
            pos = s + (s < len ? utf8_char_len(text[s]) : 1);
            continue;
        }
        if (s > gap) {
            int r = fn(text + gap, s - gap, user);
            if (r) return r;
        }
        int r = fn(text + s, e - s, user);
        if (r) return r;
        pos = gap = e;
    }
    if (gap < len) {
        int r = fn(text + gap, len - gap, user);
        if (r) return r;
    }
    return 0;
}
