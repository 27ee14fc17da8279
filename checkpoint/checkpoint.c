/* checkpoint.c — sharded save (sync and async), folder policy and the
 * resharding reader (see checkpoint.h for the protocol). */
#include "checkpoint/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/crc32c.h"
#include "util/host.h"
#include "util/file.h"

#define PATH_LEN 4096
#define MSG_LEN 2048

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int mpi_world(void) { return host_world(); }
static int mpi_rank(void) { return host_rank(); }

/* ----------------------------------------------------------------------------
 * files and folders */

static int fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

int ckpt_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode)) return unlink(path);
    DIR *d = opendir(path);
    if (!d) return -1;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char sub[PATH_LEN];
        if (ck_snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) {
            rc = -1;
            continue;
        }
        if (ckpt_remove_tree(sub) != 0) rc = -1;
    }
    closedir(d);
    if (rmdir(path) != 0) rc = -1;
    return rc;
}

static int file_exists(const char *dir, const char *name) {
    char p[PATH_LEN];
    ck_snprintf(p, sizeof p, "%s/%s", dir, name);
    struct stat st;
    return stat(p, &st) == 0;
}

/* "model_only": true near the top of metadata.json (the writer puts it there). */
static int meta_model_only(const char *dir) {
    char p[PATH_LEN + 16], head[512];
    ck_snprintf(p, sizeof p, "%s/metadata.json", dir);
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    size_t n = fread(head, 1, sizeof head - 1, f);
    fclose(f);
    head[n] = '\0';
    return strstr(head, "\"model_only\": true") != NULL;
}

static int cmp_entry(const void *a, const void *b) {
    int64_t x = ((const ckpt_entry *)a)->step, y = ((const ckpt_entry *)b)->step;
    return x < y ? -1 : x > y;
}

int ckpt_scan(const char *dir, ckpt_entry **out, int *n, char *err, size_t errlen) {
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        ck_snprintf(err, errlen, "cannot read the checkpoint folder '%s': %s", dir, strerror(errno));
        return -1;
    }
    int cap = 0;
    ckpt_entry *list = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step = ck_parse_step_dir(e->d_name);
        if (step < 0) continue;
        char p[PATH_LEN];
        ck_snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            ckpt_entry *nl = realloc(list, (size_t)cap * sizeof *nl);
            if (!nl) {
                free(list);
                closedir(d);
                ck_snprintf(err, errlen, "out of memory");
                return -1;
            }
            list = nl;
        }
        ckpt_entry *c = &list[(*n)++];
        c->step = step;
        ck_snprintf(c->name, sizeof c->name, "%s", e->d_name);
        c->model_only = 0;
        if (file_exists(p, "metadata.json")) {
            c->kind = CKPT_COMPLETE;
            c->model_only = meta_model_only(p);
        } else if (file_exists(p, "model.safetensors") || file_exists(p, "model.safetensors.index.json"))
            c->kind = CKPT_HF;
        else c->kind = CKPT_DAMAGED;
    }
    closedir(d);
    if (*n > 1) qsort(list, (size_t)*n, sizeof *list, cmp_entry);
    *out = list;
    return 0;
}

long ckpt_tmp_live_owner(const char *name) {
    const char *dash = strrchr(name, '-');
    char *end = NULL;
    long pid = dash ? strtol(dash + 1, &end, 10) : 0;
    if (pid <= 0 || !end || *end || pid == (long)getpid()) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno != EPERM) return 0;
    /* "pid (comm) state ...": a zombie (a killed rank not yet reaped) is dead, and a live process
     * of another program that reused the pid does not keep a save alive */
    char p[64], stat[256] = "";
    ck_snprintf(p, sizeof p, "/proc/%ld/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return pid;
    if (!fgets(stat, sizeof stat, f)) stat[0] = '\0';
    fclose(f);
    const char *open = strchr(stat, '('), *close = strrchr(stat, ')');
    if (!open || !close || close[1] != ' ') return pid;
    const char state = close[2];
    if (state == 'Z' || state == 'X' || state == 'x') return 0;
    return strncmp(open + 1, "tetra", 5) == 0 ? pid : 0;
}

int ckpt_cleanup_stale_report(const char *dir, char *kept, size_t keptlen) {
    if (kept && keptlen) kept[0] = '\0';
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    char names[64][256];
    int n = 0;
    while ((e = readdir(d)) != NULL && n < 64)
        if (!strncmp(e->d_name, "step-", 5) && strstr(e->d_name, ".tmp-"))
            ck_snprintf(names[n++], 256, "%s", e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++) {
        long owner = ckpt_tmp_live_owner(names[i]);
        if (owner) { /* a save in progress of a live run: never ours to remove */
            if (kept && keptlen) {
                size_t o = strlen(kept);
                ck_snprintf(kept + o, keptlen - o, "%s%s (process %ld)", o ? ", " : "", names[i], owner);
            }
            continue;
        }
        char p[PATH_LEN];
        ck_snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        if (ckpt_remove_tree(p) == 0) removed++;
    }
    return removed;
}

int ckpt_cleanup_stale(const char *dir) { return ckpt_cleanup_stale_report(dir, NULL, 0); }

static void list_complete(const ckpt_entry *l, int n, char *out, size_t len) {
    size_t o = 0;
    out[0] = '\0';
    for (int i = 0; i < n && o < len; i++)
        if (l[i].kind == CKPT_COMPLETE)
            o += (size_t)ck_snprintf(out + o, len - o, "%s%" PRId64, o ? ", " : "", l[i].step);
    if (!o) ck_snprintf(out, len, "none");
}

int ckpt_find(const char *dir, int64_t load_step, char *out, size_t n, char *note, size_t notelen, char *err,
              size_t errlen) {
    ckpt_entry *l = NULL;
    int cnt = 0;
    if (note && notelen) note[0] = '\0';
    if (ckpt_scan(dir, &l, &cnt, err, errlen)) return -1;
    const ckpt_entry *pick = NULL;
    char complete[512];
    list_complete(l, cnt, complete, sizeof complete);
    if (load_step >= 0) {
        for (int i = 0; i < cnt; i++)
            if (l[i].step == load_step) pick = &l[i];
        if (!pick) {
            ck_snprintf(err, errlen,
                        "checkpoint.load_step = %" PRId64 ": there is no %s/step-%" PRId64
                        " (complete checkpoints there: %s)",
                        load_step, dir, load_step, complete);
            free(l);
            return -1;
        }
    } else {
        for (int i = cnt - 1; i >= 0 && !pick; i--)
            if (l[i].kind != CKPT_HF) pick = &l[i];
        if (!pick) {
            free(l);
            return 0;
        }
        if (pick->kind == CKPT_COMPLETE && pick->model_only && pick->step > 0) {
            const ckpt_entry *full = NULL;
            for (const ckpt_entry *e = pick - 1; e >= l && !full; e--) {
                if (e->kind == CKPT_DAMAGED) break; /* never resume past a damaged folder */
                if (e->kind == CKPT_COMPLETE && !e->model_only) full = e;
            }
            if (full) {
                if (note)
                    ck_snprintf(note, notelen,
                                "%s/%s holds model weights only (a final model-only save); resuming "
                                "from %s, the newest checkpoint with the full training state",
                                dir, pick->name, full->name);
                pick = full;
            }
        }
    }
    int rc = 1;
    if (pick->kind == CKPT_DAMAGED) {
        ck_snprintf(err, errlen,
                    "checkpoint %s/%s: %s/%s/metadata.json is missing, so it is not a complete checkpoint "
                    "(damaged, or not written by tetra); refusing to resume from it and leaving it in place: remove "
                    "the folder or set checkpoint.load_step to a complete one (complete checkpoints: %s)",
                    dir, pick->name, dir, pick->name, complete);
        rc = -1;
    } else if (pick->kind == CKPT_HF) {
        ck_snprintf(err, errlen,
                    "checkpoint %s/%s is a Hugging Face export (last_save_in_hf), not a resumable "
                    "checkpoint; load it with checkpoint.initial_load_path and initial_load_in_hf = true "
                    "(complete checkpoints: %s)",
                    dir, pick->name, complete);
        rc = -1;
    } else {
        ck_snprintf(out, n, "%s/%s", dir, pick->name);
    }
    free(l);
    return rc;
}

/* ----------------------------------------------------------------------------
 * agreement */

int ckpt_agree(int failed, char *err, size_t errlen) {
    if (mpi_world() <= 1) return failed ? -1 : 0;
    int world = mpi_world(), rank = mpi_rank();
    const int who = host_min_int(failed ? rank : world);
    if (who == world) return 0;
    char msg[MSG_LEN];
    if (rank == who) ck_snprintf(msg, sizeof msg, "%s", err);
    host_bcast(msg, MSG_LEN, who);
    msg[MSG_LEN - 1] = '\0';
    ck_snprintf(err, errlen, "%s", msg);
    return -1;
}

/* ----------------------------------------------------------------------------
 * saving */

typedef struct {
    int tensor, chunk; /* in the local metadata */
    const float *src;  /* backend memory */
    uint64_t count, offset, length;
    int host; /* src is host memory */
} plan_entry;

struct ckpt_saver {
    ckpt_saver_options o;
    char dir[PATH_LEN];
    long tmp_id;
    int mpi;

    /* the save in flight (or being done synchronously) */
    int in_flight;
    int64_t step;
    int model_only;
    tetra_dtype dtype;
    ckpt_convert_fn convert;
    const void *convert_ctx;
    char tmp[PATH_LEN], final[PATH_LEN], file[PATH_LEN];
    ck_meta local;
    plan_entry *plan;
    int n_plan, cap_plan;
    uint64_t file_bytes;
    json_t *state; /* rank 0 */
    unsigned char *staging;
    size_t staging_cap;
    pthread_t thread;
    int thread_running;
    pthread_mutex_t mu;
    int done, failed;
    char errmsg[MSG_LEN];
    double t_start, stage_s, write_s;
    ckpt_save_report last;
};

static long slow_write_ms(void) {
    /* Test hook: the writer pauses this long halfway through its file, so a test
     * can kill the job while a save is in progress. */
    const char *s = getenv("TETRA_TEST_CKPT_SLOW_WRITE_MS");
    return s ? atol(s) : 0;
}

static void sleep_ms(long ms) {
    if (ms <= 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int pwrite_full(int fd, const void *buf, size_t n, uint64_t off) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

ckpt_saver *ckpt_saver_create(const ckpt_saver_options *o, char *err, size_t errlen) {
    ckpt_saver *s = calloc(1, sizeof *s);
    if (!s) {
        ck_snprintf(err, errlen, "checkpoint: out of host memory");
        return NULL;
    }
    s->o = *o;
    ck_snprintf(s->dir, sizeof s->dir, "%s", o->dir);
    s->o.dir = s->dir;
    s->mpi = mpi_world() > 1;
    s->tmp_id = (long)getpid();
    if (s->mpi) host_bcast(&s->tmp_id, sizeof s->tmp_id, 0);
    pthread_mutex_init(&s->mu, NULL);
    ck_meta_init(&s->local);
    return s;
}

static void reset_save(ckpt_saver *s) {
    ck_meta_free(&s->local);
    ck_meta_init(&s->local);
    s->n_plan = 0;
    s->file_bytes = 0;
    json_decref(s->state);
    s->state = NULL;
    s->done = s->failed = 0;
    s->errmsg[0] = '\0';
}

void ckpt_saver_free(ckpt_saver *s) {
    if (!s) return;
    /* not collective: a save still in flight is abandoned after its writer
     * stops (its step-N.tmp-* folder is removed at the next start) */
    if (s->thread_running) pthread_join(s->thread, NULL);
    s->thread_running = 0;
    reset_save(s);
    ck_meta_free(&s->local);
    free(s->plan);
    free(s->staging);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int ckpt_in_flight(const ckpt_saver *s) { return s->in_flight; }
ckpt_save_report ckpt_last_report(const ckpt_saver *s) { return s->last; }
double ckpt_last_stage_s(const ckpt_saver *s) { return s->stage_s; }

/* This rank's chunks: every piece of every group, split at CK_MAX_CHUNK_ELEMS,
 * laid out back to back at 64-byte aligned offsets of its file. */
static int build_plan(ckpt_saver *s, const ckpt_save_request *r, char *err, size_t errlen) {
    if (!s->o.writer) return 0;
    const size_t es = tetra_dtype_size(r->dtype);
    uint64_t off = 0;
    for (int g = 0; g < r->n_groups; g++) {
        const ckpt_group *grp = &r->groups[g];
        for (int i = 0; i < grp->n; i++) {
            const dt_tensor *t = &grp->tensors[i];
            char name[CK_NAME_MAX];
            ck_snprintf(name, sizeof name, "%s%s", grp->prefix, t->name);
            /* every tensor is listed, held here or not, so metadata.json keeps the model's order */
            int ti = ck_meta_tensor(&s->local, name, r->dtype, t->ndim, t->shape);
            if (ti < 0) goto oom;
            if (!t->n_pieces || t->piece.count == 0) continue;
            for (uint64_t k = 0; k < t->piece.count; k += CK_MAX_CHUNK_ELEMS) {
                uint64_t cnt = t->piece.count - k < CK_MAX_CHUNK_ELEMS ? t->piece.count - k : CK_MAX_CHUNK_ELEMS;
                ck_chunk c;
                memset(&c, 0, sizeof c);
                c.file = 0;
                c.offset = off;
                c.length = cnt * es;
                for (int d = 0; d < t->ndim; d++) {
                    c.box_start[d] = t->box_start[d];
                    c.box_shape[d] = t->box_shape[d];
                }
                c.start = t->piece.start + k;
                c.count = cnt;
                if (ck_tensor_add_chunk(&s->local.tensors[ti], &c)) goto oom;
                if (s->n_plan == s->cap_plan) {
                    int nc = s->cap_plan ? 2 * s->cap_plan : 256;
                    plan_entry *np = realloc(s->plan, (size_t)nc * sizeof *np);
                    if (!np) goto oom;
                    s->plan = np;
                    s->cap_plan = nc;
                }
                plan_entry *p = &s->plan[s->n_plan++];
                p->tensor = ti;
                p->chunk = s->local.tensors[ti].n_chunks - 1;
                p->src = grp->storage + t->piece.local_offset + k;
                p->host = grp->host;
                p->count = cnt;
                p->offset = off;
                p->length = c.length;
                off = (off + c.length + CK_ALIGN - 1) / CK_ALIGN * CK_ALIGN;
            }
        }
    }
    s->file_bytes = s->n_plan ? s->plan[s->n_plan - 1].offset + s->plan[s->n_plan - 1].length : 0;
    return 0;
oom:
    ck_snprintf(err, errlen, "checkpoint: out of host memory planning the save");
    return -1;
}

/* A piece's bytes to host memory: through the op table, or copied where they live on the host. */
static void copy_out(const ckpt_saver *s, const plan_entry *p, void *dst, size_t bytes) {
    if (p->host) memcpy(dst, p->src, bytes);
    else s->o.ops->copy_d2h(dst, p->src, bytes);
}

static void set_crc(ckpt_saver *s, const plan_entry *p, uint32_t crc) {
    s->local.tensors[p->tensor].chunks[p->chunk].crc = crc;
}

/* Writes the file from the staging buffer (async) or from backend memory
 * through a bounded host buffer (sync). Fills the chunks' CRCs. */
static int write_file(ckpt_saver *s, const unsigned char *staging, char *err, size_t errlen) {
    if (!s->o.writer || s->n_plan == 0) return 0;
    int fd = open(s->file, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot create '%s': %s", s->step, s->file,
                    strerror(errno));
        return -1;
    }
    const size_t es = tetra_dtype_size(s->dtype);
    float *host = NULL;
    unsigned char *bytes = NULL;
    int rc = 0;
    if (!staging) {
        uint64_t maxc = 0;
        for (int i = 0; i < s->n_plan; i++)
            if (s->plan[i].count > maxc) maxc = s->plan[i].count;
        host = malloc((size_t)maxc * sizeof(float));
        bytes = s->dtype == TETRA_F32 ? (unsigned char *)host : malloc((size_t)maxc * es);
        if (!host || !bytes) {
            ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": out of host memory writing '%s'", s->step, s->file);
            rc = -1;
        }
    }
    const long pause = slow_write_ms();
    for (int i = 0; i < s->n_plan && rc == 0; i++) {
        const plan_entry *p = &s->plan[i];
        const unsigned char *data;
        if (staging) {
            data = staging + p->offset;
        } else {
            copy_out(s, p, host, (size_t)p->count * sizeof(float));
            if (s->dtype != TETRA_F32) ck_encode(bytes, host, (size_t)p->count, s->dtype);
            data = bytes;
        }
        set_crc(s, p, crc32c(0, data, (size_t)p->length));
        if (pwrite_full(fd, data, (size_t)p->length, p->offset) != 0) {
            ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot write '%s': %s", s->step, s->file,
                        errno ? strerror(errno) : "short write");
            rc = -1;
        }
        if (pause > 0 && i == s->n_plan / 2) sleep_ms(pause);
    }
    if (rc == 0 && fsync(fd) != 0) {
        ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot fsync '%s': %s", s->step, s->file,
                    strerror(errno));
        rc = -1;
    }
    if (close(fd) != 0 && rc == 0) {
        ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot close '%s': %s", s->step, s->file,
                    strerror(errno));
        rc = -1;
    }
    if (bytes != (unsigned char *)host) free(bytes);
    free(host);
    return rc;
}

static void *writer_thread(void *arg) {
    ckpt_saver *s = arg;
    char err[MSG_LEN];
    err[0] = '\0';
    double t0 = now_s();
    int rc = write_file(s, s->staging, err, sizeof err);
    pthread_mutex_lock(&s->mu);
    s->write_s = now_s() - t0;
    s->failed = rc != 0;
    if (rc) ck_snprintf(s->errmsg, sizeof s->errmsg, "%s", err);
    s->done = 1;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Copy this rank's pieces into the staging buffer, in their file layout. */
static int stage(ckpt_saver *s, char *err, size_t errlen) {
    if (!s->o.writer || s->n_plan == 0) return 0;
    if (s->file_bytes > s->staging_cap) {
        free(s->staging);
        s->staging = malloc((size_t)s->file_bytes);
        s->staging_cap = s->staging ? (size_t)s->file_bytes : 0;
        if (!s->staging) {
            ck_snprintf(err, errlen,
                        "checkpoint step %" PRId64 ": cannot allocate %.1f MiB of host staging memory for "
                        "the async save",
                        s->step, (double)s->file_bytes / (1024.0 * 1024.0));
            return -1;
        }
    }
    float *tmp = NULL;
    uint64_t prev_end = 0;
    for (int i = 0; i < s->n_plan; i++) {
        const plan_entry *p = &s->plan[i];
        if (p->offset > prev_end) memset(s->staging + prev_end, 0, (size_t)(p->offset - prev_end));
        prev_end = p->offset + p->length;
        if (s->dtype == TETRA_F32) {
            copy_out(s, p, s->staging + p->offset, (size_t)p->length);
        } else {
            if (!tmp) tmp = malloc((size_t)CK_MAX_CHUNK_ELEMS * sizeof(float));
            if (!tmp) {
                ck_snprintf(err, errlen, "checkpoint: out of host memory staging step %" PRId64, s->step);
                return -1;
            }
            copy_out(s, p, tmp, (size_t)p->count * sizeof(float));
            ck_encode(s->staging + p->offset, tmp, (size_t)p->count, s->dtype);
        }
    }
    free(tmp);
    return 0;
}

/* Moves `from` to `to`, first moving an existing `to` aside (then removing it). */
static int publish(const char *from, const char *to, long id) {
    struct stat st;
    char old[PATH_LEN];
    int had_old = 0;
    if (stat(to, &st) == 0) {
        ck_snprintf(old, sizeof old, "%s.tmp-old-%ld", to, id);
        ckpt_remove_tree(old);
        if (rename(to, old) != 0) return -1;
        had_old = 1;
    }
    if (rename(from, to) != 0) return -1;
    if (had_old) ckpt_remove_tree(old);
    return 0;
}

static void prune(ckpt_saver *s) {
    if (s->o.keep_latest_k <= 0) return;
    ckpt_entry *l = NULL;
    int n = 0;
    char err[MSG_LEN];
    if (ckpt_scan(s->dir, &l, &n, err, sizeof err)) return;
    int kept = 1; /* the one just written */
    for (int i = n - 1; i >= 0; i--) {
        if (l[i].kind != CKPT_COMPLETE || l[i].step == s->step) continue;
        if (kept < s->o.keep_latest_k) {
            kept++;
            continue;
        }
        /* move out of the way atomically first, so a kill mid-delete leaves a
         * *.tmp-* folder (ignored, cleaned at start), never a damaged step-N */
        char from[PATH_LEN], to[PATH_LEN];
        ck_snprintf(from, sizeof from, "%s/%s", s->dir, l[i].name);
        ck_snprintf(to, sizeof to, "%s/%s.tmp-delete-%ld", s->dir, l[i].name, s->tmp_id);
        if (rename(from, to) == 0) ckpt_remove_tree(to);
    }
    free(l);
    fsync_dir(s->dir);
}

/* Rank 0: assemble and publish the checkpoint from every rank's contribution. */
static int finalise_rank0(ckpt_saver *s, char **texts, int world, char *err, size_t errlen) {
    ck_meta m;
    ck_meta_init(&m);
    m.step = s->step;
    m.model_only = s->model_only;
    if (s->state) {
        json_decref(m.state);
        m.state = json_deep_copy(s->state);
    }
    int failed = 0, rc = 0;
    for (int r = 0; r < world && rc == 0 && !failed; r++) {
        char fname[64];
        ck_snprintf(fname, sizeof fname, "rank_%05d.bin", r);
        if (ck_chunks_merge(&m, texts[r], fname, &failed, err, errlen)) rc = -1;
    }
    if (failed) rc = -1;
    uint64_t total = 0;
    for (int i = 0; i < m.n_files; i++) total += m.files[i].size;
    char path[PATH_LEN + 32];
    if (rc == 0) {
        ck_snprintf(path, sizeof path, "%s/metadata.json", s->tmp);
        rc = ck_meta_write(&m, path, err, errlen);
    }
    if (rc == 0 && fsync_dir(s->tmp) != 0) {
        ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot fsync '%s': %s", s->step, s->tmp,
                    strerror(errno));
        rc = -1;
    }
    if (rc == 0 && s->convert) {
        char out_tmp[PATH_LEN + 16];
        ck_snprintf(out_tmp, sizeof out_tmp, "%s-out", s->tmp);
        rc = s->convert(s->tmp, out_tmp, s->convert_ctx, err, errlen);
        if (rc == 0 && publish(out_tmp, s->final, s->tmp_id) != 0) {
            ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot rename '%s' to '%s': %s", s->step, out_tmp,
                        s->final, strerror(errno));
            rc = -1;
        }
        if (rc != 0) ckpt_remove_tree(out_tmp);
        ckpt_remove_tree(s->tmp);
    } else if (rc == 0 && publish(s->tmp, s->final, s->tmp_id) != 0) {
        ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot rename '%s' to '%s': %s", s->step, s->tmp,
                    s->final, strerror(errno));
        rc = -1;
    }
    if (rc == 0 && fsync_dir(s->dir) != 0) {
        ck_snprintf(err, errlen, "checkpoint step %" PRId64 ": cannot fsync '%s': %s", s->step, s->dir,
                    strerror(errno));
        rc = -1;
    }
    if (rc != 0) ckpt_remove_tree(s->tmp);
    else if (!s->convert) prune(s);
    s->last.total_bytes = total;
    ck_meta_free(&m);
    return rc;
}

/* Collective: gather, publish at rank 0, broadcast the outcome. */
static int finalise(ckpt_saver *s, char *err, size_t errlen) {
    const int rank = s->o.rank, world = s->mpi ? s->o.world : 1;
    char *mine = ck_chunks_serialise(&s->local, s->file_bytes, s->failed ? s->errmsg : NULL);
    int len = mine ? (int)strlen(mine) + 1 : 0;
    char **texts = NULL;
    char *all = NULL;
    int *lens = NULL, *displs = NULL;
    int rc = 0;
    char msg[MSG_LEN];
    msg[0] = '\0';
    if (rank == 0) {
        texts = calloc((size_t)world, sizeof *texts);
        lens = calloc((size_t)world, sizeof *lens);
        displs = calloc((size_t)world, sizeof *displs);
    }
    /* every rank's chunk list (each with its NUL) end to end at rank 0 */
    int gathered = rank != 0 || lens ? host_gather_text(mine ? mine : "", len, &all, lens) : -1;
    if (rank == 0 && gathered == 0 && displs) {
        long tot = 0;
        for (int r = 0; r < world; r++) {
            displs[r] = (int)tot;
            tot += lens[r];
        }
    }
    if (rank == 0) {
        int ok = texts && lens && displs && all;
        for (int r = 0; ok && r < world; r++) {
            texts[r] = all + displs[r];
            if (lens[r] == 0) ok = 0;
        }
        if (!ok) {
            ck_snprintf(msg, sizeof msg, "checkpoint step %" PRId64 ": out of memory gathering the chunk lists",
                        s->step);
            rc = -1;
            ckpt_remove_tree(s->tmp);
        } else {
            rc = finalise_rank0(s, texts, world, msg, sizeof msg);
        }
    }
    if (s->mpi) {
        host_bcast(&rc, sizeof rc, 0);
        host_bcast(msg, MSG_LEN, 0);
        msg[MSG_LEN - 1] = '\0';
    }
    free(mine);
    free(all);
    free(texts);
    free(lens);
    free(displs);
    s->last.step = s->step;
    s->last.stage_s = s->stage_s;
    s->last.write_s = s->write_s;
    s->last.bytes = s->file_bytes;
    s->last.total_s = now_s() - s->t_start;
    if (rc != 0) ck_snprintf(err, errlen, "%s", msg);
    return rc ? -1 : 0;
}

int ckpt_poll(ckpt_saver *s, int wait, char *err, size_t errlen) {
    if (!s->in_flight) return 0;
    if (wait && s->thread_running) {
        pthread_join(s->thread, NULL);
        s->thread_running = 0;
    }
    pthread_mutex_lock(&s->mu);
    int done = s->done;
    pthread_mutex_unlock(&s->mu);
    if (s->mpi) done = host_min_int(done);
    if (!done) return 0;
    if (s->thread_running) {
        pthread_join(s->thread, NULL);
        s->thread_running = 0;
    }
    int rc = finalise(s, err, errlen);
    s->in_flight = 0;
    reset_save(s);
    return rc ? -1 : 1;
}

int ckpt_save(ckpt_saver *s, const ckpt_save_request *r, char *err, size_t errlen) {
    if (s->in_flight && ckpt_poll(s, 1, err, errlen) < 0) return -1;
    reset_save(s);
    s->t_start = now_s();
    s->stage_s = s->write_s = 0.0;
    s->step = r->step;
    s->model_only = r->model_only;
    s->convert = r->convert;
    s->convert_ctx = r->convert_ctx;
    s->dtype = r->dtype;
    ck_snprintf(s->tmp, sizeof s->tmp, "%s/step-%" PRId64 ".tmp-%ld", s->dir, r->step, s->tmp_id);
    ck_snprintf(s->final, sizeof s->final, "%s/step-%" PRId64, s->dir, r->step);
    ck_snprintf(s->file, sizeof s->file, "%s/rank_%05d.bin", s->tmp, s->o.rank);
    if (s->o.rank == 0 && r->state) s->state = json_deep_copy(r->state);

    /* 1. the temporary folder */
    int failed = 0;
    char msg[MSG_LEN];
    msg[0] = '\0';
    if (s->o.rank == 0) {
        ckpt_remove_tree(s->tmp);
        if (util_mkdir_p(s->dir) != 0 || mkdir(s->tmp, 0755) != 0) {
            ck_snprintf(msg, sizeof msg, "checkpoint step %" PRId64 ": cannot create '%s': %s", r->step, s->tmp,
                        strerror(errno));
            failed = 1;
        }
    }
    if (!failed && build_plan(s, r, msg, sizeof msg)) failed = 1;
    if (ckpt_agree(failed, msg, sizeof msg)) {
        if (s->o.rank == 0) ckpt_remove_tree(s->tmp);
        ck_snprintf(err, errlen, "%s", msg);
        reset_save(s);
        return -1;
    }

    /* 2. the shard files */
    if (s->o.async && !r->sync) {
        double t0 = now_s();
        failed = stage(s, msg, sizeof msg) != 0;
        s->stage_s = now_s() - t0;
        if (!failed) {
            s->done = 0;
            if (pthread_create(&s->thread, NULL, writer_thread, s) != 0) {
                ck_snprintf(msg, sizeof msg, "checkpoint step %" PRId64 ": cannot start the writer thread", r->step);
                failed = 1;
            } else {
                s->thread_running = 1;
            }
        }
        if (ckpt_agree(failed, msg, sizeof msg)) {
            if (s->thread_running) {
                pthread_join(s->thread, NULL);
                s->thread_running = 0;
            }
            if (s->o.rank == 0) ckpt_remove_tree(s->tmp);
            ck_snprintf(err, errlen, "%s", msg);
            reset_save(s);
            return -1;
        }
        s->in_flight = 1;
        return 0;
    }
    double t0 = now_s();
    if (write_file(s, NULL, s->errmsg, sizeof s->errmsg) != 0) s->failed = 1;
    s->write_s = now_s() - t0;
    s->done = 1;
    /* 3. publish */
    int rc = finalise(s, err, errlen);
    reset_save(s);
    return rc;
}

/* ----------------------------------------------------------------------------
 * reading */

struct ckpt_reader {
    char dir[PATH_LEN];
    ck_meta meta;
    int *fds;
    const ck_tensor *cached_t;
    int cached_c;
    unsigned char *raw;
    size_t raw_cap;
    float *host;
    size_t host_cap;
};

const ck_meta *ckpt_reader_meta(const ckpt_reader *r) { return &r->meta; }
const char *ckpt_reader_dir(const ckpt_reader *r) { return r->dir; }

void ckpt_reader_close(ckpt_reader *r) {
    if (!r) return;
    for (int i = 0; r->fds && i < r->meta.n_files; i++)
        if (r->fds[i] >= 0) close(r->fds[i]);
    free(r->fds);
    free(r->raw);
    free(r->host);
    ck_meta_free(&r->meta);
    free(r);
}

/* A folder named step-N holds step N: a renamed folder would resume at the wrong step and
 * save over another step's name. Folders named otherwise (initial_load_path) are not checked. */
static int check_step_folder(const ckpt_reader *r, const char *meta_path, char *why, size_t n) {
    const char *base = strrchr(r->dir, '/');
    base = base ? base + 1 : r->dir;
    const int64_t named = ck_parse_step_dir(base);
    if (named < 0 || named == r->meta.step) return 0;
    ck_snprintf(why, n,
                "%s records \"step\": %" PRId64 " but its folder is named %s (renamed, or its files copied "
                "from another step); rename the folder to step-%" PRId64 " if that is the step it holds",
                meta_path, r->meta.step, base, r->meta.step);
    return -1;
}

ckpt_reader *ckpt_reader_open(const char *step_dir, char *err, size_t errlen) {
    ckpt_reader *r = calloc(1, sizeof *r);
    if (!r) {
        ck_snprintf(err, errlen, "checkpoint: out of host memory");
        return NULL;
    }
    ck_snprintf(r->dir, sizeof r->dir, "%s", step_dir);
    size_t l = strlen(r->dir);
    while (l > 1 && r->dir[l - 1] == '/') r->dir[--l] = '\0';
    ck_meta_init(&r->meta);
    struct stat st;
    if (stat(r->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        ck_snprintf(err, errlen, "checkpoint %s: not a folder (%s)", r->dir, strerror(errno ? errno : ENOTDIR));
        ckpt_reader_close(r);
        return NULL;
    }
    char path[PATH_LEN + 32];
    ck_snprintf(path, sizeof path, "%s/metadata.json", r->dir);
    char why[MSG_LEN];
    if (ck_meta_read(&r->meta, path, why, sizeof why) || check_step_folder(r, path, why, sizeof why) ||
        ck_meta_check_state(&r->meta, path, why, sizeof why)) {
        ck_snprintf(err, errlen, "checkpoint %s: %s; refusing to load it", r->dir, why);
        ckpt_reader_close(r);
        return NULL;
    }
    r->fds = malloc(sizeof(int) * (size_t)(r->meta.n_files ? r->meta.n_files : 1));
    if (!r->fds) {
        ck_snprintf(err, errlen, "checkpoint: out of host memory");
        ckpt_reader_close(r);
        return NULL;
    }
    for (int i = 0; i < r->meta.n_files; i++) r->fds[i] = -1;
    /* every file present with its full size; name the first tensor a short file cuts */
    for (int f = 0; f < r->meta.n_files; f++) {
        ck_snprintf(path, sizeof path, "%s/%s", r->dir, r->meta.files[f].name);
        int missing = stat(path, &st) != 0;
        uint64_t have = missing ? 0 : (uint64_t)st.st_size;
        if (!missing && have == r->meta.files[f].size) continue;
        if (!missing && have > r->meta.files[f].size) { /* every chunk is there, but the file is not the saved one */
            ck_snprintf(err, errlen,
                        "checkpoint %s: shard file %s has %" PRIu64 " bytes but metadata.json records %" PRIu64
                        " (files[%d].size): %" PRIu64 " bytes after its last chunk, so it is not the file this save "
                        "wrote (appended to, or copied from another save); refusing to load",
                        r->dir, path, have, r->meta.files[f].size, f, have - r->meta.files[f].size);
            ckpt_reader_close(r);
            return NULL;
        }
        const char *tname = "?";
        int cidx = -1;
        uint64_t co = 0, cl = 0;
        for (int t = 0; t < r->meta.n_tensors && cidx < 0; t++)
            for (int c = 0; c < r->meta.tensors[t].n_chunks; c++) {
                const ck_chunk *ch = &r->meta.tensors[t].chunks[c];
                if (ch->file == f && ch->offset + ch->length > have) {
                    tname = r->meta.tensors[t].name;
                    cidx = c;
                    co = ch->offset;
                    cl = ch->length;
                    break;
                }
            }
        if (missing)
            ck_snprintf(err, errlen,
                        "checkpoint %s: shard file %s is missing (%s); it holds tensor '%s' and others; "
                        "refusing to load",
                        r->dir, path, strerror(errno), tname);
        else
            ck_snprintf(err, errlen,
                        "checkpoint %s: shard file %s is truncated (%" PRIu64 " of %" PRIu64 " bytes): "
                        "tensor '%s' chunk %d (bytes %" PRIu64 "..%" PRIu64 ") lies past its end; refusing to load",
                        r->dir, path, have, r->meta.files[f].size, tname, cidx, co, co + cl);
        ckpt_reader_close(r);
        return NULL;
    }
    return r;
}

static int ensure(void **p, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    void *q = realloc(*p, need);
    if (!q) return -1;
    *p = q;
    *cap = need;
    return 0;
}

/* The bytes of chunk c of t, read whole and CRC-checked (one-chunk cache). */
static const unsigned char *get_chunk(ckpt_reader *r, const ck_tensor *t, int c, char *err, size_t errlen) {
    if (r->cached_t == t && r->cached_c == c) return r->raw;
    r->cached_t = NULL;
    const ck_chunk *ch = &t->chunks[c];
    const char *fname = r->meta.files[ch->file].name;
    if (r->fds[ch->file] < 0) {
        char path[PATH_LEN + 80];
        ck_snprintf(path, sizeof path, "%s/%s", r->dir, fname);
        r->fds[ch->file] = open(path, O_RDONLY);
        if (r->fds[ch->file] < 0) {
            ck_snprintf(err, errlen, "checkpoint %s: cannot open %s for tensor '%s': %s", r->dir, path, t->name,
                        strerror(errno));
            return NULL;
        }
    }
    if (ensure((void **)&r->raw, &r->raw_cap, (size_t)ch->length ? (size_t)ch->length : 1)) {
        ck_snprintf(err, errlen, "checkpoint: out of host memory reading tensor '%s'", t->name);
        return NULL;
    }
    errno = 0;
    if (util_pread_all(r->fds[ch->file], r->raw, (size_t)ch->length, ch->offset) != 0) {
        ck_snprintf(err, errlen,
                    "checkpoint %s: cannot read tensor '%s' chunk %d from %s/%s (bytes %" PRIu64 "..%" PRIu64
                    "): %s; refusing to load",
                    r->dir, t->name, c, r->dir, fname, ch->offset, ch->offset + ch->length,
                    errno ? strerror(errno) : "the file is truncated");
        return NULL;
    }
    uint32_t crc = crc32c(0, r->raw, (size_t)ch->length);
    if (crc != ch->crc) {
        ck_snprintf(err, errlen,
                    "checkpoint %s: checksum mismatch in %s/%s, tensor '%s' chunk %d (bytes %" PRIu64 "..%" PRIu64
                    "): crc32c %08" PRIx32 " recorded, %08" PRIx32 " read; the file is corrupt, refusing "
                    "to load",
                    r->dir, r->dir, fname, t->name, c, ch->offset, ch->offset + ch->length, ch->crc, crc);
        return NULL;
    }
    r->cached_t = t;
    r->cached_c = c;
    return r->raw;
}

int ckpt_reader_verify_chunk(ckpt_reader *r, const ck_tensor *t, int c, char *err, size_t errlen) {
    r->cached_t = NULL;
    return get_chunk(r, t, c, err, errlen) ? 0 : -1;
}

typedef struct {
    const unsigned char *raw;
    size_t es;
    tetra_dtype dt;
    float *out;
} decode_ctx;

static void decode_run(void *user, uint64_t src_k, uint64_t dst_k, uint64_t n) {
    decode_ctx *d = user;
    ck_decode(d->out + dst_k, d->raw + src_k * d->es, (size_t)n, d->dt);
}

int ckpt_reader_read_region(ckpt_reader *r, const ck_tensor *t, const ck_region *want, float *out, char *err,
                            size_t errlen) {
    uint64_t covered = 0;
    for (int c = 0; c < t->n_chunks; c++) {
        ck_region src = ck_region_of_chunk(t->ndim, &t->chunks[c]);
        if (ck_overlap(t->ndim, &src, want, NULL, NULL) == 0) continue;
        const unsigned char *raw = get_chunk(r, t, c, err, errlen);
        if (!raw) return -1;
        decode_ctx d = {raw, tetra_dtype_size(t->dtype), t->dtype, out};
        covered += ck_overlap(t->ndim, &src, want, decode_run, &d);
    }
    if (covered != want->count) {
        ck_snprintf(err, errlen,
                    "checkpoint %s: tensor '%s': the chunks cover %" PRIu64 " of the %" PRIu64
                    " elements wanted (elements [%" PRIu64 ", %" PRIu64 ")); the metadata is inconsistent",
                    r->dir, t->name, covered, want->count, want->start, want->start + want->count);
        return -1;
    }
    return 0;
}

static void fmt_shape(char *out, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)ck_snprintf(out, n, "[");
    for (int d = 0; d < ndim && o < n; d++)
        o += (size_t)ck_snprintf(out + o, n - o, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (o < n) ck_snprintf(out + o, n - o, "]");
}

int ckpt_reader_load(ckpt_reader *r, const ckpt_group *g, const tetra_ops *ops, char *err, size_t errlen) {
    for (int i = 0; i < g->n; i++) {
        const dt_tensor *t = &g->tensors[i];
        char name[CK_NAME_MAX];
        ck_snprintf(name, sizeof name, "%s%s", g->prefix, t->name);
        const ck_tensor *ct = ck_meta_find(&r->meta, name);
        if (!ct) {
            ck_snprintf(err, errlen, "checkpoint %s has no tensor '%s'%s", r->dir, name,
                        r->meta.model_only ? " (it holds model weights only)" : "");
            return -1;
        }
        int same = ct->ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = ct->shape[d] == t->shape[d];
        if (!same) {
            char a[96], b[96];
            fmt_shape(a, sizeof a, ct->ndim, ct->shape);
            fmt_shape(b, sizeof b, t->ndim, t->shape);
            ck_snprintf(err, errlen,
                        "checkpoint %s: tensor '%s' has shape %s; this model's is %s (another model flavor?)", r->dir,
                        name, a, b);
            return -1;
        }
        if (!t->n_pieces || t->piece.count == 0) continue;
        ck_region whole = ck_region_of_piece(t);
        const uint64_t block = CK_MAX_CHUNK_ELEMS;
        size_t need = (size_t)(whole.count < block ? whole.count : block) * sizeof(float);
        if (ensure((void **)&r->host, &r->host_cap, need)) {
            ck_snprintf(err, errlen, "checkpoint: out of host memory loading '%s'", name);
            return -1;
        }
        for (uint64_t k = 0; k < whole.count; k += block) {
            ck_region part = whole;
            part.start = whole.start + k;
            part.count = whole.count - k < block ? whole.count - k : block;
            if (ckpt_reader_read_region(r, ct, &part, r->host, err, errlen)) return -1;
            float *dst = g->storage + t->piece.local_offset + k;
            if (g->host) memcpy(dst, r->host, (size_t)part.count * sizeof(float));
            else ops->copy_h2d(dst, r->host, (size_t)part.count * sizeof(float));
        }
    }
    return 0;
}
