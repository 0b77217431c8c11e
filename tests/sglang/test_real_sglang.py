"""kvtier loaded by the real SGLang (./run.sh test-sglang): SGLang's own storage backend
factory creates KvtierHiCacheStorage from the extra config a user passes on the command line,
and it is registered with SGLang's real MHATokenToKVPoolHost (CPU tensors, pin_memory off,
over a K/V pool description made of CPU tensors, since no GPU is needed for the host side).
Then SGLang's calls: batch_set_v1 from the pool's pages, batch_exists, batch_get_v1 into other
pages, compared byte for byte through the pool's own get_page_buffer_meta; a restart; the
copy path with the pool's flat pages; and batch_exists_v2's hit policies against SGLang's own
HiCacheFile on the same random data. Real: sglang 0.5.23, torch, the factory, HiCacheStorage
and HiCacheStorageConfig, the host pool class and its memory. Not real: no model runs, no GPU
pool exists (the host pool's device side is CPU tensors), no scheduler thread calls it.
"""

import hashlib
import os
import shutil
import tempfile
import unittest

import torch
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage import StorageBackendFactory

from kvtier.sglang import KvtierHiCacheStorage

LAYERS, HEADS, HEAD_DIM, PAGE, TOKENS = 4, 2, 64, 16, 512


def host_pool(layout):
    k = tuple(torch.zeros(TOKENS + PAGE, HEADS, HEAD_DIM, dtype=torch.bfloat16)
              for _ in range(LAYERS))
    v = tuple(torch.zeros(TOKENS + PAGE, HEADS, HEAD_DIM, dtype=torch.bfloat16)
              for _ in range(LAYERS))
    ptrs = lambda ts: torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)
    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v),
                          layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=HEAD_DIM, v_head_dim=HEAD_DIM,
        dtype=torch.bfloat16, device=torch.device("cpu"))
    pool = MHATokenToKVPoolHost(info, host_to_device_ratio=4.0, host_size=0, page_size=PAGE,
                                layout=layout, pin_memory=False, device="cpu",
                                device_capacity_tokens=TOKENS, start_layer=0,
                                end_layer=LAYERS)
    pool._keep = (k, v)
    return pool


def config(extra, model="test-org/test-model"):
    return HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0,
                                attn_cp_size=1, is_mla_model=False,
                                enable_storage_metrics=False, is_page_first_layout=True,
                                model_name=model, extra_config=extra)


def keys_for(n, salt):
    return [hashlib.sha256(f"{salt}/{i}".encode()).hexdigest() for i in range(n)]


def page_slots(pages):
    return torch.tensor([p * PAGE + t for p in pages for t in range(PAGE)], dtype=torch.int64)


def page_bytes(pool, page):
    ptrs, sizes = pool.get_page_buffer_meta(page_slots([page]))
    import ctypes
    return b"".join(ctypes.string_at(p, n) for p, n in zip(ptrs, sizes))


class RealSGLang(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-real-sglang-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def make(self, layout, v1=True):
        extra = {"backend_name": "kvtier", "module_path": "kvtier.sglang",
                 "class_name": "KvtierHiCacheStorage", "interface_v1": int(v1),
                 "dir": self.dir, "capacity": "64M"}
        backend = StorageBackendFactory.create_backend("dynamic", config(extra), None)
        self.assertIsInstance(backend, HiCacheStorage)
        self.assertIsInstance(backend, KvtierHiCacheStorage)
        pool = host_pool(layout)
        backend.register_mem_pool_host(pool)
        return backend, pool

    def zero_copy(self, layout):
        backend, pool = self.make(layout)
        pool.kv_buffer.view(torch.int16).random_(-30000, 30000)
        keys = keys_for(8, layout)
        want = [page_bytes(pool, p) for p in range(8)]
        self.assertEqual(backend.batch_set_v1(keys, page_slots(range(8))), [True] * 8)
        self.assertEqual(backend.batch_exists(keys), 8)
        self.assertEqual(backend.batch_get_v1(keys, page_slots(range(16, 24))), [True] * 8)
        for i in range(8):
            self.assertEqual(page_bytes(pool, 16 + i), want[i])
        backend.close()
        # A restart: a new backend from the factory finds the pages.
        again, pool2 = self.make(layout)
        self.assertEqual(again.batch_exists(keys), 8)
        self.assertEqual(again.batch_get_v1(keys, page_slots(range(8))), [True] * 8)
        for i in range(8):
            self.assertEqual(page_bytes(pool2, i), want[i])
        print(f"real sglang {layout}: {again.segs_per_page} regions, "
              f"{again.page_bytes}-byte pages, 8 pages set, found, read back exact, "
              f"and again after a restart")
        again.close()

    def test_page_first(self):
        self.zero_copy("page_first")

    def test_page_first_direct(self):
        self.zero_copy("page_first_direct")

    def test_layer_first(self):
        self.zero_copy("layer_first")

    def test_copy_path(self):
        backend, pool = self.make("page_first", v1=False)
        pool.kv_buffer.view(torch.int16).random_(-30000, 30000)
        keys = keys_for(3, "copy")
        pages = [pool.get_data_page(p * PAGE, flat=True).clone() for p in range(3)]
        self.assertTrue(backend.batch_set(keys, pages))
        got = backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        for g, w in zip(got, pages):
            self.assertTrue(torch.equal(g.view(torch.int16), w.view(torch.int16)))
        print("real sglang copy path: 3 flat pages set and read back exact")
        backend.close()


class HitPoliciesAgainstSGLangsFile(unittest.TestCase):
    """batch_exists_v2 against SGLang's own HiCacheFile, the reference for its hit policies:
    the same random presence patterns stored in both (KV pages, a Mamba state pool and a
    sliding-window pool, SGLang's real host pools registered through v2), then the same
    queries with all_pages and trailing_pages pools (windows of 1 to 3 pages) in random order;
    every answer (kv_hit_pages, each pool's hit pages, the restorable prefix lengths) must be
    SGLang's. (block_groups: HiCacheFile has none to compare with.)"""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-real-sglang-policies-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_random_patterns(self):
        import random

        import rig
        from sglang.srt.mem_cache.hicache_storage import (HiCacheFile, PoolHitPolicy, PoolName,
                                                          PoolTransfer)

        rig.set_parallel()
        g = rig.Geometry()
        _, kv = rig.mha_pools(g, "page_first")
        _, mamba = rig.mamba_pools("page_first")
        _, swa = rig.mha_pools(g, "page_first", layers=2)
        pools = {PoolName.MAMBA: mamba, PoolName.SWA: swa}
        cfg = config({"file_storage_path": os.path.join(self.dir, "file")})
        ref = HiCacheFile(cfg, file_path=os.path.join(self.dir, "file"))
        ours = StorageBackendFactory.create_backend("dynamic", config(rig.extra_config(
            os.path.join(self.dir, "kvtier"))), None)
        for b in (ref, ours):
            b.register_mem_pool_host(kv)
            b.register_mem_host_pool_v2(kv, PoolName.KV)
            for name, pool in pools.items():
                b.register_mem_host_pool_v2(pool, name)
        rng = random.Random(32)
        kv_page = kv.get_data_page(0, flat=True).clone()
        compared = 0
        for case in range(120):
            n = rng.randrange(0, 10)
            keys = [hashlib.sha256(f"{case}/{i}".encode()).hexdigest() for i in range(n)]
            for i, key in enumerate(keys):
                if rng.random() < 0.9:
                    self.assertTrue(ref.set(key, kv_page))
                    self.assertEqual(ours.batch_set_v1([key], page_slots([0])), [True])
            for name, pool in pools.items():
                stored = [k for k in keys if rng.random() < 0.7]
                if stored:
                    t = PoolTransfer(name, host_indices=torch.arange(
                        len(stored) * pool.page_size, dtype=torch.int64), keys=stored)
                    for b in (ref, ours):
                        self.assertEqual(b.batch_set_v2([t]), {name: [True] * len(stored)})
            for _ in range(4):
                transfers = []
                for name in rng.sample(list(pools), rng.randrange(0, 3)):
                    policy = rng.choice([PoolHitPolicy.ALL_PAGES, PoolHitPolicy.TRAILING_PAGES])
                    window = rng.randrange(0, 4)
                    transfers.append(PoolTransfer(name, hit_policy=policy,
                                                  keys=keys[:window] if window else None))
                want, got = ref.batch_exists_v2(keys, transfers), ours.batch_exists_v2(keys,
                                                                                    transfers)
                self.assertEqual(
                    (got.kv_hit_pages, {str(k): v for k, v in got.extra_pool_hit_pages.items()},
                     got.restorable_prefix_pages),
                    (want.kv_hit_pages, {str(k): v for k, v in want.extra_pool_hit_pages.items()},
                     want.restorable_prefix_pages), (case, transfers))
                compared += 1
        ours.close()
        print(f"real sglang hit policies: {compared} queries answered as HiCacheFile answers them")


if __name__ == "__main__":
    unittest.main(verbosity=2)
