#!/usr/bin/python3
"""The numaserve command line: `topology` plans for synthetic machines,
`serve` refuses a missing repository and numeric flags outside their
ranges, `infer` talks to a running server, and unknown options are
named."""

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


INT64_MAX = str(2 ** 63 - 1)


class ServeFlagRangeTest(unittest.TestCase):
    """Every numeric `serve` flag has a range: a value outside it stops
    `serve` before anything starts, naming the flag, the range and the
    value (a negative --default-timeout-ms made every request time out; a
    huge one, or a huge --shutdown-timeout, overflowed the clock; sizes
    wrapped when shifted or cast). The ends of the ranges are served."""

    # flag, refused values, the range its error states.
    REFUSED = [
        ("--default-timeout-ms", ("-1", "0", "86400001", INT64_MAX), "between 1 and 86400000"),
        ("--shutdown-timeout", ("-1", "86401", INT64_MAX), "between 0 and 86400 seconds"),
        ("--repository-poll-secs", ("0", "86401", INT64_MAX), "between 1 and 86400"),
        ("--worker-arena-mb", ("0", str(2 ** 44)), "between 1 and 1048576"),
        ("--max-workers", ("-1", str(2 ** 32 + 1)), "between 0 and 65536"),
        ("--grpc-max-message-bytes", ("1023", str(2 ** 31)), "between 1024 and 2147483647"),
        ("--max-queue-size", ("0", str(2 ** 32 + 1)), "between 1 and 2147483647"),
        ("--max-stream-outstanding", ("0", INT64_MAX), "between 1 and 1048576"),
        ("--max-inflight-bytes-mb", ("-1", INT64_MAX), "between 0 and 1073741824"),
        ("--grpc-memory-quota-mb", ("15", INT64_MAX), "between 16 and 1073741824"),
        ("--max-activation-mb", ("-1", str(2 ** 30 + 1), INT64_MAX), "between 0 and 1073741824"),
        ("--grpc-port", ("-1", "65536"), "between 0 and 65535"),
        ("--http-port", ("-2", "65536"), "between -1 and 65535"),
        ("--http-threads", ("0", "65"), "between 1 and 64"),
    ]

    def serve_refused(self, extra, *mentions):
        # No repository: the flags are checked first, so only a refused flag
        # can be what stderr names.
        args = ("serve", "--model-repository", "/nonexistent/numaserve-models",
                "--grpc-port", "0", "--metrics-port", "0") + tuple(extra)
        result = run(*args)
        what = describe(args, result)
        self.assertNotEqual(result.returncode, 0, what)
        self.assertNotIn("grpc=", result.stdout, what)
        self.assertNotIn("/nonexistent/numaserve-models", result.stderr, what)
        for mention in mentions:
            self.assertIn(mention, result.stderr, what)

    def test_values_out_of_range_are_refused_naming_the_flag(self):
        for flag, values, allowed in self.REFUSED:
            for value in values:
                with self.subTest(flag=flag, value=value):
                    self.serve_refused((flag, value), flag + " must be " + allowed,
                                       "got " + value)

    def test_training_limits_out_of_range_are_refused(self):
        with tempfile.TemporaryDirectory(prefix="numaserve_cli_root_") as root:
            training = ("--training-service", "--training-address", "127.0.0.1:0",
                        "--training-root", root)
            for flag, value, allowed in (
                    ("--training-max-ranks", "-1", "between 0 and 65536"),
                    ("--training-max-jobs", str(2 ** 32 + 1), "between 1 and 65536"),
                    ("--training-max-finished-jobs", "-1", "between 0 and 65536"),
                    ("--training-max-config-bytes", INT64_MAX, "between 1 and 1073741824")):
                with self.subTest(flag=flag, value=value):
                    self.serve_refused(training + (flag, value), flag + " must be " + allowed,
                                       "got " + value)

    def test_the_longest_durations_are_served(self):
        repo = tempfile.mkdtemp(prefix="numaserve_cli_ranges_")
        nc.write_default_model(repo)
        server = nc.ServerProcess(repo, ["--default-timeout-ms", "86400000",
                                         "--shutdown-timeout", "86400",
                                         "--model-control-mode", "poll",
                                         "--repository-poll-secs", "86400"])
        try:
            server.start()
            # No client deadline: the request runs under the server's
            # 24-hour default, and is answered.
            out = nc.infer(server.stub(), MODEL, {"image": nc.random_images(2, seed=4)},
                           deadline=None)
            self.assertEqual(out["probabilities"].shape, (2, 10))
        finally:
            nc.stop_server_and_remove(server, repo)  # exits 0 at once: nothing to drain


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
