#include "telemetry/log.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int log_rank = 0, log_world = 1, log_color = -1;
static int console_fd = -1; /* a hidden rank's errors are copied here (log_console_init) */
static char *cap_buf;
static size_t cap_n;

void log_capture(char *buf, size_t n) {
    cap_buf = n ? buf : NULL;
    cap_n = n;
    if (cap_buf) cap_buf[0] = 0;
}

/* LOG_RANK as the launcher applied it: 1 when it shows at least one rank of a world of n
 * ("all", or a comma list with some rank below n). */
static int log_rank_shows_any(const char *list, int n) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!strcmp(tok, "all")) return 1;
        char *end;
        long r = strtol(tok, &end, 10);
        if (end != tok && !*end && r >= 0 && r < n) return 1;
    }
    return 0;
}

/* Under run_train.sh a rank that LOG_RANK does not show writes to LOG_DIR/rank_N.log, and
 * scripts/rank_exec.sh leaves the console open as TETRA_LOG_CONSOLE_FD. Its errors are
 * copied there, so no failure is silent; and when LOG_RANK shows no rank of this run at all
 * (LOG_RANK=5 of 2), rank 0 is shown whole instead, saying why. */
static void log_console_init(int rank, int world) {
    const char *fds = getenv("TETRA_LOG_CONSOLE_FD"), *shown = getenv("LOG_RANK");
    char *end;
    long fd = fds ? strtol(fds, &end, 10) : -1;
    if (!fds || end == fds || *end || fd < 3 || fcntl((int)fd, F_GETFD) < 0) return;
    unsetenv("TETRA_LOG_CONSOLE_FD"); /* the console is this process's, not its children's */
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    if (rank == 0 && shown && !log_rank_shows_any(shown, world)) {
        fflush(stdout);
        fflush(stderr);
        dup2((int)fd, STDOUT_FILENO);
        dup2((int)fd, STDERR_FILENO);
        close((int)fd);
        log_warn("LOG_RANK=%s names no rank of this %d-rank run (ranks 0 to %d): showing rank 0; every rank's "
                 "errors reach this console, and the others' full output is in their rank_N.log files",
                 shown, world, world - 1);
        return;
    }
    console_fd = (int)fd;
}

void log_init(int rank, int world) {
    log_rank = rank;
    log_world = world;
    log_console_init(rank, world);
}

void log_set_color(int enabled) { log_color = enabled; }

int log_color_wanted(int fd) {
    const char *no = getenv("NO_COLOR");
    if (no && no[0]) return 0;
    const char *tc = getenv("TETRA_COLOR");
    if (tc && (!strcmp(tc, "0") || !strcmp(tc, "1"))) return tc[0] == '1';
    return isatty(fd);
}

/* One log line to fd-backed stream f; colour as f's descriptor wants it. */
static void emit_line(FILE *f, const char *level, const char *color, const char *head, const char *msg) {
    int use_color = log_color < 0 ? log_color_wanted(fileno(f)) : log_color;
    if (use_color) fprintf(f, "%s%s - %s - %s\033[0m\n", color, head, level, msg);
    else fprintf(f, "%s - %s - %s\n", head, level, msg);
    fflush(f);
}

static void emit(FILE *f, const char *level, const char *color, const char *fmt, va_list ap) {
    if (cap_buf) {
        /* the first error or warning is the one that explains */
        if (f == stderr && !cap_buf[0]) vsnprintf(cap_buf, cap_n, fmt, ap);
        return;
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    localtime_r(&tv.tv_sec, &tm);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
    char prefix[48], head[96], small[2048];
    if (log_world > 1) snprintf(prefix, sizeof prefix, "[tetra|rank %d]", log_rank);
    else snprintf(prefix, sizeof prefix, "[tetra]");
    snprintf(head, sizeof head, "%s %s,%03d", prefix, ts, (int)(tv.tv_usec / 1000));
    va_list again;
    va_copy(again, ap);
    int len = vsnprintf(small, sizeof small, fmt, ap);
    char *msg = small;
    if (len >= (int)sizeof small && (msg = malloc((size_t)len + 1)) != NULL)
        vsnprintf(msg, (size_t)len + 1, fmt, again);
    va_end(again);
    if (!msg) msg = small; /* out of memory: the line cut short rather than lost */
    emit_line(f, level, color, head, msg);
    if (console_fd >= 0 && !strcmp(level, "ERROR")) { /* a hidden rank's error also reaches the console */
        int fd = dup(console_fd);
        FILE *con = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (con) {
            emit_line(con, level, color, head, msg);
            fclose(con);
        } else if (fd >= 0) {
            close(fd);
        }
    }
    if (msg != small) free(msg);
}

void log_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(stdout, "INFO", "\033[0m", fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(stderr, "WARNING", "\033[33m", fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    emit(stderr, "ERROR", "\033[31m", fmt, ap);
    va_end(ap);
}
