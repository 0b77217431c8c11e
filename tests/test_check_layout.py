#!/usr/bin/env python3
"""The layout check can fail: check_layout.py run on copies of src/, tools/ and include/ with a
circle added. usage: test_check_layout.py REPO_ROOT

  - the copy as it is: rule 9 ok, "circles: none";
  - a call circle in src/, one in tools/ and one inside tools/ctl/: a file that another .c
    already calls (one of the arrows the check found) gets a function calling back into it;
  - an include circle: a header that another header includes includes it back.
Each must turn rule 9 BROKEN, the exit status 1, and name both files of the circle.
And rule 10: engine.c calling a device allocator itself, not through the slot layer, must turn
it BROKEN and name the call.
"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_layout  # noqa: E402

CHECK = os.path.join(HERE, "check_layout.py")
failures = []


def check(ok, what):
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    if not ok:
        failures.append(what)


def run(root):
    r = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def verdict_of(out, rule=9):
    """A rule's verdict line (rule 9's by default) and the lines it printed under it."""
    lines = out.split("\n")
    start = next(i for i, l in enumerate(lines) if l.startswith(f"rule {rule} "))
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].startswith("    ")),
               len(lines))
    return lines[start], "\n".join(lines[start + 1:end])


def copy(src_root, dst):
    for top in ("src", "tools", "include"):
        shutil.copytree(os.path.join(src_root, top), os.path.join(dst, top))


def callable_names(root, f):
    """The functions f defines that another file may call."""
    return sorted(n for n in check_layout.all_definitions(root, [f]) if n != "main")


def arrow(root, graph, top, kind):
    """The first arrow a -> b of the graph with both files under top, b named by kind: "call"
    (b a .c whose function a calls, a defining a function b can call back) or "include" (a and
    b headers, a including b)."""
    for a in sorted(graph):
        for b, why in sorted(graph[a].items()):
            if not (a.startswith(top) and b.startswith(top)):
                continue
            if kind == "call" and a.endswith(".c") and b.endswith(".c") and \
                    not why.startswith("#include") and callable_names(root, a):
                return a, b, why
            if kind == "include" and a.endswith(".h") and b.endswith(".h"):
                return a, b, why
    return None


def add_call_back(root, a, b):
    """A function in b calling one a defines: with a -> b, a circle of two files."""
    name = callable_names(root, a)[0]
    with open(os.path.join(root, b), "a") as f:
        f.write(f"\nvoid layout_test_circle(void)\n{{\n    {name}();\n}}\n")
    return name


def add_include_back(root, a, b):
    """b includes a back: with a including b, a circle of two headers."""
    rel = os.path.relpath(os.path.join(root, a), os.path.dirname(os.path.join(root, b)))
    with open(os.path.join(root, b), "a") as f:
        f.write(f'\n#include "{rel}"\n')


def case(repo, what, mutate):
    tmp = tempfile.mkdtemp(prefix="kvtier-layout-")
    try:
        copy(repo, tmp)
        files = check_layout.sources(tmp) + check_layout.sources(tmp, "tools")
        graph = check_layout.file_graph(tmp, files)
        names = mutate(tmp, graph)
        rc, out = run(tmp)
        verdict, detail = verdict_of(out)
        if names is None:
            check(rc == 0 and verdict.endswith(": ok") and "circles: none" in out,
                  f"{what}: rule 9 ok, circles: none (exit {rc})")
            return
        a, b = names
        check(rc == 1, f"{what}: exit status 1 (got {rc})")
        check(verdict.endswith(": BROKEN"), f"{what}: rule 9 BROKEN ({verdict})")
        check(a in detail and b in detail, f"{what}: the circle names {a} and {b}:\n{detail}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    repo = os.path.abspath(sys.argv[1])

    case(repo, "the tree as it is", lambda root, g: None)

    def call_circle(top):
        def mutate(root, graph):
            a, b, why = arrow(root, graph, top, "call")
            name = add_call_back(root, a, b)
            print(f"     {a} calls {why} in {b}; {b} now calls {name} back")
            return a, b
        return mutate

    case(repo, "a call circle in src/", call_circle("src/"))
    case(repo, "a call circle in tools/", call_circle("tools/"))
    case(repo, "a call circle inside kvtier-ctl", call_circle("tools/ctl/"))

    def include_circle(root, graph):
        a, b, why = arrow(root, graph, "src/", "include")
        add_include_back(root, a, b)
        print(f"     {a} has {why}; {b} now includes {a} back")
        return a, b

    case(repo, "an include circle in src/", include_circle)

    tmp = tempfile.mkdtemp(prefix="kvtier-layout-")
    try:
        copy(repo, tmp)
        with open(os.path.join(tmp, "src/engine/engine.c"), "a") as f:
            f.write("\nsize_t layout_test_bypass(const struct slot_alloc *a)\n{\n"
                    "    return slot_available(a);\n}\n")
        rc, out = run(tmp)
        verdict, detail = verdict_of(out, 10)
        check(rc == 1 and verdict.endswith(": BROKEN") and "slot_available" in detail,
              f"engine.c calling slot_available itself: rule 10 BROKEN (exit {rc}):\n{detail}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
