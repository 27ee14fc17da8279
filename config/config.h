/* config.h — the merged job configuration: defaults < TOML file < command line.
 *
 * The keys, types, defaults and help live in schema.def and nowhere
 * else. Every error names where the bad value came from: "FILE:LINE: ..." for
 * the TOML file, "command line: ..." for an override, and suggests the nearest
 * valid key for unknown ones.
 */
#ifndef TETRA_CONFIG_H
#define TETRA_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "models/llama3/llama3_args.h"
#include "models/model.h"

typedef struct {
    char **items; /* [n] owned strings */
    int n;
} cfg_list;

/* struct tetra_config { struct { ... } job; struct { ... } profiling; ... } */
#define CFG_SECTION(S, NAME, HELP) struct {
#define CFG_END(S)                                                                                                     \
    }                                                                                                                  \
    S;
#define CFG_BOOL(S, K, D, H) int K;
#define CFG_INT(S, K, D, H) int64_t K;
#define CFG_FLOAT(S, K, D, H) double K;
#define CFG_STR(S, K, D, H) char *K;
#define CFG_ENUM(S, K, D, C, H) char *K;
#define CFG_LIST(S, K, D, H) cfg_list K;
typedef struct tetra_config {
#include "config/schema.def"
} tetra_config_values;
#undef CFG_SECTION
#undef CFG_END
#undef CFG_BOOL
#undef CFG_INT
#undef CFG_FLOAT
#undef CFG_STR
#undef CFG_ENUM
#undef CFG_LIST

typedef enum { CFG_T_BOOL, CFG_T_INT, CFG_T_FLOAT, CFG_T_STR, CFG_T_ENUM, CFG_T_LIST } cfg_type;

typedef struct {
    const char *section; /* "quantize.linear.float8" */
    const char *key;     /* "filter_fqns" */
    cfg_type type;
    size_t offset;       /* into tetra_config_values */
    int64_t def_i;       /* BOOL, INT */
    double def_f;        /* FLOAT; NAN = not set */
    const char *def_s;   /* STR, ENUM, LIST (comma-separated); NULL = not set */
    const char *choices; /* ENUM: "a|b|c" */
    const char *help;
} cfg_key_desc;

typedef struct {
    const char *name; /* "lr_scheduler" */
    const char *help;
} cfg_section_desc;

typedef enum { CFG_FROM_DEFAULT = 0, CFG_FROM_FILE, CFG_FROM_CLI } cfg_origin_kind;

typedef struct {
    cfg_origin_kind kind;
    int line; /* FILE: 1-based line of the key */
} cfg_origin;

extern const cfg_key_desc cfg_keys[];
extern const int cfg_n_keys;
extern const cfg_section_desc cfg_sections[];
extern const int cfg_n_sections;

typedef struct {
    tetra_config_values v;
    cfg_origin *origin; /* [cfg_n_keys] */
    char *file;         /* the TOML file read, or NULL */
} tetra_config;

/* Parallel layout after resolving -1 degrees against the world size. */
typedef struct {
    int world;
    int pp, dp_replicate, dp_shard, cp, tp;
    int dp;               /* dp_replicate * dp_shard: ranks that read different data */
    int grad_accum_steps; /* microbatches per optimizer step on each rank */
    int64_t global_batch_size;
} cfg_parallel_dims;

void cfg_init(tetra_config *c); /* defaults */
void cfg_free(tetra_config *c);

/* Parse `tetra train` arguments (argv[0] is the subcommand name): finds
 * --job.config_file, loads it, then applies the other options in order.
 * Returns 0 on success, 1 when --help was asked (help already printed to
 * out), -1 on error (message in err). */
int cfg_parse_args(tetra_config *c, int argc, char **argv, FILE *out, char *err, size_t errlen);

/* Load a TOML file over the current values. */
int cfg_load_file(tetra_config *c, const char *path, char *err, size_t errlen);
/* Parse a TOML document from memory; `name` is used in messages. */
int cfg_load_string(tetra_config *c, const char *name, const char *text, size_t len, char *err, size_t errlen);

/* Set one key ("section.key") from its command-line text. */
int cfg_set_string(tetra_config *c, const char *full_key, const char *value, char *err, size_t errlen);

/* Cross-key rules and the parallel layout for `world` ranks. */
int cfg_validate(const tetra_config *c, int world, cfg_parallel_dims *dims, char *err, size_t errlen);

/* The model a valid configuration names: model.flavor with model.vocab_size, n_layers,
 * attn_mask_type and reset_positions_at_document_boundaries applied — the one rule for
 * "flavor + overrides" (engine/job.h hands its result to every reader). */
void cfg_model_args(const tetra_config_values *v, llama3_args *a);
/* The same as the generic arguments of the family model.name names (models/model.h). */
void cfg_model(const tetra_config_values *v, model_args *out);

/* What this build can run: training.device = "cuda" needs the CUDA backend. Training
 * checks it; `tetra plan` does not (a GPU run is planned from any build). */
int cfg_check_build(const tetra_config *c, char *err, size_t errlen);

/* Merged configuration as valid TOML (not-set keys appear as comments). */
void cfg_print_toml(const tetra_config *c, FILE *f);
/* Case-insensitive Levenshtein distance of two names up to 128 bytes ((size_t)-1
 * beyond): how "did you mean" suggestions pick the nearest key. */
size_t cfg_edit_distance(const char *a, const char *b);
/* Every key with type, default and help. */
void cfg_print_help(FILE *f);

const cfg_key_desc *cfg_find_key(const char *section, const char *key);
/* Set (by the file or the command line) to a value other than its default. */
int cfg_is_changed(const tetra_config *c, const cfg_key_desc *d);
/* A key's value as TOML text (4, true, "x", ["a", "b"]), cut to fit buf. */
const char *cfg_value_text(const tetra_config *c, const cfg_key_desc *d, char *buf, size_t n);
/* "configs/x.toml:12", "command line" or "default" for a key's current value. */
const char *cfg_origin_str(const tetra_config *c, const char *section, const char *key, char *buf, size_t n);

#endif
