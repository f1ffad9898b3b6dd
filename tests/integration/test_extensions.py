#!/usr/bin/python3
"""Triton's extensions against the real server: ModelStreamInfer round trip
(answers matched by id, errors in error_message), ModelStatistics counters
(success, fail, queue, compute phases, per batch size) and ModelConfig."""

import os
import sys
import tempfile
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
RTOL, ATOL = 1e-4, 1e-5
CONFIG = """
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 preferred_batch_size: [ 4 ] }
"""


class ExtensionsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_extensions_")
        cls.reference = nc.ReferenceModel(nc.write_default_model(cls.repo))
        with open(os.path.join(cls.repo, MODEL, "config.pbtxt"), "w") as f:
            f.write(CONFIG)
        cls.server = nc.ServerProcess(cls.repo).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def statistics(self):
        response = self.stub.ModelStatistics(nc.pb.ModelStatisticsRequest(name=MODEL),
                                             timeout=10)
        self.assertEqual(len(response.model_stats), 1, response)
        return response.model_stats[0]

    def test_stream_round_trip(self):
        before = self.statistics()
        images = {"r%d" % i: nc.random_images((i % 3) + 1, seed=40 + i) for i in range(12)}

        def requests():
            for rid, x in images.items():
                yield nc.make_request(MODEL, {"image": x}, request_id=rid)
            bad = nc.make_request(MODEL, {"image": nc.random_images(1)}, request_id="bad")
            bad.inputs[0].datatype = "FP64"
            yield bad
            yield nc.make_request("no_such_model", {"image": nc.random_images(1)},
                                  request_id="missing")

        answers = {}
        for reply in self.stub.ModelStreamInfer(requests(), timeout=60):
            answers[reply.infer_response.id] = reply
        self.assertEqual(set(answers), set(images) | {"bad", "missing"})
        for rid, x in images.items():
            reply = answers[rid]
            self.assertEqual(reply.error_message, "", rid)
            got = nc.decode_outputs(reply.infer_response)["probabilities"]
            np.testing.assert_allclose(got, self.reference.run({"image": x})["probabilities"],
                                       rtol=RTOL, atol=ATOL, err_msg=rid)
        self.assertIn("INVALID_ARGUMENT", answers["bad"].error_message)
        self.assertIn("NOT_FOUND", answers["missing"].error_message)

        after = self.statistics()
        rows = sum(x.shape[0] for x in images.values())
        stats, old = after.inference_stats, before.inference_stats
        self.assertEqual(stats.success.count - old.success.count, len(images))
        self.assertEqual(stats.fail.count - old.fail.count, 1)  # "missing" has no version
        self.assertEqual(after.inference_count - before.inference_count, rows)
        executions = after.execution_count - before.execution_count
        self.assertGreater(executions, 0)
        self.assertLessEqual(executions, len(images))
        for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
            self.assertEqual(getattr(stats, phase).count - getattr(old, phase).count,
                             len(images), phase)
        self.assertGreater(stats.compute_infer.ns, old.compute_infer.ns)
        self.assertGreater(stats.success.ns, old.success.ns)

    def test_statistics_per_batch_size(self):
        before = {b.batch_size: b.compute_infer.count for b in self.statistics().batch_stats}
        nc.infer(self.stub, MODEL, {"image": nc.random_images(3)})
        nc.infer(self.stub, MODEL, {"image": nc.random_images(3)})
        after = self.statistics()
        per_size = {b.batch_size: b for b in after.batch_stats}
        self.assertTrue(all(1 <= size <= 8 for size in per_size), sorted(per_size))
        self.assertEqual(sum(b.compute_infer.count for b in after.batch_stats),
                         after.execution_count)
        grown = {s: b.compute_infer.count - before.get(s, 0) for s, b in per_size.items()}
        self.assertEqual(sum(s * n for s, n in grown.items()), 6, grown)
        self.assertGreater(after.last_inference, 0)
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelStatistics(nc.pb.ModelStatisticsRequest(name="no_such_model"),
                                      timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)
        # A version that is no version of the model is refused, not read as
        # "every version".
        for version in ("abc", "0", "-1", "99"):
            with self.assertRaises(grpc.RpcError) as caught:
                self.stub.ModelStatistics(
                    nc.pb.ModelStatisticsRequest(name=MODEL, version=version), timeout=10)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND, version)

    def test_model_config(self):
        """ModelConfig answers Triton's inference.ModelConfig: decoded with a
        Triton-numbered message, and checked field number by field number on
        the wire."""
        tc = nc.triton_config_pb
        config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=MODEL), timeout=10).config
        self.assertEqual(config.name, MODEL)
        self.assertEqual(config.platform, "onnxruntime_onnx")
        # ModelMetadata names the platform as ModelConfig does (Triton's name).
        metadata = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=MODEL), timeout=10)
        self.assertEqual(metadata.platform, config.platform)
        self.assertEqual(config.backend, "numaserve")
        self.assertEqual(config.max_batch_size, 8)
        self.assertEqual(config.version_policy.WhichOneof("policy_choice"), "latest")
        self.assertEqual(config.version_policy.latest.num_versions, 1)
        self.assertEqual([(t.name, t.data_type, list(t.dims)) for t in config.input],
                         [("image", tc.TYPE_FP32, [1, 28, 28])])
        self.assertEqual([(t.name, t.data_type, list(t.dims)) for t in config.output],
                         [("probabilities", tc.TYPE_FP32, [10])])
        batching = config.dynamic_batching
        self.assertEqual(list(batching.preferred_batch_size), [4])
        self.assertEqual(batching.max_queue_delay_microseconds, 2000)
        # The server's defaults, since the config sets neither.
        self.assertEqual(batching.default_queue_policy.max_queue_size, 4096)
        self.assertEqual(batching.default_queue_policy.default_timeout_microseconds, 60000000)
        self.assertEqual(len(config.instance_group), 1)
        group = config.instance_group[0]
        self.assertEqual(group.kind, tc.ModelInstanceGroup.KIND_CPU)
        self.assertGreaterEqual(group.count, 1)
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        self.assertEqual(parameters, {"gemm_backend": "auto",
                                      "precision": "fp32",
                                      "instance_placement.domains": "all",
                                      "instance_placement.instances_per_domain": "1"})

        # The same answer as raw bytes, walked by Triton's field numbers.
        raw = self.server.channel().unary_unary(
            "/inference.GRPCInferenceService/ModelConfig",
            request_serializer=nc.pb.ModelConfigRequest.SerializeToString,
            response_deserializer=None)(nc.pb.ModelConfigRequest(name=MODEL), timeout=10)
        (body,) = wire_fields(raw)[1]                  # ModelConfigResponse.config = 1
        fields = wire_fields(body)
        self.assertEqual(fields[1], [MODEL.encode()])  # name = 1
        self.assertEqual(fields[2], [b"onnxruntime_onnx"])  # platform = 2
        self.assertEqual(fields[4], [8])               # max_batch_size = 4
        self.assertEqual(fields[17], [b"numaserve"])   # backend = 17
        self.assertEqual(len(fields[5]), 1)            # input = 5
        self.assertEqual(len(fields[6]), 1)            # output = 6
        self.assertEqual(len(fields[7]), 1)            # instance_group = 7
        self.assertEqual(len(fields[11]), 1)           # dynamic_batching = 11
        self.assertEqual(len(fields[14]), 4)           # parameters = 14 (map entries)
        model_input = wire_fields(fields[5][0])
        self.assertEqual(model_input[1], [b"image"])   # ModelInput.name = 1
        self.assertEqual(model_input[2], [11])         # data_type = 2: TYPE_FP32 = 11
        self.assertIn(4, model_input)                  # dims = 4
        model_output = wire_fields(fields[6][0])
        self.assertEqual(model_output[2], [11])
        self.assertIn(3, model_output)                 # ModelOutput.dims = 3
        self.assertEqual(wire_fields(fields[7][0])[4], [2])  # kind = 4: KIND_CPU = 2
        self.assertEqual(wire_fields(fields[11][0])[2], [2000])  # max_queue_delay = 2

        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=MODEL, version="7"), timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)


def wire_fields(data):
    """{field number: [value, ...]} of a serialized protobuf message: ints for
    varints, bytes for length-delimited fields (fixed-width fields are not
    expected here)."""
    def varint(pos):
        value, shift = 0, 0
        while True:
            byte = data[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value, pos

    fields, pos = {}, 0
    while pos < len(data):
        key, pos = varint(pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = varint(pos)
        elif wire_type == 2:
            length, pos = varint(pos)
            value, pos = data[pos:pos + length], pos + length
        else:
            raise AssertionError("unexpected wire type %d for field %d" % (wire_type, number))
        fields.setdefault(number, []).append(value)
    return fields


if __name__ == "__main__":
    unittest.main()
