#!/usr/bin/env python3
"""Engines sharing one Redis tier against each alone, on one workload split between them.

Starts a redis-server of its own (in a temp dir, no persistence) and runs N kvtier-bench
processes at once, each on its shard of the workload (--shard K/N), all with --remote to
that one server: the shared run. Then the same N shards, each with a fresh server of its
own: the alone run. Prints each engine's hit rate and the sum over all of them, shared and
alone, and the ratio (what the Mooncake paper calls the gain of a global cache).

With --cluster the engines share a 3-master Redis Cluster instead (formed with redis-cli
--cluster create; alone, each still has a standalone server: the hit rate does not depend on
how a server is cut). With --netns (root, iproute2): every engine runs in a network namespace
of its own, joined to the servers' namespace by a veth pair, as engines on other hosts;
--delay-ms adds that much delay each way with tc netem where the kernel has it (the run says
when it has not).

Usage: share_remote.py [--bench PATH] [--engines N] [--cluster] [--netns] [--delay-ms MS]
                       [--maxmemory BYTES] [--json] -- KVTIER-BENCH-ARGS...
The kvtier-bench arguments name the workload and the tiers below the device (a host tier is
needed; --shard, --remote and --json are added here).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip()}")
    return r


class Net:
    """Namespaces kvt-srv and kvt-e<i>, a veth pair from each engine to the server's."""

    def __init__(self, n, delay_ms):
        self.n, self.made, self.note = n, [], ""
        tag = os.getpid() % 10000
        self.srv = f"kvt{tag}s"
        self.ns = [f"kvt{tag}e{i}" for i in range(n)]
        for ns in [self.srv] + self.ns:
            run(["ip", "netns", "add", ns])
            self.made.append(ns)
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
        self.addr = []
        for i, ns in enumerate(self.ns):
            a, b = f"vs{tag}x{i}", f"ve{tag}x{i}"
            run(["ip", "link", "add", a, "type", "veth", "peer", "name", b])
            run(["ip", "link", "set", a, "netns", self.srv])
            run(["ip", "link", "set", b, "netns", ns])
            run(["ip", "-n", self.srv, "addr", "add", f"10.88.{i}.1/24", "dev", a])
            run(["ip", "-n", ns, "addr", "add", f"10.88.{i}.2/24", "dev", b])
            run(["ip", "-n", self.srv, "link", "set", a, "up"])
            run(["ip", "-n", ns, "link", "set", b, "up"])
            # Every server address (a cluster announces one) is the servers' namespace.
            run(["ip", "-n", ns, "route", "add", "default", "via", f"10.88.{i}.1"])
            self.addr.append(f"10.88.{i}.1")
            if delay_ms:
                for where, dev in ((self.srv, a), (ns, b)):
                    r = run(["ip", "netns", "exec", where, "tc", "qdisc", "add", "dev", dev,
                             "root", "netem", "delay", f"{delay_ms}ms"], check=False)
                    if r.returncode:
                        self.note = f"no delay added: tc netem refused ({r.stderr.strip()})"

    def close(self):
        for ns in self.made:
            run(["ip", "netns", "del", ns], check=False)


def start_server(tmp, ns, addrs, maxmemory):
    """A redis-server listening on addrs (in namespace ns, or here): (process, port)."""
    port = free_port()
    d = tempfile.mkdtemp(dir=tmp, prefix="redis-")
    cmd = ["redis-server", "--port", str(port), "--bind"] + addrs + [
        "--save", "", "--appendonly", "no", "--dir", d, "--protected-mode", "no"]
    if maxmemory:
        cmd += ["--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]
    p = subprocess.Popen((["ip", "netns", "exec", ns] if ns else []) + cmd,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = ["redis-cli", "-h", addrs[0], "-p", str(port), "ping"]
    for _ in range(200):
        if run((["ip", "netns", "exec", ns] if ns else []) + probe, check=False).stdout.strip() \
                == "PONG":
            return p, port
        time.sleep(0.05)
    p.kill()
    raise RuntimeError("redis-server did not come up")


def in_ns(ns, cmd):
    return (["ip", "netns", "exec", ns] if ns else []) + cmd


def start_cluster(tmp, ns, announce, maxmemory, masters=3):
    """A Redis Cluster of masters nodes on announce (in namespace ns, or here), listening
    on every address: (processes, ports) once every node says cluster_state:ok."""
    ports = [free_port() for _ in range(2 * masters)]
    procs = []
    for port, bus in zip(ports[:masters], ports[masters:]):
        d = tempfile.mkdtemp(dir=tmp, prefix="redis-cluster-")
        cmd = ["redis-server", "--port", str(port), "--bind", "0.0.0.0" if ns else announce,
               "--save", "", "--appendonly", "no", "--dir", d, "--protected-mode", "no",
               "--cluster-enabled", "yes", "--cluster-port", str(bus), "--cluster-announce-ip",
               announce, "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
               "--cluster-require-full-coverage", "no"]
        if maxmemory:
            cmd += ["--maxmemory", maxmemory, "--maxmemory-policy", "allkeys-lru"]
        procs.append(subprocess.Popen(in_ns(ns, cmd), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    ports = ports[:masters]

    def info(port):
        return run(in_ns(ns, ["redis-cli", "-h", announce, "-p", str(port), "cluster", "info"]),
                   check=False).stdout

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any("cluster_state" not in info(p) for p in ports):
        time.sleep(0.05)
    run(in_ns(ns, ["redis-cli", "--cluster", "create"] + [f"{announce}:{p}" for p in ports] +
              ["--cluster-replicas", "0", "--cluster-yes"]))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all("cluster_state:ok" in info(p) for p in ports):
            return procs, ports
        time.sleep(0.1)
    for p in procs:
        p.kill()
    raise RuntimeError("the redis cluster did not form")


def engines(args, urls, net):
    """Run the N shards at once, shard i against urls[i]: their JSON reports."""
    procs = []
    for i, url in enumerate(urls):
        cmd = [args.bench] + args.rest + ["--shard", f"{i}/{args.engines}", "--remote", url,
                                          "--json"]
        if net:
            cmd = ["ip", "netns", "exec", net.ns[i]] + cmd
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    out = []
    for p in procs:
        o, e = p.communicate()
        if p.returncode:
            raise RuntimeError(f"kvtier-bench failed: {e.strip()[-400:]}")
        out.append(json.loads(o))
    return out


def served(j):
    return sum(j["tokens_hit"].values())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=os.path.join(HERE, "..", "..", "build", "tools",
                                                    "kvtier-bench"))
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--netns", action="store_true")
    ap.add_argument("--cluster", action="store_true")
    ap.add_argument("--delay-ms", type=float, default=0)
    ap.add_argument("--maxmemory", help="each server's maxmemory (allkeys-lru), e.g. 2gb")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    args.rest = [a for a in args.rest if a != "--"]
    if args.engines < 1 or not shutil.which("redis-server"):
        ap.error("needs --engines >= 1 and redis-server")
    tmp = tempfile.mkdtemp(prefix="kvt-share-")
    net = servers = None
    try:
        net = Net(args.engines, args.delay_ms) if args.netns else None
        bind = [net.addr[i] if net else "127.0.0.1" for i in range(args.engines)]
        srv_ns = net.srv if net else None
        if args.cluster:
            # Shared: one cluster, its nodes announcing the first link's address.
            servers, ports = start_cluster(tmp, srv_ns, bind[0], args.maxmemory)
            seeds = ",".join(f"redis://{bind[0]}:{p}" for p in ports)
            shared = engines(args, [seeds] * args.engines, net)
        else:
            # Shared: one server, listening on every engine's link.
            p, port = start_server(tmp, srv_ns, sorted(set(bind)), args.maxmemory)
            servers = [p]
            shared = engines(args, [f"redis://{b}:{port}" for b in bind], net)
        for p in servers:
            p.kill()
            p.wait()
        # Alone: a server each.
        urls, servers = [], []
        for i in range(args.engines):
            p, port = start_server(tmp, srv_ns, [bind[i]], args.maxmemory)
            servers.append(p)
            urls.append(f"redis://{bind[i]}:{port}")
        alone = engines(args, urls, net)
    finally:
        for p in servers or []:
            p.kill()
            p.wait()
        if net:
            net.close()
        shutil.rmtree(tmp, ignore_errors=True)
    total = sum(j["tokens_total"] for j in shared)
    rows = [(i, served(s) / s["tokens_total"], served(a) / a["tokens_total"],
             s["tokens_hit"]["remote"], a["tokens_hit"]["remote"])
            for i, (s, a) in enumerate(zip(shared, alone))]
    sh, al = sum(served(j) for j in shared), sum(served(j) for j in alone)
    mism = sum(j["verify"]["mismatches"] for j in shared + alone)
    if args.json:
        print(json.dumps({"engines": args.engines, "cluster": args.cluster, "netns": bool(net),
                          "delay_ms": args.delay_ms,
                          "note": net.note if net else "", "tokens_total": total,
                          "shared_served": sh, "alone_served": al, "mismatches": mism,
                          "per_engine": [{"shared": s, "alone": a} for s, a in
                                         zip(shared, alone)]}))
        return 0
    where = ("a 3-master cluster, " if args.cluster else "one server, ") + (
        "network namespaces" if net else "loopback")
    print(f"{args.engines} engines on one workload split {args.engines} ways, sharing {where}"
          + (f", {args.delay_ms} ms each way" if args.delay_ms and not (net and net.note) else ""))
    if net and net.note:
        print(f"  ({net.note})")
    print("engine   served shared   served alone   from the remote: shared   alone")
    for i, s, a, rs, ra in rows:
        print(f"{i:6}   {100 * s:12.2f}%  {100 * a:12.2f}%   {rs:23}   {ra:5}")
    print(f"all      {100 * sh / total:12.2f}%  {100 * al / total:12.2f}%   shared / alone "
          f"{sh / al if al else float('inf'):.2f}x; {mism} mismatches")
    return 1 if mism else 0


if __name__ == "__main__":
    sys.exit(main())
