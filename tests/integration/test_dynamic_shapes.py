#!/usr/bin/python3
"""Models with dynamic dims besides the batch (shape-polymorphic), over the
real server: each request runs at its own input shapes (its signature),
answered with the output shapes the model computes there and checked
against NumPy, concurrent requests at several sequence lengths and image
sizes on gRPC and HTTP; metadata and config show -1 for every dynamic dim;
a config.pbtxt may narrow a dynamic dim (requests must then send it); a
request with a wrong fixed dim, a dynamic dim of 0 or two sizes for one
named dim is refused (INVALID_ARGUMENT / HTTP 400) naming the input and
the dim.

  ENCODER: x [batch, seq, 16], pos [seq, 16] -> y = Relu(x @ w + pos)
           [batch, seq, 16]  (one 'seq' for both inputs)
  CNN:     image [n, 3, h, w] -> Conv 3x3 (pad 1, 4 channels) + Relu ->
           features [n, 4, h, w] and MaxPool 2x2 -> pooled [n, 4, h/2, w/2]
  NARROW:  ENCODER with config.pbtxt dims [-1, 8, 16] for x: seq 8 only
  BATCHED: ENCODER with max_batch_size 8: refused at load, saying why (pos
           [seq, 16] has no batch dim: there are no rows to stack)
  CNN_BATCHED: CNN with max_batch_size 8 and a 20 ms queue delay: requests
           of one image size are stacked into one run, requests of other
           sizes wait for runs of their own
  WARM:    ENCODER with model_warmup at seq 16 (zeros, twice) and 32
           (random): run at load before it reports ready, in the log
  WARM_BAD, WARM_UNKNOWN: ENCODER whose warm-up gives 'seq' two sizes (the
           engine refuses it when it runs) or names no input of the model
           (refused when the config is read): not ready, saying why
"""

import http.client
import json
import os
import sys
import tempfile
import unittest

import grpc
import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

ENCODER = "encoder"
CNN = "cnn"
NARROW = "encoder_seq8"
BATCHED = "encoder_batched"
CNN_BATCHED = "cnn_batched"
WARM = "encoder_warm"
WARM_BAD = "encoder_warm_bad"
WARM_UNKNOWN = "encoder_warm_unknown"
HIDDEN = 16


def warmup(name, seq, pos_seq, data="zero_data", count=1, extra=""):
    """A model_warmup entry for the encoder, in Triton's schema."""
    return ("""{ name: "%s" count: %d
  inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ 1, %d, %d ] %s: true } }
  inputs { key: "pos" value: { data_type: TYPE_FP32 dims: [ %d, %d ] %s: true } }
  %s }""" % (name, count, seq, HIDDEN, data, pos_seq, HIDDEN, data, extra))


def _model(name, nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def encoder_model(w):
    return _model(
        ENCODER,
        [helper.make_node("MatMul", ["x", "w"], ["xw"], name="project"),
         helper.make_node("Add", ["xw", "pos"], ["sum"], name="position"),
         helper.make_node("Relu", ["sum"], ["y"], name="relu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", HIDDEN]),
         helper.make_tensor_value_info("pos", TensorProto.FLOAT, ["seq", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        [numpy_helper.from_array(w, "w")])


def cnn_model(kernel, bias):
    return _model(
        CNN,
        [helper.make_node("Conv", ["image", "kernel", "bias"], ["conv"], name="conv",
                          kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["conv"], ["features"], name="relu"),
         helper.make_node("MaxPool", ["features"], ["pooled"], name="pool",
                          kernel_shape=[2, 2], strides=[2, 2])],
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["n", 3, "h", "w"])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", 4, "h", "w"]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["n", 4, "h2", "w2"])],
        [numpy_helper.from_array(kernel, "kernel"), numpy_helper.from_array(bias, "bias")])


def random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def encoder_reference(x, pos, w):
    return np.maximum(x @ w + pos, 0)


def cnn_reference(image, kernel, bias):
    n, _, h, w = image.shape
    padded = np.pad(image, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros((n, kernel.shape[0], h, w), np.float64)
    for dy in range(3):
        for dx in range(3):
            window = padded[:, :, dy:dy + h, dx:dx + w]
            conv += np.einsum("nchw,oc->nohw", window, kernel[:, :, dy, dx])
    features = np.maximum(conv + bias[None, :, None, None], 0).astype(np.float32)
    h2, w2 = h // 2, w // 2
    pooled = features[:, :, :2 * h2, :2 * w2].reshape(n, 4, h2, 2, w2, 2).max(axis=(3, 5))
    return features, pooled


class DynamicShapesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_dynamic_shapes_")
        cls.w = random((HIDDEN, HIDDEN), 1)
        cls.kernel = random((4, 3, 3, 3), 2)
        cls.bias = random((4,), 3)
        for name in (ENCODER, NARROW, BATCHED, WARM, WARM_BAD, WARM_UNKNOWN):
            nc.write_model(cls.repo, name, encoder_model(cls.w))
        nc.write_model(cls.repo, CNN, cnn_model(cls.kernel, cls.bias))
        nc.write_model(cls.repo, CNN_BATCHED, cnn_model(cls.kernel, cls.bias))
        configs = {NARROW: 'input { name: "x" dims: [-1, 8, %d] }\n' % HIDDEN,
                   BATCHED: "max_batch_size: 8\n"
                            "dynamic_batching { max_queue_delay_microseconds: 1000 }\n",
                   CNN_BATCHED: "max_batch_size: 8\n"
                                "dynamic_batching { max_queue_delay_microseconds: 20000 }\n",
                   WARM: 'backend: "onnxruntime"\nmodel_warmup [ %s, %s ]\n' % (
                       warmup("seq16", 16, 16, count=2), warmup("seq32", 32, 32, "random_data")),
                   WARM_BAD: 'backend: "onnxruntime"\nmodel_warmup [ %s ]\n'
                             % warmup("bad", 16, 8),
                   WARM_UNKNOWN: 'backend: "onnxruntime"\nmodel_warmup [ %s ]\n' % warmup(
                       "unknown", 16, 16,
                       extra='inputs { key: "z" value: { data_type: TYPE_FP32 dims: [ 1 ] '
                             'zero_data: true } }')}
        for name, text in configs.items():
            with open(os.path.join(cls.repo, name, "config.pbtxt"), "w") as f:
                f.write(text)
        cls.server = nc.ServerProcess(cls.repo).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(4000)

    def assert_close(self, got, want, what):
        self.assertEqual(got.shape, want.shape, "%s: shape%s" % (what, self.log()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=what)

    def assert_refused(self, model, inputs, *fragments):
        with self.assertRaises(grpc.RpcError) as caught:
            nc.infer(self.stub, model, inputs)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         caught.exception.details())
        for fragment in fragments:
            self.assertIn(fragment, caught.exception.details())

    def http_json(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, json.loads(response.read() or b"{}")
        finally:
            conn.close()

    def test_metadata_and_config_show_minus_one_for_dynamic_dims(self):
        meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=ENCODER), timeout=10)
        shapes = {t.name: list(t.shape) for t in list(meta.inputs) + list(meta.outputs)}
        self.assertEqual(shapes, {"x": [-1, -1, HIDDEN], "pos": [-1, HIDDEN],
                                  "y": [-1, -1, HIDDEN]})
        meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=CNN), timeout=10)
        self.assertEqual(list(meta.inputs[0].shape), [-1, 3, -1, -1])
        self.assertEqual([list(t.shape) for t in meta.outputs], [[-1, 4, -1, -1]] * 2)
        status, body = self.http_json("GET", "/v2/models/" + ENCODER)
        self.assertEqual(status, 200, body)
        self.assertEqual([t["shape"] for t in body["inputs"]], [[-1, -1, HIDDEN], [-1, HIDDEN]])
        config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=ENCODER), timeout=10).config
        self.assertEqual(config.max_batch_size, 0)
        self.assertEqual(list(config.input[0].dims), [-1, -1, HIDDEN])
        # Narrowed by its config: seq is 8.
        meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=NARROW), timeout=10)
        self.assertEqual(list(meta.inputs[0].shape), [-1, 8, HIDDEN])

    def test_each_request_runs_at_its_own_shapes(self):
        for batch, seq in ((2, 5), (1, 1), (3, 33), (2, 16)):
            x, pos = random((batch, seq, HIDDEN), seq), random((seq, HIDDEN), 100 + seq)
            y = nc.infer(self.stub, ENCODER, {"x": x, "pos": pos})["y"]
            self.assert_close(y, encoder_reference(x, pos, self.w), "seq %d" % seq)
        for n, h, w in ((1, 8, 8), (2, 13, 7), (1, 32, 24)):
            image = random((n, 3, h, w), h * w)
            out = nc.infer(self.stub, CNN, {"image": image})
            features, pooled = cnn_reference(image, self.kernel, self.bias)
            self.assert_close(out["features"], features, "%dx%d features" % (h, w))
            self.assert_close(out["pooled"], pooled, "%dx%d pooled" % (h, w))

    def test_concurrent_requests_of_many_shapes_get_their_own_answers(self):
        count = 48

        def call(i, stub):
            if i % 2 == 0:
                seq = (1, 4, 9, 16, 31)[i % 5]
                x, pos = random((1 + i % 3, seq, HIDDEN), i), random((seq, HIDDEN), 1000 + i)
                y = nc.infer(stub, ENCODER, {"x": x, "pos": pos})["y"]
                return "encoder", encoder_reference(x, pos, self.w), y
            h, w = (6, 10, 17)[i % 3], (9, 12, 5)[i % 4 % 3]
            image = random((1 + i % 2, 3, h, w), i)
            return "cnn", cnn_reference(image, self.kernel, self.bias)[1], \
                nc.infer(stub, CNN, {"image": image})["pooled"]

        for i, result in enumerate(nc.call_together(self.server, count, call)):
            self.assertIsInstance(result, tuple, "request %d: %r%s" % (i, result, self.log()))
            name, want, got = result
            self.assert_close(got, want, "request %d (%s %s)" % (i, name, want.shape))
        self.assertEqual(self.server.metrics().sum("numaserve_worker_restarts_total"), 0,
                         self.log())

    def test_http_runs_at_the_requests_shapes(self):
        x, pos = random((2, 7, HIDDEN), 7), random((7, HIDDEN), 8)
        body = {"inputs": [
            {"name": "x", "datatype": "FP32", "shape": list(x.shape),
             "data": x.flatten().tolist()},
            {"name": "pos", "datatype": "FP32", "shape": list(pos.shape),
             "data": pos.flatten().tolist()}]}
        status, reply = self.http_json("POST", "/v2/models/%s/infer" % ENCODER, body)
        self.assertEqual(status, 200, reply)
        out = reply["outputs"][0]
        self.assertEqual(out["shape"], [2, 7, HIDDEN])
        self.assert_close(np.array(out["data"], np.float32).reshape(out["shape"]),
                          encoder_reference(x, pos, self.w), "http")
        body["inputs"][1]["shape"] = [7, HIDDEN - 1]
        body["inputs"][1]["data"] = body["inputs"][1]["data"][:7 * (HIDDEN - 1)]
        status, reply = self.http_json("POST", "/v2/models/%s/infer" % ENCODER, body)
        self.assertEqual(status, 400, reply)
        self.assertIn("input 'pos'", reply["error"])
        self.assertIn("dim 1 is fixed at %d, got %d" % (HIDDEN, HIDDEN - 1), reply["error"])

    def test_wrong_shapes_are_refused_naming_the_input_and_dim(self):
        x, pos = random((2, 5, HIDDEN), 1), random((5, HIDDEN), 2)
        self.assert_refused(ENCODER, {"x": random((2, 5, HIDDEN + 1), 1), "pos": pos},
                            "input 'x'", "dim 2 is fixed at %d, got %d" % (HIDDEN, HIDDEN + 1))
        self.assert_refused(ENCODER, {"x": x, "pos": random((6, HIDDEN), 3)},
                            "input 'pos' dim 0 ('seq') is 6", "input 'x' dim 1 ('seq') is 5")
        self.assert_refused(ENCODER, {"x": np.zeros((2, 0, HIDDEN), np.float32),
                                      "pos": np.zeros((0, HIDDEN), np.float32)},
                            "input 'x'", "dim 1 ('seq') is dynamic: it must be >= 1, got 0")
        self.assert_refused(CNN, {"image": random((1, 2, 8, 8), 4)},
                            "input 'image'", "dim 1 is fixed at 3, got 2")
        # The server answers afterwards.
        y = nc.infer(self.stub, ENCODER, {"x": x, "pos": pos})["y"]
        self.assert_close(y, encoder_reference(x, pos, self.w), "after")

    def test_a_config_narrowing_a_dynamic_dim_holds_requests_to_it(self):
        x, pos = random((1, 8, HIDDEN), 5), random((8, HIDDEN), 6)
        y = nc.infer(self.stub, NARROW, {"x": x, "pos": pos})["y"]
        self.assert_close(y, encoder_reference(x, pos, self.w), NARROW)
        self.assert_refused(NARROW, {"x": random((1, 5, HIDDEN), 5), "pos": pos[:5]},
                            "input 'x'", "dim 1 ('seq') is fixed at 8, got 5")

    def test_batching_a_shape_polymorphic_model_is_refused_with_the_reason(self):
        ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=BATCHED), timeout=10)
        self.assertFalse(ready.ready, self.log())
        with self.assertRaises(grpc.RpcError) as caught:
            nc.infer(self.stub, BATCHED, {"x": random((1, 2, HIDDEN), 1),
                                          "pos": random((2, HIDDEN), 2)})
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("max_batch_size", caught.exception.details())
        self.assertIn("input 'pos' has no batch dim", caught.exception.details())

    def test_requests_of_one_shape_are_batched_together_and_others_apart(self):
        config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=CNN_BATCHED),
                                       timeout=10).config
        self.assertEqual(config.max_batch_size, 8)
        meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=CNN_BATCHED), timeout=10)
        self.assertEqual(list(meta.inputs[0].shape), [-1, 3, -1, -1])

        def statistics():
            response = self.stub.ModelStatistics(
                nc.pb.ModelStatisticsRequest(name=CNN_BATCHED), timeout=10)
            return response.model_stats[0]

        sizes = ((6, 10), (9, 9), (6, 10), (13, 7))
        before = statistics()
        count = 24

        def call(i, stub):
            h, w = sizes[i % len(sizes)]
            image = random((1, 3, h, w), 500 + i)
            out = nc.infer(stub, CNN_BATCHED, {"image": image})
            return (h, w), cnn_reference(image, self.kernel, self.bias), out

        for i, result in enumerate(nc.call_together(self.server, count, call)):
            self.assertIsInstance(result, tuple, "request %d: %r%s" % (i, result, self.log()))
            size, (features, pooled), out = result
            self.assert_close(out["features"], features, "request %d %s features" % (i, size))
            self.assert_close(out["pooled"], pooled, "request %d %s pooled" % (i, size))
        after = statistics()
        runs = after.execution_count - before.execution_count
        rows = after.inference_count - before.inference_count
        self.assertEqual(rows, count)
        # Stacked: fewer runs than requests; at least one per image size.
        self.assertLess(runs, count, self.log())
        self.assertGreaterEqual(runs, 3)
        stacked = [b for b in after.batch_stats if b.batch_size > 1]
        self.assertTrue(stacked, "no run of more than one row: %s" % after.batch_stats)

    def test_model_warmup_runs_at_load_before_the_model_is_ready(self):
        ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=WARM), timeout=10)
        self.assertTrue(ready.ready, self.log())
        log = self.server.stderr_text(0)
        self.assertRegex(log, r"worker 0: %s:1: warm-up 'seq16' 2 runs in [0-9.]+ ms, "
                         r"'seq32' 1 run in [0-9.]+ ms" % WARM, self.log())
        self.assertNotIn("ignoring Triton field 'model_warmup'", log)
        x, pos = random((2, 16, HIDDEN), 9), random((16, HIDDEN), 10)
        y = nc.infer(self.stub, WARM, {"x": x, "pos": pos})["y"]
        self.assert_close(y, encoder_reference(x, pos, self.w), WARM)

    def test_a_malformed_warmup_leaves_the_model_unavailable_saying_why(self):
        index = nc.repository_index(self.stub, by_version=False)
        for name, why in ((WARM_BAD, ["warm-up 'bad'", "input 'pos' dim 0 ('seq') is 8",
                                      "input 'x' dim 1 ('seq') is 16"]),
                          (WARM_UNKNOWN, ["model_warmup[0] ('unknown')",
                                          "the model has no input 'z'"])):
            state, reason = index[name]
            self.assertEqual(state, "UNAVAILABLE", "%s: %s%s" % (name, reason, self.log()))
            for fragment in why:
                self.assertIn(fragment, reason, name)


if __name__ == "__main__":
    unittest.main()
