#!/usr/bin/python3
"""`numaserve profile`: every compiled step against the roofline, as JSON,
with a Chrome trace holding one complete event per step per run; bad input
gets an error naming the flag or file."""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

STEP_FIELDS = ("index", "kind", "step", "implementation", "precision", "threads", "calls", "ms",
               "share", "flops", "bytes", "intensity", "gflops", "gb_per_second", "peak_gflops",
               "bound_gflops", "bound", "fraction")


def run(*args, timeout=120):
    return nc.run_numaserve(args, timeout=timeout)


class ProfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="numaserve_profile_")
        # x[batch,64] -> 3 x (MatMul W -> Add b -> Relu) -> y: 3 matmul steps.
        cls.model = nc.write_model(cls.tmp.name, "mlp", nc.deep_mlp_model(width=64, layers=3))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_json_and_trace(self):
        trace = os.path.join(self.tmp.name, "trace.json")
        args = ("profile", "--model", self.model, "--batch", "4", "--threads", "1",
                "--seconds", "0.2", "--json", "--trace", trace)
        result = run(*args)
        what = nc.describe_run(args, result)
        self.assertEqual(result.returncode, 0, what)
        report = json.loads(result.stdout)
        self.assertEqual(report["batch"], 4, what)
        self.assertEqual(report["threads"], 1, what)
        runs = report["runs"]
        self.assertGreaterEqual(runs, 5, what)
        limits = report["limits"]
        self.assertGreater(limits["fp32_gflops_per_core"], 0, what)
        self.assertGreater(limits["memory_gb_per_second"], 0, what)
        self.assertLess(limits["memory_gb_per_second"], 10000, what)
        steps = report["steps"]
        self.assertGreaterEqual(len(steps), 3, what)
        for step in steps:
            for field in STEP_FIELDS:
                self.assertIn(field, step, what)
            self.assertEqual(step["calls"], runs, what)
            self.assertIn(step["bound"], ("compute", "memory"), what)
        matmuls = [s for s in steps if s["kind"] == "matmul"]
        self.assertEqual(len(matmuls), 3, what)
        for s in matmuls:
            # 4 rows x 64 x 64, x2; x, W and b read, y written, floats.
            self.assertAlmostEqual(s["flops"], 2 * 4 * 64 * 64, delta=1, msg=what)
            self.assertAlmostEqual(s["bytes"], 4 * (4 * 64 + 64 * 64 + 64 + 4 * 64), delta=1,
                                   msg=what)
            self.assertAlmostEqual(s["intensity"], s["flops"] / s["bytes"], delta=1e-3, msg=what)
            self.assertGreater(s["bound_gflops"], 0, what)
            self.assertLessEqual(s["bound_gflops"], s["peak_gflops"] * 1.0001, what)
        # Sorted by time, costliest first.
        times = [s["ms"] for s in steps]
        self.assertEqual(times, sorted(times, reverse=True), what)
        totals = report["totals"]
        self.assertAlmostEqual(totals["ms"], sum(times), delta=1e-3 * max(1, totals["ms"]),
                               msg=what)
        self.assertAlmostEqual(totals["flops"], sum(s["flops"] for s in steps), delta=1, msg=what)

        with open(trace) as f:
            chrome = json.load(f)
        events = [e for e in chrome["traceEvents"] if e.get("ph") == "X"]
        # Every run is traced up to ~100000 events (this model runs tens of
        # thousands of times a second): the first `runs` of them, whole.
        traced_runs = report["trace"]["runs"]
        self.assertGreaterEqual(traced_runs, 5, what)
        self.assertLessEqual(traced_runs, runs, what)
        if runs * len(steps) <= 100000:
            self.assertEqual(traced_runs, runs, what)
        self.assertEqual(report["trace"]["events"], len(events), what)
        self.assertEqual(len(events), len(steps) * traced_runs, what)
        per_step = {}
        for e in events:
            for field in ("name", "ts", "dur", "pid", "tid", "args"):
                self.assertIn(field, e, what)
            self.assertGreaterEqual(e["dur"], 0, what)
            for field in ("index", "kind", "implementation", "run"):
                self.assertIn(field, e["args"], what)
            per_step.setdefault(e["args"]["index"], set()).add(e["args"]["run"])
        self.assertEqual(sorted(per_step), sorted(s["index"] for s in steps), what)
        for index, seen in per_step.items():
            self.assertEqual(seen, set(range(traced_runs)), "step %d: %s" % (index, what))

    def test_text(self):
        args = ("profile", "--model", self.model, "--batch", "2", "--seconds", "0.1")
        result = run(*args)
        what = nc.describe_run(args, result)
        self.assertEqual(result.returncode, 0, what)
        self.assertIn("limits: fp32", result.stdout, what)
        self.assertIn("GB/s", result.stdout, what)
        self.assertIn("matmul", result.stdout, what)
        self.assertIn("total", result.stdout, what)

    def test_advise(self):
        args = ("profile", "--model", self.model, "--advise", "--p99-ms", "1000",
                "--max-batch", "4", "--seconds", "0.05", "--threads", "1", "--json")
        result = run(*args)
        what = nc.describe_run(args, result)
        self.assertEqual(result.returncode, 0, what)
        report = json.loads(result.stdout)
        self.assertEqual([b["batch"] for b in report["batches"]], [1, 2, 4], what)
        for b in report["batches"]:
            self.assertGreater(b["mean_ms"], 0, what)
            self.assertGreaterEqual(b["p99_ms"], 0, what)
        advice = report["advice"]
        self.assertTrue(advice["target_met"], what)
        self.assertIn(advice["max_batch_size"], (1, 2, 4), what)
        self.assertGreaterEqual(advice["max_queue_delay_microseconds"], 0, what)
        self.assertTrue(advice["reasons"], what)
        self.expect_error(("profile", "--model", self.model, "--advise"), "--p99-ms")

    def expect_error(self, args, *fragments):
        result = run(*args)
        what = nc.describe_run(args, result)
        self.assertNotEqual(result.returncode, 0, what)
        self.assertNotIn("Traceback", result.stderr, what)
        self.assertLess(result.returncode, 128, "crashed: " + what)
        for fragment in fragments:
            self.assertIn(fragment, result.stderr, what)

    def test_missing_model(self):
        missing = os.path.join(self.tmp.name, "missing.onnx")
        self.expect_error(("profile", "--model", missing), missing)

    def test_bad_batch(self):
        self.expect_error(("profile", "--model", self.model, "--batch", "0"), "--batch")
        self.expect_error(("profile", "--model", self.model, "--batch", "-3"), "--batch")
        # No batch size at all (only separators): refused, not run on nothing.
        for command in ("profile", "bench"):
            self.expect_error((command, "--model", self.model, "--batch", ","), "--batch")
        self.expect_error(("bench", "--model", self.model, "--batch", "x"), "--batch", "'x'")
        # Buffers beyond the engine's tensor limit: an error naming the
        # batch, not an allocation failure.
        for command in ("profile", "bench"):
            self.expect_error((command, "--model", self.model, "--batch", "100000000000",
                               "--seconds", "0.1"), "batch 100000000000", "exceeds the limit")

    def test_bad_index_bounds(self):
        # --index-bounds: name=bound pairs, each bound >= 1, each an integer
        # input of the model (the MLP's one input is FP32).
        for bad in ("x", "x=0", "=4", "x=four"):
            self.expect_error(("bench", "--model", self.model, "--index-bounds", bad),
                              "--index-bounds", "'%s'" % bad)
        self.expect_error(("bench", "--model", self.model, "--batch", "1", "--seconds", "0.05",
                           "--index-bounds", "x=4"), "'x'", "no integer input")

    def test_unwritable_trace(self):
        bad = os.path.join(self.tmp.name, "no_such_dir", "trace.json")
        self.expect_error(("profile", "--model", self.model, "--trace", bad), "--trace", bad)

    def test_no_model(self):
        self.expect_error(("profile",), "--model")


class TopologyMeasureTest(unittest.TestCase):

    def test_limits_json(self):
        args = ("topology", "--measure", "--json")
        result = run(*args)
        what = nc.describe_run(args, result)
        self.assertEqual(result.returncode, 0, what)
        report = json.loads(result.stdout)
        limits = report["limits"]
        per_core = limits["peak_per_core"]
        self.assertGreater(per_core["fp32_gflops"], 0, what)
        workers = report["plan"]["workers"]
        self.assertEqual(len(limits["workers"]), len(workers), what)
        for w in limits["workers"]:
            self.assertGreater(w["cores"], 0, what)
            self.assertAlmostEqual(w["fp32_gflops"], w["cores"] * per_core["fp32_gflops"],
                                   delta=1e-3 * w["fp32_gflops"], msg=what)
        nodes = limits["memory_bandwidth"]
        self.assertEqual(len(nodes), max(1, len(report["topology"]["numa_nodes"])), what)
        for n in nodes:
            self.assertGreater(n["gb_per_second"], 0, what)
            self.assertLess(n["gb_per_second"], 10000, what)
            self.assertEqual(n["threads"], len(n["cpus"]), what)

    def test_refuses_a_described_machine(self):
        args = ("topology", "--measure", "--topology", "package:2 numa:1 core:4 pu:1")
        result = run(*args)
        self.assertEqual(result.returncode, 1, nc.describe_run(args, result))
        self.assertIn("--measure", result.stderr, nc.describe_run(args, result))


if __name__ == "__main__":
    unittest.main()
