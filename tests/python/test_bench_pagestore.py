"""tools/bench/bench_pagestore.py runs (tiny), checks what it read back, and reports both paths."""

import json
import os
import subprocess
import sys
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
C_BENCH = os.path.join(ROOT, "build", "tools", "kvtier-pagestore-bench")


class BenchPagestore(unittest.TestCase):
    @unittest.skipUnless(os.access(C_BENCH, os.X_OK), "build/tools/kvtier-pagestore-bench not built")
    def test_tiny_run(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "bench", "bench_pagestore.py"),
                            "--c-bench", C_BENCH, "--pages", "64", "--batch", "16",
                            "--page-bytes", "8192", "--reps", "1", "--json"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        for side in ("c", "python"):
            for op in ("set", "get"):
                self.assertGreater(out[side][op]["pages_per_s"], 0)
        self.assertEqual(set(out["ratio"]), {"set", "get"})
        self.assertEqual(out["config"]["batch"], 16)


if __name__ == "__main__":
    unittest.main()
