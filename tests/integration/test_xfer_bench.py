#!/usr/bin/env python3
"""End-to-end tests of kvtier-xfer-bench: usage: test_xfer_bench.py PATH-TO-KVTIER-XFER-BENCH

The program is a benchmark: its timings are never judged here. What is checked is everything
that does not depend on the machine's speed: the exit status, that the JSON report has every
field with a sane type, that byte counts follow from the geometry (worked out here from the
documented layout, not copied from the output), that the derived figures (GB/s, ratios, the
ideal prefill, the overhead) follow from the measured times, that bad arguments are refused
with exit 2 and a message, and that --help describes the options the program takes.

Every case prints one line (PASS, FAIL or SKIP); the script exits 1 when any case FAILed.
"""
import math
import re
import sys
import time

from harness import Skip, case, check, close, eq, has_keys, has_types, positive
import harness

PROG = None
# A small, quick configuration: tiny geometry (2 layers, 1 KV head of 16, 2 bytes).
SMALL = ["--geometry", "tiny", "--pages", "64", "--reps", "2", "--overlap-pages", "32",
         "--compute-us", "1,50,auto"]
COMPUTE = ["1", "50", "auto"]  # 1 us is below a layer's copy, so the ideal is copy-bound


# ---- running the program ----


def run(*args, timeout=120):
    return harness.Result("kvtier-xfer-bench", PROG, args, timeout)


def run_json(*args):
    r = run(*args, "--json")
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr of a clean run{r.where()}")
    return r.json()


def bad_usage(*args, mention=None):
    """Exit 2, nothing on stdout, a message on stderr (naming mention when given)."""
    r = run(*args)
    eq(r.rc, 2, f"exit status{r.where()}")
    eq(r.out, "", f"stdout{r.where()}")
    check(r.err.startswith("kvtier-xfer-bench: "), f"stderr should say what is wrong{r.where()}")
    check("--help" in r.err, f"stderr should point at --help{r.where()}")
    if mention:
        check(mention in r.err, f"stderr should mention {mention!r}{r.where()}")
    return r


# ---- what a report must hold ----

def page_bytes(g, page_size):
    """One page over every layer, K and V (MHA) or the latent (MLA)."""
    if g["attention"] == "mla":
        row = (g["kv_lora_rank"] + g["qk_rope_head_dim"]) * g["dtype_bytes"]
    else:
        row = g["kv_heads"] * (g["head_dim"] + g["v_head_dim"]) * g["dtype_bytes"]
    return row * g["layers"] * page_size


CONFIG_KEYS = {
    "backend": str, "io": str, "layout": str, "host_pinned": bool, "geometry": str,
    "attention": str, "layers": int, "kv_heads": int, "head_dim": int, "v_head_dim": int,
    "kv_lora_rank": int, "qk_rope_head_dim": int, "dtype_bytes": int, "page_size": int,
    "page_bytes": int, "pages": int, "pool_pages": int, "scatter": str, "run_pages": (int, type(None)),
    "runs": int, "reps": int, "seed": int, "dma_min_bytes": int, "path_ops": dict,
    "load_priority": str, "kernel_blocks": int, "dma_hint": str,
}
TIMING_KEYS = ["median_s", "best_s", "median_gbps", "best_gbps"]


def check_timing(t, nbytes, what):
    has_keys(t, TIMING_KEYS, what)
    for k in TIMING_KEYS:
        positive(t[k], f"{what}.{k}")
    check(t["best_s"] <= t["median_s"], f"{what}: best {t['best_s']} above median {t['median_s']}")
    close(t["median_gbps"], nbytes / t["median_s"] / 1e9, f"{what}.median_gbps")
    close(t["best_gbps"], nbytes / t["best_s"] / 1e9, f"{what}.best_gbps")


def check_config(c):
    has_types(c, CONFIG_KEYS, "config")
    eq(c["page_bytes"], page_bytes(c, c["page_size"]), "config.page_bytes")
    check(c["pages"] <= c["pool_pages"], "config: pages above pool_pages")
    check(1 <= c["runs"] <= c["pages"], f"config.runs {c['runs']} out of 1..pages")
    if c["scatter"] == "random":
        eq(c["run_pages"], None, "config.run_pages with --scatter random")
    else:
        check(c["runs"] <= -(-c["pages"] // c["run_pages"]), "more runs than blocks of run_pages")


def check_bandwidth(b, c):
    has_keys(b, ["bytes", "baseline", "load", "backup", "baseline_h2d", "baseline_d2h",
                 "load_ratio", "backup_ratio", "target_ratio"], "bandwidth")
    eq(b["bytes"], c["pages"] * c["page_bytes"], "bandwidth.bytes (pages x page_bytes)")
    eq(b["baseline"], "cudaMemcpyAsync" if c["backend"] == "cuda" else "memcpy",
       "bandwidth.baseline")
    eq(b["target_ratio"], 0.9 if c["backend"] == "cuda" else 0.8, "bandwidth.target_ratio")
    for k in ["load", "backup", "baseline_h2d", "baseline_d2h"]:
        check_timing(b[k], b["bytes"], f"bandwidth.{k}")
    for name, x, base in [("load_ratio", "load", "baseline_h2d"),
                          ("backup_ratio", "backup", "baseline_d2h")]:
        has_keys(b[name], ["median", "best"], f"bandwidth.{name}")
        for k in ["median", "best"]:
            positive(b[name][k], f"bandwidth.{name}.{k}")
        # scattered GB/s over one copy's GB/s, i.e. one copy's time over the scattered time
        close(b[name]["median"], b[base]["median_s"] / b[x]["median_s"], f"{name}.median")
        close(b[name]["best"], b[base]["best_s"] / b[x]["best_s"], f"{name}.best")


def check_overlap(o, c, compute):
    has_keys(o, ["layers", "pages", "bytes", "layer_bytes", "load", "layer_copy_s",
                 "target_overhead_pct", "points", "compute"], "overlap")
    # sim busy-waits; cuda runs the compute kernel unless --compute host asks otherwise
    check(o["compute"] in (["kernel", "host"] if c["backend"] == "cuda" else ["busy-wait"]),
          f"overlap.compute {o['compute']!r} on {c['backend']}")
    eq(o["layers"], c["layers"], "overlap.layers")
    check(1 <= o["pages"] <= c["pages"], "overlap.pages out of 1..pages")
    eq(o["bytes"], o["pages"] * c["page_bytes"], "overlap.bytes (pages x page_bytes)")
    eq(o["layer_bytes"], o["bytes"] // c["layers"], "overlap.layer_bytes")
    eq(o["target_overhead_pct"], 5.0, "overlap.target_overhead_pct")
    check_timing(o["load"], o["bytes"], "overlap.load")
    t = o["layer_copy_s"]
    close(t, o["load"]["median_s"] / c["layers"], "overlap.layer_copy_s (load / layers)")
    eq(len(o["points"]), len(compute), "overlap.points")
    for p, want in zip(o["points"], compute):
        what = f"overlap point {want}"
        has_keys(p, ["compute_us", "asked_us", "compute_blocks", "auto", "measured_s", "best_s",
                     "ideal_s", "overhead_pct", "copy_compute_ratio"], what)
        eq(p["auto"], want == "auto", f"{what}: auto")
        if want == "auto":  # twice the layer's copy, rounded up to whole microseconds
            us = p["asked_us"]
            check(us == int(us) and 2 * t * 1e6 - 0.01 <= us <= max(1, 2 * t * 1e6 + 1),
                  f"{what}: asked_us {us} is not 2 x layer_copy_s {t} in whole us")
        else:
            eq(p["asked_us"], float(want), f"{what}: asked_us")
        # A busy-wait computes what was asked; the kernel's compute is its time measured alone.
        if o["compute"] == "kernel":
            positive(p["compute_us"], f"{what}: compute_us")
            check(p["compute_blocks"] > 0, f"{what}: compute_blocks")
        else:
            eq((p["compute_us"], p["compute_blocks"]), (p["asked_us"], 0), f"{what}: compute")
        cs = p["compute_us"] * 1e-6
        for k in ["measured_s", "best_s", "ideal_s", "copy_compute_ratio"]:
            positive(p[k], f"{what}: {k}")
        check(p["best_s"] <= p["measured_s"], f"{what}: best above median")
        close(p["ideal_s"], t + cs + (c["layers"] - 1) * max(t, cs), f"{what}: ideal_s")
        close(p["copy_compute_ratio"], t / cs, f"{what}: copy_compute_ratio")
        check(math.isfinite(p["overhead_pct"]), f"{what}: overhead_pct not finite")
        close(p["overhead_pct"], 100 * (p["measured_s"] / p["ideal_s"] - 1), f"{what}: overhead",
              rel=1e-3, abs_=1e-3)
        # The prefill cannot beat its computes: busy-waits of exactly compute_us (the kernel's
        # time alone is a median, so a prefill may come in a little under it).
        slack = 0.9 if o["compute"] == "kernel" else 1.0
        check(p["best_s"] >= slack * c["layers"] * cs, f"{what}: faster than its own compute")


def check_paths(c, ncompute):
    """Which path (kernel or dma) the cuda engine took for each op; none on sim."""
    p = c["path_ops"]
    for d in ["load", "backup"]:
        has_keys(p.get(d), ["kernel", "dma"], f"config.path_ops.{d}")
    if c["backend"] != "cuda":
        eq(p, {"load": {"kernel": 0, "dma": 0}, "backup": {"kernel": 0, "dma": 0}}, "sim path_ops")
        return
    # Every measurement runs reps times after one warm-up: (a) loads and backs up once per
    # rep; (b) loads once per rep for the copy alone and once per rep per compute value.
    runs = c["reps"] + 1
    eq(sum(p["load"].values()), runs * (2 + ncompute), "load ops by either path")
    eq(sum(p["backup"].values()), runs, "backup ops by either path")
    if c["io"] != "auto":
        eq(p["load"]["dma" if c["io"] == "kernel" else "kernel"], 0, f"ops off --io {c['io']}")


def check_report(j, compute=COMPUTE):
    has_keys(j, ["config", "bandwidth", "overlap"], "report")
    check_config(j["config"])
    check_paths(j["config"], len(compute))
    check_bandwidth(j["bandwidth"], j["config"])
    check_overlap(j["overlap"], j["config"], list(compute))
    return j


# ---- the cases ----

@case("a small sim run: every field, consistent figures")
def _():
    j = check_report(run_json(*SMALL, "--backend", "sim"))
    c = j["config"]
    eq((c["backend"], c["io"], c["layout"], c["scatter"]), ("sim", "auto", "page_first", "random"),
       "config defaults")
    eq((c["layers"], c["kv_heads"], c["head_dim"], c["dtype_bytes"]), (2, 1, 16, 2), "tiny")
    eq(c["page_bytes"], 2 * 2 * 16 * 2 * 16, "tiny page bytes")
    eq((c["pages"], c["pool_pages"], c["reps"], c["seed"]), (64, 96, 2, 1), "config counts")
    eq(j["overlap"]["pages"], 32, "overlap.pages")
    # 64 of 96 pages picked at random: the bench breaks up any neighbours, so none coalesce.
    eq(c["runs"], 64, "runs with --scatter random")


@case("layer_first layout")
def _():
    j = check_report(run_json(*SMALL, "--backend", "sim", "--layout", "layer_first"))
    eq(j["config"]["layout"], "layer_first", "config.layout")


@case("--scatter runs: pages in runs of --run-pages")
def _():
    j = check_report(run_json(*SMALL, "--backend", "sim", "--scatter", "runs", "--run-pages", 4))
    c = j["config"]
    eq((c["scatter"], c["run_pages"]), ("runs", 4), "config")
    # 16 runs of 4 at random blocks; two picked blocks may abut on both sides and merge.
    check(c["runs"] <= 16, f"runs {c['runs']} above 64 / 4")


@case("geometry: overrides over a preset, an MLA preset, --page-size")
def _():
    j = check_report(run_json(*SMALL, "--layers", 3, "--dtype-bytes", 4, "--page-size", 8))
    c = j["config"]
    eq((c["layers"], c["dtype_bytes"], c["page_size"]), (3, 4, 8), "overridden fields")
    eq(c["page_bytes"], 3 * 2 * 16 * 4 * 8, "page bytes")
    args = ["--geometry", "deepseek-v3", "--pages", 8, "--reps", 1, "--compute-us", 50]
    j = check_report(run_json(*args, "--backend", "sim"), compute=["50"])
    c = j["config"]
    eq((c["attention"], c["layers"], c["kv_lora_rank"], c["qk_rope_head_dim"]),
       ("mla", 61, 512, 64), "deepseek-v3")
    eq(c["page_bytes"], 61 * 576 * 2 * 16, "MLA page bytes")


@case("--scatter random never leaves two pages to coalesce")
def _():
    # Two pages in pools of two: a plain shuffle puts device 1, 2 against host 0, 1 (a run)
    # one time in four; the bench must break every such pair.
    for seed in range(1, 21):
        j = run_json("--geometry", "tiny", "--pages", 2, "--pool-pages", 2, "--reps", 1,
                     "--compute-us", 10, "--seed", seed)
        eq(j["config"]["runs"], 2, f"runs of 2 pages, seed {seed}")


@case("the same seed picks the same pages; --pool-pages and --seed are echoed")
def _():
    args = [*SMALL, "--backend", "sim", "--pages", 40, "--pool-pages", 41, "--seed", 7]
    a, b = run_json(*args), run_json(*args)
    check_report(a)
    eq((a["config"]["pool_pages"], a["config"]["seed"]), (41, 7), "config")
    eq(a["config"]["runs"], b["config"]["runs"], "runs of two runs with one seed")


@case("text report")
def _():
    r = run(*SMALL, "--backend", "sim")
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr{r.where()}")
    for want in [r"^kvtier-xfer-bench: sim backend", r"^\(a\) bandwidth: 128\.0 KiB per op",
                 r"^  load \(H2D\) .* GB/s .* GB/s .*>= 0\.80", r"^  backup \(D2H\) .*>= 0\.80",
                 r"^\(b\) overlap: prefill of 2 layers over 32 pages",
                 r"^ +50\.0 us .* ms .* ms .*%", r" auto .* ms .* ms .*<= 5%"]:
        check(re.search(want, r.out, re.M), f"text report lacks /{want}/{r.where()}")


@case("--backend cuda: figures on a GPU, exit 77 and a message without one")
def _():
    r = run(*SMALL, "--backend", "cuda", "--json")
    if r.rc == 77:
        eq(r.out, "", f"stdout{r.where()}")
        check(re.search(r"cuda|gpu", r.err, re.I), f"stderr should say why{r.where()}")
        raise Skip("no GPU here; the exit 77 notice was checked")
    eq(r.rc, 0, f"exit status{r.where()}")
    j = check_report(r.json())
    eq(j["config"]["backend"], "cuda", "config.backend")


@case("--io is accepted and echoed")
def _():
    for io in ["auto", "kernel", "dma"]:
        j = check_report(run_json(*SMALL, "--io", io, "--reps", 1, "--dma-min-bytes", 4096))
        eq((j["config"]["io"], j["config"]["dma_min_bytes"]), (io, 4096), "config.io")


@case("cuda's knobs are accepted and echoed; the engine's defaults when not given")
def _():
    j = check_report(run_json(*SMALL, "--reps", 1))
    eq((j["config"]["load_priority"], j["config"]["kernel_blocks"]), ("high", 16),
       "config defaults (the host tier's: high-priority loads, 16 blocks)")
    eq(j["config"]["dma_hint"], "none", "config.dma_hint default")
    j = check_report(run_json(*SMALL, "--reps", 1, "--load-priority", "default",
                              "--kernel-blocks", 4096, "--compute", "host", "--dma-hint",
                              "overlap"))
    eq((j["config"]["load_priority"], j["config"]["kernel_blocks"], j["config"]["dma_hint"]),
       ("default", 4096, "overlap"), "config knobs")


BAD = [
    (["--bogus"], "unknown option"),
    (["--pages"], "needs a value"),
    (["--pages", "0"], "--pages"),
    (["--pages", "abc"], "--pages"),
    (["--pages", "-3"], "--pages"),
    (["--page-size", "3"], "--page-size"),
    (["--page-size", "512"], "--page-size"),
    (["--reps", "0"], "--reps"),
    (["--seed", "x"], "--seed"),
    (["--dma-min-bytes", "-1"], "--dma-min-bytes"),
    (["--backend", "gpu"], "--backend"),
    (["--io", "fast"], "--io"),
    (["--layout", "rows"], "--layout"),
    (["--kernel-blocks", "4097"], "--kernel-blocks"),
    (["--load-priority", "low"], "--load-priority"),
    (["--compute", "gpu"], "--compute"),
    (["--dma-hint", "fast"], "--dma-hint"),
    (["--scatter", "everywhere"], "--scatter"),
    (["--run-pages", "0"], "--run-pages"),
    (["--compute-us", "0"], "--compute-us"),
    (["--compute-us", ","], "--compute-us"),
    (["--compute-us", "10,x"], "--compute-us"),
    (["--compute-us", ",".join(["5"] * 17)], "--compute-us"),
    (["--geometry", "gpt-5"], "--geometry"),
    (["--geometry", "tiny,layers=0"], "--geometry"),
    (["--layers", "0"], "--layers"),
    (["--kv-heads", "x"], "--kv-heads"),
    (["--dtype-bytes", "3"], "geometry"),
    (["--geometry", "deepseek-v3", "--head-dim", "64"], "geometry"),
    (["--pages", "10", "--pool-pages", "9"], "--pool-pages"),
    (["--pages", "10", "--overlap-pages", "11"], "--overlap-pages"),
    (["--pages", "10", "--pool-pages", "10", "--scatter", "runs", "--run-pages", "4"],
     "--run-pages"),
]


@case("bad arguments: exit 2 with a message")
def _():
    for args, mention in BAD:
        bad_usage(*args, mention=mention)


@case("--help exits 0 and tells the truth about the options")
def _():
    r = run("--help")
    eq(r.rc, 0, f"exit status{r.where()}")
    eq(r.err, "", f"stderr{r.where()}")
    check(r.out.startswith("usage: kvtier-xfer-bench"), f"usage line{r.where()}")
    documented = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", r.out))
    wanted = {"--pages", "--pool-pages", "--page-size", "--layers", "--kv-heads", "--head-dim",
              "--dtype-bytes", "--geometry", "--reps", "--seed", "--backend", "--io", "--layout",
              "--json", "--help", "--scatter", "--run-pages", "--overlap-pages", "--compute-us",
              "--dma-min-bytes", "--kernel-blocks", "--load-priority", "--compute",
              "--dma-hint"}
    check(wanted <= documented, f"--help lacks {sorted(wanted - documented)}")
    for p in ["tiny", "llama3-8b", "deepseek-v3", "page_first", "layer_first", "kernel", "dma"]:
        check(p in r.out, f"--help does not mention {p}")
    # Every option --help names is one the program takes: given a bad value it complains
    # about the value, never that the option is unknown.
    for opt in sorted(documented - {"--help", "--json"}):
        r = run(opt, "not-a-value")
        eq(r.rc, 2, f"{opt} with a bad value{r.where()}")
        check("unknown option" not in r.err, f"--help documents {opt}, which is unknown{r.where()}")
    r = run("--json", "--help")  # --help after other options still prints the help
    eq(r.rc, 0, f"exit status of --json --help{r.where()}")
    check(r.out.startswith("usage:"), f"--json --help should print the help{r.where()}")


# ---- driver ----

def main():
    global PROG
    PROG = harness.program_arg("test_xfer_bench.py", "PATH-TO-KVTIER-XFER-BENCH")
    if PROG is None:
        return 2
    t0 = time.monotonic()
    failed, _ = harness.run_cases()
    return harness.summary(failed, t0)


if __name__ == "__main__":
    sys.exit(main())
