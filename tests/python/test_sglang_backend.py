"""kvtier.sglang.KvtierHiCacheStorage driven through SGLang's exact method signatures, over
host pools laid out as SGLang 0.5.23's host pools lay out their memory (MHA page_first,
page_first_direct and layer_first; MLA page_first), without SGLang or torch installed.

The pools here compute their page regions with the arithmetic of SGLang's
get_page_buffer_meta (pool_host/mha.py and mla.py) over a ctypes buffer. Every page read back
is compared byte for byte with what was written. Also: three threads at once, restarts, a
wrong fingerprint, damaged slabs, a full store, a full file system (a small tmpfs, where this
test may mount one), and errors that stay misses.
"""

import ctypes
import dataclasses
import glob
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import unittest
from typing import Optional

from kvtier.sglang import KvtierHiCacheStorage, key_bytes, parse_bytes

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig as Config
except Exception:

    @dataclasses.dataclass
    class Config:  # the fields of SGLang's HiCacheStorageConfig
        tp_rank: int
        tp_size: int
        pp_rank: int
        pp_size: int
        attn_cp_rank: int
        attn_cp_size: int
        is_mla_model: bool
        enable_storage_metrics: bool
        is_page_first_layout: bool
        model_name: Optional[str]
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        dp_rank: int = 0
        extra_config: Optional[dict] = None
        dcp_size: int = 1
        dcp_rank: int = 0
        logical_page_size: Optional[int] = None

        @property
        def is_storage_writer(self) -> bool:
            return not self.is_mla_model or self.tp_rank == self.dcp_rank


class Indices:
    """What SGLang passes as host_indices: token slots, page i starting at i * page_size."""

    def __init__(self, slots):
        self.slots = list(slots)

    def __len__(self):
        return len(self.slots)

    def tolist(self):
        return list(self.slots)


class Dtype:
    def __init__(self, name, itemsize):
        self.name, self.itemsize = name, itemsize

    def __str__(self):
        return f"torch.{self.name}"


class MHAPool:
    """MHATokenToKVPoolHost's memory: kv_buffer of (2, size, layer, heads, head_dim) for
    page_first, (2, pages, layer, page_size, heads, head_dim) for page_first_direct, and
    (2, layer, size, heads, head_dim) for layer_first."""

    def __init__(self, layout, pages=64, page_size=4, layer_num=3, head_num=2, head_dim=8):
        self.layout, self.page_size, self.layer_num = layout, page_size, layer_num
        self.head_num, self.head_dim, self.dtype = head_num, head_dim, Dtype("bfloat16", 2)
        self.size = pages * page_size
        self.nbytes = 2 * self.size * layer_num * head_num * head_dim * 2
        self.buf = (ctypes.c_uint8 * self.nbytes)()
        self.base = ctypes.addressof(self.buf)

    def get_page_buffer_meta(self, indices):
        idx, tok = indices.tolist(), self.head_num * self.head_dim * self.dtype.itemsize
        v_offset = self.layer_num * self.size * tok
        ptrs = []
        for i in range(0, len(idx), self.page_size):
            if self.layout == "layer_first":
                for layer in range(self.layer_num):
                    k = self.base + idx[i] * tok + layer * self.size * tok
                    ptrs += [k, k + v_offset]
                size = self.page_size * tok
            else:
                k = self.base + idx[i] * self.layer_num * tok
                ptrs += [k, k + v_offset]
                size = self.layer_num * self.page_size * tok
        return ptrs, [size] * len(ptrs)

    def get_dummy_flat_data_page(self):
        return bytearray(2 * self.layer_num * self.page_size * self.head_num * self.head_dim * 2)


class MLAPool:
    """MLATokenToKVPoolHost's page_first memory: (size, layer, 1, kv_cache_dim)."""

    def __init__(self, pages=64, page_size=4, layer_num=3, kv_cache_dim=24):
        self.layout, self.page_size, self.layer_num = "page_first", page_size, layer_num
        self.kv_cache_dim, self.dtype = kv_cache_dim, Dtype("bfloat16", 2)
        self.logical_page_size = page_size
        self.size = pages * page_size
        self.nbytes = self.size * layer_num * kv_cache_dim * 2
        self.buf = (ctypes.c_uint8 * self.nbytes)()
        self.base = ctypes.addressof(self.buf)

    def get_page_buffer_meta(self, indices):
        idx, row = indices.tolist(), self.kv_cache_dim * self.dtype.itemsize
        ptrs = [self.base + idx[i] * self.layer_num * row
                for i in range(0, len(idx), self.page_size)]
        return ptrs, [self.layer_num * self.page_size * row] * len(ptrs)

    def get_dummy_flat_data_page(self):
        return bytearray(self.layer_num * self.page_size * self.kv_cache_dim * 2)


def sglang_keys(tokens, page_size, prior=None):
    """SGLang's page keys: h_i = SHA256(h_{i-1} || u32 LE tokens of page i), as hex."""
    keys, h = [], prior
    for i in range(0, len(tokens), page_size):
        m = hashlib.sha256()
        if h is not None:
            m.update(bytes.fromhex(h))
        for t in tokens[i:i + page_size]:
            m.update(int(t).to_bytes(4, "little"))
        h = m.hexdigest()
        keys.append(h)
    return keys


def page_bytes_at(pool, page):
    """Every byte of host page `page` (token slots page*page_size ...), region by region."""
    ptrs, sizes = pool.get_page_buffer_meta(Indices(range(page * pool.page_size,
                                                          (page + 1) * pool.page_size)))
    return b"".join(ctypes.string_at(p, n) for p, n in zip(ptrs, sizes))


def fill_page(pool, page, seed):
    ptrs, sizes = pool.get_page_buffer_meta(Indices(range(page * pool.page_size,
                                                          (page + 1) * pool.page_size)))
    data = hashlib.shake_256(seed.encode()).digest(sum(sizes))
    at = 0
    for p, n in zip(ptrs, sizes):
        ctypes.memmove(p, data[at:at + n], n)
        at += n
    return data


def slots(pages, page_size):
    return Indices(s for p in pages for s in range(p * page_size, (p + 1) * page_size))


def make_config(model="org/model-7b", tp_rank=0, tp_size=1, mla=False, **extra):
    return Config(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                  attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
                  is_page_first_layout=True, model_name=model, extra_config=extra)


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-sglang-")
        self.backends = []

    def tearDown(self):
        for b in self.backends:
            b.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def backend(self, pool, config=None, **extra):
        extra.setdefault("dir", self.dir)
        extra.setdefault("interface_v1", 1)
        config = config or make_config(**extra)
        config.extra_config = extra
        b = KvtierHiCacheStorage(config, {})
        b.register_mem_pool_host(pool)
        self.backends.append(b)
        return b


class ZeroCopy(Base):
    def round_trip(self, pool, mla=False):
        b = self.backend(pool, make_config(mla=mla))
        tokens = list(range(1000, 1000 + 8 * pool.page_size))
        keys = sglang_keys(tokens, pool.page_size)
        want = [fill_page(pool, p, f"page{p}") for p in range(8)]
        self.assertEqual(b.batch_set_v1(keys, slots(range(8), pool.page_size)), [True] * 8)
        self.assertEqual(b.batch_exists(keys), 8)
        self.assertEqual(b.batch_exists(keys[:3] + ["0" * 64] + keys[4:]), 3)
        # Read back into other host pages.
        self.assertEqual(b.batch_get_v1(keys, slots(range(20, 28), pool.page_size)), [True] * 8)
        for i in range(8):
            self.assertEqual(page_bytes_at(pool, 20 + i), want[i], f"page {i}")
        return b

    def test_mha_page_first(self):
        self.round_trip(MHAPool("page_first"))

    def test_mha_page_first_direct(self):
        self.round_trip(MHAPool("page_first_direct"))

    def test_mha_layer_first(self):
        b = self.round_trip(MHAPool("layer_first"))
        self.assertEqual(b.segs_per_page, 2 * 3)

    def test_mla_page_first(self):
        b = self.round_trip(MLAPool(), mla=True)
        self.assertEqual(b.segs_per_page, 1)

    def test_mla_ranks_share_one_writer(self):
        """MLA KV is the same on every TP rank: rank 0 writes the shared dir, rank 1 reads it
        (a read-only view beside the writer) and never writes."""
        writer_pool = MLAPool()
        writer = self.backend(writer_pool, make_config(mla=True, tp_rank=0, tp_size=2))
        reader_pool = MLAPool()
        reader = self.backend(reader_pool, make_config(mla=True, tp_rank=1, tp_size=2))
        self.assertEqual(writer.dir, reader.dir)
        self.assertTrue(reader.read_only)
        keys = sglang_keys(list(range(4 * writer_pool.page_size)), writer_pool.page_size)
        want = [fill_page(writer_pool, p, f"mla{p}") for p in range(4)]
        self.assertEqual(writer.batch_set_v1(keys, slots(range(4), 4)), [True] * 4)
        self.assertEqual(reader.batch_exists(keys), 4)
        self.assertEqual(reader.batch_get_v1(keys, slots(range(8, 12), 4)), [True] * 4)
        for i in range(4):
            self.assertEqual(page_bytes_at(reader_pool, 8 + i), want[i])
        self.assertEqual(reader.batch_set_v1(keys, slots(range(4), 4)), [False] * 4)
        self.assertFalse(reader.clear())

    def test_mla_reader_before_its_writer(self):
        """A reader rank that starts before the writer made the dir serves misses, then finds
        the writer's pages at its first call once they are there (no second's wait: it
        looks for the dir's index at each call until it opens it)."""
        reader_pool = MLAPool()
        reader = self.backend(reader_pool, make_config(mla=True, tp_rank=1, tp_size=2))
        keys = sglang_keys(list(range(2 * reader_pool.page_size)), reader_pool.page_size)
        self.assertIsNone(reader.store)
        self.assertEqual(reader.batch_exists(keys), 0)
        self.assertEqual(reader.batch_get_v1(keys, slots(range(2), 4)), [False] * 2)
        writer_pool = MLAPool()
        writer = self.backend(writer_pool, make_config(mla=True, tp_rank=0, tp_size=2))
        fill_page(writer_pool, 0, "w0")
        fill_page(writer_pool, 1, "w1")
        self.assertEqual(writer.batch_set_v1(keys, slots(range(2), 4)), [True] * 2)
        self.assertEqual(reader.batch_exists(keys), 2)
        self.assertEqual(reader.batch_get_v1(keys, slots(range(2), 4)), [True] * 2)
        self.assertEqual(page_bytes_at(reader_pool, 1), page_bytes_at(writer_pool, 1))

    def test_misses_and_stats(self):
        pool = MHAPool("page_first")
        b = self.backend(pool)
        keys = sglang_keys(list(range(4 * pool.page_size)), pool.page_size)
        self.assertEqual(b.batch_exists(keys), 0)
        self.assertEqual(b.batch_get_v1(keys, slots(range(4), pool.page_size)), [False] * 4)
        self.assertEqual(b.batch_set_v1(keys[:2], slots(range(2), pool.page_size)), [True] * 2)
        self.assertEqual(b.batch_get_v1(keys, slots(range(4), pool.page_size)),
                         [True, True, False, False])
        stats = b.get_stats()
        pgs = stats["prefetch_pgs"] if isinstance(stats, dict) else stats.prefetch_pgs
        self.assertEqual(sum(pgs), 2)
        self.assertEqual(b.store_stats()["pages"], 2)
        self.assertTrue(b.clear())
        self.assertEqual(b.batch_exists(keys), 0)

    def test_sync_option(self):
        # relaxed unless the config says durable (as the vLLM tier); anything else refused
        import kvtier.sglang as mod

        seen, real = [], mod.PageStore

        def spy(*a, **kw):
            seen.append(kw.get("sync"))
            return real(*a, **kw)

        mod.PageStore = spy
        try:
            for sync in (None, "durable", "relaxed"):
                extra = {"dir": os.path.join(self.dir, str(sync))}
                if sync:
                    extra["sync"] = sync
                pool = MHAPool("page_first")
                b = self.backend(pool, **extra)
                keys = sglang_keys(list(range(pool.page_size)), pool.page_size)
                self.assertEqual(b.batch_set_v1(keys, slots([0], pool.page_size)), [True])
        finally:
            mod.PageStore = real
        self.assertEqual(seen, ["relaxed", "durable", "relaxed"])
        with self.assertRaisesRegex(ValueError, "sync"):
            KvtierHiCacheStorage(make_config(), {"dir": self.dir, "sync": "fast"})

    def test_restart_keeps_pages(self):
        pool = MHAPool("page_first")
        b = self.backend(pool)
        keys = sglang_keys(list(range(6 * pool.page_size)), pool.page_size)
        want = [fill_page(pool, p, f"r{p}") for p in range(6)]
        self.assertEqual(b.batch_set_v1(keys, slots(range(6), pool.page_size)), [True] * 6)
        b.close()
        b2 = self.backend(MHAPool("page_first"))
        pool2 = b2.mem_pool_host
        self.assertEqual(b2.batch_exists(keys), 6)
        self.assertEqual(b2.batch_get_v1(keys, slots(range(6), pool.page_size)), [True] * 6)
        for i in range(6):
            self.assertEqual(page_bytes_at(pool2, i), want[i])

    def test_other_model_never_served(self):
        pool = MHAPool("page_first")
        b = self.backend(pool)
        keys = sglang_keys(list(range(2 * pool.page_size)), pool.page_size)
        fill_page(pool, 0, "a")
        fill_page(pool, 1, "b")
        self.assertEqual(b.batch_set_v1(keys, slots(range(2), pool.page_size)), [True] * 2)
        b.close()
        for config, other_pool in (
            (make_config(model="org/other-model"), MHAPool("page_first")),
            (make_config(), MHAPool("page_first", head_dim=16)),  # another geometry
            (make_config(), MHAPool("layer_first")),  # another layout
        ):
            config.extra_config = {"dir": self.dir, "interface_v1": 1}
            other = KvtierHiCacheStorage(config, {})
            with self.assertRaisesRegex(RuntimeError, "refused"):
                other.register_mem_pool_host(other_pool)
        # The copy path lays pages out otherwise: never served from a v1 dir either.
        config = make_config()
        config.extra_config = {"dir": self.dir}
        with self.assertRaisesRegex(RuntimeError, "refused"):
            KvtierHiCacheStorage(config, {}).register_mem_pool_host(MHAPool("page_first"))

    def test_damaged_slab_is_a_miss(self):
        pool = MHAPool("page_first", head_dim=64)  # pages of 6 KiB
        b = self.backend(pool)
        keys = sglang_keys(list(range(16 * pool.page_size)), pool.page_size)
        want = [fill_page(pool, p, f"d{p}") for p in range(16)]
        self.assertEqual(b.batch_set_v1(keys, slots(range(16), pool.page_size)), [True] * 16)
        b.close()
        # Every slab file (the store stripes its pages over several), a block here and there
        # past the slab's head: some pages damaged, some not.
        for slab in glob.glob(os.path.join(b.dir, "slabs", "*.slab")):
            with open(slab, "r+b") as f:
                for at in range(8 << 10, os.path.getsize(slab), 40 << 10):
                    f.seek(at)
                    f.write(b"\x5a" * 4096)
        b2 = self.backend(MHAPool("page_first", head_dim=64))
        ok = b2.batch_get_v1(keys, slots(range(16), pool.page_size))
        self.assertIn(False, ok)
        self.assertIn(True, ok)  # the undamaged pages still served, and exact
        for i, good in enumerate(ok):
            if good:
                self.assertEqual(page_bytes_at(b2.mem_pool_host, i), want[i])

    def test_full_store_keeps_newest(self):
        pool = MHAPool("page_first", pages=256, head_dim=64)
        b = self.backend(pool, capacity=64 * 12288)  # about 64 slots of 12 KiB
        for r in range(8):
            keys = sglang_keys([r] * (32 * pool.page_size), pool.page_size)
            for p in range(32):
                fill_page(pool, p, f"f{r}.{p}")
            ok = b.batch_set_v1(keys, slots(range(32), pool.page_size))
            self.assertTrue(all(ok))
        self.assertLessEqual(b.store_stats()["pages"], b.store_stats()["capacity_pages"])
        self.assertEqual(b.batch_exists(keys), 32)  # the newest batch is whole

    def test_full_disk(self):
        """The file system fills up under a running store: writes that need room fail (False,
        no exception), and every page stored before or after reads back exact."""
        mnt = os.path.join(self.dir, "small")
        os.makedirs(mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=72m", "tmpfs", mnt],
                           capture_output=True)
        if r.returncode:
            self.skipTest(f"cannot mount a small tmpfs here: {r.stderr.decode().strip()}")
        try:
            pool = MHAPool("page_first", pages=256, head_dim=64)
            b = self.backend(pool, dir=mnt, capacity="64M")  # one slab of 64 MiB
            stored, want, tried = [], {}, 0

            def write_rounds(first, n):
                nonlocal tried
                for r_ in range(first, first + n):
                    keys = sglang_keys([r_] * (32 * pool.page_size), pool.page_size)
                    for p in range(32):
                        want[keys[p]] = fill_page(pool, p, f"full{r_}.{p}")
                    ok = b.batch_set_v1(keys, slots(range(32), pool.page_size))
                    stored.extend(k for k, good in zip(keys, ok) if good)
                    tried += 32

            write_rounds(0, 4)
            self.assertEqual(len(stored), tried, "room enough at first")
            with open(os.path.join(mnt, "filler"), "wb") as f:  # take what is left
                try:
                    while True:
                        f.write(b"\0" * (1 << 20))
                        f.flush()
                except OSError:
                    pass
            write_rounds(4, 60)
            self.assertLess(len(stored), tried, "no write ever met the full file system")
            for at in range(0, len(stored), 32):
                chunk = stored[at:at + 32]
                ok = b.batch_get_v1(chunk, slots(range(64, 64 + len(chunk)), pool.page_size))
                for i, good in enumerate(ok):
                    if good:
                        self.assertEqual(page_bytes_at(pool, 64 + i), want[chunk[i]])
            b.close()
            self.backends.remove(b)
        finally:
            subprocess.run(["umount", "-l", mnt], capture_output=True)

    def test_errors_are_misses(self):
        pool = MHAPool("page_first")
        b = self.backend(pool)
        keys = sglang_keys(list(range(2 * pool.page_size)), pool.page_size)
        # host_indices of the wrong length: no exception, a miss / nothing stored
        self.assertEqual(b.batch_get_v1(keys, slots(range(1), pool.page_size)), [False] * 2)
        self.assertEqual(b.batch_set_v1(keys, slots(range(1), pool.page_size)), [False] * 2)
        self.assertEqual(b.batch_exists(["not a key"]), 0)
        self.assertEqual(b.batch_set_v1(keys, slots(range(2), pool.page_size)), [True] * 2)
        b.close()
        self.assertEqual(b.batch_exists(keys), 0)  # closed: a miss, never reopened
        self.assertIsNone(b.store)

    def test_three_threads(self):
        pool = MHAPool("page_first", pages=192)
        b = self.backend(pool)
        chains = [sglang_keys([c] * (8 * pool.page_size), pool.page_size) for c in range(12)]
        want = {}
        for c in range(12):
            for p in range(8):
                want[(c, p)] = fill_page(pool, c * 8 + p, f"t{c}.{p}")
        errors = []
        done = threading.Event()

        def setter():
            for c in range(12):
                ok = b.batch_set_v1(chains[c], slots(range(c * 8, c * 8 + 8), pool.page_size))
                if not all(ok):
                    errors.append(("set", c))
            done.set()

        def getter():
            # reads into pages 96.. (its own), compares what it got
            while not done.is_set() or not getattr(getter, "last", False):
                getter.last = done.is_set()
                for c in range(12):
                    ok = b.batch_get_v1(chains[c], slots(range(96, 104), pool.page_size))
                    for p, good in enumerate(ok):
                        if good and page_bytes_at(pool, 96 + p) != want[(c, p)]:
                            errors.append(("wrong bytes", c, p))

        def exister():
            while not done.is_set():
                for c in range(12):
                    b.batch_exists(chains[c])

        threads = [threading.Thread(target=f) for f in (setter, getter, exister)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        for c in range(12):
            self.assertEqual(b.batch_exists(chains[c]), 8)


class CopyPath(Base):
    def test_flat_pages(self):
        pool = MHAPool("page_first")
        b = self.backend(pool, interface_v1=0)
        page = len(pool.get_dummy_flat_data_page())
        keys = sglang_keys(list(range(3 * pool.page_size)), pool.page_size)
        values = [bytearray(hashlib.shake_256(k.encode()).digest(page)) for k in keys]
        self.assertTrue(b.set(keys[0], values[0]))
        self.assertTrue(b.batch_set(keys[1:], values[1:]))
        self.assertTrue(b.exists(keys[2]))
        self.assertFalse(b.exists("f" * 64))
        got = b.batch_get(keys, [bytearray(page) for _ in keys])
        self.assertEqual([bytes(g) for g in got], [bytes(v) for v in values])
        self.assertIsNone(b.get("e" * 64, bytearray(page)))
        self.assertFalse(b.set(keys[0], bytearray(page - 1)))  # the wrong size: refused


class Helpers(unittest.TestCase):
    def test_keys_and_sizes(self):
        self.assertEqual(key_bytes("ab" * 32), bytes([0xAB]) * 32)
        self.assertEqual(len(key_bytes("something else")), 32)
        self.assertEqual(parse_bytes("2G"), 2 << 30)
        self.assertEqual(parse_bytes("512MiB"), 512 << 20)
        self.assertEqual(parse_bytes(4096), 4096)

    def test_needs_a_dir(self):
        with self.assertRaises(ValueError):
            KvtierHiCacheStorage(make_config(), {})


if __name__ == "__main__":
    unittest.main()
