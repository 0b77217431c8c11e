#!/usr/bin/env python3
"""End-to-end tests of kvtier-bench: usage: test_bench.py PATH-TO-KVTIER-BENCH

Every case prints one line (PASS, FAIL, XFAIL or XPASS); the script exits 1 when any case
FAILed. The traces it needs are written into a temporary directory.

Expected numbers are worked out here from the bench's documented model, not copied from its
output:
  * A trace line's input is its hash_ids' 512-token blocks (the last one partial); the tokens
    of a block depend only on its id, so requests with equal leading ids share those tokens.
    Output tokens are unique to the line.
  * A request matches its first input_length - 1 tokens, aligned down to the page: that is its
    device hit, and every page of it is read back and verified. The rest of the input is
    computed; output_length - 1 tokens are decoded; then the whole pages of
    input + output[:-1] are cached.
  * The pool must hold the longest request, input + output rounded up to the page.
`model()` below replays that on token names for traces that never evict; the eviction cases
have their expected hits derived by hand in comments.

Cases marked with a known-bug reason are bugs this suite found in the bench: they print XFAIL
while the bug is there and XPASS once it is fixed (then drop the marker). KVT_STRICT=1 in the
environment makes an XFAIL count as a failure.
"""
import fcntl
import json
import os
import random
import re
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time

from harness import Failure, Skip, case, check, eq
import harness

BLOCK = 512  # tokens per Mooncake hash id
TINY_CELL = 2 * 2 * 16 * 2  # tiny: 2 layers x (K + V) x 16 elements x 2 bytes
CUDA_ERROR = re.compile(r"backend|cuda|gpu", re.I)

BENCH = None
TMP = None


# ---- running the bench ----


def bench(*args, timeout=120):
    return harness.Result("kvtier-bench", BENCH, args, timeout)


def run_ok(*args):
    """Run with --json; it must exit 0 with an empty stderr and 0 mismatches."""
    r = bench(*args, "--json")
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr of a clean run with pipes{r.where()}")
    j = r.json()
    eq(j["verify"]["mismatches"], 0, f"mismatches{r.where()}")
    return j


def evicted(j):
    """Tokens evicted from the device. tokens_evicted was one number before the host tier and
    is {"device", "host"} since; without a host tier nothing leaves the host."""
    e = j["tokens_evicted"]
    if isinstance(e, dict):
        eq(e.get("host", 0), 0, "tokens_evicted.host")
        return e["device"]
    return e


def consistent(j, page_size, cell):
    """Relations every report of a run without host or disk tier must satisfy."""
    hit = j["tokens_hit"]["device"]
    eq(j["tokens_hit"]["host"], 0, "tokens_hit.host")
    eq(j["tokens_hit"]["disk"], 0, "tokens_hit.disk")
    eq(hit + j["tokens_computed"], j["tokens_total"], "tokens_hit.device + tokens_computed")
    eq(j["verify"]["pages_checked"] * page_size, hit, "pages_checked * page_size")
    eq(j["bytes"]["compute_to_device"], (j["tokens_computed"] + j["tokens_decoded"]) * cell,
       "bytes.compute_to_device")
    eq(j["bytes"]["device_to_verify"], hit * cell, "bytes.device_to_verify")
    for k in ("device_to_host", "host_to_device", "host_to_disk", "disk_to_host"):
        eq(j["bytes"][k], 0, f"bytes.{k}")
    eq(evicted(j) % page_size, 0, "tokens evicted is whole pages")
    eq(j["config"]["page_size"], page_size, "config.page_size")
    eq(j["config"]["cell_bytes"], cell, "config.cell_bytes")
    check(j["seconds"] >= 0 and j["tokens_per_second"] >= 0, "negative time")


# ---- traces ----

_trace_n = 0


def trace(rows, name=None):
    """Write a Mooncake trace; rows are (input_length, output_length, hash_ids) or raw
    str/bytes lines. Returns its path."""
    global _trace_n
    _trace_n += 1
    path = os.path.join(TMP, name or f"t{_trace_n}.jsonl")
    with open(path, "wb") as f:
        for row in rows:
            if isinstance(row, bytes):
                f.write(row)
            elif isinstance(row, str):
                f.write(row.encode())
            else:
                i, o, ids = row
                f.write(json.dumps({"timestamp": 0, "input_length": i, "output_length": o,
                                    "hash_ids": ids}).encode() + b"\n")
    return path


def model(rows, page_size):
    """Expected counters of a trace replayed in a pool that never evicts. Tokens are named
    (block id, offset) and (output, line, k), so two tokens match only when they are the same
    token of the same block. The bench's token ids are values from a 128000-word vocabulary
    and can coincide (1 in 128000 a pair): the traces here are fixed and free of that, and
    the random ones are built so that it cannot matter (see the eviction stress case)."""
    cached = set()  # every cached prefix of whole pages, as a tuple of token names
    hits, total, decoded = [], 0, 0
    for line, (inp, out, ids) in enumerate(rows):
        toks = [(h, o) for n, h in enumerate(ids)
                for o in range(min(BLOCK, inp - n * BLOCK))]
        assert len(toks) == inp
        toks += [("out", line, k) for k in range(max(out - 1, 0))]
        pages = (inp - 1) // page_size
        while pages and tuple(toks[:pages * page_size]) not in cached:
            pages -= 1
        hits.append(pages * page_size)
        for p in range(1, len(toks) // page_size + 1):
            cached.add(tuple(toks[:p * page_size]))
        total += inp
        decoded += max(out - 1, 0)
    hit = sum(hits)
    return {"requests": len(rows), "tokens_total": total, "hit": hit, "computed": total - hit,
            "decoded": decoded, "per_request": hits}


def check_model(j, rows, page_size):
    m = model(rows, page_size)
    eq(j["requests"], m["requests"], "requests")
    eq(j["tokens_total"], m["tokens_total"], "tokens_total")
    eq(j["tokens_hit"]["device"], m["hit"], "tokens_hit.device")
    eq(j["tokens_computed"], m["computed"], "tokens_computed")
    eq(j["tokens_decoded"], m["decoded"], "tokens_decoded")
    eq(j["verify"]["pages_checked"], m["hit"] // page_size, "verify.pages_checked")


def check_location(r, path, line):
    """Exit 1, nothing on stdout, and stderr names path and line as path:LINE[:COL]: msg."""
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    pat = re.escape(path) + f":{line}(:\\d+)?: \\S"
    check(re.search(pat, r.err), f"stderr should name {path}:{line}:{r.where()}")
    check(r.err.count("\n") <= 2, f"a one-line message is expected{r.where()}")


# ---- the cases ----

# 1. Known answers

FIVE = [(1024, 1, [1, 2])] * 5


@case("known answer: 5 identical requests")
def _():
    # Request 1 computes all 1024 tokens and caches 64 pages. Requests 2-5 match 1023 tokens,
    # aligned down to 1008 (63 pages), verify those 63 pages and compute 16 tokens each.
    j = run_ok("--trace", trace(FIVE), "--page-size", 16)
    eq(j["requests"], 5, "requests")
    eq(j["tokens_total"], 5 * 1024, "tokens_total")
    eq(j["tokens_hit"]["device"], 4 * 1008, "tokens_hit.device")
    eq(j["tokens_computed"], 5 * 1024 - 4 * 1008, "tokens_computed")
    eq(j["tokens_decoded"], 0, "tokens_decoded")
    eq(evicted(j), 0, "tokens_evicted")
    eq(j["verify"]["pages_checked"], 4 * 63, "verify.pages_checked")
    eq(j["bytes"]["compute_to_device"], (5 * 1024 - 4 * 1008) * TINY_CELL, "bytes computed")
    eq(j["bytes"]["device_to_verify"], 4 * 1008 * TINY_CELL, "bytes verified")
    consistent(j, 16, TINY_CELL)
    check_model(j, FIVE, 16)


@case("known answer: --requests 3 replays the first 3 lines")
def _():
    j = run_ok("--trace", trace(FIVE), "--requests", 3)
    eq(j["requests"], 3, "requests")
    eq(j["tokens_hit"]["device"], 2 * 1008, "tokens_hit.device")


@case("known answer: requests sharing only the first block")
def _():
    # [1,2] then [1,3] and [1,4]: the later two match block 1 (512 tokens) and no further.
    rows = [(1024, 1, [1, 2]), (1024, 1, [1, 3]), (1024, 1, [1, 4])]
    j = run_ok("--trace", trace(rows))
    eq(j["tokens_total"], 3072, "tokens_total")
    eq(j["tokens_hit"]["device"], 2 * 512, "tokens_hit.device")
    eq(j["tokens_computed"], 3072 - 1024, "tokens_computed")
    eq(j["verify"]["pages_checked"], 64, "verify.pages_checked")
    consistent(j, 16, TINY_CELL)
    check_model(j, rows, 16)


PARTIAL = [
    (600, 1, [1, 2]),   # caches 600 -> 592 tokens (37 pages)
    (1024, 1, [1, 2]),  # matches 1023 -> 1008, but only 592 are cached: hit 592
    (300, 1, [1]),      # matches 299 -> 288
    (1000, 1, [1, 5]),  # block 1 then a new block: hit 512
    (100, 50, [7]),     # caches 100 + 49 output tokens = 149 -> 144; decodes 49
    (100, 1, [7]),      # matches 99 -> 96; the cached output tokens are not its input
    (1, 0, [8]),        # output_length 0: nothing decoded, nothing matched
]


@case("known answer: partial blocks, prefixes of cached requests, decoded output")
def _():
    j = run_ok("--trace", trace(PARTIAL))
    eq(j["tokens_total"], 600 + 1024 + 300 + 1000 + 100 + 100 + 1, "tokens_total")
    eq(j["tokens_hit"]["device"], 592 + 288 + 512 + 96, "tokens_hit.device")
    eq(j["tokens_decoded"], 49, "tokens_decoded")
    eq(evicted(j), 0, "tokens_evicted")
    consistent(j, 16, TINY_CELL)
    check_model(j, PARTIAL, 16)


@case("known answer: --seed changes KV bytes, not the counts of a trace")
def _():
    path = trace(PARTIAL)
    a, b = run_ok("--trace", path, "--seed", 1), run_ok("--trace", path, "--seed", 77)
    eq(b["config"]["seed"], 77, "config.seed")
    for k in ("requests", "tokens_total", "tokens_hit", "tokens_computed", "tokens_decoded",
              "verify"):
        eq(b[k], a[k], k)


@case("known answer: JSON config echoes the run")
def _():
    path = trace(FIVE)
    j = run_ok("--trace", path, "--device-tokens", 4096, "--page-size", 32, "--evict-policy",
               "fifo", "--backend", "sim", "--geometry", "tiny,v_head_dim=8", "--seed", 5,
               "--host-tokens", 0, "--disk-tokens", 0)
    c = j["config"]
    want = {"trace": path, "synthetic": None, "seed": 5, "geometry": "tiny,v_head_dim=8",
            "cell_bytes": 2 * (32 + 16), "page_size": 32, "device_tokens": 4096,
            "host_tokens": 0, "disk_tokens": 0, "dir": None, "backend": "sim",
            "evict_policy": "fifo"}
    for k, v in want.items():
        eq(c.get(k), v, f"config.{k}")


@case("known answer: a trace path with quotes, backslash, tab and non-ASCII is valid JSON")
def _():
    path = trace(FIVE[:2], name='we"ird\\ na\tme é.jsonl')
    j = run_ok("--trace", path)
    eq(j["config"]["trace"], path, "config.trace")
    eq(j["tokens_hit"]["device"], 1008, "tokens_hit.device")


@case("known answer: input_length 1 is computed, never served from cache (page size 1)")
def _():
    rows = [(1, 1, [1]), (1, 3, [1]), (2, 1, [1])]
    j = run_ok("--trace", trace(rows), "--page-size", 1)
    # Requests 1 and 2 match input_length - 1 = 0 tokens; request 3 matches its first token.
    eq(j["tokens_hit"]["device"], 1, "tokens_hit.device")
    eq(j["tokens_computed"], 3, "tokens_computed")
    check_model(j, rows, 1)


# 2. Eviction order under capacity pressure
#
# Every request is one partial block: input_length 500, output_length 1, hash_ids [id]. It
# allocates 32 pages while it runs and leaves 31 (496 tokens) cached. A repeat matches 499 ->
# 496 tokens, exactly the cached node (no split), needs one free page, and inserts nothing.
# With a pool of 63..93 pages, two prefixes fit but a third miss must evict exactly one
# 31-page leaf (496 tokens); a hit never evicts. --device-tokens 1280 (80 pages) is in that
# range whether or not the padding page is counted in it.
#
# The radix clock ticks once per match and once per insert. A miss: match at t, created and
# last used at t+1. A hit: last used at t, hit count + 1. Per policy the victim is:
# lru min last-use; lfu min (hits, last-use); fifo min created; mru max last-use;
# filo max created.

EVICT_DEVICE_TOKENS = 1280
H = 496  # one hit

EVICTION = {
    # A B C A. At C: A(c2,u2), B(c4,u4). lru/lfu(tie 0 hits -> older)/fifo evict A, so A
    # misses again; mru/filo evict B and A hits.
    "A B C A": ([1, 2, 3, 1], {
        "lru": ([0, 0, 0, 0], 2), "lfu": ([0, 0, 0, 0], 2), "fifo": ([0, 0, 0, 0], 2),
        "mru": ([0, 0, 0, H], 1), "filo": ([0, 0, 0, H], 1)}),
    # A B A C A B. At C: A(c2,u5,h1), B(c4,u4,h0). lru, lfu, filo evict B: A hits, then B
    # misses and evicts C (lru: u7 < u8; lfu: 0 hits; filo: c7 > c2). fifo evicts A: A misses
    # and evicts B, so B misses too. mru evicts A: A misses and evicts C (u7 > u4), B hits.
    "A B A C A B": ([1, 2, 1, 3, 1, 2], {
        "lru": ([0, 0, H, 0, H, 0], 2), "lfu": ([0, 0, H, 0, H, 0], 2),
        "filo": ([0, 0, H, 0, H, 0], 2), "fifo": ([0, 0, H, 0, 0, 0], 3),
        "mru": ([0, 0, H, 0, 0, H], 2)}),
    # A A B C A. At C: A(c2,u3,h1), B(c5,u5,h0). lru and fifo evict A (older), lfu evicts B
    # (fewer hits), mru and filo evict B (newer).
    "A A B C A": ([1, 1, 2, 3, 1], {
        "lru": ([0, H, 0, 0, 0], 2), "fifo": ([0, H, 0, 0, 0], 2),
        "lfu": ([0, H, 0, 0, H], 1), "mru": ([0, H, 0, 0, H], 1),
        "filo": ([0, H, 0, 0, H], 1)}),
    # A B B C B. At C: A(c2,u2,h0), B(c4,u5,h1). lru, lfu, fifo evict A; mru, filo evict B.
    "A B B C B": ([1, 2, 2, 3, 2], {
        "lru": ([0, 0, H, 0, H], 1), "lfu": ([0, 0, H, 0, H], 1),
        "fifo": ([0, 0, H, 0, H], 1), "mru": ([0, 0, H, 0, 0], 2),
        "filo": ([0, 0, H, 0, 0], 2)}),
}


def per_request_hits(path, n, *args):
    """Hits of each request, from runs of the first 1, 2, ..., n requests."""
    hits, prev, j = [], 0, None
    for k in range(1, n + 1):
        j = run_ok("--trace", path, "--requests", k, *args)
        hits.append(j["tokens_hit"]["device"] - prev)
        prev = j["tokens_hit"]["device"]
    return hits, j


def eviction_case(seq, ids, policy, want_hits, evictions):
    def run():
        path = trace([(500, 1, [i]) for i in ids])
        hits, j = per_request_hits(path, len(ids), "--page-size", 16, "--device-tokens",
                                   EVICT_DEVICE_TOKENS, "--evict-policy", policy)
        eq(j["config"]["evict_policy"], policy, "config.evict_policy")
        eq(hits, want_hits, f"{policy} hits per request of {seq}")
        eq(evicted(j), evictions * H, f"{policy} tokens_evicted after {seq}")
        consistent(j, 16, TINY_CELL)
    return run


for _seq, (_ids, _per_policy) in EVICTION.items():
    for _policy, (_hits, _ev) in _per_policy.items():
        case(f"eviction: {_policy} on {_seq}")(eviction_case(_seq, _ids, _policy, _hits, _ev))


@case("host tier: a prefix evicted from the device is served from the host")
def _():
    # A B C A under lru (see above): C evicts A from the device, but write-through backed A
    # up when it was inserted, so the last A loads it back from the host.
    path = trace([(500, 1, [i]) for i in (1, 2, 3, 1)])
    j = run_ok("--trace", path, "--page-size", 16, "--device-tokens", EVICT_DEVICE_TOKENS,
               "--host-tokens", 4096)
    eq(j["tokens_hit"]["device"], 0, "tokens_hit.device")
    eq(j["tokens_hit"]["host"], H, "tokens_hit.host")
    eq(j["tokens_computed"], 4 * 500 - H, "tokens_computed")
    eq(j["verify"]["pages_checked"], H // 16, "pages_checked (host hits are verified)")
    eq(j["bytes"]["host_to_device"], H * TINY_CELL, "bytes.host_to_device")
    check(j["bytes"]["device_to_host"] >= 3 * H * TINY_CELL, "every prefix was backed up")
    eq(j["config"]["host_tokens"], 4096, "config.host_tokens")


@case("host tier: a small host pool evicts and every page served still verifies")
def _():
    small = run_ok("--synthetic", "mixed", "--requests", 200, "--device-tokens", 32768,
                   "--host-tokens", 65536)
    big = run_ok("--synthetic", "mixed", "--requests", 200, "--device-tokens", 32768,
                 "--host-tokens", 524288)
    alone = run_ok("--synthetic", "mixed", "--requests", 200, "--device-tokens", 32768)
    check(small["tokens_evicted"]["host"] > 0, "the small host pool evicted")
    check(small["tokens_hit"]["host"] > 0, "the small host pool served hits")
    check(big["tokens_hit"]["host"] > small["tokens_hit"]["host"], "a bigger host serves more")
    total = lambda j: j["tokens_hit"]["device"] + j["tokens_hit"]["host"]
    check(total(small) > total(alone), "a host tier serves more than the device alone")
    eq(alone["tokens_hit"]["host"], 0, "no host hits without a host tier")


@case("host tier: write policies decide when the host gets its copy")
def _():
    # A B C A as above. write_back backs A up only when C's allocation evicts it, and B
    # never (nothing evicts it); write_through backs up all three at insert. Both serve the
    # last A from the host. selective never backs A up (one hit is below its threshold of 2),
    # so the last A is computed again.
    path = trace([(500, 1, [i]) for i in (1, 2, 3, 1)])
    base = ("--trace", path, "--page-size", 16, "--device-tokens", EVICT_DEVICE_TOKENS,
            "--host-tokens", 4096)
    wt = run_ok(*base, "--write-policy", "write_through")
    wb = run_ok(*base, "--write-policy", "write_back")
    sel = run_ok(*base, "--write-policy", "write_through_selective")
    for name, j in (("write_through", wt), ("write_back", wb)):
        eq(j["tokens_hit"]["host"], H, f"{name} tokens_hit.host")
        eq(j["verify"]["pages_checked"], H // 16, f"{name} pages_checked")
        eq(j["config"]["write_policy"], name, "config.write_policy")
    check(wb["bytes"]["device_to_host"] < wt["bytes"]["device_to_host"],
          "write_back copies less to the host than write_through")
    check(wb["bytes"]["device_to_host"] >= H * TINY_CELL, "write_back backed A up")
    eq(sel["tokens_hit"]["host"], 0, "selective: tokens_hit.host")
    eq(sel["bytes"]["device_to_host"], 0, "selective: bytes.device_to_host")


@case("disk tier: a second run over the same data dir is served from disk, verified")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "data")
        args = ("--synthetic", "mixed", "--requests", 150, "--device-tokens", 32768,
                "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir", d)
        first = run_ok(*args)
        check(first["bytes"]["host_to_disk"] > 0, "the first run wrote to disk")
        eq(first["config"]["dir"], d, "config.dir")
        # store pages chosen by bytes: 64 KiB of the tiny geometry's 128 B a token
        eq(first["config"]["store_page_tokens"], 512, "config.store_page_tokens by default")
        second = run_ok(*args)
        total = lambda j: sum(j["tokens_hit"].values())
        check(second["tokens_hit"]["disk"] > 0, "the second run read from disk")
        check(total(second) > total(first), "the second run serves more from cache")
        # a fill reads whole store pages, which may start in the part the tree holds
        check(second["bytes"]["disk_to_host"] >= second["tokens_hit"]["disk"] * TINY_CELL,
              "the bytes read from disk hold the disk hits")
        eq(second["disk_errors"], 0, "disk_errors")
        # a store page to a page: exactly the hits' bytes are read
        d2 = os.path.join(tmp, "data2")
        pinned = args[:-1] + (d2, "--store-page-tokens", 16)
        run_ok(*pinned)
        second = run_ok(*pinned)
        eq(second["config"]["store_page_tokens"], 16, "config.store_page_tokens")
        check(second["tokens_hit"]["disk"] > 0, "the second run read from disk")
        eq(second["tokens_hit"]["disk"] * TINY_CELL, second["bytes"]["disk_to_host"],
           "disk hits are the bytes read from disk")
        # The same dir for another geometry is refused, with the reason.
        r = bench("--synthetic", "mixed", "--requests", 5, "--host-tokens", 65536,
                  "--disk-tokens", 4096, "--dir", d, "--geometry", "tiny,layers=3")
        eq(r.rc, 1, f"exit status{r.where()}")
        check(re.search(r"another model|fingerprint", r.err), f"stderr names the cause{r.where()}")
        check(f"--dir {d} " in r.err and "use another --dir" in r.err,
              f"stderr names the option and what to do{r.where()}")


@case("disk tier: a dir filled with another --seed's KV is refused, naming --seed; never "
      "VERIFY FAILED")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "data")
        path = trace(PARTIAL)  # a trace: the same tokens whatever the seed, other KV bytes
        args = ("--trace", path, "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir", d)
        run_ok(*args)
        r = bench(*args, "--seed", 2)
        eq(r.rc, 1, f"exit status over a dir of seed 1{r.where()}")
        check("VERIFY FAILED" not in r.err, f"no wrong bytes served{r.where()}")
        check(f"--dir {d} holds the KV of another model, geometry, page size or seed" in r.err
              and "--seed 2)" in r.err, f"stderr names --seed{r.where()}")
        again = run_ok(*args, "--seed", 1)  # the dir is whole: seed 1 is served from it
        check(again["tokens_hit"]["disk"] > 0, "seed 1 reads its dir again")
        eq(again["disk_errors"], 0, "disk_errors")
        other = os.path.join(tmp, "seed2")
        run_ok(*args[:-1], other, "--seed", 2)
        two = run_ok(*args[:-1], other, "--seed", 2)
        check(two["tokens_hit"]["disk"] > 0, "seed 2 reads its own dir")


@case("disk tier: --disk-sync relaxed writes a dir that a durable run serves from, verified")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "data")
        args = ("--synthetic", "mixed", "--requests", 150, "--device-tokens", 32768,
                "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir", d)
        first = run_ok(*args, "--disk-sync", "relaxed")
        check(first["bytes"]["host_to_disk"] > 0, "the relaxed run wrote to disk")
        second = run_ok(*args, "--disk-sync", "durable")
        check(second["tokens_hit"]["disk"] > 0, "the durable run read what the relaxed one wrote")
        eq(second["disk_errors"], 0, "disk_errors")
        r = bench(*args, "--disk-sync", "lazy")
        eq(r.rc, 2, f"exit status of a bad --disk-sync{r.where()}")


@case("disk tier: --disk-backlog lets disk ops fly past a request's start; all verified")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "data")
        args = ("--synthetic", "mixed", "--requests", 150, "--device-tokens", 32768,
                "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir", d)
        first = run_ok(*args, "--disk-backlog", 16)
        eq(first["config"]["disk_backlog"], 16, "config.disk_backlog")
        check(first["bytes"]["host_to_disk"] > 0, "the overlapped run wrote to disk")
        eq(first["disk_errors"], 0, "disk_errors")
        # Whatever landed when, the run's end waits for it: a second run is served from it.
        second = run_ok(*args)
        eq((second["config"]["disk_backlog"], second["config"]["deterministic"]), (64, False),
           "config.disk_backlog and deterministic by default: as a server")
        check(second["tokens_hit"]["disk"] > 0, "the second run read what the first wrote")
        eq(second["disk_errors"], 0, "disk_errors")
        r = bench(*args, "--disk-backlog", "some")
        eq(r.rc, 2, f"exit status of a bad --disk-backlog{r.where()}")
        r = bench(*args, "--deterministic", "--disk-backlog", 16)
        eq(r.rc, 2, f"exit status of --deterministic with a backlog{r.where()}")
        check("--deterministic" in r.err, f"stderr names the clash{r.where()}")


@case("--deterministic: everything lands before a request; two runs count alike, field by field")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        runs = []
        for k in range(2):
            d = os.path.join(tmp, f"data{k}")
            runs.append(run_ok("--synthetic", "mixed", "--requests", 150, "--device-tokens",
                               32768, "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir",
                               d, "--deterministic"))
        eq((runs[0]["config"]["disk_backlog"], runs[0]["config"]["deterministic"]), (0, True),
           "config with --deterministic")
        check(runs[0]["bytes"]["host_to_disk"] > 0, "the disk tier was written")
        for f in ["tokens_hit", "tokens_computed", "tokens_evicted", "bytes"]:
            eq(runs[0][f], runs[1][f], f"{f} of two --deterministic runs")


@case("disk tier: --store-page-tokens 256 writes store pages of 16 pages; a second run reads them")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "data")
        args = ("--synthetic", "mixed", "--requests", 150, "--device-tokens", 32768,
                "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir", d,
                "--store-page-tokens", 256)
        first = run_ok(*args)
        eq(first["config"]["store_page_tokens"], 256, "config.store_page_tokens")
        written = first["bytes"]["host_to_disk"]
        check(written > 0 and written % (256 * TINY_CELL) == 0,
              f"the first run wrote whole store pages of 256 tokens: {written} bytes")
        second = run_ok(*args)
        check(second["tokens_hit"]["disk"] > 0, "the second run read what the first wrote")
        eq(second["disk_errors"], 0, "disk_errors")
        # The dir is of store pages of 256: pages of 16 are another engine's.
        r = bench(*args[:-2])
        eq(r.rc, 1, f"exit status over a dir of another store page{r.where()}")
        check(re.search(r"another model|fingerprint", r.err), f"stderr names the cause{r.where()}")
        for bad, want in ((24, r"multiple of --page-size"), (0, r"from 1 to 4096"),
                          (8192, r"from 1 to 4096")):
            r = bench(*args[:-1], bad)
            eq(r.rc, 2, f"exit status of --store-page-tokens {bad}{r.where()}")
            check(re.search(want, r.err), f"stderr names the rule{r.where()}")
        r = bench(*args, "--geometry", "gpt-oss-120b")
        eq(r.rc, 2, f"exit status with a hybrid geometry{r.where()}")
        check(re.search(r"--store-page-tokens: not with a hybrid", r.err), f"stderr{r.where()}")


DISK = ("--trace", None, "--host-tokens", 65536, "--disk-tokens", 4096, "--dir")


def open_fails(d, pattern, *more):
    """A run with the disk tier at d fails at kvt_open with one line matching pattern."""
    r = bench(*(trace(FIVE) if a is None else a for a in DISK), d, *more, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    check(re.fullmatch(pattern + r"\n", r.err, re.S), f"stderr should match /{pattern}/{r.where()}")


@case("disk tier: a --dir the engine cannot open is named, with the reason and what to do")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "file")
        open(f, "w").close()
        open_fails(f, rf"kvtier-bench: --dir {re.escape(f)}: .*not a directory: give a .*")
        open_fails(os.path.join(f, "d"), rf"kvtier-bench: --dir {re.escape(f)}/d: .*not a "
                   r"directory.*")
        missing = os.path.join(tmp, "no", "d")
        open_fails(missing, rf"kvtier-bench: --dir {re.escape(missing)}: its parent dir does "
                   r"not exist.*create the parent first")
        foreign = os.path.join(tmp, "foreign")
        os.mkdir(foreign)
        open(os.path.join(foreign, "notes.txt"), "w").close()
        open_fails(foreign, rf"kvtier-bench: --dir {re.escape(foreign)}: not a kvtier data "
                   r"dir.*give a new or empty dir.*")
        d = os.path.join(tmp, "data")
        run_ok(*(trace(FIVE) if a is None else a for a in DISK), d)
        with open(os.path.join(d, "lock"), "r+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            open_fails(d, rf"kvtier-bench: --dir {re.escape(d)}: another process.*has it open: "
                       r"wait for it to end, or use another --dir")
        run_ok(*(trace(FIVE) if a is None else a for a in DISK), d)
        long = "/" + "x" * 5000
        open_fails(long, r"kvtier-bench: --dir /x{255}\.\.\.: the path is too long")


@case("disk tier: an entry of the wrong kind in the dir is named (its path, what it is, what "
      "kvtier keeps there), never a bare errno; an empty dir in place of the lock or a slab is "
      "replaced")
def _():
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        run_ok(*(trace(FIVE) if a is None else a for a in DISK), src)
        for name, make, what, err in (
                ("lock", lambda p: os.makedirs(os.path.join(p, "keep")), "a directory",
                 "Directory not empty"),
                ("slabs", lambda p: open(p, "w").close(), "a regular file", "Not a directory"),
                ("index.new/data.mdb", os.makedirs, "a directory", "File exists")):
            d = os.path.join(tmp, "wrong-" + name.replace("/", "-"))
            shutil.copytree(src, d)
            path = os.path.join(d, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
            if name == "index.new/data.mdb":  # a creation that crashed: no index yet
                shutil.rmtree(os.path.join(d, "index"))
                shutil.rmtree(os.path.join(d, "slabs"))
            make(path)
            open_fails(d, rf"kvtier-bench: --dir {re.escape(d)}: {re.escape(path)} is {what}, "
                       rf"where kvtier keeps .* \({err}\): remove it, or use another --dir")
        # An empty dir where the lock is, or where a slab is: junk, replaced; a slab dir with
        # something in it is no slab (its pages are misses), and the run goes on.
        for name, keep in (("lock", False), ("slabs/0000.slab", False), ("slabs/0000.slab", True)):
            d = os.path.join(tmp, f"junk-{name.replace('/', '-')}-{keep}")
            shutil.copytree(src, d)
            os.remove(os.path.join(d, name))
            os.makedirs(os.path.join(d, name, "keep") if keep else os.path.join(d, name))
            j = run_ok(*(trace(FIVE) if a is None else a for a in DISK), d)
            eq(os.path.isfile(os.path.join(d, name)), not keep, f"{name} replaced ({keep})")
            if name == "lock":  # the slab's pages are gone with it: misses, counted
                eq(j["disk_errors"], 0, "disk errors")


@case("sizes kvt_open refuses are named: --host-tokens, --device-tokens, --page-size")
def _():
    r = bench("--trace", trace(FIVE), "--host-tokens", 2**31 - 2, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    check(re.fullmatch(r"kvtier-bench: --host-tokens 2147483646: a host pool of .* does not fit "
                       r"in the memory available now: lower --host-tokens\n", r.err),
          f"stderr{r.where()}")
    # 40 host tokens are 2 pages of 16: no more than a 32-token device pool
    r = bench("--trace", trace([(16, 1, [1])]), "--device-tokens", 32, "--host-tokens", 40)
    eq(r.rc, 1, f"exit status{r.where()}")
    check(re.fullmatch(r"kvtier-bench: --host-tokens 40 must be larger than the device pool "
                       r"\(--device-tokens 32\) in whole pages of 16 tokens\n", r.err),
          f"stderr{r.where()}")
    for ps, most in ((16, 2**31 - 17), (256, 2**31 - 257)):
        r = bench("--page-size", ps, "--device-tokens", most + 1)
        eq(r.rc, 2, f"exit status{r.where()}")
        check(f"--device-tokens is at most {most} with --page-size {ps}\n" in r.err,
              f"stderr{r.where()}")
    # the largest pool the engine takes: refused for memory, not as an invalid argument
    r = Measured(["--trace", trace(FIVE), "--backend", "sim", "--device-tokens", 2**31 - 17,
                  "--json"], timeout=60)
    eq(r.rc, 1, f"exit status{r.where()}")
    check(re.fullmatch(r"kvtier-bench: .*device pool.*--device-tokens 2147483631 of 128 bytes, "
                       r"--geometry tiny\): lower --device-tokens.*\n", r.err),
          f"stderr{r.where()}")
    r = bench("--trace", trace(FIVE), "--geometry", "llama3-8b,layers=4096", "--page-size", 256,
              "--host-tokens", 65536, "--disk-tokens", 4096, "--dir", os.path.join(TMP, "big"))
    eq(r.rc, 2, f"exit status{r.where()}")
    check("pages of 4.00 GiB" in r.err and "larger than the disk tier takes" in r.err,
          f"stderr{r.where()}")


@case("out of memory at open names --disk-tokens when a disk tier's index takes its share")
def _():
    if sanitized():
        raise Skip("needs an address-space limit, under which AddressSanitizer cannot start")
    # 2^31 - 2 tokens of disk: an index mapping of tens of GiB, past the 1 GiB limit
    d = os.path.join(TMP, "huge-disk")
    r = Measured(["--trace", trace(FIVE), "--host-tokens", 65536, "--disk-tokens", 2**31 - 2,
                  "--dir", d, "--json"], timeout=60)
    eq(r.rc, 1, f"exit status{r.where()}")
    check(re.fullmatch(r"kvtier-bench: out of memory opening the engine, .*--device-tokens 32768 "
                       r".* and the index of the disk tier: lower --device-tokens or "
                       r"--disk-tokens\n", r.err), f"stderr{r.where()}")


@case("bounded memory: a geometry whose sim pool cannot fit in RAM is refused, not run")
def _():
    # 32768 tokens of 16 MiB: 512 GiB, mapped at once where memory may be overcommitted. With
    # the address space limited the mapping fails; without, the bench sees it cannot fill it.
    args = ["--trace", trace(FIVE), "--backend", "sim", "--geometry", "llama3-8b,layers=4096",
            "--json"]
    for r in (Measured(args, timeout=60), bench(*args)):
        eq(r.rc, 1, f"exit status{r.where()}")
        eq(r.out, "", f"stdout{r.where()}")
        check(re.search(r"device pool.*--device-tokens 32768 of 16777216 bytes, --geometry "
                        r"llama3-8b,layers=4096\).*lower --device-tokens", r.err),
              f"stderr{r.where()}")
    check("sim backend keeps the device pool in host memory" in r.err or
          open("/proc/sys/vm/overcommit_memory").read().strip() == "2",
          f"without a limit the pool is mapped, and refused as too large to fill{r.where()}")


@case("eviction: with room for everything no policy evicts")
def _():
    ids = EVICTION["A B A C A B"][0]
    path = trace([(500, 1, [i]) for i in ids])
    for policy in ("lru", "lfu", "fifo", "mru", "filo"):
        j = run_ok("--trace", path, "--device-tokens", 4096, "--evict-policy", policy)
        eq(evicted(j), 0, f"{policy} tokens_evicted")
        eq(j["tokens_hit"]["device"], 3 * H, f"{policy} tokens_hit.device")


# 3. Malformed traces

GOOD = '{"input_length": 512, "output_length": 1, "hash_ids": [1]}\n'
MALFORMED = {
    # name: (lines, line number named in the error); line 2 is blank and still counted
    "bad JSON (unclosed object)": ([GOOD, "\n", '{"input_length": 512, "hash_ids": [1]\n'], 3),
    "not JSON at all": ([GOOD, "\n", "input_length=512\n"], 3),
    "text after the object": ([GOOD, "\n", GOOD.strip() + " x\n"], 3),
    "missing hash_ids": ([GOOD, "\n", '{"input_length": 512, "output_length": 1}\n'], 3),
    "missing input_length": ([GOOD, "\n", '{"output_length": 1, "hash_ids": [1]}\n'], 3),
    "empty hash_ids": ([GOOD, "\n", '{"input_length": 1, "output_length": 1, "hash_ids": []}\n'],
                       3),
    "input_length above what hash_ids hold": (
        [GOOD, "\n", '{"input_length": 513, "output_length": 1, "hash_ids": [1]}\n'], 3),
    "input_length leaving the last id empty": (
        [GOOD, "\n", '{"input_length": 512, "output_length": 1, "hash_ids": [1, 2]}\n'], 3),
    "negative input_length": (
        [GOOD, "\n", '{"input_length": -1, "output_length": 1, "hash_ids": [1]}\n'], 3),
    "hash id that is not an integer": (
        [GOOD, "\n", '{"input_length": 512, "output_length": 1, "hash_ids": ["a"]}\n'], 3),
    "duplicate key": ([GOOD, "\n", GOOD.replace("}", ', "input_length": 512}')], 3),
    "hash id of 2^40": (
        [GOOD, "\n", '{"input_length": 512, "output_length": 1, "hash_ids": [1099511627776]}\n'],
        3),
    "input_length above 2^24": (
        [GOOD, "\n", '{"input_length": 16777217, "output_length": 1, "hash_ids": [1]}\n'], 3),
    "NUL byte": ([GOOD, "\n", GOOD.replace("output", "out\0put").encode()], 3),
}


def malformed_case(lines, line):
    def run():
        path = trace(lines)
        r = bench("--trace", path, "--json")
        check_location(r, path, line)
    return run


for _name, (_lines, _line) in MALFORMED.items():
    case(f"malformed trace: {_name}")(malformed_case(_lines, _line))


@case("malformed trace: the first bad line wins, even on line 1")
def _():
    path = trace(['{"input_length": 512 "output_length": 1, "hash_ids": [1]}\n', "garbage\n"])
    check_location(bench("--trace", path), path, 1)


@case("malformed trace: empty file")
def _():
    path = trace([])
    r = bench("--trace", path, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    check(path in r.err, f"stderr should name {path}{r.where()}")


@case("malformed trace: only blank lines")
def _():
    path = trace(["\n", "   \n", "\t\n"])
    r = bench("--trace", path, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    check(path in r.err, f"stderr should name {path}{r.where()}")


@case("malformed trace: nonexistent file")
def _():
    path = os.path.join(TMP, "no-such-dir", "missing.jsonl")
    r = bench("--trace", path, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    check(path in r.err and re.search(r"no such file", r.err, re.I),
          f"stderr should name {path} and say it does not exist{r.where()}")


@case("trace: CRLF line ends, no final newline, unknown fields and the largest hash id")
def _():
    rows = ['{"input_length": 512, "output_length": 1, "hash_ids": [1099511627775]}\r\n',
            '{"ts": [1.5e3, null, true, {"s": "a\\u00e9\\n"}], "hash_ids": [1099511627775], '
            '"input_length": 512, "output_length": 1}']
    j = run_ok("--trace", trace(rows))
    eq(j["requests"], 2, "requests")
    eq(j["tokens_hit"]["device"], 496, "tokens_hit.device")


@case("malformed trace: --requests stops before a bad line")
def _():
    path = trace([GOOD, GOOD, "garbage\n"])
    j = run_ok("--trace", path, "--requests", 2)
    eq(j["requests"], 2, "requests")
    check_location(bench("--trace", path, "--requests", 3), path, 3)


# 3b. Bounded memory: hostile sizes fail fast or run in a bounded footprint

AS_LIMIT = 1 << 30  # the bench's address space in these cases (not under ASan, which needs more)
RSS_ROOM = 64 << 20  # what a case may keep resident beyond a small run's peak
_baseline = []


def sanitized():
    """Whether the bench is built with AddressSanitizer (it maps terabytes of shadow)."""
    with open(BENCH, "rb") as f:
        data = f.read()
    return b"__asan_init" in data or b"libasan" in data


class Measured:
    """The bench (or prog) run with its address space limited to AS_LIMIT (unless sanitized),
    stdin from the file stdin (or nothing), output to files; killed after timeout seconds if
    still going (alive says so). rss: its peak resident bytes, from wait4."""

    def __init__(self, args, timeout, prog=None, stdin=subprocess.DEVNULL):
        self.prog = prog or BENCH
        self.args = [str(a) for a in args]
        limit = None if sanitized() else (
            lambda: resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT)))
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            p = subprocess.Popen([self.prog] + self.args, stdin=stdin, stdout=out,
                                 stderr=err, preexec_fn=limit)
            self.alive, deadline = False, time.monotonic() + timeout
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:
                    self.alive = True
                    p.kill()
                    _, status, ru = os.wait4(p.pid, 0)
                    break
                time.sleep(0.05)
            p.returncode = self.rc = os.waitstatus_to_exitcode(status)
            self.rss = ru.ru_maxrss * 1024
            out.seek(0)
            err.seek(0)
            self.out = out.read().decode("utf-8", "replace")
            self.err = err.read().decode("utf-8", "replace")

    def where(self):
        return (f"\n    command: {os.path.basename(self.prog)} {' '.join(self.args)}\n"
                f"    exit {self.rc}, "
                f"{'killed while running' if self.alive else 'ended'}, peak RSS "
                f"{self.rss >> 20} MiB\n    stdout: {self.out[:300]!r}\n    stderr: "
                f"{self.err[:300]!r}")


def rss_bound():
    """A small run's peak resident bytes, plus RSS_ROOM."""
    if not _baseline:
        r = Measured(["--trace", trace(FIVE), "--json"], timeout=60)
        eq(r.rc, 0, f"exit status of the baseline run{r.where()}")
        _baseline.append(r.rss)
    return _baseline[0] + RSS_ROOM


@case("bounded memory: --trace /dev/zero fails at once, naming line 1")
def _():
    r = Measured(["--trace", "/dev/zero", "--json"], timeout=20)
    check(not r.alive, f"still running after 20 s{r.where()}")
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    check(re.fullmatch(r"kvtier-bench: /dev/zero:1: (NUL byte in line|line longer than \d+ "
                       r"bytes)\n", r.err), f"the error should name /dev/zero:1{r.where()}")
    check(r.rss <= rss_bound(), f"peak RSS above {rss_bound() >> 20} MiB{r.where()}")


@case("bounded memory: a trace line of 16 MiB is read, a longer one is an error naming it")
def _():
    cap = 16 << 20
    head = '{"input_length": 512, "output_length": 1, "hash_ids": [1]'
    line = head + " " * (cap - len(head) - 1) + "}"
    eq(len(line), cap, "test line length")
    path = trace([line + "\n", line + "\n"])
    j = run_ok("--trace", path)
    eq(j["requests"], 2, "requests of two 16 MiB lines")
    path = trace([line + "\n", line + " \n", GOOD])
    r = Measured(["--trace", path, "--json"], timeout=60)
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    eq(r.err, f"kvtier-bench: {path}:2: line longer than {cap} bytes\n", f"stderr{r.where()}")
    check(r.rss <= rss_bound(), f"peak RSS above {rss_bound() >> 20} MiB{r.where()}")
    check(re.search(r"16 MiB a line", bench("--help").out), "--help gives the line limit")


@case("bounded memory: a trace is read a line at a time, not held")
def _():
    # 256 requests of 32768 blocks: 8 M segments, 128 MiB if they were all held. The pool
    # is too small, so the run stops once the trace has been read through (sizing the engine).
    ids = ",".join(["7"] * 32768)
    line = f'{{"input_length": {32768 * BLOCK}, "output_length": 1, "hash_ids": [{ids}]}}\n'
    path = trace([line] * 256)
    r = Measured(["--trace", path, "--device-tokens", 16, "--json"], timeout=120)
    eq(r.rc, 1, f"exit status{r.where()}")
    check("--device-tokens" in r.err, f"stderr should say the pool is too small{r.where()}")
    check(r.rss <= rss_bound(), f"peak RSS above {rss_bound() >> 20} MiB{r.where()}")


@case("bounded memory: --requests 2^40 (the most) of a synthetic workload holds one request "
      "at a time")
def _():
    r = Measured(["--requests", 2**40, "--json"], timeout=4)
    check(r.alive, f"it should still be going after 4 s{r.where()}")
    check(r.rss <= rss_bound(), f"peak RSS above {rss_bound() >> 20} MiB{r.where()}")


@case("trace: a pipe is refused before a pass is spent on it")
def _():
    p = subprocess.run(f"cat {trace(FIVE)} | {BENCH} --trace /dev/stdin --json", shell=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    eq(p.returncode, 1, f"exit status; stderr {p.stderr!r}")
    eq(p.stdout, b"", "stdout")
    check(re.search(rb"/dev/stdin: cannot be read again.*not a pipe", p.stderr),
          f"stderr {p.stderr!r}")


# 3c. kvtier-radix-bench, built beside kvtier-bench, reads traces through the same reader

def radix():
    path = os.path.join(os.path.dirname(BENCH), "kvtier-radix-bench")
    check(os.access(path, os.X_OK), f"{path} is not built beside kvtier-bench")
    return path


@case("radix bench: a trace without end is refused once 256 MiB of it are held")
def _():
    line = b'{"input_length": 512, "output_length": 1, "hash_ids": [1]}\n'
    feed = subprocess.Popen(["sh", "-c", 'while :; do printf "%s" "$0"; done', line.decode() * 64],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        r = Measured(["--trace", "/dev/stdin", "--pages", 100], timeout=120, prog=radix(),
                     stdin=feed.stdout)
    finally:
        feed.kill()
        feed.wait()
    check(not r.alive, f"still running after 120 s{r.where()}")
    eq(r.rc, 1, f"exit status{r.where()}")
    check(re.fullmatch(r"kvtier-radix-bench: the traces take more than 256 MiB in memory \(\d+ "
                       r"requests, the last of them from /dev/stdin\): give shorter traces\n",
                       r.err), f"stderr{r.where()}")
    r = Measured(["--trace", "/dev/zero"], timeout=20, prog=radix())
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.err, "kvtier-radix-bench: /dev/zero:1: NUL byte in line\n", f"stderr{r.where()}")


@case("radix bench: --pages whose tree cannot fit in RAM is refused before it is built")
def _():
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    pages = 2**30 - 3  # page size 1: the most it takes
    if pages * 162 <= ram:
        raise Skip(f"this machine's {ram >> 30} GiB of RAM would hold the largest tree")
    r = Measured(["--pages", pages, "--page-size", 1], timeout=60, prog=radix())
    eq(r.rc, 2, f"exit status{r.where()}")
    check(re.match(rf"kvtier-radix-bench: --pages: a tree of {pages} pages and its pool take "
                   r"about [\d.]+ GiB, more than this machine's [\d.]+ GiB\n", r.err),
          f"stderr{r.where()}")
    check(r.rss <= rss_bound(), f"peak RSS above {rss_bound() >> 20} MiB{r.where()}")


# 4. The verifier catches corruption

TWO = [(1024, 1, [1, 2])] * 2


@case("verifier: --corrupt-after 1 makes the next hit fail")
def _():
    r = bench("--trace", trace(TWO), "--json", "--corrupt-after", 1)
    eq(r.rc, 1, f"exit status{r.where()}")
    check("VERIFY FAILED" in r.err, f"stderr should say VERIFY FAILED{r.where()}")
    j = r.json()
    # One byte of one page was flipped: exactly one of the 63 pages served differs.
    eq(j["verify"]["mismatches"], 1, "verify.mismatches")
    eq(j["verify"]["pages_checked"], 63, "verify.pages_checked")
    eq(j["tokens_hit"]["device"], 1008, "tokens_hit.device")


@case("verifier: the same trace without --corrupt-after passes")
def _():
    j = run_ok("--trace", trace(TWO))
    eq(j["verify"]["pages_checked"], 63, "verify.pages_checked")


@case("verifier: corruption after the last request is never served")
def _():
    j = run_ok("--trace", trace(TWO), "--corrupt-after", 2)
    eq(j["verify"]["pages_checked"], 63, "verify.pages_checked")


@case("verifier: a shared first block is caught too, and the text report shows it")
def _():
    r = bench("--trace", trace([(1024, 1, [1, 2]), (1024, 1, [1, 3])]), "--corrupt-after", 1)
    eq(r.rc, 1, f"exit status{r.where()}")
    check("VERIFY FAILED" in r.err, f"stderr should say VERIFY FAILED{r.where()}")
    check(re.search(r"verified\D*32\b", r.out), f"report should show 32 pages verified{r.where()}")
    check(re.search(r"\b1 mismatch", r.out), f"report should show 1 mismatch{r.where()}")


@case("verifier: MLA geometry at page size 1 catches it")
def _():
    r = bench("--trace", trace(TWO), "--json", "--corrupt-after", 1, "--page-size", 1,
              "--geometry", "attention=mla,layers=2,kv_lora_rank=32,qk_rope_head_dim=16,"
              "dtype_bytes=2")
    eq(r.rc, 1, f"exit status{r.where()}")
    check("VERIFY FAILED" in r.err, f"stderr should say VERIFY FAILED{r.where()}")
    eq(r.json()["verify"]["mismatches"], 1, "verify.mismatches")


@case("verifier: a corrupted page that is evicted and recomputed is not served")
def _():
    # A B C A under lru (see the eviction cases): C evicts the damaged A, so A is recomputed.
    path = trace([(500, 1, [i]) for i in (1, 2, 3, 1)])
    j = run_ok("--trace", path, "--device-tokens", EVICT_DEVICE_TOKENS, "--corrupt-after", 1)
    eq(j["tokens_hit"]["device"], 0, "tokens_hit.device")
    eq(evicted(j), 2 * H, "tokens_evicted")
    # Under mru, B goes instead and the damaged A is served: that must fail.
    r = bench("--trace", path, "--json", "--device-tokens", EVICT_DEVICE_TOKENS,
              "--corrupt-after", 1, "--evict-policy", "mru")
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.json()["verify"]["mismatches"], 1, "verify.mismatches")


# 4b. Hybrid models: recurrent states served and checked like KV

HYBRID = "tiny,mamba_layers=2,conv_bytes=64,ssm_bytes=256"


@case("hybrid: a repeated 1024-token prompt is served up to its checkpoint at 960")
def _():
    # The first request checkpoints at the last multiple of 64 (the chunk) that a match of
    # its first 1023 tokens can reach, 960, and caches its KV up to there; the second finds
    # KV and state at 960 (a KV-only cache would serve 1008) and checks both.
    j = run_ok("--trace", trace(TWO), "--geometry", HYBRID)
    eq(j["tokens_hit"]["device"], 960, "tokens_hit.device")
    eq(j["verify"]["pages_checked"], 60, "verify.pages_checked")
    m = j["mamba"]
    eq((m["kv_hit_tokens"], m["state_hit_tokens"], m["checkpoints"], m["states_checked"]),
       (960, 960, 1, 1), "mamba kv/state hit, checkpoints, states checked")
    eq(run_ok("--trace", trace(TWO))["tokens_hit"]["device"], 1008, "KV-only hit")


@case("hybrid: prompts sharing a 512-token block: the second branches at 512, the third uses it")
def _():
    # Block 1 is shared (512 tokens) and block 2 differs: the shared prefix is 512 tokens.
    # The first caches KV and a state at 960; the second matches 512 tokens of KV whose only
    # state lies deeper (a tombstone at 512): served 0, branching at 512, where it
    # checkpoints; the third (as the second) then starts from 512.
    rows = [(1024, 1, [1, 2]), (1024, 1, [1, 3]), (1024, 1, [1, 4])]
    j = run_ok("--trace", trace(rows), "--geometry", HYBRID)
    eq(j["tokens_hit"]["device"], 512, "tokens_hit.device")
    m = j["mamba"]
    eq((m["kv_hit_tokens"], m["state_hit_tokens"], m["states_checked"]), (1024, 512, 1),
       "mamba kv/state hit, states checked")


@case("hybrid: a damaged checkpoint is caught as a state mismatch")
def _():
    r = bench("--trace", trace(TWO), "--json", "--corrupt-after", 1, "--geometry", HYBRID)
    eq(r.rc, 1, f"exit status{r.where()}")
    check("VERIFY FAILED" in r.err, f"stderr should say VERIFY FAILED{r.where()}")
    # One KV page and the state the second request starts from.
    eq(r.json()["verify"]["mismatches"], 2, "verify.mismatches")


@case("hybrid: the qwen3-next-80b-a3b preset replays a synthetic workload, 0 mismatches")
def _():
    j = run_ok("--geometry", "qwen3-next-80b-a3b", "--synthetic", "mixed", "--requests", 40,
               "--device-tokens", 65536)
    m = j["mamba"]
    check(0 < m["state_hit_tokens"] <= m["kv_hit_tokens"], f"state-backed hit in (0, KV]: {m}")
    eq(j["tokens_hit"]["device"], m["state_hit_tokens"], "tokens_hit.device")
    check(m["states_checked"] > 0, "states checked")


@case("hybrid: a checkpoint the device evicted comes back from the host, state checked")
def _():
    # A's KV and state at 960 leave a 2048-token device for B and C; the state is saved
    # beside A's host copy, and the fourth request gets both back from the host.
    rows = [(1024, 1, [1, 2]), (1024, 1, [3, 4]), (1024, 1, [5, 6]), (1024, 1, [1, 2])]
    j = run_ok("--trace", trace(rows), "--geometry", HYBRID, "--device-tokens", 2048,
               "--host-tokens", 65536)
    eq((j["tokens_hit"]["device"], j["tokens_hit"]["host"]), (0, 960), "tokens_hit device, host")
    m = j["mamba"]
    eq((m["state_hit_tokens"], m["states_checked"], m["saved_states"], m["restored_states"]),
       (960, 1, 2, 1), "mamba state hit, states checked, saved, restored")
    eq(j["verify"]["pages_checked"], 60, "verify.pages_checked")


@case("hybrid: a second run on the same dir gets KV and states from disk, states checked")
def _():
    # Each checkpoint is written to disk with its pages; the second process starts with an
    # empty tree and finds A, B and C on disk (KV and the state at 960), then the second A
    # on the host, where the first fill left it.
    rows = [(1024, 1, [1, 2]), (1024, 1, [3, 4]), (1024, 1, [5, 6]), (1024, 1, [1, 2])]
    d = os.path.join(TMP, "hybrid-restart")
    args = ("--trace", trace(rows), "--geometry", HYBRID, "--device-tokens", 2048,
            "--host-tokens", 65536, "--disk-tokens", 1 << 20, "--dir", d)
    j = run_ok(*args)
    eq(j["mamba"]["stored_states"], 3, "checkpoints written")
    j = run_ok(*args)
    eq((j["tokens_hit"]["device"], j["tokens_hit"]["host"], j["tokens_hit"]["disk"]),
       (0, 960, 2880), "tokens_hit device, host, disk")
    m = j["mamba"]
    eq((m["fetched_states"], m["states_checked"], m["state_hit_tokens"]), (3, 4, 3840),
       "states read from disk, checked, state-backed hit")


def hybrid_from_remote(url):
    """Two processes of a hybrid model on url: the second gets KV and states from it."""
    rows = [(1024, 1, [1, 2]), (1024, 1, [3, 4]), (1024, 1, [5, 6]), (1024, 1, [1, 2])]
    args = ("--trace", trace(rows), "--geometry", HYBRID, "--device-tokens", 2048,
            "--host-tokens", 65536, "--remote", url)
    r = bench(*args, "--json")
    if r.rc == 1 and "--remote: not built in" in r.err:
        raise Skip("kvtier-bench was built without the Redis store")
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.json()["mamba"]["stored_states"], 3, "checkpoints written")
    j = run_ok(*args)
    eq((j["tokens_hit"]["host"], j["tokens_hit"]["disk"], j["tokens_hit"]["remote"]),
       (960, 0, 2880), "tokens_hit host, disk, remote")
    eq((j["mamba"]["fetched_states"], j["mamba"]["states_checked"]), (3, 4),
       "states read from the remote, checked")


@case("hybrid: a second process gets KV and states from the Redis tier")
def _():
    p, url = redis_server()
    try:
        hybrid_from_remote(url)
    finally:
        p.kill()
        p.wait()


@case("hybrid: a second process gets KV and states from a 3-master Redis Cluster")
def _():
    procs, ports = harness.start_redis_cluster(TMP)
    try:
        hybrid_from_remote(",".join(f"redis://127.0.0.1:{p}" for p in ports))
    finally:
        for p in procs:
            p.kill()
            p.wait()


@case("hybrid: the qwen3-next-80b-a3b preset with a host tier, 0 mismatches")
def _():
    # Rows shrunk (hits depend on tokens and pool sizes, not row bytes).
    j = run_ok("--geometry", "qwen3-next-80b-a3b,head_dim=16,conv_bytes=64,ssm_bytes=256",
               "--synthetic", "mixed", "--requests", 100, "--device-tokens", 32768,
               "--host-tokens", 262144)
    m = j["mamba"]
    hit = j["tokens_hit"]
    check(hit["host"] > 0 and m["restored_states"] > 0, f"served from the host: {hit} {m}")
    eq(hit["device"] + hit["host"], m["state_hit_tokens"], "state-backed hit")
    check(m["states_checked"] > 0, "states checked")


@case("hybrid: usage errors name the option")
def _():
    for args, pat in ((["--geometry", "tiny,mamba_layers=2"], r"--geometry"),
                      (["--geometry", HYBRID, "--mamba-slots", "1"], r"--mamba-slots"),
                      (["--mamba-slots", "8"], r"--mamba-slots needs a hybrid")):
        usage_case(args, pat)()


# 4c. Hybrid models: sliding-window layers

WINDOWED = "tiny,layers=4,swa_window=32,full_every=2"


@case("window: a repeated prompt is served whole; full layers and the last window checked")
def _():
    # The prompt is cached when its prefill ends, before its window moves on, so all of its
    # sliding-window KV is cached: the second request gets its 1008 tokens back.
    j = run_ok("--trace", trace(TWO), "--geometry", WINDOWED)
    eq(j["tokens_hit"]["device"], 1008, "tokens_hit.device")
    eq(j["verify"]["pages_checked"], 63, "verify.pages_checked")
    w = j["swa"]
    eq((w["window"], w["full_layers"], w["kv_hit_tokens"], w["window_hit_tokens"]),
       (32, 2, 1008, 1008), "swa window, full layers, kv hit, window-backed hit")


@case("window: a small SWA pool frees windows; what is served is still checked")
def _():
    # Three prompts of 1024 tokens with an SWA pool of 1024 tokens: each prefill evicts the
    # SWA KV the one before cached (its full KV stays), so the repeated first prompt finds KV
    # without a live window at its end and is recomputed.
    rows = [(1024, 1, [1, 2]), (1024, 1, [3, 4]), (1024, 1, [1, 2])]
    j = run_ok("--trace", trace(rows), "--geometry", WINDOWED, "--swa-tokens", 1200)
    w = j["swa"]
    check(w["evicted_tokens"] > 0, f"SWA KV evicted: {w}")
    check(w["window_hit_tokens"] < w["kv_hit_tokens"], f"a window lost: {w}")
    eq(j["tokens_hit"]["device"], w["window_hit_tokens"], "tokens_hit.device")


@case("window: --corrupt-after is caught through a full-attention layer")
def _():
    r = bench("--trace", trace(TWO), "--json", "--corrupt-after", 1, "--geometry", WINDOWED)
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.json()["verify"]["mismatches"], 1, "verify.mismatches")


@case("window: the gpt-oss-120b and gemma-3-27b presets replay prompts sharing three blocks")
def _():
    # Prompts of four blocks sharing three: past gemma's 1024-token window too.
    rows = [(2000, 8, [1, 2, 3, 4]), (2000, 8, [1, 2, 3, 5]), (2000, 8, [1, 2, 3, 4])]
    for g, dev in (("gpt-oss-120b", 8192), ("gemma-3-27b", 8192)):
        j = run_ok("--geometry", g, "--trace", trace(rows), "--device-tokens", dev)
        w = j["swa"]
        check(0 < w["window_hit_tokens"] <= w["kv_hit_tokens"], f"{g}: window-backed hit: {w}")
        check(w["kv_pool_bytes"] < dev * j["config"]["cell_bytes"], f"{g}: pool smaller: {w}")


@case("window: a prompt evicted from the device comes back from the host, its window too")
def _():
    # Four prompts of 1024 tokens through a 2048-token device: the first is evicted to the
    # host (written through, its sliding-window layers with it) and its repeat is loaded back
    # whole; the last window's sliding-window rows are checked as on the device.
    rows = [(1024, 1, [1, 2]), (1024, 1, [3, 4]), (1024, 1, [5, 6]), (1024, 1, [7, 8]),
            (1024, 1, [1, 2])]
    j = run_ok("--trace", trace(rows), "--geometry", WINDOWED, "--device-tokens", 2048,
               "--host-tokens", 16384)
    eq((j["tokens_hit"]["device"], j["tokens_hit"]["host"]), (0, 1008), "tokens_hit device, host")
    w = j["swa"]
    eq((w["kv_hit_tokens"], w["window_hit_tokens"]), (1008, 1008), "swa kv, window-backed hit")
    check(w["evicted_tokens"] > 0, f"SWA KV evicted on the device: {w}")
    eq(j["verify"]["mismatches"], 0, "verify.mismatches")


def window_restart(*where):
    """Two processes of a sliding-window model over where (--dir or --remote): the second
    is served each prompt from below, its last window read from the window copies."""
    rows = [(1024, 1, [1, 2]), (1024, 1, [3, 4]), (1024, 1, [5, 6]), (1024, 1, [7, 8]),
            (1024, 1, [1, 2])]
    args = ("--trace", trace(rows), "--geometry", WINDOWED, "--device-tokens", 2048,
            "--host-tokens", 65536, *where)
    r = bench(*args, "--json")
    if r.rc == 1 and "--remote: not built in" in r.err:
        raise Skip("kvtier-bench was built without the Redis store")
    eq(r.rc, 0, f"exit status{r.where()}")
    j = run_ok(*args)
    below = j["tokens_hit"]["disk"] + j["tokens_hit"].get("remote", 0)
    eq((j["tokens_hit"]["host"], below), (1008, 4032), "tokens_hit host, below the host")
    w = j["swa"]
    eq((w["kv_hit_tokens"], w["window_hit_tokens"]), (5040, 5040), "swa kv, window-backed hit")
    eq(j["verify"]["mismatches"], 0, "verify.mismatches")


@case("window: a prefix ending inside a cached prompt is served from disk up to a 512-token point")
def _():
    # The first process caches A (blocks 1, 2: one node of 1024 tokens); the second asks for
    # blocks 1, 3, sharing A's first 512 tokens: inside A's node, where the window copies of
    # the 512-token point let the disk serve them (a window at A's end alone would not).
    d = os.path.join(TMP, "window-inside")
    common = ("--geometry", WINDOWED, "--device-tokens", 2048, "--host-tokens", 65536,
              "--disk-tokens", 1 << 20, "--dir", d)
    run_ok("--trace", trace([(1024, 1, [1, 2])]), *common)
    j = run_ok("--trace", trace([(1024, 1, [1, 3])]), *common)
    eq((j["tokens_hit"]["host"], j["tokens_hit"]["disk"]), (0, 512), "tokens_hit host, disk")
    eq(j["verify"]["mismatches"], 0, "verify.mismatches")


@case("window: a second run on the same dir is served from disk, windows from their copies")
def _():
    window_restart("--disk-tokens", 1 << 20, "--dir", os.path.join(TMP, "window-restart"))


@case("window: a second process is served from the Redis tier, windows from their copies")
def _():
    p, url = redis_server()
    try:
        window_restart("--remote", url)
    finally:
        p.kill()
        p.wait()


@case("window: usage errors name the option")
def _():
    for args, pat in ((["--swa-tokens", "64"], r"--swa-tokens needs a sliding-window"),
                      (["--geometry", WINDOWED + ",mamba_layers=1,conv_bytes=8,ssm_bytes=8"],
                       r"recurrent and sliding-window"),
                      (["--geometry", "tiny,swa_window=32,full_every=1"], r"--geometry")):
        usage_case(args, pat)()


# 4d. A shared remote tier (Redis)


def redis_server():
    """A redis-server of our own: (process, url); Skip without one."""
    p, port = harness.start_redis(TMP)
    return p, f"redis://127.0.0.1:{port}"


def first_remote_run(url):
    """The first of two processes on url: (its args, its report); Skip without the Redis store."""
    args = ("--synthetic", "mixed", "--requests", 150, "--host-tokens", 65536, "--remote", url)
    r = bench(*args, "--json")
    if r.rc == 1 and "--remote: not built in" in r.err:
        raise Skip("kvtier-bench was built without the Redis store")
    eq(r.rc, 0, f"exit status{r.where()}")
    first = r.json()
    eq(first["verify"]["mismatches"], 0, "mismatches")
    eq(first["config"]["remote"], url, "config.remote")
    return args, first


@case("remote: a second process is served from the Redis tier what the first wrote")
def _():
    p, url = redis_server()
    try:
        args, first = first_remote_run(url)
        second = run_ok(*args)
        check(second["tokens_hit"]["remote"] > first["tokens_hit"]["remote"],
              f"the remote serves the second: {first['tokens_hit']} -> {second['tokens_hit']}")
        eq(second["tokens_hit"]["disk"], 0, "no disk hits without a disk tier")
        eq((second["disk_errors"], second["remote_errors"]), (0, 0), "disk and remote errors")
        p.kill()
        p.wait()
        # The server is gone: the engine serves from its own tiers and counts the failures.
        dead = run_ok(*args)
        eq(dead["tokens_hit"]["remote"], 0, "nothing from a dead remote")
        check(dead["remote_errors"] > 0, f"the dead remote's failures counted: {dead['remote_errors']}")
        eq(dead["disk_errors"], 0, "and not as the disk's")
        check(dead["tokens_hit"]["device"] > 0, "the device still serves")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@case("remote: a server filled with --seed 1 serves a --seed 2 run nothing of seed 1's; "
      "verified, as on an empty server")
def _():
    servers = []
    try:
        path = trace(PARTIAL)  # the same tokens whatever the seed, other KV bytes
        for _ in range(2):
            servers.append(redis_server())
        args = lambda url, seed: ("--trace", path, "--host-tokens", 65536, "--remote", url,
                                  "--seed", seed)
        r = bench(*args(servers[0][1], 1), "--json")
        if r.rc == 1 and "--remote: not built in" in r.err:
            raise Skip("kvtier-bench was built without the Redis store")
        eq(r.rc, 0, f"exit status{r.where()}")
        check(run_ok(*args(servers[0][1], 1))["tokens_hit"]["remote"] > 0,
              "seed 1 is served its own KV from the server")
        r = bench(*args(servers[0][1], 2), "--json")
        eq(r.rc, 0, f"seed 2 on a server of seed 1{r.where()}")
        check("VERIFY FAILED" not in r.err, f"no wrong bytes{r.where()}")
        beside = r.json()
        alone = run_ok(*args(servers[1][1], 2))  # the same run on an empty server
        eq(beside["tokens_hit"], alone["tokens_hit"], "seed 2 beside seed 1's KV")
        eq((beside["remote_errors"], beside["verify"]["mismatches"]), (0, 0),
           "remote errors, mismatches")
    finally:
        for p, _ in servers:
            p.kill()
            p.wait()


@case("remote: store pages of 256 tokens on the server serve a second process; pages of 16 do "
      "not read them")
def _():
    servers = []
    try:
        servers.append(redis_server())
        args, alone = first_remote_run(servers[0][1])  # pages of 16 on an empty server
        servers.append(redis_server())
        url = servers[1][1]
        grouped = tuple(url if a == servers[0][1] else a for a in args)
        one = run_ok(*grouped, "--store-page-tokens", 256)
        two = run_ok(*grouped, "--store-page-tokens", 256)
        check(two["tokens_hit"]["remote"] > one["tokens_hit"]["remote"],
              f"the remote serves the second: {one['tokens_hit']} -> {two['tokens_hit']}")
        eq((two["remote_errors"], two["verify"]["mismatches"]), (0, 0), "errors, mismatches")
        # Another store page size is another fingerprint: pages of 16 on the server holding
        # the store pages of 256 are served exactly as on an empty one.
        beside = run_ok(*grouped)
        eq(beside["tokens_hit"], alone["tokens_hit"], "pages of 16 beside store pages of 256")
        eq(beside["remote_errors"], 0, "remote_errors")
    finally:
        for p, _ in servers:
            p.kill()
            p.wait()


@case("remote over TLS (rediss://): a second process is served what the first wrote; a server "
      "whose certificate does not check out serves nothing")
def _():
    p, port, tls_port, files = harness.start_redis_tls(TMP)
    url = f"rediss://127.0.0.1:{tls_port}"
    try:
        args, first = first_remote_run(url)  # the system's CAs: the test's CA is not one
        eq(first["tokens_hit"]["remote"], 0, "nothing over TLS without the test's CA")
        check(first["remote_errors"] > 0, f"the refused connections counted: {first['remote_errors']}")
        args = args + ("--remote-tls-ca", files["ca.crt"])
        first = run_ok(*args)
        second = run_ok(*args)
        check(second["tokens_hit"]["remote"] > first["tokens_hit"]["remote"],
              f"the remote serves the second over TLS: {first['tokens_hit']} -> "
              f"{second['tokens_hit']}")
        eq((second["remote_errors"], second["verify"]["mismatches"]), (0, 0),
           "remote errors, mismatches")
        # The same pages through the plain port: one database, reached either way.
        plain = run_ok(*args[:-4], "--remote", f"redis://127.0.0.1:{port}")
        check(plain["tokens_hit"]["remote"] > 0, f"the plain port serves them: {plain['tokens_hit']}")
        # Another CA: the certificate does not check out; served from the engine's own tiers.
        other = run_ok(*args[:-1], files["other-ca.crt"])
        eq(other["tokens_hit"]["remote"], 0, "nothing from a server whose certificate fails")
        check(other["remote_errors"] > 0, "counted")
        eq(other["verify"]["mismatches"], 0, "mismatches")
    finally:
        p.kill()
        p.wait()


@case("remote over TLS: bad TLS options are usage errors that name the option")
def _():
    cert = os.path.join(TMP, "not-a-cert.pem")
    with open(cert, "w") as f:
        f.write("no PEM here\n")
    base = ("--requests", 2, "--host-tokens", 65536)
    for args, pat in (
            (("--remote", "redis://127.0.0.1:1", "--remote-tls-ca", cert),
             r"--remote-tls-ca needs a rediss://"),
            (("--remote", "rediss://127.0.0.1:1", "--remote-tls-ca", "/nonexistent/ca.pem"),
             r"--remote-tls-ca: cannot read /nonexistent/ca.pem"),
            (("--remote", "rediss://127.0.0.1:1", "--remote-tls-key", cert),
             r"--remote-tls-key needs --remote-tls-cert"),
            (("--remote", "rediss://127.0.0.1:1,redis://127.0.0.1:2"), r"--remote needs")):
        r = bench(*base, *args)
        eq(r.rc, 2, f"exit status of {args}{r.where()}")
        check(re.search(pat, r.err), f"stderr should match {pat!r}{r.where()}")
    # A readable file that holds no PEM: refused at open, saying so.
    r = bench(*base, "--remote", "rediss://127.0.0.1:1", "--remote-tls-ca", cert)
    eq(r.rc, 1, f"exit status{r.where()}")
    check("no usable PEM" in r.err, f"stderr should say the file is no PEM{r.where()}")


@case("remote: under a disk tier, hits are counted where they came from: disk or remote")
def _():
    p, url = redis_server()
    d1, d2 = tempfile.mkdtemp(dir=TMP), tempfile.mkdtemp(dir=TMP)
    try:
        args = ("--synthetic", "mixed", "--requests", 150, "--host-tokens", 65536,
                "--disk-tokens", 1 << 20, "--remote", url, "--deterministic")
        r = bench(*args, "--dir", d1, "--json")
        if r.rc == 1 and "--remote: not built in" in r.err:
            raise Skip("kvtier-bench was built without the Redis store")
        eq(r.rc, 0, f"exit status{r.where()}")
        # Its own disk holds what it wrote: the disk is nearer, so the disk serves.
        own = run_ok(*args, "--dir", d1)
        check(own["tokens_hit"]["disk"] > 0, f"the disk serves: {own['tokens_hit']}")
        eq(own["tokens_hit"]["remote"], 0, f"nothing from the remote: {own['tokens_hit']}")
        # An empty disk: what the first run wrote comes from the server, and is counted so
        # (the disk serves only what this run wrote to it); below the host, about the same
        # total (a leading run that times out on the server may cost a page: not exact).
        fresh = run_ok(*args, "--dir", d2)
        check(fresh["tokens_hit"]["remote"] > 10 * fresh["tokens_hit"]["disk"],
              f"the remote serves the first run's pages: {fresh['tokens_hit']}")
        below = fresh["tokens_hit"]["disk"] + fresh["tokens_hit"]["remote"]
        check(abs(below - own["tokens_hit"]["disk"]) <= own["tokens_hit"]["disk"] // 100,
              f"served from below the host, either way: {fresh['tokens_hit']} vs "
              f"{own['tokens_hit']}")
        eq((fresh["disk_errors"], fresh["remote_errors"]), (0, 0), "errors")
        eq(fresh["verify"]["mismatches"], 0, "mismatches")
    finally:
        p.kill()
        p.wait()


@case("remote: over a 3-master Redis Cluster, a second process is served what the first wrote")
def _():
    procs, ports = harness.start_redis_cluster(TMP)
    url = ",".join(f"redis://127.0.0.1:{p}" for p in ports)
    try:
        args, first = first_remote_run(url)
        # One seed is enough: it answers as a cluster and names the other masters.
        second = run_ok(*args[:-1], f"redis://127.0.0.1:{ports[1]}")
        check(second["tokens_hit"]["remote"] > first["tokens_hit"]["remote"],
              f"the cluster serves the second: {first['tokens_hit']} -> {second['tokens_hit']}")
        eq(second["disk_errors"], 0, "disk errors")
        eq(second["verify"]["mismatches"], 0, "mismatches")
        procs[2].kill()
        procs[2].wait()
        # A master gone: each page has a copy on another master (a slot 8192 away), so the
        # two live ones serve at least (N-1)/N of it, every byte verified.
        third = run_ok(*args)
        eq(third["verify"]["mismatches"], 0, "mismatches with a master down")
        check(third["tokens_hit"]["remote"] * 3 >= second["tokens_hit"]["remote"] * 2,
              f"the live masters serve 2/3 or more: {second['tokens_hit']} -> "
              f"{third['tokens_hit']}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@case("remote: engines splitting a workload (--shard) serve each other from one server")
def _():
    args = ("--synthetic", "mixed", "--requests", 200, "--host-tokens", 65536)
    halves = [run_ok(*args, "--shard", f"{k}/2") for k in (0, 1)]
    whole = run_ok(*args)
    eq(sum(h["requests"] for h in halves), 200, "the shards' requests")
    eq(sum(h["tokens_total"] for h in halves), whole["tokens_total"], "the shards' tokens")
    eq(halves[1]["config"]["shard"], "1/2", "config.shard")
    servers = [redis_server(), redis_server()]
    try:
        run_ok(*args, "--shard", "0/2", "--remote", servers[0][1])
        shared = run_ok(*args, "--shard", "1/2", "--remote", servers[0][1])
        alone = run_ok(*args, "--shard", "1/2", "--remote", servers[1][1])
    finally:
        for p, _ in servers:
            p.kill()
            p.wait()
    # The second engine finds on the server what the first wrote, beyond what its own
    # writes there give it alone.
    check(shared["tokens_hit"]["remote"] > alone["tokens_hit"]["remote"],
          f"from the remote: shared {shared['tokens_hit']} vs alone {alone['tokens_hit']}")
    check(sum(shared["tokens_hit"].values()) > sum(alone["tokens_hit"].values()),
          f"shared {shared['tokens_hit']} vs alone {alone['tokens_hit']}")


@case("remote: share_remote.py runs engines shared and alone and reports both")
def _():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                          "bench", "share_remote.py")
    if not shutil.which("redis-server"):
        raise Skip("redis-server is not installed")
    total = run_ok("--synthetic", "mixed", "--requests", 120)["tokens_total"]
    for extra in ([], ["--cluster"]):
        if extra and not shutil.which("redis-cli"):
            continue  # the standalone run still counts; a cluster needs redis-cli to form
        r = subprocess.run([sys.executable, script, "--bench", BENCH, "--engines", "2",
                            "--json"] + extra + ["--", "--synthetic", "mixed", "--requests",
                                                 "120", "--host-tokens", "65536"],
                           capture_output=True, text=True, timeout=300)
        eq(r.returncode, 0, f"share_remote.py {extra}: {r.stderr[-400:]}")
        j = json.loads(r.stdout)
        eq((j["engines"], j["cluster"], j["mismatches"]), (2, bool(extra), 0),
           "engines, cluster, mismatches")
        eq(j["tokens_total"], total, "the shards cover the workload")
        check(j["shared_served"] >= j["alone_served"] > 0, f"shared vs alone: {j}")


@case("remote: usage errors name the option")
def _():
    for args, pat in ((["--shard", "2/2"], r"--shard"), (["--shard", "1"], r"--shard"),
                      (["--remote", "redis://127.0.0.1:1"], r"--remote needs a host tier"),
                      (["--host-tokens", "65536", "--remote", "http://x"], r"--remote needs a redis"),
                      (["--host-tokens", "65536", "--remote", "redis://a:1,http://b"],
                       r"--remote needs a redis")):
        usage_case(args, pat)()


# 5. Usage errors

USAGE = [
    (["--host-tokens", "x"], r"--host-tokens"),
    (["--disk-tokens", "5"], r"--disk-tokens"),
    (["--host-tokens", "65536", "--disk-tokens", "4096"], r"--dir"),
    (["--host-tokens", "65536", "--dir", "/tmp/kvt-never"], r"--disk-tokens.*--dir"),
    (["--disk-tokens", "x"], r"--disk-tokens"),
    (["--trace", "x.jsonl", "--synthetic", "chat"], r"--trace.*--synthetic|--synthetic.*--trace"),
    (["--synthetic", "nope"], r"--synthetic.*nope|nope.*--synthetic"),
    (["--geometry", "bogus"], r"--geometry.*bogus"),
    (["--geometry", "tiny,layers=0"], r"--geometry"),
    (["--geometry", "tiny,layers=x"], r"--geometry"),
    (["--geometry", "attention=mla,layers=2"], r"--geometry"),
    (["--page-size", "3"], r"--page-size"),
    (["--page-size", "512"], r"--page-size"),
    (["--page-size", "0"], r"--page-size"),
    (["--device-tokens", "0"], r"--device-tokens"),
    (["--requests", "0"], r"--requests"),
    (["--seed", "-1"], r"--seed"),
    (["--evict-policy", "random"], r"--evict-policy"),
    (["--write-policy", "lazy"], r"--write-policy"),
    (["--backend", "gpu"], r"--backend"),
    (["--bogus", "1"], r"unknown option.*--bogus"),
    (["--json", "--trace"], r"--trace"),
]


def usage_case(args, pattern):
    def run():
        r = bench(*args)
        eq(r.rc, 2, f"exit status{r.where()}")
        eq(r.out, "", f"stdout{r.where()}")
        check(re.search(pattern, r.err), f"stderr should match /{pattern}/{r.where()}")
    return run


for _args, _pat in USAGE:
    case(f"usage: {' '.join(_args)}")(usage_case(_args, _pat))


@case("usage: an unknown option given last is called unknown")
def _():
    usage_case(["--trace", "x.jsonl", "--bogus"], r"unknown option.*--bogus")()


# An argument of 100 KB is quoted in an error by its start only.
HUGE = "x" * 100000
HUGE_ARGS = [["--synthetic", HUGE], ["--backend", HUGE], ["--evict-policy", HUGE],
             ["--write-policy", HUGE], ["--" + HUGE, "1"], ["--geometry", HUGE],
             ["--geometry", "tiny," + HUGE], ["--trace", "/" + HUGE]]


def huge_case(args):
    def run():
        r = bench(*args)
        check(r.rc in (1, 2), f"exit status 1 or 2 expected{r.where()}")
        eq(r.out, "", f"stdout{r.where()}")
        check(len(r.err) < 1000, f"stderr of {len(r.err)} bytes{r.where()}")
        check(re.search(r"x{60}\.\.\.", r.err) or "x" not in r.err,
              f"the argument is cut{r.where()}")
    return run


for _args in HUGE_ARGS:
    case(f"usage: a 100 KB argument is cut in the error: {_args[0][:12]}")(huge_case(_args))


@case("usage: a host tier no larger than the device pool is refused")
def _():
    # --help: "host tier size in tokens, larger than the device pool". Written when the host
    # tier did not exist yet and any non-zero value was a usage error (exit 2); with the tier
    # under way the engine refuses it at open (exit 1). Either way: refused, and said so.
    r = bench("--trace", trace(FIVE), "--host-tokens", 5, "--json")
    check(r.rc in (1, 2), f"exit status 1 or 2 expected{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    check(re.search(r"host", r.err, re.I), f"stderr should mention the host tier{r.where()}")


@case("usage: --help")
def _():
    r = bench("--help")
    eq(r.rc, 0, f"exit status{r.where()}")
    for opt in ("--trace", "--synthetic", "--geometry", "--page-size", "--device-tokens",
                "--evict-policy", "--backend", "--json", "--corrupt-after"):
        check(opt in r.out, f"--help should mention {opt}{r.where()}")


@case("usage: --host-tokens 0 and --disk-tokens 0 are accepted")
def _():
    j = run_ok("--trace", trace(FIVE), "--host-tokens", 0, "--disk-tokens", 0)
    eq(j["tokens_hit"]["device"], 4 * 1008, "tokens_hit.device")
    eq(j["config"]["host_tokens"], 0, "config.host_tokens")


@case("backend: sim, and auto picks sim or cuda")
def _():
    eq(run_ok("--trace", trace(FIVE), "--backend", "sim")["config"]["backend"], "sim", "backend")
    j = run_ok("--trace", trace(FIVE), "--backend", "auto")
    check(j["config"]["backend"] in ("sim", "cuda"), f"auto chose {j['config']['backend']}")
    eq(j["tokens_hit"]["device"], 4 * 1008, "tokens_hit.device")


@case("backend: cuda runs on a GPU or fails clearly")
def _():
    r = bench("--trace", trace(FIVE), "--backend", "cuda", "--json")
    if r.rc == 0:
        j = r.json()
        eq(j["config"]["backend"], "cuda", "config.backend")
        eq(j["verify"]["mismatches"], 0, "verify.mismatches")
        eq(j["tokens_hit"]["device"], 4 * 1008, "tokens_hit.device")
    else:
        eq(r.rc, 1, f"exit status{r.where()}")
        eq(r.out, "", f"stdout{r.where()}")
        check(CUDA_ERROR.search(r.err), f"stderr should mention the backend{r.where()}")


# 6. Geometries and page sizes

GEO_ROWS = [(300, 4, [1]), (300, 1, [1]), (250, 1, [1]), (700, 2, [1, 9]), (260, 1, [1])]
GEOMETRIES = [
    ("tiny", TINY_CELL),
    ("llama3-8b", 32 * 2 * 8 * 128 * 2),
    ("llama3-70b", 80 * 2 * 1 * 128 * 2),
    ("deepseek-v3", 61 * (512 + 64) * 2),
    ("attention=mla,layers=2,kv_lora_rank=32,qk_rope_head_dim=16,dtype_bytes=2", 2 * 48 * 2),
    ("tiny,v_head_dim=8", 2 * (16 + 8) * 2),
    ("llama3-8b,layers=2,kv_heads=2,dtype_bytes=4", 2 * 2 * 2 * 128 * 4),
]


def geometry_case(geometry, cell, page_size):
    def run():
        # 768 tokens: the longest request (702) rounded up to 64, and a little room.
        j = run_ok("--trace", trace(GEO_ROWS), "--geometry", geometry, "--page-size", page_size,
                   "--device-tokens", 768)
        check(j["tokens_hit"]["device"] > 0, "expected hits")
        eq(j["config"]["geometry"], geometry, "config.geometry")
        consistent(j, page_size, cell)
        check_model(j, GEO_ROWS, page_size)
    return run


for _g, _cell in GEOMETRIES:
    case(f"geometry: {_g}")(geometry_case(_g, _cell, 16))
for _ps in (1, 2, 64, 256):
    case(f"page size {_ps}")(geometry_case("tiny", TINY_CELL, _ps))
case("page size 64 with deepseek-v3")(geometry_case("deepseek-v3", 61 * 576 * 2, 64))


@case("eviction: random traces under every policy verify clean and never beat the model")
def _():
    # Whatever a policy evicts, the cache is a subset of what a pool that never evicts would
    # hold, so each request's hit, and so the total, is at most the model's; with nothing
    # evicted it is exactly the model's.
    #
    # Token ids come from a 128000-word vocabulary, so one token of a request's output can equal
    # the token at the same position of another request's input block (it happens: block 2
    # offset 177 == the first output token of line 2), a real shared prefix that the model,
    # which names tokens instead of valuing them, does not see. So a request that caches output
    # tokens (output_length >= 2) ends in a block no other request has, and pages are at least
    # 2 tokens, so that a false match between two blocks would need two coincidences at once.
    rng = random.Random(20240601)
    policies = ("lru", "lfu", "fifo", "mru", "filo")
    evicting, unique = 0, 1000
    for it in range(30):
        rows = []
        for _ in range(rng.randint(5, 30)):
            nb, out = rng.randint(1, 3), rng.choice([0, 1, 1, 2, 17, 100])
            ids = [rng.randint(1, 3)] + [rng.randint(1, 3) * 10 + k for k in range(1, nb)]
            if out >= 2:
                ids[-1], unique = unique, unique + 1
            rows.append((rng.randint((nb - 1) * BLOCK + 1, nb * BLOCK), out, ids))
        ps = rng.choice([2, 4, 16, 64])
        need = -(-max(i + o for i, o, _ in rows) // ps) * ps
        dev = need + rng.randint(0, 2000)
        policy = policies[it % len(policies)]
        j = run_ok("--trace", trace(rows), "--page-size", ps, "--device-tokens", dev,
                   "--evict-policy", policy)
        m = model(rows, ps)
        what = f"trace {it} ({policy}, page {ps}, {dev} tokens)"
        consistent(j, ps, TINY_CELL)
        eq(j["tokens_decoded"], m["decoded"], f"{what}: tokens_decoded")
        check(j["tokens_hit"]["device"] <= m["hit"],
              f"{what}: {j['tokens_hit']['device']} tokens hit, more than the {m['hit']} "
              "possible")
        if evicted(j) == 0:
            eq(j["tokens_hit"]["device"], m["hit"], f"{what} evicted nothing: tokens_hit")
        else:
            evicting += 1
    check(evicting >= 10, f"only {evicting} of 30 random traces evicted anything")


# 7. Synthetic workloads are deterministic

def strip_time(j):
    j = dict(j)
    del j["seconds"], j["tokens_per_second"]
    return j


def synthetic_case(name):
    def run():
        a = run_ok("--synthetic", name, "--requests", 200, "--seed", 3)
        b = run_ok("--synthetic", name, "--requests", 200, "--seed", 3)
        c = run_ok("--synthetic", name, "--requests", 200, "--seed", 4)
        eq(strip_time(b), strip_time(a), "a second run with the same seed")
        check(c["tokens_total"] != a["tokens_total"], "seeds 3 and 4 give the same tokens_total")
        check(strip_time(c) != strip_time(a), "seeds 3 and 4 give the same report")
        for j, seed in ((a, 3), (c, 4)):
            eq(j["requests"], 200, "requests")
            eq(j["config"]["synthetic"], name, "config.synthetic")
            eq(j["config"]["trace"], None, "config.trace")
            eq(j["config"]["seed"], seed, "config.seed")
            check(j["tokens_hit"]["device"] > 0, "expected hits")
            check(j["tokens_decoded"] > 0, "expected decoded tokens")
            consistent(j, 16, TINY_CELL)
    return run


for _name in ("chat", "docqa", "mixed"):
    case(f"synthetic: {_name} is deterministic")(synthetic_case(_name))


@case("synthetic: the default workload is mixed, seed 1")
def _():
    a = run_ok("--requests", 50)
    b = run_ok("--synthetic", "mixed", "--requests", 50, "--seed", 1)
    eq(a["config"]["synthetic"], "mixed", "config.synthetic")
    eq(strip_time(a), strip_time(b), "default vs --synthetic mixed --seed 1")


@case("synthetic: a small pool evicts and still verifies")
def _():
    j = run_ok("--synthetic", "chat", "--requests", 200, "--device-tokens", 8192,
               "--evict-policy", "lfu")
    check(evicted(j) > 0, "expected evictions in an 8192-token pool")
    check(j["tokens_hit"]["device"] > 0, "expected hits")
    consistent(j, 16, TINY_CELL)


# 8. A pool smaller than the longest request

@case("pool: smaller than the longest request is refused")
def _():
    # input 512 + output 1 rounded up to 16: 528 slots.
    path = trace([(100, 1, [1]), (512, 1, [2])])
    for tokens in (16, 512, 527):
        r = bench("--trace", path, "--device-tokens", tokens, "--json")
        eq(r.rc, 1, f"exit status with --device-tokens {tokens}{r.where()}")
        eq(r.out, "", f"stdout{r.where()}")
        check("--device-tokens" in r.err, f"stderr should mention --device-tokens{r.where()}")
    j = run_ok("--trace", path, "--device-tokens", 528)
    eq(j["requests"], 2, "requests")


@case("pool: the output counts toward the longest request")
def _():
    # input 100 + output 200 = 300, rounded up to 304 at page 16.
    path = trace([(100, 200, [1])])
    r = bench("--trace", path, "--device-tokens", 288, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    check("--device-tokens" in r.err, f"stderr should mention --device-tokens{r.where()}")
    j = run_ok("--trace", path, "--device-tokens", 304)
    eq(j["tokens_decoded"], 199, "tokens_decoded")


# 9. The text report

@case("text report: numbers, and nothing on stderr through pipes")
def _():
    r = bench("--trace", trace(FIVE))
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr through pipes (a progress line leaked?){r.where()}")
    for pat, what in ((r"(?m)^\s*input tokens\s+5120\s*$", "input tokens 5120"),
                      (r"(?m)^\s*from cache\s+4032\b", "from cache 4032"),
                      (r"(?m)^\s*verified\D*252\b", "verified 252 pages"),
                      (r"\b0 mismatches\b", "0 mismatches")):
        check(re.search(pat, r.out), f"report should show {what}{r.where()}")
    check("\r" not in r.out and "\033" not in r.out, f"control characters in the report{r.where()}")


@case("text report: a synthetic run through pipes leaves stderr empty")
def _():
    r = bench("--synthetic", "docqa", "--requests", 100)
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr through pipes{r.where()}")
    check(re.search(r"(?m)^\s*input tokens\s+\d+", r.out), f"no input tokens line{r.where()}")


@case("text report: a terminal on stderr does not disturb stdout")
def _():
    try:
        import pty
        master, slave = pty.openpty()
    except (ImportError, OSError) as e:
        raise Skip(f"no pseudo-terminal: {e}")
    args = ["--synthetic", "docqa", "--requests", "200", "--json"]
    try:
        proc = subprocess.Popen([BENCH] + args, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        slave = None
        tty = b""
        while True:  # drain the terminal so the bench never blocks on it
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the bench closed its end
                break
            if not chunk:
                break
            tty += chunk
        out = proc.stdout.read().decode()
        rc = proc.wait(timeout=120)
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    eq(rc, 0, f"exit status; terminal got {tty[:300]!r}")
    check(b"VERIFY" not in tty, f"terminal got {tty[:300]!r}")
    try:
        j = json.loads(out)
    except ValueError:
        raise Failure(f"stdout is not one JSON object: {out[:300]!r}")
    eq(strip_time(j), strip_time(run_ok(*args[:-1])), "JSON with a terminal on stderr")


@case("--requests past what a synthetic workload makes is refused at once; a long run shows "
      "its progress on a terminal from the start")
def _():
    for n in (2 ** 64 - 1, 2 ** 40 + 1):
        t = time.monotonic()
        r = bench("--requests", n, timeout=20)
        eq(r.rc, 2, f"exit status of --requests {n}{r.where()}")
        check(re.search(r"--requests: a synthetic workload makes at most 1099511627776 "
                        r"\(2\^40\) requests", r.err), f"stderr names the limit{r.where()}")
        check(time.monotonic() - t < 10, "refused at once")
    try:
        import pty
        master, slave = pty.openpty()
    except (ImportError, OSError) as e:
        raise Skip(f"no pseudo-terminal: {e}")
    # The largest count allowed: reading the workload through takes ages, and says so.
    proc = subprocess.Popen([BENCH, "--requests", str(2 ** 40)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    tty, counts, deadline = b"", [], time.monotonic() + 30
    try:
        while len(counts) < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                tty += os.read(master, 4096)
            counts = [int(c) for c in re.findall(rb"sizing the engine: (\d+) requests", tty)]
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
    check(len(counts) >= 3 and counts == sorted(counts) and counts[-1] > counts[0],
          f"a progress line that counts up on the terminal: {tty[-300:]!r}")


# ---- driver ----

def main():
    global BENCH, TMP
    BENCH = harness.program_arg("test_bench.py", "PATH-TO-KVTIER-BENCH")
    if BENCH is None:
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-test-") as tmp:
        TMP = tmp
        failed, xfailed = harness.run_cases(os.environ.get("BENCH_CASE"))  # names holding it
    return harness.summary(failed, t0, f" ({len(xfailed)} known bugs)")


if __name__ == "__main__":
    sys.exit(main())
