#!/usr/bin/env python3
"""The multimodal workload end to end: kvtier-bench --synthetic multimodal through the embedding
cache's tiers, and kvtier-ctl emb on the dirs it leaves.
usage: test_bench_mm.py PATH-TO-KVTIER-BENCH PATH-TO-KVTIER-CTL

What holds whatever the workload draws (the figures are checked against each other, never
against recorded output):
  * every image of a prompt is inside the cached prefix or needs an embedding; every one that
    needs one was served by a tier or encoded; tokens add up the same way;
  * every embedding served was verified, and none mismatched;
  * a tier the run does not have serves nothing; a run over a dir another run filled serves
    from the disk (a restart), and one sharing a redis-server with another from the remote;
  * kvtier-ctl emb lists as many embeddings as the runs stored, all ok, and --verify reads them
    whole; after their chunks are damaged, ctl says so (exit 1) and the bench reads them as
    misses (encoded again), never as bytes.
"""
import json
import os
import sys
import tempfile
import time

from harness import Failure, case, check, eq
import harness

BENCH = CTL = TMP = None
TIERS = ("device", "host", "disk", "remote")
SLOT_BYTES = 2304  # tiny geometry, page 16: 2 KiB + a head of 160 + 4 x 16 bytes, in 64s


def bench(*args, timeout=240):
    return harness.Result("kvtier-bench", BENCH, args, timeout)


def ctl(*args):
    return harness.Result("kvtier-ctl", CTL, args, 120)


def run_mm(*args, requests=400):
    # A store page to a page (the chunks whose slots these cases compute), and counts that
    # repeat.
    pin = ("--store-page-tokens", "16", "--deterministic") if "--dir" in args else ()
    r = bench("--synthetic", "multimodal", "--requests", requests, *args, *pin, "--json")
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr{r.where()}")
    j = r.json()
    eq(j["verify"]["mismatches"], 0, f"KV mismatches{r.where()}")
    m = j["multimodal"]
    adds_up(m)
    return m


def adds_up(m):
    served = sum(m["served"][t] for t in TIERS)
    served_tokens = sum(m["served_tokens"][t] for t in TIERS)
    eq(m["covered"] + m["needed"], m["images"], "covered + needed = images")
    eq(m["covered_tokens"] + m["needed_tokens"], m["image_tokens"], "their tokens")
    eq(served + m["encoded"], m["needed"], "served + encoded = needed")
    eq(served_tokens + m["encoded_tokens"], m["needed_tokens"], "their tokens")
    eq(m["verified"], served, "every embedding served was verified")
    eq(m["mismatches"], 0, "embedding mismatches")
    check(m["bytes_verified"] == served_tokens * m["emb_token_bytes"],
          f"bytes verified {m['bytes_verified']} for {served_tokens} tokens")
    want = served_tokens / m["needed_tokens"] if m["needed_tokens"] else 0
    check(abs(m["encoder_saved"] - want) < 1e-3, f"encoder_saved {m['encoder_saved']} != {want}")


@case("multimodal: device only: images repeat, the device serves some, the figures add up")
def _():
    m = run_mm()
    check(m["images"] > 300 and m["needed"] > 100, f"images of the workload: {m}")
    check(m["covered"] > 0, "some images inside a cached prefix (a chat's later turns)")
    check(m["served"]["device"] > 0, "the device served repeated images")
    eq([m["served"][t] for t in ("host", "disk", "remote")], [0, 0, 0], "no other tier")
    eq(m["stored"], 0, "nothing stored below")


@case("multimodal: --emb-host-bytes: the host serves what the device evicted")
def _():
    small = run_mm("--emb-device-bytes", "256K")
    m = run_mm("--emb-device-bytes", "256K", "--emb-host-bytes", "16M")
    check(m["served"]["host"] > 0, f"host served {m['served']}")
    check(m["evicted_device"] > 0, "the device evicted")
    check(m["encoded"] < small["encoded"], f"fewer encoded with a host ({m['encoded']} vs "
          f"{small['encoded']})")


@case("multimodal: the disk tier across a restart; kvtier-ctl emb lists and verifies it")
def _():
    d = os.path.join(TMP, "disk")
    tiers = ("--host-tokens", "262144", "--disk-tokens", "2000000", "--dir", d,
             "--emb-device-bytes", "256K")
    # One half of the workload, then the other half on a restarted engine (the same seed: KV
    # bytes are the seed's, and the dir's KV is served to the second run too).
    first = run_mm(*tiers, "--shard", "0/2")
    check(first["stored"] > 0 and first["stored"] <= first["encoded"], f"stored {first}")
    again = run_mm(*tiers, "--shard", "1/2")
    check(again["served"]["disk"] > 0, f"the other half after a restart: {again['served']}")
    none = run_mm(*tiers, "--shard", "1/2", "--emb-store", "none")
    eq(none["served"]["disk"], 0, "--emb-store none: the disk is not asked")
    r = ctl("emb", d, "--json")
    eq(r.rc, 0, f"ctl emb{r.where()}")
    j = r.json()
    eq(j["total"], first["stored"] + again["stored"] + none["stored"],
       "ctl emb: the embeddings stored")
    eq((j["ok"], j["damaged"], j["incomplete"], j["orphan_chunks"]), (j["total"], 0, 0, 0),
       "all ok")
    eq(j["verified"], False, "heads only without --verify")
    check(all(e["bytes"] % first["emb_token_bytes"] == 0 for e in j["embeddings"]),
          "an embedding is whole tokens")
    r = ctl("emb", d, "--verify")
    eq(r.rc, 0, f"ctl emb --verify{r.where()}")
    check(f"{j['total']} ok, 0 incomplete, 0 damaged" in r.out, f"text summary{r.where()}")
    r = ctl("stat", d, "--json")
    ns = [n for n in r.json()["namespaces"] if n["embeddings"]]
    eq(len(ns), 1, "one embeddings namespace in stat")
    eq(ns[0]["pages"], sum(e["chunks"] for e in j["embeddings"]), "its pages are the chunks")
    r = ctl("verify", d)
    eq(r.rc, 0, f"ctl verify reads the chunks as pages{r.where()}")


def flip(path, off):
    with open(path, "r+b") as f:
        f.seek(off)
        b = bytearray(f.read(8))
        f.seek(off)
        f.write(bytes(x ^ 0xA5 for x in b))


@case("multimodal: damaged embeddings on disk: ctl emb says so, the bench encodes them again")
def _():
    d = os.path.join(TMP, "damaged")
    tiers = ("--host-tokens", "262144", "--disk-tokens", "2000000", "--dir", d,
             "--emb-device-bytes", "256K")
    run_mm(*tiers, "--shard", "0/2")
    emb = ctl("emb", d, "--json").json()
    pages = {p["hash"]: p for p in ctl("ls", d, "--ns", "embeddings", "--json").json()["pages"]}
    for e in emb["embeddings"]:
        p = pages[e["first_chunk"]]
        flip(os.path.join(d, "slabs", "%04d.slab" % p["slab"]),
             4096 + p["slot"] * SLOT_BYTES + 200)
    r = ctl("emb", d, "--json")
    eq(r.rc, 1, f"ctl emb exits 1 on damage{r.where()}")
    j = r.json()
    eq(j["damaged"], emb["total"], "every first chunk damaged")
    check(all(e["why"] for e in j["embeddings"]), "each says why")
    m = run_mm(*tiers, "--shard", "1/2")
    eq(m["served"]["disk"], 0, "nothing damaged served")
    check(m["read_misses"] > 0, f"the damaged ones were read and missed: {m}")


@case("multimodal: two engines on one redis-server, a half of the workload each: the second is "
      "served from the remote")
def _():
    p, port = harness.start_redis(TMP)
    try:
        url = f"redis://127.0.0.1:{port}"
        tiers = ("--host-tokens", "65536", "--remote", url, "--emb-device-bytes", "256K")
        first = run_mm(*tiers, "--shard", "0/2")
        check(first["stored"] > 0, f"stored on the server: {first}")
        m = run_mm(*tiers, "--shard", "1/2")
        check(m["served"]["remote"] > 0, f"remote served {m['served']}")
        eq(m["served"]["disk"], 0, "no disk tier")
    finally:
        p.kill()
        p.wait()


@case("multimodal: bad usage is refused and named")
def _():
    for args, what in ((["--emb-host-bytes", "1M"], "--emb-* options need --synthetic"),
                       (["--synthetic", "multimodal", "--emb-store", "some"], "--emb-store"),
                       (["--synthetic", "multimodal", "--emb-device-bytes", "0"],
                        "--emb-device-bytes"),
                       (["--synthetic", "multimodal", "--emb-token-bytes", "x"],
                        "--emb-token-bytes")):
        r = bench(*args)
        eq(r.rc, 2, f"exit status{r.where()}")
        check(what in r.err, f"names {what}{r.where()}")
    r = ctl("emb")
    eq(r.rc, 2, f"ctl emb without a dir{r.where()}")
    r = ctl("emb", os.path.join(TMP, "no-such-dir"))
    eq(r.rc, 1, f"ctl emb on a missing dir{r.where()}")


def main():
    global BENCH, CTL, TMP
    if len(sys.argv) != 3 or not all(os.access(p, os.X_OK) for p in sys.argv[1:]):
        print("usage: test_bench_mm.py PATH-TO-KVTIER-BENCH PATH-TO-KVTIER-CTL", file=sys.stderr)
        return 2
    BENCH, CTL = (os.path.abspath(p) for p in sys.argv[1:])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvtier-bench-mm-") as tmp:
        TMP = tmp
        failed, _ = harness.run_cases()
    return harness.summary(failed, t0)


if __name__ == "__main__":
    sys.exit(main())
