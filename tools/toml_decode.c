/* toml_decode.c — toml-test decoder for tetra's TOML parser.
 *
 * Reads a TOML document from stdin. If it is valid, writes toml-test's tagged
 * JSON to stdout (every scalar as {"type": ..., "value": "..."}) and exits 0
 * without writing to stderr; otherwise writes "line:col: message" to stderr
 * and exits 1. JSON is produced by hand so that keys and strings containing
 * U+0000 survive and table order stays as in the document.
 */
#include "config/toml.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void put_json_string(FILE *out, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    putc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\b': fputs("\\b", out); break;
        case '\f': fputs("\\f", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            /* The parser guarantees valid UTF-8, so only controls need escaping. */
            if (c < 0x20 || c == 0x7F) fprintf(out, "\\u00%c%c", hex[c >> 4], hex[c & 15]);
            else putc(c, out);
        }
    }
    putc('"', out);
}

static void put_tagged(FILE *out, const char *type, const char *value) {
    fprintf(out, "{\"type\":\"%s\",\"value\":", type);
    put_json_string(out, value, strlen(value));
    putc('}', out);
}

static void put_value(FILE *out, const toml_value *v) {
    char buf[64];
    switch (v->type) {
    case TOML_TABLE:
        putc('{', out);
        for (size_t i = 0; i < v->u.tab.n; i++) {
            const toml_entry *e = &v->u.tab.entries[i];
            if (i) putc(',', out);
            put_json_string(out, e->key, e->key_len);
            putc(':', out);
            put_value(out, e->value);
        }
        putc('}', out);
        break;
    case TOML_ARRAY:
        putc('[', out);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i) putc(',', out);
            put_value(out, v->u.arr.items[i]);
        }
        putc(']', out);
        break;
    case TOML_STRING:
        fputs("{\"type\":\"string\",\"value\":", out);
        put_json_string(out, v->u.s.ptr, v->u.s.len);
        putc('}', out);
        break;
    case TOML_INTEGER:
        snprintf(buf, sizeof buf, "%" PRId64, v->u.i);
        put_tagged(out, "integer", buf);
        break;
    case TOML_FLOAT:
        toml_format_float(v->u.f, buf, sizeof buf);
        put_tagged(out, "float", buf);
        break;
    case TOML_BOOLEAN: put_tagged(out, "bool", v->u.b ? "true" : "false"); break;
    case TOML_OFFSET_DATETIME:
    case TOML_LOCAL_DATETIME:
    case TOML_LOCAL_DATE:
    case TOML_LOCAL_TIME: put_tagged(out, toml_type_name(v->type), v->u.dt.text); break;
    }
}

int main(void) {
    size_t cap = 1 << 16, len = 0;
    char *doc = malloc(cap);
    if (!doc) {
        fputs("out of memory\n", stderr);
        return 2;
    }
    for (;;) {
        if (len == cap) {
            char *n = realloc(doc, cap *= 2);
            if (!n) {
                fputs("out of memory\n", stderr);
                free(doc);
                return 2;
            }
            doc = n;
        }
        size_t got = fread(doc + len, 1, cap - len, stdin);
        len += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        perror("reading stdin");
        free(doc);
        return 2;
    }

    char err[512];
    toml_value *root = toml_parse(doc, len, err, sizeof err);
    free(doc);
    if (!root) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    put_value(stdout, root);
    putc('\n', stdout);
    toml_free(root);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        perror("writing stdout");
        return 2;
    }
    return 0;
}
