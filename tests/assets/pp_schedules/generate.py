#!/usr/bin/env python3
"""Fixture generator for tests/unit/test_pp_schedule.c: PyTorch's own pipeline
schedules, dumped as CSV, so the C generators and lowering passes in parallel/pp/
can be compared with them cell by cell.

For every case of the grid below it writes
    <kind>_p<P>_v<V>_m<M>.csv        the compute-only order (PyTorch's pipeline_order,
                                     idle slots as empty cells)
    <kind>_p<P>_v<V>_m<M>.comms.csv  the lowered order (pipeline_order_with_comms of
                                     _PipelineScheduleRuntime with default options)
and a MANIFEST listing them (the torch version in its header).

GPipe and 1F1B are single-stage schedules: PyTorch's _get_pipeline_order for them
already runs _add_reduce_grad (dropping idle slots, adding REDUCE_GRAD and
WAIT_REDUCE_GRAD); their compute-only form here is that order without the two
reduction actions (and, for 1F1B, with the last rank's forwards numbered from 0:
see renumber_forwards). Their lowered form is what _PipelineScheduleRuntime._load_csv
makes of the compute-only CSV, which is how a CSV with them runs in PyTorch.

No process group is needed: the schedule classes only read a few attributes of
their stages (sizes, rank, stage index, submod) while building the orders.

Rerun (needs torch 2.x; the output is committed test data):
    /tmp/torchvenv/bin/python tests/assets/pp_schedules/generate.py
from the repository root (or pass the output folder as the one argument).

    generate.py --wide DIR
writes a much larger grid (every kind, 1-5 ranks, 2-4 stages per rank for the
looped kinds, 1 to 3p+2 microbatches) into DIR, not for committing: point the C test at it with
TETRA_PP_SCHEDULES=DIR. Cases PyTorch refuses are listed with "-" for both files,
and the C generator must refuse them too.
"""
import csv
import os
import sys

import torch
from torch.distributed.pipelining import schedules as S


class StubStage:
    """Just enough of _PipelineStageBase for the schedule constructors."""

    def __init__(self, stage_index, num_stages, group_size, group_rank):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.submod = None
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank = {}


SINGLE = {"GPipe": S.ScheduleGPipe, "1F1B": S.Schedule1F1B}
MULTI = {
    "Interleaved1F1B": S.ScheduleInterleaved1F1B,
    "LoopedBFS": S.ScheduleLoopedBFS,
    "InterleavedZeroBubble": S.ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": S.ScheduleZBVZeroBubble,
    "DualPipeV": S.ScheduleDualPipeV,
}
V_KINDS = ("ZBVZeroBubble", "DualPipeV")


def grid():
    cases = []
    for p in (2, 4):
        odd = 2 * p + 2
        for kind in ("GPipe", "1F1B"):
            for m in (p, 2 * p, odd):
                cases.append((kind, p, 1, m))
        for kind in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble"):
            for m in (p, 2 * p, odd):
                cases.append((kind, p, 2, m))
        for m in (2 * p, odd):  # DualPipeV needs m >= 2p
            cases.append(("DualPipeV", p, 2, m))
    # three stages per rank for the looped kinds; fewer microbatches than ranks
    for kind in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"):
        cases.append((kind, 2, 3, 4))
        cases.append((kind, 4, 2, 3))
    cases.append(("InterleavedZeroBubble", 2, 3, 1))  # more bubbles added (m < p)
    # one pipeline rank: gradient accumulation in PyTorch's orders
    cases += [("GPipe", 1, 1, 3), ("1F1B", 1, 1, 3), ("Interleaved1F1B", 1, 2, 2)]
    # looped kinds with one stage per rank: InterleavedZeroBubble is then ZB-H1
    for kind in ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble"):
        cases.append((kind, 4, 1, 8))
    cases.append(("InterleavedZeroBubble", 2, 1, 4))
    return cases


def wide_grid():
    cases = []
    for kind in list(SINGLE) + list(MULTI):
        for p in range(1, 6):
            for v in ((1,) if kind in SINGLE else (2,) if kind in V_KINDS else (2, 3, 4)):
                for m in range(1, 3 * p + 3):
                    cases.append((kind, p, v, m))
    return cases


def stage_rank_loop(p, s):
    return s % p


def renumber_forwards(acts):
    """PyTorch 2.15's Schedule1F1B._get_pipeline_order numbers the forwards of the
    last rank from 1 (its counter is bumped before the first use when that rank has
    no warm-up forwards: "1F1 1B0 1F2 1B1 ... 1F<m>"), an order its own validator
    refuses. Its runtime (_step_microbatches) runs forwards 0, 1, 2, ... on every
    rank; the k-th forward of a rank is microbatch k. Same order otherwise."""
    out, k = [], 0
    for a in acts:
        if a.computation_type == S.FORWARD:
            a = S._Action(a.stage_index, S.FORWARD, k)
            k += 1
        out.append(a)
    return out


def build(kind, p, v, m):
    """(compute-only order, lowered order, bubbles added by _add_bubbles_to_actions)."""
    n_stages = p * v
    bubbles = 0
    if kind in SINGLE:
        sched = SINGLE[kind](StubStage(0, n_stages, p, 0), m)
        order = {
            r: [a for a in acts if a is not None and a.computation_type not in (S.REDUCE_GRAD, S.WAIT_REDUCE_GRAD)]
            for r, acts in sched.pipeline_order.items()
        }
        if kind == "1F1B":
            order = {r: renumber_forwards(acts) for r, acts in order.items()}
        lowered = None
    else:
        if kind in V_KINDS:
            mapping = S.generate_rank_to_stage_mapping(p, n_stages, style="v")
            own = mapping[0]
        else:
            own = [s for s in range(n_stages) if stage_rank_loop(p, s) == 0]
        stages = [StubStage(s, n_stages, p, 0) for s in own]
        sched = MULTI[kind](stages, m)
        order = sched.pipeline_order
        lowered = sched.pipeline_order_with_comms
        if kind == "InterleavedZeroBubble":
            raw = {r: sched._calculate_single_rank_operations(r) for r in range(p)}
            bubbles = sum(len(order[r]) - len(raw[r]) for r in range(p))
    return order, lowered, bubbles


def write_csv(path, order):
    # as PyTorch's _dump_csv: csv.writer, one row per rank, None as an empty cell
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        for r in sorted(order):
            w.writerow(order[r])


def lower_from_csv(path, p, v, m, kind):
    """What _PipelineScheduleRuntime._load_csv(path, "compute_only") lowers it to."""
    n_stages = p * v
    style = "v" if kind in V_KINDS else "loop"
    mapping = S.generate_rank_to_stage_mapping(p, n_stages, style=style)
    stages = [StubStage(s, n_stages, p, 0) for s in mapping[0]]
    rt = S._PipelineScheduleRuntime(stages, m)
    rt._load_csv(path, format="compute_only")
    return rt.pipeline_order_with_comms


FSDP_TYPES = (S.UNSHARD, S.RESHARD, S.REDUCE_GRAD, S.WAIT_REDUCE_GRAD)


def sim_steps(lowered, p, v, kind):
    """Steps of PyTorch's dry run (_simulate_comms_compute) over the lowered lists
    without their FSDP actions, which it does not model; "-" where it cannot run
    (OVERLAP_F_B, which it does not model either)."""
    if any(a.computation_type == S.OVERLAP_F_B for acts in lowered.values() for a in acts):
        return "-"
    style = "v" if kind in V_KINDS else "loop"
    mapping = S.generate_stage_to_rank_mapping(p, p * v, style=style)
    stripped = {r: [a for a in acts if a.computation_type not in FSDP_TYPES] for r, acts in lowered.items()}
    sim = S._simulate_comms_compute(stripped, lambda s: mapping[s], p * v)
    return str(max(len(acts) for acts in sim.values()))


def main():
    args = sys.argv[1:]
    wide = bool(args) and args[0] == "--wide"
    if wide:
        args = args[1:]
        if not args:
            raise SystemExit("usage: generate.py --wide DIR")
        os.makedirs(args[0], exist_ok=True)
    out = args[0] if args else os.path.dirname(os.path.abspath(__file__))
    lines = [
        "# PyTorch pipeline schedules as CSV fixtures for tests/unit/test_pp_schedule.c",
        f"# torch {torch.__version__} (torch/distributed/pipelining/schedules.py); written by generate.py",
        "# 1F1B: PyTorch's order with the last rank's forwards numbered from 0 (its IR numbers them from 1)",
        "# columns: kind pp_ranks stages_per_rank microbatches compute_only_csv compute_comms_csv zb_bubbles_added sim_steps",
        "# zb_bubbles_added: idle slots InterleavedZeroBubble's _add_bubbles_to_actions inserted",
        "# sim_steps: steps of _simulate_comms_compute over the lowered lists without FSDP actions (- where it cannot run)",
    ]
    for kind, p, v, m in wide_grid() if wide else grid():
        base = f"{kind}_p{p}_v{v}_m{m}"
        try:
            order, lowered, bubbles = build(kind, p, v, m)
        except (ValueError, AssertionError) as e:
            if not wide:
                raise
            lines.append(f"{kind} {p} {v} {m} - - 0 -")
            print(base, "refused:", str(e).splitlines()[0][:100])
            continue
        cpath = os.path.join(out, base + ".csv")
        write_csv(cpath, order)
        from_csv = lower_from_csv(cpath, p, v, m, kind)
        if lowered is not None and {r: list(a) for r, a in lowered.items()} != from_csv:
            raise SystemExit(f"{base}: lowering the dumped CSV differs from the schedule's own")
        write_csv(os.path.join(out, base + ".comms.csv"), from_csv)
        steps = sim_steps(from_csv, p, v, kind)
        lines.append(f"{kind} {p} {v} {m} {base}.csv {base}.comms.csv {bubbles} {steps}")
        print(base, "bubbles added" if bubbles else "")
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
