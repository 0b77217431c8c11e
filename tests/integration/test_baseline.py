#!/usr/bin/env python3
"""The engine's behaviour, pinned: usage: test_baseline.py PATH-TO-KVTIER-BENCH [--record]

A fixed set of kvtier-bench runs (device only, a host tier, a disk tier twice on one dir, each
write policy, each eviction policy, MHA and MLA, pages of 1, 16 and 64 tokens, on the shared
traces and the synthetic workloads) whose --json reports were recorded before the code was
reorganised (baseline/*.json, by --record). Each case runs one again and compares it with its
record field by field: tokens per tier, computed and decoded, evictions per tier, bytes per
path, disk errors, pages verified; times are left out, and mismatches must be 0.

What lands when depends on timing as well as on the code (a restart's backups follow which
host leaves an eviction finds free of loads still in flight), so the runs use --deterministic:
the sim backend copies each transfer as it is submitted and every transfer and disk op lands
before the next request, and a run repeats exactly. The disk runs keep a store page to a page
(--store-page-tokens of the page size: the default before 0.9, when these were recorded). Recording runs
each case REPEATS times and keeps each field's range; a field that never moved must come out
the same, one that moved (none did when this was written) must stay within what was seen.

A change that alters what the engine does on purpose records again (--record) in the same
commit and says why; a change that only moves code must leave every field as it was.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from harness import case, check, eq
import harness

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDS = os.path.join(HERE, "baseline")
# The first requests of shared/traces (as many as the runs replay), kept in the repo so the
# test needs nothing outside it.
TRACES = os.path.join(HERE, "baseline", "traces")
BENCH = None
TMP = None

CONV = ["--trace", os.path.join(TRACES, "mooncake_conversation.jsonl")]
SYNTH = ["--trace", os.path.join(TRACES, "mooncake_synthetic.jsonl")]
SMALL = ["--device-tokens", "32768"]
HOST = SMALL + ["--host-tokens", "131072"]
MLA = ["--geometry", "attention=mla,layers=2,kv_lora_rank=32,qk_rope_head_dim=16,dtype_bytes=2"]

# name -> (arguments, runs on one dir): a second run on the same dir is the restart.
RUNS = {
    "device-mixed": (["--synthetic", "mixed", "--requests", "300"] + SMALL, 1),
    "device-conversation": (CONV + ["--requests", "150", "--device-tokens", "262144"], 1),
    "host-chat": (["--synthetic", "chat", "--requests", "300"] + HOST, 1),
    "host-synthetic-trace": (SYNTH + ["--requests", "60", "--device-tokens", "262144",
                                      "--host-tokens", "1048576"], 1),
    "disk-docqa": (["--synthetic", "docqa", "--requests", "120"] + HOST +
                   ["--disk-tokens", "200000"], 2),
    "disk-conversation": (CONV + ["--requests", "120", "--device-tokens", "262144",
                                  "--host-tokens", "524288", "--disk-tokens", "2000000"], 2),
    "write-selective": (["--synthetic", "mixed", "--requests", "300", "--write-policy",
                         "write_through_selective"] + HOST, 1),
    "write-back": (["--synthetic", "mixed", "--requests", "300", "--write-policy",
                    "write_back"] + HOST, 1),
    "evict-lfu": (["--synthetic", "chat", "--requests", "300", "--evict-policy", "lfu"] + HOST, 1),
    "evict-fifo": (["--synthetic", "chat", "--requests", "300", "--evict-policy", "fifo"] +
                   HOST, 1),
    "evict-mru": (["--synthetic", "chat", "--requests", "300", "--evict-policy", "mru"] + HOST, 1),
    "evict-filo": (["--synthetic", "chat", "--requests", "300", "--evict-policy", "filo"] +
                   HOST, 1),
    "mla-host": (["--synthetic", "mixed", "--requests", "200"] + MLA + HOST, 1),
    "mla-disk": (["--synthetic", "chat", "--requests", "150"] + MLA + HOST +
                 ["--disk-tokens", "100000"], 2),
    "page-1": (["--synthetic", "chat", "--requests", "150", "--page-size", "1"] + HOST, 1),
    "page-64": (["--synthetic", "mixed", "--requests", "200", "--page-size", "64"] + HOST, 1),
    "page-64-disk": (["--synthetic", "chat", "--requests", "150", "--page-size", "64"] + HOST +
                     ["--disk-tokens", "200000"], 2),
}

REPEATS = 5  # runs per case when recording

# The report's fields that are behaviour; the rest (times, rates, paths) are not.
FIELDS = ["requests", "tokens_total", "tokens_hit", "tokens_computed", "tokens_decoded",
          "tokens_evicted", "bytes", "disk_errors"]


def run(name):
    """The reports of name's runs, in order, as the fields compared."""
    args, times = RUNS[name]
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    if any(a == "--disk-tokens" for a in args):
        page = args[args.index("--page-size") + 1] if "--page-size" in args else "16"
        args = args + ["--dir", d, "--store-page-tokens", page]
    out = []
    for i in range(times):
        r = subprocess.run([BENCH, *args, "--deterministic", "--json"], capture_output=True, text=True,
                           timeout=300)
        eq(r.returncode, 0, f"{name} run {i + 1}: exit status ({r.stderr[-300:]!r})")
        j = json.loads(r.stdout)
        eq(j["verify"]["mismatches"], 0, f"{name} run {i + 1}: mismatches")
        rec = {k: j[k] for k in FIELDS}
        rec["pages_checked"] = j["verify"]["pages_checked"]
        out.append(rec)
    shutil.rmtree(d, ignore_errors=True)
    return out


def flatten(rec, where=""):
    """{"path": number} for every number in a report."""
    if isinstance(rec, dict):
        out = {}
        for k, v in rec.items():
            out.update(flatten(v, f"{where}.{k}" if where else k))
        return out
    if isinstance(rec, list):
        out = {}
        for i, v in enumerate(rec):
            out.update(flatten(v, f"{where}[{i}]"))
        return out
    return {where: rec}


def ranges(runs):
    """Each field's [least, most] over repeated runs of a case."""
    flat = [flatten(r) for r in runs]
    return {k: [min(f[k] for f in flat), max(f[k] for f in flat)] for k in flat[0]}


def diff(got, want):
    """The fields outside their recorded range, as lines."""
    g = flatten(got)
    lines = [f"{k}: missing" for k in want if k not in g]
    lines += [f"{k}: not recorded" for k in g if k not in want]
    for k, (lo, hi) in sorted(want.items()):
        if k in g and not lo <= g[k] <= hi:
            lines.append(f"{k}: {g[k]} (recorded {lo})" if lo == hi else
                         f"{k}: {g[k]} (recorded {lo}..{hi})")
    return lines


def record_path(name):
    return os.path.join(RECORDS, name + ".json")


def make_case(name):
    @case(f"{name}: every field as recorded")
    def _():
        with open(record_path(name)) as f:
            want = json.load(f)
        got = run(name)
        lines = diff(got, want)
        check(not lines, "differs from its record:\n      " + "\n      ".join(lines[:20]))


def main():
    global BENCH, TMP
    recording = "--record" in sys.argv
    if recording:
        sys.argv.remove("--record")
    BENCH = harness.program_arg(sys.argv[0], "PATH-TO-KVTIER-BENCH [--record]")
    if not BENCH:
        return 2
    TMP = tempfile.mkdtemp(prefix="kvtier-baseline-")
    t0 = time.monotonic()
    try:
        if recording:
            os.makedirs(RECORDS, exist_ok=True)
            for name in RUNS:
                rec = ranges([run(name) for _ in range(REPEATS)])
                with open(record_path(name), "w") as f:
                    json.dump(rec, f, indent=1, sort_keys=True)
                    f.write("\n")
                moved = [k for k, (lo, hi) in rec.items() if lo != hi]
                print(f"recorded {name}" + (f" (moved: {', '.join(moved)})" if moved else ""))
            return 0
        for name in RUNS:
            make_case(name)
        failed, _ = harness.run_cases()
        return harness.summary(failed, t0)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
