"""TensorBoard event files and metrics.jsonl written by tetra's C metrics
logger (libtetra.so through ctypes), read back by the `tensorboard` package:
its CRC-checking TFRecord reader, the EventAccumulator (every tag, every step,
float32 values), and TensorBoard's restart handling when a run resumes.
metrics.jsonl is parsed with json and must hold the exact doubles."""
import ctypes
import glob
import io
import json
import math
import os
import re
import struct
import sys
import tempfile

from tensorboard.backend.event_processing import event_accumulator, plugin_event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.compat.tensorflow_stub import errors as tb_errors
from tensorboard.util import tensor_util

BUILD = os.environ.get("TETRA_BUILD", os.path.join(os.getcwd(), "build"))
LIB = os.path.join(BUILD, "lib", "libtetra.so")

failures = 0
checks = 0


def check(cond, msg):
    global failures, checks
    checks += 1
    if not cond:
        failures += 1
        print("FAIL", msg)


class MetricsStep(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("loss", ctypes.c_double),
        ("max_loss", ctypes.c_double),
        ("grad_norm", ctypes.c_double),
        ("lr", ctypes.c_double),
        ("tps", ctypes.c_double),
        ("tflops", ctypes.c_double),
        ("mfu", ctypes.c_double),
        ("mem_gib", ctypes.c_double),
        ("mem_pct", ctypes.c_double),
        ("step_time_s", ctypes.c_double),
        ("data_time_s", ctypes.c_double),
        ("tokens_seen", ctypes.c_int64),
        ("tflops_computed", ctypes.c_double),
        ("mfu_computed", ctypes.c_double),
        ("host_waits", ctypes.c_double),
    ]


lib = ctypes.CDLL(LIB)
lib.metrics_open_at.restype = ctypes.c_void_p
lib.metrics_open_at.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int,
                                ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
lib.metrics_log_step.argtypes = [ctypes.c_void_p, ctypes.POINTER(MetricsStep)]
lib.metrics_log_validation.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_double, ctypes.c_double]
lib.metrics_tb_path.restype = ctypes.c_char_p
lib.metrics_tb_path.argtypes = [ctypes.c_void_p]
lib.metrics_close.argtypes = [ctypes.c_void_p]

# TorchTitan's tags, and the field (or function of the step record) each comes from
TAGS = {
    "loss_metrics/global_avg_loss": lambda s: s["loss"],
    "loss_metrics/global_max_loss": lambda s: s["max_loss"],
    "grad_norm": lambda s: s["grad_norm"],
    "lr": lambda s: s["lr"],
    "throughput(tps)": lambda s: s["tps"],
    "tflops": lambda s: s["tflops"],
    "mfu(%)": lambda s: s["mfu"],
    "tflops_computed": lambda s: s["tflops_computed"],  # tetra's: the attention the mask leaves
    "mfu_computed(%)": lambda s: s["mfu_computed"],
    "time_metrics/end_to_end(s)": lambda s: s["step_time_s"],
    "time_metrics/data_loading(s)": lambda s: s["data_time_s"],
    "time_metrics/data_loading(%)": lambda s: 100.0 * s["data_time_s"] / s["step_time_s"],
    "memory/max_active(GiB)": lambda s: s["mem_gib"],
    "memory/max_active(%)": lambda s: s["mem_pct"],
    "n_tokens_seen": lambda s: s["tokens_seen"],
}
VAL_TAG = "validation_metrics/loss"


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def make_step(step, seed):
    loss = 11.0 * math.exp(-0.1 * step) + seed / 7.0 + 1.0 / 3.0  # many significant digits
    return {
        "step": step, "loss": loss, "max_loss": loss + 0.125 + 1e-9 * step, "grad_norm": 2.0 / (step + 0.3),
        "lr": 8e-4 * min(1.0, step / 3.0), "tps": 1234.5678 * step + seed, "tflops": 0.0123 * step,
        "mfu": 0.5 + step / 100.0, "mem_gib": 0.75 + step / 1024.0, "mem_pct": 1.25 + step / 10.0,
        "step_time_s": 0.2 + step / 1000.0, "data_time_s": 0.01 + step / 1e5, "tokens_seen": 8192 * step,
        "tflops_computed": 0.0061 * step, "mfu_computed": 0.25 + step / 200.0,
    }


def open_logger(dump, first_step, color=0):
    err = ctypes.create_string_buffer(1024)
    m = lib.metrics_open_at(dump.encode(), 1, b"tb", color, first_step, err, len(err))
    if not m:
        raise RuntimeError("metrics_open_at: " + err.value.decode())
    return m


def log_steps(m, steps):
    for s in steps:
        lib.metrics_log_step(m, ctypes.byref(MetricsStep(**s)))


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def check_raw_records(path):
    """The tensorboard package's own TFRecord reader, which verifies both CRCs."""
    reader = pywrap_tensorflow.PyRecordReader_New(path)
    events = []
    while True:
        try:
            reader.GetNext()
        except tb_errors.OutOfRangeError:
            break
        except tb_errors.DataLossError as e:
            check(False, "CRC/framing error in %s: %s" % (path, e))
            break
        ev = event_pb2.Event()
        ev.ParseFromString(reader.record())
        events.append(ev)
    check(len(events) > 0 and events[0].file_version == "brain.Event:2",
          "first record is file_version brain.Event:2")
    return events


def check_accumulator(tbdir, expected_steps, expected_val):
    acc = event_accumulator.EventAccumulator(tbdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    want = set(TAGS) | ({VAL_TAG} if expected_val else set())
    check(tags == want, "scalar tags: missing %s, extra %s" % (sorted(want - tags), sorted(tags - want)))
    for tag, fn in TAGS.items():
        if tag not in tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        exp = [(s["step"], f32(fn(s))) for s in expected_steps]
        check(got == exp, "%s: got %s, expected %s" % (tag, got, exp))
    if expected_val:
        got = [(e.step, e.value) for e in acc.Scalars(VAL_TAG)]
        exp = [(st, f32(v)) for st, v in expected_val]
        check(got == exp, "%s: got %s, expected %s" % (VAL_TAG, got, exp))
    # the plugin accumulator (what the TensorBoard server uses) converts the
    # simple_value scalars into scalar tensors
    pacc = plugin_event_accumulator.EventAccumulator(tbdir, size_guidance={plugin_event_accumulator.TENSORS: 0})
    pacc.Reload()
    got = [(t.step, float(tensor_util.make_ndarray(t.tensor_proto)))
           for t in pacc.Tensors("loss_metrics/global_avg_loss")]
    exp = [(s["step"], f32(s["loss"])) for s in expected_steps]
    check(got == exp, "plugin accumulator loss: %s vs %s" % (got, exp))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "run")
        tbdir = os.path.join(dump, "tb")

        # ---- a fresh run: steps 1..10, validation at 5 and 10 -----------------
        run1 = [make_step(s, 0) for s in range(1, 11)]
        m = open_logger(dump, 1)
        tbfile = lib.metrics_tb_path(m).decode()
        check(re.fullmatch(re.escape(tbdir) + r"/events\.out\.tfevents\.\d{10}\.[^/]+\.%d\.\d+" % os.getpid(),
                           tbfile) is not None, "event file name %s" % tbfile)
        log_steps(m, run1[:5])
        lib.metrics_log_validation(m, 5, 2.0 / 3.0 + 5, 0.25)
        log_steps(m, run1[5:])
        lib.metrics_log_validation(m, 10, 2.0 / 3.0 + 10, 0.5)
        lib.metrics_close(m)

        events = check_raw_records(tbfile)
        check(len(events) == 1 + 1 + 10 + 2, "records: %d" % len(events))  # version, START, 10 steps, 2 validations
        check(any(e.HasField("session_log") and e.session_log.status == event_pb2.SessionLog.START and e.step == 1
                  for e in events), "SessionLog START at step 1")
        check_accumulator(tbdir, run1, [(5, 2.0 / 3.0 + 5), (10, 2.0 / 3.0 + 10)])

        recs = read_jsonl(os.path.join(dump, "metrics.jsonl"))
        check(len(recs) == 12, "jsonl records %d" % len(recs))
        steps = [r for r in recs if "loss" in r]
        for r, s in zip(steps, run1):
            for k, v in s.items():
                check(r.get(k) == v, "jsonl step %d %s: %r != %r (full precision)" % (s["step"], k, r.get(k), v))
            check(isinstance(r["time"], float) and r["time"] > 1e9, "jsonl wall time")
        vals = [(r["step"], r["validation_loss"]) for r in recs if "validation_loss" in r]
        check(vals == [(5, 2.0 / 3.0 + 5), (10, 2.0 / 3.0 + 10)], "jsonl validation %s" % vals)

        # ---- resume from a checkpoint at step 6: steps 7..9 are run again -------
        run2 = [make_step(s, 1) for s in range(7, 10)]
        m = open_logger(dump, 7)
        tbfile2 = lib.metrics_tb_path(m).decode()
        check(tbfile2 != tbfile and sorted([tbfile, tbfile2])[1] == tbfile2, "second event file sorts last")
        log_steps(m, run2)
        lib.metrics_close(m)
        check_raw_records(tbfile2)
        # TensorBoard drops the first attempt's steps >= 7 (incl. validation at 10)
        check_accumulator(tbdir, run1[:6] + run2, [(5, 2.0 / 3.0 + 5)])
        recs = read_jsonl(os.path.join(dump, "metrics.jsonl"))
        got = [(r["step"], r.get("loss", r.get("validation_loss"))) for r in recs]
        exp = [(s["step"], s["loss"]) for s in run1[:5]] + [(5, 2.0 / 3.0 + 5), (6, run1[5]["loss"])] + \
              [(s["step"], s["loss"]) for s in run2]
        check(got == exp, "jsonl after resume: %s" % got)

        # ---- NaN handling: loss NaN -> JSON null, TensorBoard NaN; unknown max_loss skipped
        dump3 = os.path.join(tmp, "nan")
        m = open_logger(dump3, 1)
        s = make_step(1, 0)
        s["loss"] = float("nan")
        s["max_loss"] = float("nan")
        log_steps(m, [s])
        s2 = make_step(2, 0)
        s2["max_loss"] = float("nan")
        log_steps(m, [s2])
        lib.metrics_close(m)
        recs = read_jsonl(os.path.join(dump3, "metrics.jsonl"))
        check(recs[0]["loss"] is None and recs[0]["max_loss"] is None, "NaN as null: %s" % recs[0])
        acc = event_accumulator.EventAccumulator(os.path.join(dump3, "tb"))
        acc.Reload()
        loss = acc.Scalars("loss_metrics/global_avg_loss")
        check(len(loss) == 2 and math.isnan(loss[0].value), "NaN loss reaches TensorBoard")
        check([e.step for e in acc.Scalars("loss_metrics/global_max_loss")] == [1],
              "unknown max_loss (NaN with a finite loss) is not logged")

        # ---- the printed line (fd 1 redirected to a file) ----------------------
        dump4 = os.path.join(tmp, "line")
        out = os.path.join(tmp, "stdout.txt")
        sys.stdout.flush()
        saved = os.dup(1)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        try:
            for color in (0, 1):
                m = open_logger(dump4, 1, color)
                s = make_step(3, 0)
                s.update(loss=10.123456, grad_norm=1.5, lr=3e-4, mem_gib=1.5, mem_pct=2.25, tps=1234567.4,
                         tflops=1234.5678, mfu=45.678, mfu_computed=22.504)
                log_steps(m, [s])
                lib.metrics_log_validation(m, 3, 9.87654, 1.25)
                lib.metrics_close(m)
        finally:
            os.dup2(saved, 1)
            os.close(fd)
            os.close(saved)
        text = open(out).read()
        sys.stdout.write(text)
        plain = ("step:  3  loss: 10.1235  grad_norm:  1.5000  lr: 3.0000e-04  memory:  1.50GiB(2.25%)  "
                 "tps: 1,234,567  tflops: 1,234.57  mfu: 45.68%  mfu(computed): 22.50%")
        line_re = r"\[tetra(\|rank \d+)?\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - INFO - "
        check(re.search(line_re + re.escape(plain) + "$", text, re.M) is not None, "plain step line")
        check(re.search(line_re + re.escape("validate step:  3  loss:  9.8765  time: 1.25s") + "$", text, re.M)
              is not None, "validation line")
        colored = [l for l in text.splitlines() if "\033[31mstep:" in l]
        check(len(colored) == 1 and re.sub(r"\033\[[0-9;]*m", "", colored[0]).endswith(plain),
              "coloured line equals the plain one without escapes: %r" % colored)

    print("test_tensorboard: %d checks, %d failures" % (checks, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
