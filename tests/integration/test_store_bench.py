#!/usr/bin/env python3
"""End-to-end tests of kvtier-store-bench: usage: test_store_bench.py PATH-TO-KVTIER-STORE-BENCH

The program is a benchmark: its timings are never judged here. What is checked is what does
not depend on the machine's speed: the exit status, that the JSON report has every field with
a sane type, that byte counts follow from the pages and the page size (slots worked out here
from the documented 4 KiB rounding), that derived figures (GB/s, pages/s, ratios) follow from
the measured times, that the store counted exactly the I/Os asked for, that fio is used when
present and its absence is a note rather than a failure, that the work dir goes away unless
--keep, that bad arguments are refused with exit 2 and a message, and that --help describes the
options the program takes. fio is never required: the cases that need it skip without it.

Every case prints one line (PASS, FAIL or SKIP); the script exits 1 when any case FAILed.
"""
import os
import re
import shutil
import sys
import tempfile
import time

from harness import Skip, case, check, eq, has_keys, has_types, positive
import harness

PROG = None
WORK = None  # a private --dir for every run
# A small, quick configuration: 24 pages of 64 KiB written and read back in ops of 8, and an
# open test over 300 pages.
SMALL = ["--page-bytes", "64K", "--queue-depth", "4", "--pages", "24", "--batch", "8",
         "--reps", "1", "--open-pages", "300", "--open-reps", "2"]


def close(got, want, what):
    harness.close(got, want, what, abs_=1e-9)


PAGE_TOKENS = 16  # kvtier-store-bench's records carry 16 tokens, as the engine's do


def slot_of(page_bytes):
    """A slot of the data format (docs/formats.md): the page's whole 4 KiB blocks, then one
    or more blocks holding the rest of the page and its head (160 bytes + 4 per token)."""
    body = page_bytes // 4096 * 4096
    tail = page_bytes - body
    head_off = (tail + 7) // 8 * 8
    return body + (head_off + 160 + 4 * PAGE_TOKENS + 4095) // 4096 * 4096


# ---- running the program ----


def run(*args, dir_=True):
    if dir_:
        args = ["--dir", WORK] + list(args)
    return harness.Result("kvtier-store-bench", PROG, args, 120)


def run_json(*args):
    r = run(*args, "--json")
    eq(r.rc, 0, f"exit status{r.where()}")
    return r.json()


def bad_usage(*args, mention):
    r = run(*args)
    eq(r.rc, 2, f"exit status for bad usage{r.where()}")
    eq(r.out, "", f"stdout for bad usage{r.where()}")
    check(mention in r.err, f"stderr should mention {mention!r}{r.where()}")


def has_fio():
    return shutil.which("fio") is not None


def hugetlb_free():
    """Huge pages (hugetlb) free now: what fio's buffers can have with --iomem=shmhuge."""
    with open("/proc/meminfo") as f:
        m = re.search(r"^HugePages_Free:\s+(\d+)", f.read(), re.M)
    return int(m.group(1)) if m else 0


# ---- checking a report ----

CONFIG_KEYS = {"work_dir": str, "fs": str, "keep": bool, "reps": int, "batch": int,
               "read_order": str, "io": str, "disk_sync": str, "seed": int, "page_tokens": int,
               "fio": (str, type(None)), "fio_note": (str, type(None))}
TIMING_KEYS = ["median_s", "best_s", "worst_s", "median_gbps", "best_gbps"]


def check_timing(t, nbytes, what):
    has_keys(t, TIMING_KEYS, what)
    for k in ["median_s", "best_s", "worst_s"]:
        positive(t[k], f"{what}.{k}")
    check(t["best_s"] <= t["median_s"] <= t["worst_s"],
          f"{what}: best {t['best_s']}, median {t['median_s']}, worst {t['worst_s']} out of order")
    close(t["median_gbps"], nbytes / t["median_s"] / 1e9, f"{what}.median_gbps")
    close(t["best_gbps"], nbytes / t["best_s"] / 1e9, f"{what}.best_gbps")


def check_config(c):
    has_types(c, CONFIG_KEYS, "config")
    check(c["read_order"] in ("random", "seq"), f"config.read_order {c['read_order']!r}")
    check(c["io"] in ("auto", "uring", "psync"), f"config.io {c['io']!r}")
    check(c["disk_sync"] in ("durable", "relaxed"), f"config.disk_sync {c['disk_sync']!r}")
    # fio is either there (a version) or its absence explained (a note)
    check(c["fio"] is not None or c["fio_note"], "config: neither fio's version nor a note")


def check_point(p, c, fio_wanted):
    what = f"point {p.get('page_bytes')} B, qd {p.get('queue_depth')}"
    has_keys(p, ["page_bytes", "slot_bytes", "queue_depth", "pages", "bytes", "store", "fio",
                 "ratio", "target_ratio"], what)
    eq(p["slot_bytes"], slot_of(p["page_bytes"]), f"{what}: slot_bytes")
    eq(p["bytes"], p["pages"] * p["page_bytes"], f"{what}: bytes (pages x page_bytes)")
    eq(p["target_ratio"], 0.95, f"{what}: target_ratio")
    s = p["store"]
    has_keys(s, ["io", "direct", "fixed_buffers", "fixed_ios", "write", "read",
                 "write_pages_per_s", "read_pages_per_s"], f"{what}: store")
    check(s["io"] in ("io_uring", "psync"), f"{what}: store.io {s['io']!r}")
    check(isinstance(s["direct"], bool) and isinstance(s["fixed_buffers"], bool),
          f"{what}: store.direct / fixed_buffers not booleans")
    if s["io"] == "psync":
        eq(s["fixed_buffers"], False, f"{what}: fixed buffers without io_uring")
    # Every page written once (plus the warm-up page) and read once, all from the registered
    # buffers when they are in use.
    eq(s["fixed_ios"], 2 * p["pages"] + 1 if s["fixed_buffers"] else 0, f"{what}: fixed_ios")
    for k in ["write", "read"]:
        check_timing(s[k], p["bytes"], f"{what}: store.{k}")
        close(s[f"{k}_pages_per_s"], p["pages"] / s[k]["median_s"], f"{what}: {k}_pages_per_s")
    if not fio_wanted or p["fio"] is None:
        check(not fio_wanted, f"{what}: fio was present but did not run ({c['fio_note']})")
        eq(p["ratio"], None, f"{what}: ratio without fio")
        return
    f = p["fio"]
    has_keys(f, ["bytes", "fdatasync_every", "write", "write_fdatasync", "read"], f"{what}: fio")
    eq(f["bytes"], p["pages"] * p["slot_bytes"], f"{what}: fio.bytes (pages x slot)")
    eq(f["fdatasync_every"], c["batch"], f"{what}: fio.fdatasync_every")
    for k in ["write", "write_fdatasync", "read"]:
        check_timing(f[k], f["bytes"], f"{what}: fio.{k}")
    r = p["ratio"]
    has_keys(r, ["write", "write_vs_fdatasync", "read", "judged"], f"{what}: ratio")
    # Writes are judged like with like: a durable store against fio's durable write, a relaxed
    # one (no sync per batch) against fio's plain write, which syncs nothing.
    judged = "write" if c["disk_sync"] == "relaxed" else "write_vs_fdatasync"
    eq(r["judged"], [judged, "read"], f"{what}: ratio.judged")
    for k, fk, sk in [("write", "write", "write"), ("write_vs_fdatasync", "write_fdatasync",
                                                     "write"), ("read", "read", "read")]:
        positive(r[k], f"{what}: ratio.{k}")
        # store I/Os per second over fio's: fio's time over the store's for as many I/Os
        close(r[k], f[fk]["median_s"] / s[sk]["median_s"], f"{what}: ratio.{k}")


def check_open(o, pages, reps, page_bytes=4096):
    has_keys(o, ["pages", "page_bytes", "keys", "reps", "build_s", "build_pages_per_s", "cold",
                 "warm", "target_serve_s"], "open")
    eq((o["pages"], o["page_bytes"], o["keys"], o["reps"]), (pages, page_bytes, min(64, pages), reps),
       "open: pages, page_bytes, keys, reps")
    eq(o["target_serve_s"], 0.2, "open.target_serve_s")
    positive(o["build_s"], "open.build_s")
    close(o["build_pages_per_s"], pages / o["build_s"], "open.build_pages_per_s")
    for kind in ["cold", "warm"]:
        k = o[kind]
        has_keys(k, ["open", "serve", "first_read", "ready"], f"open.{kind}")
        for f in ["open", "serve", "first_read", "ready"]:
            check_timing(k[f], 0, f"open.{kind}.{f}")
        # Each open is timed from before dstore_open to each step in turn, so the medians keep
        # the order of the steps.
        steps = [k[f]["median_s"] for f in ["open", "serve", "first_read", "ready"]]
        check(steps == sorted(steps), f"open.{kind}: steps out of order: {steps}")


def check_report(j, fio_wanted, open_pages=None, open_reps=None):
    has_keys(j, ["config", "throughput", "open"], "report")
    check_config(j["config"])
    check(isinstance(j["throughput"], list), "throughput is not a list")
    for p in j["throughput"]:
        check_point(p, j["config"], fio_wanted)
    if open_pages:
        check_open(j["open"], open_pages, open_reps)
    else:
        eq(j["open"], None, "open without --open-pages")
    return j


# ---- the cases ----

@case("a small run: every field, consistent figures, fio used when present")
def _():
    j = check_report(run_json(*SMALL), has_fio(), 300, 2)
    c = j["config"]
    eq((c["reps"], c["batch"], c["read_order"], c["io"], c["disk_sync"], c["seed"]),
       (1, 8, "random", "auto", "durable", 1), "config")
    eq(len(j["throughput"]), 1, "points")
    p = j["throughput"][0]
    eq((p["page_bytes"], p["queue_depth"], p["pages"], p["bytes"]), (65536, 4, 24, 24 * 65536),
       "the point")
    check(not os.path.exists(c["work_dir"]), f"work dir {c['work_dir']} left behind")
    if not has_fio():
        raise Skip("fio is not installed: the report was checked without the comparison")


@case("lists: every page size x queue depth, pages from --bytes, slots of whole blocks")
def _():
    j = check_report(run_json("--page-bytes", "4K,6000", "--queue-depth", "1,2", "--bytes", "64K",
                              "--batch", "4", "--reps", "2", "--open-pages", 0, "--no-fio",
                              "--read-order", "seq", "--seed", 9), False)
    pts = [(p["page_bytes"], p["queue_depth"], p["pages"]) for p in j["throughput"]]
    eq(pts, [(4096, 1, 16), (4096, 2, 16), (6000, 1, 10), (6000, 2, 10)], "points in order")
    eq(j["throughput"][2]["slot_bytes"], 8192, "slot of a 6000-byte page")
    eq(j["throughput"][0]["slot_bytes"], 8192, "slot of a 4096-byte page: one block and its head")
    # Every slab I/O is whole blocks, so a 6000-byte page goes out as a 4096-byte page does.
    eq(j["throughput"][2]["store"]["direct"], j["throughput"][0]["store"]["direct"],
       "O_DIRECT with 6000-byte pages as with 4096-byte pages")
    eq((j["config"]["read_order"], j["config"]["seed"]), ("seq", 9), "config")
    check("--no-fio" in j["config"]["fio_note"], "the note should say --no-fio")


@case("--disk-sync relaxed: the store in relaxed mode, its write judged against fio's plain one")
def _():
    args = ["--page-bytes", "64K", "--queue-depth", "4", "--pages", "24", "--batch", "8",
            "--reps", "1", "--open-pages", 0, "--disk-sync", "relaxed"]
    j = check_report(run_json(*args), has_fio())
    eq(j["config"]["disk_sync"], "relaxed", "config.disk_sync")
    r = run(*args)
    eq(r.rc, 0, f"exit status{r.where()}")
    check(re.search(r"^  write \(relaxed\) +[0-9.]+ \(", r.out, re.M), f"no relaxed row{r.where()}")
    if not has_fio():
        raise Skip("fio is not installed: the report was checked without the comparison")
    check(re.search(r"^  write \(relaxed\) .*>= 0\.95 (met|MISSED)", r.out, re.M) and
          re.search(r"^    vs fio durable write ", r.out, re.M), f"relaxed rows{r.where()}")


@case("no fio: a note on how to install it, the store's figures, exit 0")
def _():
    r = run("--fio", "/nonexistent/fio", "--page-bytes", "8K", "--pages", 8, "--batch", 4,
            "--reps", 1, "--open-pages", 0, "--json")
    eq(r.rc, 0, f"exit status{r.where()}")
    j = check_report(r.json(), False)
    eq(j["config"]["fio"], None, "config.fio")
    check("apt-get install fio" in j["config"]["fio_note"], "the note should say how to install")
    check("apt-get install fio" in r.err, f"stderr should carry the note{r.where()}")
    r = run("--fio", "/nonexistent/fio", "--page-bytes", "8K", "--pages", 8, "--batch", 4,
            "--reps", 1, "--open-pages", 0)
    eq(r.rc, 0, f"exit status{r.where()}")
    check(re.search(r"^  note: .*apt-get install fio", r.out, re.M), f"text note{r.where()}")


@case("--buffers: the store's and fio's buffers on the same pages, and the report says which")
def _():
    small = ["--page-bytes", "64K", "--queue-depth", "4", "--pages", "8", "--batch", "4",
             "--reps", "1", "--open-pages", "0"]
    # 4k: both on 4 KiB pages, whatever the machine has
    j = run_json(*small, "--buffers", "4k")
    eq(j["config"]["buffers"], "4k", "config.buffers with --buffers 4k")
    eq(j["throughput"][0]["store"]["huge_page_bytes"], 0, "store buffers on huge pages with 4k")
    # auto: never reported as auto; without fio the store's as the engine's (huge); with fio
    # and no hugetlb pages to give it, 4 KiB pages for both
    j = run_json(*small, "--fio", "/nonexistent/fio")
    eq(j["config"]["buffers"], "huge", "config.buffers without fio")
    if has_fio() and hugetlb_free() == 0:
        j = run_json(*small)
        eq(j["config"]["buffers"], "4k", "config.buffers with fio and no hugetlb pages")
        r = run(*small, "--buffers", "huge")
        eq(r.rc, 1, f"--buffers huge with no hugetlb pages for fio{r.where()}")
        check("vm.nr_hugepages" in r.err and "--buffers 4k" in r.err,
              f"the error should say how to reserve them, or use 4k{r.where()}")
    elif has_fio():
        j = run_json(*small)
        eq(j["config"]["buffers"], "huge", "config.buffers with fio and hugetlb pages free")
    bad_usage("--buffers", "2m", mention="--buffers")


@case("--pages 0 --open-pages 0 measures nothing and says so in the shape")
def _():
    j = check_report(run_json("--pages", 0, "--open-pages", 0, "--no-fio"), False)
    eq(j["throughput"], [], "throughput")


@case("text report")
def _():
    r = run(*SMALL)
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr{r.where()}")
    want = [r"^kvtier-store-bench: work dir .*removed at the end",
            r"^page 64\.0 KiB \(slot 69632 B\), queue depth 4: 24 pages, 1\.5 MiB a run",
            r"^  store: (io_uring|psync), (O_DIRECT|buffered), ",
            r"^  write \(durable\) +[0-9.]+ \(",
            r"^  read \(random order\) +[0-9.]+ \(", r"^open: 300 pages of 4096 bytes, built in",
            r"^  cold +[0-9.]+ \(", r"^  warm +[0-9.]+ \(", r"^  serve <= 200 ms: cold "]
    if has_fio():
        want += [r"^    vs fio plain write ", r"^  write \(durable\) .*>= 0\.95 (met|MISSED)",
                 r"^    \$ \S*fio --name=kvtier-store-bench .*--ioengine=io_uring "
                 r".*--bs=69632 --iodepth=4 --rw=write --size=1671168 --fdatasync=0 ",
                 r"^    \$ \S*fio --name=kvtier-store-bench .*--ioengine=io_uring "
                 r".*--bs=69632 --iodepth=4 --rw=write --size=1671168 --fdatasync=8 "
                 r"--end_fsync=1 "]
    for w in want:
        check(re.search(w, r.out, re.M), f"text report lacks /{w}/{r.where()}")
    # Verdicts follow the figures printed beside them.
    for m in re.finditer(r"^  (?:write \(durable\)|read \(random order\)) .* ([0-9.]+) +>= 0\.95 "
                         r"(met|MISSED)$",
                         r.out, re.M):
        eq(m.group(2), "met" if float(m.group(1)) >= 0.95 else "MISSED", f"verdict of {m.group(0)}")
    serve = {k: float(v) for k, v in re.findall(r"^  (cold|warm) +[0-9.]+ \( *[0-9.]+\) +([0-9.]+)",
                                               r.out, re.M)}
    m = re.search(r"serve <= 200 ms: cold (met|MISSED), warm (met|MISSED)", r.out)
    check(m and len(serve) == 2, f"open table or verdict missing{r.where()}")
    eq((m.group(1), m.group(2)), tuple("met" if serve[k] <= 200 else "MISSED"
                                       for k in ["cold", "warm"]), "open verdicts")


@case("--open-page-bytes: the open test's dir of small pages serves what it wrote")
def _():
    j = run_json("--pages", 0, "--open-pages", 200, "--open-page-bytes", "2K", "--open-reps", 1,
                 "--no-fio")
    check_open(j["open"], 200, 1, page_bytes=2048)


@case("--keep keeps the work dir and the open test's data dir")
def _():
    j = run_json("--pages", 0, "--open-pages", 100, "--open-reps", 1, "--no-fio", "--keep")
    d = j["config"]["work_dir"]
    try:
        eq(j["config"]["keep"], True, "config.keep")
        check(os.path.isdir(os.path.join(d, "open", "index")), f"{d}/open/index is gone")
    finally:
        shutil.rmtree(d, ignore_errors=True)


BAD = [
    (["--redis-benchmark", "x"], "--redis-benchmark goes with --remote"),
    (["--remote", "http://x"], "--remote needs a redis:// URL"),
    (["--bogus"], "unknown option"),
    (["--pages"], "needs a value"),
    (["--pages", "abc"], "--pages"),
    (["--pages", "-3"], "--pages"),
    (["--page-bytes", "100"], "--page-bytes"),
    (["--page-bytes", "1G"], "--page-bytes"),
    (["--page-bytes", "4K,"], "--page-bytes"),
    (["--page-bytes", ","], "--page-bytes"),
    (["--page-bytes", "4Q"], "--page-bytes"),
    (["--page-bytes", ",".join(["4K"] * 9)], "--page-bytes"),
    (["--queue-depth", "0"], "--queue-depth"),
    (["--queue-depth", "5000"], "--queue-depth"),
    (["--bytes", "0"], "--bytes"),
    (["--batch", "0"], "--batch"),
    (["--reps", "0"], "--reps"),
    (["--open-reps", "0"], "--open-reps"),
    (["--open-pages", "x"], "--open-pages"),
    (["--open-page-bytes", "100"], "--open-page-bytes"),
    (["--open-page-bytes", "1G"], "--open-page-bytes"),
    (["--seed", "x"], "--seed"),
    (["--read-order", "backwards"], "--read-order"),
    (["--io", "fast"], "--io"),
    (["--disk-sync", "lazy"], "--disk-sync"),
    (["--dir", ""], "--dir"),
]


@case("bad arguments: exit 2 with a message, nothing measured")
def _():
    for args, mention in BAD:
        bad_usage(*args, mention=mention)
    r = run("--dir", "/nonexistent/dir/for/sure", "--no-fio", dir_=False)
    eq(r.rc, 1, f"exit status with a --dir that does not exist{r.where()}")
    check("/nonexistent/dir/for/sure" in r.err, f"stderr should name the dir{r.where()}")


@case("--help exits 0 and tells the truth about the options")
def _():
    r = run("--help", dir_=False)
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr{r.where()}")
    check(r.out.startswith("usage: kvtier-store-bench"), f"usage line{r.where()}")
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", r.out))
    wanted = {"--page-bytes", "--queue-depth", "--bytes", "--pages", "--batch", "--reps",
              "--read-order", "--io", "--disk-sync", "--fio", "--no-fio", "--open-pages",
              "--open-page-bytes", "--open-reps", "--remote", "--redis-benchmark",
              "--dir", "--keep", "--seed", "--json", "--help"}
    check(wanted <= documented, f"--help lacks {sorted(wanted - documented)}")
    for w in ["--ioengine=io_uring", "--direct=1", "apt-get install fio",
              "--open-pages 10000000 --open-page-bytes 2K"]:
        check(w in r.out, f"--help does not mention {w}")
    # fio's options named in --help are not ours; every other one is taken, and with a bad
    # value it complains about the value, never that the option is unknown.
    # ("--end" is how the pattern above reads fio's --end_fsync.)
    fio_opts = {"--name", "--filename", "--ioengine", "--direct", "--fixedbufs", "--fallocate",
                "--bs", "--iodepth", "--rw", "--size", "--fdatasync", "--end", "--output",
                "--output-format", "--iomem"}
    for opt in sorted(documented - fio_opts - {"--help", "--json", "--keep", "--no-fio",
                                               "--fio", "--dir"}):
        r = run(opt, "not-a-value")
        eq(r.rc, 2, f"{opt} with a bad value{r.where()}")
        check("unknown option" not in r.err, f"--help documents {opt}, which is unknown{r.where()}")
    r = run("--json", "--help", dir_=False)
    eq(r.rc, 0, f"exit status of --json --help{r.where()}")
    check(r.out.startswith("usage:"), f"--json --help should print the help{r.where()}")


# ---- --remote: the Redis store against redis-benchmark ----

# Small pages, but enough of them that redis-benchmark's run lasts more than its clock's
# millisecond.
REMOTE_SMALL = ["--page-bytes", "4K", "--pages", "4096", "--batch", "256", "--reps", "2"]
REMOTE_KEYS = {"remote": str, "cluster": bool, "masters": int, "page_bytes": int, "pages": int,
               "batch": int, "reps": int, "write_pages_s": (int, float),
               "read_pages_s": (int, float), "redis_benchmark": dict,
               "ratio_write": (int, float), "ratio_read": (int, float), "note": str}


def remote_json(url, *extra):
    r = run("--remote", url, *REMOTE_SMALL, *extra, "--json")
    if r.rc == 1 and "not built in" in r.err:
        raise Skip("kvtier-store-bench was built without the Redis store")
    eq(r.rc, 0, f"exit status{r.where()}")
    j = r.json()
    has_types(j, REMOTE_KEYS, "--remote report")
    eq((j["page_bytes"], j["pages"], j["batch"], j["reps"]), (4096, 4096, 256, 2), "config")
    positive(j["write_pages_s"], "store writes")
    positive(j["read_pages_s"], "store reads")
    return j


def check_ratios(j):
    b = j["redis_benchmark"]
    positive(b["set_rps"], "redis-benchmark SET")
    positive(b["get_rps"], "redis-benchmark GET")
    eq((b["pipeline"], b["clients"]), (16, j["masters"]), "redis-benchmark -P and -c")
    harness.close(j["ratio_write"], j["write_pages_s"] / b["set_rps"], "ratio_write", rel=1e-2)
    harness.close(j["ratio_read"], j["read_pages_s"] / b["get_rps"], "ratio_read", rel=1e-2)


@case("--remote: a server and a cluster against redis-benchmark, ratios from the figures")
def _():
    if not shutil.which("redis-benchmark"):
        raise Skip("redis-benchmark is not installed")
    tmp = tempfile.mkdtemp(prefix="test_store_bench_redis.")
    procs = []
    try:
        p, port = harness.start_redis(tmp)
        procs.append(p)
        j = remote_json(f"redis://127.0.0.1:{port}")
        eq((j["cluster"], j["masters"], j["note"]), (False, 1, ""), "standalone")
        check_ratios(j)
        cluster, ports = harness.start_redis_cluster(tmp)
        procs += cluster
        url = ",".join(f"redis://127.0.0.1:{q}" for q in ports)
        j = remote_json(url)
        eq((j["cluster"], j["masters"], j["note"], j["remote"]), (True, 3, "", url), "cluster")
        check_ratios(j)
        j = remote_json(url, "--redis-benchmark", os.path.join(tmp, "none"))
        check("redis-benchmark not found" in j["note"], f"note without it: {j['note']!r}")
        eq(j["ratio_write"], 0, "no ratio without redis-benchmark")
        t = run("--remote", url, *REMOTE_SMALL)
        eq(t.rc, 0, f"text report{t.where()}")
        check("a Redis Cluster, 3 masters" in t.out and "ratio" in t.out, f"text: {t.out!r}")
        p.kill()
        p.wait()
        r = run("--remote", f"redis://127.0.0.1:{port}", *REMOTE_SMALL)
        eq(r.rc, 1, f"a dead server{r.where()}")
    finally:
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@case("--remote rediss://: the store over TLS against redis-benchmark --tls; TLS usage errors")
def _():
    if not shutil.which("redis-benchmark"):
        raise Skip("redis-benchmark is not installed")
    tmp = tempfile.mkdtemp(prefix="test_store_bench_tls.")
    p = None
    try:
        p, port, tls_port, files = harness.start_redis_tls(tmp)
        url = f"rediss://127.0.0.1:{tls_port}"
        j = remote_json(url, "--remote-tls-ca", files["ca.crt"])
        eq((j["cluster"], j["masters"], j["note"]), (False, 1, ""), "over TLS")
        check_ratios(j)
        t = run("--remote", url, "--remote-tls-ca", files["ca.crt"], *REMOTE_SMALL)
        check("--tls" in t.out, f"the text names redis-benchmark's --tls: {t.out!r}")
        # Another CA: the store cannot connect, and says why.
        r = run("--remote", url, "--remote-tls-ca", files["other-ca.crt"], *REMOTE_SMALL)
        eq(r.rc, 1, f"a certificate that fails{r.where()}")
        check("pages written (page 0:" in r.err, f"the first failure named{r.where()}")
        r = run("--remote", f"redis://127.0.0.1:{port}", "--remote-tls-ca", files["ca.crt"],
                *REMOTE_SMALL)
        eq(r.rc, 2, f"--remote-tls-ca without rediss://{r.where()}")
        check("--remote-tls-ca needs a rediss://" in r.err, f"said so{r.where()}")
        r = run("--remote", url, "--remote-tls-ca", os.path.join(tmp, "none.pem"), *REMOTE_SMALL)
        eq(r.rc, 1, f"an unreadable CA file{r.where()}")
        check("none.pem" in r.err, f"the file named{r.where()}")
    finally:
        if p and p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@case("--remote-restart: the store serves again after its server restarts, within the backoff")
def _():
    if not shutil.which("redis-server"):
        raise Skip("redis-server is not installed")
    r = run("--remote-restart", "50,700", "--reps", "1", "--backoff-max-ms", "200", "--json")
    if r.rc == 1 and "not built in" in r.err:
        raise Skip("kvtier-store-bench was built without the Redis store")
    eq(r.rc, 0, f"exit status{r.where()}")
    j = r.json()
    eq((j["page_bytes"], j["batch"], j["backoff_max_ms"]), (65536, 8, 200), "config")
    eq([x["down_ms"] for x in j["samples"]], [50, 700], "a rep per down time")
    for x in j["samples"]:
        check(x["ping_ms"] > 0, f"the new server answered: {x}")
        check(0 < x["first_write_ms"] <= x["first_read_ms"], f"write, then read: {x}")
        check(x["failed_ops"] > 0 and x["failed_after_start"] <= x["failed_ops"],
              f"ops failed while the server was down: {x}")
        # The bound: the PING, then at most one backoff wait (200 ms); the store served by
        # then, a second of slack for a loaded machine's scheduling and the op's own time.
        check(x["bound_ms"] <= x["ping_ms"] + 200 + 1, f"the backoff's bound: {x}")
        check(x["first_write_ms"] <= x["bound_ms"] + 1000, f"served within the bound: {x}")
    t = run("--remote-restart", "50", "--reps", "1")
    eq(t.rc, 0, f"text report{t.where()}")
    check("first write ms" in t.out and "bound ms" in t.out, f"text: {t.out!r}")
    for args, pat in ((["--backoff-max-ms", "5"], "go with --remote-restart"),
                      (["--remote-restart", "50", "--remote", "redis://127.0.0.1:1"],
                       "no --remote"),
                      (["--remote-restart", "50", "--batch", "257"], "up to 256")):
        u = run(*args)
        eq(u.rc, 2, f"{args}{u.where()}")
        check(re.search(pat, u.err), f"{args}: {u.err!r}")


# ---- driver ----

def main():
    global PROG, WORK
    PROG = harness.program_arg("test_store_bench.py", "PATH-TO-KVTIER-STORE-BENCH")
    if PROG is None:
        return 2
    t0 = time.monotonic()
    WORK = tempfile.mkdtemp(prefix="test_store_bench.")
    try:
        failed, _ = harness.run_cases()
        left = os.listdir(WORK)
        if left:
            failed.append("cleanup")
            print(f"FAIL  cleanup: the runs left {left} in {WORK}", flush=True)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    return harness.summary(failed, t0)


if __name__ == "__main__":
    sys.exit(main())
