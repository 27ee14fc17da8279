/* comm_trace.c — the flight recorder (TorchTitan's comm.trace_buf_size): the last N
 * operations of this rank in a ring, written as JSON when a wait times out, an operation
 * fails, or the process gets SIGUSR2; on a timeout, the peers' dumps say which ranks of
 * the group never issued the operation. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "parallel/comm_internal.h"

struct commi_trace_entry {
    uint64_t seq; /* the group's sequence number of the operation */
    int64_t step;
    double t_issue; /* seconds, monotonic */
    double t_done;  /* 0 while in flight */
    size_t bytes;
    int group; /* mesh_group_id */
    int kind;  /* comm_kind */
    int peer;  /* send / recv / sendrecv: the group rank on the other side; -1 */
};

static volatile sig_atomic_t dump_requested;
static void on_sigusr2(int sig) {
    (void)sig;
    dump_requested = 1;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int commi_trace_init(comm_world *w, char *err, size_t errlen) {
    if (w->opt.trace_buf_size <= 0) {
        w->opt.trace_dir = w->opt.trace_prefix = NULL;
        return 0;
    }
    /* the caller's strings need not outlive this call: keep copies */
    w->trace_dir = strdup(w->opt.trace_dir ? w->opt.trace_dir : "");
    w->trace_prefix = strdup(w->opt.trace_prefix ? w->opt.trace_prefix : "rank_");
    w->opt.trace_dir = w->trace_dir;
    w->opt.trace_prefix = w->trace_prefix;
    w->trace = calloc((size_t)w->opt.trace_buf_size, sizeof *w->trace);
    if (!w->trace || !w->trace_dir || !w->trace_prefix) {
        snprintf(err, errlen, "comm: out of host memory for a flight recorder of %d entries", w->opt.trace_buf_size);
        return -1;
    }
    w->trace_wall_offset = wall_now() - commi_now();
    /* SIGUSR2 asks for a dump without stopping (SIGUSR1 is the preemption signal) */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr2;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &sa, NULL);
    return 0;
}

void commi_trace_free(comm_world *w) {
    free(w->trace);
    free(w->trace_dir);
    free(w->trace_prefix);
    w->trace = NULL;
    w->trace_dir = w->trace_prefix = NULL;
}

void commi_trace_issue(comm_request *r) {
    comm_world *w = r->g->w;
    if (!w->trace) return;
    const size_t n = (size_t)w->opt.trace_buf_size;
    struct commi_trace_entry *e = &w->trace[w->trace_total % n];
    e->seq = r->seq;
    e->step = r->step;
    e->t_issue = r->t_start;
    e->t_done = 0;
    e->bytes = r->count * comm_dtype_size(r->dtype);
    e->group = (int)r->g->id;
    e->kind = (int)r->kind;
    e->peer = -1;
    r->trace_id = ++w->trace_total;
}

/* The entry of r while the ring still holds it, else NULL. */
static struct commi_trace_entry *entry_of(const comm_request *r) {
    const comm_world *w = r->g->w;
    if (!w->trace || !r->trace_id || w->trace_total - r->trace_id >= (uint64_t)w->opt.trace_buf_size) return NULL;
    return &w->trace[(r->trace_id - 1) % (uint64_t)w->opt.trace_buf_size];
}

void commi_trace_peer(const comm_request *r, int peer) {
    struct commi_trace_entry *e = entry_of(r);
    if (e) e->peer = peer;
}

void commi_trace_done(const comm_request *r) {
    struct commi_trace_entry *e = entry_of(r);
    if (e) e->t_done = commi_now();
}

static void trace_path(const comm_world *w, int rank, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s%d.json", w->opt.trace_dir, w->opt.trace_prefix ? w->opt.trace_prefix : "rank_", rank);
}

static int mkdir_p(const char *dir) {
    char p[4096];
    snprintf(p, sizeof p, "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) && errno != EEXIST) return -1;
            *s = '/';
        }
    return mkdir(p, 0755) && errno != EEXIST ? -1 : 0;
}

int commi_trace_dump(comm_world *w, const char *reason, const comm_request *waiting, char *path, size_t pathlen) {
    if (!w->trace || !w->opt.trace_dir || !*w->opt.trace_dir) return -1;
    char tmp[4200];
    trace_path(w, w->rank, path, pathlen);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (mkdir_p(w->opt.trace_dir)) return -1;
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    const double now = commi_now(), off = w->trace_wall_offset;
    fprintf(f, "{\"format\":\"tetra-comm-trace\",\"version\":1,\"run_id\":%.6f,\"rank\":%d,\"world\":%d,", w->run_id,
            w->rank, w->m.world);
    fprintf(f, "\"reason\":\"%s\",\"time\":%.6f,\"step\":%lld,\"waiting\":", reason, now + off, (long long)w->step);
    if (waiting)
        fprintf(f, "{\"group\":\"%s\",\"op\":\"%s\",\"seq\":%llu,\"step\":%lld,\"waited_s\":%.3f}",
                mesh_group_name(waiting->g->id), commi_kind_name(waiting->kind), (unsigned long long)waiting->seq,
                (long long)waiting->step, now - waiting->t_start);
    else fputs("null", f);
    /* operations issued per group, exact even when the ring has wrapped */
    fputs(",\"issued\":{", f);
    for (int i = 0, first = 1; i < MESH_N_GROUPS; i++) {
        if (w->groups[i].size < 2) continue;
        fprintf(f, "%s\"%s\":%llu", first ? "" : ",", mesh_group_name((mesh_group_id)i),
                (unsigned long long)w->groups[i].seq);
        first = 0;
    }
    fprintf(f, "},\"buffer\":%d,\"recorded\":%llu,\"entries\":[", w->opt.trace_buf_size,
            (unsigned long long)w->trace_total);
    const uint64_t n = (uint64_t)w->opt.trace_buf_size;
    const uint64_t first = w->trace_total > n ? w->trace_total - n : 0;
    for (uint64_t id = first; id < w->trace_total; id++) {
        const struct commi_trace_entry *e = &w->trace[id % n];
        fprintf(f,
                "%s\n{\"id\":%llu,\"group\":\"%s\",\"op\":\"%s\",\"seq\":%llu,\"step\":%lld,\"bytes\":%zu,"
                "\"peer\":%d,\"issued\":%.6f,\"completed\":",
                id == first ? "" : ",", (unsigned long long)(id + 1), mesh_group_name((mesh_group_id)e->group),
                commi_kind_name((comm_kind)e->kind), (unsigned long long)e->seq, (long long)e->step, e->bytes, e->peer,
                e->t_issue + off);
        if (e->t_done > 0) fprintf(f, "%.6f}", e->t_done + off);
        else fputs("null}", f);
    }
    fputs("\n]}\n", f);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path)) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

void commi_trace_poll(comm_world *w) {
    if (!dump_requested || !w->trace) return;
    dump_requested = 0;
    char path[4096];
    if (commi_trace_dump(w, "SIGUSR2", NULL, path, sizeof path) == 0)
        fprintf(stderr, "comm: rank %d: flight recorder written to %s (SIGUSR2)\n", w->rank, path);
}

/* After r timed out and this rank dumped its own trace: wait a little for the dumps of the
 * group's other ranks (they time out too, unless stuck outside a collective or dead), then
 * name the ranks holding it up: those that did not issue r's operation, left no dump, or
 * dumped seconds after the others (not running while they waited). */
void commi_trace_blame(const comm_request *r, char *buf, size_t n) {
    const comm_world *w = r->g->w;
    buf[0] = 0;
    if (!w->trace || !w->opt.trace_dir || !*w->opt.trace_dir) return;
    int members[1024];
    const int gs = r->g->size;
    if (gs > (int)(sizeof members / sizeof members[0])) return;
    mesh_group_members(&w->m, mesh_group_dims(r->g->id), w->rank, members);
    const char *gname = mesh_group_name(r->g->id);
    const double my_dump = commi_now() + w->trace_wall_offset; /* just after this rank's own dump */
    double deadline = commi_now() + (w->timeout_s < 10 ? (w->timeout_s > 2 ? w->timeout_s : 2) : 10);
    size_t used = 0;
    int missing = 0;
    for (;;) {
        int all = 1;
        for (int i = 0; i < gs && all; i++) {
            char p[4096];
            struct stat st;
            trace_path(w, members[i], p, sizeof p);
            all = members[i] == w->rank || stat(p, &st) == 0;
        }
        if (all || commi_now() > deadline) break;
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < gs; i++) {
        if (members[i] == w->rank) continue;
        char p[4096], what[400] = "";
        trace_path(w, members[i], p, sizeof p);
        json_t *root = json_load_file(p, 0, NULL);
        json_t *rid = root ? json_object_get(root, "run_id") : NULL;
        if (!root || !json_is_number(rid) || json_number_value(rid) != w->run_id) {
            snprintf(what, sizeof what, "rank %d left no dump (stopped, dead, or busy outside any collective)",
                     members[i]);
        } else {
            json_t *iss = json_object_get(json_object_get(root, "issued"), gname);
            const uint64_t k = json_is_integer(iss) ? (uint64_t)json_integer_value(iss) : 0;
            json_t *tm = json_object_get(root, "time");
            const double late = json_is_number(tm) ? json_number_value(tm) - my_dump : 0.0;
            if (k >= r->seq && late > (w->timeout_s > 2 ? 0.5 * w->timeout_s : 1.0)) {
                /* it issued the operation but timed out seconds after the others: it was not
                 * running (stopped, or starved of CPU) while they waited for it */
                snprintf(what, sizeof what,
                         "rank %d issued it but dumped %.1f s after this rank (stopped or starved "
                         "inside the collective)",
                         members[i], late);
            } else if (k < r->seq) {
                json_t *wt = json_object_get(root, "waiting");
                if (json_is_object(wt))
                    snprintf(what, sizeof what, "rank %d issued only #%llu on %s (waits in %s #%lld on group %s)",
                             members[i], (unsigned long long)k, gname,
                             json_string_value(json_object_get(wt, "op")) ? json_string_value(json_object_get(wt, "op"))
                                                                          : "?",
                             (long long)json_integer_value(json_object_get(wt, "seq")),
                             json_string_value(json_object_get(wt, "group"))
                                 ? json_string_value(json_object_get(wt, "group"))
                                 : "?");
                else
                    snprintf(what, sizeof what, "rank %d issued only #%llu on %s", members[i], (unsigned long long)k,
                             gname);
            }
        }
        if (root) json_decref(root);
        if (*what && used + strlen(what) + 3 < n) {
            used += (size_t)snprintf(buf + used, n - used, "%s%s", missing ? "; " : "", what);
            missing++;
        }
    }
    if (!missing) snprintf(buf, n, "every rank of the group issued it (a backend stall)");
}
