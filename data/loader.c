/* loader.c — stateful packing loader over memory-mapped token shards (see loader.h). */
#include "data/loader.h"
#include "data/loader_internal.h"

#include "util/crc32c.h"

#include "data/megatron.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "util/err.h"
#include "util/file.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the permutation: a keyed Feistel network with cycle walking ------------- */

static uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void dl_feistel_init(feistel *f, uint64_t n, uint64_t seed, uint64_t epoch) {
    unsigned bits = 2;
    while (bits < 62 && ((uint64_t)1 << bits) < n) bits++;
    if (bits & 1) bits++;
    f->n = n;
    f->half = bits / 2;
    f->mask = ((uint64_t)1 << f->half) - 1;
    uint64_t k = mix64(seed ^ mix64(epoch + 0x7465747261ull));
    for (int r = 0; r < FEISTEL_ROUNDS; r++) f->key[r] = k = mix64(k + (uint64_t)r);
}

uint64_t dl_feistel_apply(const feistel *f, uint64_t i) {
    if (f->n <= 1) return 0;
    do {
        uint64_t l = i >> f->half, r = i & f->mask;
        for (int k = 0; k < FEISTEL_ROUNDS; k++) {
            uint64_t t = l ^ (mix64(r ^ f->key[k]) & f->mask);
            l = r;
            r = t;
        }
        i = (l << f->half) | r;
    } while (i >= f->n); /* cycle walking: stays a bijection of 0..n-1 */
    return i;
}

uint64_t dl_permute(uint64_t i, uint64_t n, uint64_t seed, uint64_t epoch) {
    feistel f;
    dl_feistel_init(&f, n, seed, epoch);
    return dl_feistel_apply(&f, i);
}

/* ---- the loader ---------------------------------------------------------------- */

void dl_close(dl_loader *dl) {
    if (!dl) return;
    dl_mix_free(dl);
    for (int i = 0; i < dl->n_shards; i++) shard_close(&dl->shards[i]);
    free(dl->shards);
    if (dl->mg) mg_close(dl->mg);
    free(dl->mg);
    free(dl->starts);
    free(dl->window);
    free(dl->dir);
    free(dl->split);
    free(dl);
}

/* W, G and the window buffer, once the stream's length is known. */
static int finish_open(dl_loader *dl, const char *what, char *err, size_t errlen) {
    const dl_config *cfg = &dl->cfg;
    dl->window = malloc(((size_t)cfg->seq_len + 1) * sizeof *dl->window);
    if (!dl->window) {
        util_set_err(err, errlen, "data loader: out of memory");
        return -1;
    }
    dl->W = dl->n_tokens / ((uint64_t)cfg->seq_len + 1);
    dl->G = (uint64_t)cfg->dp_size * (uint64_t)cfg->local_batch_size;
    if (dl->W == 0) {
        util_set_err(err, errlen, "%s has %llu tokens, fewer than one sequence of seq_len+1 = %d", what,
                     (unsigned long long)dl->n_tokens, cfg->seq_len + 1);
        return -1;
    }
    return 0;
}

/* A Megatron dataset is one token stream: "train" and "val" both read all of it. Its index
 * records no tokenizer, so the model's vocabulary is the one every id is checked against,
 * and a dtype that cannot hold that vocabulary's ids means another tokenizer. */
static dl_loader *open_megatron(dl_loader *dl, const char *path, char *err, size_t errlen) {
    const uint32_t V = dl->cfg.expected_vocab_size;
    if (!(dl->mg = calloc(1, sizeof *dl->mg)) || !(dl->dir = strdup(path)) || !(dl->split = strdup("all"))) {
        util_set_err(err, errlen, "data loader: out of memory");
        goto fail;
    }
    if (mg_open(dl->mg, path, err, errlen) != 0) goto fail;
    if (V == 0) {
        util_set_err(err, errlen,
                     "%s.idx: a Megatron dataset records no vocabulary; the model's vocab_size is needed to check "
                     "its ids",
                     dl->mg->prefix);
        goto fail;
    }
    if (mg_dtype_max(dl->mg->dtype) < (uint64_t)V - 1) {
        util_set_err(err, errlen,
                     "%s.idx: its ids are %s, at most %llu, but the model's vocab_size is %u: the dataset was "
                     "tokenized with a smaller vocabulary (another tokenizer); tokenize it with the model's, or set "
                     "model.vocab_size",
                     dl->mg->prefix, mg_dtype_name(dl->mg->dtype), (unsigned long long)mg_dtype_max(dl->mg->dtype), V);
        goto fail;
    }
    dl->vocab = V;
    dl->bos = dl->eos = -1;
    dl->n_tokens = dl->mg->n_tokens;
    uint32_t fp = crc32c(0, &V, sizeof V);
    dl->fingerprint = crc32c(fp, &dl->mg->idx_crc, sizeof dl->mg->idx_crc);
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "Megatron dataset %s", dl->mg->prefix);
    if (finish_open(dl, what, err, errlen) != 0) goto fail;
    return dl;
fail:
    dl_close(dl);
    return NULL;
}

dl_loader *dl_open_config(const char *dir, const char *split, const dl_config *cfg, char *err, size_t errlen) {
    if (!dir || !split || !cfg) {
        util_set_err(err, errlen, "data loader: no corpus folder or split given");
        return NULL;
    }
    if (cfg->seq_len < 1 || cfg->local_batch_size < 1 || cfg->dp_size < 1 || cfg->dp_rank < 0 ||
        cfg->dp_rank >= cfg->dp_size) {
        util_set_err(err, errlen, "data loader: bad geometry (seq_len %d, local_batch_size %d, dp rank %d of %d)",
                     cfg->seq_len, cfg->local_batch_size, cfg->dp_rank, cfg->dp_size);
        return NULL;
    }
    if (mg_is_dataset(dir)) {
        dl_loader *dl = calloc(1, sizeof *dl);
        if (!dl) {
            util_set_err(err, errlen, "data loader: out of memory");
            return NULL;
        }
        dl->cfg = *cfg;
        return open_megatron(dl, dir, err, errlen);
    }
    shard_index ix;
    if (shard_index_read(dir, &ix, err, errlen) != 0) return NULL;
    dl_loader *dl = calloc(1, sizeof *dl);
    if (!dl) {
        shard_index_free(&ix);
        util_set_err(err, errlen, "data loader: out of memory");
        return NULL;
    }
    dl->cfg = *cfg;
    dl->dir = strdup(dir);
    dl->split = strdup(split);
    dl->vocab = ix.vocab_size;
    dl->bos = ix.bos_id;
    dl->eos = ix.eos_id;
    const shard_index_split *sp = shard_index_find(&ix, split);
    if (!sp) {
        if (strcmp(split, "val") == 0)
            util_set_err(
                err, errlen,
                "%s: the corpus has no \"val\" split (prepare it with `tetra data prepare ... --val-fraction F`, "
                "F > 0)",
                dir);
        else util_set_err(err, errlen, "%s: the corpus has no \"%s\" split", dir, split);
        goto fail;
    }
    if (cfg->expected_vocab_size && cfg->expected_vocab_size != ix.vocab_size) {
        util_set_err(err, errlen,
                     "%s: the corpus was tokenized with a vocabulary of %u tokens but the model's vocab_size is %u; "
                     "prepare the corpus with the model's tokenizer, or set model.vocab_size = %u",
                     dir, ix.vocab_size, cfg->expected_vocab_size, ix.vocab_size);
        goto fail;
    }
    if (sp->n_shards == 0 || sp->n_tokens == 0) {
        util_set_err(err, errlen, "%s: split \"%s\" is empty", dir, split);
        goto fail;
    }
    dl->shards = calloc((size_t)sp->n_shards, sizeof *dl->shards);
    dl->starts = calloc((size_t)sp->n_shards + 1, sizeof *dl->starts);
    if (!dl->dir || !dl->split || !dl->shards || !dl->starts) {
        util_set_err(err, errlen, "data loader: out of memory");
        goto fail;
    }
    uint32_t fp = crc32c(0, &ix.vocab_size, sizeof ix.vocab_size);
    for (int i = 0; i < sp->n_shards; i++) {
        const shard_index_shard *e = &sp->shards[i];
        char *path = util_path_join(dir, e->file);
        if (!path) {
            util_set_err(err, errlen, "data loader: out of memory");
            goto fail;
        }
        int rc = shard_open(&dl->shards[i], path, !cfg->skip_verify, err, errlen);
        if (rc == 0) {
            const shard_header *h = &dl->shards[i].h;
            if (h->n_tokens != e->n_tokens || h->crc32c != e->crc32c) {
                util_set_err(err, errlen,
                             "%s: does not match %s/index.json (%llu tokens, CRC %08x; the index says %llu tokens, CRC "
                             "%08x)",
                             path, dir, (unsigned long long)h->n_tokens, h->crc32c, (unsigned long long)e->n_tokens,
                             e->crc32c);
                rc = -1;
            } else if (h->vocab_size != ix.vocab_size || h->token_bytes != ix.token_bytes) {
                util_set_err(err, errlen, "%s: vocab size %u / token width %u differ from index.json's %u / %u", path,
                             h->vocab_size, h->token_bytes, ix.vocab_size, ix.token_bytes);
                rc = -1;
            }
            if (rc != 0) shard_close(&dl->shards[i]);
        }
        free(path);
        if (rc != 0) goto fail;
        dl->n_shards = i + 1;
        dl->starts[i + 1] = dl->starts[i] + dl->shards[i].h.n_tokens;
        uint64_t rec[2] = {dl->shards[i].h.n_tokens, dl->shards[i].h.crc32c};
        fp = crc32c(fp, rec, sizeof rec);
    }
    dl->fingerprint = fp;
    dl->n_tokens = dl->starts[dl->n_shards];
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "%s: split \"%s\"", dir, split);
    if (finish_open(dl, what, err, errlen) != 0) goto fail;
    shard_index_free(&ix);
    return dl;
fail:
    shard_index_free(&ix);
    dl_close(dl);
    return NULL;
}

dl_loader *dl_open(const char *dir, const char *split, int seq_len, int local_batch_size, int dp_rank, int dp_size,
                   int shuffle, uint64_t seed, uint32_t expected_vocab_size, char *err, size_t errlen) {
    dl_config c;
    memset(&c, 0, sizeof c);
    c.seq_len = seq_len;
    c.local_batch_size = local_batch_size;
    c.dp_rank = dp_rank;
    c.dp_size = dp_size;
    c.shuffle = shuffle;
    c.seed = seed;
    c.expected_vocab_size = expected_vocab_size;
    return dl_open_config(dir, split, &c, err, errlen);
}

/* Copy stream tokens [first, first+n) into out. */
/* 0, or -1 with dl->error set when a token id is outside the vocabulary (a shard whose
 * index and checksums are valid but whose ids are not: written by another tool, or by
 * hand), naming the shard and the token's offset in it. */
int dl_read_stream(dl_loader *dl, uint64_t first, size_t n, int32_t *out) {
    if (dl->mg) return mg_read(dl->mg, first, n, dl->vocab, out, dl->error, sizeof dl->error);
    int lo = 0, hi = dl->n_shards - 1;
    while (lo < hi) { /* last shard whose start <= first */
        int mid = (lo + hi + 1) / 2;
        if (dl->starts[mid] <= first) lo = mid;
        else hi = mid - 1;
    }
    int s = lo;
    while (n) {
        uint64_t off = first - dl->starts[s];
        uint64_t avail = dl->shards[s].h.n_tokens - off;
        size_t k = avail < n ? (size_t)avail : n;
        shard_read_tokens(&dl->shards[s], off, k, out);
        for (size_t i = 0; i < k; i++)
            if (out[i] < 0 || (uint32_t)out[i] >= dl->vocab) {
                snprintf(dl->error, sizeof dl->error,
                         "%s: token %llu holds id %lld, outside the vocabulary of %u ids that index.json declares "
                         "(the shard was not written by `tetra data prepare` with this tokenizer)",
                         dl->shards[s].path, (unsigned long long)(off + i), (long long)(uint32_t)out[i], dl->vocab);
                return -1;
            }
        out += k;
        first += k;
        n -= k;
        s++;
    }
    return 0;
}

uint64_t dl_window_of(dl_loader *dl, uint64_t g) {
    uint64_t e = g / dl->W, i = g % dl->W;
    if (!dl->cfg.shuffle) return i;
    if (!dl->perm_ready || dl->perm_epoch != e) {
        dl_feistel_init(&dl->perm, dl->W, dl->cfg.seed, e);
        dl->perm_epoch = e;
        dl->perm_ready = 1;
    }
    return dl_feistel_apply(&dl->perm, i);
}

void dl_doc_ids(const int32_t *tokens, int n, int64_t bos, int64_t eos, int32_t *ids) {
    int32_t id = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && ((eos >= 0 && tokens[i - 1] == eos) || (bos >= 0 && tokens[i] == bos))) id++;
        ids[i] = id;
    }
}

void dl_window_docs(const dl_loader *dl, uint64_t first, const int32_t *window, int n, int32_t *ids) {
    if (dl->mg) mg_doc_ids(dl->mg, first, (size_t)n, ids);
    else dl_doc_ids(window, n, dl->bos, dl->eos, ids);
}

int dl_has_documents(const dl_loader *dl) {
    if (dl->n_src) {
        for (int i = 0; i < dl->n_src; i++)
            if (!dl_has_documents(dl->src[i])) return 0;
        return 1;
    }
    return dl->mg != NULL || dl->bos >= 0 || dl->eos >= 0;
}

int dl_next(dl_loader *dl, int32_t *inputs, int32_t *labels) { return dl_next_docs(dl, inputs, labels, NULL); }

int dl_next_docs(dl_loader *dl, int32_t *inputs, int32_t *labels, int32_t *docs) {
    if (dl->n_src) return dl_mix_next(dl, inputs, labels, docs);
    const size_t T = (size_t)dl->cfg.seq_len;
    const uint64_t R = (uint64_t)dl->cfg.dp_size, r = (uint64_t)dl->cfg.dp_rank;
    if (dl->cfg.single_pass && dl->position + dl->G > dl->W) return 0;
    for (int k = 0; k < dl->cfg.local_batch_size; k++) {
        uint64_t g = dl->position + (uint64_t)k * R + r;
        uint64_t j = dl_window_of(dl, g);
        if (dl_read_stream(dl, j * (T + 1), T + 1, dl->window)) return -1;
        memcpy(inputs + (size_t)k * T, dl->window, T * sizeof *inputs);
        memcpy(labels + (size_t)k * T, dl->window + 1, T * sizeof *labels);
        if (docs) dl_window_docs(dl, j * (T + 1), dl->window, (int)T, docs + (size_t)k * T);
    }
    uint64_t old = dl->position;
    dl->position += dl->G;
    if (!dl->cfg.single_pass) {
        /* epochs finished between the last window before this step and the last one of it */
        uint64_t e_prev = old ? (old - 1) / dl->W : 0;
        for (uint64_t e = e_prev; e < (dl->position - 1) / dl->W; e++) {
            char msg[512];
            snprintf(msg, sizeof msg,
                     "data: finished epoch %llu of split \"%s\" of %s (%llu sequences of %zu tokens); "
                     "wrapping around to epoch %llu",
                     (unsigned long long)(e + 1), dl->split, dl->dir, (unsigned long long)dl->W, T + 1,
                     (unsigned long long)(e + 2));
            if (dl->cfg.on_epoch) dl->cfg.on_epoch(dl->cfg.on_epoch_user, e + 1, msg);
            else if (dl->cfg.dp_rank == 0) fprintf(stderr, "%s\n", msg);
        }
    }
    return 1;
}

void dl_rewind(dl_loader *dl) {
    dl->position = 0;
    if (dl->n_src) dl_mix_rewind(dl);
}

const char *dl_error(const dl_loader *dl) { return dl->error; }

/* ---- state -------------------------------------------------------------------------- */

#define DL_STATE_MAGIC "TDLSTATE"
#define DL_STATE_VERSION 1u

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

size_t dl_state_size(const dl_loader *dl) {
    (void)dl;
    return DL_STATE_BYTES;
}

int dl_state_save(const dl_loader *dl, void *buf, size_t n) {
    if (n < DL_STATE_BYTES) return -1;
    unsigned char *p = buf;
    memset(p, 0, DL_STATE_BYTES);
    memcpy(p, DL_STATE_MAGIC, 8);
    put32(p + 8, DL_STATE_VERSION);
    put32(p + 12, (uint32_t)dl->cfg.seq_len);
    put64(p + 16, dl->position);
    put64(p + 24, dl->cfg.seed);
    put32(p + 32, dl->cfg.shuffle ? 1u : 0u);
    put32(p + 36, dl->fingerprint);
    put64(p + 40, dl->n_tokens);
    put64(p + 48, dl->W);
    put32(p + 60, crc32c(0, p, 60));
    return 0;
}

int dl_state_load(dl_loader *dl, const void *buf, size_t n, char *err, size_t errlen) {
    const unsigned char *p = buf;
    if (n < DL_STATE_BYTES || memcmp(p, DL_STATE_MAGIC, 8) != 0) {
        util_set_err(err, errlen, "data loader state: not a loader state (%zu bytes)", n);
        return -1;
    }
    if (get32(p + 60) != crc32c(0, p, 60)) {
        util_set_err(err, errlen, "data loader state: corrupt (checksum mismatch)");
        return -1;
    }
    if (get32(p + 8) != DL_STATE_VERSION) {
        util_set_err(err, errlen, "data loader state: version %u is not supported", get32(p + 8));
        return -1;
    }
    uint32_t seq_len = get32(p + 12), shuffle = get32(p + 32), fp = get32(p + 36);
    uint64_t seed = get64(p + 24), ntok = get64(p + 40);
    if (fp != dl->fingerprint || ntok != dl->n_tokens) {
        util_set_err(
            err, errlen,
            "data loader state: saved for another corpus (split of %llu tokens, fingerprint %08x); split \"%s\" "
            "of %s has %llu tokens, fingerprint %08x",
            (unsigned long long)ntok, fp, dl->split, dl->dir, (unsigned long long)dl->n_tokens, dl->fingerprint);
        return -1;
    }
    if (seq_len != (uint32_t)dl->cfg.seq_len) {
        util_set_err(err, errlen, "data loader state: saved with seq_len %u; this run has seq_len %d", seq_len,
                     dl->cfg.seq_len);
        return -1;
    }
    if (dl->n_src && seed != dl->cfg.seed) {
        util_set_err(err, errlen,
                     "data loader state: saved with seed %llu; this run has seed %llu, and a mixture's order "
                     "of sources follows the seed",
                     (unsigned long long)seed, (unsigned long long)dl->cfg.seed);
        return -1;
    }
    if ((shuffle != 0) != (dl->cfg.shuffle != 0) || (shuffle && seed != dl->cfg.seed)) {
        util_set_err(err, errlen,
                     "data loader state: saved with shuffle %s, seed %llu; this run has shuffle %s, seed %llu",
                     shuffle ? "on" : "off", (unsigned long long)seed, dl->cfg.shuffle ? "on" : "off",
                     (unsigned long long)dl->cfg.seed);
        return -1;
    }
    dl->position = get64(p + 16);
    if (dl->n_src) mix_counts(&dl->mix, dl->position, dl->counted);
    return 0;
}

/* ---- facts ------------------------------------------------------------------------------ */

uint64_t dl_position(const dl_loader *dl) { return dl->position; }
uint64_t dl_epoch(const dl_loader *dl) { return dl->position / dl->W; }
uint64_t dl_windows_per_epoch(const dl_loader *dl) { return dl->W; }
uint64_t dl_steps_per_epoch(const dl_loader *dl) { return dl->W / dl->G; }
uint64_t dl_num_tokens(const dl_loader *dl) { return dl->n_tokens; }
uint32_t dl_vocab_size(const dl_loader *dl) { return dl->vocab; }
int64_t dl_bos_id(const dl_loader *dl) { return dl->bos; }
int64_t dl_eos_id(const dl_loader *dl) { return dl->eos; }

/* ---- dataset names ------------------------------------------------------------------------ */

static int has_index(const char *dir) {
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/index.json", dir) >= sizeof path) return 0;
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int copy_out(char *out, size_t n, const char *s, char *err, size_t errlen) {
    if (strlen(s) >= n) {
        util_set_err(err, errlen, "dataset path too long: %s", s);
        return -1;
    }
    strcpy(out, s);
    return 0;
}

/* A prepared folder <name> next to the executable (<build>/data/<name>) or under
 * $TETRA_DATA_DIR; 0 with out set, else -1 with the places looked at in where. */
static int find_prepared(const char *name, char *out, size_t n, char *where, size_t wn) {
    char cand[PATH_MAX] = "", exe[PATH_MAX], envc[PATH_MAX] = "";
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k > 0) {
        exe[k] = 0;
        for (int up = 0; up < 2; up++) { /* <build>/bin/tetra -> <build> */
            char *slash = strrchr(exe, '/');
            if (slash) *slash = 0;
        }
        if (*exe && (size_t)snprintf(cand, sizeof cand, "%s/data/%s", exe, name) < sizeof cand && has_index(cand) &&
            strlen(cand) < n) {
            strcpy(out, cand);
            return 0;
        }
    }
    const char *env = getenv("TETRA_DATA_DIR");
    if (env && *env && (size_t)snprintf(envc, sizeof envc, "%s/%s", env, name) < sizeof envc && has_index(envc) &&
        strlen(envc) < n) {
        strcpy(out, envc);
        return 0;
    }
    snprintf(where, wn, "%s%s%s%s", *cand ? cand : "<executable dir>/../data/", *envc ? " nor at " : "", envc,
             *envc ? "" : " (TETRA_DATA_DIR is not set)");
    return -1;
}

int dl_is_megatron(const char *path) { return mg_is_dataset(path); }

int dl_check_tokenizer(const char *const *dirs, int n, const char *tok_path, char *err, size_t errlen) {
    char *tok_file = tok_find_file(tok_path);
    if (!tok_file) {
        struct stat st;
        if (tok_path && *tok_path && stat(tok_path, &st) == 0)
            util_set_err(err, errlen, "%s holds no tokenizer.json or tokenizer.model", tok_path);
        else util_set_err(err, errlen, "%s does not exist", tok_path && *tok_path ? tok_path : "(none)");
        return 1;
    }
    free(tok_file);
    char e[1024];
    tok_tokenizer *t = tok_load(tok_path, e, sizeof e);
    if (!t) {
        util_set_err(err, errlen, "%s", e);
        return -1;
    }
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)tok_fingerprint(t));
    const uint32_t v = tok_vocab_size(t);
    const int64_t bos = tok_bos_id(t), eos = tok_eos_id(t);
    tok_free(t);
    for (int i = 0; i < n; i++) {
        if (mg_is_dataset(dirs[i])) continue; /* its index records no tokenizer */
        shard_index ix;
        if (shard_index_read(dirs[i], &ix, e, sizeof e)) {
            util_set_err(err, errlen, "%s", e);
            return -1;
        }
        const int differ = ix.tokenizer_fingerprint ? strcmp(fp, ix.tokenizer_fingerprint) != 0
                                                    : v != ix.vocab_size || bos != ix.bos_id || eos != ix.eos_id;
        if (differ)
            util_set_err(
                err, errlen,
                "the tokenizer in %s (vocab %u, BOS %lld, EOS %lld, fingerprint %s) is not the one the token "
                "shards in %s were prepared with (%s/index.json: tokenizer %s, vocab %u, BOS %lld, EOS %lld, "
                "fingerprint %s): point model.hf_assets_path at that tokenizer, or prepare the corpus again with "
                "`tetra data prepare --tokenizer %s`",
                tok_path, v, (long long)bos, (long long)eos, fp, dirs[i], dirs[i],
                ix.tokenizer ? ix.tokenizer : "(not recorded)", ix.vocab_size, (long long)ix.bos_id,
                (long long)ix.eos_id, ix.tokenizer_fingerprint ? ix.tokenizer_fingerprint : "not recorded", tok_path);
        shard_index_free(&ix);
        if (differ) return -1;
    }
    return 0;
}

int dl_resolve_dataset(const char *dataset, const char *dataset_path, char *out_dir, size_t n, char *err,
                       size_t errlen) {
    if (dataset_path && *dataset_path) return copy_out(out_dir, n, dataset_path, err, errlen);
    if (!dataset || !*dataset) {
        util_set_err(err, errlen,
                     "no dataset: set training.dataset = \"sample\" or training.dataset_path to a folder made "
                     "by `tetra data prepare`");
        return -1;
    }
    char where[2 * PATH_MAX + 64];
    if (!strcmp(dataset, "c4")) {
        if (!find_prepared("c4", out_dir, n, where, sizeof where)) return 0;
        util_set_err(err, errlen,
                     "dataset \"c4\" is not prepared: no c4/ at %s. Download C4's English files (allenai/c4, "
                     "en/c4-train.*.json.gz and en/c4-validation.*.json.gz), then run `tetra data prepare --tokenizer "
                     "<model.hf_assets_path> --input <folder of .json.gz files> --output $TETRA_DATA_DIR/c4` "
                     "(docs/data.md), or set training.dataset_path",
                     where);
        return -1;
    }
    /* c4_validation: the held-out split of c4 where it is prepared, else of the sample */
    if (!strcmp(dataset, "c4_validation") && !find_prepared("c4", out_dir, n, where, sizeof where)) return 0;
    if (strcmp(dataset, "sample") != 0 && strcmp(dataset, "c4_test") != 0 && strcmp(dataset, "c4_validation") != 0) {
        util_set_err(err, errlen,
                     "unknown dataset \"%s\": the names are \"sample\" (the shipped Moby Dick; \"c4_test\" is its "
                     "alias), \"c4\" (C4 prepared with `tetra data prepare`) and \"c4_validation\"; for any other "
                     "corpus run `tetra data prepare --tokenizer DIR --input FILE|DIR --output DIR` and set "
                     "dataset_path = DIR",
                     dataset);
        return -1;
    }
    if (!find_prepared("sample", out_dir, n, where, sizeof where)) return 0;
    util_set_err(err, errlen,
                 "dataset \"%s\": the prepared sample corpus was not found at %s (the build prepares it: cmake --build "
                 "<build dir>; or set TETRA_DATA_DIR to a folder holding sample/)",
                 dataset, where);
    return -1;
}
