"""The kvtier package against the C page store: pages of one and two segments round trip
byte for byte through int addresses and through buffers; exists, delete, clear and stats; a
restart keeps the pages and refuses another fingerprint; damaged slabs give misses, never
bytes; three threads (exists, get, set) at once; submitted ops with the eventfd; bad
arguments refused before any I/O; a closed store refuses every call; and the GIL is let go
inside a call.

Plain unittest: buffers and addresses come from ctypes, bytearray and mmap.
"""
import ctypes
import errno
import mmap
import os
import random
import select
import shutil
import tempfile
import threading
import time
import unittest

import kvtier

SEG = 6000  # two segments: a page is not a whole number of 4 KiB blocks
PAGE = 2 * SEG
FP = b"model=test/weights=r1/dtype=bf16/layout=page_first/tp=0of1"
MISS = (-errno.ENOENT, kvtier.ECORRUPT)


def key_of(i):
    return i.to_bytes(4, "little") + bytes(27) + b"\xc3"


def bytes_of(i, n=PAGE):
    """Page i's bytes: a function of i alone, so any page read can be checked."""
    return random.Random(i * 7919 + n).randbytes(n)


class Pages:
    """Pages [first, first + n) in ctypes memory: each page a K and a V buffer apart (as in
    SGLang's host pool), and the addresses and sizes get and set take."""

    def __init__(self, first, n, fill=True):
        self.first, self.n = first, n
        self.keys = [key_of(first + i) for i in range(n)]
        self.k = [ctypes.create_string_buffer(SEG) for _ in range(n)]
        self.v = [ctypes.create_string_buffer(SEG) for _ in range(n)]
        if fill:
            for i in range(n):
                b = bytes_of(first + i)
                ctypes.memmove(self.k[i], b[:SEG], SEG)
                ctypes.memmove(self.v[i], b[SEG:], SEG)

    def ptrs(self):
        return [ctypes.addressof(b) for i in range(self.n) for b in (self.k[i], self.v[i])]

    def sizes(self):
        return [SEG] * (2 * self.n)

    def exact(self, i):
        return self.k[i].raw + self.v[i].raw == bytes_of(self.first + i)


class StoreCase(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvt-py-")
        self.s = self.open()

    def tearDown(self):
        self.s.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def open(self, fp=FP, page_bytes=PAGE, **kw):
        return kvtier.PageStore(self.dir, fp, page_bytes, page_tokens=16, **kw)

    def put(self, first, n, s=None):
        p = Pages(first, n)
        self.assertEqual((s or self.s).set(p.keys, p.ptrs(), p.sizes(), 2), [0] * n)

    def read(self, first, n, s=None):
        """Results of reading [first, first + n); every page read is exact or a miss."""
        p = Pages(first, n, fill=False)
        res = (s or self.s).get(p.keys, p.ptrs(), p.sizes(), segs_per_page=2)
        for i, r in enumerate(res):
            if r == 0:
                self.assertTrue(p.exact(i), f"page {first + i} came back with wrong bytes")
            else:
                self.assertIn(r, MISS)
        return res


class RoundTrip(StoreCase):
    def test_two_segments_by_address(self):
        self.put(0, 32)
        self.assertEqual(self.read(0, 32), [0] * 32)

    def test_one_segment_by_address(self):
        bufs = [ctypes.create_string_buffer(bytes_of(i), PAGE) for i in range(8)]
        keys = b"".join(key_of(i) for i in range(8))  # one bytes object of n * 32
        self.assertEqual(self.s.set(keys, [ctypes.addressof(b) for b in bufs]), [0] * 8)
        out = [ctypes.create_string_buffer(PAGE) for _ in range(8)]
        self.assertEqual(self.s.get(keys, [ctypes.addressof(b) for b in out]), [0] * 8)
        for i in range(8):
            self.assertEqual(out[i].raw, bytes_of(i))

    def test_uneven_segments(self):
        data = bytes_of(5)
        a = ctypes.create_string_buffer(data[:1000], 1000)
        b = ctypes.create_string_buffer(data[1000:], PAGE - 1000)
        ptrs, sizes = [ctypes.addressof(a), ctypes.addressof(b)], [1000, PAGE - 1000]
        self.assertEqual(self.s.set([key_of(5)], ptrs, sizes, 2), [0])
        ctypes.memset(a, 0, 1000)
        ctypes.memset(b, 0, PAGE - 1000)
        self.assertEqual(self.s.get([key_of(5)], ptrs, sizes, 2), [0])
        self.assertEqual(a.raw + b.raw, data)

    def test_buffers(self):
        keys = [key_of(i) for i in range(6)]
        srcs = [bytes_of(0), bytearray(bytes_of(1)), memoryview(bytes_of(2))]
        srcs += [bytes_of(i) for i in range(3, 6)]
        self.assertEqual(self.s.set_from(keys, srcs), [0] * 6)
        with mmap.mmap(-1, 6 * PAGE) as m:
            view = memoryview(m)
            outs = [bytearray(PAGE), bytearray(PAGE)] + [view[i * PAGE:(i + 1) * PAGE]
                                                         for i in range(2, 6)]
            self.assertEqual(self.s.get_into(keys, outs), [0] * 6)
            for i in range(6):
                self.assertEqual(bytes(outs[i]), bytes_of(i))
            del outs
            view.release()

    def test_read_what_buffers_wrote_by_address(self):
        self.s.set_from([key_of(9)], [bytes_of(9)], parent=key_of(8))
        self.assertEqual(self.read(9, 1), [0])

    def test_psync(self):
        self.s.close()
        self.s = self.open(disk_io="psync")
        self.put(0, 4)
        self.assertEqual(self.read(0, 4), [0] * 4)
        self.assertEqual(self.s.stats()["disk_io"], "psync")


class KeysAndStats(StoreCase):
    def test_exists_delete_clear_stats(self):
        self.put(0, 32)
        self.assertEqual(self.s.exists([key_of(i) for i in range(32)]), 32)
        self.assertEqual(self.s.exists(b"".join(key_of(i) for i in range(30, 34))), 2)
        self.assertEqual(self.s.exists([]), 0)
        self.assertEqual(self.read(30, 4), [0, 0, -errno.ENOENT, -errno.ENOENT])
        st = self.s.stats()
        self.assertEqual(st["pages"], 32)
        self.assertEqual(st["page_bytes"], PAGE)
        self.assertEqual(st["get_hits"], 2)
        self.assertEqual(st["errors"], 0)
        self.assertFalse(st["read_only"])
        for field in ("capacity_pages", "gets", "sets", "set_dups", "bytes_read",
                      "bytes_written", "evicted", "deleted", "recovered", "disk_io"):
            self.assertIn(field, st)
        self.put(0, 4)  # again: stored already
        self.assertEqual(self.s.stats()["set_dups"], 4)
        self.assertEqual(self.s.delete([key_of(5), key_of(99)]), 1)
        self.assertEqual(self.s.exists([key_of(i) for i in range(32)]), 5)
        self.s.clear()
        self.assertEqual(self.s.exists([key_of(i) for i in range(32)]), 0)
        self.assertEqual(self.s.stats()["pages"], 0)

    def test_properties(self):
        self.assertEqual(self.s.page_bytes, PAGE)
        self.assertEqual(self.s.dir, self.dir)
        self.assertFalse(self.s.closed)
        self.assertIn("PageStore", repr(self.s))


class Restart(StoreCase):
    def test_restart_keeps_pages(self):
        self.put(100, 20)
        self.s.close()
        self.s = self.open()
        self.assertEqual(self.s.exists([key_of(100 + i) for i in range(20)]), 20)
        self.assertEqual(self.read(100, 20), [0] * 20)

    def test_wrong_fingerprint(self):
        self.put(100, 4)
        self.s.close()
        with self.assertRaises(kvtier.Error) as cm:
            self.open(fp=b"another model")
        e = cm.exception
        self.assertIsInstance(e, OSError)
        self.assertEqual(e.code, kvtier.EFINGERPRINT)
        self.assertEqual(e.errno, -kvtier.EFINGERPRINT)
        self.assertTrue(e.strerror)
        with self.assertRaises(kvtier.Error):
            self.open(page_bytes=PAGE + 4096)
        self.s = self.open()
        self.assertEqual(self.read(100, 4), [0] * 4)

    def test_read_only_view(self):
        self.put(0, 4)
        with self.open(read_only=True) as ro:
            self.assertEqual(self.read(0, 4, ro), [0] * 4)
            with self.assertRaises(kvtier.Error) as cm:
                ro.clear()
            self.assertEqual(cm.exception.code, -errno.EROFS)


class Damage(StoreCase):
    def test_damaged_slab_gives_misses(self):
        n = 48
        self.put(400, n)
        self.s.close()
        with open(os.path.join(self.dir, "slabs", "0000.slab"), "r+b") as f:
            for at in range(64 << 10, n * PAGE, 5 * PAGE):
                f.seek(at)
                f.write(b"\x5a" * 8192)
        self.s = self.open()
        res = self.read(400, n)
        bad = sum(r != 0 for r in res)
        self.assertGreater(bad, 0)
        self.assertGreater(self.s.stats()["errors"], 0)


class Threads(StoreCase):
    def test_exists_get_set_at_once(self):
        """As SGLang's controller: one thread sets, one gets, one asks exists; every page
        read is exact or a miss, over a store small enough to evict as they go."""
        self.s.close()
        self.s = self.open(capacity=300 * 16384)
        self.put(0, 16)
        latest, done, errors = [0], threading.Event(), []
        counts = {"exact": 0, "runs": 0}

        def guard(fn):
            def run():
                try:
                    fn()
                except BaseException as e:  # reported below: a thread's failure fails the test
                    errors.append(e)
                    done.set()
            return run

        def writer():
            for r in range(120):
                first = r * 7 % 64 * 8
                self.put(first, 16)
                latest[0] = first
            done.set()

        def reader():
            while not done.is_set():
                counts["exact"] += self.read(latest[0], 16).count(0)

        def asker():
            while not done.is_set():
                counts["runs"] += self.s.exists([key_of(latest[0] + i) for i in range(16)]) > 0

        threads = [threading.Thread(target=guard(f)) for f in (writer, reader, asker)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertGreater(counts["exact"], 0)
        self.assertGreater(counts["runs"], 0)


class Async(StoreCase):
    def test_submit_eventfd_wait(self):
        efd = self.s.event_fd()
        self.assertGreaterEqual(efd, 0)
        w = Pages(200, 16)
        op = self.s.submit_set(w.keys, w.ptrs(), w.sizes(), 2)
        p = select.poll()
        p.register(efd, select.POLLIN)
        self.assertEqual(len(p.poll(10000)), 1)  # readable once an op completed
        self.assertGreaterEqual(int.from_bytes(os.read(efd, 8), "little"), 1)
        self.assertEqual(self.s.wait(op), [0] * 16)
        with self.assertRaises(ValueError):  # collected already
            self.s.wait(op, 0)
        r = Pages(200, 16, fill=False)
        op = self.s.submit_get(r.keys, r.ptrs(), r.sizes(), segs_per_page=2)
        self.assertEqual(self.s.wait(op, timeout_ms=-1), [0] * 16)
        self.assertTrue(all(r.exact(i) for i in range(16)))

    def test_buffers_held_until_wait(self):
        keys = [key_of(i) for i in range(64)]
        op = self.s.submit_set_from(keys, [bytes_of(i) for i in range(64)])
        self.assertEqual(self.s.wait(op), [0] * 64)
        outs = [bytearray(PAGE) for _ in range(64)]
        op = self.s.submit_get_into(keys, outs)
        with self.assertRaises(BufferError):  # the op holds it: it cannot move
            outs[0].extend(b"x")
        try:
            res = self.s.wait(op, 0)
        except TimeoutError:  # not done yet: it stays waitable
            res = self.s.wait(op)
        self.assertEqual(res, [0] * 64)
        outs[0].extend(b"x")  # let go by wait
        self.assertTrue(all(bytes(outs[i][:PAGE]) == bytes_of(i) for i in range(64)))

    def test_timeout_leaves_op_waitable(self):
        """A big durable set, waited for with no time: TimeoutError, and the op is still
        there to wait for (when the set beat the first wait, its result is checked)."""
        n, big = 64, 1 << 20
        with self.open_big(big) as s:
            bufs = [ctypes.create_string_buffer(big) for _ in range(n)]
            op = s.submit_set([key_of(i) for i in range(n)], [ctypes.addressof(b) for b in bufs])
            try:
                s.wait(op, 0)
                timed_out = False
            except TimeoutError:
                timed_out = True
            if timed_out:
                self.assertEqual(s.wait(op), [0] * n)
            self.assertEqual(s.stats()["pages"], n)

    def open_big(self, page_bytes):
        d = tempfile.mkdtemp(prefix="kvt-py-big-", dir=self.dir)
        return kvtier.PageStore(d, FP, page_bytes, capacity=256 << 20)


class BadArguments(StoreCase):
    def assert_untouched(self):
        st = self.s.stats()
        self.assertEqual((st["gets"], st["sets"], st["pages"]), (0, 0, 0))

    def test_refused_before_io(self):
        p = Pages(0, 4)
        keys, ptrs, sizes = p.keys, p.ptrs(), p.sizes()
        cases = [
            (ValueError, lambda: self.s.exists(b"x" * 33)),
            (ValueError, lambda: self.s.set([b"k" * 31], ptrs[:2], sizes[:2], 2)),
            (TypeError, lambda: self.s.exists("not bytes")),
            (TypeError, lambda: self.s.exists(5)),
            (ValueError, lambda: self.s.set(keys, ptrs[:-1], sizes, 2)),
            (ValueError, lambda: self.s.set(keys, ptrs, sizes[:-1], 2)),
            (ValueError, lambda: self.s.set(keys, [0] + ptrs[1:], sizes, 2)),
            (ValueError, lambda: self.s.set(keys, [-1] + ptrs[1:], sizes, 2)),
            (ValueError, lambda: self.s.set(keys, [1 << 70] + ptrs[1:], sizes, 2)),
            (TypeError, lambda: self.s.set(keys, ["x"] + ptrs[1:], sizes, 2)),
            (ValueError, lambda: self.s.set(keys, ptrs, [SEG - 1] + sizes[1:], 2)),
            (ValueError, lambda: self.s.set(keys, ptrs, [0] + sizes[1:], 2)),
            (ValueError, lambda: self.s.set(keys, ptrs, None, 2)),
            (ValueError, lambda: self.s.set(keys, ptrs, sizes, 0)),
            (ValueError, lambda: self.s.set(keys, ptrs, sizes, 2, parent=b"p" * 31)),
            (TypeError, lambda: self.s.set(keys, ptrs, sizes, 2, parent=7)),
            (ValueError, lambda: self.s.set_from(keys, [bytes(PAGE)] * 3)),
            (ValueError, lambda: self.s.set_from(keys, [bytes(PAGE)] * 3 + [bytes(PAGE - 1)])),
            (TypeError, lambda: self.s.get_into(keys, [bytes(PAGE)] * 4)),  # read-only
            (TypeError, lambda: self.s.get_into(keys, [object()] * 4)),
            (ValueError, lambda: self.s.submit_set(keys, ptrs, sizes[:-1], 2)),
            (ValueError, lambda: self.s.submit_get_into(keys, [bytearray(PAGE - 1)] * 4)),
            (ValueError, lambda: self.s.wait(12345)),
            (TypeError, lambda: self.s.get(keys)),
        ]
        for i, (exc, call) in enumerate(cases):
            with self.subTest(case=i):
                self.assertRaises(exc, call)
        self.assert_untouched()
        self.assertEqual(self.s.exists(keys), 0)

    def test_open_arguments(self):
        cases = [
            (ValueError, lambda: kvtier.PageStore(self.dir, b"", PAGE)),
            (TypeError, lambda: kvtier.PageStore(self.dir, "a str", PAGE)),
            (ValueError, lambda: kvtier.PageStore(self.dir, FP, 0)),
            (ValueError, lambda: kvtier.PageStore(self.dir, FP, (1 << 31) + 1)),
            (ValueError, lambda: kvtier.PageStore(self.dir, FP, PAGE, page_tokens=5000)),
            (ValueError, lambda: kvtier.PageStore(self.dir, FP, PAGE, capacity=0)),
            (ValueError, lambda: kvtier.PageStore(self.dir, FP, PAGE, disk_io="aio")),
            (TypeError, lambda: kvtier.PageStore(self.dir, FP, PAGE, 16)),  # keyword-only
            (TypeError, lambda: kvtier.PageStore(None, FP, PAGE)),
        ]
        for i, (exc, call) in enumerate(cases):
            with self.subTest(case=i):
                self.assertRaises(exc, call)


class Closed(StoreCase):
    def test_closed_store_raises(self):
        self.put(0, 2)
        self.s.close()
        self.s.close()  # idempotent
        self.assertTrue(self.s.closed)
        p = Pages(0, 2, fill=False)
        calls = [
            lambda: self.s.exists(p.keys),
            lambda: self.s.get(p.keys, p.ptrs(), p.sizes(), 2),
            lambda: self.s.set(p.keys, p.ptrs(), p.sizes(), 2),
            lambda: self.s.get_into(p.keys, [bytearray(PAGE)] * 2),
            lambda: self.s.set_from(p.keys, [bytes(PAGE)] * 2),
            lambda: self.s.submit_get(p.keys, p.ptrs(), p.sizes(), 2),
            lambda: self.s.submit_set(p.keys, p.ptrs(), p.sizes(), 2),
            lambda: self.s.wait(1),
            lambda: self.s.event_fd(),
            lambda: self.s.delete(p.keys),
            lambda: self.s.clear(),
            lambda: self.s.stats(),
            lambda: self.s.__enter__(),
        ]
        for i, call in enumerate(calls):
            with self.subTest(call=i):
                self.assertRaises(ValueError, call)

    def test_context_manager_and_pending_ops(self):
        self.s.close()
        with self.open() as s:
            op = s.submit_set_from([key_of(1)], [bytes_of(1)])  # never waited: close waits
        self.assertTrue(s.closed)
        self.assertRaises(ValueError, s.wait, op)
        self.s = self.open()
        self.assertEqual(self.read(1, 1), [0])

    def test_close_while_threads_call(self):
        """close from one thread while others are inside calls: it waits them out, and
        their next calls raise ValueError, never touching a closed store."""
        self.put(0, 16)
        started, errors, closed_seen = threading.Barrier(4), [], []

        def caller():
            started.wait()
            try:
                while True:
                    self.read(0, 16)
                    self.s.exists([key_of(i) for i in range(16)])
            except ValueError:
                closed_seen.append(True)
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=caller) for _ in range(3)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.05)
        self.s.close()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(len(closed_seen), 3)


    def test_close_from_threads_at_once(self):
        """close from several threads at once, with ops pending and without, while others
        keep calling: every close returns (the C store is closed once), the callers get
        ValueError, and nothing is left waiting."""
        for pending in (False, True):
            with self.subTest(pending=pending):
                self.s.close()
                self.s = self.open()
                self.put(0, 16)
                ops = []
                if pending:
                    ops = [self.s.submit_set_from([key_of(100 + i)], [bytes_of(100 + i)])
                           for i in range(8)]
                    ops += [self.s.submit_get_into([key_of(i)], [bytearray(PAGE)])
                            for i in range(8)]
                go, closes, errors, refused = threading.Barrier(6), [], [], []

                def closer():
                    go.wait()
                    try:
                        self.s.close()
                        self.s.close()
                        closes.append(self.s.closed)
                    except BaseException as e:  # reported below
                        errors.append(e)

                def caller():
                    go.wait()
                    try:
                        while True:
                            self.s.exists([key_of(i) for i in range(16)])
                            self.read(0, 4)
                    except ValueError as e:
                        refused.append(str(e))
                    except BaseException as e:
                        errors.append(e)

                threads = [threading.Thread(target=closer, daemon=True) for _ in range(4)]
                threads += [threading.Thread(target=caller, daemon=True) for _ in range(2)]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join(20)
                self.assertEqual([th.is_alive() for th in threads], [False] * 6,
                                 "a thread still blocked after 20 s")
                self.assertEqual(errors, [])
                self.assertEqual(closes, [True] * 4)
                self.assertEqual(len(refused), 2)
                self.assertTrue(all("closed" in r for r in refused), refused)
                for op in ops:
                    self.assertRaises(ValueError, self.s.wait, op)
        self.s = self.open()  # the pages the pending sets wrote are there
        self.assertEqual(self.read(100, 8), [0] * 8)

class Gil(StoreCase):
    def test_gil_released_inside_a_call(self):
        """A pure-Python thread counts, stamping the time every 256 counts, while another is
        inside a big set. Were the GIL held through the call, no stamp could fall inside it
        (the counter could run only before the call began or after it returned)."""
        n, big = 64, 1 << 20
        d = tempfile.mkdtemp(prefix="kvt-py-gil-", dir=self.dir)
        with kvtier.PageStore(d, FP, big, capacity=256 << 20, disk_io="psync") as s:
            bufs = [bytes([i]) * big for i in range(n)]
            keys = [key_of(i) for i in range(n)]
            stamps, stop = [], threading.Event()

            def count():
                c = 0
                while not stop.is_set():
                    c += 1
                    if c % 256 == 0:
                        stamps.append(time.monotonic())

            t = threading.Thread(target=count)
            t.start()
            time.sleep(0.05)
            t0 = time.monotonic()
            res = s.set_from(keys, bufs)
            t1 = time.monotonic()
            stop.set()
            t.join()
            self.assertEqual(res, [0] * n)
            lo, hi = t0 + (t1 - t0) / 4, t1 - (t1 - t0) / 4
            inside = sum(lo <= x <= hi for x in stamps)
            self.assertGreater(inside, 0, f"no count in the middle of {t1 - t0:.3f} s of set")
            print(f"\ngil: {inside} stamps (x256 counts) in the middle half of a "
                  f"{t1 - t0:.3f} s set of {n} MiB", end=" ")


if __name__ == "__main__":
    unittest.main()
