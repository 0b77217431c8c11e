"""What the integration scripts share: checks that raise Failure, a program run and its
report, the case registry, and the runner that prints one line a case (PASS, FAIL, SKIP, or
XFAIL and XPASS for a case marked with a known bug) and a summary; and a redis-server of a
test's own for the remote tier's cases.

A case raises Skip to say why it cannot run here. KVT_STRICT=1 in the environment makes an
XFAIL count as a failure.
"""
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time


class Failure(Exception):
    pass


class Skip(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def eq(got, want, what):
    if got != want:
        raise Failure(f"{what}: expected {want!r}, got {got!r}")


def close(got, want, what, rel=1e-3, abs_=1e-12):
    check(isinstance(got, (int, float)) and math.isfinite(got), f"{what}: {got!r} is not finite")
    if abs(got - want) > max(abs_, rel * abs(want)):
        raise Failure(f"{what}: expected about {want!r}, got {got!r}")


def positive(x, what):
    check(isinstance(x, (int, float)) and not isinstance(x, bool), f"{what}: {x!r} is no number")
    check(math.isfinite(x) and x > 0, f"{what}: {x!r} is not positive and finite")


def has_keys(obj, keys, what):
    check(isinstance(obj, dict), f"{what} is not an object: {obj!r}")
    missing = [k for k in keys if k not in obj]
    check(not missing, f"{what} lacks {missing}: {obj!r}")


def has_types(obj, types, what):
    """obj has every key of types, each value of its type (a bool is no int)."""
    has_keys(obj, types, what)
    for k, ty in types.items():
        check(isinstance(obj[k], ty) and not (ty is int and isinstance(obj[k], bool)),
              f"{what}.{k}: {obj[k]!r} is not {ty}")


# ---- running a program ----


class Result:
    """Runs the program at path (called name in messages) with args, stdin empty, and keeps
    its exit status and output; running past timeout seconds is a Failure."""
    shown = 600  # characters of stdout and of stderr that where() quotes

    def __init__(self, name, path, args, timeout):
        self.name = name
        self.args = [str(a) for a in args]
        try:
            proc = subprocess.run([path] + self.args, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise Failure(f"{name} {' '.join(self.args)} ran past {timeout} s")
        self.rc = proc.returncode
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")

    def where(self):
        n = self.shown
        return (f"\n    command: {self.name} {' '.join(self.args)}\n    exit {self.rc}"
                f"\n    stdout: {self.out[:n]!r}\n    stderr: {self.err[:n]!r}")

    def json(self):
        lines = self.out.splitlines()
        check(len(lines) == 1, f"--json should print exactly one line{self.where()}")
        try:
            j = json.loads(lines[0])
        except ValueError as e:
            raise Failure(f"stdout is not JSON ({e}){self.where()}")
        check(isinstance(j, dict), f"JSON is not an object{self.where()}")
        return j


def program_arg(script, what):
    """The path of the one program script tests, its only argument; None, once the reason is
    printed, when the command line does not name an executable."""
    if len(sys.argv) != 2:
        print(f"usage: {script} {what}", file=sys.stderr)
        return None
    path = os.path.abspath(sys.argv[1])
    if not os.access(path, os.X_OK):
        print(f"{script}: {path} is not an executable", file=sys.stderr)
        return None
    return path


# ---- the cases ----

CASES = []


def start_redis(tmp):
    """A redis-server of our own on a free loopback port, its data dir in tmp, no
    persistence: (process, port) once it accepts connections; Skip without one."""
    exe = shutil.which("redis-server")
    if not exe:
        raise Skip("redis-server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = os.path.join(tmp, f"redis-{port}")
    os.makedirs(d, exist_ok=True)
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", d], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    p.kill()
    p.wait()
    raise Failure("redis-server did not come up")


def make_test_certs(d):
    """A CA of the test's own, a server certificate it signed (subjectAltName DNS:localhost and
    IP:127.0.0.1), a client certificate it signed, and another CA that signed nothing, as PEM
    files in d (ca.crt, server.crt/.key, client.crt/.key, other-ca.crt); Skip without
    openssl(1)."""
    if not shutil.which("openssl"):
        raise Skip("openssl is not installed")
    k = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def ossl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)

    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for ca in ("ca", "other-ca"):
        ossl("req", "-x509", *k, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2",
             "-subj", f"/CN=kvtier-test-{ca}")
    for who, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        ossl("req", *k, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}")
        ossl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{who}.crt", "-days", "2", *ext)
    return {name: os.path.join(d, name) for name in
            ("ca.crt", "other-ca.crt", "client.crt", "client.key")}


def start_redis_tls(tmp, auth_clients=False):
    """A redis-server of our own that also speaks TLS: (process, plain port, TLS port, the
    files of make_test_certs) once its plain port accepts connections; Skip without
    redis-server or openssl."""
    exe = shutil.which("redis-server")
    if not exe:
        raise Skip("redis-server is not installed")
    port, tls_port = _free_ports(2)
    d = os.path.join(tmp, f"redis-tls-{tls_port}")
    os.makedirs(d, exist_ok=True)
    files = make_test_certs(d)
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", d, "--tls-port", str(tls_port),
                          "--tls-cert-file", os.path.join(d, "server.crt"),
                          "--tls-key-file", os.path.join(d, "server.key"),
                          "--tls-ca-cert-file", os.path.join(d, "ca.crt"),
                          "--tls-auth-clients", "yes" if auth_clients else "no"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return p, port, tls_port, files
        except OSError:
            time.sleep(0.05)
    p.kill()
    p.wait()
    raise Failure("redis-server (TLS) did not come up")


def _free_ports(n):
    """n loopback ports the kernel calls free now, all different."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_redis_cluster(tmp, masters=3):
    """A Redis Cluster of our own: masters redis-servers in cluster mode on free loopback
    ports (their buses on free ports too), data dirs in tmp, no persistence, formed with
    `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`: (processes, ports)
    once every node says cluster_state:ok; Skip without redis-server or redis-cli."""
    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if not exe or not cli:
        raise Skip("redis-server or redis-cli is not installed")
    ports = _free_ports(2 * masters)
    procs = []
    for port, bus in zip(ports[:masters], ports[masters:]):
        d = os.path.join(tmp, f"redis-cluster-{port}")
        os.makedirs(d, exist_ok=True)
        procs.append(subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", d, "--cluster-enabled", "yes", "--cluster-port", str(bus),
             "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
             "--cluster-require-full-coverage", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    ports = ports[:masters]

    def stop():
        for p in procs:
            p.kill()
            p.wait()

    def info(port):
        r = subprocess.run([cli, "-p", str(port), "cluster", "info"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, timeout=10)
        return r.stdout.decode()

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any("cluster_state" not in info(p) for p in ports):
        time.sleep(0.05)
    r = subprocess.run([cli, "--cluster", "create"] + [f"127.0.0.1:{p}" for p in ports] +
                       ["--cluster-replicas", "0", "--cluster-yes"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    deadline = time.monotonic() + 20
    while r.returncode == 0 and time.monotonic() < deadline:
        if all("cluster_state:ok" in info(p) for p in ports):
            return procs, ports
        time.sleep(0.1)
    stop()
    raise Failure(f"redis cluster did not form: {r.stdout.decode()[-400:]!r}")


def case(name, known_bug=None):
    def register(fn):
        CASES.append((name, fn, known_bug))
        return fn
    return register


def run_case(fn):
    """None when fn passes, else what went wrong; Skip passes through."""
    try:
        fn()
    except Failure as e:
        return str(e)
    except Skip:
        raise
    except Exception as e:  # a bug in the test, or output of an unexpected shape
        return f"{type(e).__name__}: {e}"
    return None


def run_cases(only=None):
    """Runs every case (those whose name holds only, when given), one line each; returns the
    names that failed and those that failed with a known bug."""
    strict = os.environ.get("KVT_STRICT") == "1"
    failed, xfailed = [], []
    SKIPPED.clear()
    for name, fn, known_bug in CASES:
        if only and only not in name:
            continue
        t = time.monotonic()
        try:
            err = run_case(fn)
        except Skip as e:
            print(f"SKIP  {name}: {e}", flush=True)
            SKIPPED.append(name)
            continue
        took = f"({time.monotonic() - t:.2f} s)"
        if known_bug and err:
            xfailed.append(name)
            print(f"XFAIL {name} {took}: known bug: {known_bug}\n    {err}", flush=True)
            if strict:
                failed.append(name)
        elif known_bug:
            print(f"XPASS {name} {took}: fixed? drop its known_bug marker", flush=True)
        elif err:
            failed.append(name)
            print(f"FAIL  {name} {took}: {err}", flush=True)
        else:
            print(f"PASS  {name} {took}", flush=True)
    return failed, xfailed


SKIPPED = []  # the cases the last run_cases skipped


def summary(failed, t0, note=""):
    """Prints the counts (a skipped case is not a passed one) and the failed names; the
    script's exit status."""
    skipped = f", {len(SKIPPED)} skipped" if SKIPPED else ""
    print(f"{len(CASES) - len(failed) - len(SKIPPED)}/{len(CASES)} cases passed{skipped}{note} in "
          f"{time.monotonic() - t0:.1f} s")
    for name in failed:
        print(f"failed: {name}")
    return 1 if failed else 0
