#!/usr/bin/python3
"""GEMM backends from the command line and the server: `bench --gemm` and
`serve --gemm` refuse unknown names with the accepted ones; `bench --plan`
names each matmul's backend and `auto` logs and caches its choices; models
served on BLIS (config.pbtxt gemm_backend) and OpenBLAS (serve --gemm, for
a model whose config names none) answer like the NumPy reference. A backend
whose library is missing is skipped with the reason."""

import os
import re
import shutil
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402
import prerequisites  # noqa: E402

PLAN_LINE = re.compile(r"^\s+#\d+\s+(.*) \[([^\]]*)\](  <- REFERENCE implementation)?$")

MODEL = nc.DEFAULT_MODEL_NAME
TIMEOUT_S = 120
RTOL, ATOL = 1e-4, 1e-5


def run(args, env):
    return nc.run_numaserve(args, env=env, timeout=TIMEOUT_S)


describe = nc.describe_run


class GemmBackendsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_gemm_")
        cls.repo = os.path.join(cls.tmp, "models")
        os.makedirs(cls.repo)
        cls.model_path = os.path.realpath(nc.write_default_model(cls.repo))
        cls.cache = os.path.join(cls.tmp, "cache", "gemm_choices.tsv")
        cls.env = dict(os.environ, NUMASERVE_GEMM_CACHE=cls.cache)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def bench(self, *extra):
        args = ("bench", "--model", self.model_path, "--batch", "1,4", "--seconds", "0.05") + extra
        return args, run(args, self.env)

    def skip_for(self, backend, reason):
        """The own GEMM runs on the AVX2 tier only, a machine's tier; BLIS or
        OpenBLAS unavailable is a missing package (a failure under CI=true)."""
        if backend == "numaserve":
            self.skipTest(reason)
        prerequisites.missing(self, reason)

    def unavailable(self, backend):
        """The reason `backend` cannot run here, or None."""
        args, result = self.bench("--gemm", backend)
        match = re.search(r"%s is unavailable: .*" % backend, result.stderr)
        if result.returncode != 0 and match:
            return match.group(0)
        self.assertEqual(result.returncode, 0, describe(args, result))
        return None

    def test_bench_refuses_an_unknown_backend(self):
        args, result = self.bench("--gemm", "bogus")
        self.assertEqual(result.returncode, 2, describe(args, result))
        self.assertIn("numaserve bench: --gemm: gemm backend 'bogus' is not one of onednn, blis, "
                      "openblas, numaserve, auto", result.stderr, describe(args, result))

    def test_serve_refuses_an_unknown_backend(self):
        args = ("serve", "--model-repository", self.repo, "--grpc-port", "0", "--metrics-port",
                "0", "--gemm", "cublas")
        result = run(args, self.env)
        self.assertNotEqual(result.returncode, 0, describe(args, result))
        self.assertIn("--gemm: gemm backend 'cublas' is not one of onednn, blis, openblas, "
                      "numaserve, auto",
                      result.stderr, describe(args, result))

    def test_bench_plan_names_the_backend(self):
        for backend in ("onednn", "blis", "openblas", "numaserve"):
            with self.subTest(backend=backend):
                reason = self.unavailable(backend)
                if reason:
                    self.skip_for(backend, reason)
                args, result = self.bench("--gemm", backend, "--plan")
                self.assertEqual(result.returncode, 0, describe(args, result))
                # "  #0    matmul: fc1+relu1 [blis] [blis sgemv, skx, 1 thread]": the
                # plan line, then what ran it at the first batch size.
                steps = [m.groups() for m in
                         (PLAN_LINE.match(l) for l in result.stdout.splitlines())
                         if m and m.group(1).startswith("matmul: ")]
                self.assertEqual(len(steps), 3, describe(args, result))
                for description, implementation, reference in steps:
                    self.assertIsNone(reference, describe(args, result))
                    if backend == "onednn":
                        self.assertNotIn("[", description, describe(args, result))
                        self.assertFalse(implementation.startswith(("blis", "openblas")),
                                         describe(args, result))
                    else:
                        self.assertTrue(description.endswith("[%s]" % backend),
                                        describe(args, result))
                        # One row (batch 1) runs the library's matrix-vector
                        # product, and numaserve's own.
                        expected = ("numaserve:sgemv avx2" if backend == "numaserve"
                                    else "%s sgemv, " % backend)
                        self.assertTrue(implementation.startswith(expected),
                                        describe(args, result))
                # The libraries and their kernels are listed first.
                self.assertRegex(result.stdout, r"gemm blis: ", describe(args, result))

    def test_auto_logs_and_caches_its_choices(self):
        args, result = self.bench("--gemm", "auto", "--plan")
        self.assertEqual(result.returncode, 0, describe(args, result))
        logged = re.findall(r"numaserve: gemm \S+ K=\d+ N=\d+: .* -> "
                            r"(?:onednn|blis|openblas|numaserve)(; not written to .*)?\n",
                            result.stderr)
        self.assertEqual(len(logged), 3, describe(args, result))
        self.assertEqual(result.stdout.count("[auto: "), 3, describe(args, result))
        # A choice timed while other work held the cpu (other tests run
        # beside this one) says so and is not written; the others are.
        written = sum(1 for unwritten in logged if not unwritten)
        for unwritten in logged:
            if unwritten:
                self.assertRegex(unwritten, r"^; not written to %s: timed while off the cpu "
                                 r"\d+%% of the time" % re.escape(self.cache))
        lines = []
        if os.path.exists(self.cache):
            with open(self.cache) as f:
                lines = f.read().splitlines()
            self.assertTrue(lines[0].startswith("# numaserve gemm choices"), lines)
        self.assertEqual(sum(1 for l in lines if l.startswith(self.model_path + "\t")), written,
                         lines)
        # A second process finds every written choice in the file and times
        # only the others.
        args, result = self.bench("--gemm", "auto", "--plan")
        self.assertEqual(result.returncode, 0, describe(args, result))
        self.assertEqual(result.stderr.count("(cached in %s)" % self.cache), written,
                         describe(args, result))
        self.assertEqual(result.stdout.count(", cached]"), written, describe(args, result))

    def test_served_on_blis_and_openblas(self):
        for backend in ("blis", "openblas"):
            reason = self.unavailable(backend)
            if reason:
                self.skip_for(backend, reason)
        repo = os.path.join(self.tmp, "served")
        shutil.copytree(self.repo, repo)
        # One model names BLIS in its config; the other names nothing and
        # gets serve --gemm openblas.
        shutil.copytree(os.path.join(repo, MODEL), os.path.join(repo, "on_blis"))
        with open(os.path.join(repo, "on_blis", "config.pbtxt"), "w") as f:
            f.write('gemm_backend: "blis"\n')
        reference = nc.ReferenceModel(self.model_path)
        server = nc.ServerProcess(repo, ["--gemm", "openblas"], env=self.env).start()
        try:
            stub = server.stub()
            for model in (MODEL, "on_blis"):
                for batch in (1, 5):
                    images = nc.random_images(batch, seed=batch)
                    got = nc.infer(stub, model, {"image": images})
                    want = reference.run({"image": images})
                    for name, value in want.items():
                        self.assertTrue(
                            np.allclose(got[name], value, rtol=RTOL, atol=ATOL),
                            "%s batch %d output %s: max diff %g\n%s" % (
                                model, batch, name, abs(got[name] - value).max(),
                                server.stderr_text()))
            log = server.stderr_text()
            self.assertRegex(log, r"worker \d+: on_blis\S*: gemm backend blis", log)
            self.assertRegex(log, r"worker \d+: %s\S*: gemm backend openblas" % MODEL, log)
        finally:
            nc.stop_server_and_remove(server, repo)


if __name__ == "__main__":
    unittest.main()
