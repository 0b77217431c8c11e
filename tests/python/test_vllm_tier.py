"""kvtier.vllm.KvtierTier driven through vLLM 0.33.0's secondary-tier signatures, without vLLM.

Where vLLM is not installed, tests/python/vllm_standin (a stand-in of the few vLLM names the
tier imports: TransferJob, JobResult, LookupResult, the base class, the config dataclasses) is
put on the path. The primary tier's memory is a page-aligned anonymous mapping seen through a
numpy array, chunk c at c * stride, as vLLM's CPU pool is. Every chunk read back is compared
byte for byte with what was stored. With a remote: a redis-server of the test's own shared by two
tiers on two dirs, and a server that accepts connections and never answers.
tests/vllm does the same under the real vLLM.
"""

import errno
import glob
import hashlib
import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import vllm.v1.kv_offload.tiering.base  # noqa: F401 - the real one, where installed
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "vllm_standin"))

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.config import (  # noqa: E402
    OffloadingCacheConfig, OffloadingConfig, OffloadingGroupConfig, OffloadingModelConfig,
    OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.base import TransferJob  # noqa: E402

import kvtier  # noqa: E402
from kvtier.vllm import KvtierTier, page_key  # noqa: E402

MiB = 1 << 20


class Spec:
    """What the tier reads of vLLM's OffloadingSpec: config and kv_events_config."""

    class Events:
        enable_kv_cache_events = True

    def __init__(self, model="test/model", dtype="bfloat16", tokens_per_block=16,
                 blocks_per_chunk=4, tp=1, layers=("l0", "l1")):
        self.kv_events_config = Spec.Events()
        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=tokens_per_block,
                                          layer_names=tuple(layers), group_id=0),),
            worker_kv_bytes_per_block=4096, enable_kv_cache_events=True, extra_config={},
            engine_id="e0", model=OffloadingModelConfig(name=model, dtype=dtype),
            cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block,
                                        blocks_per_chunk=blocks_per_chunk),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=tp, tp_size=tp, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=False))


class Pool:
    """The CPU pool: an anonymous mapping (page-aligned) of n chunks, seen as (n, chunk)."""

    def __init__(self, n, chunk):
        self.mm = mmap.mmap(-1, n * chunk)
        self.arr = np.frombuffer(self.mm, dtype=np.uint8).reshape(n, chunk)
        self.view = memoryview(self.arr)
        self.n, self.chunk = n, chunk

    def fill(self, c, seed):
        self.arr[c] = np.random.default_rng(seed).integers(0, 256, self.chunk, dtype=np.uint8)

    def close(self):
        self.view.release()
        self.arr = None
        self.mm.close()


def key_of(i, group=0):
    return make_offload_key(hashlib.sha256(b"block %d" % i).digest(), group)


def content(i, chunk):
    return np.random.default_rng(1000 + i).integers(0, 256, chunk, dtype=np.uint8)


_job_ids = iter(range(1, 1 << 30))


def job(keys, chunks, promotion, req="r0"):
    return TransferJob(job_id=next(_job_ids), keys=list(keys),
                       chunk_ids=np.array(chunks, dtype=np.int32), is_promotion=promotion,
                       req_context=ReqContext(req_id=req))


def drain(tier):
    tier.drain_jobs()
    return {r.job_id: r for r in tier.get_finished_jobs()}


def has_cachestat(path):
    """Whether this kernel answers cachestat(2) (Linux 6.5) for the file at path."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rng, cs = (ctypes.c_uint64 * 2)(0, 4096), (ctypes.c_uint64 * 5)()
    fd = os.open(path, os.O_RDONLY)
    try:
        return libc.syscall(451, fd, rng, cs, 0) == 0
    finally:
        os.close(fd)


def open_tier(pool, d, spec=None, **kw):
    kw.setdefault("capacity", 256 * MiB)
    return KvtierTier(spec or Spec(), pool.view, "KvtierTier", dir=d, **kw)


class TierTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvtier-vllm-")
        self.dir = os.path.join(self.tmp, "tier")
        self.pools = []

    def tearDown(self):
        for p in self.pools:
            p.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pool(self, n, chunk):
        p = Pool(n, chunk)
        self.pools.append(p)
        return p

    def store(self, tier, pool, ids, chunks=None, req="r0"):
        chunks = list(range(len(ids))) if chunks is None else chunks
        for i, c in zip(ids, chunks):
            pool.arr[c] = content(i, pool.chunk)
        j = job([key_of(i) for i in ids], chunks, False, req)
        tier.submit_store(j)
        return j

    # ---- round trips ----

    def round_trip(self, chunk, **kw):
        pool = self.pool(16, chunk)
        tier = open_tier(pool, self.dir, **kw)
        try:
            self.assertEqual(pool.view.strides[0], chunk)
            j = self.store(tier, pool, range(8))
            done = drain(tier)
            self.assertTrue(done[j.job_id].success)
            self.assertEqual(done[j.job_id].transfer_bytes, 8 * chunk)
            for i in range(8):
                self.assertIs(tier.lookup(key_of(i), ReqContext("r1")), LookupResult.HIT)
            self.assertIs(tier.lookup(key_of(99), ReqContext("r1")), LookupResult.MISS)
            pool.arr[:] = 0
            # Into other chunk ids, in another order.
            targets = [15, 9, 8, 14, 10, 13, 11, 12]
            j = job([key_of(i) for i in range(8)], targets, True)
            tier.submit_load(j)
            r = drain(tier)[j.job_id]
            self.assertTrue(r.success)
            self.assertIsNone(r.successful_keys)
            for i, c in enumerate(targets):
                np.testing.assert_array_equal(pool.arr[c], content(i, chunk))
            self.assertFalse(pool.arr[:8].any())  # nothing landed elsewhere
            st = tier.kvtier_stats()
            self.assertEqual((st["pages"], st["stored"], st["loaded"]), (8, 8, 8))
            # O_DIRECT both ways unless page_cache is on (then the loads are copies from it)
            probe = os.path.join(self.tmp, "probe")
            open(probe, "w").close()
            cached = kw.get("page_cache") and has_cachestat(probe)
            self.assertEqual(st["cache_reads"], 8 if cached else 0)
        finally:
            tier.shutdown()

    def test_round_trip_2mib_chunks(self):
        self.round_trip(2 * MiB)

    def test_round_trip_through_the_page_cache(self):
        self.round_trip(2 * MiB, page_cache=True)

    def test_round_trip_256kib_chunks(self):
        self.round_trip(256 << 10)

    def test_partial_failure_names_the_loaded_keys(self):
        pool = self.pool(8, 256 << 10)
        tier = open_tier(pool, self.dir)
        try:
            self.store(tier, pool, [0, 2])
            drain(tier)
            pool.arr[:] = 0
            keys = [key_of(0), key_of(1), key_of(2)]
            j = job(keys, [5, 6, 7], True)
            tier.submit_load(j)
            r = drain(tier)[j.job_id]
            self.assertFalse(r.success)
            self.assertEqual(set(r.successful_keys), {key_of(0), key_of(2)})
            np.testing.assert_array_equal(pool.arr[5], content(0, pool.chunk))
            np.testing.assert_array_equal(pool.arr[7], content(2, pool.chunk))
            # Bad chunk ids and a job whose lengths differ fail their keys, no exception.
            j = job([key_of(0), key_of(2)], [3, 99], True)
            tier.submit_load(j)
            r = drain(tier)[j.job_id]
            self.assertEqual((r.success, tuple(r.successful_keys)), (False, (key_of(0),)))
            bad = TransferJob(job_id=next(_job_ids), keys=[key_of(0)],
                              chunk_ids=np.array([1, 2], dtype=np.int32), is_promotion=False,
                              req_context=ReqContext("r"))
            tier.submit_store(bad)
            self.assertFalse(drain(tier)[bad.job_id].success)
            self.assertEqual(tier.kvtier_stats()["load_failed"], 2)
        finally:
            tier.shutdown()

    def slab_offset(self, data):
        """(slab file, offset) of the first occurrence of data's first 256 bytes."""
        needle = data[:256].tobytes()
        for path in sorted(glob.glob(os.path.join(self.dir, "kv", "slabs", "*.slab"))):
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                at = m.find(needle)
                if at >= 0:
                    return path, at
        self.fail("the chunk's bytes are not in any slab file")

    def test_flipped_byte_fails_the_load_then_misses(self):
        pool = self.pool(8, 256 << 10)
        tier = open_tier(pool, self.dir)
        self.store(tier, pool, range(4))
        drain(tier)
        tier.shutdown()
        path, at = self.slab_offset(content(2, pool.chunk))
        with open(path, "r+b") as f:
            f.seek(at + 1000)
            b = f.read(1)
            f.seek(at + 1000)
            f.write(bytes([b[0] ^ 0x10]))
        tier = open_tier(pool, self.dir)
        try:
            self.assertIs(tier.lookup(key_of(2), ReqContext("r")), LookupResult.HIT)
            pool.arr[:] = 0
            j = job([key_of(i) for i in range(4)], [4, 5, 6, 7], True)
            tier.submit_load(j)
            r = drain(tier)[j.job_id]
            self.assertFalse(r.success)
            self.assertEqual(set(r.successful_keys), {key_of(0), key_of(1), key_of(3)})
            for i, c in ((0, 4), (1, 5), (3, 7)):
                np.testing.assert_array_equal(pool.arr[c], content(i, pool.chunk))
            self.assertIs(tier.lookup(key_of(2), ReqContext("r")), LookupResult.MISS)
            st = tier.kvtier_stats()
            self.assertEqual(st["load_corrupt"], 1)
            self.assertGreaterEqual(st["errors"], 1)
        finally:
            tier.shutdown()

    # ---- restarts, capacity, crashes ----

    def test_restart_in_a_new_process_finds_every_chunk(self):
        pool = self.pool(16, 256 << 10)
        tier = open_tier(pool, self.dir, sync="relaxed")
        self.store(tier, pool, range(16))
        self.assertTrue(all(r.success for r in drain(tier).values()))
        tier.shutdown()
        out = run_child("check", self.dir, 256 << 10, 16)
        self.assertEqual(out["found"], list(range(16)))
        self.assertEqual(out["exact"], list(range(16)))
        with open(os.path.join(self.dir, "kv.json")) as f:
            self.assertEqual(json.load(f)["model_name"], "test/model")

    def test_capacity_evicts_the_least_recently_used(self):
        chunk = 2 * MiB
        pool = self.pool(12, chunk)
        tier = open_tier(pool, self.dir, capacity=8 * MiB)
        try:
            cap = tier.kvtier_stats()["capacity_pages"]
            self.assertGreaterEqual(cap, 2)
            self.assertLess(cap, 5)
            self.store(tier, pool, range(cap))
            drain(tier)
            tier.touch([key_of(0)], ReqContext("r"))  # 0 is now the most recently used
            self.store(tier, pool, [50], [11])
            drain(tier)
            found = [i for i in list(range(cap)) + [50]
                     if tier.lookup(key_of(i), ReqContext("r")) is LookupResult.HIT]
            self.assertIn(0, found)
            self.assertIn(50, found)
            self.assertNotIn(1, found)  # the oldest untouched one went
            self.assertLessEqual(len(found), cap)
            # Many more than fit: the store stays within its capacity, the newest found.
            for base in range(100, 130, 2):
                self.store(tier, pool, range(base, base + 2))
                drain(tier)
            st = tier.kvtier_stats()
            self.assertLessEqual(st["pages"], cap)
            self.assertGreater(st["evicted"], 0)
            self.assertIs(tier.lookup(key_of(129), ReqContext("r")), LookupResult.HIT)
            hits = [i for i in range(100, 130)
                    if tier.lookup(key_of(i), ReqContext("r")) is LookupResult.HIT]
            pool.arr[:] = 0
            j = job([key_of(i) for i in hits], range(len(hits)), True)
            tier.submit_load(j)
            self.assertTrue(drain(tier)[j.job_id].success)
            for c, i in enumerate(hits):
                np.testing.assert_array_equal(pool.arr[c], content(i, chunk))
        finally:
            tier.shutdown()

    def test_sigkill_mid_store_then_restart_serves_exact_chunks(self):
        env = dict(os.environ)
        p = subprocess.Popen([sys.executable, __file__, "store-forever", self.dir,
                              str(256 << 10)], stdout=subprocess.PIPE, env=env)
        try:
            line = p.stdout.readline()  # the first batch is stored
            self.assertTrue(line.startswith(b"stored"), line)
            time.sleep(0.4)
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
            p.stdout.close()
        out = run_child("check", self.dir, 256 << 10, 4000)
        self.assertGreaterEqual(len(out["found"]), 8)
        self.assertEqual(out["found"], out["exact"])

    # ---- refusals ----

    def test_other_model_or_revision_is_refused_naming_the_field(self):
        pool = self.pool(4, 256 << 10)
        open_tier(pool, self.dir, weights_revision="abc").shutdown()
        with self.assertRaisesRegex(ValueError, r"model_name: the dir has 'test/model', "
                                                r"this engine 'other/model'"):
            open_tier(pool, self.dir, Spec(model="other/model"), weights_revision="abc")
        with self.assertRaisesRegex(ValueError, "weights_revision"):
            open_tier(pool, self.dir, weights_revision="def")
        with self.assertRaisesRegex(ValueError, "dtype"):
            open_tier(pool, self.dir, Spec(dtype="float16"), weights_revision="abc")
        with self.assertRaisesRegex(ValueError, "chunk_bytes"):
            open_tier(self.pool(4, 512 << 10), self.dir, weights_revision="abc")
        # The record gone: the page store's own fingerprint still refuses.
        os.unlink(os.path.join(self.dir, "kv.json"))
        with self.assertRaisesRegex(ValueError, "another fingerprint"):
            open_tier(pool, self.dir, weights_revision="def")
        t = open_tier(pool, self.dir, weights_revision="abc")  # the right one opens
        t.shutdown()
        with self.assertRaisesRegex(ValueError, "sync"):
            open_tier(pool, self.dir, sync="sometimes")
        with self.assertRaisesRegex(ValueError, "capacity"):
            open_tier(pool, self.dir, capacity="lots")

    def test_second_engine_on_one_dir_is_refused(self):
        pool = self.pool(4, 256 << 10)
        t = open_tier(pool, self.dir)
        try:
            with self.assertRaisesRegex(RuntimeError, "in use by another process"):
                open_tier(pool, self.dir)
        finally:
            t.shutdown()

    def test_other_vllm_interface_names_both_versions(self):
        code = (
            "import sys; sys.path.insert(0, %r)\n"
            "import vllm, vllm.v1.kv_offload.tiering.base as b\n"
            "vllm.__version__ = '0.28.1'\n"
            "del b.TransferJob.__dataclass_fields__['chunk_ids']\n"
            "import kvtier.vllm\n" % os.path.join(HERE, "vllm_standin"))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("supports vLLM 0.33.0; vLLM 0.28.1 is installed", r.stderr)
        self.assertIn("TransferJob.chunk_ids", r.stderr)

    # ---- the rest of the interface ----

    def test_drain_waits_for_queued_work(self):
        pool = self.pool(64, 256 << 10)
        tier = open_tier(pool, self.dir)
        try:
            jobs = [self.store(tier, pool, range(i * 4, i * 4 + 4), range(i * 4, i * 4 + 4))
                    for i in range(16)]
            self.assertTrue(tier.has_pending_work())
            tier.drain_jobs()
            done = {r.job_id: r for r in tier.get_finished_jobs()}
            self.assertEqual(set(done), {j.job_id for j in jobs})
            self.assertTrue(all(r.success for r in done.values()))
            self.assertFalse(tier.has_pending_work())
            self.assertEqual(list(tier.get_finished_jobs()), [])
        finally:
            tier.shutdown()

    def test_events_stats_metrics_and_touch(self):
        pool = self.pool(8, 256 << 10)
        tier = open_tier(pool, self.dir, enable_kv_events=True, locality="LOCAL")
        try:
            self.store(tier, pool, range(3))
            drain(tier)
            (ev,) = list(tier.take_events())
            self.assertEqual((ev.keys, ev.removed), ([key_of(i) for i in range(3)], False))
            self.assertEqual(list(tier.take_events()), [])
            defs = KvtierTier.build_metric_definitions({})
            self.assertIn("vllm:kv_offload_kvtier_pages", defs)
            stats = tier.get_stats()
            self.assertEqual(stats.gauges[("vllm:kv_offload_kvtier_pages", ("KvtierTier",))], 3)
            self.assertEqual(stats.counters[("vllm:kv_offload_kvtier_written_bytes",
                                             ("KvtierTier",))], 3 * pool.chunk)
            self.assertNotIn(("vllm:kv_offload_kvtier_written_bytes", ("KvtierTier",)),
                             tier.get_stats().counters)  # counters report what is new
            self.assertEqual(tier.config_info()["kvtier_sync"], "relaxed")
            self.assertEqual(set(KvtierTier.config_info_keys({})), set(tier.config_info()))
            tier.touch([key_of(0), key_of(77)], ReqContext("r"))
            self.assertEqual(tier.kvtier_stats()["touched"], 1)
        finally:
            tier.shutdown()
        # After shutdown every call is a miss or a failed job, never an exception.
        self.assertIs(tier.lookup(key_of(0), ReqContext("r")), LookupResult.MISS)
        j = job([key_of(0)], [0], True)
        tier.submit_load(j)
        self.assertFalse(drain(tier)[j.job_id].success)
        tier.shutdown()

    def test_parents_follow_the_request_positions(self):
        pool = self.pool(8, 256 << 10)
        tier = open_tier(pool, self.dir)
        try:
            ctx = ReqContext("r9")
            span = 16 * 4
            for i in range(6):
                ctx.set_offload_key_position(key_of(i), (i + 1) * span)
            for part in ([0, 1, 2], [3, 4, 5]):  # two jobs: the second chains onto the first
                j = TransferJob(job_id=next(_job_ids), keys=[key_of(i) for i in part],
                                chunk_ids=np.array(part, dtype=np.int32), is_promotion=False,
                                req_context=ctx)
                tier.submit_store(j)
            drain(tier)
        finally:
            tier.shutdown()
        ctl = os.path.join(os.path.dirname(HERE), "..", "build", "tools", "kvtier-ctl")
        if not os.path.exists(ctl):
            self.skipTest("kvtier-ctl is not built")
        r = subprocess.run([ctl, "tree", "--json", os.path.join(self.dir, "kv")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        tree = json.loads(r.stdout)
        (ns,) = tree["namespaces"]
        # One chain of six pages (unlinked pages would be six roots), none detached.
        self.assertEqual([(c["pages"], c["first_token"]) for c in ns["children"]], [(6, 0)])
        self.assertEqual(tree["detached"], [])

    def test_three_threads_at_once(self):
        chunk = 256 << 10
        pool = self.pool(48, chunk)
        tier = open_tier(pool, self.dir)
        errors = []

        def worker(t):
            try:
                base = t * 16
                for rnd in range(6):
                    ids = [1000 * t + 10 * rnd + i for i in range(8)]
                    for n, i in enumerate(ids):
                        pool.arr[base + n] = content(i, chunk)
                    tier.submit_store(job([key_of(i) for i in ids], range(base, base + 8),
                                          False, f"t{t}"))
                    while any(tier.lookup(key_of(i), ReqContext("x")) is not LookupResult.HIT
                              for i in ids):
                        tier.get_finished_jobs()  # lands stores, any thread's
                        time.sleep(0.001)
                    j = job([key_of(i) for i in ids], range(base + 8, base + 16), True,
                            f"t{t}")
                    tier.submit_load(j)
                    while True:
                        tier.get_finished_jobs()
                        if j.job_id not in tier._jobs:
                            break
                        time.sleep(0.001)
                    for n, i in enumerate(ids):
                        if not np.array_equal(pool.arr[base + 8 + n], content(i, chunk)):
                            errors.append((t, i))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        try:
            self.assertFalse(any(th.is_alive() for th in threads))
            self.assertEqual(errors, [])
            self.assertEqual(tier.kvtier_stats()["loaded"], 3 * 6 * 8)
        finally:
            tier.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """A TCP server that accepts every connection and never answers: a hung Redis."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            while True:
                self.conns.append(self.sock.accept()[0])
        except OSError:
            pass

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def resolve(tier, key, limit=30.0):
    """Look key up as vLLM does (a step between tries) until it is not RETRY: (result, s)."""
    t0 = time.monotonic()
    while True:
        r = tier.lookup(key, ReqContext("remote"))
        if r is not LookupResult.RETRY or time.monotonic() - t0 > limit:
            return r, time.monotonic() - t0
        tier.on_schedule_end(None)
        time.sleep(0.002)


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed")
class RemoteTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvtier-vllm-remote-")
        self.port = free_port()
        self.srv = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.tmp], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}"
        self.pools = []

    def tearDown(self):
        self.srv.kill()
        self.srv.wait()
        for p in self.pools:
            p.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pool(self, n, chunk):
        p = Pool(n, chunk)
        self.pools.append(p)
        return p

    def test_second_engine_is_served_from_the_server(self):
        chunk = 256 << 10
        a_pool, b_pool = self.pool(8, chunk), self.pool(8, chunk)
        a = open_tier(a_pool, os.path.join(self.tmp, "a"), remote=self.url,
                      remote_timeout_ms=500)
        b = open_tier(b_pool, os.path.join(self.tmp, "b"), remote=self.url,
                      remote_timeout_ms=500)
        try:
            for i in range(6):
                a_pool.arr[i] = content(i, chunk)
            j = job([key_of(i) for i in range(6)], range(6), False)
            a.submit_store(j)
            self.assertTrue(drain(a)[j.job_id].success)
            # b's disk has none: RETRY while the server is asked, then HIT.
            self.assertIs(b.lookup(key_of(0), ReqContext("x")), LookupResult.RETRY)
            for i in range(6):
                self.assertIs(resolve(b, key_of(i))[0], LookupResult.HIT)
            self.assertIs(resolve(b, key_of(77))[0], LookupResult.MISS)
            j = job([key_of(i) for i in range(6)], [7, 6, 5, 4, 3, 2], True)
            b.submit_load(j)
            self.assertTrue(drain(b)[j.job_id].success)
            for i, c in enumerate([7, 6, 5, 4, 3, 2]):
                np.testing.assert_array_equal(b_pool.arr[c], content(i, chunk))
            st = b.kvtier_stats()
            self.assertEqual((st["remote"], st["remote_reads"], st["get_hits"]), (True, 6, 0))
            self.assertEqual(b.config_info()["kvtier_remote"], self.url)
        finally:
            a.shutdown()
            b.shutdown()

    def test_a_server_that_never_answers_costs_hits_in_bounded_time(self):
        chunk = 256 << 10
        hung = SilentServer()
        pool = self.pool(8, chunk)
        t0 = time.monotonic()
        tier = open_tier(pool, os.path.join(self.tmp, "h"),
                         remote=f"redis://127.0.0.1:{hung.port}", remote_timeout_ms=200)
        try:
            for i in range(4):
                pool.arr[i] = content(i, chunk)
            j = job([key_of(i) for i in range(4)], range(4), False)
            tier.submit_store(j)
            self.assertTrue(drain(tier)[j.job_id].success)  # the disk kept every chunk
            r, took = resolve(tier, key_of(50))
            self.assertIs(r, LookupResult.MISS)
            self.assertLess(took, 3.0)
            self.assertIs(tier.lookup(key_of(1), ReqContext("x")), LookupResult.HIT)  # disk
            pool.arr[4:] = 0
            j = job([key_of(i) for i in range(4)] + [key_of(50)], [4, 5, 6, 7, 3], True)
            tier.submit_load(j)
            r = drain(tier)[j.job_id]
            self.assertEqual(set(r.successful_keys), {key_of(i) for i in range(4)})
            for i, c in enumerate([4, 5, 6, 7]):
                np.testing.assert_array_equal(pool.arr[c], content(i, chunk))
        finally:
            tier.shutdown()
            hung.close()
        self.assertLess(time.monotonic() - t0, 20.0)


def run_child(what, d, chunk, n):
    r = subprocess.run([sys.executable, __file__, what, d, str(chunk), str(n)],
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise AssertionError(f"child {what} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def child_check(d, chunk, n):
    """A new process: which of chunks 0..n-1 the dir holds, and which load exactly."""
    pool = Pool(64, chunk)
    tier = open_tier(pool, d)
    found = [i for i in range(n) if tier.lookup(key_of(i), ReqContext("c")) is LookupResult.HIT]
    exact = []
    for at in range(0, len(found), 64):
        part = found[at:at + 64]
        pool.arr[:] = 0
        j = job([key_of(i) for i in part], range(len(part)), True)
        tier.submit_load(j)
        drain(tier)
        exact += [i for c, i in enumerate(part) if np.array_equal(pool.arr[c], content(i, chunk))]
    tier.shutdown()
    pool.close()
    print(json.dumps({"found": found, "exact": exact}))


def child_store_forever(d, chunk):
    """Store chunks 0, 1, 2, ... in jobs of 8 until killed."""
    pool = Pool(16, chunk)
    tier = open_tier(pool, d, sync="relaxed")
    i = 0
    while True:
        ids = list(range(i, i + 8))
        for c, k in enumerate(ids):
            pool.arr[c] = content(k, chunk)
        tier.submit_store(job([key_of(k) for k in ids], range(8), False))
        drain(tier)
        if i == 0:
            print("stored", flush=True)
        i += 8


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "check":
        child_check(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif len(sys.argv) > 1 and sys.argv[1] == "store-forever":
        child_store_forever(sys.argv[2], int(sys.argv[3]))
    else:
        unittest.main()
