#include "telemetry/memsnap.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "telemetry/metrics.h"
#include "util/file.h"

int memsnap_write(const char *folder, int rank, int64_t step, const char *reason, const memsnap_plan *p,
                  const tetra_ops *ops, char *err, size_t errlen) {
    char path[4300], tmp[4400];
    if (util_mkdir_p(folder)) {
        snprintf(err, errlen, "memory snapshot: cannot create %s: %s", folder, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof path, "%s/rank%d_memory_snapshot.json", folder, rank);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    json_t *root = json_object(), *cats = json_array();
    json_object_set_new(root, "format", json_string("tetra-memory-snapshot"));
    json_object_set_new(root, "version", json_integer(1));
    json_object_set_new(root, "rank", json_integer(rank));
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "reason", json_string(reason));
    json_object_set_new(root, "backend", json_string(ops ? ops->name : "none"));
    json_object_set_new(root, "bf16_compute", json_boolean(p->bf16_compute));
    double sum = 0;
    for (int i = 0; i < p->n; i++) {
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(p->cat[i].name));
        json_object_set_new(o, "bytes", json_integer((json_int_t)p->cat[i].bytes));
        json_object_set_new(o, "what", json_string(p->cat[i].what));
        json_array_append_new(cats, o);
        sum += (double)(json_int_t)p->cat[i].bytes;
    }
    json_object_set_new(root, "categories", cats);
    json_object_set_new(root, "planned_bytes", json_integer((json_int_t)sum));
    size_t dfree = 0, dtotal = 0;
    if (ops) ops->device_memory(&dfree, &dtotal);
    json_object_set_new(root, "allocated_bytes", json_integer(ops ? (json_int_t)ops->allocated_bytes() : 0));
    json_object_set_new(root, "allocations", json_integer(ops ? (json_int_t)ops->alloc_count() : 0));
    json_object_set_new(root, "peak_rss_bytes", json_integer(metrics_peak_rss_bytes()));
    json_object_set_new(root, "host_memory_bytes", json_integer(metrics_host_memory_bytes()));
    json_object_set_new(root, "device_free_bytes", json_integer((json_int_t)dfree));
    json_object_set_new(root, "device_total_bytes", json_integer((json_int_t)dtotal));
    int rc = json_dump_file(root, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0 || rename(tmp, path) != 0) {
        snprintf(err, errlen, "memory snapshot: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}
