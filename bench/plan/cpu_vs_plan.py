#!/usr/bin/env python3
"""tetra plan against tetra's own runs on this machine (--hardware cpu).

For each layout (1 rank, FSDP 2, TP 2, PP 2 ZB-H1, CP 2, each AC mode) on the debug
model and the `small` flavour, runs `tetra plan --json` and a real `tetra train` under
mpirun, and prints predicted vs measured memory (the backend bytes every rank
allocates at start-up; the largest rank) and step time (the median of the steps after
the first two: the host's noise moves single steps by 15-20 %), with the ratios, as a markdown table.

usage: bench/plan/cpu_vs_plan.py [--tetra build/bin/tetra] [--hardware cpu] [--steps 10] [--only REGEX]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

LAYOUTS = [
    ("1 rank", 1, []),
    ("FSDP 2", 2, []),
    ("TP 2", 2, ["--parallelism.tensor_parallel_degree", "2"]),
    ("PP 2 ZB-H1", 2, ["--parallelism.pipeline_parallel_degree", "2",
                       "--parallelism.pipeline_parallel_schedule", "InterleavedZeroBubble",
                       "--parallelism.pipeline_parallel_first_stage_less_layers", "0",
                       "--parallelism.pipeline_parallel_last_stage_less_layers", "0",
                       "--parallelism.pipeline_parallel_layers_per_stage", "LPS"]),
    ("CP 2", 2, ["--parallelism.context_parallel_degree", "2"]),
    ("1 rank, AC none", 1, ["--activation_checkpoint.mode", "none"]),
    ("1 rank, AC op", 1, ["--activation_checkpoint.mode", "selective",
                          "--activation_checkpoint.selective_ac_option", "op"]),
    ("1 rank, AC full", 1, ["--activation_checkpoint.mode", "full"]),
]
MODELS = [("debugmodel", 6, 512, 4), ("small", 8, 512, 4)]  # flavour, layers, seq_len, global batch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tetra", default="build/bin/tetra")
    ap.add_argument("--hardware", default="cpu")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", help="rows whose 'model | layout' matches this regular expression (rerun the noisy ones)")
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_WAIT_POLICY="PASSIVE")
    print("| model | layout | plan MiB | allocated MiB | ratio | plan step s | measured step s | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    worst_m = worst_t = 0.0
    for flavor, layers, seq, gbs in MODELS:
        for name, np_, over in LAYOUTS:
            if a.only and not re.search(a.only, "%s | %s" % (flavor, name)):
                continue
            over = [str(layers // 2) if x == "LPS" else x for x in over]
            base = ["--job.config_file", "configs/debug_model.toml", "--model.flavor", flavor,
                    "--training.seq_len", str(seq), "--training.global_batch_size", str(gbs),
                    "--training.local_batch_size", str(gbs // np_ if "--parallelism.tensor_parallel_degree" not in over
                                                       and "--parallelism.pipeline_parallel_degree" not in over
                                                       and "--parallelism.context_parallel_degree" not in over
                                                       else gbs),
                    "--training.device", "cpu", "--training.threads", "1", "--metrics.disable_color_printing"]
            if "--parallelism.context_parallel_degree" in over:
                base[base.index("--training.local_batch_size") + 1] = str(gbs)
            p = subprocess.run([a.tetra, "plan", "--hardware", a.hardware, "--ngpu", str(np_), "--json"] + base + over,
                               capture_output=True, text=True)
            if p.returncode > 1 or not p.stdout.startswith("{"):
                print("| %s | %s | plan failed: %s |" % (flavor, name, p.stderr.strip()[:200]))
                continue
            o = json.loads(p.stdout)
            with tempfile.TemporaryDirectory() as d:
                r = subprocess.run(["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", a.tetra,
                                    "train"] + base + over + ["--training.steps", str(a.steps), "--job.dump_folder", d,
                                                              "--metrics.log_freq", "1"],
                                   capture_output=True, text=True, env=env)
                got = [int(x) for x in re.findall(r"backend memory: .*?\((\d+) bytes\)", r.stdout)]
                times = []
                mf = os.path.join(d, "metrics.jsonl")
                if os.path.exists(mf):
                    for line in open(mf):
                        m = json.loads(line)
                        if m.get("step", 0) > 2 and "step_time_s" in m:
                            times.append(m["step_time_s"])
            if r.returncode or not got or not times:
                print("| %s | %s | train failed: %s |" % (flavor, name, (r.stderr or r.stdout).strip()[-200:]))
                continue
            mem_p, mem_m = o["memory"]["training_buffers_bytes"], max(got)
            t_p, t_m = o["step_time_s"], statistics.median(times)
            worst_m = max(worst_m, abs(mem_p / mem_m - 1))
            worst_t = max(worst_t, abs(t_p / t_m - 1))
            print("| %s | %s | %.2f | %.2f | %.3f | %.4f | %.4f | %.2f |" %
                  (flavor, name, mem_p / 2**20, mem_m / 2**20, mem_p / mem_m, t_p, t_m, t_p / t_m))
            sys.stdout.flush()
    print("\nlargest deviation: memory %.1f%%, step time %.0f%%" % (100 * worst_m, 100 * worst_t))


if __name__ == "__main__":
    sys.exit(main())
