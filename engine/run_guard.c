#define _DEFAULT_SOURCE /* flock, realpath */
#include "engine/run_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "telemetry/log.h"
#include "telemetry/tb_writer.h"
#include "util/host.h"

/* ---- standard streams ------------------------------------------------------ */

void run_guard_fix_std_fds(void) {
    /* a closed fd 1 would be handed to the next file opened (metrics.jsonl), and every
     * log line would go into it */
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
        int nfd = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (nfd >= 0 && nfd != fd) { /* cannot happen: open takes the lowest free fd */
            dup2(nfd, fd);
            close(nfd);
        }
    }
}

/* ---- stop signals ------------------------------------------------------------ */

static volatile sig_atomic_t stop_sig = 0, last_sig = 0, cur_step = 0;
static sem_t sig_sem;
static char abandon_msg[160];
static size_t abandon_len;
static pthread_mutex_t target_mu = PTHREAD_MUTEX_INITIALIZER;
static char stop_target[4200];
static int stop_target_set = 0;
/* Set (under target_mu) from the moment a rank samples its stop request for the end of a step
 * until the all-reduce has decided: a signal arriving then may stop the run after this step
 * (another rank saw it first) or after the next, so the reporter waits for the decision. */
static pthread_cond_t decided_cv = PTHREAD_COND_INITIALIZER;
static int deciding = 0;

const char *run_guard_signal_name(int sig) {
    if (sig > RUN_GUARD_FROM_LAUNCHER) sig -= RUN_GUARD_FROM_LAUNCHER;
    return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : sig == SIGUSR1 ? "SIGUSR1" : "a signal";
}

/* async-signal-safe: the step number into buf, returns its length */
static size_t fmt_uint(char *buf, long v) {
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0 && n < sizeof tmp);
    for (size_t i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    return n;
}

static void on_stop_signal(int sig) {
    if (sig == SIGINT && stop_sig) {
        /* Ctrl-C twice: the user gives up the save. Said here, with write(2) only: the
         * process may be deep in a collective or a write and is not coming back */
        char msg[256];
        size_t n = 0;
        memcpy(msg, abandon_msg, abandon_len);
        n += abandon_len;
        n += fmt_uint(msg + n, (long)cur_step);
        static const char tail[] = ") and exiting now (130); the newest complete checkpoint is unchanged\n";
        memcpy(msg + n, tail, sizeof tail - 1);
        n += sizeof tail - 1;
        ssize_t w = write(STDERR_FILENO, msg, n);
        (void)w;
        _exit(130);
    }
    if (!stop_sig) stop_sig = sig;
    last_sig = sig;
    sem_post(&sig_sem);
}

/* The launcher's stop request: run_train.sh writes the signal it received ("SIGTERM") into
 * $TETRA_STOP_FILE before passing the signal on, so a signal lost on the way (mpirun still
 * starting its job, a rank not yet running) still stops the run at the next step's end. */
static int stop_file_signal(void) {
    const char *path = getenv("TETRA_STOP_FILE");
    if (!path || !path[0]) return 0;
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char name[32] = "";
    if (!fgets(name, sizeof name, f)) name[0] = '\0';
    fclose(f);
    return !strncmp(name, "SIGINT", 6) ? SIGINT : !strncmp(name, "SIGUSR1", 7) ? SIGUSR1 : SIGTERM;
}

/* Says what a signal does the moment it arrives (the handler itself cannot format a log line). */
static void *signal_reporter(void *arg) {
    (void)arg;
    int seen = 0;
    for (;;) {
        if (sem_wait(&sig_sem) != 0) continue;
        const int sig = last_sig;
        const int asked = sig == SIGUSR1 ? stop_file_signal() : 0; /* passed on by run_train.sh */
        char what[64];
        if (asked && asked != SIGUSR1)
            snprintf(what, sizeof what, "%s (from the launcher, as SIGUSR1)", run_guard_signal_name(asked));
        else snprintf(what, sizeof what, "%s", run_guard_signal_name(sig));
        pthread_mutex_lock(&target_mu);
        /* the step the stop will save is known once the step's stop decision is (an all-reduce:
         * milliseconds); a collective that never ends is the watchdog's, not a reason to be silent */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 5;
        while (deciding)
            if (pthread_cond_timedwait(&decided_cv, &target_mu, &until) != 0) break;
        const long step = (long)cur_step;
        if (++seen > 1) log_warn("%s again: already stopping after step %ld (SIGINT abandons the save)", what, step);
        else if (step == 0) log_warn("%s received during start-up: the run stops before its first step", what);
        else if (stop_target_set)
            log_warn("%s received during step %ld: saving step %ld to %s when every rank has finished it, then "
                     "stopping (Ctrl-C abandons the save)",
                     what, step, step, stop_target);
        else
            log_warn("%s received during step %ld: stopping after it; checkpoint.enable is false, so nothing will be "
                     "saved",
                     what, step);
        pthread_mutex_unlock(&target_mu);
    }
    return NULL;
}

void run_guard_catch_signals(int rank) {
    snprintf(abandon_msg, sizeof abandon_msg, "[tetra|rank %d] SIGINT again: abandoning the save (step ", rank);
    abandon_len = strlen(abandon_msg);
    sem_init(&sig_sem, 0, 0);
    pthread_t th;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old); /* the reporter takes no signals itself */
    if (pthread_create(&th, NULL, signal_reporter, NULL) == 0) pthread_detach(th);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    /* main() held them from the first instruction: one that came meanwhile is taken now */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &stop, NULL);
}

int run_guard_stop_signal(void) { return (int)stop_sig; }

/* Test hook: ranks other than 0 come to each stop decision this many milliseconds late, so
 * that rank 0 spends most of a step inside the decision's all-reduce, where a signal it
 * receives can no longer be in its own request (tests/sh/test_preemption.sh). */
static void decision_delay(int rank) {
    static long ms = -1;
    if (ms < 0) {
        const char *s = getenv("TETRA_TEST_STOP_DECISION_DELAY_MS");
        ms = s && atol(s) > 0 ? atol(s) : 0;
    }
    if (rank == 0 || ms == 0) return;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int run_guard_stop_request(int rank) {
    decision_delay(rank);
    /* marked before the sample: a signal after the mark either is in the sample or waits for
     * the decision in the reporter; one before it is in the sample */
    pthread_mutex_lock(&target_mu);
    deciding = 1;
    pthread_mutex_unlock(&target_mu);
    /* the launcher's word outranks a rank's own signal in the all-reduce (max), so every rank
     * names the signal the user sent, not the SIGUSR1 that carried it */
    const int file = rank == 0 ? stop_file_signal() : 0;
    return file ? RUN_GUARD_FROM_LAUNCHER + file : (int)stop_sig;
}

void run_guard_stop_decided(int stop, int64_t next_step) {
    pthread_mutex_lock(&target_mu);
    if (!stop) cur_step = (sig_atomic_t)next_step;
    deciding = 0;
    pthread_cond_broadcast(&decided_cv);
    pthread_mutex_unlock(&target_mu);
}

void run_guard_set_step(int64_t step) { cur_step = (sig_atomic_t)step; }

void run_guard_set_stop_target(const char *ckpt_dir) {
    pthread_mutex_lock(&target_mu);
    stop_target_set = ckpt_dir != NULL;
    snprintf(stop_target, sizeof stop_target, "%s", ckpt_dir ? ckpt_dir : "");
    pthread_mutex_unlock(&target_mu);
}

/* ---- one live run per folder ---------------------------------------------------- */

#define LOCK_NAME ".tetra.lock"
static int lock_fd[2] = {-1, -1};
static char lock_path[2][4200];

/* "process 1234 on host h (started ...)" as the holder wrote it, or "" */
static void read_holder(int fd, char *out, size_t n) {
    ssize_t k = pread(fd, out, n - 1, 0);
    out[k > 0 ? k : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
}

static void write_holder(int fd) {
    char host[256] = "?", ts[32], line[400];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
    int n = snprintf(line, sizeof line, "process %ld on host %s (started %s)\n", (long)getpid(), host, ts);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n)
        log_warn("cannot write the lock file: %s", strerror(errno));
}

/* flock <dir>/.tetra.lock for the life of the process. key names the setting (message). */
static int lock_folder(int slot, const char *dir, const char *key) {
    snprintf(lock_path[slot], sizeof lock_path[slot], "%s/%s", dir, LOCK_NAME);
    const char *path = lock_path[slot];
    for (int attempt = 0; attempt < 20; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            log_error("%s '%s': cannot create the run's lock file %s: %s", key, dir, path, strerror(errno));
            return 1;
        }
        char holder[300];
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int e = errno;
            read_holder(fd, holder, sizeof holder);
            close(fd);
            if (e == EWOULDBLOCK)
                log_error("%s '%s' is in use by another run: %s holds %s. Two runs in one folder would overwrite each "
                          "other's checkpoints and metrics: wait for it to end, stop it (SIGTERM saves and stops it), "
                          "or choose another %s",
                          key, dir, holder[0] ? holder : "a process", path, key);
            else log_error("%s '%s': cannot lock %s: %s", key, dir, path, strerror(e));
            return 1;
        }
        /* the holder that just ended removed the file after we opened it: lock the new one */
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            continue;
        }
        read_holder(fd, holder, sizeof holder);
        if (holder[0])
            log_warn("%s '%s': taking over %s, left by %s, which no longer holds it (killed or crashed)", key, dir,
                     path, holder);
        write_holder(fd);
        lock_fd[slot] = fd;
        return 0;
    }
    log_error("%s '%s': cannot lock %s: it keeps being replaced", key, dir, path);
    return 1;
}

void run_guard_end(void) {
    for (int i = 0; i < 2; i++) {
        if (lock_fd[i] < 0) continue;
        unlink(lock_path[i]); /* while still held: a waiter that opened it re-checks the inode */
        close(lock_fd[i]);
        lock_fd[i] = -1;
    }
}

/* ---- writable output folders ------------------------------------------------------ */

/* Creates dir (create) or finds its nearest existing ancestor, then writes and removes a
 * file there. 0, or 1 after saying which setting names an unwritable folder. */
static int probe_folder(const char *key, const char *dir, int create) {
    char where[4200];
    snprintf(where, sizeof where, "%s", dir);
    if (create) {
        if (tb_make_dirs(where) != 0) {
            log_error("%s: cannot create the folder '%s': %s (every output folder is checked at start-up)", key, dir,
                      strerror(errno));
            return 1;
        }
    } else {
        struct stat st;
        while (stat(where, &st) != 0) { /* the folder is made when first needed: its parent must be writable */
            char *slash = strrchr(where, '/');
            if (!slash) {
                snprintf(where, sizeof where, ".");
                break;
            }
            if (slash == where) slash[1] = '\0';
            else *slash = '\0';
        }
    }
    char probe[4300];
    snprintf(probe, sizeof probe, "%s/.tetra-write-test-%ld", where, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    int e = fd < 0 ? errno : 0;
    if (fd >= 0) {
        if (write(fd, "t", 1) != 1) e = errno ? errno : EIO;
        if (close(fd) != 0 && !e) e = errno;
        unlink(probe);
    }
    if (e) {
        log_error("%s: cannot write in the folder '%s'%s%s: %s (every output folder is checked at start-up, so "
                  "that a save does not fail hours into the run)",
                  key, dir,
                  strcmp(where, dir) ? ", whose nearest "
                                       "existing parent is "
                                     : "",
                  strcmp(where, dir) ? where : "", strerror(e));
        return 1;
    }
    return 0;
}

static void join(char *out, size_t n, const char *dump, const char *f) {
    if (f[0] == '/') snprintf(out, n, "%s", f);
    else snprintf(out, n, "%s/%s", dump, f);
}

/* dir lies inside (or is) base: a lock on base covers it */
static int inside(const char *dir, const char *base) {
    char a[4200], b[4200];
    if (!realpath(dir, a) || !realpath(base, b)) return 0;
    size_t n = strlen(b);
    return !strncmp(a, b, n) && (a[n] == '/' || a[n] == '\0' || (n == 1 && b[0] == '/'));
}

static int probe_all(const tetra_config_values *c, int rank, const char *dump, const char *ckpt) {
    char dir[4200];
    int bad = 0;
    if (rank == 0) bad |= probe_folder("job.dump_folder", dump, 1);
    if (!bad && rank == 0 && c->metrics.enable_tensorboard) {
        join(dir, sizeof dir, dump,
             c->metrics.save_tb_folder && c->metrics.save_tb_folder[0] ? c->metrics.save_tb_folder : "tb");
        bad |= probe_folder("metrics.save_tb_folder", dir, 1);
    }
    if (!bad && c->checkpoint.enable && !c->checkpoint.load_only) bad |= probe_folder("checkpoint.folder", ckpt, 1);
    if (!bad && c->profiling.enable_profiling) {
        snprintf(dir, sizeof dir, "%s/%s", dump, c->profiling.save_traces_folder);
        bad |= probe_folder("profiling.save_traces_folder", dir, 1);
    }
    if (!bad && c->profiling.enable_memory_snapshot) {
        join(dir, sizeof dir, dump, c->profiling.save_memory_snapshot_folder);
        bad |= probe_folder("profiling.save_memory_snapshot_folder", dir, 1);
    }
    if (!bad && c->comm.trace_buf_size > 0) { /* dumped only on a failure: not created now */
        join(dir, sizeof dir, dump, c->comm.save_traces_folder);
        bad |= probe_folder("comm.save_traces_folder", dir, 0);
    }
    return bad;
}

int run_guard_start(const tetra_config_values *c, int rank) {
    const char *dump = c->job.dump_folder && c->job.dump_folder[0] ? c->job.dump_folder : ".";
    char ckpt[4200];
    join(ckpt, sizeof ckpt, dump,
         c->checkpoint.folder && c->checkpoint.folder[0] ? c->checkpoint.folder : "checkpoint");
    int bad = probe_all(c, rank, dump, ckpt);
    if (!bad && rank == 0) {
        bad = lock_folder(0, dump, "job.dump_folder");
        /* a checkpoint folder elsewhere may be shared by runs with different dump folders */
        if (!bad && c->checkpoint.enable && !c->checkpoint.load_only && !inside(ckpt, dump))
            bad = lock_folder(1, ckpt, "checkpoint.folder");
    }
    const int any = host_max_int(bad);
    if (any && !bad && rank == 0)
        log_error("another rank cannot write one of the run's output folders (see its log, LOG_RANK=all)");
    if (any) run_guard_end();
    return any;
}
