#!/usr/bin/env python3
"""The page store through Python against the same store through C, in one run.

Runs build/tools/kvtier-pagestore-bench (the C baseline) and the same workload through the
kvtier package, rep by rep in turn (so that the machine's drifts hit both), as SGLang's
backend calls it: batches of --batch pages, each page
--segments regions given as (address, nbytes) pairs, one set and one get call per batch,
fresh keys per rep, the dir reopened between the sets and the gets. Prints pages/s and GB/s
of both and the ratio Python / C (target: at least 0.90 at 128 pages per call).

Usage: bench_pagestore.py [--c-bench PATH] [--dir DIR] [--page-bytes N] [--segments N]
                          [--batch N] [--pages N] [--reps N] [--json]
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import kvtier

TARGET = 0.90


def python_rep(args, base, rep, mem, back):
    """One rep through the package: (set seconds, get seconds)."""
    page, segs = args.page_bytes, args.segments
    seg = page // segs
    sizes_one = [seg] * (segs - 1) + [page - seg * (segs - 1)]
    d = os.path.join(base, f"kvt-pagestore-pybench-{os.getpid()}-{rep}")
    keys = [rep.to_bytes(8, "little") + i.to_bytes(8, "little") + b"pykvtier" * 2
            for i in range(args.pages)]
    capacity = (args.pages + args.batch) * (page + (64 << 10))

    def batches(base_addr, moving):
        for at in range(0, args.pages, args.batch):
            n = min(args.batch, args.pages - at)
            start = base_addr + (at * page if moving else 0)
            ptrs = [start + i * page + k * seg for i in range(n) for k in range(segs)]
            yield keys[at:at + n], ptrs, sizes_one * n

    store = kvtier.PageStore(d, b"kvtier-pagestore-bench", page, capacity=capacity)
    t = time.perf_counter()
    for k, p, s in batches(ctypes.addressof(mem), True):
        res = store.set(k, p, s, segs)
        if any(res):
            sys.exit(f"bench_pagestore: a set failed: {res}")
    set_s = time.perf_counter() - t
    store.close()
    store = kvtier.PageStore(d, b"kvtier-pagestore-bench", page, capacity=capacity)
    t = time.perf_counter()
    for k, p, s in batches(ctypes.addressof(back), False):
        res = store.get(k, p, s, segs)
        if any(res):
            sys.exit(f"bench_pagestore: a get failed: {res}")
    get_s = time.perf_counter() - t
    last = (args.pages - 1) // args.batch * args.batch
    n = args.pages - last
    if bytes(back)[:n * page] != bytes(mem)[last * page:(last + n) * page]:
        sys.exit("bench_pagestore: a page read back differs from the page stored")
    store.clear()
    store.close()
    shutil.rmtree(d, ignore_errors=True)
    return set_s, get_s


def c_rep(args, common):
    """One rep of the C bench: (set seconds, get seconds)."""
    out = subprocess.run([args.c_bench] + common + ["--reps", "1", "--json"], check=True,
                         capture_output=True, text=True).stdout
    j = json.loads(out)
    return j["set"]["median_s"], j["get"]["median_s"]


def figures(args, times):
    b = args.pages * args.page_bytes
    med = {op: statistics.median(t[i] for t in times) for i, op in enumerate(("set", "get"))}
    return {op: {"pages_per_s": args.pages / m, "gbps": b / m / 1e9, "median_s": m}
            for op, m in med.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--c-bench", default=os.path.join(here, "..", "..", "build", "tools",
                                                      "kvtier-pagestore-bench"))
    ap.add_argument("--dir", default="/dev/shm" if os.access("/dev/shm", os.W_OK) else "/tmp")
    ap.add_argument("--page-bytes", type=int, default=65536)
    ap.add_argument("--segments", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--pages", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    common = ["--dir", args.dir, "--page-bytes", str(args.page_bytes), "--segments",
              str(args.segments), "--batch", str(args.batch), "--pages", str(args.pages)]
    if not os.access(args.c_bench, os.X_OK):
        sys.exit(f"bench_pagestore: no C bench at {args.c_bench}: build it (ninja -C build)")
    mem = (ctypes.c_uint8 * (args.pages * args.page_bytes))()
    back = (ctypes.c_uint8 * (args.batch * args.page_bytes))()
    chunk = os.urandom(1 << 20)
    for at in range(0, len(mem), len(chunk)):
        n = min(len(chunk), len(mem) - at)
        ctypes.memmove(ctypes.addressof(mem) + at, chunk, n)
    ctypes.memset(back, 1, len(back))  # touched, as the C bench's buffers are
    c_times, py_times = [], []
    for rep in range(args.reps):  # C and Python alternate, so drifts hit both alike
        c_times.append(c_rep(args, common))
        py_times.append(python_rep(args, args.dir, rep, mem, back))
    c, py = figures(args, c_times), figures(args, py_times)
    ratio = {op: py[op]["pages_per_s"] / c[op]["pages_per_s"] for op in ("set", "get")}
    out = {"config": {k: getattr(args, k) for k in ("page_bytes", "segments", "batch", "pages",
                                                    "reps", "dir")},
           "c": c, "python": py, "ratio": ratio,
           "target": TARGET}
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.pages} pages of {args.page_bytes} bytes in {args.segments} segments, "
          f"{args.batch} per call, median of {args.reps}, in {args.dir}:")
    for op in ("set", "get"):
        print(f"  {op}  C {c[op]['pages_per_s']:9.0f} pages/s {c[op]['gbps']:6.3f} GB/s   "
              f"Python {py[op]['pages_per_s']:9.0f} pages/s {py[op]['gbps']:6.3f} GB/s   "
              f"Python/C {ratio[op]:.2f} (target {TARGET}: "
              f"{'met' if ratio[op] >= TARGET else 'MISSED'})")


if __name__ == "__main__":
    main()
