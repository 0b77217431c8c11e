#!/usr/bin/env python3
"""kvtier against SGLang's own storage backends, through SGLang's own code (run it with the
Python of ./run.sh test-sglang: build/venv-sglang/bin/python).

Each backend is made by SGLang's storage backend factory and attached to SGLang's
HiCacheController over SGLang's real host pool (CPU tensors, pin_memory off), and timed
through the controller's own page functions, the ones its backup and prefetch threads call:
for kvtier `_page_set_zero_copy` / `_page_get_zero_copy` (interface_v1), for `file`
`_generic_page_set` / `_generic_page_get` (flat pages copied through the host pool's
get_data_page / set_from_flat_data_page), in batches of SGLang's STORAGE_BATCH_SIZE. Same host
pool, same pages, same batches, backends alternating rep by rep (kvtier first in even reps),
a fresh dir and fresh keys each rep, and a sync(2) after each backend's rep (untimed: the file
backend writes without fsync, and its writeback would fall on the next backend's timings).

Rows per backend: set pages/s; exists µs per page (batch_exists of 128 present keys); get
pages/s hot (right after the sets, as the page cache left them) and cold (the backend's files
dropped from the page cache first with POSIX_FADV_DONTNEED; on tmpfs the same as hot);
restart (a new backend attached to a new controller, then the query of every key: ms, and
the pages found); damaged (64 bytes overwritten once per page size across the backend's
files, then every page read: pages served with wrong bytes, pages missed). Every page read
in the timed gets is compared with what was set.

Page kinds: 8m (MHA, 64 tokens x 32 layers x 8 heads x 128, bf16: 8 MiB), 4.3m (MLA,
DeepSeek-V3's 64 tokens x 61 layers x 576, bf16: 4.29 MiB), 64k (MHA, 2 tokens x 16 layers
x 8 heads x 64: 64 KiB); also 128k and 256k (MHA, 2 and 4 tokens x 32 layers x 8 x 64).

Backends: kvtier, file, and mooncake (SGLang's Mooncake store over TCP on loopback, with a
mooncake_master this script starts from the mooncake-transfer-engine-non-cuda wheel: pages in
memory, so no cold, damaged rows; its restart is a new client of the same running master).

Usage: bench_sglang.py [--fs ext4=/tmp,tmpfs=/dev/shm] [--kinds 8m,4.3m,64k]
                       [--backends kvtier,file] [--reps 3] [--mb 192]
                       [--kvtier-sync durable|relaxed] [--json FILE]
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import torch

STORAGE_BATCH = 128
KVTIER_EXTRA = {}  # extra config keys for kvtier from the command line (--kvtier-sync)

KINDS = {  # name: (mla, page tokens, layers, heads, head_dim)
    "8m": (False, 64, 32, 8, 128),
    "4.3m": (True, 64, 61, 1, 576),
    "64k": (False, 2, 16, 8, 64),
    "128k": (False, 2, 32, 8, 64),
    "256k": (False, 4, 32, 8, 64),
}


def set_parallel():
    from sglang.srt.runtime_context import get_parallel

    get_parallel().override_permanently(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                        attn_dcp_size=1, attn_dcp_rank=0)


class Stack:
    """SGLang's device pool (CPU tensors), allocator and host pool for one page kind."""

    def __init__(self, kind, pages):
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        mla, page, layers, heads, dim = KINDS[kind]
        self.page, self.pages = page, pages
        tokens = pages * page
        if mla:
            self.dev = MLATokenToKVPool(size=tokens, page_size=page, dtype=torch.bfloat16,
                                        kv_lora_rank=512, qk_rope_head_dim=64, layer_num=layers,
                                        device="cpu", enable_memory_saver=False)
            info = self.dev.get_device_pool_infos()[0].buffer_info
            self.host = MLATokenToKVPoolHost(info, 2.0, 0, page, "page_first", pin_memory=False,
                                             device="cpu", device_capacity_tokens=tokens,
                                             start_layer=0, end_layer=layers,
                                             target_layer_num=layers)
        else:
            self.dev = MHATokenToKVPool(size=tokens, page_size=page, dtype=torch.bfloat16,
                                        head_num=heads, head_dim=dim, layer_num=layers,
                                        device="cpu", enable_memory_saver=False,
                                        enable_alt_stream=False)
            info = self.dev.get_device_pool_infos()[0].buffer_info
            self.host = MHATokenToKVPoolHost(info, 2.0, 0, page, "page_first", pin_memory=False,
                                             device="cpu", device_capacity_tokens=tokens,
                                             start_layer=0, end_layer=layers)
        self.alloc = TokenToKVPoolAllocator(tokens, torch.bfloat16, "cpu", self.dev, False)
        self.src = self.host.alloc(tokens)
        self.dst = self.host.alloc(tokens)
        self.host.kv_buffer.view(torch.uint8).random_()
        self.want = [self.page_bytes(self.src, p) for p in range(pages)]
        self.page_nbytes = len(self.want[0])

    def clear_dst(self, p=None):
        """Zero the destination pages (all, or page p), so a get that moved nothing shows."""
        pages = range(self.pages) if p is None else [p]
        for q in pages:
            ptrs, sizes = self.host.get_page_buffer_meta(self.dst[q * self.page:
                                                                  (q + 1) * self.page])
            for a, n in zip(ptrs, sizes):
                ctypes.memset(a, 0, n)

    def page_bytes(self, indices, p):
        ptrs, sizes = self.host.get_page_buffer_meta(indices[p * self.page:(p + 1) * self.page])
        return b"".join(ctypes.string_at(a, n) for a, n in zip(ptrs, sizes))

    def controller(self, backend, data_dir):
        from sglang.srt.managers.cache_controller import HiCacheController

        if backend == "kvtier":
            name, extra = "dynamic", {
                "backend_name": "kvtier", "module_path": "kvtier.sglang",
                "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "dir": data_dir,
                "capacity": str(4 * self.pages * self.page_nbytes), **KVTIER_EXTRA}
        elif backend == "file":
            name, extra = "file", {"file_storage_path": data_dir}
        elif backend == "mooncake":  # configured by the environment Mooncake.start sets
            name, extra = "mooncake", {}
        else:
            raise SystemExit(f"bench_sglang: unknown backend {backend}")
        return HiCacheController(self.alloc, self.host, self.page, None, threading.Event(),
                                 io_backend="direct", storage_backend=name,
                                 model_name="bench-org/bench-model",
                                 storage_backend_extra_config=extra)


class Mooncake:
    """A mooncake_master on loopback (its HTTP metadata server in the same process), from the
    mooncake-transfer-engine-non-cuda wheel, for SGLang's `mooncake` backend over TCP."""

    def __init__(self, segment_bytes):
        import subprocess

        import mooncake

        master = os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")
        rpc, http, metrics = 50151, 18080, 19003
        self.log = open(os.path.join(tempfile.gettempdir(), "kvt-bench-mooncake.log"), "w")
        self.proc = subprocess.Popen([master, "--enable_http_metadata_server=true",
                                      f"--http_metadata_server_port={http}",
                                      f"--rpc_port={rpc}", f"--metrics_port={metrics}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        os.environ.update(MOONCAKE_MASTER=f"127.0.0.1:{rpc}", MOONCAKE_PROTOCOL="tcp",
                          MOONCAKE_DEVICE="", MOONCAKE_LOCAL_HOSTNAME="127.0.0.1",
                          MOONCAKE_TE_META_DATA_SERVER=f"http://127.0.0.1:{http}/metadata",
                          MOONCAKE_GLOBAL_SEGMENT_SIZE=str(segment_bytes))
        time.sleep(3)  # its RPC and HTTP servers up
        if self.proc.poll() is not None:
            raise SystemExit("bench_sglang: mooncake_master did not start")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        os.unlink(self.log.name)


def drop_cache(data_dir):
    for root, _, files in os.walk(data_dir):
        for f in files:
            try:
                fd = os.open(os.path.join(root, f), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def damage(data_dir, stride):
    """64 bytes of 0x5a once per stride bytes across every data file (slabs, .bin files)."""
    for root, _, files in os.walk(data_dir):
        for f in files:
            path = os.path.join(root, f)
            if not (f.endswith(".slab") or f.endswith(".bin")):
                continue
            size = os.path.getsize(path)
            with open(path, "r+b") as fh:
                for at in range(min(stride // 2, size // 2), size, stride):
                    fh.seek(at)
                    fh.write(b"\x5a" * min(64, size - at))


def batches(n):
    return [(i, min(i + STORAGE_BATCH, n)) for i in range(0, n, STORAGE_BATCH)]


def one_rep(stack, backend, base, rep):
    from sglang.srt.managers.cache_controller import PrefetchOperation
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageExtraInfo

    data_dir = tempfile.mkdtemp(prefix=f"kvt-bench-sglang-{backend}-", dir=base)
    keys = [f"{rep:08x}{backend[:4].encode().hex():>8}{p:048x}" for p in range(stack.pages)]
    page, n, out = stack.page, stack.pages, {}
    ctl = stack.controller(backend, data_dir)
    try:
        be = ctl.storage_backend
        t = time.perf_counter()
        for a, b in batches(n):
            ok = ctl.page_set_func(keys[a:b], stack.src[a * page:b * page],
                                   HiCacheStorageExtraInfo(prefix_keys=keys[:a]))
            if not ok:
                raise SystemExit(f"bench_sglang: {backend} refused a set")
        out["set pages/s"] = n / (time.perf_counter() - t)
        lat = []
        for a, b in batches(n):
            t = time.perf_counter()
            found = be.batch_exists(keys[a:b])
            lat.append((time.perf_counter() - t) / (b - a) * 1e6)
            assert found == b - a, (backend, found)
        out["exists us/page"] = statistics.median(lat)
        op = PrefetchOperation(f"bench-{rep}", [0] * (n * page))
        for which in ("hot", "cold"):
            if which == "cold":
                if backend == "mooncake":
                    continue
                drop_cache(data_dir)
            stack.clear_dst()
            t = time.perf_counter()
            got = 0
            for a, b in batches(n):
                got += ctl.page_get_func(op, keys[a:b], stack.dst[a * page:b * page])
            out[f"get {which} pages/s"] = n / (time.perf_counter() - t)
            bad = sum(stack.page_bytes(stack.dst, p) != stack.want[p] for p in range(n))
            if got != n or bad:
                raise SystemExit(f"bench_sglang: {backend} got {got} of {n}, {bad} wrong")
    finally:
        ctl.detach_storage_backend()
    # A restart: a new controller and backend over the same dir, then every key asked for.
    t = time.perf_counter()
    ctl = stack.controller(backend, data_dir)
    try:
        found = sum(ctl.storage_backend.batch_exists(keys[a:b]) for a, b in batches(n))
        out["restart ms"] = (time.perf_counter() - t) * 1e3
        out["restart found"] = found
    finally:
        ctl.detach_storage_backend()
    if backend == "mooncake":  # memory only: nothing on a disk to damage
        shutil.rmtree(data_dir, ignore_errors=True)
        return out
    damage(data_dir, stack.page_nbytes)
    ctl = stack.controller(backend, data_dir)
    try:
        op = PrefetchOperation(f"bench-d-{rep}", [0] * (n * page))
        wrong = missed = 0
        for p in range(n):  # one at a time, so a miss does not hide the pages after it
            stack.clear_dst(p)
            ok = ctl.page_get_func(op, keys[p:p + 1], stack.dst[p * page:(p + 1) * page])
            if not ok:
                missed += 1
            elif stack.page_bytes(stack.dst, p) != stack.want[p]:
                wrong += 1
        out["damaged: served wrong"] = wrong
        out["damaged: missed"] = missed
    finally:
        ctl.detach_storage_backend()
        shutil.rmtree(data_dir, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fs", default="ext4=/tmp,tmpfs=/dev/shm")
    ap.add_argument("--kinds", default="8m,4.3m,64k")
    ap.add_argument("--backends", default="kvtier,file")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mb", type=float, default=192, help="megabytes of pages a rep")
    ap.add_argument("--kvtier-sync", choices=["durable", "relaxed"],
                    help="kvtier's sync mode (default: the backend's own default)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.kvtier_sync:
        KVTIER_EXTRA["sync"] = a.kvtier_sync
    import logging

    logging.disable(logging.WARNING)  # the file backend warns at every damaged or missed page
    set_parallel()
    backends = a.backends.split(",")
    mooncake = Mooncake(1 << 30) if "mooncake" in backends else None
    try:
        results = run_all(a, backends)
    finally:
        if mooncake:
            mooncake.stop()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


def run_all(a, backends):
    results = []
    for fs in a.fs.split(","):
        fs_name, base = fs.split("=")
        for kind in a.kinds.split(","):
            stack = None
            reps = {b: [] for b in backends}
            for rep in range(a.reps):
                if stack is None:
                    mla, page, layers, heads, dim = KINDS[kind]
                    per_page = page * layers * (dim * 2 if mla else 2 * heads * dim * 2)
                    stack = Stack(kind, max(8, int(a.mb * 1e6) // per_page))
                order = backends if rep % 2 == 0 else backends[::-1]
                for b in order:
                    reps[b].append(one_rep(stack, b, base, rep))
                    os.sync()  # the file backend never syncs: its writeback is its own cost
            for b in backends:
                row = {"fs": fs_name, "kind": kind, "page_bytes": stack.page_nbytes,
                       "pages": stack.pages, "backend": b, "reps": reps[b]}
                results.append(row)
                summary(row)
            del stack
    return results


def summary(row):
    print(f"{row['fs']:>5} {row['kind']:>4} ({row['page_bytes']} B x {row['pages']}) "
          f"{row['backend']}:", flush=True)
    for k in row["reps"][0]:
        v = sorted(r[k] for r in row["reps"] if k in r)
        print(f"    {k:24} min {v[0]:12.1f}  median {statistics.median(v):12.1f}  "
              f"max {v[-1]:12.1f}", flush=True)


if __name__ == "__main__":
    main()
