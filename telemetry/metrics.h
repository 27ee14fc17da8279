/* metrics.h — the per-step metrics line, metrics.jsonl and TensorBoard events.
 *
 * Only the logging rank opens a logger (the engine decides which: rank 0, or
 * the first rank of the last pipeline stage). Each logged step
 *   - prints TorchTitan's line through log_info, with lr added:
 *       step:  1  loss: 12.2367  grad_norm:  3.1410  lr: 8.0000e-05  memory:  0.54GiB(0.87%)
 *       tps: 4,213  tflops: 0.11  mfu: 0.08%
 *     (one line; each field in its own ANSI colour unless colour is off);
 *   - appends one JSON object to <dump_folder>/metrics.jsonl (numbers in full
 *     precision, NaN/inf as null);
 *   - when TensorBoard is on, writes the scalars under TorchTitan's tags to
 *     <dump_folder>/<tb_folder>/events.out.tfevents.<time>.<host>.<pid>.<n>.
 * Files are flushed after every step. docs/metrics.md has the schema and tags. */
#ifndef TETRA_METRICS_H
#define TETRA_METRICS_H

#include <stddef.h>
#include <stdint.h>

typedef struct metrics_logger metrics_logger;

typedef struct {
    int64_t step;
    double loss;     /* global average loss */
    double max_loss; /* global max of per-rank losses (TorchTitan's global_max_loss); NAN if unknown */
    double grad_norm;
    double lr;
    double tps;         /* tokens/s per device */
    double tflops;      /* achieved TFLOP/s per device */
    double mfu;         /* percent */
    double mem_gib;     /* peak memory (GiB): GPU max allocated on GPU, peak RSS on CPU */
    double mem_pct;     /* of device / host memory */
    double step_time_s; /* end-to-end seconds per step (avg since last log) */
    double data_time_s; /* data loading seconds per step (avg since last log) */
    int64_t tokens_seen;
    /* the same two counting the attention the mask leaves (causal: half the score pairs;
     * block_causal: those within documents) instead of TorchTitan's T^2; NAN: not known */
    double tflops_computed;
    double mfu_computed; /* percent */
    /* host waits on the device per step since the last log (ops.h host_waits), leaving
     * out the reads and synchronisations that logging and checkpoints add */
    double host_waits;
} metrics_step;

/* Opens <dump_folder>/metrics.jsonl for appending (creating dump_folder if
 * needed) and, when enable_tensorboard, a new TensorBoard event file in
 * <dump_folder>/<tb_folder> (an absolute tb_folder is used as is).
 * `color`: ANSI colours in the step line. Existing records are kept as they are.
 * NULL on error, with a message naming the path in err. */
metrics_logger *metrics_open(const char *dump_folder, int enable_tensorboard, const char *tb_folder, int color,
                             char *err, size_t errlen);
/* The same for a run whose first step is `first_step` (1 for a fresh run,
 * checkpoint step + 1 on resume): records with step >= first_step are first
 * dropped from metrics.jsonl (they belong to an earlier attempt that went
 * past its last checkpoint), as is a torn last line, and the TensorBoard file
 * starts with a SessionLog START at first_step, so TensorBoard discards the
 * earlier files' events from that step on. first_step <= 0: like metrics_open. */
metrics_logger *metrics_open_at(const char *dump_folder, int enable_tensorboard, const char *tb_folder, int color,
                                int64_t first_step, char *err, size_t errlen);
/* Prints the step line, writes the jsonl record and the TensorBoard scalars, flushes. */
void metrics_log_step(metrics_logger *m, const metrics_step *s);
/* "validate step: N  loss: X  time: Ts" line, jsonl {"step":N,"validation_loss":X,...},
 * TensorBoard tag validation_metrics/loss. */
void metrics_log_validation(metrics_logger *m, int64_t step, double loss, double step_time_s);
/* A weighted mixture's realised shares so far (docs/data.md): the jsonl record
 * {"step":N,"data_mix":<mix_json>,"time":T} (mix_json: dl_mix_json's object) and the
 * TensorBoard scalars data_mix/share_<i> of sources 0..n-1, in the order given. */
void metrics_log_mix(metrics_logger *m, int64_t step, const char *mix_json, int n, const double *shares);
/* Path of metrics.jsonl / of the TensorBoard event file (NULL when TensorBoard is off). */
const char *metrics_jsonl_path(const metrics_logger *m);
const char *metrics_tb_path(const metrics_logger *m);
/* Flushes and closes; NULL is fine. */
void metrics_close(metrics_logger *m);

/* Peak resident set size of this process in bytes (getrusage), and total host
 * memory in bytes (sysconf); -1 when unknown. */
int64_t metrics_peak_rss_bytes(void);
int64_t metrics_host_memory_bytes(void);
/* Logs "peak resident memory: X GiB (Y% of host memory)" — for the end of a run. */
void metrics_log_peak_rss(void);

/* The dense bf16 peak FLOP/s of a GPU named as the CUDA runtime names it ("NVIDIA H100
 * 80GB HBM3"), the MFU denominator TorchTitan uses; 0 for a device not in the table.
 * Datasheet values: A100 312e12, H100 SXM 989e12, H100 PCIe 756e12, H100 NVL 835e12,
 * H200 (and GH200) 989e12, B200 2.25e15, L40S 362e12. */
double metrics_gpu_peak_bf16(const char *device_name);

/* Formats v rounded to `decimals` places with thousands separators, like
 * Python's f"{v:,.{decimals}f}" (nan/inf as "nan"/"inf"). Returns out. */
char *metrics_format_grouped(char *out, size_t outlen, double v, int decimals);

#endif
