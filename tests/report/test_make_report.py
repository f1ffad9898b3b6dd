#!/usr/bin/python3
"""`make report`'s script in its short form: benchmarks/report/make_report.py
--quick on the MLP only, into a temporary directory, against the built
binaries; the Markdown and every plot it names must be there, the plots
valid PNGs.

  NUMASERVE_BUILD_DIR=build/release /usr/bin/python3 tests/report/test_make_report.py -v

Exits 77 (ctest's SKIP_RETURN_CODE for this test, shown as "Skipped") after
saying why when python3-matplotlib is missing; deploy/install-deps.sh, which
`make test` runs first, installs it.
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD_DIR = os.environ.get("NUMASERVE_BUILD_DIR") or os.path.join(SOURCE_DIR, "build", "release")
MODELS_DIR = os.environ.get("NUMASERVE_BENCHMARK_MODELS_DIR") or os.path.join(
    SOURCE_DIR, "benchmarks", "models", "out")
SCRIPT = os.path.join(SOURCE_DIR, "benchmarks", "report", "make_report.py")
SKIP = 77
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    """(width, height) from a PNG's IHDR, or None if it is not a PNG."""
    with open(path, "rb") as f:
        head = f.read(33)
    if len(head) < 33 or head[:8] != PNG_SIGNATURE or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


class MakeReportTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="numaserve-report-test-")
        cls.out = cls.tmp.name
        cls.result = subprocess.run(
            [sys.executable, SCRIPT, "--quick", "--out", cls.out, "--build", BUILD_DIR,
             "--models-dir", MODELS_DIR, "--models", "mlp", "--seconds", "0.05"],
            capture_output=True, text=True, timeout=240)
        sys.stderr.write(cls.result.stderr[-4000:])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_exits_zero(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr[-2000:])

    def test_markdown_has_the_header(self):
        path = os.path.join(self.out, "README.md")
        self.assertTrue(os.path.isfile(path))
        with open(path) as f:
            text = f.read()
        self.assertIn("# numaserve performance report", text)
        self.assertRegex(text, r"- date: \d{4}-\d\d-\d\d")
        self.assertIn("Model name:", text)
        self.assertRegex(text, r"- cores: \d+")
        self.assertRegex(text, r"- numaserve commit: [0-9a-f]{4,}")
        for title in ("Throughput against batch size", "Throughput against threads",
                      "Served latency under load", "Throughput against workers and instances",
                      "Roofline"):
            self.assertIn(title, text)

    def test_every_plot_is_a_png(self):
        with open(os.path.join(self.out, "README.md")) as f:
            images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", f.read())
        expected = {"throughput_vs_batch.png", "throughput_vs_threads.png", "latency_cdf.png",
                    "throughput_vs_layout.png", "roofline.png"}
        self.assertEqual(set(images), expected)
        for name in images:
            path = os.path.join(self.out, name)
            self.assertTrue(os.path.isfile(path), name)
            size = png_size(path)
            self.assertIsNotNone(size, f"{name} is not a PNG")
            self.assertGreater(size[0], 100, name)
            self.assertGreater(size[1], 100, name)
            self.assertGreater(os.path.getsize(path), 1000, name)

    def test_data_has_every_section(self):
        with open(os.path.join(self.out, "data.json")) as f:
            data = json.load(f)
        self.assertIn("mlp", data["in_process"]["batch"])
        self.assertTrue(data["in_process"]["batch"]["mlp"]["numaserve"])
        self.assertTrue(data["served"]["runs"])
        self.assertTrue(data["layouts"]["rows"])
        self.assertTrue(data["profile"]["runs"])
        self.assertTrue(data["limits"]["fp32_gflops_per_core"])
        # GEMM shapes on the roofline: FLOPs 2MKN and bytes 4(MK + KN + MN).
        shapes = [(g["m"], g["k"], g["n"]) for g in data["gemm_shapes"]]
        self.assertEqual(shapes, [(1, 64, 64), (32, 256, 256)])
        for g in data["gemm_shapes"]:
            m, k, n = g["m"], g["k"], g["n"]
            self.assertEqual(g["flops"], 2 * m * k * n, g)
            self.assertEqual(g["bytes"], 4 * (m * k + k * n + m * n), g)
            self.assertGreater(g["gflops"], 0, g)


if __name__ == "__main__":
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"\n*** SKIPPED: python3-matplotlib is not installed ({e}); "
              "deploy/install-deps.sh installs it (make test runs it first)\n", flush=True)
        # Under CI=true a missing prerequisite fails (tests/clients/prerequisites.py).
        sys.exit(1 if os.environ.get("CI", "").lower() == "true" else SKIP)
    unittest.main()
