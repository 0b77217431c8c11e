"""The kvtier package's embedding cache (EmbeddingCache, Embedding, kvtier.mm) against the C
engine: embeddings round trip byte for byte through every tier the package reaches (device,
host, a data dir across a restart, a redis-server of the test's own), LRU eviction under the
device budget with held embeddings kept, a damaged dir gives misses, never bytes; holds export
their bytes through the buffer protocol and cannot go while a view lives; bad arguments are
refused before anything reaches C; the GIL is let go inside a call; and SGLang's multimodal
cache interface (kvtier.mm.MultimodalCache) sits on it.
"""
import array
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import kvtier
import kvtier.mm

KIB = 1024


def key(i):
    return i.to_bytes(8, "little") + bytes(23) + b"\xe7"


def data(i, n):
    return random.Random(i * 131 + n).randbytes(n)


class EmbCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-py-emb-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class Memory(EmbCase):
    def test_round_trip_and_lru(self):
        with kvtier.EmbeddingCache(64 * KIB) as c:
            for i in range(4):
                self.assertTrue(c.put(key(i), data(i, 16 * KIB)))
            self.assertEqual(c.get(key(0)), data(0, 16 * KIB))  # 0 is the newest now
            self.assertTrue(c.put(key(4), bytearray(data(4, 16 * KIB))))
            self.assertIsNone(c.get(key(1)), "the least recently used went")
            self.assertEqual(c.lookup(key(0)), ("device", 16 * KIB))
            self.assertIsNone(c.lookup(key(1)))
            out = bytearray(20 * KIB)
            self.assertEqual(c.get_into(key(4), out), 16 * KIB)
            self.assertEqual(bytes(out[:16 * KIB]), data(4, 16 * KIB))
            with self.assertRaises(ValueError):
                c.get_into(key(4), bytearray(10))
            self.assertFalse(c.put(key(9), bytes(64 * KIB + 1)), "larger than the budget")
            st = c.stats()
            self.assertEqual(st["evicted_device"], 1)
            self.assertEqual(st["refused"], 1)
            self.assertEqual(st["device_embeddings"], 4)
            self.assertTrue(c.drop(key(4)))
            self.assertFalse(c.drop(key(4)))
            self.assertEqual(c.device_bytes, 64 * KIB)
        self.assertTrue(c.closed)
        with self.assertRaises(ValueError):
            c.get(key(0))

    def test_namespaces(self):
        with kvtier.EmbeddingCache(64 * KIB) as c:
            self.assertTrue(c.put(key(1), b"lora" * 100, ns=b"lora:3"))
            self.assertIsNone(c.get(key(1)))
            self.assertEqual(c.get(key(1), ns=b"lora:3"), b"lora" * 100)

    def test_holds_and_buffers(self):
        with kvtier.EmbeddingCache(32 * KIB) as c:
            c.put(key(1), data(1, 16 * KIB))
            h = c.fetch(key(1))
            self.assertTrue(h.ready and h.held)
            self.assertEqual((h.tier, h.nbytes), ("device", 16 * KIB))
            self.assertTrue(h.wait(0))
            view = memoryview(h)
            self.assertTrue(view.readonly)
            self.assertEqual(view.tobytes(), data(1, 16 * KIB))
            for i in (2, 3, 4):  # evict around the held one
                c.put(key(i), data(i, 16 * KIB))
            self.assertEqual(c.lookup(key(1)), ("device", 16 * KIB))
            self.assertFalse(c.put(key(5), bytes(32 * KIB)), "no room beside a held one")
            with self.assertRaises(BufferError):
                h.release()
            with self.assertRaises(BufferError):
                c.close()
            view.release()
            h.release()
            self.assertFalse(h.held)
            with self.assertRaises(ValueError):
                h.read_into(bytearray(16 * KIB))
            self.assertIsNone(c.fetch(key(99)))

    def test_host_tier(self):
        with kvtier.EmbeddingCache(32 * KIB, host_bytes=256 * KIB) as c:
            for i in range(8):
                c.put(key(i), data(i, 16 * KIB - 100))
            self.assertEqual(c.lookup(key(0)), ("host", 16 * KIB - 100))
            with c.fetch(key(0)) as h:
                self.assertEqual(h.tier, "host")
                out = bytearray(h.nbytes)
                self.assertEqual(h.read_into(out), h.nbytes)
                self.assertEqual(bytes(out), data(0, 16 * KIB - 100))
            self.assertEqual(c.stats()["hits_host"], 1)

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            kvtier.EmbeddingCache(0)
        with self.assertRaises(ValueError):
            kvtier.EmbeddingCache(KIB, chunk_bytes=100)
        with self.assertRaises(kvtier.Error) as e:
            kvtier.EmbeddingCache(KIB, remote="http://nowhere")
        self.assertEqual(e.exception.errno, 22)
        with kvtier.EmbeddingCache(64 * KIB) as c:
            with self.assertRaises(ValueError):
                c.put(b"short", b"x")
            with self.assertRaises(ValueError):
                c.put(key(1), b"")
            with self.assertRaises(ValueError):
                c.put(key(1), b"x", ns=b"n" * 257)
            with self.assertRaises(TypeError):
                c.put(key(1), 42)
            with self.assertRaises(TypeError):
                c.get(1234)
            with self.assertRaises(BufferError):
                c.get_into(key(1), b"read-only")


class Disk(EmbCase):
    def test_restart_and_damage(self):
        d = os.path.join(self.dir, "d")
        sizes = {i: 1000 + 3000 * i for i in range(10)}
        with kvtier.EmbeddingCache(256 * KIB, dir=d, chunk_bytes=4 * KIB) as c:
            for i, n in sizes.items():
                self.assertTrue(c.put(key(i), data(i, n)))
            self.assertGreater(c.stats()["ops_in_flight"] + c.stats()["stored"], 0)
        with kvtier.EmbeddingCache(256 * KIB, dir=d, chunk_bytes=4 * KIB) as c:
            self.assertEqual(c.lookup(key(3)), ("disk", 0))
            h = c.fetch(key(3))
            self.assertTrue(h.wait())
            self.assertEqual((h.tier, bytes(memoryview(h))), ("disk", data(3, sizes[3])))
            h.release()
            for i, n in sizes.items():
                self.assertEqual(c.get(key(i)), data(i, n))
            self.assertEqual(c.stats()["hits_disk"], 10)
        with self.assertRaises(kvtier.Error) as e:
            kvtier.EmbeddingCache(256 * KIB, dir=d, chunk_bytes=8 * KIB)  # another page size
        self.assertEqual(e.exception.code, kvtier.EFINGERPRINT)
        for name in os.listdir(os.path.join(d, "slabs")):
            with open(os.path.join(d, "slabs", name), "r+b") as f:
                size = f.seek(0, 2)
                for off in range(4096 + 64, size, 512):
                    f.seek(off)
                    f.write(b"\xff" * 8)
        with kvtier.EmbeddingCache(256 * KIB, dir=d, chunk_bytes=4 * KIB) as c:
            for i in sizes:
                self.assertIsNone(c.get(key(i)), "damaged: a miss, never bytes")
            self.assertGreater(c.stats()["read_errors"], 0)


class Remote(EmbCase):
    def test_two_caches_share_a_server(self):
        exe = shutil.which("redis-server")
        if not exe:
            self.skipTest("redis-server is not installed")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", self.dir],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
            url = f"redis://127.0.0.1:{port}"
            with kvtier.EmbeddingCache(64 * KIB, remote=url, chunk_bytes=4 * KIB) as a, \
                    kvtier.EmbeddingCache(64 * KIB, remote=url, chunk_bytes=4 * KIB) as b:
                self.assertTrue(a.put(key(7), data(7, 9000)))
                a.close()  # its write lands first
                self.assertEqual(b.lookup(key(7)), ("remote", 0))
                self.assertEqual(b.get(key(7)), data(7, 9000))
                self.assertEqual(b.stats()["hits_remote"], 1)
        finally:
            p.kill()
            p.wait()


class Threads(EmbCase):
    def test_threads_take_turns(self):
        with kvtier.EmbeddingCache(1 << 20, host_bytes=4 << 20) as c:
            errors = []

            def work(t):
                try:
                    for i in range(200):
                        k = key(t * 1000 + i % 40)
                        got = c.get(k)
                        if got is None:
                            c.put(k, data(t * 1000 + i % 40, 5000))
                        elif got != data(t * 1000 + i % 40, 5000):
                            errors.append(f"thread {t}: wrong bytes for {i}")
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

            ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errors, [])

    def test_gil_released_inside_a_call(self):
        """A pure-Python thread counts while another puts and gets a large embedding (copies
        and a checksum of 64 MiB, tens of ms, under the cache's lock): stamps fall in the
        middle half of such a call only if the GIL was let go (before the call the counter may
        have the GIL for one switch interval, made short here)."""
        import sys
        big = bytes(range(256)) * (256 * KIB)  # 64 MiB
        interval = sys.getswitchinterval()
        sys.setswitchinterval(0.0005)
        try:
            with kvtier.EmbeddingCache(64 << 20, host_bytes=128 << 20) as c:
                stamps, stop = [], threading.Event()

                def count():
                    n = 0
                    while not stop.is_set():
                        n += 1
                        if n % 64 == 0:
                            stamps.append(time.monotonic())

                t = threading.Thread(target=count)
                t.start()
                time.sleep(0.05)
                spans, got = [], []
                for i in range(3):  # a span a call: between calls the counter may run
                    t0 = time.monotonic()
                    self.assertTrue(c.put(key(i), big))
                    t1 = time.monotonic()
                    got.append(c.get(key(i)))
                    spans += [(t0, t1), (t1, time.monotonic())]
                self.assertEqual([len(g) for g in got], [len(big)] * 3)
                stop.set()
                t.join()
        finally:
            sys.setswitchinterval(interval)
        inside = sum(a + (b - a) / 4 <= x <= b - (b - a) / 4 for a, b in spans for x in stamps)
        self.assertGreater(inside, 0, f"no count inside the calls {spans}")


class SGLangInterface(EmbCase):
    def test_multimodal_cache(self):
        c = kvtier.mm.MultimodalCache(kvtier.EmbeddingCache(64 * KIB, host_bytes=256 * KIB))
        try:
            emb = array.array("f", [float(i) for i in range(1024)])
            self.assertTrue(c.set(12345, emb))
            self.assertTrue(c.has(12345))
            self.assertFalse(c.has(54321))
            got = c.get_single(12345)
            if isinstance(got, tuple):  # no numpy here
                self.assertEqual(got[:2], ("|u1", (4096,)))
                self.assertEqual(got[2], emb.tobytes())
            else:
                self.assertEqual(got.tobytes(), emb.tobytes())
            combined = c.combine_hashes([1, 2])
            self.assertTrue(c.set(combined, b"both"))
            self.assertIsNotNone(c.get([1, 2]))
            self.assertIsNone(c.get([2, 1]))
            self.assertIsNone(c.get([]))
            self.assertEqual(c.available_size(), 2)
            self.assertTrue(c.free(12345))
            self.assertFalse(c.has(12345))
            self.assertEqual(kvtier.mm.item_key(b"\x01" * 32), b"\x01" * 32)
            with self.assertRaises(ValueError):
                kvtier.mm.item_key(b"short")
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
