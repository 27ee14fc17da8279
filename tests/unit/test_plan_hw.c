/* Hardware profiles (plan/hw.h): every shipped profile loads with its
 * datasheet numbers; a written profile reads back to the same bits; bad files
 * (missing key, wrong type, value out of range, unknown key or table, syntax)
 * are refused with the file, line and key named; the search path
 * ($TETRA_HARDWARE_DIR first) and an unknown name's error listing the places
 * looked at and the profiles found; the GPU peak table MFU uses (metrics_gpu_peak_bf16)
 * agrees with the shipped profiles. Run from the repository root (ctest does).
 * plan_calibrate needs MPI and a quiet machine: tests/sh runs it. */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "telemetry/metrics.h"
#include "plan/hw.h"
#include "tests/check.h"

static char tmpdir[64];

#define GIB 1073741824.0

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

static int same_hw(const plan_hw *a, const plan_hw *b) {
    return !strcmp(a->name, b->name) && !strcmp(a->description, b->description) &&
        a->peak_bf16_flops == b->peak_bf16_flops && a->peak_fp8_flops == b->peak_fp8_flops &&
        a->peak_fp32_flops == b->peak_fp32_flops && a->memory_bytes == b->memory_bytes &&
        a->memory_bandwidth == b->memory_bandwidth && a->intra_node_bandwidth == b->intra_node_bandwidth &&
        a->inter_node_bandwidth == b->inter_node_bandwidth && a->gpus_per_node == b->gpus_per_node &&
        a->gemm_efficiency == b->gemm_efficiency && a->fp8_gemm_efficiency == b->fp8_gemm_efficiency &&
        a->attention_efficiency == b->attention_efficiency && a->comm_efficiency == b->comm_efficiency &&
        a->inter_node_comm_efficiency == b->inter_node_comm_efficiency &&
        a->memory_efficiency == b->memory_efficiency && a->reserved_bytes == b->reserved_bytes;
}

static void test_shipped(void) {
    char err[2048], list[512];
    plan_hw_list(list, sizeof list);
    CHECK(!strcmp(list, "b200, cpu, h100-96gb, h100-sxm, h200"), "shipped profiles: '%s'", list);

    /* every listed profile loads and is self-consistent */
    char names[512];
    snprintf(names, sizeof names, "%s", list);
    for (char *save = NULL, *nm = strtok_r(names, ", ", &save); nm; nm = strtok_r(NULL, ", ", &save)) {
        plan_hw h;
        int rc = plan_hw_load(nm, &h, err, sizeof err);
        CHECK(rc == 0, "%s: %s", nm, err);
        if (rc) continue;
        char want[256];
        snprintf(want, sizeof want, "configs/hardware/%s.toml", nm);
        CHECK(!strcmp(h.name, nm), "%s: name '%s' is not the file's", nm, h.name);
        CHECK(!strcmp(h.path, want), "%s: path %s", nm, h.path);
        CHECK(h.description[0] != 0, "%s: description", nm);
        CHECK(h.peak_bf16_flops > 0 && h.peak_fp32_flops > 0 && h.peak_fp8_flops >= 0, "%s: peaks", nm);
        CHECK(h.memory_bytes > h.reserved_bytes && h.memory_bandwidth > 0, "%s: memory", nm);
        CHECK(h.gemm_efficiency > 0 && h.gemm_efficiency <= 1 && h.attention_efficiency > 0 &&
                  h.attention_efficiency <= 1 && h.comm_efficiency > 0 && h.comm_efficiency <= 1 &&
                  h.memory_efficiency > 0 && h.memory_efficiency <= 1,
              "%s: efficiencies", nm);
    }

    plan_hw h;
    CHECK(plan_hw_load("h100-sxm", &h, err, sizeof err) == 0, "%s", err);
    CHECK(h.peak_bf16_flops == 989e12 && h.peak_fp8_flops == 1979e12 && h.peak_fp32_flops == 67e12,
          "h100-sxm peaks %g %g %g", h.peak_bf16_flops, h.peak_fp8_flops, h.peak_fp32_flops);
    CHECK(h.gpus_per_node == 8, "h100-sxm gpus_per_node %d", h.gpus_per_node);
    CHECK(h.memory_bytes == 79.65 * GIB && h.memory_bandwidth == 3.35e12, "h100-sxm memory %g %g", h.memory_bytes / GIB,
          h.memory_bandwidth);
    CHECK(h.intra_node_bandwidth == 450e9 && h.inter_node_bandwidth == 50e9, "h100-sxm links %g %g",
          h.intra_node_bandwidth, h.inter_node_bandwidth);
    /* the efficiencies are assumptions (docs/plan.md): fractions, the fp8 GEMM's below the bf16 one's */
    CHECK(h.gemm_efficiency > 0 && h.gemm_efficiency <= 1 && h.fp8_gemm_efficiency > 0 &&
              h.fp8_gemm_efficiency < h.gemm_efficiency && h.attention_efficiency > 0 &&
              h.attention_efficiency <= h.gemm_efficiency && h.comm_efficiency == 0.8 &&
              h.inter_node_comm_efficiency == 0.7 && h.memory_efficiency == 0.8,
          "h100-sxm efficiencies");
    CHECK(h.reserved_bytes == 2.5 * GIB, "h100-sxm reserved %g", h.reserved_bytes / GIB);

    plan_hw h96;
    CHECK(plan_hw_load("h100-96gb", &h96, err, sizeof err) == 0, "%s", err);
    CHECK(h96.memory_bytes > 89 * GIB && h96.memory_bytes < 96 * GIB && h96.memory_bandwidth == 2.4e12,
          "h100-96gb memory %g %g", h96.memory_bytes / GIB, h96.memory_bandwidth);
    CHECK(h96.peak_bf16_flops == h.peak_bf16_flops && h96.gpus_per_node == 8, "h100-96gb as h100-sxm otherwise");

    CHECK(plan_hw_load("h200", &h, err, sizeof err) == 0, "%s", err);
    CHECK(h.peak_bf16_flops == 989e12 && h.memory_bandwidth == 4.8e12 && h.memory_bytes > 139 * GIB &&
              h.memory_bytes < 141 * GIB && h.gpus_per_node == 8,
          "h200 %g %g %g", h.peak_bf16_flops, h.memory_bandwidth, h.memory_bytes / GIB);

    CHECK(plan_hw_load("b200", &h, err, sizeof err) == 0, "%s", err);
    CHECK(h.peak_bf16_flops == 2.25e15 && h.peak_fp8_flops == 4.5e15 && h.memory_bandwidth == 8e12 &&
              h.intra_node_bandwidth == 900e9 && h.gemm_efficiency > 0 && h.gemm_efficiency <= 1 &&
              h.memory_bytes > 178 * GIB && h.memory_bytes <= 180 * GIB,
          "b200 %g %g %g", h.peak_bf16_flops, h.peak_fp8_flops, h.memory_bytes / GIB);

    CHECK(plan_hw_load("cpu", &h, err, sizeof err) == 0, "%s", err);
    CHECK(h.peak_fp8_flops == 0 && h.peak_bf16_flops == h.peak_fp32_flops && h.gemm_efficiency > 0.5 &&
              h.gemm_efficiency <= 1.0 && h.gpus_per_node == 2,
          "cpu %g %g %g %d", h.peak_fp8_flops, h.peak_bf16_flops, h.gemm_efficiency, h.gpus_per_node);

    /* a path, relative or with ./, is read as given */
    CHECK(plan_hw_load("./configs/hardware/h200.toml", &h, err, sizeof err) == 0 && !strcmp(h.name, "h200") &&
              !strcmp(h.path, "./configs/hardware/h200.toml"),
          "by path: %s", err);
}

static void test_round_trip(void) {
    char err[2048], path[256];
    plan_hw a, b;
    CHECK(plan_hw_load("h100-sxm", &a, err, sizeof err) == 0, "%s", err);
    /* values with no short decimal form, and a description that needs escapes */
    snprintf(a.name, sizeof a.name, "rt");
    snprintf(a.description, sizeof a.description, "quote \" backslash \\ tab \t newline \n bell \a caf\xc3\xa9");
    a.peak_bf16_flops = 1.0 / 3.0 * 1e12;
    a.peak_fp8_flops = 0;
    a.peak_fp32_flops = 123456789012.34567;
    a.memory_bytes = 12345678901.0; /* not a whole number of GiB */
    a.memory_bandwidth = 0.1 + 0.2;
    a.intra_node_bandwidth = 5e-324 + 1e9;
    a.inter_node_bandwidth = 3.999999999e9;
    a.gpus_per_node = 3;
    a.gemm_efficiency = 1.0;
    a.fp8_gemm_efficiency = 0;
    a.attention_efficiency = 0.3333333333333333;
    a.comm_efficiency = 0.1;
    a.inter_node_comm_efficiency = 0.7000000000000001;
    a.memory_efficiency = 0.9;
    a.reserved_bytes = 17 * 1048576.0 + 1;
    snprintf(path, sizeof path, "%s/rt.toml", tmpdir);
    CHECK(plan_hw_write(&a, path, err, sizeof err) == 0, "write: %s", err);
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "%s left behind", tmp);
    memset(&b, 0xff, sizeof b);
    CHECK(plan_hw_load(path, &b, err, sizeof err) == 0, "read back: %s", err);
    CHECK(same_hw(&a, &b), "round trip differs: '%s' vs '%s', %.17g vs %.17g", a.description, b.description,
          a.memory_bytes, b.memory_bytes);
    CHECK(!strcmp(b.path, path), "path %s", b.path);

    /* a second write replaces the first */
    a.gpus_per_node = 4;
    CHECK(plan_hw_write(&a, path, err, sizeof err) == 0, "rewrite: %s", err);
    CHECK(plan_hw_load(path, &b, err, sizeof err) == 0 && b.gpus_per_node == 4, "rewrite read: %s", err);

    /* a profile that would not load is not written */
    plan_hw c = a;
    c.gemm_efficiency = 1.5;
    snprintf(path, sizeof path, "%s/bad_write.toml", tmpdir);
    CHECK(plan_hw_write(&c, path, err, sizeof err) == -1 && strstr(err, "gemm_efficiency") && strstr(err, "(0, 1]"),
          "refuses efficiency 1.5: %s", err);
    CHECK(access(path, F_OK) != 0, "bad profile written anyway");
    c = a;
    c.memory_bandwidth = NAN;
    CHECK(plan_hw_write(&c, path, err, sizeof err) == -1 && strstr(err, "memory_bandwidth"), "refuses nan: %s", err);
    c = a;
    c.name[0] = 0;
    CHECK(plan_hw_write(&c, path, err, sizeof err) == -1 && strstr(err, "name"), "refuses empty name: %s", err);
    CHECK(plan_hw_write(&a, "/nonexistent-dir/x.toml", err, sizeof err) == -1 && strstr(err, "/nonexistent-dir/x.toml"),
          "unwritable: %s", err);
}

/* A complete valid profile, one key per line (line i + 1 is base_lines[i]). */
static const char *base_lines[] = {
    "name = \"t\"",
    "description = \"test\"",
    "peak_bf16_flops = 1e12",
    "peak_fp8_flops = 2e12",
    "peak_fp32_flops = 1e11",
    "memory_gib = 16",
    "memory_bandwidth = 1e12",
    "intra_node_bandwidth = 1e11",
    "inter_node_bandwidth = 1e10",
    "gpus_per_node = 4",
    "gemm_efficiency = 0.7",
    "fp8_gemm_efficiency = 0.6",
    "attention_efficiency = 0.5",
    "comm_efficiency = 0.8",
    "inter_node_comm_efficiency = 0.7",
    "memory_efficiency = 0.8",
    "reserved_memory_gib = 1",
};
enum { NBASE = (int)(sizeof base_lines / sizeof base_lines[0]) };

/* Writes <tmpdir>/<file>: the base profile with the line of `key` replaced by
 * `line` (removed when line is NULL), then `extra` appended; returns the path. */
static const char *profile(const char *file, const char *key, const char *line, const char *extra) {
    static char path[256];
    char text[4096] = "";
    size_t used = 0, klen = key ? strlen(key) : 0;
    for (int i = 0; i < NBASE; i++) {
        const char *l = base_lines[i];
        if (key && !strncmp(l, key, klen) && l[klen] == ' ') {
            if (!line) continue;
            l = line;
        }
        used += (size_t)snprintf(text + used, sizeof text - used, "%s\n", l);
    }
    if (extra) snprintf(text + used, sizeof text - used, "%s\n", extra);
    snprintf(path, sizeof path, "%s/%s", tmpdir, file);
    write_text(path, text);
    return path;
}

/* err names the file (with ":line:" when line > 0) and has every other fragment. */
static int names(const char *err, const char *path, int line, const char *a, const char *b) {
    char where[300];
    if (line > 0) snprintf(where, sizeof where, "%s:%d:", path, line);
    else snprintf(where, sizeof where, "%s", path);
    return strstr(err, where) && (!a || strstr(err, a)) && (!b || strstr(err, b));
}

static void test_errors(void) {
    char err[2048];
    plan_hw h;
    const char *p;

    p = profile("ok.toml", NULL, NULL, NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == 0, "base profile: %s", err);
    CHECK(h.memory_bytes == 16 * GIB && h.reserved_bytes == GIB && h.gpus_per_node == 4,
          "integers where floats go: %g %g", h.memory_bytes, h.reserved_bytes);

    p = profile("missing.toml", "gpus_per_node", NULL, NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 0, "missing key", "gpus_per_node"),
          "missing key: %s", err);
    p = profile("missing2.toml", "memory_gib", NULL, "#");
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 0, "memory_gib", NULL), "missing: %s", err);

    p = profile("string.toml", "memory_bandwidth", "memory_bandwidth = \"3.35e12\"", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 &&
              names(err, p, 7, "memory_bandwidth", "must be a number, not a string"),
          "string for a number: %s", err);
    p = profile("bool.toml", "gemm_efficiency", "gemm_efficiency = true", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 11, "gemm_efficiency", "not a bool"),
          "bool for a number: %s", err);
    p = profile("namenum.toml", "name", "name = 5", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 1, "name must be a string", NULL),
          "number for a string: %s", err);
    p = profile("float_int.toml", "gpus_per_node", "gpus_per_node = 8.0", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 10, "gpus_per_node", "integer"),
          "float for an integer: %s", err);

    p = profile("negative.toml", "peak_bf16_flops", "peak_bf16_flops = -989e12", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 3, "peak_bf16_flops", "> 0"), "negative: %s",
          err);
    p = profile("negres.toml", "reserved_memory_gib", "reserved_memory_gib = -1", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 17, "reserved_memory_gib", ">= 0"),
          "negative reserve: %s", err);
    p = profile("nan.toml", "memory_gib", "memory_gib = nan", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 6, "memory_gib", "finite"), "nan: %s", err);
    p = profile("inf.toml", "intra_node_bandwidth", "intra_node_bandwidth = inf", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 8, "intra_node_bandwidth", "finite"), "inf: %s",
          err);
    p = profile("zero.toml", "memory_bandwidth", "memory_bandwidth = 0", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 7, "memory_bandwidth", "> 0"), "zero: %s", err);
    p = profile("fp8zero.toml", "peak_fp8_flops", "peak_fp8_flops = 0", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == 0 && h.peak_fp8_flops == 0, "fp8 0 means none: %s", err);
    p = profile("eff.toml", "comm_efficiency", "comm_efficiency = 80", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 14, "comm_efficiency", "(0, 1]"),
          "percent for a fraction: %s", err);
    p = profile("gpn.toml", "gpus_per_node", "gpus_per_node = 0", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 10, "gpus_per_node", NULL), "0 gpus: %s", err);
    p = profile("reserve.toml", "reserved_memory_gib", "reserved_memory_gib = 16", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 17, "reserved_memory_gib", "memory_gib"),
          "reserve >= memory: %s", err);
    p = profile("longname.toml", "name",
                "name = \"0123456789012345678901234567890123456789012345678901234567890123456789\"", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 1, "name", "63 bytes"), "long name: %s", err);

    p = profile("typo.toml", NULL, NULL, "gemm_effciency = 0.7");
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 &&
              names(err, p, NBASE + 1, "unknown key 'gemm_effciency'", "did you mean gemm_efficiency?"),
          "typo: %s", err);
    p = profile("unknown.toml", NULL, NULL, "tdp_watts = 700");
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, NBASE + 1, "unknown key 'tdp_watts'", NULL),
          "unknown key: %s", err);
    p = profile("table.toml", NULL, NULL, "[nvlink]\nversion = 4");
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, NBASE + 1, "[nvlink]", NULL), "table: %s", err);
    p = profile("dotted.toml", NULL, NULL, "memory.gib = 80");
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, NBASE + 1, "memory", NULL), "dotted: %s", err);

    p = profile("syntax.toml", "memory_gib", "memory_gib = 80 GiB", NULL);
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && names(err, p, 6, NULL, NULL), "syntax: %s", err);
    p = profile("dup.toml", NULL, NULL, "memory_gib = 32");
    CHECK(plan_hw_load(p, &h, err, sizeof err) == -1 && strstr(err, p), "duplicate key: %s", err);

    char absent[256];
    snprintf(absent, sizeof absent, "%s/absent.toml", tmpdir);
    CHECK(plan_hw_load(absent, &h, err, sizeof err) == -1 && strstr(err, absent) && strstr(err, "cannot open"),
          "absent path: %s", err);
    CHECK(plan_hw_load("", &h, err, sizeof err) == -1, "empty name");
}

static void test_search(void) {
    char err[4096], list[512];
    plan_hw h;
    CHECK(plan_hw_load("h100-nope", &h, err, sizeof err) == -1 && strstr(err, "'h100-nope'") &&
              strstr(err, "configs/hardware") && strstr(err, "h100-sxm") && strstr(err, "b200") && strstr(err, "cpu"),
          "unknown name: %s", err);

    /* $TETRA_HARDWARE_DIR comes first: its profile hides the shipped one of the same name */
    char dir[128], path[256];
    snprintf(dir, sizeof dir, "%s/hw", tmpdir);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/h100-sxm.toml", dir);
    CHECK(plan_hw_load("configs/hardware/h100-sxm.toml", &h, err, sizeof err) == 0, "%s", err);
    h.gpus_per_node = 4;
    CHECK(plan_hw_write(&h, path, err, sizeof err) == 0, "%s", err);
    setenv("TETRA_HARDWARE_DIR", dir, 1);
    CHECK(plan_hw_load("h100-sxm", &h, err, sizeof err) == 0 && h.gpus_per_node == 4 && !strcmp(h.path, path),
          "env dir first: %s (%s)", err, h.path);
    CHECK(plan_hw_load("h200", &h, err, sizeof err) == 0 && !strcmp(h.path, "configs/hardware/h200.toml"),
          "falls through to configs/hardware: %s", err);
    plan_hw_list(list, sizeof list);
    CHECK(!strcmp(list, "h100-sxm"), "list of the env dir: '%s'", list);
    CHECK(plan_hw_load("nope", &h, err, sizeof err) == -1 && strstr(err, "$TETRA_HARDWARE_DIR=") && strstr(err, dir) &&
              strstr(err, "h200"),
          "unknown name with env: %s", err);

    /* a directory that does not exist is reported and skipped */
    setenv("TETRA_HARDWARE_DIR", "/nonexistent-tetra-hw", 1);
    plan_hw_list(list, sizeof list);
    CHECK(!strcmp(list, "b200, cpu, h100-96gb, h100-sxm, h200"), "list skips a missing dir: '%s'", list);
    CHECK(plan_hw_load("nope", &h, err, sizeof err) == -1 && strstr(err, "/nonexistent-tetra-hw: no such directory"),
          "missing env dir: %s", err);
    unsetenv("TETRA_HARDWARE_DIR");
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) remove_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* MFU's denominator on a GPU: the CUDA runtime's device names map to the datasheet's dense
 * bf16 peak, the specific H100 variants before the generic one, and agree with the profiles
 * `tetra plan` uses for the same parts. */
static void test_gpu_peaks(void) {
    static const struct {
        const char *name;
        double want;
    } cases[] = {
        {"NVIDIA H100 80GB HBM3", 989e12}, {"NVIDIA H100 NVL", 835e12},
        {"NVIDIA H100 PCIe", 756e12},      {"NVIDIA H200", 989e12},
        {"NVIDIA GH200 480GB", 989e12},    {"NVIDIA A100-SXM4-80GB", 312e12},
        {"NVIDIA B200", 2.25e15},          {"NVIDIA L40S", 362e12},
        {"NVIDIA GeForce RTX 4090", 0.0},  {"", 0.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK(metrics_gpu_peak_bf16(cases[i].name) == cases[i].want, "%s: %g, want %g", cases[i].name,
              metrics_gpu_peak_bf16(cases[i].name), cases[i].want);
    CHECK(metrics_gpu_peak_bf16(NULL) == 0.0, "NULL name");
    static const struct {
        const char *profile, *device;
    } same[] = {{"h100-sxm", "NVIDIA H100 80GB HBM3"}, {"h200", "NVIDIA H200"}, {"b200", "NVIDIA B200"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        plan_hw hw;
        char err[1024];
        int rc = plan_hw_load(same[i].profile, &hw, err, sizeof err);
        CHECK(rc == 0, "%s: %s", same[i].profile, err);
        if (rc == 0)
            CHECK(hw.peak_bf16_flops == metrics_gpu_peak_bf16(same[i].device), "%s: profile %g, MFU table %g",
                  same[i].profile, hw.peak_bf16_flops, metrics_gpu_peak_bf16(same[i].device));
    }
}

int main(void) {
    unsetenv("TETRA_HARDWARE_DIR");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tetra_plan_hw_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_shipped();
    test_round_trip();
    test_errors();
    test_search();
    test_gpu_peaks();
    remove_tree(tmpdir);
    printf("test_plan_hw: %d checks, %d failures\n", checks, failures);
    return failures ? 1 : 0;
}
