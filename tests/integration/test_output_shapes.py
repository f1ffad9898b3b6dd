#!/usr/bin/python3
"""Models whose outputs are not [batch, static...] with rows kept apart,
over the real server: served one request per run with the shape the model
really computes (checked against NumPy), never batched across requests (a
config asking for it is refused with the reason), never a guessed shape,
and concurrent requests never overwrite each other's answers.

  x [n,64] -> Reshape [1,-1] -> y [1,64n]       (ONE_ROW)
  x [n,3]  -> x times its transpose -> y [n,n]  (GRAM)
  x [n,4]  -> Softmax over axis 0 -> y [n,4]     (SOFTMAX_ROWS: the batch
                                                  dim first, rows mixed)
"""

import os
import sys
import tempfile
import unittest

import grpc
import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

ONE_ROW = "one_row"
GRAM = "gram"
SOFTMAX_ROWS = "softmax_rows"
GRAM_BATCHED = "gram_batched"          # GRAM with a config asking for batching
SOFTMAX_BATCHED = "softmax_batched"    # SOFTMAX_ROWS likewise
ROWWISE = "rowwise"                    # x [n,8] @ w [8,4]: batched, for contrast
MAX_MESSAGE = 4 << 20

BATCHED_CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""


def _model(name, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def one_row_model():
    return _model(
        ONE_ROW, [helper.make_node("Reshape", ["x", "one_row"], ["y"], name="flatten_all")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n64"])],
        [numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "one_row")])


def gram_model():
    return _model(
        GRAM, [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
               helper.make_node("MatMul", ["x", "xt"], ["y"], name="gram")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "n"])])


def softmax_rows_model():
    return _model(
        SOFTMAX_ROWS, [helper.make_node("Softmax", ["x"], ["y"], axis=0, name="over_rows")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])


def rowwise_model(weight):
    return _model(
        ROWWISE, [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(weight, "w")])


def softmax_rows(x):
    e = np.exp(x - x.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def rows(n, seed, width):
    return np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)


class OutputShapesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_output_shapes_")
        cls.weight = rows(8, 99, 4)
        for name, model in ((ONE_ROW, one_row_model()), (GRAM, gram_model()),
                            (SOFTMAX_ROWS, softmax_rows_model()),
                            (GRAM_BATCHED, gram_model()),
                            (SOFTMAX_BATCHED, softmax_rows_model()),
                            (ROWWISE, rowwise_model(cls.weight))):
            nc.write_model(cls.repo, name, model)
        for name in (GRAM_BATCHED, SOFTMAX_BATCHED, ROWWISE):
            with open(os.path.join(cls.repo, name, "config.pbtxt"), "w") as f:
                f.write(BATCHED_CONFIG)
        cls.server = nc.ServerProcess(
            cls.repo, ["--grpc-max-message-bytes", str(MAX_MESSAGE)]).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(4000)

    def assert_close(self, got, want, what):
        self.assertEqual(got.shape, want.shape, "%s: shape%s" % (what, self.log()))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)

    def test_reshape_to_one_row_answers_the_real_shape(self):
        for n in (5, 1, 3):
            x = rows(n, n, 64)
            y = nc.infer(self.stub, ONE_ROW, {"x": x})["y"]
            self.assert_close(y, x.reshape(1, -1), "%s with %d rows" % (ONE_ROW, n))

    def test_rows_times_their_transpose_is_n_by_n(self):
        for n in (4, 1, 7):
            x = rows(n, 10 + n, 3)
            y = nc.infer(self.stub, GRAM, {"x": x})["y"]
            self.assert_close(y, x @ x.T, "%s with %d rows" % (GRAM, n))

    def test_softmax_over_rows_sees_only_the_requests_rows(self):
        x = rows(6, 3, 4)
        y = nc.infer(self.stub, SOFTMAX_ROWS, {"x": x})["y"]
        self.assert_close(y, softmax_rows(x), SOFTMAX_ROWS)

    def test_metadata_and_config_say_unbatched(self):
        for name, shape in ((ONE_ROW, [1, -1]), (GRAM, [-1, -1]), (SOFTMAX_ROWS, [-1, 4])):
            meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=name), timeout=10)
            self.assertEqual(list(meta.outputs[0].shape), shape, name)
            config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=name), timeout=10).config
            self.assertEqual(config.max_batch_size, 0, name)
            self.assertFalse(config.HasField("dynamic_batching"), name)
        config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=ROWWISE), timeout=10).config
        self.assertEqual(config.max_batch_size, 8)

    def test_the_log_says_why_each_is_served_unbatched(self):
        log = self.server.stderr_text()
        for name, why in ((ONE_ROW, "flatten_all"), (GRAM, "pairs rows with rows"),
                          (SOFTMAX_ROWS, "normalizes over the rows")):
            self.assertRegex(log, r"model '%s' version 1: served one request per run "
                             r"\(max_batch_size 0\): .*%s" % (name, why), log)

    def test_a_config_batching_such_a_model_is_refused(self):
        for name in (GRAM_BATCHED, SOFTMAX_BATCHED):
            ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=name), timeout=10)
            self.assertFalse(ready.ready, name + self.log())
            with self.assertRaises(grpc.RpcError) as caught:
                nc.infer(self.stub, name, {"x": rows(2, 1, 3 if name == GRAM_BATCHED else 4)})
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE, name)
            self.assertIn("max_batch_size", caught.exception.details(), name)
        # The row-wise model next to them is batched and serves.
        x = rows(3, 4, 8)
        self.assert_close(nc.infer(self.stub, ROWWISE, {"x": x})["y"], x @ self.weight, ROWWISE)

    def test_concurrent_requests_get_their_own_answers(self):
        # Requests of different sizes at once, several per worker: none may
        # take another's rows or bytes.
        count = 48

        def call(i, stub):
            n = 1 + i % 7
            if i % 3 == 0:
                x = rows(n, 100 + i, 64)
                return ONE_ROW, x, nc.infer(stub, ONE_ROW, {"x": x})["y"]
            if i % 3 == 1:
                x = rows(n, 100 + i, 3)
                return GRAM, x, nc.infer(stub, GRAM, {"x": x})["y"]
            x = rows(n, 100 + i, 8)
            return ROWWISE, x, nc.infer(stub, ROWWISE, {"x": x})["y"]

        want = {ONE_ROW: lambda x: x.reshape(1, -1), GRAM: lambda x: x @ x.T,
                ROWWISE: lambda x: x @ self.weight}
        for i, result in enumerate(nc.call_together(self.server, count, call)):
            self.assertIsInstance(result, tuple, "request %d: %r%s" % (i, result, self.log()))
            name, x, y = result
            self.assert_close(y, want[name](x), "request %d (%s, %d rows)" % (i, name, len(x)))
        # No worker died on the way (a write past a slot used to kill one).
        self.assertEqual(self.server.metrics().sum("numaserve_worker_restarts_total"), 0,
                         self.log())

    def test_an_output_too_large_for_a_message_is_refused_up_front(self):
        # 1100 rows: [1100,1100] FP32 is 4.8 MB, over the 4 MiB limit.
        with self.assertRaises(grpc.RpcError) as caught:
            nc.infer(self.stub, GRAM, {"x": rows(1100, 5, 3)})
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("message limit", caught.exception.details())
        x = rows(2, 6, 3)
        self.assert_close(nc.infer(self.stub, GRAM, {"x": x})["y"], x @ x.T, "after")


if __name__ == "__main__":
    unittest.main()
