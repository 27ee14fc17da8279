#!/usr/bin/env python3
"""scripts/gpu_check_tools.py — the comparisons and tables of scripts/gpu_check (standard
library only: it runs with whatever python3 the GPU machine has).

  gpu_check_tools.py layouts WORK REFDIR [--perturb NAME:REL] [--json OUT]
      compare every run listed in WORK/runs.tsv with its baseline run and, where named, its
      CPU reference curve (REFDIR/<ref>.jsonl + .args); print the layout table; exit 1 when
      a run that ran misses its gate (or failed), 0 otherwise
  gpu_check_tools.py convergence WORK REFDIR [--perturb NAME:REL] [--json OUT]
      the convergence runs (WORK/runs.tsv) against the CPU golden curve
  gpu_check_tools.py curve METRICS OUT.jsonl
      keep step, loss, grad_norm and validation_loss of a metrics.jsonl (a reference curve)
  gpu_check_tools.py versions
      the CUDA runtime, cuBLASLt, cuDNN and NCCL versions and files this process loads
  gpu_check_tools.py glibc-needs FILE... [--weaken-above 2.34]
      the glibc versions each ELF file needs and the symbols that need them; with
      --weaken-above V, every reference to a GLIBC version newer than V is marked weak in place
      (VER_FLG_WEAK: the loader then accepts a libc without it, and an unversioned definition,
      e.g. a preloaded compat library, supplies the symbols); prints "FILE: VERSION symbol..."
  gpu_check_tools.py profile-factors GPU_OPS_MD PROFILE [CARD]
      the compute and memory factors of a `tetra plan` hardware profile from bench/gpu_ops's
      table (GPU_OPS_MD): bf16 GEMMs (the block's seven linears, forward and both gradients),
      fp8 GEMMs, fused attention (forward and backward) and the elementwise kernels, each
      the measured rate over PROFILE's datasheet rate; prints them as the profile's lines,
      each with the rate it comes from; exit 1 when a group is missing from the table

runs.tsv (written by scripts/gpu_check, one run a line, tab-separated):
  name  ranks  precision  vs  ref  rc  seconds  skip  args
where vs is "<baseline run>:<gate>" or "-", ref is "<reference curve>:<gate>" or "-", rc is
the exit status (or "-" when the run was skipped, skip saying why) and args the run's
arguments beyond the device (what the reference's .args file must equal).

--perturb NAME:REL multiplies the losses of run NAME from step 2 on by (1 + REL) before
comparing: the gates' self-test (a curve moved by more than its gate must FAIL).
"""
import json
import os
import re
import sys

# gate name: (step-1 bound or None, every-step bound, where the number comes from)
GATES = {
    "dp": (1e-6, 1e-5, "tests/sh/test_loss_parity.sh: step 1 1e-6, every step 1e-5"),
    "fp32": (None, 1e-5, "tests/sh/test_{tensor,pipeline,context}_parallel.sh: every step 1e-5"),
    "bf16": (None, 1e-3, "bf16 layouts in test_mixed_precision / test_*_parallel: every step 1e-3"),
    "f8": (5e-6, 1e-4, "tests/sh/test_float8.sh (fsdp 2 x tp 2): step 1 5e-6, every step 1e-4"),
    "cpu": (1e-5, 1e-4, "the GPU's fp32 curve against the CPU's: step 1 1e-5, every step 1e-4"),
    "cpu_low": (None, 1e-2, "bf16 / float8 against the CPU: tests/sh/test_golden_loss.sh's 1e-2"),
}


def read_rows(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if l.strip()]
    except (OSError, ValueError):
        return []


def losses(rows):
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}


def perturbed(name, curve, perturb):
    if perturb and perturb[0] == name:
        return {s: (v * (1.0 + perturb[1]) if s >= 2 else v) for s, v in curve.items()}
    return curve


def compare(cur, ref, gate, steps):
    """(ok, max rel diff, step-1 rel diff, steps compared, why)"""
    first, every, _ = GATES[gate]
    want = list(range(1, steps + 1))
    missing = [s for s in want if s not in cur or s not in ref]
    rel = {s: abs(cur[s] - ref[s]) / abs(ref[s]) for s in want if s in cur and s in ref and ref[s] != 0}
    mx = max(rel.values()) if rel else float("nan")
    s1 = rel.get(1, float("nan"))
    if missing:
        return False, mx, s1, len(rel), f"steps {missing[0]}..{missing[-1]} missing ({len(missing)} of {steps})"
    if not all(v == v for v in rel.values()):  # NaN
        return False, mx, s1, len(rel), "NaN loss"
    ok = mx <= every and (first is None or s1 <= first)
    why = "" if ok else (f"step 1 {s1:.2e} > {first:g}" if first is not None and s1 > first else f"{mx:.2e} > {every:g}")
    return ok, mx, s1, len(rel), why


def log_memory(path):
    """start-up memory of rank 0 from the log: the device's, or the CPU backend's"""
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return ""
    m = re.search(r"device memory: ([\d.]+ [KMGT]?i?B)[^;\n]*; ([\d.]+ [KMGT]?i?B) free of ([\d.]+ [KMGT]?i?B)", text)
    if m:
        return f"{m.group(1)} (free {m.group(2)} of {m.group(3)})"
    m = re.search(r"backend memory: ([\d.]+ [KMGT]?i?B)", text)
    return f"{m.group(1)} (host)" if m else ""


def first_error(path):
    try:
        for line in open(path, errors="replace"):
            if re.search(r"ERROR|error:|Error|abort|not found|FAIL", line):
                return line.strip()[-160:]
    except OSError:
        return ""
    return ""


def exit_note(r, log):
    if r["rc"] in ("124", "137"):
        return f"timed out after {r['seconds']} s (the section's time ran out)"
    return f"exit {r['rc']}: {first_error(log)}"


def read_runs(work):
    runs = []
    with open(os.path.join(work, "runs.tsv")) as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            p = line.rstrip("\n").split("\t")
            p += [""] * (9 - len(p))
            runs.append(dict(name=p[0], ranks=int(p[1]), precision=p[2], vs=p[3], ref=p[4], rc=p[5],
                             seconds=p[6], skip=p[7], args=p[8]))
    return runs


def parse_perturb(args):
    if "--perturb" in args:
        v = args[args.index("--perturb") + 1]
        name, rel = v.rsplit(":", 1)
        return name, float(rel)
    return None


def opt(args, key):
    return args[args.index(key) + 1] if key in args else None


def fmt(x):
    return "-" if x is None or x != x else f"{x:.2e}"


def layouts(args):
    work, refdir = args[0], args[1]
    perturb = parse_perturb(args)
    steps = int(opt(args, "--steps") or 0)
    runs = read_runs(work)
    by = {r["name"]: r for r in runs}
    curves = {r["name"]: perturbed(r["name"], losses(read_rows(os.path.join(work, r["name"], "metrics.jsonl"))), perturb)
              for r in runs}
    results, failed = [], 0
    print("| layout | ranks | precision | result | compared with | steps | max rel diff | step 1 | gate | "
          "wall s | start-up memory | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        name = r["name"]
        res = dict(name=name, ranks=r["ranks"], precision=r["precision"], seconds=r["seconds"],
                   memory=log_memory(os.path.join(work, name + ".log")), checks=[])
        rows = []
        if r["rc"] == "-":
            res["result"] = "SKIP"
            rows.append(("SKIP", "-", "-", None, None, "-", r["skip"]))
        elif r["rc"] != "0":
            res["result"] = "FAIL"
            failed += 1
            rows.append(("FAIL", "-", "-", None, None, "-", exit_note(r, os.path.join(work, name + ".log"))))
        else:
            cur = curves[name]
            res["losses"] = [cur[s] for s in sorted(cur)]
            comparisons = []
            if r["vs"] != "-":
                base, gate = r["vs"].rsplit(":", 1)
                b = by.get(base)
                if b is None or b["rc"] != "0":
                    comparisons.append((base, gate, None, f"baseline {base} did not run"))
                else:
                    comparisons.append((base, gate, curves[base], ""))
            if r["ref"] != "-" and not os.path.isdir(refdir):
                rows.append(("SKIP", f"CPU {r['ref'].rsplit(':', 1)[0]}", "-", None, None, "-",
                             f"no CPU references here ({refdir}: scripts/gpu_check --prepare makes them)"))
            elif r["ref"] != "-":
                refname, gate = r["ref"].rsplit(":", 1)
                rpath = os.path.join(refdir, refname + ".jsonl")
                apath = os.path.join(refdir, refname + ".args")
                if not os.path.exists(rpath):
                    comparisons.append((f"CPU {refname}", gate, None,
                                        "no CPU reference (scripts/gpu_check --prepare makes it)"))
                else:
                    made = open(apath).read().strip() if os.path.exists(apath) else ""
                    if made != r["args"].strip():
                        comparisons.append((f"CPU {refname}", gate, None,
                                            "the CPU reference was made with other arguments: rerun --prepare"))
                    else:
                        comparisons.append((f"CPU {refname}", gate, losses(read_rows(rpath)), ""))
            if not comparisons:
                rows.insert(0, ("PASS" if len(cur) == steps else "FAIL", "(baseline)", str(len(cur)), None, None,
                                "-", "" if len(cur) == steps else f"{len(cur)} of {steps} steps"))
                ok_all = len(cur) == steps
                if not ok_all:
                    failed += 1
                res["result"] = "PASS" if ok_all else "FAIL"
            else:
                ok_all = True
                for what, gate, ref, why in comparisons:
                    if ref is None:
                        ok, mx, s1, n = False, None, None, 0
                    else:
                        ok, mx, s1, n, why = compare(cur, ref, gate, steps)
                    ok_all &= ok
                    g = GATES[gate]
                    gtxt = (f"{g[0]:g} / {g[1]:g}" if g[0] is not None else f"{g[1]:g}")
                    rows.append(("PASS" if ok else "FAIL", what, str(n), mx, s1, gtxt, why))
                    res["checks"].append(dict(vs=what, gate=gate, ok=ok, max_rel=mx, step1_rel=s1, why=why))
                res["result"] = "PASS" if ok_all else "FAIL"
                failed += 0 if ok_all else 1
        for i, (result, what, n, mx, s1, gtxt, note) in enumerate(rows):
            head = (f"{name} | {r['ranks']} | {r['precision']}" if i == 0 else " | | ")
            tail = (f"{r['seconds']} | {res['memory'] or '-'}" if i == 0 else " | ")
            print(f"| {head} | {result} | {what} | {n} | {fmt(mx)} | {fmt(s1)} | {gtxt} | {tail} | "
                  f"{note.replace('|', '/')} |")
        results.append(res)
    ran = [r for r in results if r["result"] != "SKIP"]
    passed = sum(r["result"] == "PASS" for r in ran)
    print()
    print(f"layouts: {passed} of {len(ran)} runs passed, {len(results) - len(ran)} skipped")
    for g, (a, b, src) in GATES.items():
        print(f"  gate {g}: {src}")
    if opt(args, "--json"):
        json.dump(dict(layouts=results, gates={k: v[2] for k, v in GATES.items()}), open(opt(args, "--json"), "w"),
                  indent=1)
    return 1 if failed else 0


def val_losses(rows):
    return {r["step"]: r["validation_loss"] for r in rows if "validation_loss" in r}


def convergence(args):
    """fp32 on the device against the CPU golden: the training loss at every step within 1e-4
    and the final validation loss within 0.5 % (the benchmark's fp32 gate); bf16 and float8
    runs: the final validation loss within 2 % of the CPU fp32 golden (its low-precision
    gate), their training curves reported"""
    work, refdir = args[0], args[1]
    perturb = parse_perturb(args)
    steps = int(opt(args, "--steps") or 0)
    runs = read_runs(work)
    failed = 0
    results = []
    print("| run | precision | result | train loss: max rel diff to CPU fp32 (gate) | final validation loss | "
          "vs CPU fp32 (gate) | wall s | start-up memory | note |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        name = r["name"]
        res = dict(name=name, precision=r["precision"], seconds=r["seconds"],
                   memory=log_memory(os.path.join(work, name + ".log")))
        if r["rc"] == "-":
            res["result"] = "SKIP"
            print(f"| {name} | {r['precision']} | SKIP | - | - | - | - | - | {r['skip']} |")
            results.append(res)
            continue
        if r["rc"] != "0":
            failed += 1
            res["result"] = "FAIL"
            print(f"| {name} | {r['precision']} | FAIL | - | - | - | {r['seconds']} | - | "
                  f"{exit_note(r, os.path.join(work, name + '.log')).replace('|', '/')} |")
            results.append(res)
            continue
        rows = read_rows(os.path.join(work, name, "metrics.jsonl"))
        cur = perturbed(name, losses(rows), perturb)
        val = val_losses(rows)
        if perturb and perturb[0] == name:
            val = {s: v * (1.0 + perturb[1]) for s, v in val.items()}
        refname, gate = r["ref"].rsplit(":", 1)
        rpath = os.path.join(refdir, refname + ".jsonl")
        apath = os.path.join(refdir, refname + ".args")
        note = ""
        if not os.path.exists(rpath):
            ok, note = False, "no CPU golden curve (scripts/gpu_check --prepare makes it)"
            mx = vrel = None
            vfinal = val[max(val)] if val else None
        elif (open(apath).read().strip() if os.path.exists(apath) else "") != r["args"].strip():
            ok, note = False, "the CPU golden was made with other arguments: rerun --prepare"
            mx = vrel = None
            vfinal = val[max(val)] if val else None
        else:
            rrows = read_rows(rpath)
            ref, rval = losses(rrows), val_losses(rrows)
            want = list(range(1, steps + 1))
            missing = [s for s in want if s not in cur or s not in ref]
            rel = [abs(cur[s] - ref[s]) / abs(ref[s]) for s in want if s in cur and s in ref]
            mx = max(rel) if rel else None
            last = max(rval) if rval else None
            vfinal = val.get(last) if last else None
            vrel = (vfinal - rval[last]) / rval[last] if vfinal is not None and last else None
            if gate == "fp32":
                ok = not missing and mx is not None and mx <= 1e-4 and vrel is not None and abs(vrel) <= 5e-3
                if not ok:
                    note = (f"steps missing ({len(missing)})" if missing else
                            f"train {mx:.2e} > 1e-4" if mx is None or mx > 1e-4 else f"validation {vrel:+.2e} beyond 0.5 %")
            else:
                ok = not missing and vrel is not None and abs(vrel) <= 2e-2
                if not ok:
                    note = f"steps missing ({len(missing)})" if missing else f"validation {vrel:+.2e} beyond 2 %"
        failed += 0 if ok else 1
        res.update(result="PASS" if ok else "FAIL", max_rel_train=mx, final_val=vfinal, val_rel=vrel,
                   losses=[cur[s] for s in sorted(cur)])
        tgate = "1e-4" if gate == "fp32" else "reported"
        vgate = "0.5 %" if gate == "fp32" else "2 %"
        print(f"| {name} | {r['precision']} | {res['result']} | {fmt(mx)} ({tgate}) | "
              f"{'-' if vfinal is None else f'{vfinal:.4f}'} | "
              f"{'-' if vrel is None else f'{vrel * 100:+.3f} %'} ({vgate}) | {r['seconds']} | "
              f"{res['memory'] or '-'} | {note} |")
        results.append(res)
    if opt(args, "--json"):
        json.dump(dict(convergence=results), open(opt(args, "--json"), "w"), indent=1)
    return 1 if failed else 0


def curve(args):
    rows = read_rows(args[0])
    keep = ("step", "loss", "grad_norm", "validation_loss")
    with open(args[1], "w") as f:
        for r in rows:
            if "loss" in r or "validation_loss" in r:
                f.write(json.dumps({k: r[k] for k in keep if k in r}) + "\n")
    print(f"{args[1]}: {sum('loss' in r for r in rows)} steps")
    return 0 if rows else 1


def versions(args):
    import ctypes

    def load(name):
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            print(f"  {name:<18} NOT LOADED: {e}")
            return None

    def where(lib_name):
        try:
            for line in open("/proc/self/maps"):
                if lib_name in line and "/" in line:
                    return line.split()[-1]
        except OSError:
            pass
        return "?"

    ok = True
    short = []
    v = ctypes.c_int(0)
    lib = load("libcudart.so.13")
    if lib:
        lib.cudaRuntimeGetVersion(ctypes.byref(v))
        print(f"  CUDA runtime       {v.value // 1000}.{v.value % 1000 // 10}  {where('libcudart.so')}")
        short.append(f"CUDA runtime {v.value // 1000}.{v.value % 1000 // 10}")
        d = ctypes.c_int(0)
        if lib.cudaDriverGetVersion(ctypes.byref(d)) == 0 and d.value:
            print(f"  CUDA driver API    {d.value // 1000}.{d.value % 1000 // 10}")
    else:
        ok = False
    lib = load("libcublasLt.so.13")
    if lib:
        lib.cublasLtGetVersion.restype = ctypes.c_size_t
        n = lib.cublasLtGetVersion()
        print(f"  cuBLASLt           {n // 10000}.{n % 10000 // 100}.{n % 100}  {where('libcublasLt.so')}")
        short.append(f"cuBLASLt {n // 10000}.{n % 10000 // 100}.{n % 100}")
    else:
        ok = False
    lib = load("libcudnn.so.9")
    if lib:
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        n = lib.cudnnGetVersion()
        print(f"  cuDNN              {n // 10000}.{n % 10000 // 100}.{n % 100}  {where('libcudnn.so')}")
        short.append(f"cuDNN {n // 10000}.{n % 10000 // 100}.{n % 100}")
    else:
        ok = False
    lib = load("libnccl.so.2")
    if lib:
        lib.ncclGetVersion(ctypes.byref(v))
        n = v.value
        print(f"  NCCL               {n // 10000}.{n % 10000 // 100}.{n % 100}  {where('libnccl.so')}")
        short.append(f"NCCL {n // 10000}.{n % 10000 // 100}.{n % 100}")
    else:
        ok = False
    print("versions: " + ", ".join(short))
    return 0 if ok else 1


def _ver(v):
    return tuple(int(x) for x in v.split("."))


def glibc_needs(args):
    """read (and optionally patch) the version needs of ELF64 little-endian files"""
    import struct
    above = None
    files = []
    i = 0
    while i < len(args):
        if args[i] == "--weaken-above":
            above = _ver(args[i + 1])
            i += 2
        else:
            files.append(args[i])
            i += 1
    for path in files:
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            continue
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + k * shentsize) for k in range(shnum)]
        # name type flags addr offset size link info addralign entsize
        verneed = [x for x in secs if x[1] == 0x6FFFFFFE]
        versym = [x for x in secs if x[1] == 0x6FFFFFFF]
        dynsym = [x for x in secs if x[1] == 11]
        if not verneed:
            continue
        vn = verneed[0]
        strtab = secs[vn[6]]

        def cstr(tab, off):
            a = tab[4] + off
            return bytes(data[a:data.index(0, a)]).decode()

        want = {}  # version index -> (name, file offset of vna_flags)
        off = vn[4]
        while True:
            vn_version, vn_cnt, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, off)
            fname = cstr(strtab, vn_file)
            a = off + vn_aux
            for _ in range(vn_cnt):
                vna_hash, vna_flags, vna_other, vna_name, vna_next = struct.unpack_from("<IHHII", data, a)
                name = cstr(strtab, vna_name)
                if fname.startswith("libc.so") or fname.startswith("libm.so") or name.startswith("GLIBC_2"):
                    want[vna_other] = (name, a + 4, vna_flags)
                if vna_next == 0:
                    break
                a += vna_next
            if vn_next == 0:
                break
            off += vn_next
        syms = {}
        if versym and dynsym:
            ds, vs = dynsym[0], versym[0]
            dstr = secs[ds[6]]
            for k in range(ds[5] // 24):
                st_name, = struct.unpack_from("<I", data, ds[4] + 24 * k)
                ndx, = struct.unpack_from("<H", data, vs[4] + 2 * k)
                ndx &= 0x7FFF
                if ndx in want and st_name:
                    syms.setdefault(ndx, []).append(cstr(dstr, st_name))
        patched = False
        for ndx, (name, flag_off, flags) in sorted(want.items(), key=lambda x: x[1][0]):
            if not name.startswith("GLIBC_2.") or name.count(".") < 1:
                continue
            try:
                v = _ver(name[6:])
            except ValueError:
                continue
            if above is not None and v > above:
                struct.pack_into("<H", data, flag_off, flags | 0x2)
                patched = True
            if above is None or v > above:
                tag = " (now weak)" if above is not None and v > above else " (weak)" if flags & 0x2 else ""
                print(f"{path}: {name}{tag} {' '.join(sorted(syms.get(ndx, [])))}")
        if patched:
            with open(path, "r+b") as f:
                f.write(data)
    return 0


def _toml_number(path, key):
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*%s\s*=\s*([0-9.eE+-]+)" % re.escape(key), line)
            if m:
                return float(m.group(1))
    raise KeyError(f"{path}: no {key}")


def profile_factors(args):
    if len(args) < 2:
        print("usage: gpu_check_tools.py profile-factors GPU_OPS_MD PROFILE [CARD]", file=sys.stderr)
        return 2
    table, profile = args[0], args[1]
    card = args[2] if len(args) > 2 else "this GPU"
    peak16, peak8 = _toml_number(profile, "peak_bf16_flops"), _toml_number(profile, "peak_fp8_flops")
    bandwidth = _toml_number(profile, "memory_bandwidth")
    flops, secs, moved = {}, {}, {}
    with open(table) as f:
        for line in f:
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(c) < 5 or c[0] in ("group", "") or c[0].startswith("---"):
                continue
            group, op, ms, rate, mb = c[0], c[1], float(c[2]), c[3], c[4]
            if group == "block GEMMs (bf16)" and re.match(r"(fwd|dgrad|wgrad) w[qkvo123]\b", op):
                key = "gemm_efficiency"
            elif group == "float8 tensorwise" and op.startswith("fp8 gemm"):
                key = "fp8_gemm_efficiency"
            elif group.startswith("attention"):
                key = "attention_efficiency"
            elif group == "elementwise (bf16)":
                key = "memory_efficiency"
            else:
                continue
            secs[key] = secs.get(key, 0.0) + ms * 1e-3
            if rate.endswith("TFLOP/s"):
                flops[key] = flops.get(key, 0.0) + float(rate.split()[0]) * 1e12 * ms * 1e-3
            else:
                moved[key] = moved.get(key, 0.0) + float(mb) * 1e6
    peaks = {"gemm_efficiency": peak16, "fp8_gemm_efficiency": peak8, "attention_efficiency": peak16}
    what = {"gemm_efficiency": "bf16 GEMMs of an 8B block", "fp8_gemm_efficiency": "fp8 GEMMs of w1",
            "attention_efficiency": "fused attention, forward and backward",
            "memory_efficiency": "elementwise kernels"}
    missing = 0
    for key in ("gemm_efficiency", "fp8_gemm_efficiency", "attention_efficiency", "memory_efficiency"):
        if key not in secs or secs[key] <= 0:
            print(f"# {key}: no {what[key]} in {table}")
            missing = 1
            continue
        if key == "memory_efficiency":
            rate = moved.get(key, 0.0) / secs[key]
            print(f"{key} = {rate / bandwidth:.3f}    # measured: {what[key]} at {rate / 1e12:.2f} TB/s on {card}")
        else:
            rate = flops.get(key, 0.0) / secs[key]
            print(f"{key} = {rate / peaks[key]:.3f}    # measured: {what[key]} at {rate / 1e12:.0f} TFLOP/s on {card}")
    return missing


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, args = sys.argv[1], sys.argv[2:]
    fn = {"layouts": layouts, "convergence": convergence, "curve": curve, "versions": versions,
          "glibc-needs": glibc_needs, "profile-factors": profile_factors}.get(cmd)
    if fn is None:
        print(f"gpu_check_tools.py: unknown command {cmd!r}", file=sys.stderr)
        return 2
    return fn(args)


if __name__ == "__main__":
    sys.exit(main())
