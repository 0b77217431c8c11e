#!/usr/bin/env python3
"""The tools' command lines recorded, and two builds compared: for a change that must leave
every output as it was (a file moved or split).

  cli_record.py run TOOLS_DIR OUT_DIR   every case's argv, exit status, stdout and stderr into
                                        OUT_DIR (TOOLS_DIR: a build's tools/, e.g. build/tools)
  cli_record.py compare A1 A2 B         A1, A2: two records of the old build; B: the new one's

The cases: --help, -h and a bad option of every program and of every kvtier-ctl command; the
bad-usage tables of the integration tests (test_bench.USAGE, test_store_bench.BAD,
test_xfer_bench.BAD); kvtier-bench runs (--deterministic, text and --json: device, host, disk
twice on one dir, MLA, hybrid, sliding window, policies, page 64, a shard, --corrupt-after,
multimodal); kvtier-ctl on the dirs they leave (stat, ls, show, tree, verify, emb, gc, evict,
recover, export, import, a damaged copy, dead sockets and servers); small kvtier-store-bench,
-xfer-bench (sim), -radix-bench and -pagestore-bench runs. A case whose two old records agree
byte for byte must come out byte for byte the same in B; one that moved between them (a
timing) must agree with its numbers masked (and a work dir's random suffix, and met/MISSED).
Build the old tree apart (git archive into /tmp, meson setup there), record it twice, record
the new build once, compare; exit 1 when a case differs.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests", "integration")
TRACES = os.path.join(TESTS, "baseline", "traces")
CONV = os.path.join(TRACES, "mooncake_conversation.jsonl")
SYNTH = os.path.join(TRACES, "mooncake_synthetic.jsonl")
W = "/tmp/kvtier-cli-record"  # the same in every record, so outputs that name it agree

TOOLS = ["kvtier-bench", "kvtier-radix-bench", "kvtier-xfer-bench", "kvtier-store-bench",
         "kvtier-pagestore-bench", "kvtier-ctl"]
CTL_CMDS = ["stat", "ls", "show", "tree", "verify", "gc", "evict", "recover", "export", "import",
            "emb", "top", "metrics", "remote"]


def test_lists():
    """The bad-usage tables of the integration tests."""
    sys.path.insert(0, TESTS)
    sys.argv = ["x"]
    out = []
    import test_bench
    out += [("kvtier-bench", a) for a, _ in test_bench.USAGE]
    import test_store_bench
    out += [("kvtier-store-bench", a) for a, _ in test_store_bench.BAD]
    import test_xfer_bench
    out += [("kvtier-xfer-bench", a) for a, _ in test_xfer_bench.BAD]
    return out


HYBRID = "tiny,mamba_layers=2,conv_bytes=64,ssm_bytes=256"
WINDOWED = "tiny,layers=4,swa_window=32,full_every=2"
HOST = ["--device-tokens", "32768", "--host-tokens", "131072"]
DET = ["--deterministic"]


def cases():
    """(name, tool, argv, prep) in order; prep is a shell line run first (or None)."""
    c = []
    for t in TOOLS:
        c += [(f"{t} --help", t, ["--help"], None), (f"{t} -h", t, ["-h"], None),
              (f"{t} --bogus", t, ["--bogus"], None)]
    c.append(("ctl no args", "kvtier-ctl", [], None))
    c.append(("ctl nope", "kvtier-ctl", ["nope"], None))
    for cmd in CTL_CMDS:
        c.append((f"ctl {cmd} --help", "kvtier-ctl", [cmd, "--help"], None))
        c.append((f"ctl {cmd} no args", "kvtier-ctl", [cmd], None))
    for sub in ["stat", "verify"]:
        c.append((f"ctl remote {sub} --help", "kvtier-ctl", ["remote", sub, "--help"], None))
    for i, (t, a) in enumerate(test_lists()):
        c.append((f"usage {i} {t} {' '.join(a)[:60]}", t, a, None))
    b = "kvtier-bench"
    runs = {
        "mixed": ["--synthetic", "mixed", "--requests", "200", "--device-tokens", "32768"],
        "chat-host": ["--synthetic", "chat", "--requests", "200"] + HOST,
        "conv-trace": ["--trace", CONV, "--requests", "80", "--device-tokens", "262144"],
        "mla": ["--synthetic", "mixed", "--requests", "100", "--geometry",
                "attention=mla,layers=2,kv_lora_rank=32,qk_rope_head_dim=16,dtype_bytes=2"] + HOST,
        "hybrid": ["--synthetic", "chat", "--requests", "100", "--geometry", HYBRID] + HOST,
        "windowed": ["--synthetic", "chat", "--requests", "100", "--geometry", WINDOWED] + HOST,
        "evict-lfu": ["--synthetic", "chat", "--requests", "150", "--evict-policy", "lfu"] + HOST,
        "write-back": ["--synthetic", "mixed", "--requests", "150", "--write-policy",
                       "write_back"] + HOST,
        "page-64": ["--synthetic", "mixed", "--requests", "100", "--page-size", "64"] + HOST,
        "shard": ["--synthetic", "chat", "--requests", "100", "--shard", "1/3"] + HOST,
        "corrupt": ["--synthetic", "chat", "--requests", "100", "--corrupt-after", "3"] + HOST,
        "multimodal": ["--synthetic", "multimodal", "--requests", "100"] + HOST,
    }
    for name, a in runs.items():
        c.append((f"bench {name} text", b, a + DET, None))
        c.append((f"bench {name} json", b, a + DET + ["--json"], None))
    disk = HOST + ["--disk-tokens", "200000", "--dir", f"{W}/disk", "--store-page-tokens", "16"]
    mk = f"rm -rf {W}/disk"
    c.append(("bench disk first", b, ["--synthetic", "docqa", "--requests", "80"] + disk + DET, mk))
    c.append(("bench disk restart json", b,
              ["--synthetic", "docqa", "--requests", "80"] + disk + DET + ["--json"], None))
    c.append(("bench disk big pages", b, ["--synthetic", "chat", "--requests", "80"] + HOST +
              ["--disk-tokens", "200000", "--dir", f"{W}/disk2"] + DET + ["--json"],
              f"rm -rf {W}/disk2"))
    c.append(("bench mm disk", b, ["--synthetic", "multimodal", "--requests", "60"] + HOST +
              ["--disk-tokens", "400000", "--dir", f"{W}/mm"] + DET, f"rm -rf {W}/mm"))
    c.append(("bench dir without disk", b, HOST + ["--dir", f"{W}/x"], None))
    c.append(("bench missing trace", b, ["--trace", f"{W}/none.jsonl"], None))
    c.append(("bench dir parent missing", b, HOST + ["--disk-tokens", "200000", "--dir",
                                                     f"{W}/no/such/dir"], None))
    ctl = "kvtier-ctl"
    d = f"{W}/disk"
    for args in (["stat", d], ["stat", d, "--json"], ["ls", d], ["ls", d, "--json"],
                 ["ls", d, "--sort", "time"], ["ls", d, "--sort", "size"], ["tree", d],
                 ["tree", d, "--json"], ["tree", d, "--dot"], ["verify", d],
                 ["verify", d, "--json"], ["emb", d], ["stat", f"{W}/disk2"],
                 ["ls", f"{W}/disk2", "--json"], ["verify", f"{W}/disk2", "--json"],
                 ["emb", f"{W}/mm"], ["emb", f"{W}/mm", "--verify"], ["emb", f"{W}/mm", "--json"],
                 ["stat", f"{W}/mm"], ["tree", f"{W}/mm"], ["stat", f"{W}/nothing"],
                 ["show", d, "zz"], ["show", d, "0000"], ["ls", d, "--sort", "bogus"],
                 ["evict", d], ["stat", "--live", f"{W}/no.sock"], ["top", f"{W}/no.sock"],
                 ["metrics", f"{W}/no.sock"], ["remote", "stat", "redis://127.0.0.1:1"],
                 ["remote", "verify", "redis://127.0.0.1:1", "--json"],
                 ["remote", "stat", "http://x"]):
        c.append(("ctl " + " ".join(args), ctl, args, None))
    c.append(("ctl show first", ctl, ["show", d, "@FIRST"], None))
    c.append(("ctl show first json", ctl, ["show", d, "@FIRST", "--json"], None))
    cp = f"rm -rf {W}/copy && cp -a {d} {W}/copy"
    c.append(("ctl gc copy", ctl, ["gc", f"{W}/copy"], cp))
    c.append(("ctl gc copy detached json", ctl, ["gc", f"{W}/copy", "--detached", "--json"], None))
    c.append(("ctl evict copy", ctl, ["evict", f"{W}/copy", "--to", "1M"], cp))
    c.append(("ctl evict copy json", ctl, ["evict", f"{W}/copy", "--to", "0", "--json"], None))
    c.append(("ctl recover copy", ctl, ["recover", f"{W}/copy"], cp + f" && rm -f {W}/copy/index/*"))
    c.append(("ctl recover stat", ctl, ["stat", f"{W}/copy"], None))
    c.append(("ctl export", ctl, ["export", d, f"{W}/exp", "--all"], f"rm -rf {W}/exp"))
    c.append(("ctl export json", ctl, ["export", d, f"{W}/exp", "--all", "--json"], None))
    c.append(("ctl import", ctl, ["import", f"{W}/copy", f"{W}/exp", "--ns", "default"], None))
    c.append(("ctl verify exp", ctl, ["verify", f"{W}/exp"], None))
    c.append(("ctl verify damaged", ctl, ["verify", f"{W}/copy"],
              cp + f" && for f in {W}/copy/slabs/*; do dd if=/dev/urandom of=$f bs=1 count=64 "
              f"seek=9000 conv=notrunc status=none; done; true"))
    sb = "kvtier-store-bench"
    small = ["--page-bytes", "64K", "--queue-depth", "4", "--pages", "24", "--batch", "8",
             "--reps", "1", "--open-pages", "50", "--open-reps", "1", "--no-fio", "--dir", W]
    c.append(("store-bench small", sb, small, None))
    c.append(("store-bench small json", sb, small + ["--json"], None))
    c.append(("store-bench open only", sb, ["--pages", "0", "--open-pages", "100", "--open-reps",
                                            "1", "--no-fio", "--dir", W], None))
    c.append(("store-bench no dir", sb, ["--dir", "/nonexistent/dir/for/sure", "--no-fio"], None))
    xb = "kvtier-xfer-bench"
    xs = ["--backend", "sim", "--geometry", "tiny", "--pages", "64", "--reps", "1"]
    c.append(("xfer-bench sim", xb, xs, None))
    c.append(("xfer-bench sim json", xb, xs + ["--json"], None))
    c.append(("xfer-bench sim runs layer_first", xb,
              xs + ["--scatter", "runs", "--run-pages", "4", "--layout", "layer_first"], None))
    c.append(("xfer-bench compute list", xb, xs + ["--compute-us", "5,10", "--json"], None))
    rb = "kvtier-radix-bench"
    c.append(("radix-bench", rb, ["--trace", CONV, "--pages", "3000"], None))
    c.append(("radix-bench json", rb, ["--trace", CONV, "--pages", "3000", "--json"], None))
    c.append(("radix-bench no trace", rb, ["--trace", f"{W}/none.jsonl"], None))
    pb = "kvtier-pagestore-bench"
    c.append(("pagestore-bench", pb, ["--pages", "256", "--reps", "1", "--dir", W], None))
    c.append(("pagestore-bench json", pb, ["--pages", "256", "--reps", "1", "--dir", W, "--json"],
              None))
    return c


def first_hash(tools):
    r = subprocess.run([os.path.join(tools, "kvtier-ctl"), "ls", f"{W}/disk", "--json"],
                       capture_output=True, text=True)
    try:
        j = json.loads(r.stdout)
        pages = j.get("pages") or []
        return pages[0]["hash"] if pages else "none"
    except (ValueError, KeyError, IndexError, TypeError):
        return "none"


def run(tools, out):
    shutil.rmtree(W, ignore_errors=True)
    os.makedirs(W)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    env = dict(os.environ, KVT_TRACES_DIR=TRACES)
    for i, (name, tool, argv, prep) in enumerate(cases()):
        if prep:
            subprocess.run(prep, shell=True, check=False)
        if "@FIRST" in argv:
            h = first_hash(tools)
            argv = [h if a == "@FIRST" else a for a in argv]
        try:
            r = subprocess.run([os.path.join(tools, tool)] + argv, capture_output=True,
                               timeout=300, env=env, stdin=subprocess.DEVNULL)
            rc, so, se = r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            rc, so, se = "timeout", e.stdout or b"", e.stderr or b""
        with open(os.path.join(out, f"{i:03d}.json"), "w") as f:
            json.dump({"name": name, "tool": tool, "argv": argv, "rc": rc}, f)
        open(os.path.join(out, f"{i:03d}.out"), "wb").write(so)
        open(os.path.join(out, f"{i:03d}.err"), "wb").write(se)
    shutil.rmtree(W, ignore_errors=True)
    print(f"{len(cases())} cases recorded in {out}")


NUM = re.compile(rb"[-+]?\d+(\.\d+)?(e[-+]?\d+)?")


def mask(b):
    """Numbers to N, met/MISSED to V, runs of blanks to one (column widths follow numbers)."""
    b = re.sub(rb"(kvtier-[a-z-]+)\.[A-Za-z0-9]{6}", rb"\1.XXXXXX", b)  # mkdtemp's
    b = NUM.sub(b"N", b)
    b = re.sub(rb"\b(met|MISSED)\b", b"V", b)
    return re.sub(rb"[ \t]+", b" ", b)


def load(d, i):
    meta = json.load(open(os.path.join(d, f"{i}.json")))
    return (meta, open(os.path.join(d, f"{i}.out"), "rb").read(),
            open(os.path.join(d, f"{i}.err"), "rb").read())


def compare(a1, a2, b):
    ids = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(a1, "*.json")))
    exact = masked = bad = 0
    for i in ids:
        m1, o1, e1 = load(a1, i)
        m2, o2, e2 = load(a2, i)
        mb, ob, eb = load(b, i)
        same = (m1["rc"], o1, e1) == (m2["rc"], o2, e2)
        if m1["rc"] != mb["rc"]:
            ok = False
        elif same:
            ok = (o1, e1) == (ob, eb)
        else:
            ok = (mask(o1), mask(e1)) == (mask(ob), mask(eb))
        if not ok:
            bad += 1
            print(f"DIFFERS {i} {m1['name']} (rc {m1['rc']} -> {mb['rc']})")
        elif same:
            exact += 1
        else:
            masked += 1
    print(f"{len(ids)} cases: {exact} byte-identical (deterministic in the old build), "
          f"{masked} identical with numbers masked (timings), {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "compare":
        sys.exit(compare(*sys.argv[2:5]))
    else:
        print(__doc__)
        sys.exit(2)
