#!/usr/bin/env python3
"""What a page store's dir takes on the disk against what it holds.

Writes --mb megabytes of pages of each --page-bytes into a fresh page store of --capacity
(the kvtier package, as SGLang's backend opens it: a large capacity, pages arriving a batch at
a time), closes it, and prints du's bytes of the dir (allocated blocks, as `du -sB1`) against
the pages' bytes plus the index's; the ratio is the disk's cost of a byte stored.

Usage: disk_use.py [--dir DIR] [--mb 30,3000] [--page-bytes 65536,4497408,8388608]
                   [--capacity BYTES] [--batch N]
"""

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import time

import kvtier


def du(path):
    return int(subprocess.check_output(["du", "-sB1", path]).split()[0])


def measure(base, megabytes, page, capacity, batch):
    d = os.path.join(base, f"kvt-disk-use-{os.getpid()}")
    shutil.rmtree(d, ignore_errors=True)
    buf = ctypes.create_string_buffer(os.urandom(page * batch), page * batch)
    n = int(megabytes * 1e6) // page
    t = time.perf_counter()
    try:
        with kvtier.PageStore(d, b"kvtier-disk-use", page, capacity=capacity) as s:
            for at in range(0, n, batch):
                k = min(batch, n - at)
                keys = [(at + i).to_bytes(8, "little") * 4 for i in range(k)]
                res = s.set(keys, [ctypes.addressof(buf) + i * page for i in range(k)])
                if any(res):
                    sys.exit(f"disk_use: a set failed: {res}")
        seconds = time.perf_counter() - t
        stored, index, used = n * page, du(os.path.join(d, "index")), du(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return n, stored, index, used, seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--mb", default="30,3000")
    ap.add_argument("--page-bytes", default="65536,4497408,8388608")
    ap.add_argument("--capacity", type=int, default=200 << 30)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    print(f"{'page bytes':>10} {'pages':>7} {'stored MB':>10} {'index MB':>9} {'du MB':>9} "
          f"{'du / (stored + index)':>22}")
    for mb in (float(x) for x in a.mb.split(",")):
        for page in (int(x) for x in a.page_bytes.split(",")):
            n, stored, index, used, _ = measure(a.dir, mb, page, a.capacity, a.batch)
            print(f"{page:>10} {n:>7} {stored / 1e6:>10.1f} {index / 1e6:>9.2f} "
                  f"{used / 1e6:>9.1f} {used / (stored + index):>22.3f}", flush=True)


if __name__ == "__main__":
    main()
