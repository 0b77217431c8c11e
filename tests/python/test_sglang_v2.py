"""kvtier.sglang's v2 interface (hybrid models) driven through SGLang 0.5.23's exact method
signatures, without SGLang or torch installed: stand-ins for PoolTransfer and for the host
pools a hybrid model registers (a Mamba state pool laid out as SGLang's MambaPoolHost
page_first, with and without the side states that take its page buffer description away;
a sliding-window KV pool; an indexer pool beside MLA), over ctypes memory.

Checked: every hit policy against a reference written from SGLang's definitions, on random
presence patterns and by hand; every page read back byte for byte; damaged pool slabs (misses,
never wrong bytes, and the prefix they serve no longer restorable); restarts; another model
or pool geometry refused; MLA with two TP ranks (shared KV, Mamba per rank); errors that stay
misses; threads; each pool's capacity.
"""

import ctypes
import dataclasses
import os
import random
import shutil
import tempfile
import threading
import time
import unittest
from typing import Any, List, Optional

from kvtier.sglang import (KvtierHiCacheStorage, PoolTransferResult, all_pages_restorable,
                           block_groups_pages, trailing_pages_restorable)
from test_sglang_backend import (Dtype, Indices, MHAPool, MLAPool, fill_page, make_config,
                                 page_bytes_at, sglang_keys, slots)

try:
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    ALL, TRAILING, GROUPS = (PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES,
                             PoolHitPolicy.BLOCK_GROUPS)
    MAMBA, SWA, INDEXER, KV = PoolName.MAMBA, PoolName.SWA, PoolName.INDEXER, PoolName.KV
except Exception:
    ALL, TRAILING, GROUPS = "all_pages", "trailing_pages", "block_groups"
    MAMBA, SWA, INDEXER, KV = "mamba", "swa", "indexer", "kv"

    @dataclasses.dataclass
    class PoolTransfer:  # the fields of SGLang's PoolTransfer
        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: Any = ALL
        nodes_to_load: Any = None
        indices_from_pool: Any = None
        block_pages: int = 0
        group_pages: int = 0


class MambaPool:
    """MambaPoolHost's page_first memory: a temporal state buffer (slots, layers, elems) and
    conv state buffers alike; a page is one slot, its regions temporal then conv_0..conv_n, as
    SGLang's get_page_buffer_meta gives them. With side_states the pool also keeps rows SGLang's
    zero-copy description cannot carry (it raises), so only its flat pages move."""

    def __init__(self, slots_=48, layers=2, temporal=96, convs=(32, 16), side_states=0):
        self.page_size, self.layout, self.num_mamba_layers = 1, "page_first", layers
        self.temporal_state_shape, self.conv_state_shapes = (temporal,), [(c,) for c in convs]
        self.dtype = self.conv_dtype = self.temporal_dtype = Dtype("bfloat16", 2)
        self.rows = [layers * temporal * 2] + [layers * c * 2 for c in convs]
        if side_states:
            self.rows.append(side_states)
        self.size, self.side_states = slots_, side_states
        self.size_per_token = sum(self.rows)
        self.bufs = [(ctypes.c_uint8 * (slots_ * r))() for r in self.rows]

    def _regions(self, slot):
        return [ctypes.addressof(b) + slot * r for b, r in zip(self.bufs, self.rows)]

    def get_page_buffer_meta(self, indices):
        if self.side_states:
            raise NotImplementedError("side states: use a whole-page backend")
        ptrs, sizes = [], []
        for slot in indices.tolist():
            ptrs += self._regions(slot)
            sizes += self.rows
        return ptrs, sizes

    def get_dummy_flat_data_page(self):
        return bytearray(self.size_per_token)

    def get_data_page(self, index, flat=True):
        return b"".join(ctypes.string_at(p, r) for p, r in zip(self._regions(index), self.rows))

    def set_from_flat_data_page(self, index, page):
        page, at = bytes(page), 0
        for p, r in zip(self._regions(index), self.rows):
            ctypes.memmove(p, page[at:at + r], r)
            at += r

    def fill(self, slot, seed):
        data = random.Random(seed).randbytes(self.size_per_token)
        self.set_from_flat_data_page(slot, data)
        return data


class LogicalPool:
    """SGLang's LogicalHostPool: token slots, no bytes."""

    def __init__(self, size, page_size):
        self.size, self.page_size, self.layout = size, page_size, "layer_first"
        self.kv_buffer, self.size_per_token = None, 0

    def get_page_buffer_meta(self, indices):
        return None

    def get_dummy_flat_data_page(self):
        return bytearray(0)


def window_slots(pool, pages):
    return slots(pages, pool.page_size)


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-sglang-v2-")
        self.backends = []

    def tearDown(self):
        for b in self.backends:
            b.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def hybrid(self, kv=None, pools=None, config=None, **extra):
        """A backend as SGLang's HybridCacheController attaches it: the KV pool through
        register_mem_pool_host, then every pool of the group (the KV pool too) through v2."""
        extra.setdefault("dir", self.dir)
        extra.setdefault("interface_v1", 1)
        extra.setdefault("capacity", "64M")
        config = config or make_config()
        config.extra_config = extra
        kv = kv or MHAPool("page_first", pages=64)
        pools = pools if pools is not None else {MAMBA: MambaPool(), SWA: MHAPool(
            "page_first", pages=64, head_num=1)}
        b = KvtierHiCacheStorage(config, {})
        b.register_mem_pool_host(kv)
        b.register_mem_host_pool_v2(kv, KV)
        for name, pool in pools.items():
            b.register_mem_host_pool_v2(pool, name)
        b.on_host_pools_registered()
        self.backends.append(b)
        return b, kv, pools


def reference(kv_present, pools):
    """SGLang 0.5.23's batch_exists_v2 semantics (its file and Mooncake backends), written out
    plainly: the KV run, then each pool in order keeps the prefix lengths its policy allows
    (all_pages: every page up to the length; trailing_pages: the last `window` pages before
    it, at least one); once no length is left the later pools give no verdict. block_groups
    pools give a verdict of their own (the pages their leading whole groups cover) and gate
    nothing."""
    kv = kv_present.index(False) if False in kv_present else len(kv_present)
    hits = {"kv": kv} if kv else {}
    lengths = list(range(1, kv + 1))
    for name, policy, present, window, block, group in pools:
        if policy == "block_groups":
            n = 0
            if block > 0 and group > 0:
                while (n + 1) * group <= len(present) and all(present[n * group:(n + 1) * group]):
                    n += 1
            if min(n * block, len(kv_present)):
                hits[name] = min(n * block, len(kv_present))
            continue
        if not lengths:
            continue
        ok = set()
        for p in range(1, kv + 1):
            need = range(p) if policy == "all_pages" else range(max(0, p - max(window, 1)), p)
            if all(present[i] for i in need):
                ok.add(p)
        if ok:
            hits[name] = max(ok)
        lengths = [p for p in lengths if p in ok]
    return (lengths[-1] if lengths else 0), hits, lengths


class HitPolicies(unittest.TestCase):
    def test_by_hand(self):
        present = [True, False, True, True, False, True]
        self.assertEqual(all_pages_restorable(present), {1})
        self.assertEqual(trailing_pages_restorable(present, 1), {1, 3, 4, 6})
        self.assertEqual(trailing_pages_restorable(present, 2), {1, 4})
        self.assertEqual(trailing_pages_restorable(present, 0), {1, 3, 4, 6})  # at least one
        self.assertEqual(all_pages_restorable([]), set())
        # groups of 2 keys, each standing for 4 full pages, on a span of 10
        self.assertEqual(block_groups_pages([True] * 4 + [False, True], 4, 2, 10), 8)
        self.assertEqual(block_groups_pages([True] * 6, 4, 2, 10), 10)  # at most the span
        self.assertEqual(block_groups_pages([True, True, True], 4, 2, 10), 4)  # whole groups
        self.assertEqual(block_groups_pages([True] * 4, 0, 2, 10), 0)



class HitPoliciesThroughStores(Base):
    def test_random_against_reference(self):
        """Random presence patterns stored for real (KV pages through v1, pool pages
        through v2), then batch_exists_v2 against the reference."""
        pools = {name: MambaPool(slots_=16, temporal=4, convs=()) for name in "abc"}
        b, kv, _ = self.hybrid(kv=MHAPool("page_first", pages=16), pools=pools)
        rng = random.Random(7)
        for case in range(150):
            n = rng.randrange(0, 12)
            keys = [f"{case:08x}{i:056x}" for i in range(n)]
            kv_present = [rng.random() < 0.9 for _ in range(n)]
            stored = [k for k, p in zip(keys, kv_present) if p]
            if stored:
                self.assertEqual(b.batch_set_v1(stored, slots(range(len(stored)), 4)),
                                 [True] * len(stored))
            spec, transfers = [], []
            for name in "abc"[:rng.randrange(0, 4)]:
                policy = rng.choice(["all_pages", "trailing_pages", "block_groups"])
                present = [rng.random() < 0.7 for _ in range(n)]
                window, block, group = (rng.randrange(0, 4), rng.randrange(0, 4),
                                        rng.randrange(0, 3))
                # block groups: keys of their own; the others: the KV keys
                pool_keys = [f"g{k}" for k in keys] if policy == "block_groups" else keys
                stored = [k for k, p in zip(pool_keys, present) if p]
                if stored:
                    res = b.batch_set_v2([PoolTransfer(name, host_indices=Indices(
                        range(len(stored))), keys=stored)])
                    self.assertEqual(res, {name: [True] * len(stored)})
                spec.append((name, policy, present, window, block, group))
                transfers.append(PoolTransfer(
                    name, hit_policy=policy, block_pages=block, group_pages=group,
                    keys=(pool_keys if policy == "block_groups" else
                          keys[:window] if window else None)))
            r = b.batch_exists_v2(keys, transfers)
            got = (r.kv_hit_pages, {str(k): v for k, v in r.extra_pool_hit_pages.items()},
                   r.restorable_prefix_pages)
            self.assertEqual(got, reference(kv_present, spec), case)


class Hybrid(Base):
    def store_chain(self, b, kv, pools, n, mamba_at=(), swa_at=(), seed="c"):
        """KV pages 0..n-1 (v1, as SGLang writes KV), Mamba states after the pages in
        mamba_at, SWA pages at swa_at; returns keys and the bytes written."""
        keys = sglang_keys([sum(map(ord, seed))] * (n * kv.page_size), kv.page_size)
        want = {("kv", p): fill_page(kv, p, f"{seed}kv{p}") for p in range(n)}
        self.assertEqual(b.batch_set_v1(keys[:n], slots(range(n), kv.page_size)), [True] * n)
        mamba, swa = pools[MAMBA], pools[SWA]
        for p in mamba_at:
            want[("mamba", p)] = mamba.fill(p, f"{seed}m{p}")
            res = b.batch_set_v2([PoolTransfer(MAMBA, host_indices=Indices([p]),
                                               keys=[keys[p]], hit_policy=TRAILING)])
            self.assertEqual(res, {MAMBA: [True]})
        for p in swa_at:
            want[("swa", p)] = fill_page(swa, p, f"{seed}s{p}")
        if swa_at:
            res = b.batch_set_v2([PoolTransfer(SWA, host_indices=window_slots(swa, swa_at),
                                               keys=[keys[p] for p in swa_at],
                                               hit_policy=TRAILING)])
            self.assertEqual(res, {SWA: [True] * len(swa_at)})
        return keys, want

    def exists(self, b, keys, mamba_window=1, swa_window=2, extra=()):
        return b.batch_exists_v2(keys, [
            PoolTransfer(MAMBA, keys=keys[:mamba_window], hit_policy=TRAILING),
            PoolTransfer(SWA, keys=keys[:swa_window], hit_policy=TRAILING), *extra])

    def test_trailing_holes_and_round_trip(self):
        b, kv, pools = self.hybrid()
        # Mamba states after pages 1 and 4 (prefixes of 2 and 5 pages); SWA pages 2, 3, 4.
        keys, want = self.store_chain(b, kv, pools, 6, mamba_at=(1, 4), swa_at=(2, 3, 4))
        r = self.exists(b, keys)
        self.assertIsInstance(r, PoolTransferResult)
        # Mamba allows 2 and 5; SWA (window 2) allows 4 and 5: only 5 is restorable.
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (5, [5]))
        self.assertEqual(r.extra_pool_hit_pages, {KV: 6, MAMBA: 5, SWA: 5})
        # SWA with a window of 1 allows 3, 4, 5 as well: then 5 only still (Mamba: 2, 5).
        r = self.exists(b, keys, swa_window=1)
        self.assertEqual(r.restorable_prefix_pages, [5])
        # Without the SWA pool: 2 and 5.
        r = b.batch_exists_v2(keys, [PoolTransfer(MAMBA, keys=keys[:1], hit_policy=TRAILING)])
        self.assertEqual(r.restorable_prefix_pages, [2, 5])
        # Read back, as SGLang restores a 5-page prefix: KV pages, the state after page 4 and
        # the SWA window ending there, into other host slots.
        self.assertEqual(b.batch_get_v1(keys[:5], slots(range(10, 15), kv.page_size)),
                         [True] * 5)
        res = b.batch_get_v2([
            PoolTransfer(MAMBA, host_indices=Indices([20]), keys=[keys[4]]),
            PoolTransfer(SWA, host_indices=window_slots(pools[SWA], [30, 31]),
                         keys=keys[3:5])])
        self.assertEqual(res, {MAMBA: [True], SWA: [True, True]})
        for p in range(5):
            self.assertEqual(page_bytes_at(kv, 10 + p), want[("kv", p)])
        self.assertEqual(pools[MAMBA].get_data_page(20), want[("mamba", 4)])
        self.assertEqual(page_bytes_at(pools[SWA], 30), want[("swa", 3)])
        self.assertEqual(page_bytes_at(pools[SWA], 31), want[("swa", 4)])
        # A state never written is a miss, and leaves no verdict on the pages it would need.
        res = b.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([21]),
                                           keys=[keys[2]])])
        self.assertEqual(res, {MAMBA: [False]})

    def test_all_pages_and_block_groups(self):
        mla = MLAPool(pages=64)
        indexer = MLAPool(pages=64, kv_cache_dim=8)  # a KV-derived pool of its own bytes
        groups = MambaPool(slots_=16, temporal=8, convs=())  # one slot a group key
        b, kv, pools = self.hybrid(kv=mla, pools={INDEXER: indexer, "deepseek_v4_c4": groups},
                                   config=make_config(mla=True))
        keys = sglang_keys(list(range(6 * 4)), 4)
        for p in range(6):
            fill_page(mla, p, f"k{p}")
            fill_page(indexer, p, f"i{p}")
        self.assertEqual(b.batch_set_v1(keys, slots(range(6), 4)), [True] * 6)
        # the indexer as SGLang writes KV-derived pools: the KV keys and KV host slots
        self.assertEqual(b.batch_set_v2([PoolTransfer(INDEXER, host_indices=slots(
            [0, 1, 2, 4, 5], 4), keys=[keys[i] for i in (0, 1, 2, 4, 5)])]),
            {INDEXER: [True] * 5})
        group_keys = [f"group-{j}" for j in range(3)]
        self.assertEqual(b.batch_set_v2([PoolTransfer("deepseek_v4_c4", host_indices=Indices(
            [0, 1]), keys=group_keys[:2])]), {"deepseek_v4_c4": [True, True]})
        r = b.batch_exists_v2(keys, [
            PoolTransfer(INDEXER, keys=None, hit_policy=ALL),
            PoolTransfer("deepseek_v4_c4", keys=group_keys, hit_policy=GROUPS, block_pages=2,
                         group_pages=1)])
        # The indexer lacks page 3: a prefix of at most 3 pages. The block groups (two of
        # three stored, each standing for 2 full pages) cover 4 pages, and gate nothing.
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (3, [1, 2, 3]))
        self.assertEqual(r.extra_pool_hit_pages, {KV: 6, INDEXER: 3, "deepseek_v4_c4": 4})
        res = b.batch_get_v2([PoolTransfer(INDEXER, host_indices=slots(range(10, 13), 4),
                                           keys=keys[:3], indices_from_pool=KV)])
        self.assertEqual(res, {INDEXER: [True] * 3})
        for p in range(3):
            self.assertEqual(page_bytes_at(indexer, 10 + p), page_bytes_at(indexer, p))

    def test_kv_missing_gates_everything(self):
        b, kv, pools = self.hybrid()
        keys, _ = self.store_chain(b, kv, pools, 3, mamba_at=(0, 1, 2), swa_at=(0, 1, 2))
        other = sglang_keys([5] * (3 * kv.page_size), kv.page_size)
        r = self.exists(b, other)
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages, r.restorable_prefix_pages),
                         (0, {}, []))
        r = self.exists(b, keys[:2] + other[2:])
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (2, [1, 2]))

    def test_damaged_pool_slab_is_a_miss(self):
        mamba = MambaPool(slots_=40, layers=4, temporal=4096)  # pages of about 33 KiB
        b, kv, pools = self.hybrid(pools={MAMBA: mamba, SWA: MHAPool("page_first", pages=64,
                                                                      head_num=1)})
        keys, want = self.store_chain(b, kv, pools, 32, mamba_at=range(32))
        mdir = b._pool(MAMBA).dir
        b.close()
        slab = os.path.join(mdir, "slabs", "0000.slab")
        with open(slab, "r+b") as f:
            size = os.path.getsize(slab)
            for at in range(96 << 10, size, 200 << 10):
                f.seek(at)
                f.write(b"\xa5" * 4096)
        b2, kv2, pools2 = self.hybrid(pools={MAMBA: MambaPool(slots_=40, layers=4,
                                                              temporal=4096)})
        good = []
        for p in range(32):
            res = b2.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([p]),
                                                keys=[keys[p]])])
            if res[MAMBA] == [True]:
                good.append(p)
                self.assertEqual(pools2[MAMBA].get_data_page(p), want[("mamba", p)], p)
        self.assertLess(len(good), 32, "no page met the damage")
        self.assertGreater(len(good), 0)
        # A state that failed its checks is gone: no prefix ending there is restorable.
        r = b2.batch_exists_v2(keys, [PoolTransfer(MAMBA, keys=keys[:1],
                                                   hit_policy=TRAILING)])
        self.assertEqual(r.restorable_prefix_pages, [p + 1 for p in good])
        self.assertEqual(r.kv_hit_pages, good[-1] + 1)

    def test_restart_and_refusals(self):
        b, kv, pools = self.hybrid()
        keys, want = self.store_chain(b, kv, pools, 4, mamba_at=(3,), swa_at=(2, 3))
        b.close()
        b2, kv2, pools2 = self.hybrid()
        r = self.exists(b2, keys)
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (4, [4]))
        res = b2.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([7]), keys=[keys[3]])])
        self.assertEqual(res, {MAMBA: [True]})
        self.assertEqual(pools2[MAMBA].get_data_page(7), want[("mamba", 3)])
        b2.close()
        # Another Mamba state geometry, another model, another SWA head count: refused at
        # registration, naming the dir.
        for config, pools_ in (
            (make_config(), {MAMBA: MambaPool(temporal=64)}),
            (make_config(), {SWA: MHAPool("page_first", pages=64, head_num=2)}),
            (make_config(model="org/other"), {MAMBA: MambaPool()}),
        ):
            config.extra_config = {"dir": self.dir, "interface_v1": 1}
            other = KvtierHiCacheStorage(config, {})
            if config.model_name == "org/other":
                with self.assertRaisesRegex(RuntimeError, "refused"):
                    other.register_mem_pool_host(MHAPool("page_first", pages=64))
                continue
            other.register_mem_pool_host(MHAPool("page_first", pages=64))
            (name, pool), = pools_.items()
            with self.assertRaisesRegex(RuntimeError, f"{name}.*refused"):
                other.register_mem_host_pool_v2(pool, name)
            other.close()

    def test_flat_pages_for_a_pool_without_a_description(self):
        """A Mamba pool with side states has no zero-copy description: its flat data pages
        move, and a pool of the same page size whose pages move in place is refused the
        dir."""
        mamba = MambaPool(side_states=40)
        b, kv, pools = self.hybrid(pools={MAMBA: mamba})
        self.assertFalse(b._pool(MAMBA).zero_copy)
        keys = sglang_keys([3] * (4 * kv.page_size), kv.page_size)
        for p in range(4):
            fill_page(kv, p, f"f{p}")
        self.assertEqual(b.batch_set_v1(keys, slots(range(4), kv.page_size)), [True] * 4)
        want = [mamba.fill(p, f"side{p}") for p in range(4)]
        self.assertEqual(b.batch_set_v2([PoolTransfer(MAMBA, host_indices=Indices(range(4)),
                                                      keys=keys)]), {MAMBA: [True] * 4})
        self.assertEqual(b.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices(
            range(10, 14)), keys=keys)]), {MAMBA: [True] * 4})
        for p in range(4):
            self.assertEqual(mamba.get_data_page(10 + p), want[p])
        b.close()
        config = make_config()
        config.extra_config = {"dir": self.dir, "interface_v1": 1}
        other = KvtierHiCacheStorage(config, {})
        other.register_mem_pool_host(MHAPool("page_first", pages=64))
        with self.assertRaisesRegex(RuntimeError, "refused"):
            other.register_mem_host_pool_v2(MambaPool(temporal=106), MAMBA)  # 616 bytes too
        other.close()

    def test_mla_two_ranks_mamba_per_rank(self):
        """MLA KV (and its indexer) is the same on every TP rank: rank 0 writes, rank 1 reads
        the same dirs; Mamba states are each rank's own share: both write, each its dir."""
        ranks = []
        for r in range(2):
            b, kv, pools = self.hybrid(kv=MLAPool(pages=64), pools={
                MAMBA: MambaPool(), INDEXER: MLAPool(pages=64, kv_cache_dim=8)},
                config=make_config(mla=True, tp_rank=r, tp_size=2))
            ranks.append((b, kv, pools))
        (b0, kv0, p0), (b1, kv1, p1) = ranks
        self.assertEqual(b0.dir, b1.dir)
        self.assertEqual(b0._pool(INDEXER).dir, b1._pool(INDEXER).dir)
        self.assertNotEqual(b0._pool(MAMBA).dir, b1._pool(MAMBA).dir)
        self.assertTrue(b1._pool(INDEXER).read_only)
        self.assertFalse(b1._pool(MAMBA).read_only)
        keys = sglang_keys(list(range(3 * 4)), 4)
        for p in range(3):
            fill_page(kv0, p, f"m{p}")
            fill_page(p0[INDEXER], p, f"x{p}")
        self.assertEqual(b0.batch_set_v1(keys, slots(range(3), 4)), [True] * 3)
        self.assertEqual(b1.batch_set_v1(keys, slots(range(3), 4)), [False] * 3)
        idx = PoolTransfer(INDEXER, host_indices=slots(range(3), 4), keys=keys)
        self.assertEqual(b0.batch_set_v2([idx]), {INDEXER: [True] * 3})
        self.assertEqual(b1.batch_set_v2([idx]), {INDEXER: [False] * 3})
        states = {}
        for r, (b, _, pools) in enumerate(ranks):
            states[r] = pools[MAMBA].fill(2, f"rank{r}")
            self.assertEqual(b.batch_set_v2([PoolTransfer(MAMBA, host_indices=Indices([2]),
                                                          keys=[keys[2]])]), {MAMBA: [True]})
        for r, (b, kv, pools) in enumerate(ranks):
            res = b.batch_exists_v2(keys, [PoolTransfer(INDEXER, hit_policy=ALL),
                                           PoolTransfer(MAMBA, keys=keys[:1],
                                                        hit_policy=TRAILING)])
            self.assertEqual((res.kv_hit_pages, res.restorable_prefix_pages), (3, [3]), r)
            got = b.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([9]),
                                               keys=[keys[2]])])
            self.assertEqual(got, {MAMBA: [True]})
            self.assertEqual(pools[MAMBA].get_data_page(9), states[r], f"rank {r}'s own state")
            self.assertEqual(b.batch_get_v1(keys, slots(range(5, 8), 4)), [True] * 3)
            self.assertEqual(page_bytes_at(kv, 7), page_bytes_at(kv0, 2))

    def test_logical_anchor(self):
        """DeepSeek V4's KV pool is a logical anchor (no bytes, kv_buffer None): it makes no
        dir, each of its pages is there, and the pools beside it gate what is restorable."""
        anchor = LogicalPool(size=64, page_size=4)
        c4 = MLAPool(pages=16, kv_cache_dim=8)
        b, _, _ = self.hybrid(kv=anchor, pools={"deepseek_v4_c4": c4},
                              config=make_config(mla=True))
        self.assertFalse(os.path.exists(b.dir))
        keys = sglang_keys(list(range(5 * 4)), 4)
        c4_all = [PoolTransfer("deepseek_v4_c4", hit_policy=ALL)]
        r = b.batch_exists_v2(keys, c4_all)
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (0, []))
        self.assertEqual(r.extra_pool_hit_pages, {KV: 5})
        self.assertEqual(b.batch_exists(keys), 5)
        self.assertEqual(b.batch_set_v1(keys, slots(range(5), 4)), [True] * 5)
        want = [fill_page(c4, p, f"c4.{p}") for p in range(3)]
        self.assertEqual(b.batch_set_v2([PoolTransfer("deepseek_v4_c4", host_indices=slots(
            range(3), 4), keys=keys[:3], indices_from_pool=KV)]), {"deepseek_v4_c4": [True] * 3})
        r = b.batch_exists_v2(keys, c4_all)
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (3, [1, 2, 3]))
        self.assertEqual(b.batch_get_v1(keys[:3], slots(range(8, 11), 4)), [True] * 3)
        self.assertEqual(b.batch_get_v2([PoolTransfer("deepseek_v4_c4", host_indices=slots(
            range(8, 11), 4), keys=keys[:3])]), {"deepseek_v4_c4": [True] * 3})
        for p in range(3):
            self.assertEqual(page_bytes_at(c4, 8 + p), want[p])

    def test_errors_are_misses(self):
        b, kv, pools = self.hybrid()
        keys, _ = self.store_chain(b, kv, pools, 2, mamba_at=(1,))
        # a pool never registered, host slots of the wrong length, an unknown policy
        self.assertEqual(b.batch_set_v2([PoolTransfer("draft", host_indices=Indices([0]),
                                                      keys=keys[:1])]), {"draft": [False]})
        self.assertEqual(b.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([0, 1]),
                                                      keys=keys[:1])]), {MAMBA: [False]})
        self.assertEqual(b.batch_get_v2([PoolTransfer(SWA, host_indices=None,
                                                      keys=keys[:1])]), {SWA: [False]})
        r = b.batch_exists_v2(keys, [PoolTransfer("draft", hit_policy=ALL)])
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (0, []))
        r = b.batch_exists_v2(keys, [PoolTransfer(MAMBA, hit_policy="most_pages")])
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (0, []))
        self.assertEqual(b.batch_get_v2([]), {})
        self.assertEqual(b.batch_set_v2([PoolTransfer(MAMBA, keys=[])]), {MAMBA: []})
        b.close()
        r = self.exists(b, keys)
        self.assertEqual((r.kv_hit_pages, r.restorable_prefix_pages), (0, []))
        self.assertEqual(b.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([1]),
                                                      keys=keys[1:2])]), {MAMBA: [False]})

    def test_capacity_follows_the_host_pools(self):
        kv = MHAPool("page_first", pages=64)
        kv.size_per_token = 2 * 3 * 2 * 8 * 2  # MHATokenToKVPoolHost has these two
        mamba = MambaPool(slots_=32)
        b, _, _ = self.hybrid(kv=kv, pools={MAMBA: mamba, SWA: MHAPool("page_first")},
                              capacity="8M", pool_capacity={"swa": "2M"})
        ratio = mamba.size * mamba.size_per_token / (kv.size * kv.size_per_token)
        self.assertEqual(b._pool(MAMBA).capacity, int((8 << 20) * ratio))
        self.assertEqual(b._pool(SWA).capacity, 2 << 20)
        self.assertEqual(b._pool(KV).capacity, 8 << 20)
        self.assertGreater(b.store_stats(MAMBA)["capacity_pages"], 0)

    def test_threads(self):
        """A backup thread writing KV and states while a prefetch thread reads and checks
        them and a third asks batch_exists_v2, as SGLang's controller threads do."""
        b, kv, pools = self.hybrid(kv=MHAPool("page_first", pages=160),
                                   pools={MAMBA: MambaPool(slots_=160)})
        mamba = pools[MAMBA]
        chains = [sglang_keys([c] * (4 * kv.page_size), kv.page_size) for c in range(16)]
        want = {}
        for c in range(16):
            for p in range(4):
                fill_page(kv, c * 4 + p, f"t{c}.{p}")
            want[c] = mamba.fill(c, f"state{c}")
        errors, done = [], threading.Event()

        def backup():
            try:
                for c in range(16):
                    ok = b.batch_set_v1(chains[c], slots(range(c * 4, c * 4 + 4),
                                                         kv.page_size))
                    res = b.batch_set_v2([PoolTransfer(MAMBA, host_indices=Indices([c]),
                                                       keys=chains[c][3:])])
                    if not all(ok) or res != {MAMBA: [True]}:
                        errors.append(("set", c))
            finally:
                done.set()

        def prefetch(slot):
            # Until the backups are done, then once more; never past the deadline.
            last, deadline = False, time.monotonic() + 60
            while not last and time.monotonic() < deadline:
                last = done.is_set()
                for c in range(16):
                    r = b.batch_exists_v2(chains[c], [PoolTransfer(MAMBA, keys=chains[c][:1],
                                                                   hit_policy=TRAILING)])
                    if r.kv_hit_pages not in (0, 4):
                        errors.append(("hit", c, r))
                    if r.kv_hit_pages != 4:
                        continue
                    res = b.batch_get_v2([PoolTransfer(MAMBA, host_indices=Indices([slot]),
                                                       keys=chains[c][3:])])
                    if res[MAMBA] != [True] or mamba.get_data_page(slot) != want[c]:
                        errors.append(("state", c))

        threads = [threading.Thread(target=backup)] + [
            threading.Thread(target=prefetch, args=(slot,)) for slot in (100, 101)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=90)
        self.assertFalse(any(t.is_alive() for t in threads), "a thread is stuck")
        self.assertTrue(done.is_set())
        self.assertEqual(errors, [])


if __name__ == "__main__":
    unittest.main()
