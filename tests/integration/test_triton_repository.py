#!/usr/bin/python3
"""A model repository laid out and configured for Triton's CPU ONNX Runtime
backend, served unchanged by the real server: <model>/config.pbtxt in
Triton's schema (platform or backend, TYPE_FP32 inputs and outputs with
dims, instance_group of KIND_CPU, dynamic_batching with a queue policy,
version_policy, and fields numaserve does not use) beside <model>/<N>/
model.onnx. The models are ready, ModelMetadata and ModelConfig describe
them as the config says, concurrent callers get correct results, each
ignored field is logged once, and a GPU instance group is refused naming
the file and field while the other models serve."""

import os
import sys
import tempfile
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

BATCHING = "dense_batching"
FIXED = "dense_fixed"
GPU = "dense_gpu"
FEATURES, CLASSES = 4, 3
CALLERS = 8
RTOL, ATOL = 1e-5, 1e-5

# A batching model on the CPU: two instances, dynamic batching with a
# default queue policy, and fields that only matter to Triton.
BATCHING_CONFIG = """\
name: "dense_batching"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
]
output [
  {
    name: "y"
    data_type: TYPE_FP32
    dims: [ 3 ]
  }
]
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
dynamic_batching {
  preferred_batch_size: [ 4 ]
  max_queue_delay_microseconds: 100
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 30000000
    max_queue_size: 128
  }
}
version_policy: { latest { num_versions: 1 } }
optimization {
  graph { level: 1 }
  execution_accelerators {
    cpu_execution_accelerator : [ { name : "openvino" } ]
  }
}
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
parameters { key: "execution_mode" value: { string_value: "0" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs {
      key: "x"
      value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true }
    }
  }
]
"""

# No batching (fixed shapes), named by backend, one specific version of two.
FIXED_CONFIG = """\
name: "dense_fixed"
backend: "onnxruntime"
max_batch_size: 0
input [ { name: "x", data_type: TYPE_FP32, dims: [ 1, 4 ] } ]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 1, 3 ] } ]
instance_group [ { kind: KIND_CPU } ]
version_policy: { specific { versions: [ 1 ] } }
default_model_filename: "model.onnx"
response_cache { enable: false }
"""

GPU_CONFIG = """\
name: "dense_gpu"
platform: "onnxruntime_onnx"
max_batch_size: 8
instance_group [ { count: 1, kind: KIND_GPU, gpus: [ 0 ] } ]
"""


def dense_model(batch, seed):
    """x FP32 [batch, 4] -> MatMul W -> Add b -> Relu -> y [batch, 3]."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((FEATURES, CLASSES)).astype(np.float32)
    bias = rng.standard_normal(CLASSES).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, CLASSES])],
        initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def write_config(repo, name, text):
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(text)


class TritonRepositoryTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_triton_")
        cls.reference = {
            BATCHING: nc.ReferenceModel(
                nc.write_model(cls.repo, BATCHING, dense_model("batch", seed=1))),
            FIXED: nc.ReferenceModel(nc.write_model(cls.repo, FIXED, dense_model(1, seed=2))),
        }
        # Version 2 of the fixed model is on disk but not in its policy.
        nc.write_model(cls.repo, FIXED, dense_model(1, seed=3), version=2)
        nc.write_model(cls.repo, GPU, dense_model("batch", seed=4))
        write_config(cls.repo, BATCHING, BATCHING_CONFIG)
        write_config(cls.repo, FIXED, FIXED_CONFIG)
        write_config(cls.repo, GPU, GPU_CONFIG)
        # One worker on two cores: the two instances get a core each.
        cls.server = nc.ServerProcess(cls.repo, ["--cpuset", "0-1"]).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(6000)

    def test_models_are_ready(self):
        for name in (BATCHING, FIXED):
            self.assertTrue(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=name)).ready,
                            name + self.log())
        self.assertTrue(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=FIXED, version="1"))
                        .ready)
        # Version 2 is on disk but outside the policy: not served, so not
        # ready (Triton's answer for a version it does not serve).
        self.assertFalse(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=FIXED, version="2"))
                         .ready)

    def test_metadata(self):
        m = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=BATCHING))
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.inputs],
                         [("x", "FP32", [-1, FEATURES])])
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in m.outputs],
                         [("y", "FP32", [-1, CLASSES])])
        m = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=FIXED))
        self.assertEqual(list(m.versions), ["1"])
        self.assertEqual([(t.name, list(t.shape)) for t in m.inputs], [("x", [1, FEATURES])])

    def test_model_config_answers_in_tritons_message(self):
        tc = nc.triton_config_pb
        c = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=BATCHING)).config
        self.assertEqual(c.name, BATCHING)
        self.assertEqual(c.platform, "onnxruntime_onnx")
        self.assertEqual(c.max_batch_size, 8)
        self.assertEqual([(t.name, t.data_type, list(t.dims)) for t in c.input],
                         [("x", tc.TYPE_FP32, [FEATURES])])
        self.assertEqual([(t.name, t.data_type, list(t.dims)) for t in c.output],
                         [("y", tc.TYPE_FP32, [CLASSES])])
        self.assertEqual([(g.kind, g.count) for g in c.instance_group],
                         [(tc.ModelInstanceGroup.KIND_CPU, 2)], c)
        self.assertEqual(list(c.dynamic_batching.preferred_batch_size), [4])
        self.assertEqual(c.dynamic_batching.max_queue_delay_microseconds, 100)
        self.assertEqual(c.dynamic_batching.default_queue_policy.default_timeout_microseconds,
                         30000000)
        self.assertEqual(c.dynamic_batching.default_queue_policy.max_queue_size, 128)
        self.assertEqual(c.version_policy.latest.num_versions, 1)
        self.assertEqual(c.parameters["instance_placement.instances_per_domain"].string_value,
                         "2")

        c = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=FIXED)).config
        self.assertEqual(c.max_batch_size, 0)
        self.assertEqual([(t.name, t.data_type, list(t.dims)) for t in c.input],
                         [("x", tc.TYPE_FP32, [1, FEATURES])])
        self.assertEqual([(g.kind, g.count) for g in c.instance_group],
                         [(tc.ModelInstanceGroup.KIND_CPU, 1)], c)
        self.assertEqual(list(c.version_policy.specific.versions), [1])
        self.assertFalse(c.HasField("dynamic_batching"))

    def test_concurrent_callers_get_correct_results(self):
        def call(i, stub):
            rows = 1 + i % 3
            x = np.random.default_rng(i).standard_normal((rows, FEATURES)).astype(np.float32)
            y = nc.decode_outputs(stub.ModelInfer(nc.make_request(BATCHING, {"x": x}),
                                                  timeout=60))["y"]
            x1 = np.random.default_rng(100 + i).standard_normal((1, FEATURES)) \
                .astype(np.float32)
            y1 = nc.decode_outputs(stub.ModelInfer(nc.make_request(FIXED, {"x": x1}),
                                                   timeout=60))["y"]
            return x, y, x1, y1

        for i, result in enumerate(nc.call_together(self.server, CALLERS, call)):
            self.assertIsInstance(result, tuple, "caller %d: %r%s" % (i, result, self.log()))
            x, y, x1, y1 = result
            np.testing.assert_allclose(y, self.reference[BATCHING].run({"x": x})["y"],
                                       rtol=RTOL, atol=ATOL, err_msg="caller %d" % i)
            np.testing.assert_allclose(y1, self.reference[FIXED].run({"x": x1})["y"],
                                       rtol=RTOL, atol=ATOL, err_msg="caller %d" % i)

    def test_ignored_fields_are_logged_once(self):
        log = self.server.stderr_text(0)
        line = ("numaserve: model '%s' config.pbtxt: ignoring Triton field '%s' "
                "(no effect on numaserve)")
        for model, field in ((BATCHING, "optimization"), (BATCHING, "parameters"),
                             (FIXED, "response_cache")):
            self.assertEqual(log.count(line % (model, field)), 1,
                             "%s %s%s" % (model, field, self.log()))
        # Used fields are not reported.
        for field in ("instance_group", "dynamic_batching", "version_policy", "input",
                      "default_model_filename", "backend", "model_warmup"):
            self.assertNotIn("ignoring Triton field '%s'" % field, log, self.log())
        # model_warmup is used: each copy ran it at load.
        self.assertRegex(log, r"%s:\d+: warm-up 'zeros' 1 run in" % BATCHING, self.log())

    def test_a_gpu_instance_group_is_refused_naming_file_and_field(self):
        self.assertFalse(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=GPU)).ready)
        path = os.path.join(self.repo, GPU, "config.pbtxt")
        expected = "%s:4:30: instance_group[0].kind: KIND_GPU: numaserve runs models on CPU" % path
        self.assertIn(expected, self.server.stderr_text(0), self.log())
        with self.assertRaises(grpc.RpcError) as caught:
            nc.infer(self.stub, GPU, {"x": np.zeros((1, FEATURES), np.float32)})
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
        self.assertIn("KIND_GPU", caught.exception.details())
        index = self.stub.RepositoryIndex(nc.pb.RepositoryIndexRequest())
        reasons = {m.name: m.reason for m in index.models}
        self.assertIn("instance_group[0].kind", reasons.get(GPU, ""), index)


if __name__ == "__main__":
    unittest.main()
