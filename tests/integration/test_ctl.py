#!/usr/bin/env python3
"""End-to-end tests of kvtier-ctl.

usage: test_ctl.py KVTIER-CTL KVTIER-BENCH LIVE-ENGINE CTL-FIXTURE

Every case prints one line (PASS, FAIL or SKIP); the script exits 1 when any case FAILed.

The data dirs are written by the real engine: kvtier-bench (tiny geometry, page 16, default
namespace) and live_engine (the same geometry under another model id, three namespaces),
then damaged by ctl_fixture (index records, the meta record) and by this script (slab
bytes, slab length, the LMDB file). What kvtier-ctl reports is checked against what is
worked out here, independently of its code:
  * the fingerprint is SHA256(model id, NUL, 12 u32 LE: attention, layers, kv_heads,
    head_dim, v_head_dim, kv_lora_rank, qk_rope_head_dim, dtype_bytes, page_size, tp_rank,
    tp_size, hash version), as docs/design.md describes it;
  * a namespace's root is SHA256("kvtier/1" || fingerprint || namespace bytes) and a page's
    hash is SHA256(parent || its tokens as u32 LE), so every chain `show` prints is
    recomputed here;
  * detached pages, dangling pages and descendants are derived from the parent links
    `ls --json` lists, and the damage this script did.
The live cases run live_engine in the background and read its stats socket.
"""
import fcntl
import hashlib
import json
import os
import pty
import re
import select
import shlex
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

from harness import Failure, case, check, eq
import harness

CTL = BENCH = LIVE = FIXTURE = None
# kvtier-bench's dirs and servers as these tests count them: a page of the engine to a store
# page (not chosen by bytes), every op landed before the next request.
PINNED = ["--store-page-tokens", "16", "--deterministic"]
TMP = None
SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE_TOKENS = 16
PAGE_BYTES = 16 * 2 * 2 * 16 * 2  # page x (layers 2 x K,V x 16 elements x 2 bytes)
SLOT_BYTES = 2304  # the page, then its head, in 64-byte steps (docs/formats.md, format 3)
SLAB_HEAD = 4096  # a slab file starts with its head block


# ---- running kvtier-ctl ----


class Result(harness.Result):
    shown = 800

    def json(self):
        try:
            return json.loads(self.out)
        except ValueError as e:
            raise Failure(f"stdout is not one JSON document ({e}){self.where()}")


def ctl(*args, timeout=60):
    return Result("kvtier-ctl", CTL, args, timeout)


def ok(*args):
    r = ctl(*args)
    eq(r.rc, 0, f"exit status{r.where()}")
    return r


def ok_json(*args):
    r = ok(*args, "--json")
    eq(r.err, "", f"stderr{r.where()}")
    return r.json()


def fails(rc, pattern, *args):
    """The command exits rc with nothing on stdout and a message matching pattern."""
    r = ctl(*args)
    eq(r.rc, rc, f"exit status{r.where()}")
    eq(r.out, "", f"stdout of a failure{r.where()}")
    check(re.search(pattern, r.err, re.I), f"stderr should match /{pattern}/{r.where()}")
    return r


# ---- what the engine computes, recomputed here ----


def fingerprint(model_id, store_page_tokens=None):
    fields = [0, 2, 1, 16, 16, 0, 0, 2, PAGE_TOKENS, 0, 1, 1]  # tiny MHA, page 16, TP 1/1, v1
    if store_page_tokens:  # a store page of several pages follows
        fields.append(store_page_tokens)
    return hashlib.sha256(model_id.encode() + b"\0" +
                          struct.pack(f"<{len(fields)}I", *fields)).hexdigest()


def ns_root(fp_hex, ns=b""):
    return hashlib.sha256(b"kvtier/1" + bytes.fromhex(fp_hex) + ns).hexdigest()


def page_hash(parent_hex, tokens):
    return hashlib.sha256(bytes.fromhex(parent_hex) + struct.pack(f"<{len(tokens)}I",
                                                                  *tokens)).hexdigest()


def pages_of(d):
    """hash -> page, from ls --json."""
    j = ok_json("ls", d)
    eq(j["count"], len(j["pages"]), "ls count")
    return {p["hash"]: p for p in j["pages"]}


def descendants(pages, roots):
    """Every page below the given hashes (not themselves), by parent links."""
    kids = {}
    for h, p in pages.items():
        if "parent" in p:
            kids.setdefault(p["parent"], []).append(h)
    out, todo = set(), list(roots)
    while todo:
        for k in kids.get(todo.pop(), []):
            if k not in out:
                out.add(k)
                todo.append(k)
    return out - set(roots)


def file_digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def dir_digest(d):
    """What a read-only command must leave alone: the index data and every slab."""
    out = {"index": file_digest(os.path.join(d, "index", "data.mdb"))}
    for n in sorted(os.listdir(os.path.join(d, "slabs"))):
        out[n] = file_digest(os.path.join(d, "slabs", n))
    return out


def fixture(*args):
    r = subprocess.run([FIXTURE] + [str(a) for a in args], capture_output=True)
    eq(r.returncode, 0, f"ctl_fixture {' '.join(map(str, args[:1]))}: {r.stderr!r}")


# ---- damage done while kvtier-ctl runs, at a point gdb stops it ----

# Run inside gdb: stop at each call of plan["function"] (a store function kvtier-ctl calls);
# at the first, run plan["shell"] (damage the dir between the index load and that call); at
# each, when plan["fail_key"] is among the pages read, let the call finish and then make
# that page's result plan["errno"], as a read that failed would; with plan["return_errno"],
# let each call finish and make it return that. plan["once"]: fail the first call only.
GDB_DRIVER = r"""
import gdb, json, os, struct, subprocess
plan = json.load(open(os.environ["KVT_GDB_PLAN"]))


def fail_reads(key, err):
    inf = gdb.selected_inferior()
    n = int(gdb.parse_and_eval("n"))
    results = int(gdb.parse_and_eval("results"))
    hit = [i for i in range(n) if bytes(inf.read_memory(
        int(gdb.parse_and_eval(f"pages[{i}].key")), 32)) == key]
    if hit:
        gdb.execute("finish", to_string=True)
        for i in hit:
            inf.write_memory(results + 4 * i, struct.pack("<i", err))
    return len(hit)


gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.Breakpoint(plan["function"])
gdb.execute("run " + plan["run"], to_string=True)
hits = failed = 0
while gdb.selected_inferior().pid:
    hits += 1
    if hits == 1 and plan.get("shell"):
        subprocess.run(plan["shell"], check=True)
    if plan.get("fail_key") and not (plan.get("once") and failed):
        failed += fail_reads(bytes.fromhex(plan["fail_key"]), plan["errno"])
    if plan.get("return_errno") and not (plan.get("once") and failed):
        gdb.execute("finish", to_string=True)
        gdb.execute(f"set $rax = {plan['return_errno']}")
        failed += 1
    try:
        gdb.execute("continue", to_string=True)
    except gdb.error:  # it died (a signal): no exit code
        break
try:
    code = int(gdb.parse_and_eval("$_exitcode"))
except gdb.error:
    code = None
with open(plan["status"], "w") as f:
    json.dump({"exit": code, "hits": hits, "failed": failed}, f)
"""


class Debugged(Result):
    """kvtier-ctl args run under gdb with a plan for GDB_DRIVER; Skip where gdb is missing or
    may not trace."""

    def __init__(self, args, **plan):
        if not shutil.which("gdb"):
            raise harness.Skip("gdb is not installed")
        self.name = "kvtier-ctl (under gdb)"
        self.args = [str(a) for a in args]
        out, err, status = (os.path.join(TMP, f"gdb.{x}") for x in ("out", "err", "status"))
        for f in (out, err, status):
            if os.path.exists(f):
                os.remove(f)
        if "shell" in plan:
            plan["shell"] = [str(a) for a in plan["shell"]]
        plan.update(status=status, run=" ".join(map(shlex.quote, self.args)) +
                    f" > {shlex.quote(out)} 2> {shlex.quote(err)} < /dev/null")
        with open(os.path.join(TMP, "gdb-plan.json"), "w") as f:
            json.dump(plan, f)
        with open(os.path.join(TMP, "gdb-driver.py"), "w") as f:
            f.write(GDB_DRIVER)
        env = dict(os.environ, KVT_GDB_PLAN=os.path.join(TMP, "gdb-plan.json"))
        # LeakSanitizer cannot run under ptrace; the plain runs check for leaks.
        env["ASAN_OPTIONS"] = ":".join(x for x in (env.get("ASAN_OPTIONS"), "detect_leaks=0")
                                       if x)
        try:
            g = subprocess.run(["gdb", "-nx", "-batch", "-q", "-x",
                                os.path.join(TMP, "gdb-driver.py"), CTL], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise Failure(f"kvtier-ctl {' '.join(self.args)} under gdb ran past 120 s")
        gerr = g.stdout.decode(errors="replace") + g.stderr.decode(errors="replace")
        if not os.path.exists(status):
            if re.search(r"ptrace|not permitted|cannot (create|run) process", gerr, re.I):
                raise harness.Skip(f"gdb cannot trace here: {gerr.strip()[-200:]}")
            raise Failure(f"gdb driver failed: {gerr[-800:]}")
        with open(status) as f:
            st = json.load(f)
        self.hits, self.failed = st["hits"], st["failed"]
        self.rc = st["exit"]  # None: killed by a signal
        self.out = open(out, errors="replace").read()
        self.err = open(err, errors="replace").read()
        check(self.hits > 0, f"gdb never stopped at {plan['function']}: {gerr[-400:]}")


# ---- data dirs the engine wrote ----

_dirs = {}


def bench_dir():
    """A dir kvtier-bench wrote (default namespace, model id "tiny"); made once, copied."""
    if "bench" not in _dirs:
        d = os.path.join(TMP, "bench")
        r = subprocess.run([BENCH, "--host-tokens", "65536", "--disk-tokens", "300000", "--dir",
                            d, "--synthetic", "mixed", "--requests", "40", *PINNED, "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        check(r.returncode == 0, f"kvtier-bench failed: {r.stderr[-400:]!r}")
        _dirs["bench"] = d
    return _dirs["bench"]


def copy_of(d, name):
    dst = os.path.join(TMP, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(d, dst)
    return dst


class Engine:
    """live_engine in the background, with a stats socket and perhaps a data dir."""

    def __init__(self, name, disk_dir=None, namespaces=3, requests=None, pause_us=1000,
                 hybrid=None):
        self.sock = os.path.join(TMP, f"{name}.sock")
        args = [LIVE, "--socket", self.sock, "--namespaces", str(namespaces), "--pause-us",
                str(pause_us)]
        if disk_dir:
            args += ["--dir", disk_dir]
        if requests:
            args += ["--requests", str(requests)]
        if hybrid:
            args += ["--hybrid", hybrid]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.pending = b""
        self.wait_line("ready")
        if requests:
            self.wait_line(f"served {requests}")

    def wait_line(self, want, timeout=20):
        # Lines are split here from raw reads of the pipe: a buffered readline may take two
        # lines that came at once and leave the second where select() cannot see it.
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while time.monotonic() < deadline:
            while b"\n" in self.pending:
                line, self.pending = self.pending.split(b"\n", 1)
                if line.decode().strip() == want:
                    return
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk and self.proc.poll() is not None:
                    break
                self.pending += chunk
        self.stop()
        raise Failure(f"live_engine never printed {want!r}: {self.proc.stderr.read()[-400:]!r}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def live_dir():
    """A dir live_engine wrote: namespaces default, tenant-1, tenant-2 (model "live-engine")."""
    if "live" not in _dirs:
        d = os.path.join(TMP, "live")
        eng = Engine("live-writer", disk_dir=d, requests=400, pause_us=0)
        eq(eng.stop(), 0, "live_engine exit status")
        _dirs["live"] = d
    return _dirs["live"]


# ---- cases ----

COMMANDS = ["stat", "ls", "show", "tree", "verify", "gc", "evict", "recover", "export", "import",
            "top", "metrics"]


@case("--help lists every command; each command's --help names what it takes")
def _():
    r = ok("--help")
    for c in COMMANDS:
        check(re.search(rf"^\s+{c}\b", r.out, re.M), f"--help does not list {c}{r.where()}")
    for c in COMMANDS:
        h = ok(c, "--help")
        check(h.out.startswith(f"usage: kvtier-ctl {c}"), f"{c} --help usage line{h.where()}")
        check("--json" in h.out, f"{c} --help does not mention --json{h.where()}")
        eq(ok("help", c).out, h.out, f"help {c}")


VALUES = {"--live": "/nonexistent.sock", "--ns": "default", "--prefix": "abcd", "--sort": "time",
          "--limit": "3", "--to": "1M", "--capacity": "1M", "--count": "1", "--interval": "0.1"}


@case("--help tells the truth: every option it names is accepted, others are refused")
def _():
    for c in COMMANDS:
        text = ok(c, "--help").out
        opts = set(re.findall(r"^\s+(--[a-z-]+)", text, re.M)) - {"--help"}
        check(opts, f"{c} --help names no options")
        for o in sorted(opts):
            args = [c, o] + ([VALUES[o]] if o in VALUES else [])
            r = ctl(*args)
            check("unknown option" not in r.err, f"{c} --help names {o}, which is refused"
                  f"{r.where()}")
        r = ctl(c, "--frobnicate")
        eq(r.rc, 2, f"{c} --frobnicate exit status{r.where()}")
        check("unknown option" in r.err, f"{c} --frobnicate message{r.where()}")


@case("bad usage exits 2 with a message")
def _():
    d = bench_dir()
    for args, pat in [((), "missing command"), (("frob",), "unknown command"),
                      (("stat",), "data dir or --live"), (("stat", d, "--live", "x"), "one of"),
                      (("evict", d), "--to"), (("evict", d, "--to", "12X"), "size"),
                      (("export", d, d + "x"), "choose what"), (("ls", d, "--sort", "age"), "sort"),
                      (("ls", d, "--limit", "-1"), "integer"), (("show", d), "missing"),
                      (("show", d, "zz"), "hex"), (("tree", d, "--dot", "--json"), "one"),
                      (("export", d, "t", "--all", "--ns", "default"), "alone"),
                      (("top", "s", "--interval", "0"), "interval"), (("ls", d, "x"), "unexpected")]:
        fails(2, pat, *args)


@case("an argument of 100 KB is refused, and quoted by its start only")
def _():
    d, huge = bench_dir(), "x" * 100000
    for args, pat in [(("stat", huge), "a path longer than 4095 bytes"),
                      (("export", d, huge, "--all"), "a path longer than 4095 bytes"),
                      (("import", huge, d, "--all"), "a path longer than 4095 bytes"),
                      (("show", d, huge), "a page hash longer than 64 bytes"),
                      (("ls", d, "--prefix", huge), "--prefix: a page hash longer than 64"),
                      (("ls", d, "--ns", huge), "--ns: a namespace longer than 261 bytes"),
                      (("ls", d, "--ns=name:" + huge), "--ns: a namespace longer than 261"),
                      (("stat", "--live", huge), "a socket path longer than 107 bytes"),
                      (("top", huge), "a socket path longer than 107 bytes"),
                      (("metrics", huge), "a socket path longer than 107 bytes"),
                      (("ls", d, "--sort", huge), "--sort needs"), ((huge,), "unknown command"),
                      (("ls", d, "--" + huge), "unknown option")]:
        r = fails(2, pat, *args)
        check(len(r.err) < 400 and re.search(r"x{40}\.\.\.\n", r.err),
              f"the argument is cut{r.where()}")
    # the longest of each kind is taken: the command goes on and fails on what it names
    for args, pat in [(("stat", "/" + "x" * 4094), "File name too long"),
                      (("show", d, "0" * 64), "no page has this hash"),
                      (("ls", d, "--ns", "name:" + "x" * 256), "no page of it"),
                      (("stat", "--live", "/" + "x" * 106), "no such socket")]:
        r = fails(1, pat, *args)
        check(len(r.err) < 600, f"a path is quoted by its start{r.where()}")


@case("stat on a dir kvtier-bench wrote: fingerprint, geometry, counts, namespaces")
def _():
    d = bench_dir()
    j = ok_json("stat", d)
    fp = fingerprint("tiny")
    eq(j["fingerprint"], fp, "fingerprint")
    eq(j["format_version"], 3, "format_version")
    eq((j["page_tokens"], j["engine_page_tokens"], j["page_bytes"], j["slot_bytes"]),
       (PAGE_TOKENS, PAGE_TOKENS, PAGE_BYTES, SLOT_BYTES),
       "geometry")
    eq(j["capacity_slots"], 300000 // PAGE_TOKENS, "capacity_slots (300000 tokens of 16)")
    pages = pages_of(d)
    check(len(pages) > 1000, f"only {len(pages)} pages")
    eq(j["pages"], len(pages), "pages")
    eq(j["bytes"], len(pages) * PAGE_BYTES, "bytes")
    eq(j["free_slots"], j["capacity_slots"] - len(pages), "free_slots")
    eq(j["problems"]["total"], 0, "problems")
    eq([(n["root"], n["default"], n["pages"]) for n in j["namespaces"]],
       [(ns_root(fp), True, len(pages))], "namespaces")
    check(j["oldest_ns"] <= j["newest_ns"] <= j["last_access_ns"], "oldest/newest order")
    t = ok("stat", d).out
    for want in (fp, "version 3", "16 tokens", f"{len(pages)} ", "default"):
        check(want in t, f"stat text lacks {want!r}:\n{t}")


@case("a dir of format 2 (before 0.7): stat, verify and gc read it; export makes a format 3 copy")
def _():
    d = os.path.join(TMP, "format2")
    shutil.rmtree(d, ignore_errors=True)
    fixture("create", d, fingerprint("tiny"), 64 << 20, 2)
    fixture("grow", d, 64 << 20, 300, 7)
    j = ok_json("stat", d)
    eq((j["format_version"], j["slot_bytes"], j["pages"], j["capacity_slots"]),
       (2, 4096, 300, 16384), "stat of a format 2 dir: a block a page")
    t = ok("stat", d).out
    check("version 2" in t and f"kvtier-ctl export {d} NEW --all" in t,
          f"stat text names format 2 and how to pack it:\n{t}")
    v = ok_json("verify", d)
    eq((v["pages"], v["pages_read"], v["problems"], v["ok"]), (300, 300, 0, True), "verify")
    g = ok_json("gc", d)
    eq((g["pages"], g["problems"], g["dropped"], g["ok"]), (300, 0, 0, True), "gc")
    eq(ok_json("stat", d)["format_version"], 2, "the dir keeps its format")
    t = os.path.join(TMP, "format2-exp")
    shutil.rmtree(t, ignore_errors=True)
    ok("export", d, t, "--all")
    j = ok_json("stat", t)
    eq((j["format_version"], j["slot_bytes"], j["pages"]), (3, SLOT_BYTES, 300),
       "the export: format 3, packed slots, every page")
    v = ok_json("verify", t)
    eq((v["pages_read"], v["ok"]), (300, True), "verify of the export")


@case("a dir of store pages of 256 tokens: stat, show and verify check each key chained by 16")
def _():
    d = os.path.join(TMP, "grouped")
    r = subprocess.run([BENCH, "--host-tokens", "65536", "--disk-tokens", "300000", "--dir", d,
                        "--synthetic", "mixed", "--requests", "40", "--store-page-tokens", "256",
                        "--deterministic", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(r.returncode == 0, f"kvtier-bench failed: {r.stderr[-400:]!r}")
    j = ok_json("stat", d)
    fp = fingerprint("tiny", 256)
    eq((j["fingerprint"], j["page_tokens"], j["engine_page_tokens"], j["page_bytes"]),
       (fp, 256, PAGE_TOKENS, 16 * PAGE_BYTES),
       "a store page: 16 pages of the engine's, its fingerprint naming it")
    t = ok("stat", d).out
    check("a store page of 16 of the engine's pages of 16 tokens" in t, f"stat text:\n{t}")
    check(j["pages"] > 50, f"only {j['pages']} pages")
    eq(j["problems"]["total"], 0, "problems")
    pages = pages_of(d)
    deep = max(pages.values(), key=lambda p: p["prefix_tokens"])
    chain = ok_json("show", d, deep["hash"])["chain"]
    parent = ns_root(fp)
    for k, p in enumerate(chain):
        eq((p["parent"], len(p["tokens"])), (parent, 256), f"chain[{k}]")
        h = parent
        for at in range(0, 256, PAGE_TOKENS):  # named as the engine names its last page
            h = page_hash(h, p["tokens"][at:at + PAGE_TOKENS])
        eq(h, p["hash"], f"chain[{k}] hash")
        parent = p["hash"]
    j = ok_json("verify", d)
    eq((j["pages_read"], j["problems"], j["ok"]), (len(pages), 0, True), "verify")


@case("a dir with recurrent states: their own row, hung from the KV they follow, verify OK")
def _():
    d = os.path.join(TMP, "hybrid")
    r = subprocess.run([BENCH, "--geometry", "tiny,mamba_layers=2,conv_bytes=64,ssm_bytes=256",
                        "--host-tokens", "65536", "--disk-tokens", "300000", "--dir", d,
                        "--synthetic", "mixed", "--requests", "40", "--deterministic", "--json"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(r.returncode == 0, f"kvtier-bench failed: {r.stderr[-400:]!r}")
    stored = json.loads(r.stdout)["mamba"]["stored_states"]
    j = ok_json("stat", d)
    states = [n for n in j["namespaces"] if n["states"]]
    eq(len(states), 1, "one namespace of states")
    # A state of 2 x (64 + 256) bytes is one page; a state cached twice is stored once. A
    # state whose KV page never reached the disk (a backup the host had no room for) hangs
    # from nothing: detached, as such KV pages are, and no problem.
    check(0 < states[0]["pages"] <= stored, f"state pages {states[0]} for {stored} written")
    check(states[0]["detached"] < states[0]["pages"], f"most states hang from KV: {states[0]}")
    eq(j["problems"]["total"], 0, "problems")
    check(re.search(r"states +%d " % states[0]["pages"], ok("stat", d).out), "stat text row")
    v = ok_json("verify", d)
    eq(v["problems"], 0, "verify: problems")
    # ls names each by the prefix it follows: a checkpoint, on the grid of 64 tokens.
    pages = ok_json("ls", d, "--ns", "states")["pages"]
    eq(len(pages), states[0]["pages"], "ls --ns states")
    hung = [p["prefix_tokens"] for p in pages if p["state"] == "ok"]
    check(hung and all(t and t % 64 == 0 for t in hung), f"state pages follow checkpoints: {hung}")


WINDOW_TAG = b"kvtier/window/1"


def window_dir():
    """A dir a sliding-window model wrote (model id "tiny", 4 layers, every second one full):
    four prompts of 1024 tokens through a 2048-token device, written through the host to the
    disk with their window copies, the first repeated; made once, copied."""
    if "window" not in _dirs:
        d = os.path.join(TMP, "window")
        trace = os.path.join(TMP, "window.jsonl")
        with open(trace, "w") as f:
            for ids in ([1, 2], [3, 4], [5, 6], [7, 8], [1, 2]):
                f.write(json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 1,
                                    "hash_ids": ids}) + "\n")
        r = subprocess.run([BENCH, "--geometry", "tiny,layers=4,swa_window=32,full_every=2",
                            "--trace", trace, "--device-tokens", "2048", "--host-tokens",
                            "16384", "--disk-tokens", "65536", "--dir", d, "--deterministic",
                            "--json"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        check(r.returncode == 0, f"kvtier-bench failed: {r.stderr[-400:]!r}")
        _dirs["window"] = d
    return _dirs["window"]


@case("a dir with window copies: namespace windows, each hung from its page, verify and gc keep")
def _():
    d = copy_of(window_dir(), "window-gc")
    j = ok_json("stat", d)
    root = hashlib.sha256(WINDOW_TAG).hexdigest()
    wins = [n for n in j["namespaces"] if n["windows"]]
    eq([(n["root"], n["states"], n["default"]) for n in wins], [(root, False, False)],
       "one namespace of window copies")
    eq([n["windows"] for n in j["namespaces"] if n["default"]], [False], "default: no windows")
    eq((j["problems"]["total"], j["detached"]), (0, 0), "problems, detached")
    check(re.search(r"^windows +%d " % wins[0]["pages"], ok("stat", d).out, re.M),
          "stat text row")
    pages = pages_of(d)
    ls = ok_json("ls", d, "--ns", "windows")["pages"]
    eq(len(ls), wins[0]["pages"], "ls --ns windows")
    # A window (32 tokens: two pages) and a page before each cached prompt's end.
    check(4 * 3 <= len(ls) < 4 * 1024 // PAGE_TOKENS,
          f"window copies of the last pages of each prompt: {len(ls)}")
    for p in ls:
        # Its key and place are worked out here: SHA256(the page's hash || tag), the page's
        # own prefix.
        kv = pages.get(p["parent"])
        check(kv and kv["namespace"] == ns_root(j["fingerprint"]), f"{p['hash'][:12]}: page")
        eq(p["hash"], hashlib.sha256(bytes.fromhex(p["parent"]) + WINDOW_TAG).hexdigest(),
           f"{p['hash'][:12]}: key")
        eq((p["namespace"], p["state"], p["prefix_tokens"]), (root, "ok", kv["prefix_tokens"]),
           f"{p['hash'][:12]}: namespace, state, prefix")
    w = max(ls, key=lambda p: (p["prefix_tokens"], p["hash"]))
    t = ok("show", d, w["hash"][:12]).out
    for want in (r"^namespace +windows \(root %s\)$" % root,
                 r"^window copy +of page %s \(the parent\)" % w["parent"][:12],
                 r"^position +page 64 of its prefix: tokens 1008-1023$",
                 r"^chain from the namespace root: 65 pages, 1024 tokens$"):
        check(re.search(want, t, re.M), f"show text lacks /{want}/:\n{t[:900]}")
    s = ok_json("show", d, w["hash"])
    eq([c["hash"] for c in s["chain"][-2:]], [w["parent"], w["hash"]], "show: chain ends")
    eq(s["chain_complete"], True, "show: chain_complete")
    v = ok_json("verify", d)
    eq((v["ok"], v["problems"], v["detached"], v["pages_read"]), (True, 0, 0, len(pages)),
       "verify: every page read, none bad")
    eq((ok_json("gc", d)["dropped"], len(pages_of(d))), (0, len(pages)), "gc keeps them")
    # Once its page is gone a window copy is detached, as a page below it is: kept by gc,
    # dropped by gc --detached.
    below = descendants(pages, [w["parent"]])
    check(w["hash"] in below, "the window copy hangs below its page")
    fixture("delete", d, w["parent"])
    eq(ok_json("show", d, w["hash"])["page"]["state"], "detached", "its page gone: detached")
    eq(ok_json("gc", d)["dropped"], 0, "gc keeps a detached window copy")
    eq(ok_json("gc", d, "--detached")["dropped"], len(below), "gc --detached drops it")
    # A record under the windows' root whose key is not its parent's window key is corrupt.
    bad = "ab" * 32
    fixture("put", d, bad, ls[0]["parent"], root, 0)
    eq(ok_json("show", d, bad)["page"]["state"], "corrupt (hash chain)", "a made-up window key")


@case("stat, ls and tree on live_engine's dir: three namespaces, named by their bytes")
def _():
    d = live_dir()
    j = ok_json("stat", d)
    fp = fingerprint("live-engine")
    eq(j["fingerprint"], fp, "fingerprint")
    roots = {ns_root(fp): "default", ns_root(fp, b"tenant-1"): "tenant-1",
             ns_root(fp, b"tenant-2"): "tenant-2"}
    eq(sorted(n["root"] for n in j["namespaces"]), sorted(roots), "namespace roots")
    pages = pages_of(d)
    for n in j["namespaces"]:
        name = roots[n["root"]]
        mine = [p for p in pages.values() if p["namespace"] == n["root"]]
        eq(n["pages"], len(mine), f"pages of {name}")
        sel = "default" if name == "default" else f"name:{name}"
        eq(ok_json("ls", d, "--ns", sel)["count"], len(mine), f"ls --ns {sel}")
        eq(ok_json("ls", d, "--ns", n["root"][:10])["count"], len(mine), f"ls --ns by hex")
        tree = ok_json("tree", d, "--ns", sel)
        eq([t["root"] for t in tree["namespaces"]], [n["root"]], f"tree --ns {sel}")
    fails(1, "no page", "ls", d, "--ns", "name:tenant-9")
    # every page is listed in the namespace its chain starts from
    for h, p in pages.items():
        k = h
        while pages[k]["parent"] in pages:
            k = pages[k]["parent"]
        eq(p["namespace"], pages[k]["namespace"], f"{h[:12]}: namespace of its chain")
        check(pages[k]["parent"] in roots, f"{h[:12]}: the chain reaches a namespace root")


@case("ls sorts by time and size, reverses, limits, and --prefix is chain + subtree")
def _():
    d = bench_dir()
    pages = pages_of(d)
    by_time = ok_json("ls", d, "--sort", "time")["pages"]
    times = [p["last_access_ns"] for p in by_time]
    eq(times, sorted(times, reverse=True), "--sort time: newest access first")
    sizes = [p["prefix_tokens"] for p in ok_json("ls", d, "--sort", "size")["pages"]]
    eq(sizes, sorted(sizes, reverse=True), "--sort size: longest prefix first")
    created = [p["created_ns"] for p in ok_json("ls", d, "--sort", "created")["pages"]]
    eq(created, sorted(created, reverse=True), "--sort created")
    rev = ok_json("ls", d, "--sort", "time", "--reverse")["pages"]
    eq([p["hash"] for p in rev], [p["hash"] for p in by_time][::-1], "--reverse")
    eq(ok_json("ls", d, "--limit", "7")["count"], 7, "--limit")
    eq(list(pages), sorted(pages), "default order is by hash")
    # a page in the middle of a long chain with a branch below it
    mid = max((p for p in pages.values() if p["prefix_tokens"] == 10 * PAGE_TOKENS),
              key=lambda p: len(descendants(pages, [p["hash"]])))
    chain, h = set(), mid["hash"]
    while h in pages:
        chain.add(h)
        h = pages[h]["parent"]
    want = chain | descendants(pages, [mid["hash"]])
    got = {p["hash"] for p in ok_json("ls", d, "--prefix", mid["hash"][:12])["pages"]}
    eq(got, want, "ls --prefix: the chain to the root and everything below")
    lines = ok("ls", d, "--limit", "3").out.splitlines()
    eq(len(lines), 4, "ls text: a header and 3 lines")
    check(lines[0].split()[:2] == ["HASH", "NAMESPACE"], f"ls header: {lines[0]!r}")


@case("show: the record and its chain, every hash recomputed from parent and tokens")
def _():
    d = bench_dir()
    pages = pages_of(d)
    deep = max(pages.values(), key=lambda p: p["prefix_tokens"])
    j = ok_json("show", d, deep["hash"][:10])
    eq(j["page"]["hash"], deep["hash"], "page")
    eq(j["chain_complete"], True, "chain_complete")
    chain = j["chain"]
    eq(len(chain) * PAGE_TOKENS, deep["prefix_tokens"], "chain length")
    parent = ns_root(fingerprint("tiny"))
    for k, p in enumerate(chain):
        eq(p["parent"], parent, f"chain[{k}].parent")
        eq(len(p["tokens"]), PAGE_TOKENS, f"chain[{k}] tokens")
        eq(page_hash(p["parent"], p["tokens"]), p["hash"], f"chain[{k}] hash")
        parent = p["hash"]
    eq(chain[-1]["hash"], deep["hash"], "the chain ends at the page")
    eq(j["page"]["tokens"], chain[-1]["tokens"], "tokens")
    t = ok("show", d, deep["hash"]).out
    check(deep["hash"] in t and "chain from the namespace root" in t, f"show text:\n{t[:600]}")
    check(" ".join(map(str, j["page"]["tokens"])) in t, "show text lacks the tokens")
    # an ambiguous prefix: two hashes sharing their first 4 digits
    hashes = sorted(pages)
    pair = next((a for a, b in zip(hashes, hashes[1:]) if a[:4] == b[:4]), None)
    if pair:
        fails(1, "ambiguous", "show", d, pair[:4])
    fails(1, "no page", "show", d, "f" * 63 + "e" if "f" * 63 + "e" not in pages else "0" * 64)


@case("tree: text, JSON and Graphviz agree with the parent links")
def _():
    d = bench_dir()
    pages = pages_of(d)
    j = ok_json("tree", d)

    def walk(node, parent_last):
        first, last = node["first"], node["last"]
        eq(pages[first]["parent"], parent_last, f"node {first[:12]} hangs from its parent")
        n, h = 1, last
        while h != first:
            h = pages[h]["parent"]
            n += 1
        eq(n, node["pages"], f"node {first[:12]} pages")
        kids = [k for k, p in pages.items() if p["parent"] == last]
        eq(len(node["children"]), len(kids) if len(kids) != 1 else 0,
           f"node {first[:12]}: children (a single child would extend the node)")
        return n + sum(walk(c, last) for c in node["children"])

    total = sum(walk(c, ns["root"]) for ns in j["namespaces"] for c in ns["children"])
    eq(total, len(pages), "pages in the tree")
    eq(j["detached"], [], "detached")
    nodes = 0

    def count(n):
        return 1 + sum(count(c) for c in n["children"])
    nodes = sum(count(c) for ns in j["namespaces"] for c in ns["children"])
    dot = ok("tree", d, "--dot").out
    check(dot.startswith("digraph kvtier {") and dot.rstrip().endswith("}"), "dot framing")
    eq(dot.count("->"), nodes, "dot edges (one per node)")
    text = ok("tree", d).out.splitlines()
    check(text[0].startswith("namespace default"), f"tree text: {text[0]!r}")
    eq(sum(1 for ln in text if re.search(r"[|`]-- [0-9a-f]{12}", ln)), nodes, "tree text lines")


@case("verify on a clean dir: every page read, exit 0, nothing changed")
def _():
    d = copy_of(bench_dir(), "clean")
    before = dir_digest(d)
    j = ok_json("verify", d)
    n = len(pages_of(d))
    eq((j["pages"], j["pages_read"], j["problems"], j["ok"]), (n, n, 0, True), "verify")
    t = ok("verify", d).out
    check(t.rstrip().endswith("OK"), f"verify text: {t!r}")
    for args in (("stat", d), ("ls", d), ("tree", d), ("show", d, next(iter(pages_of(d))))):
        ok(*args)
    eq(dir_digest(d), before, "the dir after read-only commands")


def flip(d, slot, at=100):
    with open(os.path.join(d, "slabs", "0000.slab"), "r+b") as f:
        f.seek(SLAB_HEAD + slot * SLOT_BYTES + at)
        b = f.read(1)
        f.seek(SLAB_HEAD + slot * SLOT_BYTES + at)
        f.write(bytes([b[0] ^ 0xff]))


@case("verify finds flipped page bytes (pages below are detached); --repair drops them")
def _():
    d = copy_of(bench_dir(), "flipped")
    pages = pages_of(d)
    victim = max((p for p in pages.values() if p["prefix_tokens"] == 3 * PAGE_TOKENS),
                 key=lambda p: len(descendants(pages, [p["hash"]])))
    below = descendants(pages, [victim["hash"]])
    check(below, "the victim has pages below it")
    flip(d, victim["slot"])
    before = dir_digest(d)
    r = ctl("verify", d, "--json")
    eq(r.rc, 1, f"verify exit status{r.where()}")
    j = r.json()
    eq((j["corrupt"], j["detached"], j["dangling"], j["stale"], j["problems"]),
       (1, len(below), 0, 0, 1), "corrupt, detached, dangling, stale, problems")
    bad = {b["hash"]: b["problem"] for b in j["bad"]}
    eq(bad, {victim["hash"]: "corrupt (checksum)"}, "the problems: the victim alone")
    eq(j["pages_read"], len(pages), "detached pages are read too")
    eq(dir_digest(d), before, "verify without --repair changed the dir")
    r = ctl("verify", d)
    eq(r.rc, 1, f"verify text exit{r.where()}")
    check("PROBLEMS FOUND" in r.out and victim["hash"] in r.out, f"verify text{r.where()}")
    j = ok_json("verify", d, "--repair")
    eq((j["repaired"], j["dropped"], j["left"], j["ok"]), (True, 1, 0, True), "--repair")
    j = ok_json("verify", d)
    eq((j["pages"], j["problems"], j["detached"]), (len(pages) - 1, 0, len(below)),
       "verify after the repair: the pages below are kept")
    eq(ok_json("gc", d, "--detached")["dropped"], len(below), "gc --detached")
    eq(set(pages_of(d)), set(pages) - {victim["hash"]} - below, "what is left")


@case("a truncated slab: dangling pages; gc drops them, gc --detached what hangs below")
def _():
    d = copy_of(bench_dir(), "truncated")
    pages = pages_of(d)
    cut = sorted(p["slot"] for p in pages.values())[len(pages) // 2]
    os.truncate(os.path.join(d, "slabs", "0000.slab"), SLAB_HEAD + cut * SLOT_BYTES)
    dangling = {h for h, p in pages.items() if p["slot"] >= cut}
    below = descendants(pages, dangling) - dangling
    r = ctl("verify", d, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    j = r.json()
    eq((j["dangling"], j["detached"], j["corrupt"]), (len(dangling), len(below), 0),
       "dangling, detached, corrupt")
    eq(j["pages_read"], len(pages) - len(dangling), "pages read")
    st = ok_json("stat", d)
    eq((st["problems"]["dangling"], st["problems"]["total"], st["detached"]),
       (len(dangling), len(dangling), len(below)), "stat's problems")
    j = ok_json("gc", d, "--dry-run")
    eq((j["problems"], j["repaired"]), (len(dangling), False), "gc --dry-run")
    r = ok("gc", d, "--dry-run", "--detached")
    check(f"dry run: {len(dangling) + len(below)} pages would be dropped" in r.out,
          f"gc --dry-run --detached{r.where()}")
    eq(len(pages_of(d)), len(pages), "gc --dry-run dropped nothing")
    j = ok_json("gc", d)
    eq((j["dropped"], j["left"], j["detached"]), (len(dangling), 0, len(below)), "gc")
    j = ok_json("verify", d)
    eq((j["problems"], j["detached"], j["ok"]), (0, len(below), True), "verify after gc")
    eq(ok_json("gc", d, "--detached")["dropped"], len(below), "gc --detached")
    eq(ok_json("verify", d)["pages"], len(pages) - len(dangling) - len(below), "what is left")


@case("detached pages (a page above them not on this disk) are counted, kept, drawn apart")
def _():
    full = bench_dir()
    d = copy_of(full, "detached")
    pages = pages_of(d)
    # the disk copies of hot chain roots age out first on a big dir: take three first pages
    firsts = sorted((p for p in pages.values() if p["prefix_tokens"] == PAGE_TOKENS),
                    key=lambda p: (-len(descendants(pages, [p["hash"]])), p["hash"]))[:3]
    gone = {p["hash"] for p in firsts}
    below = descendants(pages, gone) - gone
    check(len(below) > 10, f"only {len(below)} pages below the three")
    for h in sorted(gone):
        fixture("delete", d, h)
    n = len(pages) - len(gone)
    j = ok_json("stat", d)
    eq((j["pages"], j["problems"]["total"], j["detached"]), (n, 0, len(below)), "stat")
    eq((j["namespaces"][0]["detached"], j["namespaces"][0]["good_pages"]),
       (len(below), n - len(below)), "stat: the namespace's detached and served pages")
    t = ok("stat", d).out
    check("problems      none found" in t and f"detached      {len(below)} pages: a page "
          "above them is not on this disk; an engine serves them again" in t, f"stat text:\n{t}")
    j = ok_json("verify", d)
    eq((j["ok"], j["problems"], j["detached"], j["pages_read"], j["bad"]),
       (True, 0, len(below), n, []), "verify: no problem, every page read")
    t = ok("verify", d).out
    check(t.endswith("OK\n") and f"\ndetached  {len(below)} (not a problem" in t, f"verify:\n{t}")
    states = {h: p["state"] for h, p in pages_of(d).items()}
    eq({h for h, st in states.items() if st == "detached"}, below, "ls: the detached pages")
    eq({st for h, st in states.items() if h not in below}, {"ok"}, "ls: the others")
    some = min(below)
    eq(ok_json("show", d, some)["page"]["state"], "detached", "show: state")
    check(re.search(r"^state\s+detached$", ok("show", d, some).out, re.M), "show text: state")
    tree = ok_json("tree", d)
    tops = {h for h in below if pages[h]["parent"] in gone}
    eq({o["first"] for o in tree["detached"]}, tops, "tree: detached subtrees start below")
    t = ok("tree", d).out
    check(f"\ndetached (parent not on disk): {len(tops)} subtrees\n" in t, f"tree text:\n{t[-600:]}")
    check('detached [label="detached\\n(parent not on disk)"' in ok("tree", d, "--dot").out,
          "tree --dot")
    j = ok_json("gc", d)
    eq((j["dropped"], j["detached"], j["problems"], j["ok"]), (0, len(below), 0, True),
       "gc keeps detached pages")
    eq(len(pages_of(d)), n, "pages after gc")
    # "orphaned" is gone from what kvtier-ctl says
    for args in (("stat", d), ("verify", d), ("tree", d), ("tree", d, "--dot"), ("ls", d),
                 ("gc", d, "--dry-run"), ("stat", d, "--json"), ("verify", d, "--json"),
                 ("tree", d, "--json"), ("ls", d, "--json"), ("show", d, some), ("--help",)):
        r = ok(*args)
        check("orphan" not in r.out.lower(), f"'orphaned' is said{r.where()}")
    for c in COMMANDS:
        check("orphan" not in ok(c, "--help").out.lower(), f"{c} --help says 'orphaned'")
    # export --all copies them too, parents before children
    t = os.path.join(TMP, "detached-exp")
    j = ok_json("export", d, t, "--all")
    eq((j["copied"], j["skipped"]), (n, 0), "export --all")
    eq(ok_json("verify", t)["detached"], len(below), "the export's detached pages")
    # once the pages above are stored again, every page is served again
    for h in sorted(gone):
        j = ok_json("import", d, full, "--prefix", h)
        eq(j["copied"], 1, f"import --prefix {h[:12]}: the page itself")
    j = ok_json("verify", d)
    eq((j["pages"], j["detached"], j["ok"]), (len(pages), 0, True), "verify after the import")
    # gc --detached drops them
    d = copy_of(full, "detached-gc")
    for h in sorted(gone):
        fixture("delete", d, h)
    r = ok("gc", d, "--detached", "--dry-run")
    check(f"dry run: {len(below)} pages would be dropped" in r.out, f"gc --dry-run{r.where()}")
    j = ok_json("gc", d, "--detached")
    eq((j["dropped"], j["left"], j["ok"]), (len(below), 0, True), "gc --detached")
    eq(set(pages_of(d)), set(pages) - gone - below, "what gc --detached left")


@case("records damaged in the index: junk, a slot outside the slabs, a deleted parent")
def _():
    d = copy_of(bench_dir(), "records")
    pages = pages_of(d)
    by_depth = sorted(pages.values(), key=lambda p: (p["prefix_tokens"], p["hash"]))
    junk, moved, deleted = (max((p for p in by_depth if p["prefix_tokens"] == k * PAGE_TOKENS),
                                key=lambda p: len(descendants(pages, [p["hash"]])))
                            for k in (2, 5, 8))
    for args in (("junk", d, junk["hash"]), ("move", d, moved["hash"], "7", "0"),
                 ("delete", d, deleted["hash"])):
        r = subprocess.run([FIXTURE] + list(args), capture_output=True)
        eq(r.returncode, 0, f"ctl_fixture {args[0]}: {r.stderr!r}")
    below = descendants(pages, [junk["hash"], moved["hash"], deleted["hash"]])
    below -= {junk["hash"], moved["hash"], deleted["hash"]}
    r = ctl("verify", d, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    j = r.json()
    eq((j["corrupt"], j["dangling"], j["detached"], j["problems"]), (1, 1, len(below), 2),
       "corrupt, dangling, detached, problems")
    bad = {b["hash"]: b["problem"] for b in j["bad"]}
    eq(bad[junk["hash"]], "corrupt record", "junk record")
    eq(bad[moved["hash"]], "dangling", "moved record")
    check(deleted["hash"] not in bad and deleted["hash"] not in pages_of(d), "deleted page")
    eq(ok_json("show", d, junk["hash"])["page"]["state"], "corrupt record", "show a junk record")
    check("corrupt record" in ok("ls", d).out, "ls marks the junk record")
    # below the deleted page, and below the junk record (which names no parent of its own)
    eq(len(ok_json("tree", d)["detached"]), 2, "tree: detached subtrees")
    j = ok_json("gc", d)
    eq((j["dropped"], j["left"]), (2, 0), "gc")
    eq(ok_json("verify", d)["ok"], True, "verify after gc")
    eq(ok_json("gc", d, "--detached")["dropped"], len(below), "gc --detached")


@case("an entry of the wrong kind in a dir is named with its path, never a bare errno")
def _():
    src = bench_dir()
    d = copy_of(src, "wrong-slabs")
    shutil.rmtree(os.path.join(d, "slabs"))
    open(os.path.join(d, "slabs"), "w").close()
    name = re.escape(d)
    for cmd in (("stat",), ("evict", "--to", "0")):
        fails(1, rf"^kvtier-ctl: {name}: cannot open: {name}/slabs is a regular file, where "
              rf"kvtier keeps its slab files \(a directory\) \(Not a directory\): remove it\n$",
              cmd[0], d, *cmd[1:])
    d = copy_of(src, "wrong-lock")
    os.remove(os.path.join(d, "lock"))
    os.makedirs(os.path.join(d, "lock", "keep"))
    name = re.escape(d)
    fails(1, rf"^kvtier-ctl: {name}: cannot open: {name}/lock is a directory, where kvtier "
          rf"keeps the lock file a writer holds \(Directory not empty\): remove it\n$",
          "evict", d, "--to", "0")
    eq(ok_json("stat", d)["pages"], len(pages_of(src)), "a reader takes no lock: stat works")


@case("clear errors: not a dir, not kvtier's, a newer format, a corrupt index")
def _():
    fails(1, "no such data dir", "stat", os.path.join(TMP, "missing"))
    f = os.path.join(TMP, "a-file")
    open(f, "w").close()
    fails(1, "not a directory", "stat", f)
    foreign = os.path.join(TMP, "foreign")
    os.makedirs(foreign, exist_ok=True)
    with open(os.path.join(foreign, "notes.txt"), "w") as fh:
        fh.write("mine\n")
    for cmd in (("stat",), ("verify",), ("gc",), ("evict", "--to", "0")):
        fails(1, "not a kvtier data dir", *cmd[:1], foreign, *cmd[1:])
    eq(sorted(os.listdir(foreign)), ["notes.txt"], "a foreign dir after kvtier-ctl")
    empty = os.path.join(TMP, "empty")
    os.makedirs(empty, exist_ok=True)
    fails(1, "not a kvtier data dir", "gc", empty)
    eq(os.listdir(empty), [], "an empty dir after gc")
    newer = copy_of(bench_dir(), "newer")
    r = subprocess.run([FIXTURE, "version", newer, "4"], capture_output=True)
    eq(r.returncode, 0, f"ctl_fixture version: {r.stderr!r}")
    for cmd in ("stat", "ls", "verify", "gc"):
        fails(1, r"version 4 is newer", cmd, newer)
    bad = copy_of(bench_dir(), "badindex")
    with open(os.path.join(bad, "index", "data.mdb"), "r+b") as fh:
        fh.write(os.urandom(16384))
    for cmd in ("stat", "verify", "gc --dry-run"):
        fails(1, rf"{re.escape(bad)}/index/data.mdb is damaged", *cmd.split(), bad)


LMDB_PAGE = 4096


def damage_index(d, how):
    """Damage d's index one way: LMDB's file (its meta pages, its B-tree), the meta record or
    a database's name inside a sound file, or the whole index gone."""
    path = os.path.join(d, "index", "data.mdb")
    size = os.path.getsize(path)
    pages = size // LMDB_PAGE
    with open(path, "r+b") as f:
        if how == "meta pages":  # LMDB's two meta pages
            f.write(os.urandom(2 * LMDB_PAGE))
        elif how == "zeroed":  # the first half of the B-tree's pages
            f.seek(2 * LMDB_PAGE)
            f.write(bytes((pages // 2) * LMDB_PAGE))
        elif how == "garbled":  # a byte of every page's header
            for i in range(2, pages):
                f.seek(i * LMDB_PAGE + 40)
                b = f.read(1)
                f.seek(i * LMDB_PAGE + 40)
                f.write(bytes([b[0] ^ 0x55]))
        elif how == "swapped":  # two runs of pages trade places
            f.seek(2 * LMDB_PAGE)
            a, b = f.read(8 * LMDB_PAGE), f.read(8 * LMDB_PAGE)
            f.seek(2 * LMDB_PAGE)
            f.write(b + a)
        elif how == "cut":  # to half, whole pages
            f.truncate(pages // 2 * LMDB_PAGE)
        elif how == "cut mid-page":
            f.truncate(pages // 2 * LMDB_PAGE - 100)
        elif how in ("meta magic", "db name"):  # every copy, the live one and freed ones
            old = b"KVTIERDS" if how == "meta magic" else b"pages"
            data = f.read()
            check(old in data, f"{old!r} in {path}")
            f.seek(0)
            f.write(data.replace(old, bytes([old[0] ^ 1]) + old[1:]))
    if how == "meta record":
        fixture("metajunk", d)
    elif how == "lost":
        shutil.rmtree(os.path.join(d, "index"))


DAMAGES = {"meta pages": "its LMDB structure failed the check kvtier runs on it",
           "zeroed": "its LMDB structure failed the check kvtier runs on it",
           "garbled": "its LMDB structure failed the check kvtier runs on it",
           "swapped": "its LMDB structure failed the check kvtier runs on it",
           "cut": "its LMDB structure failed the check kvtier runs on it",
           "cut mid-page": r"\d+ bytes: not whole LMDB pages, cut short",
           "meta record": "its meta record fails its checks",
           "meta magic": "its meta record fails its checks",
           "db name": "kvtier's databases or its meta record are missing from it",
           "lost": "it is missing"}


def damaged_message(d, how):
    """What read-only commands say of d with its index damaged how."""
    name = re.escape(d)
    return (rf"^kvtier-ctl: {name}: {name}/index/data.mdb is (damaged|lost) \({DAMAGES[how]}\); "
            rf"the pages are in {name}/slabs, each with a head that names it: run `kvtier-ctl "
            rf"recover {name}` to rebuild the index from them \(an engine opening the dir does "
            rf"the same\)\n$")


@case("a damaged index: read-only commands say what is wrong, name the file and the repair")
def _():
    src = bench_dir()
    for how in DAMAGES:
        d = copy_of(src, "damaged-" + how.replace(" ", "-"))
        damage_index(d, how)
        before = sorted(os.listdir(d))
        fails(1, damaged_message(d, how), "stat", d)
        r = fails(1, damaged_message(d, how), "stat", d, "--json")
        if how == "garbled":
            t = os.path.join(TMP, "damaged-export")
            for args in (("ls", d), ("show", d, "abcd"), ("tree", d), ("verify", d),
                         ("verify", d, "--json"), ("gc", d, "--dry-run"),
                         ("export", d, t, "--all")):
                fails(1, damaged_message(d, how), *args)
            check(not os.path.exists(t), "export made its target from a damaged source")
        eq(sorted(os.listdir(d)), before, f"{how}: the dir after read-only commands")


@case("recover: an index damaged any way is rebuilt from the slabs; every page reads back")
def _():
    src = bench_dir()
    pages = set(pages_of(src))
    n, slots = len(pages), ok_json("stat", src)["backed_slots"]
    for how in DAMAGES:
        d = copy_of(src, "recover-" + how.replace(" ", "-"))
        damage_index(d, how)
        fails(1, damaged_message(d, how), "stat", d)
        j = ok_json("recover", d)
        aside = None if how == "lost" else os.path.join(d, "index.damaged")
        eq((j["dir"], j["slots_scanned"], j["pages_recovered"], j["pages"], j["index_errors"],
            j["set_aside"]), (d, slots, n, n, 0, aside), f"recover ({how})")
        check(aside is None or os.path.exists(os.path.join(aside, "data.mdb")), "set aside")
        j = ok_json("verify", d)
        eq((j["pages"], j["pages_read"], j["problems"], j["ok"]), (n, n, 0, True),
           f"verify after recover ({how})")
        eq(set(pages_of(d)), pages, f"the pages after recover ({how})")
    # text, and again on the rebuilt dir: the last index set aside replaces the one before
    r = ok("recover", d)
    eq(r.out, f"{d}: {slots} slots scanned, {n} pages recovered from their heads; the index "
       f"holds {n} pages\nthe old index was set aside as {d}/index.damaged (kept for "
       "inspection only; the next recovery replaces it)\n", f"recover text{r.where()}")
    eq(ok_json("verify", d)["pages_read"], n, "verify after a second recover")
    fails(1, "no such data dir", "recover", os.path.join(TMP, "recover-missing"))
    fails(1, "not a kvtier data dir", "recover", TMP)


@case("recover is refused beside a running engine")
def _():
    d = os.path.join(TMP, "recover-busy")
    eng = Engine("recover-busy", disk_dir=d, requests=20)
    try:
        fails(1, r"locked: a running engine has the dir open; stop it first", "recover", d)
        check(not os.path.exists(os.path.join(d, "index.damaged")), "nothing set aside")
    finally:
        eq(eng.stop(), 0, "live_engine exit status")
    eq(ok_json("verify", d)["ok"], True, "the dir after")


@case("a damaged index: gc, evict, verify --repair and import rebuild it by their open")
def _():
    src = bench_dir()
    n = len(pages_of(src))
    note = (r"^kvtier-ctl: note: {d}: the index was damaged: set aside as {d}/index.damaged and "
            r"rebuilt from the slabs with {n} pages\n$")
    for how, args in (("meta pages", ("gc",)), ("garbled", ("evict", "--to", "1T")),
                      ("zeroed", ("verify", "--repair")), ("cut", ("import", src, "--all")),
                      ("meta record", ("evict", "--to", "1T")), ("meta magic", ("gc",)),
                      ("db name", ("evict", "--to", "1T"))):
        d = copy_of(src, "heal-" + how.replace(" ", "-"))
        damage_index(d, how)
        r = ctl(args[0], d, *args[1:], "--json")
        eq(r.rc, 0, f"{args[0]} on an index damaged ({how}){r.where()}")
        check(re.search(note.format(d=re.escape(d), n=n), r.err), f"the note{r.where()}")
        r.json()
        check(os.path.isdir(os.path.join(d, "index.damaged")), "index.damaged")
        j = ok_json("verify", d)
        eq((j["pages"], j["pages_read"], j["ok"]), (n, n, True), f"verify after {args[0]}")
        eq(set(pages_of(d)), set(pages_of(src)), f"the pages after {args[0]}")
    # no index at all: the target of an import is made from its slabs again
    d = copy_of(src, "heal-lost")
    damage_index(d, "lost")
    r = ctl("import", d, src, "--all")
    eq(r.rc, 0, f"import into a dir whose index is lost{r.where()}")
    eq(r.err, f"kvtier-ctl: note: {d}: the index was missing: rebuilt from the slabs with {n} "
       "pages\n", f"the note{r.where()}")
    check(f"{n} already there" in r.out, f"the pages were found there{r.where()}")


def other_dir(name, *args):
    """A dir kvtier-bench wrote beside bench_dir(), with args of its own (another page size)."""
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    page = args[args.index("--page-size") + 1] if "--page-size" in args else "16"
    r = subprocess.run([BENCH, "--host-tokens", "65536", "--disk-tokens", "300000", "--dir", d,
                        "--synthetic", "mixed", "--requests", "10", "--store-page-tokens", page,
                        "--deterministic", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    check(r.returncode == 0, f"kvtier-bench failed: {r.stderr[-400:]!r}")
    return d


@case("an index copied from another dir: read-only commands name it and recover; verify "
      "--repair and the engine rebuild it, and every page comes back")
def _():
    src = bench_dir()
    pages = set(pages_of(src))
    for how, args in (("page64", ("--page-size", "64")), ("sibling", ("--seed", "7"))):
        other = other_dir("foreign-" + how, *args)
        d = copy_of(src, "foreign-index-" + how)
        shutil.rmtree(os.path.join(d, "index"))
        shutil.copytree(os.path.join(other, "index"), os.path.join(d, "index"))
        name = re.escape(d)
        message = (rf"^kvtier-ctl: {name}: {name}/index/data.mdb is not this dir's \(it is "
                   rf"another dir's index: its meta record names pages of "
                   rf"{64 if how == 'page64' else 16} tokens, .*and no slab file here agrees "
                   rf"\(they hold pages of 16 tokens, 2.0 KiB; .*\)\); the pages are in "
                   rf"{name}/slabs.*run `kvtier-ctl recover {name}`")
        before = sorted(os.listdir(d))
        for cmd in (("stat",), ("verify",), ("ls",), ("gc", "--dry-run")):
            fails(1, message, cmd[0], d, *cmd[1:])
        eq(sorted(os.listdir(d)), before, f"{how}: the dir after read-only commands")
        if how == "sibling":  # an engine's open rebuilds it as a writer's does
            e = copy_of(d, "foreign-engine")
            r = subprocess.run([BENCH, "--host-tokens", "65536", "--disk-tokens", "300000",
                                "--dir", e, "--synthetic", "mixed", "--requests", "5", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
            eq(r.returncode, 0, f"kvtier-bench on a foreign index: {r.stderr[-400:]!r}")
            eq(json.loads(r.stdout)["disk_errors"], 0, "disk errors")
            check(os.path.isdir(os.path.join(e, "index.damaged")), "index.damaged")
            check(pages <= set(pages_of(e)), "the engine's open kept every page")
        r = ctl("verify", d, "--repair", "--json")
        eq(r.rc, 0, f"verify --repair{r.where()}")
        check(re.search(rf"^kvtier-ctl: note: {name}: the index was another dir's \(its meta "
                        rf"record agreed with no slab file's head\): set aside as "
                        rf"{name}/index.damaged and rebuilt from the slabs with {len(pages)} "
                        rf"pages\n$", r.err), f"the note{r.where()}")
        j = r.json()
        eq((j["pages"], j["pages_read"], j["problems"], j["ok"]), (len(pages), len(pages), 0,
           True), f"verify --repair ({how})")
        eq(set(pages_of(d)), pages, f"the pages after verify --repair ({how})")


@case("a FIFO or a link in place of the lock file neither hangs kvtier-ctl nor says locked")
def _():
    d = copy_of(bench_dir(), "lock-fifo")
    n = len(pages_of(d))
    lock = os.path.join(d, "lock")
    os.remove(lock)
    os.mkfifo(lock)
    for args in (("stat", d), ("ls", d), ("tree", d), ("verify", d)):
        r = ctl(*args, timeout=20)
        eq(r.rc, 0, f"beside a FIFO lock{r.where()}")
    eq(ok_json("gc", d)["pages"], n, "gc beside a FIFO lock")
    j = ok_json("evict", d, "--to", "1T")  # a writer replaces the FIFO with its lock file
    eq((j["pages"], j["evicted"]), (n, 0), "evict beside a FIFO lock")
    check(stat.S_ISREG(os.lstat(lock).st_mode), "the writer's lock is a regular file")
    # a link to a file some other process holds locked: no writer of this dir
    d = copy_of(bench_dir(), "lock-link")
    held = os.path.join(TMP, "held-lock")
    open(held, "w").close()
    lock = os.path.join(d, "lock")
    os.remove(lock)
    os.symlink(held, lock)
    with open(held) as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        j = ok_json("gc", d)
        eq((j["pages"], j["dropped"]), (n, 0), "gc with a link for its lock")
        eq(ok_json("verify", d, "--repair")["ok"], True, "verify --repair")
        eq(ok_json("import", d, bench_dir(), "--all")["already_there"], n, "import into it")
        check(stat.S_ISREG(os.lstat(lock).st_mode), "the link was replaced by a lock file")
    eq(os.path.getsize(held), 0, "the link's target is untouched")


@case("a data dir of format 1 (kvtier before 0.2) is named as such, with what to do")
def _():
    d = copy_of(bench_dir(), "format1")
    fixture("version", d, 1)
    with open(os.path.join(d, "slabs", "0000.slab"), "r+b") as f:
        f.write(bytes(SLAB_HEAD))  # format 1's slabs had no head
    for args in (("stat", d), ("ls", d), ("verify", d), ("gc", d), ("evict", d, "--to", "0"),
                 ("recover", d), ("export", d, os.path.join(TMP, "format1-exp"), "--all")):
        fails(1, r"data format version 1, written by kvtier before 0\.2, which this version "
              r"\(format 3\) does not read; the dir is a cache: remove it", *args)


@case("beside a running engine: reads work, writes are refused as locked")
def _():
    d = os.path.join(TMP, "busy")
    eng = Engine("busy", disk_dir=d, requests=60)
    try:
        n = ok_json("stat", d)["pages"]
        check(n > 0, "the engine wrote pages")
        ok("ls", d)
        ok("tree", d)
        eq(ok_json("verify", d)["ok"], True, "verify beside the engine")
        for args in (("gc", d), ("evict", d, "--to", "0"), ("verify", d, "--repair"),
                     ("import", d, live_dir(), "--all")):
            fails(1, "locked.*running engine", *args)
        t = os.path.join(TMP, "from-busy")
        eq(ok_json("export", d, t, "--all")["copied"], n, "export from a busy dir")
    finally:
        eq(eng.stop(), 0, "live_engine exit status")
    eq(ok_json("verify", t)["pages"], n, "the export")


def evict_model(pages, slab_slots, n):
    """The store's eviction order, worked out here: the least recently used chain end (a page
    no other page names as its parent) goes first, ties to the lower slot; a parent whose last
    child went is a chain end from then on. The hashes of the first n to go."""
    import heapq
    kids = {}
    for p in pages.values():
        if p.get("parent") in pages:
            kids[p["parent"]] = kids.get(p["parent"], 0) + 1

    def key(h):
        p = pages[h]
        return (p["last_access_ns"], p["slab"] * slab_slots + p["slot"], h)
    heap = [key(h) for h in pages if not kids.get(h)]
    heapq.heapify(heap)
    gone = []
    while heap and len(gone) < n:
        h = heapq.heappop(heap)[2]
        gone.append(h)
        parent = pages[h].get("parent")
        if parent in pages:
            kids[parent] -= 1
            if kids[parent] == 0:
                heapq.heappush(heap, key(parent))
    return set(gone)


@case("evict --to SIZE: the least recently used chain ends go, down to SIZE")
def _():
    d = copy_of(bench_dir(), "evict")
    pages = pages_of(d)
    slab_slots = ok_json("stat", d)["slab_slots"]
    j = ok_json("evict", d, "--to", "1M")
    keep = (1 << 20) // PAGE_BYTES
    eq((j["pages_before"], j["pages"], j["evicted"]), (len(pages), keep, len(pages) - keep),
       "evict counts")
    after = pages_of(d)
    gone = set(pages) - set(after)
    eq(len(gone), len(pages) - keep, "pages gone")
    # A chain is shortened from its end: no page stays whose parent went.
    cut = [h for h, p in after.items() if p.get("parent") in gone]
    eq(cut, [], "pages left without the parent that was evicted")
    eq(gone, evict_model(pages, slab_slots, len(pages) - keep),
       "the pages evicted, against the chain-end LRU order worked out here")
    eq(ok_json("evict", d, "--to", "1M")["evicted"], 0, "a second evict to the same size")
    t = ok("evict", d, "--to", "0").out
    check("left (0 B)" in t or " 0 left" in t, f"evict text: {t!r}")
    eq(ok_json("stat", d)["pages"], 0, "evict --to 0")


@case("export and import between dirs of one fingerprint; another is refused")
def _():
    src = live_dir()
    pages = pages_of(src)
    fp = fingerprint("live-engine")
    t1 = os.path.join(TMP, "exp-tenant1")
    mine = {h for h, p in pages.items() if p["namespace"] == ns_root(fp, b"tenant-1")}
    j = ok_json("export", src, t1, "--ns", "name:tenant-1")
    eq((j["selected"], j["copied"], j["skipped"]), (len(mine), len(mine), 0), "export --ns")
    eq(ok_json("stat", t1)["fingerprint"], fp, "the new dir's fingerprint")
    eq(set(pages_of(t1)), mine, "pages exported")
    eq(ok_json("verify", t1)["ok"], True, "verify the export")
    j = ok_json("import", t1, src, "--all")
    eq((j["copied"], j["already_there"]), (len(pages) - len(mine), len(mine)), "import --all")
    eq(set(pages_of(t1)), set(pages), "after import --all")
    eq(ok_json("import", t1, src, "--all")["copied"], 0, "import again")
    # --prefix: the chain and the subtree
    mid = max((p for p in pages.values() if p["prefix_tokens"] == 5 * PAGE_TOKENS),
              key=lambda p: len(descendants(pages, [p["hash"]])))
    chain, h = set(), mid["hash"]
    while h in pages:
        chain.add(h)
        h = pages[h]["parent"]
    t2 = os.path.join(TMP, "exp-prefix")
    ok("export", src, t2, "--prefix", mid["hash"])
    eq(set(pages_of(t2)), chain | descendants(pages, [mid["hash"]]), "export --prefix")
    # bytes went along: a page read back from the export is the source's
    one = next(iter(mine))
    eq(file_page(t1, pages_of(t1)[one]["slot"]), file_page(src, pages[one]["slot"]),
       "page bytes")
    # another model
    other = copy_of(bench_dir(), "other-model")
    before = dir_digest(other)
    fails(1, "another model", "export", src, other, "--all")
    fails(1, "another model", "import", other, src, "--all")
    eq(dir_digest(other), before, "a dir of another model after a refused copy")
    # the engine serves the export
    eng = Engine("reader", disk_dir=t2, requests=1)
    try:
        st = ok_json("stat", "--live", eng.sock)["stats"]
        check(st["disk_cached_tokens"] >= len(chain) * PAGE_TOKENS,
              f"the engine sees the exported pages: {st['disk_cached_tokens']}")
    finally:
        eq(eng.stop(), 0, "live_engine exit status")


def file_page(d, slot):
    with open(os.path.join(d, "slabs", "0000.slab"), "rb") as f:
        f.seek(SLAB_HEAD + slot * SLOT_BYTES)
        return f.read(PAGE_BYTES)


@case("parent links that loop: ls/tree --prefix end, show prints each page once, tree shows all")
def _():
    d = copy_of(bench_dir(), "loops")
    root = ns_root(fingerprint("tiny"))
    n = len(pages_of(d))
    # records under made-up keys (the store takes any key): one its own parent, two naming
    # each other, and a pair where one key checks out: b = SHA256(a || tokens), a's parent b
    own, x, y, a = (hashlib.sha256(w).hexdigest() for w in (b"own", b"x", b"y", b"a"))
    b = page_hash(a, [7] * PAGE_TOKENS)
    for key, parent in ((own, own), (x, y), (y, x), (a, b), (b, a)):
        fixture("put", d, key, parent, root, 7)
    for args, want in ((("ls", d, "--prefix", own), {own}), (("ls", d, "--prefix", x), {x}),
                       (("ls", d, "--prefix", a), {a, b}), (("ls", d, "--prefix", b), {a, b})):
        r = ctl(*args, "--json", timeout=20)
        eq(r.rc, 0, f"exit status{r.where()}")
        eq({p["hash"] for p in r.json()["pages"]}, want, " ".join(args[::2]))
    for h in (own, x, a, b):
        eq(ctl("tree", d, "--prefix", h, timeout=20).rc, 0, f"tree --prefix {h[:12]}")
    for h, chain in ((own, [own]), (x, [x]), (b, [a, b])):
        j = ok_json("show", d, h)
        eq(([p["hash"] for p in j["chain"]], j["chain_complete"]), (chain, False),
           f"show {h[:12]}: its chain")
        t = ok("show", d, h).out
        eq(len(re.findall(rf"^\s*\d+  {h[:12]}", t, re.M)), 1,
           f"show {h[:12]} text: the chain lists the page once:\n{t[:600]}")
    tree = ok_json("tree", d)
    tops = {o["first"]: o["pages"] for o in tree["detached"]}
    eq(tops, {own: 1, x: 1, y: 1, a: 2}, "tree: the made-up records, as detached subtrees")
    check(f"{a[:12]}..{b[:12]}" in ok("tree", d).out, "tree text: a and b as one node")
    j = ctl("verify", d, "--json").json()
    eq((j["pages"], j["corrupt"], j["detached"]), (n + 5, 4, 1), "verify: corrupt, detached")
    eq(ok_json("gc", d)["dropped"], 4, "gc drops the corrupt ones")
    eq(ok_json("gc", d, "--detached")["dropped"], 1, "gc --detached drops b")
    eq(ok_json("verify", d)["pages"], n, "verify after gc")


@case("a caller's keys (namespace root of zeros, as the page store and SGLang write): not "
      "corrupt, linked by their parents, a loop among them cut")
def _():
    d = copy_of(bench_dir(), "caller-keys")
    n = len(pages_of(d))
    zero = "00" * 32
    a, b, c, x, y = (hashlib.sha256(w).hexdigest() for w in (b"ca", b"cb", b"cc", b"cx", b"cy"))
    for key, parent in ((a, zero), (b, a), (c, b), (x, y), (y, x)):
        fixture("put", d, key, parent, zero, 7)
    j = ok_json("verify", d)
    eq((j["pages"], j["corrupt"], j["detached"]), (n + 5, 0, 2), "verify: none corrupt")
    check("caller-keys" in ok("stat", d).out, "stat names the namespace")
    eq([p["hash"] for p in ok_json("show", d, c)["chain"]], [a, b, c], "show c: its chain")
    for h in (a, c, x, y):
        eq(ctl("ls", d, "--prefix", h, "--json", timeout=20).rc, 0, f"ls --prefix {h[:12]}")
        eq(ctl("tree", d, "--prefix", h, timeout=20).rc, 0, f"tree --prefix {h[:12]}")
    tops = {o["first"]: o["pages"] for o in ok_json("tree", d)["detached"]}
    check(set(tops) <= {x, y} and sum(tops.values()) == 2, f"tree: the loop, detached: {tops}")
    eq(ok_json("gc", d)["dropped"], 0, "gc drops none of them")


@case("show: a page evicted after the index was read is said to be gone, not printed")
def _():
    d = copy_of(bench_dir(), "evicted-show")
    pages = pages_of(d)
    page = max(pages.values(), key=lambda p: p["prefix_tokens"])
    # the lookup after the index load misses: the page goes in between
    r = Debugged(["show", d, page["hash"]], function="dstore_lookup",
                 shell=[FIXTURE, "delete", d, page["hash"]])
    eq(r.rc, 0, f"exit status{r.where()}")
    check("(evicted since the index was read)" in r.out, f"show text{r.where()}")
    check("checksum" not in r.out and page["hash"] in r.out, f"show text{r.where()}")
    check(page["hash"] not in pages_of(d), "the page went")


@case("verify --repair keeps a page whose read failed, and the detached pages below")
def _():
    d = copy_of(bench_dir(), "readerror")
    pages = pages_of(d)
    third = sorted((p for p in pages.values() if p["prefix_tokens"] == 3 * PAGE_TOKENS),
                   key=lambda p: (-len(descendants(pages, [p["hash"]])), p["hash"]))
    io, bad = third[0]["hash"], third[1]["hash"]
    below_io, below_bad = descendants(pages, [io]), descendants(pages, [bad])
    check(below_io and below_bad, "both victims have pages below them")
    flip(d, pages[bad]["slot"])
    r = Debugged(["verify", d, "--repair", "--json"], function="dstore_get", fail_key=io,
                 errno=-5)
    eq(r.failed, 1, f"reads of {io[:12]} made to fail")
    eq(r.rc, 1, f"exit status{r.where()}")
    j = r.json()
    eq((j["read_errors"], j["corrupt"], j["detached"]), (1, 1, len(below_io) + len(below_bad)),
       "read errors, corrupt, detached")
    eq((j["repaired"], j["dropped"], j["left"], j["ok"]), (True, 1, 1, False),
       "--repair: what went, what is left")
    after = pages_of(d)
    eq(set(pages) - set(after), {bad}, "the pages dropped")
    j = ok_json("verify", d)
    eq((j["pages"], j["problems"]), (len(after), 0), "verify again: the read works now")
    check(re.search(r"read\s+error\) are kept", ok("verify", "--help").out),
          "verify --help says what --repair keeps")


EAGAIN = -11


@case("a snapshot the store cannot take for a moment (-EAGAIN) is taken again, not an error; "
      "so are a writer's deletes and evictions")
def _():
    d = copy_of(bench_dir(), "eagain")
    pages = pages_of(d)
    n = len(pages)
    victim = min((p for p in pages.values() if p["prefix_tokens"] == 2 * PAGE_TOKENS),
                 key=lambda p: (-len(descendants(pages, [p["hash"]])), p["hash"]))["hash"]
    check(descendants(pages, [victim]), "the victim has pages below it")
    # a read whose snapshot could not be taken: verify reads it again
    r = Debugged(["verify", d, "--json"], function="dstore_get", fail_key=victim, errno=EAGAIN,
                 once=True)
    eq(r.failed, 1, f"the read of {victim[:12]} answered -EAGAIN")
    eq(r.rc, 0, f"verify exit status{r.where()}")
    j = r.json()
    eq((j["pages_read"], j["read_errors"], j["problems"], j["ok"]), (n, 0, 0, True), "verify")
    # export: the read, then the second look at a record
    for i, (fn, fail) in enumerate((("dstore_get", dict(fail_key=victim, errno=EAGAIN)),
                                    ("dstore_lookup", dict(return_errno=EAGAIN)))):
        t = os.path.join(TMP, f"eagain-exp{i}")
        r = Debugged(["export", d, t, "--all", "--json"], function=fn, once=True, **fail)
        eq(r.failed, 1, f"{fn} answered -EAGAIN once")
        eq(r.rc, 0, f"export exit status ({fn}){r.where()}")
        j = r.json()
        eq((j["copied"], j["skipped"]), (n, 0), f"export --all ({fn} answered -EAGAIN once)")
        eq(set(pages_of(t)), set(pages), f"what export copied ({fn})")
    # show's look at the record, and the index load itself
    r = Debugged(["show", d, victim, "--json"], function="dstore_lookup",
                 return_errno=EAGAIN, once=True)
    eq(r.rc, 0, f"show exit status{r.where()}")
    eq(len(r.json()["page"].get("tokens", [])), PAGE_TOKENS, "show: the record was read")
    r = Debugged(["stat", d, "--json"], function="dstore_iterate", return_errno=EAGAIN, once=True)
    eq(r.rc, 0, f"stat exit status{r.where()}")
    eq(r.json()["pages"], n, "stat after the index load answered -EAGAIN once")
    # the writer's calls: gc's deletes and evict's evictions, each refused once
    below = descendants(pages, [victim])
    fixture("delete", d, victim)
    r = Debugged(["gc", d, "--detached", "--json"], function="dstore_delete",
                 return_errno=EAGAIN, once=True)
    eq(r.rc, 0, f"gc exit status{r.where()}")
    eq(r.json()["dropped"], len(below), "gc --detached after a delete answered -EAGAIN once")
    r = Debugged(["evict", d, "--to", "0", "--json"], function="dstore_evict",
                 return_errno=EAGAIN, once=True)
    eq(r.rc, 0, f"evict exit status{r.where()}")
    eq(r.json()["pages"], 0, "evict --to 0 after an eviction answered -EAGAIN once")


def small_map_dir(name, pages=2000):
    """A dir of the bench's geometry (16384 slots) whose index map is 4 MiB: LMDB
    records it, and a reader opening the dir takes it; pages written in chains of 32."""
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    fixture("create", d, fingerprint("tiny"), 4 << 20)
    fixture("grow", d, 4 << 20, pages, 1)
    return d


def index_bytes(d):
    return os.path.getsize(os.path.join(d, "index", "data.mdb"))


@case("beside a writer that grows the index past the reader's map: verify and export go on")
def _():
    # Stopped before its first read while a writer (with a 64 MiB map) adds 16000 pages: the
    # index grows past the 4 MiB the reader mapped, and the store is full, so the writer
    # evicts some of the 2000 pages the reader loaded.
    def grow(d, seed):
        return [FIXTURE, "grow", d, str(64 << 20), "16000", str(seed)]

    d = small_map_dir("growing-verify")
    before = index_bytes(d)
    r = Debugged(["verify", d, "--json"], function="dstore_get", shell=grow(d, 2))
    check(index_bytes(d) > 4 << 20 > before, f"the index grew from {before} to "
          f"{index_bytes(d)} bytes, past the reader's 4 MiB map")
    eq(r.rc, 0, f"verify exit status{r.where()}")
    j = r.json()
    eq((j["pages"], j["read_errors"], j["problems"], j["ok"]), (2000, 0, 0, True), "verify")
    check(j["evicted_during_scan"] > 0, f"the writer evicted none of the pages read: {j}")
    eq(j["pages_read"] + j["evicted_during_scan"], 2000, "read + evicted during the scan")
    d = small_map_dir("growing-export")
    t = os.path.join(TMP, "growing-exp")
    r = Debugged(["export", d, t, "--all", "--json"], function="dstore_get", shell=grow(d, 3))
    check(index_bytes(d) > 4 << 20, "the index grew past the reader's map")
    eq(r.rc, 1, f"export exit status: not every page was copied{r.where()}")
    j = r.json()
    why = j["skipped_why"]
    check(j["copied"] > 0 and why["gone"] > 0, f"copied and gone: {j}")
    eq(why, skipped_why(gone=why["gone"], below_skipped=why["below_skipped"]),
       "pages skipped only as evicted (or below such a page)")
    eq((j["selected"], j["copied"] + j["skipped"]), (2000, 2000), "selected = copied + skipped")
    check(f"{j['skipped']} of the 2000 pages selected were not copied" in r.err,
          f"stderr{r.where()}")
    v = ok_json("verify", t)
    eq((v["pages"], v["pages_read"], v["ok"]), (j["copied"], j["copied"], True), "the copy")
    # And truly beside it, without a debugger: whenever the growth falls, no read error.
    d = small_map_dir("growing-live")
    w = subprocess.Popen(grow(d, 4), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        j = ctl("verify", d, "--json").json()
        eq((j["read_errors"], j["problems"]), (0, 0), "verify beside the writer")
        eq(j["pages_read"] + j["evicted_during_scan"], j["pages"], "read + evicted")
        r = ctl("export", d, os.path.join(TMP, "growing-live-exp"), "--all", "--json")
        j = r.json()
        eq((j["skipped_why"]["read_errors"], j["skipped_why"]["bad_bytes"]), (0, 0),
           f"export beside the writer{r.where()}")
        eq((r.rc, j["copied"] + j["skipped"]), (1 if j["skipped"] else 0, j["selected"]),
           f"export's exit status and counts{r.where()}")
    finally:
        eq(w.wait(timeout=60), 0, f"the writer: {w.stderr.read()[-300:]!r}")


@case("export/import into an existing dir: its capacity is kept unless --capacity grows it")
def _():
    src = bench_dir()
    pages = pages_of(src)
    parents = {p["parent"] for p in pages.values()}

    def chain(h):
        out = set()
        while h in pages:
            out.add(h)
            h = pages[h]["parent"]
        return out
    # two leaves (a leaf's --prefix is its chain alone), the shortest, then the one sharing
    # the most with it
    leaves = sorted((p["prefix_tokens"], h) for h, p in pages.items() if h not in parents)
    first = leaves[0][1]
    second = min((h for _, h in leaves[1:]), key=lambda h: (len(chain(h) - chain(first)), h))
    slots = 128
    check(len(chain(first) | chain(second)) <= slots, "two short prefixes")
    t = os.path.join(TMP, "small-target")
    ok("export", src, t, "--prefix", first, "--capacity", f"{slots * SLOT_BYTES // 1024}K")
    st = ok_json("stat", t)
    eq((st["capacity_slots"], st["slab_files"], st["pages"]), (slots, 1, len(chain(first))),
       "the target created with --capacity")
    before = dir_digest(t)
    r = fails(1, r"only \d+ fit.*--capacity.*evict", "import", t, src, "--all")
    check(f"only {slots - len(chain(first))} fit" in r.err, f"how many fit{r.where()}")
    eq(dir_digest(t), before, "the target after a refused import")
    fails(1, "only", "export", src, t, "--all")
    j = ok_json("import", t, src, "--prefix", second)
    eq(j["copied"], len(chain(second) - chain(first)), "an import that fits")
    st = ok_json("stat", t)
    eq((st["capacity_slots"], st["slab_files"]), (slots, 1), "its capacity after it")
    eq(sorted(os.listdir(os.path.join(t, "slabs"))), ["0000.slab"], "its slab files")
    j = ok_json("import", t, src, "--all", "--capacity", "32M")
    eq(j["copied"] + j["already_there"], len(pages), "import --all --capacity 32M")
    grown = ok_json("stat", t)["capacity_slots"]  # what the slab files span, made as needed
    check(len(pages) <= grown <= (32 << 20) // SLOT_BYTES, f"grown by --capacity: {grown} slots")
    eq(ok_json("verify", t)["pages"], len(pages), "verify the grown target")
    for c in ("export", "import"):
        check("disk_bytes" in ok(c, "--help").out, f"{c} --help: the engine's disk_bytes")


@case("export: a record whose token count changed after the index was read is not copied")
def _():
    src = copy_of(live_dir(), "retokened")
    pages = pages_of(src)
    first = min((p for p in pages.values() if p["prefix_tokens"] == PAGE_TOKENS),
                key=lambda p: (len(descendants(pages, [p["hash"]])), p["hash"]))
    want = 1 + len(descendants(pages, [first["hash"]]))
    t = os.path.join(TMP, "exp-retokened")
    # the first page's record is read again after its bytes: by then it holds 4096 tokens
    r = Debugged(["export", src, t, "--prefix", first["hash"], "--json"],
                 function="dstore_lookup", shell=[FIXTURE, "tokens", src, first["hash"], 4096])
    eq(r.rc, 1, f"exit status: pages were not copied{r.where()}")
    j = r.json()
    eq((j["selected"], j["copied"], j["skipped"]), (want, 0, want),
       "the page (and what is below it) skipped")
    eq(j["skipped_why"], skipped_why(changed=1, below_skipped=want - 1), "why")
    check(f"{want} of the {want} pages selected were not copied" in r.err, f"stderr{r.where()}")
    eq(pages_of(t), {}, "nothing copied")


def skipped_why(**counts):
    """export's skipped_why: every reason, 0 unless given."""
    why = dict.fromkeys(("bad_bytes", "read_errors", "gone", "changed", "below_skipped"), 0)
    why.update(counts)
    return why


@case("export: pages not copied are counted by reason (bad bytes, read error, gone), exit 1")
def _():
    src = copy_of(bench_dir(), "exp-skips")
    pages = pages_of(src)
    eq(ok_json("verify", src)["ok"], True, "the source before the damage")
    third = sorted((p for p in pages.values() if p["prefix_tokens"] == 3 * PAGE_TOKENS),
                   key=lambda p: (-len(descendants(pages, [p["hash"]])), p["hash"]))
    io, bad = third[0]["hash"], third[1]["hash"]
    below_io, below_bad = descendants(pages, [io]), descendants(pages, [bad])
    check(below_io and below_bad, "both victims have pages below them")
    flip(src, pages[bad]["slot"])
    # text: the flipped page, and what is below it
    t = os.path.join(TMP, "exp-skips-text")
    r = ctl("export", src, t, "--all")
    eq(r.rc, 1, f"exit status{r.where()}")
    n = len(pages) - 1 - len(below_bad)
    check(re.search(rf"{len(pages)} pages selected, {n} copied .*, 0 already there, "
                    rf"{1 + len(below_bad)} skipped \(1 bad bytes \(checksum\), "
                    rf"{len(below_bad)} below a skipped page\)\n", r.out), f"report{r.where()}")
    eq(r.err, f"kvtier-ctl: {1 + len(below_bad)} of the {len(pages)} pages selected were not "
       f"copied (why: see the report)\n", f"stderr{r.where()}")
    eq(set(pages_of(t)), set(pages) - {bad} - below_bad, "what was copied")
    # JSON, with a read error too
    t = os.path.join(TMP, "exp-skips-json")
    r = Debugged(["export", src, t, "--all", "--json"], function="dstore_get", fail_key=io,
                 errno=-5)
    eq(r.failed, 1, f"reads of {io[:12]} made to fail")
    eq(r.rc, 1, f"exit status{r.where()}")
    j = r.json()
    skipped = 2 + len(below_io) + len(below_bad)
    eq((j["selected"], j["copied"], j["already_there"], j["skipped"]),
       (len(pages), len(pages) - skipped, 0, skipped), "counts")
    eq(j["skipped_why"], skipped_why(bad_bytes=1, read_errors=1,
                                     below_skipped=len(below_io) + len(below_bad)), "why")
    # a page evicted between its read and its record's second look
    first = min((p for p in pages.values() if p["prefix_tokens"] == PAGE_TOKENS),
                key=lambda p: (len(descendants(pages, [p["hash"]])), p["hash"]))
    want = 1 + len(descendants(pages, [first["hash"]]))
    r = Debugged(["export", src, os.path.join(TMP, "exp-skips-gone"), "--prefix", first["hash"],
                  "--json"], function="dstore_lookup", shell=[FIXTURE, "delete", src,
                                                               first["hash"]])
    eq(r.rc, 1, f"exit status{r.where()}")
    eq(r.json()["skipped_why"], skipped_why(gone=1, below_skipped=want - 1), "why")


@case("export/import: a target inside the source, the source itself or around it is refused")
def _():
    src = copy_of(bench_dir(), "nest")
    os.mkdir(os.path.join(TMP, "nest-sibling"))
    before, entries = dir_digest(src), sorted(os.listdir(src))
    link = os.path.join(TMP, "nest-link")
    os.symlink(src, link)
    for args in (("export", src, src), ("export", src, src + "/"),
                 ("export", src, os.path.join(src, "sub")),
                 ("export", src, os.path.join(src, "a", "b")),
                 ("export", src, os.path.join(link, "sub")),
                 ("export", src, os.path.join(src, "slabs", "..", "sub")),
                 ("export", src, os.path.join(TMP, "nest-sibling", "..", "nest", "sub")),
                 ("export", link, src), ("export", src, os.path.join(src, "slabs")),
                 ("export", src, TMP), ("import", os.path.join(src, "sub"), src),
                 ("import", src, link)):
        r = fails(2, r"(the target (is the source itself|lies inside the source)|the source "
                  r"lies inside the target): refused.*give a target outside the source",
                  *args, "--all")
        check(r.err.count("\n") == 1, f"one line{r.where()}")
    eq(sorted(os.listdir(src)), entries, "the source's entries")
    eq(dir_digest(src), before, "the source")
    # a sibling whose name starts with the source's is outside it
    eq(ok_json("export", src, src + "-other", "--all")["copied"], len(pages_of(src)),
       "export to a sibling")


@case("export: a target inside a bind mount of the source is refused")
def _():
    src = copy_of(bench_dir(), "nest-bind")
    mnt = os.path.join(TMP, "nest-mnt")
    os.mkdir(mnt)
    m = subprocess.run(["mount", "--bind", src, mnt], capture_output=True)
    if m.returncode:
        raise harness.Skip(f"mount --bind is not permitted here: {m.stderr.strip()[-200:]!r}")
    try:
        fails(2, "the target lies inside the source", "export", src, os.path.join(mnt, "sub"),
              "--all")
        fails(2, "the target is the source itself", "export", mnt, src, "--all")
        fails(2, "the target lies inside the source", "import", os.path.join(src, "x"), mnt,
              "--all")
    finally:
        subprocess.run(["umount", mnt], capture_output=True)
    check(not os.path.exists(os.path.join(src, "sub")), "nothing was made in the source")


def stats_fields():
    """The field names of struct kvt_stats in include/kvtier.h."""
    text = open(os.path.join(SRC, "include", "kvtier.h")).read()
    body = re.search(r"struct kvt_stats \{(.*?)\};", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = set()
    for decl in body.split(";"):
        m = re.match(r"\s*(?:uint32_t|uint64_t|size_t)\s+(.*)", decl, re.S)
        if m:
            names |= {n.strip() for n in m.group(1).split(",")}
    return names - {"size"}


@case("live: stat --live shows a hybrid engine's states and sliding-window KV")
def _():
    for kind, want in (("mamba", r"states +(\d+) slots, (\d+) free"),
                       ("swa", r"window +(\d+) SWA slots, (\d+) free")):
        eng = Engine(f"live-{kind}", hybrid=kind, requests=40, pause_us=0)
        try:
            t = ok("stat", "--live", eng.sock).out
            m = re.search(want, t)
            check(m, f"{kind}: stat --live lacks {want!r}:\n{t}")
            s = ok_json("stat", "--live", eng.sock)["stats"]
            if kind == "mamba":
                # 4 slots per request slot; no request runs now, and without checkpoints
                # (live_engine records none) none is cached.
                eq((int(m.group(1)), int(m.group(2))), (16, 16), "state slots, free")
                eq(s["mamba_cached_states"], 0, "checkpoints")
                # With a host tier, room for host copies of states, none made yet.
                h = re.search(r"on the host: (\d+) of (\d+) copies held", t)
                check(h, f"stat --live lacks the host copies of states:\n{t}")
                eq((int(h.group(1)), int(h.group(2))),
                   (0, s["mamba_host_slots"]), "host copies held, room")
                check(s["mamba_host_slots"] > 0, f"room for host copies: {s}")
            else:
                eq(int(m.group(1)), s["swa_tokens"], "SWA slots")
                check(s["swa_tokens"] < s["device_tokens"], "SWA pool smaller than the full")
                check(s["swa_kv_hit_tokens"] >= s["match_hit_tokens"] > 0, f"hits: {s}")
            check("states" not in t if kind == "swa" else "window " not in t,
                  f"{kind}: only its own line:\n{t}")
        finally:
            eq(eng.stop(), 0, "live_engine exit status")


@case("live: stat --live, --json, metrics and top against a running engine; figures move")
def _():
    eng = Engine("live", disk_dir=os.path.join(TMP, "live-dir"), pause_us=2000)
    try:
        t = ok("stat", "--live", eng.sock).out
        for want in ("device", "host", "disk", "sim backend", "moved", "in flight", "errors"):
            check(want in t, f"stat --live text lacks {want!r}:\n{t}")
        a = ok_json("stat", "--live", eng.sock)
        fields = set(a["stats"])
        check(fields <= stats_fields(), f"fields not in struct kvt_stats: "
              f"{fields - stats_fields()}")
        check({"device_tokens", "host_tokens", "disk_tokens", "match_calls", "h2d_bytes",
               "ops_in_flight", "disk_errors"} <= fields, f"fields: {sorted(fields)}")
        s = a["stats"]
        eq((s["device_tokens"], s["host_tokens"], s["page_size"]), (4096, 16384, 16), "sizes")
        check(s["device_free_tokens"] <= s["device_tokens"], "device free <= capacity")
        check(s["host_free_tokens"] <= s["host_tokens"], "host free <= capacity")
        check(s["match_hit_tokens"] <= s["match_query_tokens"], "hits <= asked")
        eq(s["disk_errors"], 0, "disk errors")
        time.sleep(0.3)
        b = ok_json("stat", "--live", eng.sock)
        check(b["time_ns"] > a["time_ns"], "time_ns moves")
        for k in ("match_calls", "match_query_tokens", "h2d_bytes"):
            check(b["stats"][k] > a["stats"][k], f"{k} moves: {a['stats'][k]} -> {b['stats'][k]}")
        m = ok("metrics", eng.sock).out
        samples = {}
        for line in m.splitlines():
            if line.startswith("#"):
                check(re.match(r"# (HELP|TYPE) kvtier_[a-z0-9_]+ \S", line), f"line {line!r}")
                continue
            mm = re.fullmatch(r"(kvtier_[a-z0-9_]+) (\d+)", line)
            check(mm, f"metrics line {line!r}")
            samples[mm.group(1)] = int(mm.group(2))
            check(f"# TYPE {mm.group(1)} " in m, f"no # TYPE for {mm.group(1)}")
        check(samples["kvtier_match_calls"] >= b["stats"]["match_calls"], "metrics are current")
        check({f"kvtier_{k}" for k in ("device_tokens", "disk_cached_tokens")} <= set(samples),
              "metrics fields")
        mj = ok_json("metrics", eng.sock)["metrics"]
        eq(set(mj), set(samples), "metrics --json names")
        r = ok("top", eng.sock, "--count", "3", "--interval", "0.2", "--json")
        frames = [json.loads(x) for x in r.out.splitlines()]
        eq([f["refresh"] for f in frames], [1, 2, 3], "top refreshes")
        eq(frames[0]["rates"], None, "no rates on the first refresh")
        check(frames[2]["rates"]["match_calls"] > 0, f"rates move: {frames[2]['rates']}")
        check(frames[2]["stats"]["match_calls"] > frames[0]["stats"]["match_calls"], "top moves")
        r = ok("top", eng.sock, "--count", "2", "--interval", "0.1")
        eq(r.out.count("TIER"), 2, "top text frames")
        check("matches/s" in r.out, f"top text rates{r.where()}")
    finally:
        eq(eng.stop(), 0, "live_engine exit status")
    fails(1, "no such socket", "stat", "--live", eng.sock)


@case("live: a stale socket, a server that is not kvtier's")
def _():
    path = os.path.join(TMP, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    fails(1, "nobody is listening", "stat", "--live", path)
    path = os.path.join(TMP, "other.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    proc = subprocess.Popen([CTL, "stat", "--live", path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    conn, _ = srv.accept()
    conn.recv(64)
    conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nhello\n")
    conn.close()
    out, err = proc.communicate(timeout=10)
    srv.close()
    eq(proc.returncode, 1, f"exit status; stderr {err!r}")
    check(b"not a kvtier stats reply" in err, f"stderr {err!r}")


def trickle(path, stop):
    """A client that sends its request a byte every 0.9 s, until stop or the server cuts it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
            while not stop.wait(0.9 if s.send(b"s") else 0):
                pass
        except OSError:
            pass


@case("live: stat --live answered within ~1 s beside idle, trickling and deaf clients")
def _():
    eng = Engine("crowd")
    held, stop = [], threading.Event()
    tricklers = [threading.Thread(target=trickle, args=(eng.sock, stop)) for _ in range(2)]
    try:
        for t in tricklers:
            t.start()
        for i in range(26):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            held.append(s)
            s.connect(eng.sock)
            if i % 5 == 0:
                s.sendall(b"metrics\n")  # and never reads the reply
        for _ in range(3):
            t0 = time.monotonic()
            st = ok_json("stat", "--live", eng.sock)["stats"]
            took = time.monotonic() - t0
            check(took < 3.0, f"stat --live took {took:.1f} s beside misbehaving clients")
            check("device_tokens" in st, f"stats lack device_tokens: {st}")
        # A trickler just taken in, when the engine closes.
        tricklers.append(threading.Thread(target=trickle, args=(eng.sock, stop)))
        tricklers[-1].start()
        time.sleep(0.3)
        t0 = time.monotonic()
        eq(eng.stop(), 0, "live_engine exit status")
        took = time.monotonic() - t0
        check(took < 3.0, f"the engine took {took:.1f} s to close beside a trickling client")
    finally:
        stop.set()
        for s in held:
            s.close()
        eng.stop()
        for t in tricklers:
            t.join()


@case("verify shows progress on a terminal, and --json stays clean")
def _():
    d = bench_dir()
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen([CTL, "verify", d, "--json"], stdout=subprocess.PIPE,
                                stderr=slave, stdin=subprocess.DEVNULL)
        os.close(slave)
        tty = b""
        while True:
            ready, _, _ = select.select([master], [], [], 10)
            if not ready:
                break
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            tty += chunk
        out, _ = proc.communicate(timeout=30)
    finally:
        os.close(master)
    eq(proc.returncode, 0, f"exit status; terminal got {tty[-300:]!r}")
    check(b"verify: " in tty and b"pages" in tty, f"no progress on the terminal: {tty[:300]!r}")
    check(tty.endswith(b"\r\x1b[K"), f"the progress line is cleared: {tty[-40:]!r}")
    eq(json.loads(out)["ok"], True, "JSON with a terminal on stderr")


# ---- the Redis tier (remote stat, remote verify) ----

_redis = {}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resp(port, *args):
    """One command to the server in RESP; its reply's first line (enough for SET, DBSIZE)."""
    msg = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(msg)
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
    return reply.decode().strip()


# A page's own key in a SCAN reply (not the start of its copy's name, "...:copy{T}").
PAGE_NAME = rb"kvt:[0-9a-f]{64}:[0-9a-f]{64}(?![0-9a-f:])"


def redis_url():
    """The URL of a redis-server of the test's own, filled by kvtier-bench once; Skip where
    redis-server or ctl's remote commands are missing."""
    if "url" in _redis:
        return _redis["url"]
    r = ctl("remote", "stat", "redis://127.0.0.1:1")
    if r.rc == 2 and "not built in" in r.err:
        raise harness.Skip("kvtier-ctl built without the Redis store")
    _redis["proc"], port = harness.start_redis(TMP)
    url = f"redis://127.0.0.1:{port}"
    b = subprocess.run([BENCH, "--host-tokens", "65536", "--remote", url, "--synthetic", "mixed",
                        "--requests", "50", *PINNED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    check(b.returncode == 0, f"kvtier-bench --remote failed: {b.stderr[-400:]!r}")
    _redis["port"], _redis["url"] = port, url
    return url


def stop_redis():
    proc = _redis.pop("proc", None)
    if proc:
        proc.terminate()
        proc.wait(timeout=30)
    for proc in _redis.pop("cluster_procs", []):
        proc.kill()
        proc.wait(timeout=30)


@case("remote stat: one fingerprint, its pages the server's keys; text and --json")
def _():
    url = redis_url()
    dbsize = int(resp(_redis["port"], b"DBSIZE")[1:])
    check(dbsize > 0, "kvtier-bench --remote stored no page")
    j = ok_json("remote", "stat", url)
    eq(len(j["fingerprints"]), 1, f"fingerprints in {j}")
    eq(j["fingerprints"][0]["pages"], dbsize, "pages against DBSIZE")
    eq(j["pages"], dbsize, "pages in total")
    check(j["bytes"] > dbsize * 104, f"bytes: {j['bytes']}")
    check(j["used_memory"] > 0 and j["maxmemory_policy"], f"INFO memory fields: {j}")
    t = ok("remote", "stat", url).out
    check(j["fingerprints"][0]["fingerprint"] in t and str(dbsize) in t, f"text: {t!r}")


@case("remote verify: good pages exit 0; a garbage value exits 1 and is named")
def _():
    url = redis_url()
    j = ok_json("remote", "verify", url)
    eq((j["bad"], j["ok"]), (0, True), f"verify of a clean server: {j}")
    check(j["good"] > 0, f"good pages: {j}")
    fp = ok_json("remote", "stat", url)["fingerprints"][0]["fingerprint"]
    names = []
    with socket.create_connection(("127.0.0.1", _redis["port"]), timeout=10) as s:
        s.sendall(b"*4\r\n$4\r\nSCAN\r\n$1\r\n0\r\n$5\r\nMATCH\r\n$5\r\nkvt:*\r\n")
        reply = b""
        while not names and (chunk := s.recv(1 << 16)):
            reply += chunk
            names = re.findall(PAGE_NAME, reply)
    check(names, "no kvt:* key to damage")
    key = names[0]
    check(key.decode().startswith(f"kvt:{fp}:"), f"key {key!r} of fingerprint {fp}")
    eq(resp(_redis["port"], b"SET", key, b"garbage"), "+OK", "SET garbage")
    r = ctl("remote", "verify", url)
    eq(r.rc, 1, f"exit status{r.where()}")
    check(key.decode() in r.out, f"the bad key named{r.where()}")
    j = ctl("remote", "verify", url, "--json").json()
    eq((j["bad"], j["ok"], j["bad_keys"]), (1, False, [key.decode()]), "verify --json")
    eq(j["fingerprints"][0]["bad"], 1, "bad pages of the fingerprint")


def redis_cluster_url():
    """A 3-master cluster of the test's own, filled by kvtier-bench once: (url, ports)."""
    if "cluster_url" in _redis:
        return _redis["cluster_url"], _redis["cluster_ports"]
    redis_url()  # skips where ctl or redis-server lack
    _redis["cluster_procs"], ports = harness.start_redis_cluster(TMP)
    url = ",".join(f"redis://127.0.0.1:{p}" for p in ports)
    b = subprocess.run([BENCH, "--host-tokens", "65536", "--remote", url, "--synthetic", "mixed",
                        "--requests", "50", *PINNED], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=120)
    check(b.returncode == 0, f"kvtier-bench --remote (cluster) failed: {b.stderr[-400:]!r}")
    _redis["cluster_url"], _redis["cluster_ports"] = url, ports
    return url, ports


@case("remote stat and verify over a cluster: every master scanned, a line per node")
def _():
    url, ports = redis_cluster_url()
    sizes = {f"127.0.0.1:{p}": int(resp(p, b"DBSIZE")[1:]) for p in ports}
    check(all(n > 0 for n in sizes.values()), f"pages on every master: {sizes}")
    one = f"redis://127.0.0.1:{ports[1]}"  # one node's URL finds the others
    for u in (url, one):
        j = ok_json("remote", "stat", u)
        eq(j["cluster"], True, "cluster")
        eq({n["server"]: n["pages"] for n in j["nodes"]}, sizes, "pages per node against DBSIZE")
        eq(j["pages"], sum(sizes.values()), "pages in total")
        eq(j["fingerprints"][0]["pages"], j["pages"], "one fingerprint")
    t = ok("remote", "stat", one).out
    check("cluster:      3 masters" in t and all(s in t for s in sizes), f"text: {t!r}")
    j = ok_json("remote", "verify", url)
    eq((j["bad"], j["ok"], j["good"]), (0, True, sum(sizes.values())), f"verify: {j}")
    # A garbage value on one master: verify names it, and that node's line counts it.
    with socket.create_connection(("127.0.0.1", ports[2]), timeout=10) as s:
        s.sendall(b"*4\r\n$4\r\nSCAN\r\n$1\r\n0\r\n$5\r\nMATCH\r\n$5\r\nkvt:*\r\n")
        reply, names = b"", []
        while not names and (chunk := s.recv(1 << 16)):
            reply += chunk
            names = re.findall(PAGE_NAME, reply)
    check(names, "no kvt:* key on the third master")
    eq(resp(ports[2], b"SET", names[0], b"garbage"), "+OK", "SET garbage")
    r = ctl("remote", "verify", url, "--json")
    eq(r.rc, 1, f"exit status{r.where()}")
    j = r.json()
    eq((j["bad"], j["bad_keys"]), (1, [names[0].decode()]), "the bad key named")
    eq({n["server"]: n["bad"] for n in j["nodes"]},
       {s: int(s.endswith(f":{ports[2]}")) for s in sizes}, "bad pages per node")


@case("remote stat and verify over a cluster: each page's copy on another master, counted")
def _():
    url, ports = redis_cluster_url()
    j = ok_json("remote", "stat", url)
    eq(j["copies"] * 2, j["pages"], f"a copy of every page: {j}")
    eq(j["fingerprints"][0]["copies"], j["copies"], "copies of the fingerprint")
    check("copies:" in ok("remote", "stat", url).out, "the text says copies")


@case("remote: a kvt:* key of another type is foreign; stat and verify go on")
def _():
    url = redis_url()
    port = _redis["port"]
    before = ok_json("remote", "stat", url)
    page_like = b"kvt:" + b"ab" * 32 + b":" + b"cd" * 32  # a page's name, a list's value
    eq(resp(port, b"RPUSH", page_like, b"x"), ":1", "RPUSH")
    eq(resp(port, b"SADD", b"kvt:a-set", b"m"), ":1", "SADD")
    try:
        j = ok_json("remote", "stat", url)
        eq((j["pages"], j["other_keys"]), (before["pages"], before["other_keys"] + 2),
           f"stat counts the lists and sets as foreign: {j}")
        r = ctl("remote", "verify", url, "--json")
        eq(r.rc, 1, f"exit status{r.where()}")
        j = r.json()
        check(page_like.decode() in j["bad_keys"] and "kvt:a-set" in j["bad_keys"],
              f"both named: {j['bad_keys']}")
        check(j["good"] >= before["pages"] - 1, f"the pages read all the same: {j}")
        t = ctl("remote", "stat", url)
        eq(t.rc, 0, f"exit status{t.where()}")
        check("no page (another name or type)" in t.out, f"text: {t.out!r}")
    finally:
        resp(port, b"DEL", page_like, b"kvt:a-set")


@case("remote stat and verify over a cluster with a master down: the others reported, exit 1")
def _():
    redis_url()  # skips where ctl or redis-server lack
    procs, ports = harness.start_redis_cluster(TMP)
    try:
        url = ",".join(f"redis://127.0.0.1:{p}" for p in ports)
        b = subprocess.run([BENCH, "--host-tokens", "65536", "--remote", url, "--synthetic",
                            "mixed", "--requests", "20"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=120)
        check(b.returncode == 0, f"kvtier-bench --remote (cluster) failed: {b.stderr[-400:]!r}")
        sizes = {f"127.0.0.1:{p}": int(resp(p, b"DBSIZE")[1:]) for p in ports}
        procs[1].kill()
        procs[1].wait()
        dead = f"127.0.0.1:{ports[1]}"
        for sub in ("stat", "verify"):
            r = ctl("remote", sub, url, "--json")
            eq(r.rc, 1, f"{sub}: exit status{r.where()}")
            check(f"cannot connect to {dead}" in r.err, f"{sub}: stderr names it{r.where()}")
            j = r.json()
            eq(j["unreachable"], 1, f"{sub}: unreachable")
            states = {n["server"]: n["state"] for n in j["nodes"]}
            eq(states, {s: "unreachable" if s == dead else "ok" for s in sizes}, "states")
            live = {n["server"]: n["pages"] for n in j["nodes"] if n["state"] == "ok"}
            eq(live, {s: n for s, n in sizes.items() if s != dead}, f"{sub}: the live masters")
            check(any("Connection refused" in n.get("error", "") for n in j["nodes"]),
                  f"{sub}: why: {j['nodes']}")
        t = ctl("remote", "verify", url)
        eq(t.rc, 1, f"exit status{t.where()}")
        check(re.search(rf"{re.escape(dead)} .* unreachable: cannot connect", t.out) and
              "INCOMPLETE" in t.out and "unreachable:  1 master" in t.out, f"text: {t.out!r}")
        # From a dead seed too: the next seed answers.
        t = ctl("remote", "stat", f"redis://{dead},redis://127.0.0.1:{ports[0]}")
        eq(t.rc, 1, f"exit status{t.where()}")
        check("3 masters" in t.out, f"text: {t.out!r}")
    finally:
        for p in procs:
            p.kill()
            p.wait()


@case("remote: a bad URL exits 2 naming it; a dead port exits 1")
def _():
    r = ctl("remote", "stat", "redis://127.0.0.1:1")
    if r.rc == 2 and "not built in" in r.err:
        raise harness.Skip("kvtier-ctl built without the Redis store")
    for url in ("http://127.0.0.1:6379", "redis://", "redis://host:99999", "redis://u@host"):
        fails(2, re.escape(f"bad URL '{url}'"), "remote", "verify", url)
    port = free_port()
    for sub in ("stat", "verify"):
        fails(1, f"cannot connect to 127.0.0.1:{port}: ", "remote", sub,
              f"redis://127.0.0.1:{port}")
    fails(2, "expected stat or verify", "remote", "list", "redis://127.0.0.1:1")
    dead = f"redis://127.0.0.1:{port}"
    fails(2, re.escape(f"bad URL '{dead},http://x'"), "remote", "stat", f"{dead},http://x")
    fails(1, f"cannot connect to 127.0.0.1:{port}: ", "remote", "stat", f"{dead},{dead}")


@case("remote over TLS: stat and verify with --tls-ca; another CA or a plain URL fails clearly")
def _():
    redis_url()  # skips where ctl or redis-server lack
    p, port, tls_port, files = harness.start_redis_tls(TMP)
    try:
        url = f"rediss://127.0.0.1:{tls_port}"
        b = subprocess.run([BENCH, "--host-tokens", "65536", "--remote", url, "--remote-tls-ca",
                            files["ca.crt"], "--synthetic", "mixed", "--requests", "50", *PINNED],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
        check(b.returncode == 0, f"kvtier-bench over rediss:// failed: {b.stderr[-400:]!r}")
        dbsize = int(resp(port, b"DBSIZE")[1:])
        check(dbsize > 0, "kvtier-bench over TLS stored no page")
        j = ok_json("remote", "stat", url, "--tls-ca", files["ca.crt"])
        eq(j["pages"], dbsize, "pages over TLS against DBSIZE on the plain port")
        j = ok_json("remote", "verify", url, "--tls-ca", files["ca.crt"])
        eq((j["good"], j["bad"], j["ok"]), (dbsize, 0, True), "verify over TLS")
        # The system's CAs, or another CA: the server's certificate does not check out.
        fails(1, rf"cannot connect to 127.0.0.1:{tls_port}: .*certificate", "remote", "stat", url)
        fails(1, rf"cannot connect to 127.0.0.1:{tls_port}: .*certificate", "remote", "verify",
              url, "--tls-ca", files["other-ca.crt"])
        # TLS options are for rediss:// alone; a file that is no PEM is named.
        fails(2, "need a rediss:// URL", "remote", "stat", f"redis://127.0.0.1:{port}",
              "--tls-ca", files["ca.crt"])
        fails(2, re.escape(f"TLS: {files['client.key']}"), "remote", "stat", url, "--tls-ca",
              files["client.key"])
        fails(2, "--tls-key needs --tls-cert", "remote", "stat", url, "--tls-key",
              files["client.key"])
    finally:
        p.kill()
        p.wait()


@case("remote over TLS: a server that asks for a client certificate is read with --tls-cert")
def _():
    redis_url()
    p, port, tls_port, files = harness.start_redis_tls(TMP, auth_clients=True)
    try:
        url = f"rediss://127.0.0.1:{tls_port}"
        fails(1, f"127.0.0.1:{tls_port}", "remote", "stat", url, "--tls-ca", files["ca.crt"])
        j = ok_json("remote", "stat", url, "--tls-ca", files["ca.crt"], "--tls-cert",
                    files["client.crt"], "--tls-key", files["client.key"])
        eq(j["pages"], 0, "an empty server, read with a client certificate")
    finally:
        p.kill()
        p.wait()


@case("remote: an ACL user reads the server; a refused AUTH or command exits 1 naming it")
def _():
    url = redis_url()  # the pages kvtier-bench wrote there
    port = _redis["port"]
    for args in ((b"kv", b"on", b">p:w@d", b"~kvt:*", b"+@all"),
                 (b"nocmd", b"on", b">pw", b"+@all", b"-scan")):
        eq(resp(port, b"ACL", b"SETUSER", *args), "+OK", "ACL SETUSER")
    pages = ok_json("remote", "stat", url)["pages"]
    user_url = f"redis://kv:p%3Aw%40d@127.0.0.1:{port}"
    eq(ok_json("remote", "stat", user_url)["pages"], pages, "pages seen by the ACL user")
    # Another case may have left a bad value there: the ACL user sees what the default one does.
    plain, user = (ctl("remote", "verify", u, "--json") for u in (url, user_url))
    eq((user.rc, user.json()["good"], user.json()["bad"]),
       (plain.rc, plain.json()["good"], plain.json()["bad"]), "verify as the ACL user")
    for sub in ("stat", "verify"):
        fails(1, f"127.0.0.1:{port}: AUTH as user kv refused: WRONGPASS", "remote", sub,
              f"redis://kv:nope@127.0.0.1:{port}")
        fails(1, f"127.0.0.1:{port}: SCAN: NOPERM", "remote", sub,
              f"redis://nocmd:pw@127.0.0.1:{port}")


# ---- driver ----

def main():
    global CTL, BENCH, LIVE, FIXTURE, TMP
    if len(sys.argv) != 5:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    CTL, BENCH, LIVE, FIXTURE = (os.path.abspath(a) for a in sys.argv[1:])
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvtier-ctl-test-") as tmp:
        TMP = tmp
        try:
            failed, _ = harness.run_cases(os.environ.get("CTL_CASE"))  # names holding CTL_CASE
        finally:
            stop_redis()
    return harness.summary(failed, t0)


if __name__ == "__main__":
    sys.exit(main())
