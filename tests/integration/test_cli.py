#!/usr/bin/python3
"""The numaserve command line: `topology` plans for synthetic machines,
`serve` refuses a missing repository, `infer` talks to a running server,
and unknown options are named."""

import json
import os
import re
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
TIMEOUT_S = 60
ROW = re.compile(r"^\s*\[(\d+)\]((?:\s+[-+0-9.eE]+){10})\b")


def run(*args, timeout=TIMEOUT_S):
    return nc.run_numaserve(args, timeout=timeout)


describe = nc.describe_run


class TopologyTest(unittest.TestCase):

    def plan(self, *args):
        args = ("topology",) + args + ("--json",)
        result = run(*args)
        self.assertEqual(result.returncode, 0, describe(args, result))
        try:
            return json.loads(result.stdout)
        except ValueError as e:
            self.fail("--json output is not JSON (%s)\n%s" % (e, describe(args, result)))

    def test_two_sockets_no_smt(self):
        shape = "package:2 numa:1 core:8 pu:2"
        plan = self.plan("--topology", shape)
        what = "numaserve topology --topology %r --json" % shape
        workers = plan["plan"]["workers"]
        self.assertEqual(len(workers), 2, "%s: workers %s" % (what, workers))
        self.assertEqual(sorted(w["numa_node"] for w in workers), [0, 1], what)
        seen = set()
        for w in workers:
            cpus = w["cpus"]
            self.assertEqual(len(cpus), 8, "%s: worker %s cpus %s" % (what, w["index"], cpus))
            # pu:2 numbers the PUs of core c as 2c and 2c+1: one PU per core,
            # the first, and never its SMT sibling.
            self.assertTrue(all(c % 2 == 0 for c in cpus),
                            "%s: worker %s has an SMT sibling in %s" % (what, w["index"], cpus))
            self.assertEqual(w["env"]["OMP_NUM_THREADS"], "8", "%s: worker %s env %s"
                             % (what, w["index"], w["env"]))
            self.assertEqual(w["num_threads"], 8, what)
            shared = seen & set(cpus)
            self.assertFalse(shared, "%s: workers share cpus %s" % (what, shared))
            seen |= set(cpus)
        # Each worker's cpus lie on its own NUMA node.
        nodes = {n["os_index"]: set(n["cpus"]) for n in plan["topology"]["numa_nodes"]}
        for w in workers:
            self.assertTrue(set(w["cpus"]) <= nodes[w["numa_node"]],
                            "%s: worker %s cpus %s not on node %s" % (
                                what, w["index"], w["cpus"], w["numa_node"]))

    def test_two_sockets_text(self):
        args = ("topology", "--topology", "package:2 numa:1 core:8 pu:2")
        result = run(*args)
        self.assertEqual(result.returncode, 0, describe(args, result))
        self.assertEqual(result.stdout.count("OMP_NUM_THREADS=8"), 2, describe(args, result))
        self.assertIn("2 workers", result.stdout, describe(args, result))
        self.assertIn("0,2,4,6,8,10,12,14", result.stdout, describe(args, result))

    def test_l3_domains(self):
        shape = "package:1 l3:8 core:8 pu:2"
        plan = self.plan("--topology", shape, "--domain", "l3")
        what = "numaserve topology --topology %r --domain l3 --json" % shape
        workers = plan["plan"]["workers"]
        self.assertEqual(len(workers), 8, "%s: %d workers" % (what, len(workers)))
        all_cpus = [c for w in workers for c in w["cpus"]]
        self.assertEqual(len(all_cpus), len(set(all_cpus)), "%s: workers share cpus" % what)
        for w in workers:
            self.assertEqual(len(w["cpus"]), 8, "%s: worker %s" % (what, w["index"]))
            self.assertTrue(all(c % 2 == 0 for c in w["cpus"]), "%s: worker %s cpus %s"
                            % (what, w["index"], w["cpus"]))


class ServeCommandTest(unittest.TestCase):

    def test_missing_repository(self):
        path = "/nonexistent/numaserve-models"
        args = ("serve", "--model-repository", path, "--grpc-port", "0", "--metrics-port", "0")
        result = run(*args)
        self.assertNotEqual(result.returncode, 0, describe(args, result))
        self.assertIn(path, result.stderr, describe(args, result))
        self.assertNotIn("grpc=", result.stdout, describe(args, result))


class UsageTest(unittest.TestCase):

    def test_unknown_option(self):
        for command in ("serve", "infer", "topology"):
            with self.subTest(command=command):
                args = (command, "--frobnicate")
                result = run(*args)
                self.assertNotEqual(result.returncode, 0, describe(args, result))
                self.assertIn("--frobnicate", result.stderr, describe(args, result))

    def test_unknown_command(self):
        args = ("frobnicate",)
        result = run(*args)
        self.assertNotEqual(result.returncode, 0, describe(args, result))
        self.assertIn("frobnicate", result.stderr, describe(args, result))

    def test_help(self):
        args = ("--help",)
        result = run(*args)
        self.assertEqual(result.returncode, 0, describe(args, result))
        for command in ("serve", "topology", "infer"):
            self.assertIn(command, result.stdout, describe(args, result))


class InferCommandTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_cli_")
        cls.reference = nc.ReferenceModel(nc.write_default_model(cls.repo))
        cls.server = nc.ServerProcess(cls.repo).start()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def infer(self, *extra):
        args = ("infer", "--model", MODEL, "--url", self.server.grpc_address) + extra
        result = run(*args)
        self.assertEqual(result.returncode, 0, describe(args, result)
                         + "\n--- server stderr ---\n" + self.server.stderr_text(4000))
        return result, describe(args, result)

    def test_default_input(self):
        result, what = self.infer()
        self.assertIn("probabilities", result.stdout, what)
        self.assertIn("[1,10]", result.stdout.replace(" ", ""), what)

    def test_random_input_with_shape(self):
        result, what = self.infer("--input", "image=4,1,28,28:random", "--seed", "3")
        self.assertIn("probabilities", result.stdout, what)
        self.assertIn("[4,10]", result.stdout.replace(" ", ""), what)

    def test_npy_input(self):
        images = nc.random_images(3, seed=31)
        path = os.path.join(self.repo, "images.npy")
        np.save(path, images)
        result, what = self.infer("--input", "image=" + path)
        self.assertIn("probabilities", result.stdout, what)
        self.assertIn("[3,10]", result.stdout.replace(" ", ""), what)
        # The printed rows are the model's outputs for the file's images.
        rows = {}
        for line in result.stdout.splitlines():
            match = ROW.match(line)
            if match:
                rows[int(match.group(1))] = [float(v) for v in match.group(2).split()]
        self.assertEqual(sorted(rows), [0, 1, 2], "printed rows of probabilities; " + what)
        expected = self.reference.run({"image": images})["probabilities"]
        np.testing.assert_allclose(np.array([rows[i] for i in range(3)]), expected,
                                   rtol=0, atol=2e-4, err_msg=what)

    def test_missing_npy_file(self):
        path = os.path.join(self.repo, "does_not_exist.npy")
        args = ("infer", "--model", MODEL, "--url", self.server.grpc_address,
                "--input", "image=" + path)
        result = run(*args)
        self.assertNotEqual(result.returncode, 0, describe(args, result))
        self.assertIn(path, result.stderr, describe(args, result))

    def test_unknown_model(self):
        args = ("infer", "--model", "no_such_model", "--url", self.server.grpc_address)
        result = run(*args)
        self.assertNotEqual(result.returncode, 0, describe(args, result))
        self.assertIn("no_such_model", result.stderr, describe(args, result))

    def test_no_server(self):
        # A port nobody listens on: fails fast, within the request deadline.
        args = ("infer", "--model", MODEL, "--url", "127.0.0.1:1", "--timeout-ms", "5000")
        result = run(*args, timeout=30)
        self.assertNotEqual(result.returncode, 0, describe(args, result))


if __name__ == "__main__":
    unittest.main()
