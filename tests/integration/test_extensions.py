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

    def test_model_config(self):
        config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=MODEL), timeout=10).config
        self.assertEqual(config.name, MODEL)
        self.assertEqual(config.max_batch_size, 8)
        self.assertEqual(list(config.dynamic_batching.preferred_batch_size), [4])
        self.assertEqual(config.dynamic_batching.max_queue_delay_microseconds, 2000)
        self.assertEqual([(t.name, t.data_type, list(t.dims)) for t in config.input],
                         [("image", "FP32", [1, 28, 28])])
        self.assertEqual([(t.name, list(t.dims)) for t in config.output],
                         [("probabilities", [10])])
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=MODEL, version="7"), timeout=10)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)


if __name__ == "__main__":
    unittest.main()
