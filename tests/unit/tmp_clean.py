#!/usr/bin/env python3
"""Run a test program with TMPDIR a fresh dir of its own; afterwards remove that dir, and fail
the run when the program left anything in it, whether it passed or failed: every test removes
what it made (a developer's /tmp, CI's, a second run's must not fill up).

usage: tmp_clean.py PROGRAM [ARG...]    (exit status: the program's; 1 when it passed but left
files; 128 + N when signal N ended it)
"""
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    base = os.environ.get("TMPDIR") or "/tmp"
    tmp = tempfile.mkdtemp(prefix="kvt-unit-", dir=base)
    try:
        rc = subprocess.call(sys.argv[1:], env=dict(os.environ, TMPDIR=tmp))
        left = sorted(os.listdir(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rc < 0:
        rc = 128 - rc
    if left:
        more = f" and {len(left) - 8} more" if len(left) > 8 else ""
        print(f"{os.path.basename(sys.argv[1])} left in TMPDIR (removed now): "
              f"{', '.join(left[:8])}{more}", file=sys.stderr)
        if rc in (0, 77):
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
