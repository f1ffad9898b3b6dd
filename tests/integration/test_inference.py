#!/usr/bin/python3
"""KServe v2 inference against a real numaserve: health, metadata, results
compared with a NumPy evaluation of the ONNX graph, and every error path.

The repository holds the default model, a corrupt model (random bytes for
model.onnx) and a model directory without any version.
"""

import os
import sys
import tempfile
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
BROKEN = "corrupt_model"
NO_VERSION = "model_without_version"
RTOL, ATOL = 1e-4, 1e-5


class InferenceTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_inference_")
        cls.model_path = nc.write_default_model(cls.repo)
        os.makedirs(os.path.join(cls.repo, BROKEN, "1"))
        with open(os.path.join(cls.repo, BROKEN, "1", "model.onnx"), "wb") as f:
            f.write(np.random.default_rng(7).bytes(4096))
        os.makedirs(os.path.join(cls.repo, NO_VERSION))
        cls.reference = nc.ReferenceModel(cls.model_path)
        cls.server = nc.ServerProcess(cls.repo).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    # -- helpers

    def server_log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(4000)

    def assert_rpc_error(self, code, call, what, mentions=()):
        """CALL() must fail with CODE; its details must contain MENTIONS."""
        with self.assertRaises(grpc.RpcError, msg="%s: expected %s, got success"
                               % (what, code.name)) as caught:
            call()
        error = caught.exception
        self.assertEqual(error.code(), code, "%s: expected %s, got %s (%r)"
                         % (what, code.name, error.code(), error.details()))
        self.assertTrue(error.details(), "%s: %s without a message" % (what, code.name))
        for word in mentions:
            self.assertIn(word, error.details(),
                          "%s: the %s message should name %r" % (what, code.name, word))
        return error

    def assert_matches_reference(self, images, got, what):
        expected = self.reference.run({"image": images})["probabilities"]
        self.assertEqual(got.shape, expected.shape, "%s: output shape" % what)
        self.assertEqual(got.dtype, np.float32, "%s: output dtype" % what)
        np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL,
                                   err_msg="%s: probabilities differ from the NumPy "
                                           "evaluation of the ONNX graph" % what)
        np.testing.assert_allclose(got.sum(axis=1), np.ones(len(images)), rtol=0, atol=1e-5,
                                   err_msg="%s: rows of probabilities must sum to 1" % what)

    def request(self, batch=2, **kwargs):
        return nc.make_request(MODEL, {"image": nc.random_images(batch, seed=batch)}, **kwargs)

    # -- server and health

    def test_server_live_and_ready(self):
        self.assertTrue(self.stub.ServerLive(nc.pb.ServerLiveRequest()).live, "ServerLive")
        self.assertTrue(self.stub.ServerReady(nc.pb.ServerReadyRequest()).ready, "ServerReady")

    def test_health_serving(self):
        response = self.server.health_stub().Check(nc.health_pb.HealthCheckRequest(service=""))
        self.assertEqual(response.status, nc.health_pb.HealthCheckResponse.SERVING,
                         "grpc.health.v1.Health/Check(service='')")

    def test_health_per_service(self):
        # The health protocol: services report their own status, and
        # unknown names get NOT_FOUND.
        service = "inference.GRPCInferenceService"
        health = self.server.health_stub()
        response = error = None
        try:
            response = health.Check(nc.health_pb.HealthCheckRequest(service=service))
        except grpc.RpcError as e:
            error = e
        if error is not None:
            self.fail("grpc.health.v1.Health/Check(service=%r): %s %r"
                      % (service, error.code(), error.details()))
        self.assertEqual(response.status, nc.health_pb.HealthCheckResponse.SERVING,
                         "grpc.health.v1.Health/Check(service=%r)" % service)
        self.assert_rpc_error(
            grpc.StatusCode.NOT_FOUND,
            lambda: health.Check(nc.health_pb.HealthCheckRequest(service="no.such.Service")),
            "grpc.health.v1.Health/Check(service='no.such.Service')")

    def test_server_metadata(self):
        response = self.stub.ServerMetadata(nc.pb.ServerMetadataRequest())
        self.assertEqual(response.name, "numaserve", "ServerMetadata name")
        self.assertTrue(response.version, "ServerMetadata version is empty")

    # -- models

    def test_model_ready(self):
        self.assertTrue(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=MODEL)).ready,
                        "ModelReady(%s)" % MODEL)
        self.assertTrue(
            self.stub.ModelReady(nc.pb.ModelReadyRequest(name=MODEL, version="1")).ready,
            "ModelReady(%s, version '1')" % MODEL)

    def test_model_metadata(self):
        response = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=MODEL))
        self.assertEqual(response.name, MODEL)
        self.assertIn("1", list(response.versions), "ModelMetadata versions")
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in response.inputs],
                         [("image", "FP32", [-1, 1, 28, 28])], "ModelMetadata inputs")
        self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in response.outputs],
                         [("probabilities", "FP32", [-1, 10])], "ModelMetadata outputs")

    def test_infer_matches_reference(self):
        for batch in (1, 7, 64):
            for raw in (True, False):
                with self.subTest(batch=batch, raw=raw):
                    what = "ModelInfer batch %d via %s" % (
                        batch, "raw_input_contents" if raw else "contents.fp32_contents")
                    images = nc.random_images(batch, seed=100 + batch)
                    request = nc.make_request(MODEL, {"image": images}, raw=raw)
                    response = self.stub.ModelInfer(request, timeout=30)
                    self.assertEqual(response.model_name, MODEL, what)
                    self.assertEqual([o.name for o in response.outputs], ["probabilities"], what)
                    self.assertEqual(list(response.outputs[0].shape), [batch, 10], what)
                    self.assertEqual(response.outputs[0].datatype, "FP32", what)
                    self.assertEqual(len(response.raw_output_contents), 1,
                                     what + ": outputs come in raw_output_contents")
                    got = nc.decode_outputs(response)["probabilities"]
                    self.assert_matches_reference(images, got, what)

    def test_request_id_echoed(self):
        request = self.request(batch=1)
        request.id = "req-42"
        response = self.stub.ModelInfer(request, timeout=30)
        self.assertEqual(response.id, "req-42", "ModelInfer with id 'req-42'")

    def test_requested_output_by_name(self):
        images = nc.random_images(3, seed=3)
        outputs = nc.infer(self.stub, MODEL, {"image": images}, outputs=["probabilities"])
        self.assertEqual(list(outputs), ["probabilities"], "outputs=['probabilities']")
        self.assert_matches_reference(images, outputs["probabilities"],
                                      "ModelInfer requesting output 'probabilities'")

    def test_unknown_requested_output(self):
        request = self.request(outputs=["logits"])
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer requesting unknown output 'logits'", ["logits"])

    def test_explicit_version(self):
        images = nc.random_images(2, seed=11)
        outputs = nc.infer(self.stub, MODEL, {"image": images}, version="1")
        self.assert_matches_reference(images, outputs["probabilities"],
                                      "ModelInfer with model_version '1'")

    def test_unknown_version(self):
        request = self.request(version="2")
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer with model_version '2'")
        self.assert_rpc_error(
            grpc.StatusCode.NOT_FOUND,
            lambda: self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=MODEL, version="2")),
            "ModelMetadata with version '2'")

    def test_unknown_model(self):
        request = nc.make_request("no_such_model", {"image": nc.random_images(1)})
        self.assert_rpc_error(grpc.StatusCode.NOT_FOUND,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer for model 'no_such_model'", ["no_such_model"])
        self.assert_rpc_error(
            grpc.StatusCode.NOT_FOUND,
            lambda: self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name="no_such_model")),
            "ModelMetadata for model 'no_such_model'")
        # As Triton answers (tritonclient asks before loading): not ready,
        # not an error.
        self.assertFalse(self.stub.ModelReady(nc.pb.ModelReadyRequest(name="no_such_model"),
                                              timeout=10).ready, "ModelReady of an unknown model")
        self.assertFalse(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=MODEL, version="2"),
                                              timeout=10).ready, "ModelReady of an unknown version")

    # -- invalid requests

    def test_wrong_datatype(self):
        images = nc.random_images(2)
        # Real FP64 bytes, labelled FP64.
        request = nc.make_request(MODEL, {"image": images.astype(np.float64)})
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "image as FP64 [2,1,28,28]", ["image"])
        # FP32 bytes (right size) labelled INT32.
        request = nc.make_request(MODEL, {"image": images})
        request.inputs[0].datatype = "INT32"
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "image of 6272 FP32 bytes labelled INT32", ["image"])

    def test_wrong_shape(self):
        cases = [
            ("image [2,1,28,27]", nc.random_images(2)[:, :, :, :27].copy()),
            ("image [2,28,28] (rank 3)", nc.random_images(2).reshape(2, 28, 28)),
            ("image [2,784] (rank 2)", nc.random_images(2).reshape(2, 784)),
            ("image [2,2,28,28]", np.zeros((2, 2, 28, 28), np.float32)),
        ]
        for what, array in cases:
            with self.subTest(what=what):
                request = nc.make_request(MODEL, {"image": array})
                self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                                      lambda: self.stub.ModelInfer(request, timeout=30),
                                      "ModelInfer with " + what, ["image"])

    def test_byte_count_mismatch(self):
        request = self.request(batch=2)
        request.raw_input_contents[0] = request.raw_input_contents[0][:-4]
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "shape [2,1,28,28] with 6268 raw bytes (needs 6272)", ["image"])
        request = self.request(batch=2)
        request.raw_input_contents[0] += b"\0" * 4
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "shape [2,1,28,28] with 6276 raw bytes (needs 6272)", ["image"])
        request = self.request(batch=2, raw=False)
        del request.inputs[0].contents.fp32_contents[-1]
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "shape [2,1,28,28] with 1567 fp32_contents (needs 1568)", ["image"])

    def test_raw_and_typed_contents_together(self):
        request = self.request(batch=2)
        request.inputs[0].contents.fp32_contents.extend([0.5] * (2 * 28 * 28))
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "image in both raw_input_contents and fp32_contents", ["image"])

    def test_raw_contents_count_mismatch(self):
        request = self.request(batch=2)
        request.raw_input_contents.append(b"\0" * 16)
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "one input with two raw_input_contents entries")

    def test_malformed_messages_are_refused_with_the_offset(self):
        # ModelInfer and ModelStreamInfer read their messages from gRPC's
        # buffers (raw_infer.cc): bytes that are not a ModelInferRequest are
        # refused naming the offset, on a stream as that request's answer,
        # and a good request right after is answered.
        good = self.request(batch=2).SerializeToString()
        name = nc.pb.ModelInferRequest(model_name=MODEL).SerializeToString()
        malformed = [
            (name + b"\x3a\x05abc", "at byte %d: a field runs past the end" % len(name)),
            (good + b"\x0b", "at byte %d: a group or an unknown wire type" % len(good)),
            (name + b"\x02\x00", "at byte %d: field number 0" % len(name)),
        ]
        channel = self.server.channel()
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=lambda b: b,
                                    response_deserializer=nc.pb.ModelInferResponse.FromString)
        for wire, words in malformed:
            self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                                  lambda: infer(wire, timeout=30), "malformed %r" % wire[-8:],
                                  ["the ModelInferRequest is malformed", words])
        # Raw contents split by the reader match the request's NumPy answer.
        images = nc.random_images(2, seed=2)
        got = nc.decode_outputs(infer(good, timeout=30))["probabilities"]
        self.assert_matches_reference(images, got, "ModelInfer read from gRPC's buffers")
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=lambda b: b,
            response_deserializer=nc.pb.ModelStreamInferResponse.FromString)
        replies = list(stream(iter([malformed[0][0], good]), timeout=60))
        self.assertEqual(len(replies), 2, [r.error_message for r in replies])
        self.assertIn("malformed at byte", replies[0].error_message)
        self.assertEqual(replies[1].error_message, "")
        got = nc.decode_outputs(replies[1].infer_response)["probabilities"]
        self.assert_matches_reference(images, got, "ModelStreamInfer after a malformed request")

    def test_missing_input(self):
        request = nc.pb.ModelInferRequest(model_name=MODEL)
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer with no inputs", ["image"])

    def test_unknown_input(self):
        images = nc.random_images(1)
        request = nc.make_request(MODEL, {"image": images, "extra": images})
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer with inputs 'image' and 'extra'", ["extra"])
        request = nc.make_request(MODEL, {"picture": images})
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer with only input 'picture'", ["picture"])

    # -- models that cannot serve

    def test_corrupt_model(self):
        ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=BROKEN))
        self.assertFalse(ready.ready, "ModelReady(%s) of random bytes" % BROKEN)
        self.assert_rpc_error(
            grpc.StatusCode.UNAVAILABLE,
            lambda: self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=BROKEN)),
            "ModelMetadata(%s) of random bytes" % BROKEN, [BROKEN])
        request = nc.make_request(BROKEN, {"image": nc.random_images(1)})
        self.assert_rpc_error(grpc.StatusCode.UNAVAILABLE,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              "ModelInfer(%s) of random bytes" % BROKEN, [BROKEN])
        self.check_good_model_serves("after requests to the corrupt model")

    def test_model_without_version(self):
        ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=NO_VERSION))
        self.assertFalse(ready.ready, "ModelReady(%s), a directory with no version" % NO_VERSION)
        request = nc.make_request(NO_VERSION, {"image": nc.random_images(1)})
        with self.assertRaises(grpc.RpcError, msg="ModelInfer(%s)" % NO_VERSION) as caught:
            self.stub.ModelInfer(request, timeout=30)
        self.assertIn(caught.exception.code(),
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND),
                      "ModelInfer(%s): %r" % (NO_VERSION, caught.exception.details()))
        self.check_good_model_serves("after requests to the model without a version")

    def test_good_model_serves_after_errors(self):
        for request in (self.request(version="2"), self.request(outputs=["nope"]),
                        nc.pb.ModelInferRequest(model_name=MODEL)):
            with self.assertRaises(grpc.RpcError):
                self.stub.ModelInfer(request, timeout=30)
        self.check_good_model_serves("after a run of invalid requests")
        self.assertTrue(self.stub.ServerReady(nc.pb.ServerReadyRequest()).ready,
                        "ServerReady after invalid requests" + self.server_log())

    def check_good_model_serves(self, when):
        images = nc.random_images(5, seed=55)
        outputs = nc.infer(self.stub, MODEL, {"image": images})
        self.assert_matches_reference(images, outputs["probabilities"],
                                      "%s batch 5 %s" % (MODEL, when))


if __name__ == "__main__":
    unittest.main()
