#!/usr/bin/env python3
"""tetra plan against TorchTitan's published H100 table (benchmarks/llama3_h100_202412_torchtitan.md).

Runs `tetra plan --json` for every row with TorchTitan's batch, sequence length, AC
and float8 settings on the h100-96gb profile (and its pipeline microbatches: in 2024-12
TorchTitan split a local batch into as many microbatches as the pipeline degree when
pipeline_parallel_microbatches was unset, so lbs 32 at PP 8 ran 8 microbatches of 4) (the 96 GB HBM2e parts at 500 W those
runs used) and prints a markdown table of predicted vs published memory and
tokens/s/GPU with the ratios. TorchTitan's torch.compile variants are the reference
for tetra's fused kernels; its eager rows are listed for completeness.

TorchTitan's GiB is PyTorch's caching-allocator peak (memory/max_reserved), and NCCL
allocates outside that allocator, so the memory ratio sets it against the plan's peak
without its NCCL line (peak_memory_gib - memory.nccl_gib); NCCL's GiB and communicators
are their own column, and `fits` is the whole peak's. TorchTitan's loss widens the bf16
logits of the output projection to fp32 (`pred.float()`): an fp32 [tokens, vocabulary]
copy that tetra without tensor parallel does not make (its loss reads the bf16 logits and
writes the bf16 gradient over them), so on those rows that copy (local tokens x 128,256 x
4 bytes) is added to the plan's peak for the comparison and shown beside it. The last
line gives the largest memory deviation both ways.

After the table it plans Megatron-Bridge's published Llama 3 8B FP8 run (8 x H100 SXM,
FSDP 8, global batch 128, seq 8192, AC none: 14,451 tokens/s/GPU) on h100-sxm.

With --max-speed / --max-memory it exits 1 when a row cannot be planned or a ratio lies
further from 1 than that (the memory ratio without NCCL's line).

usage: bench/plan/torchtitan_h100.py [--tetra build/bin/tetra] [--hardware h100-96gb]
                                     [--max-speed 0.18] [--max-memory 0.15]
"""
import argparse
import json
import subprocess
import sys

C8, C70, C405 = "configs/llama3_8b.toml", "configs/llama3_70b.toml", "configs/llama3_405b.toml"
SAC = ["--activation_checkpoint.mode", "selective", "--activation_checkpoint.selective_ac_option", "op"]
FULL = ["--activation_checkpoint.mode", "full"]
F8 = ["--model.converters", "float8"]
ATP = ["--parallelism.enable_async_tensor_parallel", "true"]

VOCAB = 128256


def fp32_logits_gib(over):
    """TorchTitan's fp32 copy of one microbatch's logits where tetra makes none (no TP)"""
    def val(key, default):
        return int(over[over.index(key) + 1]) if key in over else default
    if val("--parallelism.tensor_parallel_degree", 1) > 1:
        return 0.0
    tokens = val("--training.local_batch_size", 1) * val("--training.seq_len", 8192)
    return tokens // val("--parallelism.context_parallel_degree", 1) * VOCAB * 4 / 2**30


# (row, layout, variant, config, ngpu, overrides, published tokens/s/GPU, published GiB)
ROWS = [
    ("1", "8B, 8 GPUs, FSDP 8, lbs 2, SAC", "bf16 (compile)", C8, 8,
     ["--training.local_batch_size", "2"] + SAC, 6667, 77.0),
    ("1", "", "float8 (compile + Float8)", C8, 8, ["--training.local_batch_size", "2"] + SAC + F8, 8532, 76.8),
]
for cp, seq, tps, gib in ((1, 32768, 3890, 83.9), (2, 65536, 2540, 84.2), (4, 131072, 1071, 84.0),
                          (8, 262144, 548, 84.5)):
    ROWS.append(("2", "8B, 8 GPUs, FSDP x CP, lbs 1, full AC, float8" if cp == 1 else "",
                 "FSDP %d CP %d, seq %dK" % (8 // cp, cp, seq // 1024), C8, 8,
                 ["--training.local_batch_size", "1", "--training.seq_len", str(seq),
                  "--parallelism.context_parallel_degree", str(cp)] + FULL + F8, tps, gib))
ROWS += [
    ("3", "8B, 128 GPUs, FSDP 128, lbs 2, SAC", "bf16 (compile)", C8, 128,
     ["--training.local_batch_size", "2"] + SAC, 6514, 62.0),
    ("3", "", "float8 (compile + Float8)", C8, 128, ["--training.local_batch_size", "2"] + SAC + F8, 8380, 61.8),
    ("4", "70B, 256 GPUs, FSDP 32 x TP 8, lbs 16, full AC, float8", "TP", C70, 256,
     ["--training.local_batch_size", "16", "--training.seq_len", "8192",
      "--parallelism.tensor_parallel_degree", "8"] + FULL + F8, 829, 71.9),
    ("4", "", "async TP", C70, 256,
     ["--training.local_batch_size", "16", "--training.seq_len", "8192",
      "--parallelism.tensor_parallel_degree", "8"] + FULL + F8 + ATP, 876, 67.6),
]
for sched, tps, gib in (("1F1B", 100, 82.5), ("Interleaved1F1B", 128, 72.7)):
    ROWS.append(("5", "405B, 512 GPUs, FSDP 8 x TP 8 x PP 8, lbs 32, full AC, float8, async TP"
                 if sched == "1F1B" else "", sched, C405, 512,
                 ["--training.local_batch_size", "32", "--training.seq_len", "8192",
                  "--parallelism.tensor_parallel_degree", "8", "--parallelism.pipeline_parallel_degree", "8",
                  "--parallelism.pipeline_parallel_schedule", sched,
                  "--parallelism.pipeline_parallel_microbatch_size", "4"] + FULL + F8 + ATP, tps, gib))
for cp, seq, tps, gib in ((1, 32768, 76, 75.3), (2, 65536, 47, 75.9), (4, 131072, 31, 77.1),
                          (8, 262144, 16, 84.9)):
    ROWS.append(("6", "405B, 512 GPUs, TP 8 x PP 8 (1F1B) x FSDP x CP, lbs 8, full AC, float8, async TP"
                 if cp == 1 else "", "FSDP %d CP %d, seq %dK" % (8 // cp, cp, seq // 1024), C405, 512,
                 ["--training.local_batch_size", "8", "--training.seq_len", str(seq),
                  "--parallelism.context_parallel_degree", str(cp),
                  "--parallelism.tensor_parallel_degree", "8", "--parallelism.pipeline_parallel_degree", "8",
                  "--parallelism.pipeline_parallel_schedule", "1F1B"] + FULL + F8 + ATP, tps, gib))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tetra", default="build/bin/tetra")
    ap.add_argument("--hardware", default="h100-96gb")
    ap.add_argument("--max-speed", type=float, default=None)
    ap.add_argument("--max-memory", type=float, default=None)
    ap.add_argument("--min-megatron", type=float, default=None,
                    help="fail when Megatron-Bridge's 8B FP8 config plans below this many tokens/s/GPU")
    a = ap.parse_args()
    failed = 0
    print("| # | layout | variant | TorchTitan tok/s/GPU | plan tok/s/GPU | ratio | TorchTitan GiB |"
          " plan GiB without NCCL (+ TorchTitan's fp32 logits) | ratio | NCCL GiB (communicators) | bubble | fits |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    worst_t = worst_m = worst_w = 0.0
    for row, layout, variant, cfg, ngpu, over, tps, gib in ROWS:
        cmd = [a.tetra, "plan", "--job.config_file", cfg, "--ngpu", str(ngpu), "--hardware", a.hardware,
               "--json"] + over
        p = subprocess.run(cmd, capture_output=True, text=True)
        if not p.stdout.strip().startswith("{"):
            print("| %s | %s | %s | %d | cannot run: %s | | %.1f | | | | | |" %
                  (row, layout, variant, tps, (p.stderr.strip() or p.stdout.strip())[:200], gib))
            failed = 1
            continue
        o = json.loads(p.stdout)
        nccl = o["memory"]["nccl_gib"]
        extra = fp32_logits_gib(over)
        plan_gib = o["peak_memory_gib"] - nccl  # like for like: TorchTitan's peak holds no NCCL buffers
        rt, rm = o["tokens_per_s_per_gpu"] / tps, (plan_gib + extra) / gib
        worst_t = max(worst_t, abs(rt - 1))
        worst_m = max(worst_m, abs(rm - 1))
        worst_w = max(worst_w, abs((o["peak_memory_gib"] + extra) / gib - 1))
        with_logits = "%.1f (+%.1f)" % (plan_gib, extra) if extra else "%.1f" % plan_gib
        print("| %s | %s | %s | %d | %.0f | %.2f | %.1f | %s | %.2f | %.2f (%d) | %.1f%% | %s |" %
              (row, layout, variant, tps, o["tokens_per_s_per_gpu"], rt, gib, with_logits, rm, nccl,
               o["memory"]["nccl"]["communicators"], 100 * o["bubble_fraction"], "yes" if o["fits"] else "no"))
    print("\nlargest deviation: tokens/s/GPU %.0f%%, memory %.0f%% without NCCL (%.0f%% with it)" %
          (100 * worst_t, 100 * worst_m, 100 * worst_w))
    mb = ["--training.local_batch_size", "1", "--training.global_batch_size", "128",
          "--activation_checkpoint.mode", "none"] + F8
    p = subprocess.run([a.tetra, "plan", "--job.config_file", C8, "--ngpu", "8", "--hardware", "h100-sxm", "--json"]
                       + mb, capture_output=True, text=True)
    if p.stdout.strip().startswith("{"):
        t = json.loads(p.stdout)["tokens_per_s_per_gpu"]
        print("Megatron-Bridge 8B FP8 (8 x H100 SXM, FSDP 8, global batch 128, seq 8192, AC none): published "
              "14451 tokens/s/GPU, plan %.0f on h100-sxm (ratio %.2f)" % (t, t / 14451))
        if a.min_megatron is not None and t < a.min_megatron:
            print("Megatron-Bridge 8B FP8 plans below %.0f tokens/s/GPU" % a.min_megatron)
            failed = 1
    else:
        print("Megatron-Bridge 8B FP8: cannot run: %s" % (p.stderr.strip() or p.stdout.strip())[:200])
        failed = 1
    if a.max_speed is not None and worst_t > a.max_speed:
        print("tokens/s/GPU off by more than %.0f%%" % (100 * a.max_speed))
        failed = 1
    if a.max_memory is not None and worst_m > a.max_memory:
        print("memory off by more than %.0f%%" % (100 * a.max_memory))
        failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
