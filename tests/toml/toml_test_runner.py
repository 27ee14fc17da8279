#!/usr/bin/env python3
"""Run a toml-test corpus through a decoder and compare the results.

A small stand-in for toml-test's Go runner, using only the Python standard
library. It implements the same decoder interface and comparison rules:

* valid/**/X.toml with X.json: the decoder must exit 0, write nothing to
  stderr and print tagged JSON that matches X.json. Strings and integers are
  compared exactly, bools exactly, floats numerically (inf, -inf and nan; the
  sign of nan is ignored), date-times parsed and compared as instants (' ',
  't' and 'z' normalised; offset date-times converted to UTC), arrays and
  tables structurally.
* invalid/**/X.toml: the decoder must exit 1 and write an error to stderr.

TOML 1.0 exclusions: valid/string/escape-esc uses the \\e escape, which only
TOML 1.1 has, so for 1.0 it is run as an invalid case (toml-test's own version
list excludes it for 1.0.0).

Prints each failure with details and ends with "toml-test: N passed, M failed";
the exit status is non-zero when anything failed.
"""

import argparse
import json
import math
import os
import re
import subprocess
import sys

# Valid-directory cases that TOML 1.0 decoders must reject.
EXPECT_INVALID_FOR_1_0 = {
    "valid/string/escape-esc": "the \\e escape was added in TOML 1.1",
}

SCALAR_TYPES = {"string", "integer", "float", "bool",
                "datetime", "datetime-local", "date-local", "time-local"}

DATE_RE = r"(\d{4})-(\d{2})-(\d{2})"
TIME_RE = r"(\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
DATETIME_RES = {
    "datetime": re.compile("^" + DATE_RE + "T" + TIME_RE + r"(Z|[+-]\d{2}:\d{2})$"),
    "datetime-local": re.compile("^" + DATE_RE + "T" + TIME_RE + "$"),
    "date-local": re.compile("^" + DATE_RE + "$"),
    "time-local": re.compile("^" + TIME_RE + "$"),
}


def days_from_civil(y, m, d):
    """Days since 1970-01-01 of a proleptic Gregorian date (works for any year,
    unlike datetime, and tolerates a leap second in the caller)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_datetime(kind, text):
    """A comparable key for a date-time value, or None when malformed."""
    norm = text
    if kind in ("datetime", "datetime-local") and len(norm) > 10 and norm[10] in " t":
        norm = norm[:10] + "T" + norm[11:]
    if kind == "datetime" and norm.endswith("z"):
        norm = norm[:-1] + "Z"
    m = DATETIME_RES[kind].match(norm)
    if not m:
        return None
    g = m.groups()

    def nanos(frac):
        return int((frac or "0")[:9].ljust(9, "0"))

    if kind == "date-local":
        return tuple(int(x) for x in g)
    if kind == "time-local":
        return (int(g[0]), int(g[1]), int(g[2]), nanos(g[3]))
    y, mo, d, h, mi, s = (int(x) for x in g[:6])
    if kind == "datetime-local":
        return (y, mo, d, h, mi, s, nanos(g[6]))
    off = g[7]
    off_s = 0
    if off != "Z":
        off_s = (1 if off[0] == "+" else -1) * (int(off[1:3]) * 3600 + int(off[4:6]) * 60)
    secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s - off_s
    return (secs, nanos(g[6]))


def parse_float(text):
    try:
        return float(text)
    except ValueError:
        return None


def is_tagged(x):
    return (isinstance(x, dict) and set(x) == {"type", "value"}
            and isinstance(x["type"], str) and isinstance(x["value"], str))


def compare(path, want, have, problems):
    """Append a description of every difference between want and have."""
    where = path or "(root)"
    if is_tagged(want):
        if not is_tagged(have):
            problems.append(f"{where}: expected a {want['type']} value, got {json.dumps(have)[:200]}")
            return
        wt, ht = want["type"], have["type"]
        wv, hv = want["value"], have["value"]
        if wt != ht:
            problems.append(f"{where}: expected type {wt}, got {ht} (value {hv!r})")
            return
        if wt not in SCALAR_TYPES:
            problems.append(f"{where}: unknown type {wt!r} in the expected JSON")
        elif wt == "float":
            wf, hf = parse_float(wv), parse_float(hv)
            if wf is None or hf is None:
                problems.append(f"{where}: cannot read float values (expected {wv!r}, got {hv!r})")
            elif not ((math.isnan(wf) and math.isnan(hf)) or wf == hf):
                problems.append(f"{where}: expected float {wv}, got {hv}")
        elif wt in DATETIME_RES:
            wd, hd = parse_datetime(wt, wv), parse_datetime(wt, hv)
            if wd is None or hd is None:
                problems.append(f"{where}: cannot read {wt} values (expected {wv!r}, got {hv!r})")
            elif wd != hd:
                problems.append(f"{where}: expected {wt} {wv}, got {hv}")
        elif wv != hv:
            problems.append(f"{where}: expected {wt} {wv!r}, got {hv!r}")
        return
    if isinstance(want, dict):
        if not isinstance(have, dict) or is_tagged(have):
            problems.append(f"{where}: expected a table, got {json.dumps(have)[:200]}")
            return
        for k in sorted(set(want) - set(have)):
            problems.append(f"{where}: missing key {k!r}")
        for k in sorted(set(have) - set(want)):
            problems.append(f"{where}: unexpected key {k!r}")
        for k in want:
            if k in have:
                compare(f"{path}.{json.dumps(k)}" if path else json.dumps(k), want[k], have[k], problems)
        return
    if isinstance(want, list):
        if not isinstance(have, list):
            problems.append(f"{where}: expected an array, got {json.dumps(have)[:200]}")
            return
        if len(want) != len(have):
            problems.append(f"{where}: expected an array of {len(want)} elements, got {len(have)}")
            return
        for i, (w, h) in enumerate(zip(want, have)):
            compare(f"{path}[{i}]", w, h, problems)
        return
    problems.append(f"{where}: malformed expected JSON {json.dumps(want)[:200]}")


def run_decoder(decoder, path, timeout):
    with open(path, "rb") as f:
        data = f.read()
    try:
        r = subprocess.run([decoder], input=data, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, b"", b""
    return r.returncode, r.stdout, r.stderr


def excerpt(b, limit=400):
    s = b.decode("utf-8", "replace").rstrip("\n")
    return s if len(s) <= limit else s[:limit] + "..."


def discover(root):
    valid, invalid = [], []
    for kind, out in (("valid", valid), ("invalid", invalid)):
        base = os.path.join(root, kind)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames.sort()
            for fn in sorted(filenames):
                if fn.endswith(".toml"):
                    rel = os.path.relpath(os.path.join(dirpath, fn[:-5]), root).replace(os.sep, "/")
                    out.append(rel)
    return valid, invalid


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--decoder", required=True, help="decoder executable (TOML on stdin)")
    ap.add_argument("--tests", required=True, help="toml-test 'tests' directory (holds valid/ and invalid/)")
    ap.add_argument("--min-valid", type=int, default=0, help="fail unless at least this many valid cases are found")
    ap.add_argument("--min-invalid", type=int, default=0, help="fail unless at least this many invalid cases are found")
    ap.add_argument("--require-position", action="store_true",
                    help="invalid cases must report errors as 'LINE:COL: message'")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every case")
    args = ap.parse_args()

    valid, invalid = discover(args.tests)
    print(f"toml-test: discovered {len(valid)} valid and {len(invalid)} invalid cases in {args.tests}")
    setup_errors = []
    if len(valid) < args.min_valid:
        setup_errors.append(f"expected at least {args.min_valid} valid cases, found {len(valid)}")
    if len(invalid) < args.min_invalid:
        setup_errors.append(f"expected at least {args.min_invalid} invalid cases, found {len(invalid)}")
    for name in EXPECT_INVALID_FOR_1_0:
        if name not in valid:
            setup_errors.append(f"excluded case {name} not found; update EXPECT_INVALID_FOR_1_0")

    cases = [(n, True) for n in valid if n not in EXPECT_INVALID_FOR_1_0]
    cases += [(n, False) for n in invalid] + [(n, False) for n in valid if n in EXPECT_INVALID_FOR_1_0]
    position_re = re.compile(rb"^\d+:\d+: \S")

    passed, failed = 0, 0
    for name, expect_valid in cases:
        toml_path = os.path.join(args.tests, name + ".toml")
        rc, out, err = run_decoder(args.decoder, toml_path, args.timeout)
        problems = []
        if rc is None:
            problems.append(f"timed out after {args.timeout} s")
        elif expect_valid:
            if rc != 0:
                problems.append(f"decoder exited with status {rc}")
            if err:
                problems.append(f"decoder wrote to stderr: {excerpt(err)}")
            if not out.strip():
                problems.append("decoder wrote nothing to stdout")
            if not problems:
                try:
                    with open(os.path.join(args.tests, name + ".json"), encoding="utf-8") as f:
                        want = json.load(f)
                except (OSError, ValueError) as e:
                    problems.append(f"cannot read the expected JSON: {e}")
                    want = None
                try:
                    have = json.loads(out.decode("utf-8"))
                except (UnicodeDecodeError, ValueError) as e:
                    problems.append(f"decoder output is not valid JSON ({e}): {excerpt(out)}")
                    have = None
                if want is not None and have is not None:
                    compare("", want, have, problems)
        else:
            if rc == 0:
                problems.append("decoder accepted an invalid document (exit status 0)"
                                + (f"; output: {excerpt(out, 200)}" if out else ""))
            elif rc != 1:
                problems.append(f"decoder exited with status {rc}, expected 1")
            if not err.strip():
                problems.append("expected an error, but nothing was written to stderr")
            elif args.require_position and not position_re.match(err):
                problems.append(f"error is not of the form 'LINE:COL: message': {excerpt(err)}")
        if problems:
            failed += 1
            why = EXPECT_INVALID_FOR_1_0.get(name)
            label = "valid" if expect_valid else ("invalid in TOML 1.0: " + why if why else "invalid")
            print(f"FAIL {name} ({label})")
            for pr in problems[:20]:
                print(f"    {pr}")
            if len(problems) > 20:
                print(f"    ... and {len(problems) - 20} more differences")
        else:
            passed += 1
            if args.verbose:
                msg = excerpt(err, 200) if err else "ok"
                print(f"ok   {name}: {msg}")

    for e in setup_errors:
        print(f"FAIL setup: {e}")
    failed += len(setup_errors)
    print(f"toml-test: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
