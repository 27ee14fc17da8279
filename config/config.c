#include "config/config.h"
#include "config/compat.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/mixture.h"
#include "config/toml.h"
#include "models/llama3/family.h"
#include "models/llama3/llama3_args.h"
#include "util/err.h"

/* ---- the descriptor tables, expanded from the schema ---------------------- */

#define OFF(S, K) offsetof(tetra_config_values, S.K)
#define CFG_SECTION(S, NAME, HELP)
#define CFG_END(S)
#define CFG_BOOL(S, K, D, H) {SECTION_NAME_##S, #K, CFG_T_BOOL, OFF(S, K), (D), 0.0, NULL, NULL, H},
#define CFG_INT(S, K, D, H) {SECTION_NAME_##S, #K, CFG_T_INT, OFF(S, K), (D), 0.0, NULL, NULL, H},
#define CFG_FLOAT(S, K, D, H) {SECTION_NAME_##S, #K, CFG_T_FLOAT, OFF(S, K), 0, (D), NULL, NULL, H},
#define CFG_STR(S, K, D, H) {SECTION_NAME_##S, #K, CFG_T_STR, OFF(S, K), 0, 0.0, (D), NULL, H},
#define CFG_ENUM(S, K, D, C, H) {SECTION_NAME_##S, #K, CFG_T_ENUM, OFF(S, K), 0, 0.0, (D), (C), H},
#define CFG_LIST(S, K, D, H) {SECTION_NAME_##S, #K, CFG_T_LIST, OFF(S, K), 0, 0.0, (D), NULL, H},
#define SECTION_NAME_job "job"
#define SECTION_NAME_profiling "profiling"
#define SECTION_NAME_metrics "metrics"
#define SECTION_NAME_model "model"
#define SECTION_NAME_optimizer "optimizer"
#define SECTION_NAME_lr_scheduler "lr_scheduler"
#define SECTION_NAME_training "training"
#define SECTION_NAME_parallelism "parallelism"
#define SECTION_NAME_checkpoint "checkpoint"
#define SECTION_NAME_activation_checkpoint "activation_checkpoint"
#define SECTION_NAME_compile "compile"
#define SECTION_NAME_quantize_linear_float8 "quantize.linear.float8"
#define SECTION_NAME_validation "validation"
#define SECTION_NAME_comm "comm"
#define SECTION_NAME_training_dataloader "training.dataloader"
#define SECTION_NAME_validation_dataloader "validation.dataloader"
#define SECTION_NAME_quantize_linear_mx "quantize.linear.mx"
#define SECTION_NAME_quantize_grouped_mm_float8 "quantize.grouped_mm.float8"
#define SECTION_NAME_quantize_grouped_mm_mx "quantize.grouped_mm.mx"
#define SECTION_NAME_memory_estimation "memory_estimation"
#define SECTION_NAME_fault_tolerance "fault_tolerance"
#define SECTION_NAME_experimental "experimental"
#define SECTION_NAME_debug "debug"
const cfg_key_desc cfg_keys[] = {
#include "config/schema.def"
};
#undef CFG_SECTION
#undef CFG_END
#undef CFG_BOOL
#undef CFG_INT
#undef CFG_FLOAT
#undef CFG_STR
#undef CFG_ENUM
#undef CFG_LIST
const int cfg_n_keys = (int)(sizeof cfg_keys / sizeof cfg_keys[0]);

#define CFG_SECTION(S, NAME, HELP) {NAME, HELP},
#define CFG_END(S)
#define CFG_BOOL(S, K, D, H)
#define CFG_INT(S, K, D, H)
#define CFG_FLOAT(S, K, D, H)
#define CFG_STR(S, K, D, H)
#define CFG_ENUM(S, K, D, C, H)
#define CFG_LIST(S, K, D, H)
const cfg_section_desc cfg_sections[] = {
#include "config/schema.def"
};
#undef CFG_SECTION
#undef CFG_END
#undef CFG_BOOL
#undef CFG_INT
#undef CFG_FLOAT
#undef CFG_STR
#undef CFG_ENUM
#undef CFG_LIST
const int cfg_n_sections = (int)(sizeof cfg_sections / sizeof cfg_sections[0]);

/* ---- small helpers ------------------------------------------------------- */

static char *xstrdup(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (!p) {
        fprintf(stderr, "tetra: out of memory\n");
        exit(1);
    }
    memcpy(p, s, n);
    return p;
}

static void *field(tetra_config *c, const cfg_key_desc *d) { return (char *)&c->v + d->offset; }
static const void *cfield(const tetra_config *c, const cfg_key_desc *d) { return (const char *)&c->v + d->offset; }

static void list_clear(cfg_list *l) {
    for (int i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    l->items = NULL;
    l->n = 0;
}

static void list_push(cfg_list *l, const char *s, size_t len) {
    char **p = realloc(l->items, sizeof(char *) * (size_t)(l->n + 1));
    char *item = malloc(len + 1);
    if (!p || !item) {
        fprintf(stderr, "tetra: out of memory\n");
        exit(1);
    }
    memcpy(item, s, len);
    item[len] = 0;
    l->items = p;
    l->items[l->n++] = item;
}

/* "a, b,c" -> [a, b, c]; empty text -> []. Items are trimmed. */
static void list_from_csv(cfg_list *l, const char *s) {
    list_clear(l);
    if (!s) return;
    const char *p = s;
    while (*p) {
        const char *comma = strchr(p, ',');
        const char *end = comma ? comma : p + strlen(p);
        const char *a = p, *b = end;
        while (a < b && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) b--;
        if (b > a || comma) list_push(l, a, (size_t)(b - a));
        if (!comma) break;
        p = comma + 1;
    }
}

static int key_index(const cfg_key_desc *d) { return (int)(d - cfg_keys); }

const cfg_key_desc *cfg_find_key(const char *section, const char *key) {
    for (int i = 0; i < cfg_n_keys; i++)
        if (strcmp(cfg_keys[i].section, section) == 0 && strcmp(cfg_keys[i].key, key) == 0) return &cfg_keys[i];
    return NULL;
}

static const cfg_key_desc *find_full(const char *full) {
    for (int i = 0; i < cfg_n_keys; i++) {
        size_t sl = strlen(cfg_keys[i].section);
        if (strncmp(full, cfg_keys[i].section, sl) == 0 && full[sl] == '.' &&
            strcmp(full + sl + 1, cfg_keys[i].key) == 0)
            return &cfg_keys[i];
    }
    return NULL;
}

static int is_section(const char *name) {
    for (int i = 0; i < cfg_n_sections; i++)
        if (strcmp(cfg_sections[i].name, name) == 0) return 1;
    return 0;
}

/* A proper prefix of a section name ("quantize", "quantize.linear"). */
static int is_section_prefix(const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < cfg_n_sections; i++)
        if (strncmp(cfg_sections[i].name, name, n) == 0 && cfg_sections[i].name[n] == '.') return 1;
    return 0;
}

size_t cfg_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 128 || lb > 128) return (size_t)-1;
    size_t row[129];
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t prev = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t cur = row[j];
            size_t sub = prev + (tolower((unsigned char)a[i - 1]) != tolower((unsigned char)b[j - 1]));
            size_t del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[lb];
}

/* Nearest "section.key" to `section.key`: same-name keys in other sections
 * first (catches TorchTitan's renamed keys), then the smallest edit distance. */
static void suggest_key(const char *section, const char *key, char *out, size_t n) {
    out[0] = 0;
    for (int i = 0; i < cfg_n_keys; i++)
        if (strcmp(cfg_keys[i].key, key) == 0) {
            snprintf(out, n, "%s.%s", cfg_keys[i].section, cfg_keys[i].key);
            return;
        }
    char full[256];
    snprintf(full, sizeof full, "%s.%s", section, key);
    size_t best = (size_t)-1;
    for (int i = 0; i < cfg_n_keys; i++) {
        char cand[256];
        snprintf(cand, sizeof cand, "%s.%s", cfg_keys[i].section, cfg_keys[i].key);
        size_t d = cfg_edit_distance(full, cand);
        /* within the section, also compare the bare key */
        if (strcmp(cfg_keys[i].section, section) == 0) {
            size_t dk = cfg_edit_distance(key, cfg_keys[i].key);
            if (dk < d) d = dk;
        }
        if (d < best) {
            best = d;
            snprintf(out, n, "%s", cand);
        }
    }
    if (best > strlen(key) / 2 + 3) out[0] = 0;
}

static void suggest_section(const char *name, char *out, size_t n) {
    out[0] = 0;
    size_t best = (size_t)-1;
    for (int i = 0; i < cfg_n_sections; i++) {
        size_t d = cfg_edit_distance(name, cfg_sections[i].name);
        if (d < best) {
            best = d;
            snprintf(out, n, "%s", cfg_sections[i].name);
        }
    }
    if (best > strlen(name) / 2 + 2) out[0] = 0;
}

/* ---- init / free --------------------------------------------------------- */

void cfg_init(tetra_config *c) {
    memset(c, 0, sizeof *c);
    c->origin = calloc((size_t)cfg_n_keys, sizeof(cfg_origin));
    if (!c->origin) {
        fprintf(stderr, "tetra: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < cfg_n_keys; i++) {
        const cfg_key_desc *d = &cfg_keys[i];
        void *p = field(c, d);
        switch (d->type) {
        case CFG_T_BOOL: *(int *)p = (int)d->def_i; break;
        case CFG_T_INT: *(int64_t *)p = d->def_i; break;
        case CFG_T_FLOAT: *(double *)p = d->def_f; break;
        case CFG_T_STR:
        case CFG_T_ENUM: *(char **)p = xstrdup(d->def_s); break;
        case CFG_T_LIST: list_from_csv((cfg_list *)p, d->def_s); break;
        }
    }
}

void cfg_free(tetra_config *c) {
    if (!c->origin) return;
    for (int i = 0; i < cfg_n_keys; i++) {
        const cfg_key_desc *d = &cfg_keys[i];
        void *p = field(c, d);
        if (d->type == CFG_T_STR || d->type == CFG_T_ENUM) {
            free(*(char **)p);
            *(char **)p = NULL;
        } else if (d->type == CFG_T_LIST) {
            list_clear((cfg_list *)p);
        }
    }
    free(c->origin);
    free(c->file);
    c->origin = NULL;
    c->file = NULL;
}

/* ---- setting values ------------------------------------------------------ */

static int check_choice(const cfg_key_desc *d, const char *v, const char *where, char *err, size_t n) {
    if (d->type != CFG_T_ENUM) return 0;
    const char *p = d->choices;
    size_t vl = strlen(v);
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == vl && strncmp(p, v, l) == 0) return 0;
        if (!bar) break;
        p = bar + 1;
    }
    util_set_err(err, n, "%s: %s.%s must be one of %s, got \"%s\"", where, d->section, d->key, d->choices, v);
    return -1;
}

static const char *type_word(cfg_type t) {
    switch (t) {
    case CFG_T_BOOL: return "a boolean";
    case CFG_T_INT: return "an integer";
    case CFG_T_FLOAT: return "a number";
    case CFG_T_STR: return "a string";
    case CFG_T_ENUM: return "a string";
    case CFG_T_LIST: return "an array of strings";
    }
    return "?";
}

static void describe_toml_value(const toml_value *v, char *out, size_t n) {
    switch (v->type) {
    case TOML_STRING: snprintf(out, n, "string \"%.40s\"", v->u.s.ptr); break;
    case TOML_INTEGER: snprintf(out, n, "integer %" PRId64, v->u.i); break;
    case TOML_FLOAT: snprintf(out, n, "float %g", v->u.f); break;
    case TOML_BOOLEAN: snprintf(out, n, "boolean %s", v->u.b ? "true" : "false"); break;
    default: snprintf(out, n, "%s", toml_type_name(v->type)); break;
    }
}

static int set_from_toml(tetra_config *c, const cfg_key_desc *d, const toml_value *v, const char *file, int line,
                         char *err, size_t n) {
    void *p = field(c, d);
    char where[600], got[96];
    snprintf(where, sizeof where, "%s:%d", file, line);
    describe_toml_value(v, got, sizeof got);
    switch (d->type) {
    case CFG_T_BOOL:
        if (v->type != TOML_BOOLEAN) goto type_error;
        *(int *)p = v->u.b;
        break;
    case CFG_T_INT:
        if (v->type != TOML_INTEGER) goto type_error;
        *(int64_t *)p = v->u.i;
        break;
    case CFG_T_FLOAT:
        if (v->type == TOML_FLOAT) *(double *)p = v->u.f;
        else if (v->type == TOML_INTEGER) *(double *)p = (double)v->u.i;
        else goto type_error;
        break;
    case CFG_T_STR:
    case CFG_T_ENUM:
        if (v->type != TOML_STRING) goto type_error;
        if (strlen(v->u.s.ptr) != v->u.s.len) {
            util_set_err(err, n, "%s: %s.%s contains a NUL character", where, d->section, d->key);
            return -1;
        }
        if (check_choice(d, v->u.s.ptr, where, err, n)) return -1;
        free(*(char **)p);
        *(char **)p = xstrdup(v->u.s.ptr);
        break;
    case CFG_T_LIST: {
        if (v->type != TOML_ARRAY) goto type_error;
        cfg_list *l = (cfg_list *)p;
        list_clear(l);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            const toml_value *it = v->u.arr.items[i];
            if (it->type != TOML_STRING) {
                describe_toml_value(it, got, sizeof got);
                util_set_err(err, n, "%s:%d: %s.%s expects an array of strings; item %zu is %s", file, it->line,
                             d->section, d->key, i, got);
                return -1;
            }
            list_push(l, it->u.s.ptr, it->u.s.len);
        }
        break;
    }
    }
    c->origin[key_index(d)].kind = CFG_FROM_FILE;
    c->origin[key_index(d)].line = line;
    return 0;
type_error:
    util_set_err(err, n, "%s: %s.%s expects %s, got %s", where, d->section, d->key, type_word(d->type), got);
    return -1;
}

/* ---- keys refused by name ---------------------------------------------------
 * Unknown, renamed and retired keys are collected over the file and the command line
 * and reported in one message, so a config from another TorchTitan era is ported in
 * one pass instead of one run per key. */
typedef struct {
    char text[6144];
    size_t len;
    int count;
} key_report;

static void report_key(key_report *r, const char *fmt, ...) {
    char line[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    r->count++;
    if (r->len + 8 >= sizeof r->text) return;
    int w = snprintf(r->text + r->len, sizeof r->text - r->len, "\n  %s", line);
    if (w > 0) r->len += (size_t)w < sizeof r->text - r->len ? (size_t)w : sizeof r->text - r->len - 1;
}

/* 0 when nothing was reported, else -1 with every line in err */
static int report_finish(const key_report *r, char *err, size_t n) {
    if (r->count == 0) return 0;
    if (r->count == 1) util_set_err(err, n, "%s", r->text + 3);
    else util_set_err(err, n, "%d keys are not taken (all of them below):%s", r->count, r->text);
    return -1;
}

/* The line for `path.key`, a key tetra does not take, at `where` ("FILE:LINE: ", or
 * "command line: " for an option): TorchTitan's older name with its new home, or the
 * nearest key. */
static void report_unknown_key(key_report *r, const char *where, const char *path, const char *key, int cli) {
    char full[512], hint[300];
    snprintf(full, sizeof full, "%s%s%s", path, path[0] ? "." : "", key);
    const char *now = cfg_compat_renamed(full);
    const char *dash = cli ? "--" : "";
    if (now && !strncmp(now, "refused: ", 9)) {
        report_key(r, "%s%s%s is not supported: %s", where, dash, full, now + 9);
        return;
    }
    if (now) {
        report_key(r, "%s%s%s is an older TorchTitan key, %s", where, dash, full, now);
        return;
    }
    suggest_key(path, key, hint, sizeof hint);
    if (cli && hint[0]) report_key(r, "%sunknown option --%s (did you mean --%s?)", where, full, hint);
    else if (cli) report_key(r, "%sunknown option --%s; `tetra train --help` lists the options", where, full);
    else if (hint[0]) report_key(r, "%sunknown key '%s' in [%s] (did you mean %s?)", where, key, path, hint);
    else report_key(r, "%sunknown key '%s' in [%s]; `tetra train --help` lists the keys", where, key, path);
}

/* An unknown table: its keys one by one when TorchTitan had them ([float8], [mx]),
 * else the table itself. */
static void report_unknown_table(key_report *r, const toml_value *t, const char *sub, const char *file, int line) {
    int known = 0;
    for (size_t i = 0; i < t->u.tab.n; i++) {
        char full[512];
        snprintf(full, sizeof full, "%s.%s", sub, t->u.tab.entries[i].key);
        known += cfg_compat_renamed(full) != NULL;
    }
    char where[600], hint[300];
    if (known) {
        for (size_t i = 0; i < t->u.tab.n; i++) {
            snprintf(where, sizeof where, "%s:%d: ", file, t->u.tab.entries[i].line);
            report_unknown_key(r, where, sub, t->u.tab.entries[i].key, 0);
        }
        return;
    }
    suggest_section(sub, hint, sizeof hint);
    if (hint[0]) report_key(r, "%s:%d: unknown section [%s] (did you mean [%s]?)", file, line, sub, hint);
    else report_key(r, "%s:%d: unknown section [%s]", file, line, sub);
}

/* An array whose elements are tables: what [[name]] (or name = [{...}]) makes. */
static int is_table_array(const toml_value *v) {
    return v->type == TOML_ARRAY && v->u.arr.n > 0 && v->u.arr.items[0]->type == TOML_TABLE;
}

/* Walk a table whose dotted path is `path` (empty for the root). Keys tetra does not
 * take go to the report; a value of the wrong type ends the walk at once. */
static int load_table(tetra_config *c, const toml_value *t, const char *path, const char *file, key_report *r,
                      char *err, size_t n) {
    int path_is_section = path[0] && is_section(path);
    for (size_t i = 0; i < t->u.tab.n; i++) {
        const toml_entry *e = &t->u.tab.entries[i];
        char sub[512], where[600];
        if (path[0]) snprintf(sub, sizeof sub, "%s.%s", path, e->key);
        else snprintf(sub, sizeof sub, "%s", e->key);
        snprintf(where, sizeof where, "%s:%d: ", file, e->line);
        if (e->value->type == TOML_TABLE && (is_section(sub) || is_section_prefix(sub))) {
            /* [training.dataloader] inside [training], [quantize.linear.float8] */
            if (load_table(c, e->value, sub, file, r, err, n)) return -1;
            continue;
        }
        if (path_is_section) {
            const cfg_key_desc *d = cfg_find_key(path, e->key);
            const char *retired = d ? cfg_compat_retired(sub) : NULL;
            if (!d) report_unknown_key(r, where, path, e->key, 0);
            else if (retired) report_key(r, "%s%s is not supported: %s", where, sub, retired);
            else if (set_from_toml(c, d, e->value, file, e->line, err, n)) return -1;
            continue;
        }
        char hint[300];
        if (is_table_array(e->value)) { /* [[training]]: TOML's array of tables, not a section */
            if (is_section(sub))
                report_key(r, "%s[[%s]] is an array of tables; a config section is one table: write [%s]", where, sub,
                           sub);
            else report_key(r, "%s[[%s]] is an array of tables, and no config section is named [%s]", where, sub, sub);
        } else if (e->value->type == TOML_TABLE) {
            report_unknown_table(r, e->value, sub, file, e->line);
        } else if (cfg_compat_renamed(sub)) {
            report_unknown_key(r, where, path, e->key, 0);
        } else {
            suggest_key(path, e->key, hint, sizeof hint);
            if (hint[0]) report_key(r, "%skey '%s' must be inside a section (did you mean %s?)", where, sub, hint);
            else report_key(r, "%skey '%s' is outside any known section", where, sub);
        }
    }
    return 0;
}

static int load_string(tetra_config *c, const char *name, const char *text, size_t len, key_report *r, char *err,
                       size_t n) {
    char perr[512];
    toml_value *root = toml_parse(text, len, perr, sizeof perr);
    if (!root) {
        util_set_err(err, n, "%s:%s", name, perr);
        return -1;
    }
    int rc = load_table(c, root, "", name, r, err, n);
    toml_free(root);
    if (rc == 0) {
        free(c->file);
        c->file = xstrdup(name);
    }
    return rc;
}

int cfg_load_string(tetra_config *c, const char *name, const char *text, size_t len, char *err, size_t n) {
    key_report r = {.len = 0};
    if (load_string(c, name, text, len, &r, err, n)) return -1;
    return report_finish(&r, err, n);
}

static int load_file(tetra_config *c, const char *path, key_report *r, char *err, size_t n) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) { /* fopen opens a folder; only the read fails */
        util_set_err(err, n,
                     "config file '%s' is a folder; job.config_file names a TOML file, such as "
                     "configs/debug_model.toml",
                     path);
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        util_set_err(err, n, "cannot open config file '%s': %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 14, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (len < cap) break;
        if (cap >= (size_t)16 << 20) { /* a config is a few KiB: this is the wrong file */
            fclose(f);
            free(buf);
            util_set_err(err, n, "config file '%s' is larger than 16 MiB; not a TOML config", path);
            return -1;
        }
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    int rd_err = ferror(f) ? errno : 0;
    fclose(f);
    if (!buf || rd_err) {
        free(buf);
        util_set_err(err, n, "cannot read config file '%s': %s", path, strerror(buf ? rd_err : ENOMEM));
        return -1;
    }
    int rc = load_string(c, path, buf, len, r, err, n);
    free(buf);
    return rc;
}

int cfg_load_file(tetra_config *c, const char *path, char *err, size_t n) {
    key_report r = {.len = 0};
    if (load_file(c, path, &r, err, n)) return -1;
    return report_finish(&r, err, n);
}

static int parse_int64(const char *s, int64_t *out) {
    if (!*s) return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end) return -1;
    *out = (int64_t)v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    if (!*s) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno == ERANGE && fabs(v) > 1.0) return -1;
    if (*end) return -1;
    *out = v;
    return 0;
}

static int set_from_text(tetra_config *c, const cfg_key_desc *d, const char *v, char *err, size_t n) {
    void *p = field(c, d);
    const char *where = "command line";
    switch (d->type) {
    case CFG_T_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "1")) *(int *)p = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "0")) *(int *)p = 0;
        else {
            util_set_err(err, n, "%s: --%s.%s expects true or false, got \"%s\"", where, d->section, d->key, v);
            return -1;
        }
        break;
    case CFG_T_INT: {
        int64_t x;
        if (parse_int64(v, &x)) {
            util_set_err(err, n, "%s: --%s.%s expects an integer, got \"%s\"", where, d->section, d->key, v);
            return -1;
        }
        *(int64_t *)p = x;
        break;
    }
    case CFG_T_FLOAT: {
        double x;
        if (parse_double(v, &x)) {
            util_set_err(err, n, "%s: --%s.%s expects a number, got \"%s\"", where, d->section, d->key, v);
            return -1;
        }
        *(double *)p = x;
        break;
    }
    case CFG_T_STR:
    case CFG_T_ENUM:
        if (check_choice(d, v, where, err, n)) return -1;
        free(*(char **)p);
        *(char **)p = xstrdup(v);
        break;
    case CFG_T_LIST: list_from_csv((cfg_list *)p, v); break;
    }
    c->origin[key_index(d)].kind = CFG_FROM_CLI;
    c->origin[key_index(d)].line = 0;
    return 0;
}

static void split_full(const char *full, char *section, size_t cap, const char **key) {
    const char *dot = strrchr(full, '.');
    section[0] = 0;
    *key = full;
    if (dot) {
        snprintf(section, cap, "%.*s", (int)(dot - full), full);
        *key = dot + 1;
    }
}

/* One option of the command line: its key, or the report's line for one tetra does not
 * take (1), or a bad value (-1). */
static int set_option(tetra_config *c, const char *full, const char *value, key_report *r, char *err, size_t n) {
    const cfg_key_desc *d = find_full(full);
    const char *retired = d ? cfg_compat_retired(full) : NULL;
    if (!d) {
        char section[256];
        const char *key;
        split_full(full, section, sizeof section, &key);
        report_unknown_key(r, "command line: ", section, key, 1);
        return 1;
    }
    if (retired) {
        report_key(r, "command line: --%s is not supported: %s", full, retired);
        return 1;
    }
    return set_from_text(c, d, value, err, n);
}

int cfg_set_string(tetra_config *c, const char *full, const char *value, char *err, size_t n) {
    key_report r = {.len = 0};
    if (set_option(c, full, value, &r, err, n) < 0) return -1;
    return report_finish(&r, err, n);
}

static void print_help_usage(FILE *out) {
    fprintf(out,
            "usage: tetra train [--dry-run] [--job.config_file FILE] [--section.key VALUE ...]\n"
            "\n"
            "Trains a Llama 3 model. Values come from the defaults below, then the TOML\n"
            "file, then the command line (last wins). Forms: --section.key VALUE,\n"
            "--section.key=VALUE; booleans: --section.flag, --section.flag true|false,\n"
            "--section.flag=true|false, --section.no_flag or --section.no-flag; tyro's\n"
            "dashed names (--metrics.enable-tensorboard) read as underscores;\n"
            "comma-separated lists (--model.converters float8).\n"
            "\n"
            "--dry-run lays out the run (model, FSDP shards and working buffers, optimizer\n"
            "state, activations) for the world it is launched with, prints every rank's\n"
            "memory by category, and exits without allocating device memory or reading\n"
            "data; training.device = \"cuda\" plans for the GPU on a machine without one.\n\n");
}

/* "--section.key[=value]" -> name (tyro's dashes read as underscores: --metrics.
 * enable-tensorboard, --metrics.no-enable-tensorboard) and the value after '=', or
 * NULL. -1 when the name does not fit. */
static int option_name(const char *a, char *name, size_t cap, const char **value) {
    const char *eq = strchr(a + 2, '=');
    size_t nl = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
    if (nl >= cap) return -1;
    for (size_t i = 0; i < nl; i++) name[i] = a[2 + i] == '-' ? '_' : a[2 + i];
    name[nl] = 0;
    *value = eq ? eq + 1 : NULL;
    return 0;
}

/* The value of --job.config_file (or --job.config-file), else NULL; 1 for --help. */
static int find_config_file(int argc, char **argv, FILE *out, const char **file, char *err, size_t n) {
    *file = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_help_usage(out);
            cfg_print_help(out);
            return 1;
        }
        char name[512];
        const char *value;
        if (strncmp(argv[i], "--", 2) != 0 || option_name(argv[i], name, sizeof name, &value) ||
            strcmp(name, "job.config_file") != 0)
            continue;
        if (!value && i + 1 >= argc) {
            util_set_err(err, n, "command line: --job.config_file needs a file name");
            return -1;
        }
        *file = value ? value : argv[++i];
    }
    return 0;
}

/* --section.no_flag: the boolean set to false; 0 when `name` is no such option */
static int set_negated(tetra_config *c, const char *name, const char *value, int *rc, char *err, size_t n) {
    const char *dot = strrchr(name, '.');
    if (!dot || strncmp(dot + 1, "no_", 3) != 0) return 0;
    char pos[512];
    snprintf(pos, sizeof pos, "%.*s.%s", (int)(dot - name), name, dot + 4);
    const cfg_key_desc *b = find_full(pos);
    if (!b || b->type != CFG_T_BOOL) return 0;
    if (value) {
        util_set_err(err, n, "command line: --%s takes no value", name);
        *rc = -1;
    } else {
        *rc = set_from_text(c, b, "false", err, n);
    }
    return 1;
}

/* The options after the file, in order; the ones tetra does not take go to the report. */
static int parse_options(tetra_config *c, int argc, char **argv, key_report *r, char *err, size_t n) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *value;
        char name[512];
        if (strncmp(a, "--", 2) != 0 || !a[2]) {
            util_set_err(err, n, "command line: unexpected argument '%s' (options look like --section.key VALUE)", a);
            return -1;
        }
        if (option_name(a, name, sizeof name, &value)) {
            util_set_err(err, n, "command line: option too long: %.60s...", a);
            return -1;
        }
        if (!strcmp(name, "job.config_file")) {
            if (!value) i++;
            continue;
        }
        const cfg_key_desc *d = find_full(name);
        int rc = 0;
        if (!d && set_negated(c, name, value, &rc, err, n)) {
            if (rc) return -1;
            continue;
        }
        if (!value && (!d || d->type != CFG_T_BOOL)) {
            if (i + 1 >= argc || (!d && !strncmp(argv[i + 1], "--", 2))) {
                if (d) {
                    util_set_err(err, n, "command line: --%s needs a value (%s)", name, type_word(d->type));
                    return -1;
                }
            } else {
                value = argv[++i];
            }
        } else if (!value) { /* --flag, or --flag true|false */
            value = "true";
            if (i + 1 < argc && (!strcmp(argv[i + 1], "true") || !strcmp(argv[i + 1], "false"))) value = argv[++i];
        }
        if (set_option(c, name, value ? value : "", r, err, n) < 0) return -1;
    }
    return 0;
}

int cfg_parse_args(tetra_config *c, int argc, char **argv, FILE *out, char *err, size_t n) {
    /* The file first, so command-line options override it wherever they appear. */
    const char *config_file = NULL;
    int rc = find_config_file(argc, argv, out, &config_file, err, n);
    if (rc) return rc;
    key_report r = {.len = 0};
    if (config_file) {
        if (load_file(c, config_file, &r, err, n)) return -1;
        const cfg_key_desc *d = cfg_find_key("job", "config_file");
        char **p = (char **)field(c, d);
        free(*p);
        *p = xstrdup(config_file);
        c->origin[key_index(d)].kind = CFG_FROM_CLI;
    }
    if (parse_options(c, argc, argv, &r, err, n) || report_finish(&r, err, n)) return -1;
    return cfg_compat_resolve(c, err, n);
}

/* ---- printing ------------------------------------------------------------ */

static void print_toml_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
            else fputc(*p, f);
        }
    }
    fputc('"', f);
}

static void print_toml_float(FILE *f, double x) {
    if (isnan(x)) {
        fputs("nan", f);
        return;
    }
    if (isinf(x)) {
        fputs(x > 0 ? "inf" : "-inf", f);
        return;
    }
    char buf[64];
    /* shortest text that reads back as the same double */
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (!strpbrk(buf, ".eEn")) strcat(buf, ".0");
    else if (strchr(buf, 'e') && !strchr(buf, '.')) {
        /* TOML accepts 1e-05; keep as is */
    }
    fputs(buf, f);
}

static int value_is_set(const cfg_key_desc *d, const void *p) {
    if (d->type == CFG_T_FLOAT) return !isnan(*(const double *)p);
    if (d->type == CFG_T_STR || d->type == CFG_T_ENUM) return *(char *const *)p != NULL;
    return 1;
}

static void print_value(FILE *f, const cfg_key_desc *d, const void *p);

int cfg_is_changed(const tetra_config *c, const cfg_key_desc *d) {
    if (c->origin[key_index(d)].kind == CFG_FROM_DEFAULT) return 0;
    const void *p = cfield(c, d);
    switch (d->type) {
    case CFG_T_BOOL: return *(const int *)p != (int)d->def_i;
    case CFG_T_INT: return *(const int64_t *)p != d->def_i;
    case CFG_T_FLOAT: {
        double x = *(const double *)p;
        return isnan(d->def_f) ? !isnan(x) : x != d->def_f;
    }
    case CFG_T_STR:
    case CFG_T_ENUM: {
        const char *x = *(char *const *)p;
        if (!x || !d->def_s) return x != d->def_s;
        return strcmp(x, d->def_s) != 0;
    }
    case CFG_T_LIST: {
        cfg_list def = {NULL, 0};
        list_from_csv(&def, d->def_s);
        const cfg_list *l = (const cfg_list *)p;
        int diff = l->n != def.n;
        for (int i = 0; i < l->n && !diff; i++) diff = strcmp(l->items[i], def.items[i]) != 0;
        list_clear(&def);
        return diff;
    }
    }
    return 1;
}

const char *cfg_value_text(const tetra_config *c, const cfg_key_desc *d, char *buf, size_t n) {
    FILE *f = fmemopen(buf, n, "w");
    if (!f) {
        snprintf(buf, n, "?");
        return buf;
    }
    print_value(f, d, cfield(c, d));
    fclose(f);
    buf[n - 1] = 0;
    return buf;
}

static void print_value(FILE *f, const cfg_key_desc *d, const void *p) {
    switch (d->type) {
    case CFG_T_BOOL: fputs(*(const int *)p ? "true" : "false", f); break;
    case CFG_T_INT: fprintf(f, "%" PRId64, *(const int64_t *)p); break;
    case CFG_T_FLOAT: print_toml_float(f, *(const double *)p); break;
    case CFG_T_STR:
    case CFG_T_ENUM: print_toml_string(f, *(char *const *)p); break;
    case CFG_T_LIST: {
        const cfg_list *l = (const cfg_list *)p;
        fputc('[', f);
        for (int i = 0; i < l->n; i++) {
            if (i) fputs(", ", f);
            print_toml_string(f, l->items[i]);
        }
        fputc(']', f);
        break;
    }
    }
}

void cfg_print_toml(const tetra_config *c, FILE *f) {
    fprintf(f, "# tetra merged configuration (defaults < %s < command line)\n", c->file ? c->file : "no file");
    for (int s = 0; s < cfg_n_sections; s++) {
        fprintf(f, "\n[%s]\n", cfg_sections[s].name);
        for (int i = 0; i < cfg_n_keys; i++) {
            const cfg_key_desc *d = &cfg_keys[i];
            if (strcmp(d->section, cfg_sections[s].name) != 0) continue;
            if (!strcmp(d->section, "job") && !strcmp(d->key, "config_file")) {
                const char *cf = *(char *const *)cfield(c, d);
                if (cf) {
                    fputs("# config_file = ", f);
                    print_toml_string(f, cf);
                    fputs("  (command line only)\n", f);
                }
                continue;
            }
            const void *p = cfield(c, d);
            if (!value_is_set(d, p)) {
                fprintf(f, "# %s = (not set)\n", d->key);
                continue;
            }
            fprintf(f, "%s = ", d->key);
            print_value(f, d, p);
            fputc('\n', f);
        }
    }
}

void cfg_print_help(FILE *f) {
    for (int s = 0; s < cfg_n_sections; s++) {
        fprintf(f, "[%s] %s\n", cfg_sections[s].name, cfg_sections[s].help);
        for (int i = 0; i < cfg_n_keys; i++) {
            const cfg_key_desc *d = &cfg_keys[i];
            if (strcmp(d->section, cfg_sections[s].name) != 0) continue;
            const char *ty = d->type == CFG_T_BOOL ? "bool"
                : d->type == CFG_T_INT             ? "int"
                : d->type == CFG_T_FLOAT           ? "float"
                : d->type == CFG_T_LIST            ? "list"
                                                   : "str";
            fprintf(f, "  --%s.%s  %s", d->section, d->key, d->type == CFG_T_ENUM ? d->choices : ty);
            fputs("  (default: ", f);
            switch (d->type) {
            case CFG_T_BOOL: fputs(d->def_i ? "true" : "false", f); break;
            case CFG_T_INT: fprintf(f, "%" PRId64, d->def_i); break;
            case CFG_T_FLOAT:
                if (isnan(d->def_f)) fputs("not set", f);
                else print_toml_float(f, d->def_f);
                break;
            case CFG_T_STR:
            case CFG_T_ENUM:
                if (d->def_s) print_toml_string(f, d->def_s);
                else fputs("not set", f);
                break;
            case CFG_T_LIST: fprintf(f, "[%s]", d->def_s); break;
            }
            fprintf(f, ")\n      %s\n", d->help);
        }
        fputc('\n', f);
    }
}

const char *cfg_origin_str(const tetra_config *c, const char *section, const char *key, char *buf, size_t n) {
    const cfg_key_desc *d = cfg_find_key(section, key);
    if (!d) return "?";
    const cfg_origin *o = &c->origin[key_index(d)];
    if (o->kind == CFG_FROM_FILE) snprintf(buf, n, "%s:%d", c->file ? c->file : "?", o->line);
    else if (o->kind == CFG_FROM_CLI) snprintf(buf, n, "command line");
    else snprintf(buf, n, "default");
    return buf;
}

/* ---- cross-key rules ------------------------------------------------------ */

#define WHERE(S, K) cfg_origin_str(c, S, K, wbuf[wi++ % 4], sizeof wbuf[0])

/* training.dataset_mix: "PATH:WEIGHT" entries, each path once, weights that give every
 * source a sample per block; not together with dataset_path (which one would it be?). */
static int check_dataset_mix(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const cfg_list *l = &c->v.training.dataset_mix;
    if (l->n == 0) return 0;
    const char *where = WHERE("training", "dataset_mix");
    if (c->v.training.dataset_path && *c->v.training.dataset_path) {
        util_set_err(err, n,
                     "%s: training.dataset_mix and training.dataset_path (%s) are both set: the mixture lists every "
                     "corpus, so leave dataset_path out",
                     where, WHERE("training", "dataset_path"));
        return -1;
    }
    if (l->n > MIX_MAX_SOURCES) {
        util_set_err(err, n, "%s: training.dataset_mix has %d sources, more than %d", where, l->n, MIX_MAX_SOURCES);
        return -1;
    }
    double w[MIX_MAX_SOURCES];
    char e[1024], path[4096], other[4096];
    for (int i = 0; i < l->n; i++) {
        if (mix_parse_entry(l->items[i], path, sizeof path, &w[i], e, sizeof e) != 0) {
            util_set_err(err, n, "%s: training.dataset_mix item %d: %s", where, i + 1, e);
            return -1;
        }
        for (int k = 0; k < i; k++) {
            double wk;
            if (mix_parse_entry(l->items[k], other, sizeof other, &wk, e, sizeof e) == 0 && !strcmp(other, path)) {
                util_set_err(err, n, "%s: training.dataset_mix lists %s twice (items %d and %d)", where, path, k + 1,
                             i + 1);
                return -1;
            }
        }
    }
    mix_plan m;
    if (mix_plan_init(&m, w, l->n, 0, e, sizeof e) != 0) {
        util_set_err(err, n, "%s: training.dataset_mix: %s", where, e);
        return -1;
    }
    mix_plan_free(&m);
    return 0;
}

/* The layout and batch numbers the rules below resolve one after another: the degrees
 * (data_parallel_shard_degree = -1 resolved against the world size) first, then the
 * data-parallel degree and the global batch that cfg_validate reports in *dims. */
typedef struct {
    int64_t rep, tp, pp, cp, shard;
    int64_t dp, gbs, per_step;
} resolved_layout;

/* The world size, the backend against the device, and each parallel degree on its own. */
static int check_parallel_degrees(const tetra_config *c, int world, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    const char *par = "parallelism";
    if (world < 1) {
        util_set_err(err, n, "world size must be at least 1 (got %d)", world);
        return -1;
    }
    struct {
        const char *key;
        int64_t val;
    } deg[] = {
        {"data_parallel_replicate_degree", v->parallelism.data_parallel_replicate_degree},
        {"tensor_parallel_degree", v->parallelism.tensor_parallel_degree},
        {"pipeline_parallel_degree", v->parallelism.pipeline_parallel_degree},
        {"context_parallel_degree", v->parallelism.context_parallel_degree},
        {"expert_parallel_degree", v->parallelism.expert_parallel_degree},
        {"expert_tensor_parallel_degree", v->parallelism.expert_tensor_parallel_degree},
    };
    if (!strcmp(v->comm.backend, "nccl") && !strcmp(v->training.device, "cpu")) {
        util_set_err(err, n,
                     "%s: comm.backend = \"nccl\" moves GPU buffers, but training.device = \"cpu\" keeps them in "
                     "host memory (use \"auto\" or \"mpi\")",
                     WHERE("comm", "backend"));
        return -1;
    }
    for (size_t i = 0; i < sizeof deg / sizeof deg[0]; i++)
        if (deg[i].val < 1) {
            util_set_err(err, n, "%s: parallelism.%s must be >= 1 (got %" PRId64 ")", WHERE(par, deg[i].key),
                         deg[i].key, deg[i].val);
            return -1;
        }
    if (v->parallelism.expert_parallel_degree != 1 || v->parallelism.expert_tensor_parallel_degree != 1) {
        util_set_err(err, n, "%s: expert parallelism needs a mixture-of-experts model; Llama 3 is dense, so keep it 1",
                     WHERE(par,
                           v->parallelism.expert_parallel_degree != 1 ? "expert_parallel_degree"
                                                                      : "expert_tensor_parallel_degree"));
        return -1;
    }
    return 0;
}

/* Resolves data_parallel_shard_degree = -1 to the ranks the other degrees leave, and
 * checks that the degrees multiply to exactly the world size. */
static int resolve_layout(const tetra_config *c, int world, resolved_layout *l, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    int64_t rep = v->parallelism.data_parallel_replicate_degree, tp = v->parallelism.tensor_parallel_degree,
            pp = v->parallelism.pipeline_parallel_degree, cp = v->parallelism.context_parallel_degree,
            shard = v->parallelism.data_parallel_shard_degree;
    int64_t others = rep * tp * pp * cp;
    if (shard == -1) {
        if (world % others != 0) {
            util_set_err(err, n,
                         "parallel layout: world size %d is not divisible by data_parallel_replicate_degree (%" PRId64
                         ") x tensor_parallel_degree (%" PRId64 ") x pipeline_parallel_degree (%" PRId64
                         ") x context_parallel_degree (%" PRId64 ") = %" PRId64
                         ", so data_parallel_shard_degree = -1 cannot take the rest",
                         world, rep, tp, pp, cp, others);
            return -1;
        }
        shard = world / others;
    } else if (shard < 1) {
        util_set_err(err, n, "%s: parallelism.data_parallel_shard_degree must be -1 or >= 1 (got %" PRId64 ")",
                     WHERE("parallelism", "data_parallel_shard_degree"), shard);
        return -1;
    }
    if (shard * others != world) {
        util_set_err(err, n,
                     "parallel layout: pipeline (%" PRId64 ") x data_parallel_replicate (%" PRId64
                     ") x data_parallel_shard (%" PRId64 ") x context (%" PRId64 ") x tensor (%" PRId64 ") = %" PRId64
                     " ranks, but the world size is %d "
                     "(NGPU / mpirun -np); set data_parallel_shard_degree = -1 to take the rest",
                     pp, rep, shard, cp, tp, shard * others, world);
        return -1;
    }
    l->rep = rep;
    l->tp = tp;
    l->pp = pp;
    l->cp = cp;
    l->shard = shard;
    return 0;
}

/* model.name, model.flavor and the overrides on it, and whether tensor parallel can split
 * the flavor's heads, vocabulary and FFN evenly. */
void cfg_model_args(const tetra_config_values *v, llama3_args *a) {
    llama3_flavor(v->model.flavor, a);
    if (v->model.vocab_size > 0) a->vocab_size = (int)v->model.vocab_size;
    if (v->model.n_layers > 0) a->n_layers = (int)v->model.n_layers;
    if (v->model.attn_mask_type) llama3_parse_mask(v->model.attn_mask_type, &a->attn_mask_type);
    a->reset_positions = v->model.reset_positions_at_document_boundaries != 0;
}

void cfg_model(const tetra_config_values *v, model_args *out) {
    llama3_args a;
    cfg_model_args(v, &a);
    *out = llama3_model_args(&a);
    /* the model keys are Llama's: the family model.name names receives them as they are */
    const model_family *f = model_family_find(v->model.name);
    if (f) out->family = f;
}

static int check_model(const tetra_config *c, int64_t tp, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    llama3_args a;
    if (!model_family_find(v->model.name)) {
        char names[256];
        model_family_names(names, sizeof names);
        util_set_err(err, n, "%s: model.name \"%s\" is not supported (models: %s)", WHERE("model", "name"),
                     v->model.name, names);
        return -1;
    }
    if (llama3_flavor(v->model.flavor, &a) != 0) {
        util_set_err(err, n, "%s: model.flavor \"%s\" is unknown (flavors: %s)", WHERE("model", "flavor"),
                     v->model.flavor, llama3_flavor_names());
        return -1;
    }
    if (v->model.n_layers < 0) {
        util_set_err(err, n, "%s: model.n_layers must be >= 0 (0 = the flavor's %d), got %" PRId64,
                     WHERE("model", "n_layers"), a.n_layers, v->model.n_layers);
        return -1;
    }
    if (v->model.vocab_size < 0 || v->model.vocab_size > (int64_t)1 << 30) {
        util_set_err(err, n, "%s: model.vocab_size must be between 1 and 2^30 (0 = the flavor's %d), got %" PRId64,
                     WHERE("model", "vocab_size"), a.vocab_size, v->model.vocab_size);
        return -1;
    }
    llama3_mask mask;
    if (v->model.attn_mask_type && llama3_parse_mask(v->model.attn_mask_type, &mask) != 0) {
        util_set_err(err, n,
                     "%s: model.attn_mask_type \"%s\" is unknown (causal or block_causal; not set = the flavor's, "
                     "%s for %s)",
                     WHERE("model", "attn_mask_type"), v->model.attn_mask_type, llama3_mask_name(a.attn_mask_type),
                     a.flavor);
        return -1;
    }
    cfg_model_args(v, &a); /* every value is valid: the one rule every reader uses */
    if (tp > 1 && (a.n_kv_heads % tp != 0 || a.n_heads % tp != 0)) {
        util_set_err(err, n,
                     "%s: tensor_parallel_degree %" PRId64
                     " must divide the %s flavor's n_heads (%d) and n_kv_heads (%d)",
                     WHERE("parallelism", "tensor_parallel_degree"), tp, a.flavor, a.n_heads, a.n_kv_heads);
        return -1;
    }
    if (tp > 1 && (a.vocab_size % tp != 0 || llama3_ffn_hidden(&a) % tp != 0)) {
        util_set_err(err, n,
                     "%s: tensor_parallel_degree %" PRId64
                     " must divide the %s flavor's vocab_size (%d) and FFN hidden size "
                     "(%lld): each rank holds a whole share of the vocabulary and of the hidden units",
                     WHERE("parallelism", "tensor_parallel_degree"), tp, a.flavor, a.vocab_size,
                     (long long)llama3_ffn_hidden(&a));
        return -1;
    }
    return 0;
}

/* Training and validation sequence lengths against context and tensor (sequence) parallel. */
static int check_seq_len(const tetra_config *c, int64_t cp, int64_t tp, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    int64_t seq = v->training.seq_len;
    if (seq < 1) {
        util_set_err(err, n, "%s: training.seq_len must be >= 1 (got %" PRId64 ")", WHERE("training", "seq_len"), seq);
        return -1;
    }
    if (cp > 1 && seq % (2 * cp * tp) != 0) {
        util_set_err(err, n,
                     "%s: training.seq_len %" PRId64 " must be divisible by 2 x context_parallel_degree x "
                     "tensor_parallel_degree = %" PRId64 " (context parallel splits it into 2*cp load-balanced chunks)",
                     WHERE("training", "seq_len"), seq, 2 * cp * tp);
        return -1;
    }
    if (cp > 1 && v->validation.enable && v->validation.seq_len % (2 * cp * tp) != 0) {
        util_set_err(err, n,
                     "%s: validation.seq_len %" PRId64 " must be divisible by 2 x context_parallel_degree x "
                     "tensor_parallel_degree = %" PRId64,
                     WHERE("validation", "seq_len"), v->validation.seq_len, 2 * cp * tp);
        return -1;
    }
    if (tp > 1 && seq % tp != 0) {
        util_set_err(err, n,
                     "%s: training.seq_len %" PRId64 " must be divisible by tensor_parallel_degree %" PRId64
                     " (sequence parallel)",
                     WHERE("training", "seq_len"), seq, tp);
        return -1;
    }
    if (tp > 1 && v->validation.enable && v->validation.seq_len % tp != 0) {
        util_set_err(err, n,
                     "%s: validation.seq_len %" PRId64 " must be divisible by tensor_parallel_degree %" PRId64
                     " (sequence parallel)",
                     WHERE("validation", "seq_len"), v->validation.seq_len, tp);
        return -1;
    }
    return 0;
}

/* Batch size, steps and max_norm; resolves global_batch_size = -1 to one step's worth
 * over the data-parallel ranks, so l->gbs / l->per_step is the gradient accumulation. */
static int check_batch(const tetra_config *c, resolved_layout *l, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->training.local_batch_size < 1) {
        util_set_err(err, n, "%s: training.local_batch_size must be >= 1", WHERE("training", "local_batch_size"));
        return -1;
    }
    if (v->training.steps < 1) {
        util_set_err(err, n, "%s: training.steps must be >= 1", WHERE("training", "steps"));
        return -1;
    }
    if (v->training.max_norm <= 0 || isnan(v->training.max_norm)) {
        util_set_err(err, n, "%s: training.max_norm must be > 0", WHERE("training", "max_norm"));
        return -1;
    }
    int64_t dp = l->rep * l->shard;
    int64_t gbs = v->training.global_batch_size;
    int64_t per_step = v->training.local_batch_size * dp;
    if (gbs == -1) gbs = per_step;
    if (gbs < 1 || gbs % per_step != 0) {
        util_set_err(err, n,
                     "%s: training.global_batch_size %" PRId64 " must be -1 or a multiple of local_batch_size (%" PRId64
                     ") x data-parallel degree (%" PRId64 ") = %" PRId64,
                     WHERE("training", "global_batch_size"), v->training.global_batch_size,
                     v->training.local_batch_size, dp, per_step);
        return -1;
    }
    l->dp = dp;
    l->gbs = gbs;
    l->per_step = per_step;
    return 0;
}

/* The pipeline keys: microbatches, the layer split, and a schedule only where there is a
 * pipeline to run it. */
static int check_pipeline(const tetra_config *c, int64_t pp, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    const char *par = "parallelism";
    if (v->parallelism.pipeline_parallel_microbatch_size < 1) {
        util_set_err(err, n, "%s: parallelism.pipeline_parallel_microbatch_size must be >= 1",
                     WHERE(par, "pipeline_parallel_microbatch_size"));
        return -1;
    }
    if (pp > 1 && v->training.local_batch_size % v->parallelism.pipeline_parallel_microbatch_size != 0) {
        util_set_err(err, n,
                     "%s: training.local_batch_size %" PRId64 " must be divisible by "
                     "parallelism.pipeline_parallel_microbatch_size %" PRId64,
                     WHERE("training", "local_batch_size"), v->training.local_batch_size,
                     v->parallelism.pipeline_parallel_microbatch_size);
        return -1;
    }
    if (v->parallelism.module_fqns_per_model_part.n > 0) {
        util_set_err(err, n,
                     "%s: parallelism.module_fqns_per_model_part (a split by module names) is not supported; "
                     "tetra splits Llama by pipeline_parallel_layers_per_stage and "
                     "pipeline_parallel_first/last_stage_less_layers",
                     WHERE(par, "module_fqns_per_model_part"));
        return -1;
    }
    if (v->parallelism.pipeline_parallel_first_stage_less_layers < 0 ||
        v->parallelism.pipeline_parallel_last_stage_less_layers < 0 ||
        v->parallelism.pipeline_parallel_layers_per_stage < 0) {
        util_set_err(err, n,
                     "%s: parallelism.pipeline_parallel_first_stage_less_layers, _last_stage_less_layers and "
                     "_layers_per_stage must be >= 0",
                     WHERE(par, "pipeline_parallel_layers_per_stage"));
        return -1;
    }
    if (pp == 1 && v->parallelism.pipeline_parallel_schedule_csv && v->parallelism.pipeline_parallel_schedule_csv[0]) {
        util_set_err(err, n,
                     "%s: parallelism.pipeline_parallel_schedule_csv is set but pipeline_parallel_degree is 1: "
                     "a pipeline schedule needs at least 2 pipeline ranks",
                     WHERE(par, "pipeline_parallel_schedule_csv"));
        return -1;
    }
    return 0;
}

/* The flight recorder's size and where its traces go. */
static int check_comm_traces(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->comm.trace_buf_size < 0 || v->comm.trace_buf_size > 10000000) {
        util_set_err(err, n,
                     "%s: comm.trace_buf_size must be 0 (no flight recorder) to 10000000 operations, got %" PRId64,
                     WHERE("comm", "trace_buf_size"), v->comm.trace_buf_size);
        return -1;
    }
    if (!*v->comm.save_traces_folder || strchr(v->comm.save_traces_file_prefix, '/')) {
        util_set_err(err, n,
                     "%s: comm.save_traces_folder must not be empty and comm.save_traces_file_prefix must not "
                     "hold a '/'",
                     WHERE("comm", *v->comm.save_traces_folder ? "save_traces_file_prefix" : "save_traces_folder"));
        return -1;
    }
    return 0;
}

/* Step counts: the non-finite step limit and the LR warmup and decay. */
static int check_step_counts(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->training.max_consecutive_nonfinite_steps < 0) {
        util_set_err(err, n, "%s: training.max_consecutive_nonfinite_steps must be >= 0 (0 = no limit), got %" PRId64,
                     WHERE("training", "max_consecutive_nonfinite_steps"), v->training.max_consecutive_nonfinite_steps);
        return -1;
    }
    if (v->lr_scheduler.warmup_steps < 0) {
        util_set_err(err, n, "%s: lr_scheduler.warmup_steps must be >= 0", WHERE("lr_scheduler", "warmup_steps"));
        return -1;
    }
    if (!isnan(v->lr_scheduler.decay_ratio) && (v->lr_scheduler.decay_ratio < 0 || v->lr_scheduler.decay_ratio > 1)) {
        util_set_err(err, n, "%s: lr_scheduler.decay_ratio must be between 0 and 1 (got %g)",
                     WHERE("lr_scheduler", "decay_ratio"), v->lr_scheduler.decay_ratio);
        return -1;
    }
    return 0;
}

/* NaN and infinities pass every < or > test: refuse them by name (NaN means "not set"
 * only for decay_ratio and peak_flops) */
static int check_finite(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    struct {
        double x;
        const char *section, *key;
    } fin[] = {{v->optimizer.lr, "optimizer", "lr"},
               {v->optimizer.beta1, "optimizer", "beta1"},
               {v->optimizer.beta2, "optimizer", "beta2"},
               {v->optimizer.eps, "optimizer", "eps"},
               {v->optimizer.weight_decay, "optimizer", "weight_decay"},
               {v->lr_scheduler.min_lr_factor, "lr_scheduler", "min_lr_factor"},
               {v->training.max_norm, "training", "max_norm"}};
    for (size_t i = 0; i < sizeof fin / sizeof fin[0]; i++)
        if (!isfinite(fin[i].x)) {
            util_set_err(err, n, "%s: %s.%s must be a finite number, got %g", WHERE(fin[i].section, fin[i].key),
                         fin[i].section, fin[i].key, fin[i].x);
            return -1;
        }
    if (!isnan(v->lr_scheduler.decay_ratio) && !isfinite(v->lr_scheduler.decay_ratio)) {
        util_set_err(err, n, "%s: lr_scheduler.decay_ratio must be finite", WHERE("lr_scheduler", "decay_ratio"));
        return -1;
    }
    if (!isnan(v->metrics.peak_flops) && !(isfinite(v->metrics.peak_flops) && v->metrics.peak_flops > 0)) {
        util_set_err(err, n, "%s: metrics.peak_flops must be a positive finite number (FLOP/s), got %g",
                     WHERE("metrics", "peak_flops"), v->metrics.peak_flops);
        return -1;
    }
    return 0;
}

/* The ranges of the LR floor and the AdamW hyperparameters (now known to be finite). */
static int check_optimizer(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->lr_scheduler.min_lr_factor < 0 || v->lr_scheduler.min_lr_factor > 1) {
        util_set_err(err, n, "%s: lr_scheduler.min_lr_factor must be between 0 and 1",
                     WHERE("lr_scheduler", "min_lr_factor"));
        return -1;
    }
    if (v->optimizer.lr < 0 || v->optimizer.eps <= 0 || v->optimizer.beta1 < 0 || v->optimizer.beta1 >= 1 ||
        v->optimizer.beta2 < 0 || v->optimizer.beta2 >= 1 || v->optimizer.weight_decay < 0) {
        util_set_err(err, n, "[optimizer]: need lr >= 0, eps > 0, 0 <= beta1, beta2 < 1 and weight_decay >= 0 (%s)",
                     WHERE("optimizer", "lr"));
        return -1;
    }
    return 0;
}

/* How often the profiler and the metrics log run, and the one metrics sink not built. */
static int check_metrics(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->profiling.profile_freq < 1 || v->profiling.profiler_active < 1) {
        util_set_err(err, n, "%s: profiling.profile_freq and profiling.profiler_active must be >= 1",
                     WHERE("profiling", "profile_freq"));
        return -1;
    }
    if (v->metrics.log_freq < 1) {
        util_set_err(err, n, "%s: metrics.log_freq must be >= 1", WHERE("metrics", "log_freq"));
        return -1;
    }
    if (v->metrics.enable_wandb) {
        util_set_err(err, n,
                     "%s: metrics.enable_wandb is not available in tetra; use metrics.enable_tensorboard "
                     "(metrics.jsonl is always written)",
                     WHERE("metrics", "enable_wandb"));
        return -1;
    }
    return 0;
}

/* How many checkpoints to keep and how often to save; then the selective activation
 * checkpointing option, an integer stride or "op". */
static int check_checkpointing(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->checkpoint.keep_latest_k == 1 || v->checkpoint.keep_latest_k < 0) {
        util_set_err(err, n,
                     "%s: checkpoint.keep_latest_k must be 0 (keep all) or >= 2, so a complete checkpoint "
                     "always survives a failed save",
                     WHERE("checkpoint", "keep_latest_k"));
        return -1;
    }
    if (v->checkpoint.interval < 1) {
        util_set_err(err, n, "%s: checkpoint.interval must be >= 1", WHERE("checkpoint", "interval"));
        return -1;
    }
    const char *ac = v->activation_checkpoint.selective_ac_option;
    if (!strcmp(v->activation_checkpoint.mode, "selective") && strcmp(ac, "op") != 0) {
        int64_t every;
        if (parse_int64(ac, &every) || every < 1) {
            util_set_err(err, n,
                         "%s: activation_checkpoint.selective_ac_option must be a positive integer (as a string, "
                         "e.g. \"2\") or \"op\", got \"%s\"",
                         WHERE("activation_checkpoint", "selective_ac_option"), ac);
            return -1;
        }
    }
    return 0;
}

/* Keys a TorchTitan config may carry whose feature tetra does not have: any value but
 * the default is refused, so no key is silently ignored (docs/configs.md lists them). */
static int check_unsupported_keys(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    struct {
        int set;
        const char *section, *key, *why;
    } no[] = {
        {v->metrics.save_for_all_ranks, "metrics", "save_for_all_ranks",
         "only rank 0 writes metrics and TensorBoard events in this version; set it to false"},
        {strcmp(v->optimizer.name, "AdamW") != 0, "optimizer", "name",
         "only AdamW (decoupled weight decay) is built; Adam with L2 weight decay is not"},
        {v->optimizer.early_step_in_backward, "optimizer", "early_step_in_backward",
         "stepping during backward is not built; set it to false"},
        {strcmp(v->training.dtype, "float32") != 0, "training", "dtype",
         "full-bf16 training (bf16 master weights) is not built; training.mixed_precision_param = \"bfloat16\" "
         "gives bf16 compute with fp32 master weights"},
        {v->training.gc_debug, "training", "gc_debug", "tetra has no garbage collector; set it to false"},
        {v->activation_checkpoint.early_stop, "activation_checkpoint", "early_stop",
         "early stop of recomputation is not built (a block recomputes what it dropped); set it to false"},
    };
    if (v->training.enable_cpu_offload && !strcmp(v->training.device, "cpu")) {
        util_set_err(err, n,
                     "%s: training.enable_cpu_offload has no meaning on training.device = \"cpu\": the CPU "
                     "backend's memory is host memory already; set it to false",
                     WHERE("training", "enable_cpu_offload"));
        return -1;
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        if (no[i].set) {
            util_set_err(err, n, "%s: %s.%s is not supported: %s", WHERE(no[i].section, no[i].key), no[i].section,
                         no[i].key, no[i].why);
            return -1;
        }
    return 0;
}

/* [quantize.linear.float8] only acts through the float8 converter */
static int check_float8_keys(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    int f8 = 0;
    for (int i = 0; i < v->model.converters.n; i++) f8 |= !strcmp(v->model.converters.items[i], "float8");
    const cfg_list *ff = &v->quantize_linear_float8.filter_fqns;
    struct {
        int set;
        const char *key;
    } q[] = {
        {strcmp(v->quantize_linear_float8.recipe_name, "tensorwise") != 0, "recipe_name"},
        {v->quantize_linear_float8.enable_fsdp_float8_all_gather, "enable_fsdp_float8_all_gather"},
        {v->quantize_linear_float8.precompute_float8_dynamic_scale_for_fsdp,
         "precompute_float8_dynamic_scale_for_fsdp"},
        /* ["output"] is tetra's default, [] TorchTitan v0.2's */
        {!(ff->n == 0 || (ff->n == 1 && !strcmp(ff->items[0], "output"))), "filter_fqns"},
        {v->quantize_linear_float8.emulate, "emulate"},
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0] && !f8; i++)
        if (q[i].set) {
            util_set_err(err, n,
                         "%s: quantize.linear.float8.%s has no effect without model.converters = "
                         "[\"float8\"]: add the converter or leave the key at its default",
                         WHERE("quantize.linear.float8", q[i].key), q[i].key);
            return -1;
        }
    return 0;
}

/* checkpoint.exclude_from_loading names only states a checkpoint holds. */
static int check_checkpoint_exclusions(const tetra_config *c, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    static const char *exclusions[] = {"model", "optimizer", "lr_scheduler", "dataloader", "train_state"};
    for (int i = 0; i < v->checkpoint.exclude_from_loading.n; i++) {
        int ok = 0;
        for (size_t j = 0; j < sizeof exclusions / sizeof exclusions[0]; j++)
            ok |= !strcmp(v->checkpoint.exclude_from_loading.items[i], exclusions[j]);
        if (!ok) {
            util_set_err(err, n,
                         "%s: checkpoint.exclude_from_loading: unknown state \"%s\" (model, optimizer, "
                         "lr_scheduler, dataloader, train_state)",
                         WHERE("checkpoint", "exclude_from_loading"), v->checkpoint.exclude_from_loading.items[i]);
            return -1;
        }
    }
    return 0;
}

/* Stepping in backward against the pipeline, then the validation loop's own numbers. */
static int check_backward_step_and_validation(const tetra_config *c, int64_t pp, char *err, size_t n) {
    char wbuf[4][600];
    int wi = 0;
    const tetra_config_values *v = &c->v;
    if (v->optimizer.early_step_in_backward && pp > 1) {
        util_set_err(err, n, "%s: optimizer.early_step_in_backward cannot be combined with pipeline parallel",
                     WHERE("optimizer", "early_step_in_backward"));
        return -1;
    }
    if (v->validation.enable &&
        (v->validation.freq < 1 || v->validation.local_batch_size < 1 || v->validation.seq_len < 1)) {
        util_set_err(err, n, "%s: validation.freq, local_batch_size and seq_len must be >= 1",
                     WHERE("validation", "enable"));
        return -1;
    }
    return 0;
}

/* The rules run in a fixed order and stop at the first that fails, so the error names the
 * earliest broken rule; the layout is resolved on the way and reported in *dims. */
int cfg_validate(const tetra_config *c, int world, cfg_parallel_dims *dims, char *err, size_t n) {
    resolved_layout l;
    if (check_dataset_mix(c, err, n) != 0) return -1;
    if (check_parallel_degrees(c, world, err, n)) return -1;
    if (resolve_layout(c, world, &l, err, n)) return -1;
    if (check_model(c, l.tp, err, n)) return -1;
    if (check_seq_len(c, l.cp, l.tp, err, n)) return -1;
    if (check_batch(c, &l, err, n)) return -1;
    if (check_pipeline(c, l.pp, err, n)) return -1;
    if (check_comm_traces(c, err, n)) return -1;
    if (check_step_counts(c, err, n)) return -1;
    if (check_finite(c, err, n)) return -1;
    if (check_optimizer(c, err, n)) return -1;
    if (check_metrics(c, err, n)) return -1;
    if (cfg_compat_check(c, err, n)) return -1;
    if (check_checkpointing(c, err, n)) return -1;
    if (check_unsupported_keys(c, err, n)) return -1;
    if (check_float8_keys(c, err, n)) return -1;
    if (check_checkpoint_exclusions(c, err, n)) return -1;
    if (check_backward_step_and_validation(c, l.pp, err, n)) return -1;
    if (dims) {
        dims->world = world;
        dims->pp = (int)l.pp;
        dims->dp_replicate = (int)l.rep;
        dims->dp_shard = (int)l.shard;
        dims->cp = (int)l.cp;
        dims->tp = (int)l.tp;
        dims->dp = (int)l.dp;
        dims->grad_accum_steps = (int)(l.gbs / l.per_step);
        dims->global_batch_size = l.gbs;
    }
    return 0;
}

int cfg_check_build(const tetra_config *c, char *err, size_t n) {
#ifndef TETRA_HAVE_CUDA
    if (!strcmp(c->v.training.device, "cuda")) {
        char where[256];
        util_set_err(err, n,
                     "%s: training.device = \"cuda\" but this tetra was built without CUDA (install the CUDA "
                     "toolkit and rebuild with -DTETRA_CUDA=ON)",
                     cfg_origin_str(c, "training", "device", where, sizeof where));
        return -1;
    }
    if (!strcmp(c->v.comm.backend, "nccl")) {
        char where[256];
        util_set_err(err, n, "%s: comm.backend = \"nccl\" but this tetra was built without CUDA and NCCL",
                     cfg_origin_str(c, "comm", "backend", where, sizeof where));
        return -1;
    }
#else
    (void)c;
    (void)err;
    (void)n;
#endif
    return 0;
}
