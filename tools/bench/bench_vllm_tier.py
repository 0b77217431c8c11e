#!/usr/bin/env python3
"""kvtier's vLLM tier against vLLM's own fs tier, through the same real vLLM manager, in one run.

Run by hand with the real vLLM 0.33.0 (./run.sh test-vllm makes build/venv-vllm):

    CUDA_VISIBLE_DEVICES= build/venv-vllm/bin/python tools/bench/bench_vllm_tier.py \\
        [--dirs /var/tmp,/dev/shm] [--chunks 2M,256K] [--data 512M] [--reps 3] [--json]

Each tier is built by vLLM's TieringOffloadingSpec from a user's JSON (kvtier: "type":
"KvtierTier", "module_path": "kvtier.vllm", sync relaxed; fs: "type": "fs", vLLM's defaults:
16 read and 16 write threads, O_DIRECT where the file system takes it) over the same CPU pool
(--cpu, vLLM's shared-memory region). Per file system, chunk size and rep, the two tiers run in
turn, the order swapped every rep, each on a fresh dir:

  store  GB/s: --data of chunks stored GPU -> CPU as requests of --req chunks (the CPU pool
         pre-filled, so no copy is timed), cascaded by vLLM to the tier, until every cascade
         has landed; vLLM evicts CPU chunks as the pool fills.
  load   GB/s: every chunk no longer in the CPU pool looked up as the scheduler does (a HIT
         in the tier starts a promotion), promoted back in rounds of half the pool, until
         each is a HIT in the CPU pool; the bytes promoted are checked after the clock stops.

Then, once per file system at the first chunk size: lookup latency (a HIT and a MISS, per
call, and for fs the time to its answer, as its lookups answer RETRY until a step has run
them), the disk space each dir takes (du), a restart (a new manager on the dir: of the
chunks not damaged, how many each finds and serves exactly), a flipped byte (what each serves for a chunk damaged on disk), and
a capacity limit (kvtier's capacity set to a quarter of the data; fs has none).

The machine is shared and busy: figures are min/median/max over the reps. Ratios are kvtier's
median over fs's.
"""

import argparse
import glob
import hashlib
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from vllm.v1.kv_offload.base import (LookupResult, ReqContext, ScheduleEndContext,
                                     make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                       OffloadingGroupConfig, OffloadingModelConfig,
                                       OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def size(text):
    text = text.strip().upper()
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def human(n):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{n} B"


_ids = iter(range(1 << 40))


class Engine:
    """vLLM's scheduler-side offloading: spec, CPU pool, one secondary tier, manager."""

    def __init__(self, tier, chunk, cpu_bytes):
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu_bytes,
                 "secondary_tiers": [tier]}
        bpc = 4
        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("l0",),
                                          group_id=0),),
            worker_kv_bytes_per_block=chunk // bpc, enable_kv_cache_events=False,
            extra_config=json.loads(json.dumps(extra)),
            engine_id=f"kvtier-bench-{os.getpid()}-{next(_ids)}",
            model=OffloadingModelConfig(name="bench/model", dtype="bfloat16"),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=bpc),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=False))
        self.spec = TieringOffloadingSpec(self.config)
        self.m = self.spec.get_manager()
        self.view = np.asarray(self.m.primary_tier.get_kv_memoryview()).view(np.uint8)
        self.n = self.view.shape[0]
        self.tier = self.m.secondary_tiers[0]
        self.reqs = {}
        self.slot_of = {}  # key -> the CPU slot its bytes were stored from

    def ctx(self, req):
        if req not in self.reqs:
            c = ReqContext(req_id=req)
            with self.m.lock:
                self.m.on_new_request(c)
            self.reqs[req] = c
        return self.reqs[req]

    def step(self):
        with self.m.lock:
            self.m.on_schedule_end(ScheduleEndContext((), ()))

    def settle(self):
        while True:
            self.step()
            with self.m.lock:
                if not self.m.has_pending_work():
                    return
            time.sleep(0.0005)

    def store(self, req, keys):
        """GPU -> CPU (the bytes already there but for a stamp of the key in the first 32, so
        no two chunks are alike), then vLLM's cascade; waits for room."""
        ctx = self.ctx(req)
        while True:
            with self.m.lock:
                out = self.m.prepare_store(keys, ctx)
            if out is not None:
                break
            self.step()  # the pool is pinned by cascades in flight
            time.sleep(0.0005)
        for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids):
            self.slot_of[k] = int(c)
            self.view[int(c), :32] = stamp(k)
        with self.m.lock:
            self.m.complete_store(keys, ctx)

    def stored_bytes(self, key):
        """What key was stored with: its slot's bytes (the slot may hold another key's by now,
        which differ in the stamp only)."""
        out = self.view[self.slot_of[key]].copy()
        out[:32] = stamp(key)
        return out

    def in_primary(self, key):
        ctx = self.ctx("probe")
        with self.m.lock:
            return self.m.primary_tier.lookup(key, ctx) is LookupResult.HIT

    def promote(self, req, keys):
        """Look keys up until each is a HIT in the CPU pool or a MISS: {key: hit}."""
        ctx = self.ctx(req)
        left, out = list(keys), {}
        while left:
            nxt = []
            for k in left:
                with self.m.lock:
                    r = self.m.lookup(k, ctx)
                if r is LookupResult.HIT or r is LookupResult.MISS:
                    out[k] = r is LookupResult.HIT
                else:
                    nxt.append(k)
            left = nxt
            if left:
                self.step()
                time.sleep(0.0005)
        return out

    def read(self, req, key):
        ctx = self.ctx(req)
        with self.m.lock:
            spec = self.m.prepare_load([key], ctx)
        data = self.view[int(spec.chunk_ids[0])].copy()
        with self.m.lock:
            self.m.complete_load([key], ctx)
        return data

    def close(self):
        for req, c in list(self.reqs.items()):
            with self.m.lock:
                self.m.on_request_finished(c)
        self.reqs.clear()
        self.settle()
        self.view = None
        self.m.shutdown()


def tier_config(kind, d, capacity):
    if kind == "kvtier":
        return {"type": "KvtierTier", "module_path": "kvtier.vllm", "dir": d,
                "capacity": capacity, "sync": "relaxed"}
    return {"type": "fs", "root_dir": d}


def stamp(key):
    return np.frombuffer(hashlib.sha256(bytes(key)).digest(), dtype=np.uint8)


def key_of(rep, i):
    return make_offload_key(hashlib.sha256(b"%d/%d" % (rep, i)).digest(), 0)


def du(d):
    r = subprocess.run(["du", "-sb", "--apparent-size", d], capture_output=True, text=True)
    apparent = int(r.stdout.split()[0]) if r.returncode == 0 else 0
    r = subprocess.run(["du", "-sk", d], capture_output=True, text=True)
    used = int(r.stdout.split()[0]) * 1024 if r.returncode == 0 else 0
    return used, apparent


def drop_caches(d):
    """Keep reads honest where the file system has a page cache to drop (not tmpfs)."""
    for path in glob.glob(os.path.join(d, "**", "*"), recursive=True):
        if os.path.isfile(path):
            try:
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            except OSError:
                pass


def fill(engine, seed):
    engine.view[:] = np.random.default_rng(seed).integers(0, 256, engine.view.shape,
                                                         dtype=np.uint8)


def one_run(kind, base, chunk, args, rep):
    """Store then load --data through one tier: (store s, load s, chunks loaded, ok, dir)."""
    d = tempfile.mkdtemp(prefix=f"{kind}-", dir=base)
    n = args.data // chunk
    cap = max(2 * args.data, 64 << 20)
    e = Engine(tier_config(kind, d, cap), chunk, args.cpu)
    fill(e, rep)
    keys = [key_of(rep, i) for i in range(n)]
    t0 = time.perf_counter()
    for r in range(0, n, args.req):
        e.store(f"s{r}", keys[r:r + args.req])
    e.settle()
    t_store = time.perf_counter() - t0
    expected = {k: e.stored_bytes(k) for k in keys if not e.in_primary(k)}
    e.close()
    drop_caches(d)
    # A fresh manager on the same dir (an engine restart): every chunk comes from the tier.
    e = Engine(tier_config(kind, d, cap), chunk, args.cpu)
    todo = [k for k in keys if k in expected]
    rounds = max(1, e.n // 2)
    t_load, ok = 0.0, 0
    for at in range(0, len(todo), rounds):
        part = todo[at:at + rounds]
        t0 = time.perf_counter()
        hits = e.promote(f"l{at}", part)
        t_load += time.perf_counter() - t0
        for k in part:  # checked after the clock stops
            ok += hits[k] and np.array_equal(e.read(f"l{at}", k), expected[k])
    e.close()
    return t_store, t_load, n, len(todo), ok, d


def extras(kind, base, chunk, args):
    """Lookup latency, disk use, restart, a flipped byte, a capacity limit: one dict."""
    out = {}
    d = tempfile.mkdtemp(prefix=f"{kind}-x-", dir=base)
    n = min(args.data // chunk, 64)
    cap = n * chunk // 4 + (1 << 20) if kind == "kvtier" else 0
    e = Engine(tier_config(kind, d, max(2 * n * chunk, 64 << 20)), chunk, args.cpu)
    fill(e, 99)
    keys = [key_of(10 ** 6, i) for i in range(n)]
    for r in range(0, n, args.req):
        e.store(f"s{r}", keys[r:r + args.req])
    e.settle()
    data = {k: e.stored_bytes(k) for k in keys}
    tier = e.tier
    ctx = ReqContext("lat")

    def resolve(key):
        t0 = time.perf_counter()
        while True:
            with e.m.lock:
                r = tier.lookup(key, ctx)
            if r is not LookupResult.RETRY:
                return time.perf_counter() - t0, r
            with e.m.lock:
                tier.on_schedule_end(ScheduleEndContext((), ()))

    for what, key in (("hit", keys[0]), ("miss", key_of(7, 7))):
        first = resolve(key)
        calls = []
        for _ in range(2000):
            t0 = time.perf_counter()
            with e.m.lock:
                tier.lookup(key, ctx)
            calls.append(time.perf_counter() - t0)
        out[f"lookup_{what}_first_us"] = first[0] * 1e6
        out[f"lookup_{what}_call_us"] = statistics.median(calls) * 1e6
        out[f"lookup_{what}_answer"] = first[1].name
    e.close()
    out["disk_used"], out["disk_apparent"] = du(d)
    out["data_bytes"] = n * chunk
    # A byte flipped in one stored chunk: what a restarted engine serves for it.
    victim = keys[n // 2]
    needle = data[victim][:4096].tobytes()
    flipped = False
    for path in glob.glob(os.path.join(d, "**", "*"), recursive=True):
        if not os.path.isfile(path) or os.path.getsize(path) < len(needle):
            continue
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
            at = m.find(needle)
            if at >= 0:
                m[at + 100] ^= 0x01
                m.flush()
                flipped = True
                break
    drop_caches(d)
    e = Engine(tier_config(kind, d, max(2 * n * chunk, 64 << 20)), chunk, args.cpu)
    got = {}  # key -> the bytes served, or None for a miss; in rounds the pool holds
    for at in range(0, n, max(1, e.n // 2)):
        part = keys[at:at + max(1, e.n // 2)]
        hits = e.promote(f"restart{at}", part)
        for k in part:
            got[k] = e.read(f"restart{at}", k) if hits[k] else None
    found = sum(got[k] is not None for k in keys if k != victim)
    exact = sum(got[k] is not None and np.array_equal(got[k], data[k])
                for k in keys if k != victim)
    out["restart_found"] = f"{found}/{n - 1}"
    out["restart_exact"] = f"{exact}/{n - 1}"
    if not flipped:
        out["flipped"] = "chunk not found on disk"
    elif got[victim] is None:
        out["flipped"] = "a miss (recomputed)"
    else:
        out["flipped"] = ("served exact (?)" if np.array_equal(got[victim], data[victim]) else
                          "SERVED WRONG BYTES "
                          f"({int((got[victim] != data[victim]).sum())} differ)")
    e.close()
    shutil.rmtree(d, ignore_errors=True)
    # A capacity: kvtier's set to a quarter of what is stored; fs takes all of it.
    d = tempfile.mkdtemp(prefix=f"{kind}-c-", dir=base)
    e = Engine(tier_config(kind, d, cap or 1 << 40), chunk, args.cpu)
    fill(e, 5)
    for r in range(0, n, args.req):
        e.store(f"c{r}", [key_of(2 * 10 ** 6, i) for i in range(r, min(n, r + args.req))])
        e.settle()
    found = sum(1 for i in range(n) if e.tier.lookup(key_of(2 * 10 ** 6, i), ctx)
                is LookupResult.HIT) if kind == "kvtier" else n
    e.close()
    used, _ = du(d)
    out["capacity"] = (f"limit {human(cap)}: {human(used)} on disk, {found}/{n} chunks kept"
                       if cap else f"no limit: {human(used)} on disk for {n} chunks")
    shutil.rmtree(d, ignore_errors=True)
    return out


def spread(values):
    return min(values), statistics.median(values), max(values)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dirs", default="/var/tmp,/dev/shm")
    ap.add_argument("--chunks", default="2M,256K")
    ap.add_argument("--data", default="512M", help="bytes stored per run")
    ap.add_argument("--cpu", default="128M", help="the CPU pool (cpu_bytes_to_use)")
    ap.add_argument("--req", type=int, default=16, help="chunks a request stores")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.data, args.cpu = size(args.data), size(args.cpu)
    rows, extra = [], {}
    load = [os.getloadavg()[0]]
    for base_dir in args.dirs.split(","):
        found = subprocess.run(["findmnt", "-n", "-o", "FSTYPE", "-T", base_dir],
                               capture_output=True, text=True).stdout.split()
        fs = found[0] if found else "?"  # the mount that serves the path: the first line
        base = tempfile.mkdtemp(prefix="kvtier-vllm-bench-", dir=base_dir)
        try:
            for ci, chunk in enumerate(size(c) for c in args.chunks.split(",")):
                got = {"kvtier": {"store": [], "load": []}, "fs": {"store": [], "load": []}}
                bad = {"kvtier": 0, "fs": 0}
                for rep in range(args.reps):
                    order = ["kvtier", "fs"] if rep % 2 == 0 else ["fs", "kvtier"]
                    for kind in order:
                        ts, tl, n, nl, ok, d = one_run(kind, base, chunk, args, rep)
                        got[kind]["store"].append(n * chunk / ts / 1e9)
                        got[kind]["load"].append(nl * chunk / tl / 1e9 if tl else 0.0)
                        bad[kind] += nl - ok
                        shutil.rmtree(d, ignore_errors=True)
                        print(f"  {fs} {human(chunk)} rep {rep} {kind}: store {ts:.2f} s, "
                              f"load {tl:.2f} s ({nl} chunks, {nl - ok} not exact)",
                              file=sys.stderr)
                for what in ("store", "load"):
                    k, f = spread(got["kvtier"][what]), spread(got["fs"][what])
                    rows.append({"fs": fs, "dir": base_dir, "chunk": chunk, "op": what,
                                 "kvtier": k, "vllm_fs": f, "ratio": k[1] / f[1] if f[1] else 0,
                                 "not_exact": bad})
                if ci == 0:
                    extra[fs] = {kind: extras(kind, base, chunk, args)
                                 for kind in ("kvtier", "fs")}
        finally:
            shutil.rmtree(base, ignore_errors=True)
    load.append(os.getloadavg()[0])
    if args.json:
        print(json.dumps({"rows": rows, "extras": extra, "load_average": load}, indent=1))
        return
    print(f"kvtier vs vLLM fs tier, through vLLM {__import__('vllm').__version__}'s "
          f"TieringOffloadingManager; {human(args.data)} a run, CPU pool {human(args.cpu)}, "
          f"{args.req} chunks a request, {args.reps} reps (A/B alternating); GB/s median "
          f"(min-max); {os.cpu_count()} CPUs, load average {load[0]:.1f} at the start, "
          f"{load[1]:.1f} at the end")
    print(f"{'fs':6} {'chunk':>9} {'op':5} {'kvtier':>20} {'vLLM fs':>20} {'ratio':>6}")
    for r in rows:
        k, f = r["kvtier"], r["vllm_fs"]
        print(f"{r['fs']:6} {human(r['chunk']):>9} {r['op']:5} "
              f"{k[1]:6.2f} ({k[0]:.2f}-{k[2]:.2f}) {f[1]:6.2f} ({f[0]:.2f}-{f[2]:.2f}) "
              f"{r['ratio']:6.2f}")
    for fs, by in extra.items():
        print(f"\n{fs}:")
        for key in by["kvtier"]:
            print(f"  {key:22} kvtier: {by['kvtier'][key]!s:38} fs: {by['fs'][key]!s}")


if __name__ == "__main__":
    main()
