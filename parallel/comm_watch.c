/* comm_watch.c — NCCL operations that comm_wait ordered the compute stream after.
 *
 * comm_wait on a running NCCL operation does not wait on the host: the compute stream
 * waits for the operation's event, and the request moves here. The thread that issues
 * operations finishes the ones that have completed at its next call into comm (trace,
 * observer, the event back to the pool). Because the host no longer waits, a stuck
 * collective would block the compute stream and, at the next host read, the process
 * for ever; so a watchdog thread (PyTorch's NCCL watchdog plays this role) polls the
 * deferred operations and ends the job with the usual message when one outlives its
 * deadline or its communicator reports an error. The watchdog only polls; everything
 * else happens on the issuing thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel/comm_internal.h"

/* How often the watchdog looks: a tenth of the deadline, between 10 ms and 1 s. */
static double watch_period(const comm_world *w) {
    double p = w->timeout_s / 10.0;
    return p < 0.01 ? 0.01 : p > 1.0 ? 1.0 : p;
}

static void *watchdog_main(void *arg) {
    comm_world *w = arg;
    pthread_mutex_lock(&w->watch_mutex);
    while (!w->watchdog_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + watch_period(w);
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        int rc = pthread_cond_timedwait(&w->watch_cond, &w->watch_mutex, &ts);
        if (w->watchdog_stop) break;
        if (rc != 0 && rc != ETIMEDOUT) continue;
        const double now = commi_now();
        for (int i = 0; i < w->n_pending; i++) {
            comm_request *r = &w->pending[i];
            /* the backend's poll also reports asynchronous communicator errors */
            if (commi_backend_test(r)) continue;
            if (now - r->t_start > r->deadline_s) commi_fail_timeout(r, now - r->t_start);
        }
    }
    pthread_mutex_unlock(&w->watch_mutex);
    return NULL;
}

static void start_watchdog(comm_world *w, const comm_request *r) {
    if (w->watchdog_running) return;
    if (pthread_create(&w->watchdog, NULL, watchdog_main, w) != 0) commi_fail(r, "cannot start the comm watchdog");
    w->watchdog_running = 1;
}

void commi_watch_defer(const comm_request *r) {
    comm_world *w = r->g->w;
    comm_request c = *r; /* the list owns this copy; the caller frees its handle */
    c.heap = 0;
    c.deadline_s = w->timeout_s;
    pthread_mutex_lock(&w->watch_mutex);
    if (w->n_pending == w->cap_pending) {
        int cap = w->cap_pending ? 2 * w->cap_pending : 16;
        comm_request *np = realloc(w->pending, (size_t)cap * sizeof *np);
        if (!np) {
            pthread_mutex_unlock(&w->watch_mutex);
            commi_fail(r, "out of host memory");
        }
        w->pending = np;
        w->cap_pending = cap;
    }
    w->pending[w->n_pending++] = c;
    pthread_mutex_unlock(&w->watch_mutex);
    start_watchdog(w, r);
}

void commi_watch_sweep(comm_world *w) {
    if (!w->n_pending) return; /* only this thread adds to the list */
    pthread_mutex_lock(&w->watch_mutex);
    int k = 0;
    for (int i = 0; i < w->n_pending; i++) {
        comm_request r = w->pending[i];
        if (commi_backend_test(&r)) commi_finish(&r);
        else w->pending[k++] = r;
    }
    w->n_pending = k;
    pthread_mutex_unlock(&w->watch_mutex);
}

void commi_watch_drain(comm_world *w) {
    while (w->n_pending) {
        commi_watch_sweep(w);
        if (!w->n_pending) break;
        const double now = commi_now();
        for (int i = 0; i < w->n_pending; i++)
            if (now - w->pending[i].t_start > w->pending[i].deadline_s)
                commi_fail_timeout(&w->pending[i], now - w->pending[i].t_start);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
}

void commi_watch_stop(comm_world *w) {
    if (!w->watchdog_running) return;
    pthread_mutex_lock(&w->watch_mutex);
    w->watchdog_stop = 1;
    pthread_cond_signal(&w->watch_cond);
    pthread_mutex_unlock(&w->watch_mutex);
    pthread_join(w->watchdog, NULL);
    w->watchdog_running = 0;
}
