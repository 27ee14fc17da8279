#!/usr/bin/env python3
"""The convergence table of bench/convergence/run.sh: per run, the final validation loss and
its relative difference to the ground truth (fsdp2), the largest relative difference of the
training-loss curve over all steps, throughput, and the gate (fp32: 0.5 %, bf16/float8: 2 %).
Prints markdown; exits 1 when a run is missing, incomplete or outside its gate.

usage: summarize.py OUT STEPS     (OUT/runs.txt lists the runs run.sh made)
"""
import json
import statistics
import sys

GATES = {"fp32": 0.005, "low": 0.02}


def load(path):
    train, val = {}, {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                r = json.loads(line)
                if "validation_loss" in r:
                    val[r["step"]] = r["validation_loss"]
                elif "loss" in r:
                    train[r["step"]] = r  # a repeated step (resume) keeps the last record
    except OSError:
        pass
    return train, val


def main():
    out, steps = sys.argv[1], int(sys.argv[2])
    runs = []
    with open(f"{out}/runs.txt") as f:
        for line in f:
            name, np_, gate, secs, rc, extra = line.rstrip("\n").split("|", 5)
            runs.append(dict(name=name, np=int(np_), gate=gate, secs=int(secs), rc=int(rc), extra=extra))
    if not runs or runs[0]["name"] != "fsdp2":
        print("summarize: the ground truth run fsdp2 is missing")
        return 1
    data = {r["name"]: load(f"{out}/{r['name']}/metrics.jsonl") for r in runs}
    gt_train, gt_val = data["fsdp2"]
    if steps not in gt_val or len(gt_train) != steps:
        print(f"summarize: the ground truth run fsdp2 did not finish {steps} steps with a final validation")
        return 1
    ok = True
    print(f"Llama 3 small (27.3M parameters), State of the Union, {steps} steps x 2,048 tokens "
          f"({steps * 2048:,} tokens); validation on the 61,798 held-out tokens.\n")
    print("| run | ranks | val loss, step 1 | val loss, final | vs fsdp2 | train loss, max diff over steps | gate | "
          "tokens/s | time (s) | |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        train, val = data[r["name"]]
        gate = GATES[r["gate"]]
        if r["rc"] != 0 or steps not in val or len(train) != steps:
            ok = False
            print(f"| {r['name']} | {r['np']} | | | | | {gate:.1%} | | {r['secs']} | FAILED (exit {r['rc']}, "
                  f"{len(train)} steps) |")
            continue
        rel = abs(val[steps] - gt_val[steps]) / gt_val[steps]
        curve = max(abs(train[s]["loss"] - gt_train[s]["loss"]) / gt_train[s]["loss"] for s in gt_train)
        tps = 2048 / statistics.median(t["step_time_s"] for s, t in train.items() if s > 1)
        good = rel <= gate
        ok &= good
        print(f"| {r['name']} | {r['np']} | {val.get(1, float('nan')):.4f} | {val[steps]:.4f} | "
              f"{'ground truth' if r['name'] == 'fsdp2' else f'{rel:.2e}'} | {curve:.2e} | {gate:.1%} | "
              f"{tps:,.0f} | {r['secs']} | {'ok' if good else 'OUTSIDE GATE'} |")
    print("\ntokens/s: 2,048 over the median step time of steps 2.. (all ranks share the same 2 CPU cores); "
          "time: the whole run, validation included.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
