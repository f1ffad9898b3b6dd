#!/usr/bin/python3
"""Hostile models against the real server: a repository with one good model
and several built to crash or exhaust the server (an initializer claiming
2^40 elements with 16 bytes of data, a Reshape whose target's element count
wraps around int64 to the input's, a Pad with pads of 2^62, a Conv with
stride 0 that made libonnx's shape inference divide by zero, a config.pbtxt
whose default timeout overflows, a model directory whose name holds a
control character). The server starts and stays up, the good model
serves, every bad one is not ready with its reason in RepositoryIndex, in
the error of a request to it and in the server's log, and a hostile model
dropped into the repository while it serves (poll mode) is refused the
same way.

FoldBombTest: a file of a few hundred bytes whose constants fold to 2.5
GiB (Expand of one value to 2^24 floats, a Concat of 40 of those, a
ReduceSum) took the server's front end, which imports every model it
lists, to a peak of 2.6 GiB at start-up. Now constant folding has a budget
per model: the bomb is unavailable naming the node and the budget, and the
front end's peak resident set stays near a server's without it."""

import os
import shutil
import sys
import tempfile
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

GOOD = "good"
WIDTH = 16
RTOL, ATOL = 1e-4, 1e-5


def _model(nodes, initializers, x_dims=(1, 4), y_dims=("d0", "d1")):
    graph = helper.make_graph(
        nodes, "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_dims))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_dims))],
        initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _folded_ints(name, values):
    """Nodes computing the INT64 tensor NAME = VALUES as a Concat of two
    initializers: the importer folds it, libonnx's shape inference never
    sees the values (so the server's own checks are what stops them)."""
    inits = [_ints(name + "_a", values[:1]), _ints(name + "_b", values[1:])]
    return [helper.make_node("Concat", [name + "_a", name + "_b"], [name], axis=0)], inits


def huge_initializer():
    """An unused initializer claiming 2^40 FP32 elements with 16 bytes of
    data: before, std::bad_alloc aborted the server at start-up."""
    t = TensorProto()
    t.name = "unused"
    t.data_type = TensorProto.FLOAT
    t.dims.extend([1 << 40])
    t.raw_data = b"\0" * 16
    return _model([helper.make_node("Identity", ["x"], ["y"], name="id")], [t])


def huge_int64_initializer():
    t = TensorProto()
    t.name = "ids"
    t.data_type = TensorProto.INT64
    t.dims.extend([1 << 40])
    t.int64_data.extend([1, 2])
    return _model([helper.make_node("Identity", ["x"], ["y"], name="id")], [t])


def reshape_wrap():
    """x [1,4] reshaped to [2^62 + 1, 4]: 4 * (2^62 + 1) wraps to 4."""
    nodes, inits = _folded_ints("shape", [(1 << 62) + 1, 4])
    nodes.append(helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_wrap"))
    return _model(nodes, inits)


def pad_huge():
    nodes, inits = _folded_ints("pads", [0, 1 << 62, 0, 1 << 62])
    nodes.append(helper.make_node("Pad", ["x", "pads"], ["y"], name="pad_huge"))
    return _model(nodes, inits)


def conv_stride0():
    """strides 0 with SAME padding: a SIGFPE inside libonnx's shape
    inference, in the server process, before."""
    w = numpy_helper.from_array(np.ones((1, 1, 3, 3), np.float32), "w")
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv_stride0", strides=[0, 0],
                            auto_pad="SAME_UPPER")
    return _model([node], [w], x_dims=(1, 1, 8, 8), y_dims=("a", "b", "c", "d"))


def fold_bomb(copies=40):
    """x [1] + ReduceSum(Concat(COPIES x Expand(1.0, [2^24]))) -> y [1]:
    about 300 bytes on disk, COPIES * 64 MiB of FP32 if folded."""
    one = numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one")
    nodes = [
        helper.make_node("Expand", ["one", "n"], ["e"], name="expand"),
        helper.make_node("Concat", ["e"] * copies, ["c"], name="cat", axis=0),
        helper.make_node("ReduceSum", ["c"], ["s"], name="sum"),
        helper.make_node("Add", ["x", "s"], ["y"], name="add"),
    ]
    return _model(nodes, [one, _ints("n", [1 << 24])], x_dims=(1,), y_dims=(1,))


def peak_rss_mib(pid):
    """The process's peak resident set (VmHWM), in MiB."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmHWM in /proc/%d/status" % pid)


# name -> (model, what the reason must contain)
HOSTILE = {
    "huge_initializer": (huge_initializer, ["initializer 'unused'", "[1099511627776]",
                                            "exceeds the limit"]),
    "reshape_wrap": (reshape_wrap, ["node 'reshape_wrap' (op Reshape)", "exceeds the limit"]),
    "pad_huge": (pad_huge, ["node 'pad_huge' (op Pad)", "negative or overflowing extent"]),
    "conv_stride0": (conv_stride0, ["node 'conv_stride0' (op Conv)", "'strides' has 0"]),
}
TIMEOUT_OVERFLOW = "timeout_overflow"
ODD_NAME = "odd\x01name"


def index(stub):
    return nc.repository_index(stub, by_version=False)


class HostileModelsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_hostile_")
        cls.good = nc.deep_mlp_model(WIDTH, 2, seed=3)
        nc.write_model(cls.repo, GOOD, cls.good)
        for name, (make, _) in HOSTILE.items():
            nc.write_model(cls.repo, name, make())
        nc.write_model(cls.repo, TIMEOUT_OVERFLOW, cls.good)
        with open(os.path.join(cls.repo, TIMEOUT_OVERFLOW, "config.pbtxt"), "w") as f:
            f.write("max_batch_size: 8\n"
                    "dynamic_batching { default_timeout_microseconds: 18446744073709551615 }\n")
        nc.write_model(cls.repo, ODD_NAME, cls.good)
        cls.server = nc.ServerProcess(cls.repo, ["--model-control-mode", "poll",
                                                 "--repository-poll-secs", "1"])
        cls.server.start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        try:
            cls.server.stop()
        finally:
            shutil.rmtree(cls.repo, ignore_errors=True)

    def assert_up(self):
        self.assertIsNone(self.server.proc.poll(), "the server exited:\n%s"
                          % self.server.stderr_text(4000))
        self.assertTrue(self.stub.ServerLive(nc.pb.ServerLiveRequest(), timeout=10).live)
        self.assertTrue(self.stub.ServerReady(nc.pb.ServerReadyRequest(), timeout=10).ready)

    def assert_good_serves(self):
        x = np.random.default_rng(1).random((3, WIDTH), dtype=np.float32)
        expected = nc.ReferenceModel(self.good).run({"x": x})["y"]
        self.assertTrue(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=GOOD),
                                             timeout=10).ready)
        got = nc.infer(self.stub, GOOD, {"x": x})["y"]
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)

    def assert_refused(self, name, fragments):
        self.assertFalse(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=name),
                                              timeout=10).ready, name)
        state, reason = index(self.stub)[name]
        self.assertEqual(state, "UNAVAILABLE", "%s: %s" % (name, reason))
        for fragment in fragments:
            self.assertIn(fragment, reason, name)
        # A request says why too.
        with self.assertRaises(grpc.RpcError) as raised:
            nc.infer(self.stub, name, {"x": np.zeros((1, 4), np.float32)})
        self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE, name)
        self.assertIn(fragments[0], raised.exception.details(), name)
        # And the log, with the model's name.
        log = self.server.stderr_text(200000)
        self.assertIn("model %s is not available" % name, log)
        self.assertIn(fragments[0], log)

    def test_server_stays_up_and_the_good_model_serves(self):
        self.assert_up()
        self.assert_good_serves()
        self.assertEqual(index(self.stub)[GOOD], ("READY", ""))

    def test_every_hostile_model_is_unavailable_with_its_reason(self):
        for name, (_, fragments) in HOSTILE.items():
            with self.subTest(model=name):
                self.assert_refused(name, fragments)
        self.assert_up()

    def test_overflowing_config_timeout_is_refused_naming_file_and_field(self):
        self.assert_refused(TIMEOUT_OVERFLOW, [
            "config.pbtxt: dynamic_batching.default_timeout_microseconds",
            "18446744073709551615 is above the limit"])

    def test_a_directory_named_with_a_control_character_is_not_a_model(self):
        self.assertNotIn(ODD_NAME, index(self.stub))
        self.assertIn("odd\\x01name", self.server.stderr_text(200000))
        self.assertIn("contains a control character", self.server.stderr_text(200000))

    def test_a_hostile_model_dropped_in_while_serving_is_refused_too(self):
        # Written into a hidden directory, then renamed into place, so the
        # poll never reads half a file.
        staging = os.path.join(self.repo, ".staging")
        nc.write_model(staging, "late_huge", huge_int64_initializer())
        os.rename(os.path.join(staging, "late_huge"), os.path.join(self.repo, "late_huge"))
        shutil.rmtree(staging)
        seen = nc.wait_until(lambda: "late_huge" in index(self.stub), timeout=30)
        self.assertTrue(seen, self.server.stderr_text(4000))
        state, reason = index(self.stub)["late_huge"]
        self.assertEqual(state, "UNAVAILABLE", reason)
        self.assertIn("initializer 'ids'", reason)
        self.assertIn("exceeds the limit", reason)
        time.sleep(1.5)  # another poll or two
        self.assert_up()
        self.assert_good_serves()


class FoldBombTest(unittest.TestCase):
    """The front end's peak memory with the fold bomb in its repository, next
    to a good model, against the same server without the bomb."""

    BOMB = "fold_bomb"
    # The front end with one small model peaks near 45 MiB, near 230 MiB with
    # the bomb: its Expand folds (64 MiB, the budget's floor) with the int64
    # offsets of Expand's reference beside it (128 MiB) until it is done.
    MAX_GROWTH_MIB = 320
    MAX_PEAK_MIB = 600

    def serve(self, with_bomb):
        """Starts a server on a repository of the good model (and the bomb),
        waits until every model has settled (the good one ready, the bomb
        unavailable), returns (server, stub, whether they did)."""
        repo = tempfile.mkdtemp(prefix="numaserve_fold_bomb_")
        self.addCleanup(shutil.rmtree, repo, True)
        nc.write_model(repo, GOOD, self.good)
        if with_bomb:
            path = nc.write_model(repo, self.BOMB, fold_bomb())
            self.assertLess(os.path.getsize(path), 512)
        server = nc.ServerProcess(repo, ["--model-control-mode", "poll",
                                         "--repository-poll-secs", "1"])
        server.start()
        self.addCleanup(server.stop)
        stub = server.stub()
        expected = {GOOD: "READY"}
        if with_bomb:
            expected[self.BOMB] = "UNAVAILABLE"
        settled = nc.wait_until(
            lambda: {name: state for name, (state, _) in index(stub).items()} == expected,
            timeout=60)
        time.sleep(2.5)  # two more polls of the repository
        return server, stub, settled

    @classmethod
    def setUpClass(cls):
        cls.good = nc.deep_mlp_model(WIDTH, 2, seed=3)

    def test_the_bomb_is_refused_and_the_front_end_stays_small(self):
        server, stub, settled = self.serve(with_bomb=False)
        self.assertTrue(settled, "%s\n%s" % (index(stub), server.stderr_text(4000)))
        normal = peak_rss_mib(server.proc.pid)
        server.stop()

        # The front end reads every model before it prints its ports.
        server, stub, settled = self.serve(with_bomb=True)
        peak = peak_rss_mib(server.proc.pid)
        self.assertIsNone(server.proc.poll(), server.stderr_text(4000))
        print("front end peak: %.0f MiB with the bomb, %.0f MiB without" % (peak, normal),
              file=sys.stderr)
        self.assertLess(peak, self.MAX_PEAK_MIB)
        self.assertLess(peak, normal + self.MAX_GROWTH_MIB)
        self.assertTrue(settled, "%s\n%s" % (index(stub), server.stderr_text(4000)))

        # The bomb is unavailable with its reason; the good model serves.
        self.assertFalse(stub.ModelReady(nc.pb.ModelReadyRequest(name=self.BOMB),
                                         timeout=10).ready)
        state, reason = index(stub)[self.BOMB]
        self.assertEqual(state, "UNAVAILABLE", reason)
        self.assertIn("node 'cat' (op Concat)", reason)
        self.assertIn("above the constant folding budget of 64.0 MiB", reason)
        with self.assertRaises(grpc.RpcError) as raised:
            nc.infer(stub, self.BOMB, {"x": np.zeros((1,), np.float32)})
        self.assertEqual(raised.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("constant folding budget", raised.exception.details())
        x = np.random.default_rng(2).random((2, WIDTH), dtype=np.float32)
        expected = nc.ReferenceModel(self.good).run({"x": x})["y"]
        np.testing.assert_allclose(nc.infer(stub, GOOD, {"x": x})["y"], expected,
                                   rtol=RTOL, atol=ATOL)


if __name__ == "__main__":
    unittest.main()
