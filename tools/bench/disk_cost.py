#!/usr/bin/env python3
"""What a disk tier costs a replay: kvtier-bench with and without one, alternating, as ratios.

Runs the same kvtier-bench workload twice per rep: A without a disk tier, B with one (a fresh
data dir under --dir each time), one after the other, --reps times. Each run's wall time is the
bench's own (the replay, without open and close), its CPU time the process's user + sys
(os.wait4). Prints each rep and min / median / max of B / A for wall and CPU, and the tokens B
served from disk. With --busy a second replay (the same workload, without a disk tier) runs
beside every measured run, from its start to its end, so the figures hold on a loaded machine.

Usage: disk_cost.py [--bench PATH] [--dir DIR] [--reps N] [--busy] [--json]
                    -- KVTIER-BENCH-ARGS...
The kvtier-bench arguments name the workload and the tiers above the disk (a host tier is
needed); B adds --disk-tokens (--disk-tokens here, default 8,000,000) and --dir.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def summary(values):
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "..", "build", "tools",
                                                    "kvtier-bench"))
    ap.add_argument("--dir", default="/var/tmp", help="where the data dirs are made")
    ap.add_argument("--disk-tokens", type=int, default=8000000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--busy", action="store_true", help="a second replay runs beside each run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = [x for x in a.bench_args if x != "--"]
    if a.reps < 1:
        ap.error("--reps needs at least 1")
    work = tempfile.mkdtemp(prefix="kvtier-disk-cost.", dir=a.dir)
    reps = []
    try:
        for i in range(a.reps):
            ra, ua = run_timed(a.bench, args, a.busy and args)
            d = os.path.join(work, "data")
            shutil.rmtree(d, ignore_errors=True)
            rb, ub = run_timed(a.bench, args + ["--disk-tokens", str(a.disk_tokens), "--dir", d],
                               a.busy and args)
            shutil.rmtree(d, ignore_errors=True)
            rep = {"wall_a": ra["seconds"], "wall_b": rb["seconds"], "cpu_a": ua, "cpu_b": ub,
                   "disk_tokens_hit": rb["tokens_hit"]["disk"],
                   "disk_errors": rb["disk_errors"],
                   "mismatches": ra["verify"]["mismatches"] + rb["verify"]["mismatches"],
                   "store_page_tokens": rb["config"]["store_page_tokens"]}
            rep["wall_ratio"] = rep["wall_b"] / rep["wall_a"]
            rep["cpu_ratio"] = rep["cpu_b"] / rep["cpu_a"]
            reps.append(rep)
            if not a.json:
                print(f"rep {i + 1}: without {rep['wall_a']:.2f} s (CPU {ua:.2f} s), with "
                      f"{rep['wall_b']:.2f} s (CPU {ub:.2f} s): {rep['wall_ratio']:.2f}x wall, "
                      f"{rep['cpu_ratio']:.2f}x CPU; disk hits {rep['disk_tokens_hit']}, "
                      f"disk errors {rep['disk_errors']}, mismatches {rep['mismatches']}",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res = {"busy": a.busy, "bench_args": args, "disk_tokens": a.disk_tokens, "reps": reps,
           "wall_ratio": summary([r["wall_ratio"] for r in reps]),
           "cpu_ratio": summary([r["cpu_ratio"] for r in reps])}
    if a.json:
        print(json.dumps(res))
    else:
        w, c = res["wall_ratio"], res["cpu_ratio"]
        print(f"with / without a disk tier{' (a second replay beside)' if a.busy else ''}: "
              f"wall {w['min']:.2f} / {w['median']:.2f} / {w['max']:.2f}, "
              f"CPU {c['min']:.2f} / {c['median']:.2f} / {c['max']:.2f} (min / median / max "
              f"of {len(reps)})")
    bad = any(r["mismatches"] or r["disk_errors"] for r in reps)
    return 1 if bad else 0


def run_timed(bench, args, busy_args):
    """(report with its "seconds", CPU seconds of the process)."""
    beside = None
    if busy_args:
        beside = subprocess.Popen([bench, *busy_args, "--json"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    p = subprocess.Popen([bench, *args, "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    if beside is not None:
        beside.kill()
        beside.wait()
    if status != 0:
        sys.exit(f"disk_cost.py: kvtier-bench {' '.join(args)} failed: {err.strip()[-400:]}")
    return json.loads(out), usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    sys.exit(main())
