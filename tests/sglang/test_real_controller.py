"""kvtier under SGLang 0.5.23's own cache controllers (./run.sh test-sglang).

HiCacheController and HybridCacheController are built on the CPU over SGLang's real pools (see
rig.py): their prefetch, prefetch-I/O, prefetch-sync and backup threads call kvtier through
SGLang's storage factory, as in a server. Checked: MHA and MLA KV in the three layouts; hybrid
groups (KV + Mamba states + sliding-window KV; MLA with a DSA indexer + Mamba) through the v2
calls, with SGLang's hit policies deciding what is restorable; backups racing prefetches; damaged
slabs (misses, never wrong bytes); another model or layout refused; a restart in a new process;
TP 2 over gloo in two processes (MHA: a dir per rank; MLA: rank 0 writes, both read; Mamba states
per rank). Every page loaded is compared byte for byte with what was backed up.

Not real here: no GPU (device pools are CPU tensors; no page moves between device and host), no
model, no radix tree or scheduler (rig.Driver does the scheduler's part of the protocol).
"""

import os
import shutil
import socket
import tempfile
import threading
import time
import traceback
import unittest

import torch
import torch.multiprocessing as mp

import rig
from rig import Geometry, fill, page_bytes, region_bytes, seed_of

from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

TRAILING, ALL = PoolHitPolicy.TRAILING_PAGES, PoolHitPolicy.ALL_PAGES
SWA_WINDOW = 2  # pages of sliding-window KV a prefix needs at its end


def kv_pages(host, indices, page):
    """A KV span's bytes, page by page, through the pool's zero-copy description."""
    return [region_bytes(host, indices[i:i + page]) for i in range(0, len(indices), page)]


class HybridStack:
    """A hybrid group on SGLang's real pools: MHA KV + Mamba + SWA, or MLA (DSA) KV + its
    indexer + Mamba; and the chains backed up through it, to check loads against."""

    def __init__(self, data_dir, mla=False, layout="page_first", tp_rank=0, tp_size=1,
                 tp_group=None, salt=0, tokens=1024, **extra):
        # DSA wants pages of 64 tokens
        self.g, self.mla = Geometry(page=64 if mla else 16, tokens=tokens), mla
        if mla:
            self.kv_dev, self.kv = rig.mla_pools(self.g, layout, dsa=True)
            self.side = rig.indexer_host(self.kv_dev, self.kv)
            side_entry = rig.entry(PoolName.INDEXER, self.side, self.kv_dev, self.g.layers)
        else:
            self.kv_dev, self.kv = rig.mha_pools(self.g, layout)
            self.side_dev, self.side = rig.mha_pools(self.g, layout, layers=2)  # window layers
            side_entry = rig.entry(PoolName.SWA, self.side, self.side_dev, 2)
        self.m_dev, self.mamba = rig.mamba_pools("page_first", tp_size=tp_size)
        entries = [rig.entry(PoolName.KV, self.kv, self.kv_dev, self.g.layers, anchor=True),
                   side_entry, rig.entry(PoolName.MAMBA, self.mamba, self.m_dev, 2)]
        self.ctl = rig.hybrid_controller(self.kv_dev, entries, self.g,
                                         rig.extra_config(data_dir, **extra), tp_group=tp_group)
        self.drv = rig.Driver(self.ctl)
        # KV bytes: a function of the page's key and salt (MHA ranks hold their own heads:
        # salt = rank; MLA ranks the same bytes). Mamba states: each rank's own.
        self.salt, self.rank = salt, tp_rank

    def close(self):
        self.ctl.detach_storage_backend()

    def side_name(self):
        return PoolName.INDEXER if self.mla else PoolName.SWA

    def backup(self, tokens):
        """Fill a chain's KV pages, its window pages (SWA) or indexer pages, and its Mamba
        state at the end, and back them up through the controller; returns the KV tokens
        stored and what a load must give back."""
        want, kv_idx, pools = self.stage(tokens)
        stored, _ = self.drv.backup(kv_idx, tokens, extra_pools=pools)
        return stored, want

    def stage(self, tokens):
        """The host pages of a chain, filled, and the pool transfers that back them up."""
        g, n, keys = self.g, len(tokens) // self.g.page, self.drv.keys(tokens)
        kv_idx = self.kv.alloc(len(tokens))
        for p in range(n):
            fill(self.kv, int(kv_idx[p * g.page]), seed_of(keys[p], self.salt))
        want = {"kv": kv_pages(self.kv, kv_idx, g.page)}
        m_idx = self.mamba.alloc(1)
        want["mamba"] = fill(self.mamba, int(m_idx[0]), seed_of(keys[-1], 7 + self.rank))
        pools = [PoolTransfer(PoolName.MAMBA, host_indices=m_idx, keys=keys[-1:],
                              hit_policy=TRAILING)]
        if self.mla:
            for p in range(n):
                fill(self.side, int(kv_idx[p * g.page]), seed_of(keys[p], 3))
            want["side"] = [page_bytes(self.side, int(kv_idx[p * g.page])) for p in range(n)]
            pools.append(PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV,
                                      hit_policy=ALL))
        else:
            s_idx = self.side.alloc(SWA_WINDOW * g.page)
            for p in range(SWA_WINDOW):
                fill(self.side, int(s_idx[p * g.page]),
                     seed_of(keys[n - SWA_WINDOW + p], 5 + self.salt))
            want["side"] = kv_pages(self.side, s_idx, g.page)
            pools.append(PoolTransfer(PoolName.SWA, host_indices=s_idx,
                                      keys=keys[-SWA_WINDOW:], hit_policy=TRAILING))
        return want, kv_idx, pools

    def prefetch_pools(self):
        pools = [PoolTransfer(PoolName.MAMBA, keys=["__placeholder__"], hit_policy=TRAILING)]
        if self.mla:
            pools.append(PoolTransfer(PoolName.INDEXER, indices_from_pool=PoolName.KV,
                                      hit_policy=ALL))
        else:
            pools.append(PoolTransfer(PoolName.SWA, keys=["__placeholder__"] * SWA_WINDOW,
                                      hit_policy=TRAILING))
        return pools

    def load(self, tokens, rid="r"):
        """Prefetch a chain; returns (hit, loaded, the pools' hits, the bytes loaded), and
        gives the host slots back."""
        g = self.g
        hit, loaded, pool_hits, kv_idx, op = self.drv.prefetch(tokens, self.prefetch_pools(),
                                                               rid=rid)
        got = {"kv": kv_pages(self.kv, kv_idx[:loaded], g.page) if loaded else []}
        for t in op.pool_transfers or []:
            if t.host_indices is None or t.indices_from_pool is not None:
                continue
            if t.name == PoolName.MAMBA:
                got["mamba"] = page_bytes(self.mamba, int(t.host_indices[0]))
            elif t.name == PoolName.SWA:
                got["side"] = kv_pages(self.side, t.host_indices, g.page)
            self.ctl.mem_pool_host.entry_map[t.name].host_pool.free(t.host_indices)
        if self.mla and loaded:
            got["side"] = [page_bytes(self.side, int(kv_idx[p * g.page]))
                           for p in range(loaded // g.page)]
        if kv_idx is not None:
            self.kv.free(kv_idx)
        # the controller reports every pool SGLang names; these are the ones here
        mine = {k: v for k, v in pool_hits.items() if k in ("mamba", "swa")}
        return hit, loaded, mine, got


def differences(got, want):
    """Where two loads differ (pool, page), never their bytes (a diff of megabytes is slow
    and useless)."""
    out = []
    for pool in sorted(set(got) | set(want)):
        g, w = got.get(pool), want.get(pool)
        if isinstance(w, list) and isinstance(g, list):
            out += [(pool, i) for i in range(max(len(g), len(w)))
                    if i >= len(g) or i >= len(w) or g[i] != w[i]]
            if len(g) != len(w):
                out.append((pool, f"{len(g)} pages for {len(w)}"))
        elif g != w:
            out.append((pool, "missing" if g is None or w is None else "differs"))
    return out


class Base(unittest.TestCase):
    def assertSame(self, got, want, msg=None):
        self.assertEqual(differences(got, want), [], msg)

    def setUp(self):
        rig.set_parallel()
        self.dir = tempfile.mkdtemp(prefix="kvt-sglang-ctl-")
        self.closers = []

    def tearDown(self):
        for c in reversed(self.closers):
            try:
                c()
            except Exception:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def own(self, closer):
        self.closers.append(closer)


class Controller(Base):
    def kv_round_trip(self, mla, layout):
        g = Geometry()
        dev, host = (rig.mla_pools if mla else rig.mha_pools)(g, layout)
        data_dir = os.path.join(self.dir, f"{'mla' if mla else 'mha'}-{layout}")
        ctl = rig.controller(dev, host, g, rig.extra_config(data_dir))
        self.own(ctl.detach_storage_backend)
        drv = rig.Driver(ctl)
        tokens = list(range(1000, 1000 + 12 * g.page))
        keys = drv.keys(tokens)
        src = host.alloc(len(tokens))
        for p in range(12):
            fill(host, int(src[p * g.page]), seed_of(keys[p]))
        want = kv_pages(host, src, g.page)
        stored, _ = drv.backup(src, tokens)
        self.assertEqual(stored, len(tokens))
        hit, loaded, _, dst, _ = drv.prefetch(tokens)
        self.assertEqual((hit, loaded), (len(tokens), len(tokens)))
        self.assertSame({"kv": kv_pages(host, dst, g.page)}, {"kv": want})
        # A prompt that shares the first 5 pages: a hit of 5 pages, loaded exact.
        other = tokens[:5 * g.page] + [7] * (3 * g.page)
        hit, loaded, _, dst, _ = drv.prefetch(other, rid="r2")
        self.assertEqual((hit, loaded), (5 * g.page, 5 * g.page))
        self.assertSame({"kv": kv_pages(host, dst, g.page)}, {"kv": want[:5]})
        print(f"  {'MLA' if mla else 'MHA'} {layout}: {len(want[0])} B pages, 12 backed up "
              "and loaded exact by the controller's threads")

    def test_mha_layouts(self):
        for layout in ("page_first", "page_first_direct", "layer_first"):
            with self.subTest(layout=layout):
                self.kv_round_trip(False, layout)

    def test_mla_layouts(self):
        for layout in ("page_first", "page_first_direct", "layer_first"):
            with self.subTest(layout=layout):
                self.kv_round_trip(True, layout)

    def hybrid_round_trip(self, mla):
        s = HybridStack(self.dir, mla=mla)
        self.own(s.close)
        names = sorted(s.ctl.storage_backend.pools)
        page = s.g.page
        a = list(range(8 * page))
        stored, want_a = s.backup(a)
        self.assertEqual(stored, len(a))
        hit, loaded, pool_hits, got = s.load(a)
        self.assertEqual((hit, loaded), (len(a), len(a)))
        self.assertSame(got, want_a)
        # b extends a by 4 pages and has its own state: restorable at 8 (a's state) or 12.
        b = a + list(range(5000, 5000 + 4 * page))
        stored, want_b = s.backup(b)
        hit, loaded, pool_hits, got = s.load(b, rid="b")
        self.assertEqual((hit, loaded), (len(b), len(b)))
        self.assertSame(got, want_b)
        # c shares b's first 10 pages only: no state at 9 or 10, so a's end (8) is what is
        # restorable, with a's state.
        c = b[:10 * page] + [3] * (2 * page)
        hit, loaded, pool_hits, got = s.load(c, rid="c")
        self.assertEqual((hit, loaded), (len(a), len(a)))
        self.assertSame({"mamba": got["mamba"], "kv": got["kv"]},
                        {"mamba": want_a["mamba"], "kv": want_b["kv"][:8]})
        if not mla:
            self.assertSame({"side": got["side"]}, {"side": want_a["side"]})
        # Nothing stored: no hit.
        hit, *_ = s.load([9] * (4 * page), rid="d")
        self.assertEqual(hit, 0)
        print(f"  hybrid {'MLA + DSA indexer' if mla else 'MHA + SWA'} + Mamba: pools {names}; "
              "prefixes restorable only at a stored state, every pool's bytes exact")

    def test_hybrid_mha_swa_mamba(self):
        self.hybrid_round_trip(False)

    def test_hybrid_mla_indexer_mamba(self):
        self.hybrid_round_trip(True)

    def test_backups_race_prefetches(self):
        """Backups of 24 chains of 16 pages, each prefetched as soon as it is queued (and all
        again until each loaded whole) while the backup thread writes: every hit is whole (a
        chain's state is at its end) and loads exact."""
        s = HybridStack(self.dir, tokens=4096)
        self.own(s.close)
        page, chains, n, want, pending = s.g.page, 24, 16, {}, []
        loaded_whole, misses, beside = set(), 0, 0

        def try_load(c, rid):
            nonlocal misses
            hit, loaded, _, got = s.load(pending[c], rid=rid)
            if hit == 0:
                misses += 1
                return
            self.assertEqual((hit, loaded), (n * page, n * page), c)
            self.assertSame(got, want[c], c)
            loaded_whole.add(c)

        for c in range(chains):
            tokens = [c * 100000 + t for t in range(n * page)]
            want[c], kv_idx, pools = s.stage(tokens)
            s.ctl.write_storage(kv_idx, tokens, hash_value=s.drv.keys(tokens), prefix_keys=[],
                                extra_pools=pools)
            pending.append(tokens)
            beside += s.ctl.ack_backup_queue.qsize() <= c  # this backup not done yet
            try_load(c, f"{c}.0")
        deadline, rounds = time.monotonic() + 120, 0
        while len(loaded_whole) < chains and time.monotonic() < deadline:
            rounds += 1
            for c in range(chains):
                if c not in loaded_whole:
                    try_load(c, f"{c}.{rounds}")
        self.assertEqual(len(loaded_whole), chains, "chains never restorable")
        self.assertGreater(beside, 0, "no prefetch ran beside a backup in flight")
        for _ in range(chains):
            op = rig._get(s.ctl.ack_backup_queue, "backup ack")
            self.assertEqual(op.completed_tokens, n * page)
        print(f"  {chains} chains backed up while prefetched: {beside} prefetches beside their "
              f"chain's backup, {misses} misses, every hit whole and exact")

    def test_damaged_kv_slabs(self):
        s = HybridStack(self.dir)
        page = s.g.page
        tokens = list(range(40 * page))  # 40 pages of 32 KiB
        stored, want = s.backup(tokens)
        self.assertEqual(stored, len(tokens))
        kv_dir = s.ctl.storage_backend.dir
        s.close()
        hurt = rig.damage(kv_dir, every=96 << 10)
        self.assertGreater(hurt, 0)
        s2 = HybridStack(self.dir)
        self.own(s2.close)
        hit, loaded, pool_hits, got = s2.load(tokens)
        self.assertEqual(hit, len(tokens))  # the index still names every page
        self.assertLess(loaded, len(tokens), "no page met the damage")
        self.assertSame({"kv": got["kv"]}, {"kv": want["kv"][:loaded // page]})
        self.assertEqual(pool_hits, {"mamba": 0, "swa": 0})  # they wait for the whole KV span
        # Asked again: the pages that failed their checks are gone, so the KV run stops at
        # the first, where no Mamba state is: nothing is restorable.
        hit2, *_ = s2.load(tokens, rid="again")
        self.assertEqual(hit2, 0)
        print(f"  {hurt} bytes of the KV slabs damaged: {loaded // page} of 40 pages loaded "
              "before the first bad one, all exact; asked again, no hit")

    def test_damaged_side_pool_slabs(self):
        s = HybridStack(self.dir)
        tokens = list(range(6 * s.g.page))
        stored, want = s.backup(tokens)
        side_dirs = [p.dir for p in s.ctl.storage_backend.pools.values()]
        s.close()
        hurt = sum(rig.damage(d, every=4096, length=64) for d in side_dirs)
        self.assertGreater(hurt, 0)
        s2 = HybridStack(self.dir)
        self.own(s2.close)
        hit, loaded, pool_hits, got = s2.load(tokens)
        self.assertEqual((hit, loaded), (len(tokens), len(tokens)))
        self.assertSame({"kv": got["kv"]}, {"kv": want["kv"]})
        # Every state and window page failed its checks: each pool loaded none of them.
        self.assertEqual(pool_hits, {"mamba": 0, "swa": 0})
        hit2, *_ = s2.load(tokens, rid="again")
        self.assertEqual(hit2, 0)  # dropped: the prefix is no longer restorable
        print(f"  {hurt} bytes of the Mamba and SWA slabs damaged: KV loaded exact, "
              "both pools missed, then the prefix was no longer restorable")

    def test_other_model_or_layout_refused(self):
        g = Geometry()
        dev, host = rig.mha_pools(g, "page_first")
        ctl = rig.controller(dev, host, g, rig.extra_config(self.dir))
        ctl.detach_storage_backend()
        from sglang.srt.managers.cache_controller import HiCacheController

        dev2, host2 = rig.mha_pools(g, "layer_first")
        with self.assertRaisesRegex(Exception, "refused"):
            rig.controller(dev2, host2, g, rig.extra_config(self.dir))
        with self.assertRaisesRegex(Exception, "refused"):
            HiCacheController(rig.allocator(dev, g), host, g.page, None, threading.Event(),
                              io_backend="direct", storage_backend="dynamic",
                              model_name="test-org/other-model",
                              storage_backend_extra_config=rig.extra_config(self.dir))
        print("  another layout and another model refused the dir at attach")


# ---- in other processes: a restart, and TP 2 over gloo ----


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _restart_child(data_dir, phase, out):
    try:
        rig.set_parallel()
        s = HybridStack(data_dir)
        tokens = list(range(10 * s.g.page))
        if phase == "write":
            stored, _ = s.backup(tokens)
            out.put((phase, stored, None, None))
        else:  # what the writer stored: the bytes are a function of the keys
            want, kv_idx, pools = s.stage(tokens)
            for t in pools:
                if t.host_indices is not None:
                    s.ctl.mem_pool_host.entry_map[t.name].host_pool.free(t.host_indices)
            s.kv.free(kv_idx)
            hit, loaded, pool_hits, got = s.load(tokens)
            out.put((phase, hit, loaded, differences(got, want)))
        s.close()
    except Exception:
        out.put((phase, "error", traceback.format_exc(), None))


def _tp_child(rank, data_dir, port, mla, out):
    import torch.distributed as dist

    try:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        dist.init_process_group("gloo", rank=rank, world_size=2)
        rig.set_parallel(tp_rank=rank, tp_size=2)
        # MLA KV is the same on both ranks (the same seed); MHA heads and Mamba states are
        # each rank's own.
        s = HybridStack(data_dir, mla=mla, tp_rank=rank, tp_size=2, tp_group=dist.group.WORLD,
                        salt=0 if mla else rank)
        tokens = list(range(8 * s.g.page))
        stored, want = s.backup(tokens)
        dist.barrier()
        hit, loaded, pool_hits, got = s.load(tokens)
        be = s.ctl.storage_backend
        out.put((rank, stored, hit, loaded, differences(got, want), be.writer, be.dir,
                 be._pool("mamba").dir))
        dist.barrier()
        s.close()
        dist.destroy_process_group()
    except Exception:
        out.put((rank, "error", traceback.format_exc()))


_CTX = None


def _context():
    """Children forked from a fork server that imported torch, SGLang and this module but ran
    nothing: a fork of the test process itself can hang in torch's thread pool, and a spawned
    child pays the imports (most of a minute on a busy machine) each time."""
    global _CTX
    if _CTX is None:
        _CTX = mp.get_context("forkserver")
        _CTX.set_forkserver_preload(["rig", "test_real_controller"])
    return _CTX


def _run_procs(target, args_for, n):
    ctx = _context()
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(i), out)) for i in range(n)]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            results.append(out.get(timeout=240))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    for r in results:
        if len(r) > 2 and r[1] == "error":
            raise AssertionError(f"child failed:\n{r[2]}")
    return results


class Processes(Base):
    def test_restart_in_a_new_process(self):
        (w,) = _run_procs(_restart_child, lambda i: (self.dir, "write"), 1)
        self.assertEqual(w[1], 10 * Geometry().page)
        (r,) = _run_procs(_restart_child, lambda i: (self.dir, "read"), 1)
        _, hit, loaded, diff = r
        self.assertEqual((hit, loaded, diff), (10 * Geometry().page,) * 2 + ([],))
        print("  a new process's controller found and loaded every pool's pages exact")

    def tp2(self, mla):
        port = _free_port()
        results = sorted(_run_procs(_tp_child, lambda i: (i, self.dir, port, mla), 2))
        n = 8 * (64 if mla else 16)  # HybridStack: pages of 64 tokens for DSA
        for rank, stored, hit, loaded, diff, writer, kv_dir, mamba_dir in results:
            self.assertEqual((hit, loaded, diff), (n, n, []), rank)
            self.assertEqual(writer, rank == 0 or not mla)
            self.assertEqual(stored, n, rank)  # rank 1 of MLA: its Mamba state
        dirs = [(r[6], r[7]) for r in results]
        if mla:
            self.assertEqual(dirs[0][0], dirs[1][0])  # one MLA dir, written by rank 0
        else:
            self.assertNotEqual(dirs[0][0], dirs[1][0])
        self.assertNotEqual(dirs[0][1], dirs[1][1])  # Mamba states: each rank's own
        return dirs

    def test_tp2_mha(self):
        self.tp2(False)
        print("  TP 2 (gloo, 2 processes), MHA + SWA + Mamba: each rank wrote and loaded its own")

    def test_tp2_mla(self):
        self.tp2(True)
        print("  TP 2 (gloo, 2 processes), MLA + indexer + Mamba: rank 0 wrote the KV and "
              "indexer, both loaded them exact, each its own Mamba state")


if __name__ == "__main__":
    unittest.main(verbosity=2)
