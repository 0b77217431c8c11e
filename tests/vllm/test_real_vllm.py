"""kvtier.vllm under the real vLLM 0.33.0 (./run.sh test-vllm; no GPU: CUDA_VISIBLE_DEVICES=).

Everything here is vLLM's own but the GPU: TieringOffloadingSpec is built from the
kv_connector_extra_config JSON a user passes; its get_manager() makes the shared-memory CPU
region, the CPU primary tier (CPUPrimaryTierOffloadingManager), the secondary tiers through
SecondaryTierFactory (KvtierTier from "module_path": "kvtier.vllm", and vLLM's own fs tier
where a test compares) and the TieringOffloadingManager with its tier-poll thread. The GPU
worker's part, copying KV between the GPU and the CPU region, is played by the test: it
writes each stored chunk's bytes into the region where prepare_store put it, and reads
promoted chunks back from where prepare_load says they are. With a remote, a redis-server of
the test's own.
"""

import glob
import hashlib
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np
from vllm.v1.kv_offload.base import (LookupResult, ReqContext, ScheduleEndContext,
                                     make_offload_key)
from vllm.v1.kv_offload.config import (OffloadingCacheConfig, OffloadingConfig,
                                       OffloadingGroupConfig, OffloadingModelConfig,
                                       OffloadingParallelConfig)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

import kvtier.vllm

MiB = 1 << 20
_engines = iter(range(1 << 30))


def user_json(d, capacity="256M", cpu_bytes=32 * MiB, model_extra=None):
    """What a user passes as --kv-transfer-config (its kv_connector_extra_config part)."""
    tier = {"type": "KvtierTier", "module_path": "kvtier.vllm", "dir": d,
            "capacity": capacity, "weights_revision": "rev-1"}
    tier.update(model_extra or {})
    return json.dumps({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                       "kv_connector_extra_config": {
                           "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": cpu_bytes,
                           "secondary_tiers": [tier]}})


def key_of(i):
    return make_offload_key(hashlib.sha256(b"prefix block %d" % i).digest(), 0)


def content(i, n):
    return np.random.default_rng(7 + i).integers(0, 256, n, dtype=np.uint8)


class Engine:
    """The scheduler side of one engine: vLLM's spec and manager, from the user's JSON."""

    def __init__(self, kv_transfer_config, model="Qwen/Qwen3-0.6B", chunk=2 * MiB):
        extra = json.loads(kv_transfer_config)["kv_connector_extra_config"]
        blocks_per_chunk = 4
        self.config = OffloadingConfig(
            groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0",),
                                          group_id=0),),
            worker_kv_bytes_per_block=chunk // blocks_per_chunk, enable_kv_cache_events=False,
            extra_config=extra, engine_id=f"kvtier-test-{os.getpid()}-{next(_engines)}",
            model=OffloadingModelConfig(name=model, dtype="bfloat16"),
            cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=blocks_per_chunk),
            parallel=OffloadingParallelConfig(
                rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                is_parallelism_agnostic=False))
        self.spec = TieringOffloadingSpec(self.config)
        self.manager = self.spec.get_manager()
        self.view = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        self.chunk = self.view.shape[1]
        self.tiers = self.manager.secondary_tiers
        self.reqs = {}

    def ctx(self, req):
        if req not in self.reqs:
            self.reqs[req] = ReqContext(req_id=req)
            with self.manager.lock:
                self.manager.on_new_request(self.reqs[req])
        return self.reqs[req]

    def store(self, req, ids):
        """GPU -> CPU for chunks ids of request req, then vLLM cascades them to the tiers."""
        ctx = self.ctx(req)
        keys = [key_of(i) for i in ids]
        for n, i in enumerate(ids):
            ctx.set_offload_key_position(keys[n], (i + 1) * 64)
        with self.manager.lock:
            out = self.manager.prepare_store(keys, ctx)
        assert out is not None, "the CPU pool had no room"
        where = dict(zip(out.keys_to_store, out.store_spec.chunk_ids))
        for i, k in zip(ids, keys):
            if k in where:
                self.view[int(where[k])] = content(i, self.chunk)  # the GPU worker's copy
        with self.manager.lock:
            self.manager.complete_store(keys, ctx)

    def step(self):
        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=(),
                                                            preempted_req_ids=()))

    def settle(self, timeout=60):
        """Steps until no job is in flight."""
        end = time.monotonic() + timeout
        while True:
            self.step()
            with self.manager.lock:
                if not self.manager.has_pending_work():
                    return
            assert time.monotonic() < end, "jobs still in flight"
            time.sleep(0.002)

    def fetch(self, req, i, timeout=60):
        """Look chunk i up as the scheduler does until it is HIT in the CPU pool (promoted
        from a secondary tier if need be) or a MISS; its bytes on a HIT, else None."""
        ctx = self.ctx(req)
        end = time.monotonic() + timeout
        while True:
            with self.manager.lock:
                r = self.manager.lookup(key_of(i), ctx)
            if r is LookupResult.MISS:
                return None
            if r is LookupResult.HIT:
                with self.manager.lock:
                    spec = self.manager.prepare_load([key_of(i)], ctx)
                data = self.view[int(spec.chunk_ids[0])].copy()  # the GPU worker's read
                with self.manager.lock:
                    self.manager.complete_load([key_of(i)], ctx)
                return data
            assert time.monotonic() < end, f"chunk {i} stuck at {r}"
            self.step()
            time.sleep(0.002)

    def in_primary(self, i):
        ctx = self.ctx("probe")
        with self.manager.lock:
            return self.manager.primary_tier.lookup(key_of(i), ctx) is LookupResult.HIT

    def finish(self, req):
        with self.manager.lock:
            self.manager.on_request_finished(self.reqs.pop(req))

    def shutdown(self):
        for req in list(self.reqs):
            self.finish(req)
        self.settle()
        self.view = None  # the worker's view of the region goes before vLLM unmaps it
        self.manager.shutdown()


class RealVllmTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvtier-real-vllm-")
        self.dir = os.path.join(self.tmp, "kv")
        self.engines = []

    def tearDown(self):
        for e in self.engines:
            try:
                e.shutdown()
            except Exception:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def engine(self, **kw):
        e = Engine(user_json(self.dir, **{k: v for k, v in kw.items() if k != "model"}),
                   **({"model": kw["model"]} if "model" in kw else {}))
        self.engines.append(e)
        return e

    def close(self, e):
        self.engines.remove(e)
        e.shutdown()

    def test_factory_builds_the_tier_from_the_users_json(self):
        e = self.engine()
        (tier,) = e.tiers
        self.assertIsInstance(tier, kvtier.vllm.KvtierTier)
        self.assertEqual(tier.tier_type, "KvtierTier")
        self.assertEqual(tier.capacity, 256 * MiB)
        self.assertEqual(tier.block_size_bytes, 2 * MiB)
        self.assertTrue(os.path.isdir(os.path.join(self.dir, "kv")))
        with open(os.path.join(self.dir, "kv.json")) as f:
            rec = json.load(f)
        self.assertEqual((rec["model_name"], rec["weights_revision"], rec["chunk_bytes"]),
                         ("Qwen/Qwen3-0.6B", "rev-1", 2 * MiB))
        defs = TieringOffloadingSpec.build_metric_definitions(e.config.extra_config)
        self.assertIn("vllm:kv_offload_kvtier_pages", defs)
        self.assertIn("kvtier_dir", TieringOffloadingSpec.config_info_keys(
            e.config.extra_config))
        with e.manager.lock:
            infos = e.manager.config_info()
        self.assertEqual(infos[1]["kvtier_dir"], os.path.join(self.dir, "kv"))

    def test_cascade_evict_promote_exact(self):
        e = self.engine()
        n = e.view.shape[0]
        self.assertEqual(n, 16)  # 32 MiB of 2 MiB chunks
        for r in range(3):  # 24 chunks through a CPU pool of 16
            e.store(f"req{r}", list(range(8 * r, 8 * r + 8)))
            e.settle()
        tier = e.tiers[0]
        self.assertEqual(tier.kvtier_stats()["pages"], 24)
        evicted = [i for i in range(24) if not e.in_primary(i)]
        self.assertGreaterEqual(len(evicted), 8)
        for i in range(24):  # every one HIT in kvtier, by the manager's own lookup path
            self.assertIs(tier.lookup(key_of(i), e.ctx("x")), LookupResult.HIT)
        for i in evicted:  # promoted secondary -> CPU, then byte for byte
            np.testing.assert_array_equal(e.fetch("reader", i), content(i, e.chunk))
        st = tier.kvtier_stats()
        self.assertEqual(st["loaded"], len(evicted))
        self.assertIsNone(e.fetch("reader", 999))  # in no tier: a MISS
        with e.manager.lock:
            stats = e.manager.get_stats()
        text = json.dumps(stats.reduce() if stats else {})
        self.assertIn("vllm:kv_offload_kvtier_pages", text)

    def flip_byte(self, i, chunk):
        needle = content(i, chunk)[:256].tobytes()
        for path in glob.glob(os.path.join(self.dir, "kv", "slabs", "*.slab")):
            with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                at = m.find(needle)
                if at >= 0:
                    m[at + 4096] ^= 0x01
                    m.flush()
                    return
        self.fail(f"chunk {i} not found in the slabs")

    def test_failed_promotion_is_recomputed(self):
        e = self.engine()
        for r in range(3):
            e.store(f"req{r}", list(range(8 * r, 8 * r + 8)))
            e.settle()
        evicted = [i for i in range(24) if not e.in_primary(i)]
        bad = evicted[1]
        self.flip_byte(bad, e.chunk)
        os.posix_fadvise(os.open(glob.glob(os.path.join(self.dir, "kv", "slabs", "*.slab"))[0],
                                 os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
        # The manager finds it in kvtier, promotes it, the read fails its checksum: vLLM
        # finalizes the primary slot as failed and the next lookup is a MISS (recompute).
        self.assertIsNone(e.fetch("reader", bad))
        self.assertFalse(e.in_primary(bad))
        self.assertEqual(e.tiers[0].kvtier_stats()["load_corrupt"], 1)
        for i in evicted:
            if i != bad:
                np.testing.assert_array_equal(e.fetch("reader", i), content(i, e.chunk))

    def test_reset_cache_drains_and_restart_finds_everything(self):
        e = self.engine()
        for r in range(2):
            e.store(f"req{r}", list(range(8 * r, 8 * r + 8)))
        with e.manager.lock:  # with cascades in flight: drain_jobs waits for them
            e.manager.reset_cache()
            self.assertFalse(e.manager._jobs)
            e.manager.on_reset_flushed()
        self.assertEqual(e.tiers[0].kvtier_stats()["pages"], 16)
        self.close(e)
        # A new process: vLLM built anew from the same JSON finds every chunk on disk.
        r = subprocess.run([sys.executable, __file__, "restart", self.dir],
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(json.loads(r.stdout.splitlines()[-1]), {"exact": list(range(16))})

    def test_other_model_is_refused_at_start(self):
        self.close(self.engine())
        with self.assertRaisesRegex(ValueError, "model_name: the dir has 'Qwen/Qwen3-0.6B', "
                                                "this engine 'meta-llama/Llama-3.2-1B'"):
            self.engine(model="meta-llama/Llama-3.2-1B")


@unittest.skipUnless(shutil.which("redis-server"), "redis-server is not installed")
class RealVllmRemoteTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="kvtier-real-vllm-remote-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
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

    def tearDown(self):
        self.srv.kill()
        self.srv.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_second_engine_promotes_from_the_server(self):
        url = f"redis://127.0.0.1:{self.port}"
        a = Engine(user_json(os.path.join(self.tmp, "a"), model_extra={"remote": url}))
        b = Engine(user_json(os.path.join(self.tmp, "b"), model_extra={"remote": url}))
        try:
            a.store("req", list(range(8)))
            a.settle()
            # b has nothing on its disk nor in its CPU pool: vLLM's lookup gets RETRY from the
            # tier while the server is asked, then promotes each chunk from it.
            ctx = b.ctx("reader")
            with b.manager.lock:
                first = b.manager.lookup(key_of(0), ctx)
            self.assertIs(first, LookupResult.RETRY)
            for i in range(8):
                np.testing.assert_array_equal(b.fetch("reader", i), content(i, b.chunk))
            self.assertEqual(b.tiers[0].kvtier_stats()["remote_reads"], 8)
            self.assertIsNone(b.fetch("reader", 500))
        finally:
            a.shutdown()
            b.shutdown()


class BenchTest(unittest.TestCase):
    """tools/bench/bench_vllm_tier.py, small: it runs both tiers through vLLM's manager and
    reports what each serves."""

    def test_bench_runs_both_tiers_and_tells_them_apart(self):
        tmp = tempfile.mkdtemp(prefix="kvtier-real-vllm-bench-")
        bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                             "bench", "bench_vllm_tier.py")
        try:
            r = subprocess.run([sys.executable, "-W", "ignore", bench, "--dirs", tmp,
                                "--chunks", "2M", "--data", "64M", "--cpu", "48M", "--req", "4",
                                "--reps", "2", "--json"],
                               capture_output=True, text=True, timeout=600)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertEqual(os.listdir(tmp), [])  # the bench removed what it made
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        out = json.loads(r.stdout)
        self.assertEqual([row["op"] for row in out["rows"]], ["store", "load"])
        for row in out["rows"]:
            self.assertEqual(row["not_exact"], {"kvtier": 0, "fs": 0})
            for kind in ("kvtier", "vllm_fs"):
                lo, mid, hi = row[kind]
                self.assertTrue(0 < lo <= mid <= hi, row)
        (by,) = out["extras"].values()
        k, f = by["kvtier"], by["fs"]
        self.assertEqual((k["restart_exact"], f["restart_exact"]), ("31/31", "31/31"))
        self.assertEqual(k["flipped"], "a miss (recomputed)")
        self.assertTrue(f["flipped"].startswith("SERVED WRONG BYTES"), f["flipped"])
        self.assertEqual((k["lookup_hit_answer"], k["lookup_miss_answer"]), ("HIT", "MISS"))
        kept = int(k["capacity"].split(" chunks kept")[0].rsplit(" ", 1)[1].split("/")[0])
        self.assertTrue(0 < kept <= 8, k["capacity"])  # a limit of a quarter and a MiB
        self.assertIn("no limit", f["capacity"])


def restart_child(d):
    e = Engine(user_json(d))
    out = [i for i in range(16)
           if np.array_equal(e.fetch("after-restart", i), content(i, e.chunk))]
    e.shutdown()
    print(json.dumps({"exact": out}))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "restart":
        restart_child(sys.argv[2])
    else:
        unittest.main()
