#!/usr/bin/python3
"""What one client can make the server hold, against the real server:

* a request too large for a worker's batch memory is refused alone
  (RESOURCE_EXHAUSTED naming --worker-arena-mb) while other callers' small
  requests, sent at the same moment, are all answered;
* accepted, unanswered requests are bounded by bytes (--max-inflight-bytes-mb):
  beyond it a request is refused at once, and once the held ones are answered
  new ones are taken again;
* a request's bytes stay on that budget until its reply is written: a
  stream whose client does not read its replies holds the budget, and
  other clients are refused, until the stream ends;
* a ModelStreamInfer stream is read ahead at most --max-stream-outstanding
  requests: the model's queue never holds more of that stream's requests,
  and every request on the stream is still answered in order;
* one run's activations are bounded per model (config.pbtxt
  max_activation_bytes, else --max-activation-mb): a request to a model
  served one request per run whose activations grow as rows^2 is refused
  with RESOURCE_EXHAUSTED naming the model, the bytes and the options,
  and the worker serves on without a restart;
* requests that each fit a batched model's activation limit, batched
  together past it, are all answered with the right numbers (the worker
  runs the batch in chunks of rows that fit), and only a request of which
  one row does not fit is refused.

Every batch takes a known time (--test-batch-compute-us) so requests stay
held long enough to see the bounds.
"""

import os
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = "wide"
WIDTH = 1024  # 4 KiB in and 4 KiB out per row


def wide_model():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"], name="plus_one")], MODEL,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", WIDTH])],
        [numpy_helper.from_array(np.ones((WIDTH,), dtype=np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def rows(n, seed):
    return np.random.default_rng(seed).random((n, WIDTH), dtype=np.float32)


class Server:
    def __init__(self, config, args):
        self.repo = tempfile.mkdtemp(prefix="numaserve_bounds_")
        nc.write_model(self.repo, MODEL, wide_model())
        with open(os.path.join(self.repo, MODEL, "config.pbtxt"), "w") as f:
            f.write(config)
        self.server = nc.ServerProcess(self.repo, args).start()

    def close(self):
        nc.stop_server_and_remove(self.server, self.repo)


class BoundsTest(unittest.TestCase):

    def test_a_request_too_large_for_a_batch_is_refused_alone(self):
        # 2 MiB arena: a batch may take 1 MiB, 128 rows of 8 KiB.
        s = Server("max_batch_size: 256\ndynamic_batching { max_queue_delay_microseconds: 20000 }\n",
                   ["--worker-arena-mb", "2"])
        try:
            def call(i, stub):
                x = rows(200 if i == 0 else 8, i)
                try:
                    y = nc.infer(stub, MODEL, {"x": x})["y"]
                    np.testing.assert_allclose(y, x + 1, rtol=1e-6)
                    return grpc.StatusCode.OK, ""
                except grpc.RpcError as e:
                    return e.code(), e.details()

            results = nc.call_together(s.server, 17, call)
            code, details = results[0]
            self.assertEqual(code, grpc.StatusCode.RESOURCE_EXHAUSTED, details)
            self.assertIn("--worker-arena-mb", details)
            for i, (code, details) in enumerate(results[1:], 1):
                self.assertEqual(code, grpc.StatusCode.OK, "caller %d: %s" % (i, details))
        finally:
            s.close()

    def test_accepted_bytes_are_bounded(self):
        # Each request: 40 rows, 160 KiB in + 160 KiB out + its response:
        # about 480 KiB held, so 1 MiB holds two. Every batch takes 0.4 s.
        s = Server("max_batch_size: 0\n",
                   ["--max-inflight-bytes-mb", "1", "--test-batch-compute-us", "400000"])
        try:
            def call(i, stub):
                start = time.monotonic()
                try:
                    nc.infer(stub, MODEL, {"x": rows(40, i)})
                    return grpc.StatusCode.OK, "", time.monotonic() - start
                except grpc.RpcError as e:
                    return e.code(), e.details(), time.monotonic() - start

            results = nc.call_together(s.server, 6, call)
            codes = [r[0] for r in results]
            refused = [r for r in results if r[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
            self.assertGreaterEqual(codes.count(grpc.StatusCode.OK), 2, results)
            self.assertTrue(refused, results)
            self.assertEqual(codes.count(grpc.StatusCode.OK) + len(refused), 6, results)
            for code, details, seconds in refused:
                self.assertIn("--max-inflight-bytes-mb", details)
                self.assertLess(seconds, 0.35, "refused after %.2f s, not at once" % seconds)
            # Held requests answered: new ones are taken again.
            x = rows(40, 99)
            np.testing.assert_allclose(nc.infer(s.server.stub(), MODEL, {"x": x})["y"], x + 1,
                                       rtol=1e-6)
        finally:
            s.close()

    def test_replies_a_client_does_not_read_hold_the_budget(self):
        # Two requests of 40 rows (about 480 KiB held each) on a stream whose
        # client never reads: answered, their 160 KiB replies cannot be
        # written past the client's 64 KiB window, and they keep their bytes
        # on the 1 MiB budget until they are, so another client's request is
        # refused. Once the stream is cancelled the budget is free again.
        s = Server("max_batch_size: 0\n", ["--max-inflight-bytes-mb", "1"])
        reader = grpc.insecure_channel(s.server.grpc_address, options=[
            ("grpc.max_send_message_length", nc.MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", nc.MAX_MESSAGE_BYTES),
            ("grpc.http2.bdp_probe", 0)])  # the window stays at 64 KiB
        try:
            requests = [nc.make_request(MODEL, {"x": rows(40, i)}) for i in range(2)]
            unread = nc.pb_grpc.GRPCInferenceServiceStub(reader).ModelStreamInfer(iter(requests), timeout=60)

            def answered():
                return s.server.metrics().sum("numaserve_requests_total", model=MODEL,
                                              outcome="success") >= 2
            self.assertTrue(nc.wait_until(answered, 30), "the stream's requests were not computed")
            x = rows(40, 7)
            with self.assertRaises(grpc.RpcError) as refused:
                nc.infer(s.server.stub(), MODEL, {"x": x})
            self.assertEqual(refused.exception.code(), grpc.StatusCode.RESOURCE_EXHAUSTED,
                             refused.exception.details())
            self.assertIn("--max-inflight-bytes-mb", refused.exception.details())
            unread.cancel()

            def served():
                try:
                    return [nc.infer(s.server.stub(), MODEL, {"x": x})["y"]]
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
                    return None
            y = nc.wait_until(served, 30)
            self.assertIsNotNone(y, "the cancelled stream's bytes never left the budget")
            np.testing.assert_allclose(y[0], x + 1, rtol=1e-6)
        finally:
            reader.close()
            s.close()

    def test_a_stream_is_read_ahead_only_so_far(self):
        limit, count = 4, 24
        s = Server("max_batch_size: 0\n",
                   ["--max-stream-outstanding", str(limit), "--test-batch-compute-us", "50000"])
        try:
            inputs = [rows(1, i) for i in range(count)]
            requests = [nc.make_request(MODEL, {"x": x}) for x in inputs]
            for i, r in enumerate(requests):
                r.id = str(i)
            most_pending = [0.0]
            done = threading.Event()

            def sample():
                while not done.is_set():
                    pending = s.server.metrics().sum("numaserve_pending_requests", model=MODEL)
                    most_pending[0] = max(most_pending[0], pending)
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                replies = list(s.server.stub().ModelStreamInfer(iter(requests), timeout=60))
            finally:
                done.set()
                sampler.join()
            self.assertEqual(len(replies), count)
            for i, reply in enumerate(replies):
                self.assertEqual(reply.error_message, "", reply.error_message)
                self.assertEqual(reply.infer_response.id, str(i))
                y = nc.decode_outputs(reply.infer_response)["y"]
                np.testing.assert_allclose(y, inputs[i] + 1, rtol=1e-6)
            # Read ahead by `limit` at most: one computing, one in the
            # worker's pipeline slot, the rest queued.
            self.assertLessEqual(most_pending[0], limit, "pending requests peaked at %g"
                                 % most_pending[0])
        finally:
            s.close()


def gram_model(name):
    """x [n, 8] -> mean over j of x_i . x_j: [n, 1], through an [n, n]
    activation (rows^2 floats; each row depends on every other, so it is
    served one request per run)."""
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0], name="t"),
         helper.make_node("MatMul", ["x", "xt"], ["g"], name="gram"),
         helper.make_node("ReduceMean", ["g"], ["y"], axes=[1], keepdims=1, name="mean")],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


class ActivationLimitTest(unittest.TestCase):
    """A model served one request per run takes any number of rows; its
    [n, n] activation is 4 MiB at 1024 rows and 1.6 MiB at 640. `capped`
    sets max_activation_bytes to 1 MiB, `default` none (the server's
    --max-activation-mb 2 applies)."""

    def test_a_request_needing_more_activation_bytes_than_the_limit_is_refused(self):
        repo = tempfile.mkdtemp(prefix="numaserve_activation_")
        for name, config in (("capped", "max_batch_size: 0\nmax_activation_bytes: 1048576\n"),
                             ("default", "max_batch_size: 0\n")):
            nc.write_model(repo, name, gram_model(name))
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                f.write(config)
        server = nc.ServerProcess(repo, ["--max-activation-mb", "2"]).start()
        try:
            stub = server.stub()
            workers = server.worker_pids()

            def expect_served(model, n):
                x = np.random.default_rng(n).random((n, 8), dtype=np.float32)
                y = nc.infer(stub, model, {"x": x})["y"]
                np.testing.assert_allclose(y, (x @ x.T).mean(axis=1, keepdims=True), rtol=1e-4)

            def expect_refused(model, n, limit, option):
                x = np.zeros((n, 8), dtype=np.float32)
                with self.assertRaises(grpc.RpcError) as caught:
                    nc.infer(stub, model, {"x": x})
                e = caught.exception
                what = "%s at %d rows: %s %s\n%s" % (model, n, e.code(), e.details(),
                                                     server.stderr_text(4000))
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, what)
                for mention in ("model '%s' version 1" % model, "a batch of %d rows needs" % n,
                                "above the limit of %d" % limit, option,
                                "max_activation_bytes", "--max-activation-mb"):
                    self.assertIn(mention, e.details(), what)

            expect_served("capped", 256)
            expect_refused("capped", 640, 1 << 20, "config.pbtxt max_activation_bytes")
            expect_served("default", 640)
            expect_refused("default", 1024, 2 << 20, "serve --max-activation-mb")
            # Refused in the worker before anything of that size: the same
            # workers serve on, none restarted.
            expect_served("capped", 256)
            expect_served("default", 16)
            self.assertEqual(server.worker_pids(), workers)
            self.assertEqual(server.metrics().sum("numaserve_worker_restarts_total"), 0)
        finally:
            nc.stop_server_and_remove(server, repo)


def two_layers_model(name):
    """x [n, 64] -> relu(x . w) [n, 256] -> . v -> y [n, 4]: rows
    independent (batched), 1 KiB of activations per row at least."""
    w, v = layer_weights()
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"], name="up"),
         helper.make_node("Relu", ["h"], ["r"], name="relu"),
         helper.make_node("MatMul", ["r", "v"], ["y"], name="down")],
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def layer_weights():
    rng = np.random.default_rng(7)
    return (rng.standard_normal((64, 256), dtype=np.float32) * 0.125,
            rng.standard_normal((256, 4), dtype=np.float32) * 0.125)


class ActivationLimitOfABatchTest(unittest.TestCase):
    """`split` batches up to 64 rows but may need only 16 KiB of
    activations per run (at least 1 KiB a row: 16 rows at most); requests of
    2 rows each fit alone. `tiny` may need 512 bytes, less than one row."""

    ROWS = 2
    CALLERS = 16

    def test_requests_that_fit_batched_past_the_limit_are_all_served(self):
        repo = tempfile.mkdtemp(prefix="numaserve_activation_batch_")
        batching = ("max_batch_size: 64\ndynamic_batching { max_queue_delay_microseconds: 1000000 "
                    "preferred_batch_size: [ %d ] }\n" % (self.ROWS * self.CALLERS))
        for name, limit in (("split", 16384), ("tiny", 512)):
            nc.write_model(repo, name, two_layers_model(name))
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                f.write(batching + "max_activation_bytes: %d\n" % limit)
        server = nc.ServerProcess(repo).start()
        try:
            w, v = layer_weights()
            workers = server.worker_pids()

            def call(i, stub):
                x = np.random.default_rng(100 + i).random((self.ROWS, 64), dtype=np.float32)
                try:
                    y = nc.infer(stub, "split", {"x": x})["y"]
                    np.testing.assert_allclose(y, np.maximum(x @ w, 0) @ v, rtol=1e-4,
                                               atol=1e-5)
                    return grpc.StatusCode.OK, ""
                except grpc.RpcError as e:
                    return e.code(), e.details()

            results = nc.call_together(server, self.CALLERS, call)
            for i, result in enumerate(results):
                self.assertIsNotNone(result, "caller %d did not finish" % i)
                code, details = result
                self.assertEqual(code, grpc.StatusCode.OK, "caller %d: %s\n%s"
                                 % (i, details, server.stderr_text(4000)))
            # They were batched past the limit: at least one run of more
            # than 16 rows, which needs more than 16 KiB.
            stats = stub_statistics(server.stub(), "split")
            sizes = sorted(b.batch_size for b in stats.batch_stats)
            self.assertGreater(max(sizes), 16, "batch sizes %s" % sizes)
            self.assertEqual(stats.inference_count, self.ROWS * self.CALLERS)

            x = np.zeros((1, 64), dtype=np.float32)
            with self.assertRaises(grpc.RpcError) as caught:
                nc.infer(server.stub(), "tiny", {"x": x})
            e = caught.exception
            self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED, e.details())
            for mention in ("model 'tiny' version 1", "a batch of 1 rows needs",
                            "above the limit of 512", "max_activation_bytes"):
                self.assertIn(mention, e.details())
            self.assertEqual(server.worker_pids(), workers)
            self.assertEqual(server.metrics().sum("numaserve_worker_restarts_total"), 0)
        finally:
            nc.stop_server_and_remove(server, repo)


def stub_statistics(stub, model):
    response = stub.ModelStatistics(nc.pb.ModelStatisticsRequest(name=model), timeout=10)
    return response.model_stats[0]


if __name__ == "__main__":
    unittest.main()
