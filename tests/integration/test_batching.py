#!/usr/bin/python3
"""Dynamic batching, back-pressure, message limits and config.pbtxt against
the real server: concurrent callers each get their own rows back from shared
batches, a full queue answers RESOURCE_EXHAUSTED and the server recovers,
oversized declared shapes are refused before allocation, a bad config makes
only its model unavailable, and SIGTERM under load loses no accepted
request."""

import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
SLOW = "slow"
BAD_SYNTAX = "bad_syntax"
CONTRADICTS = "contradicts_onnx"
CALLERS = 64
MAX_MESSAGE = 4 << 20
RTOL, ATOL = 1e-4, 1e-5

BATCHED_CONFIG = """
max_batch_size: 64
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""
# One request of 64 rows of a 64-layer 1024-wide MLP is ~8.6 GFLOP: tens of
# milliseconds, so a burst of them overflows a queue of one.
SLOW_CONFIG = """
max_batch_size: 64
dynamic_batching { max_queue_size: 1 }
"""
SLOW_ROWS = 64


def write_config(repo, name, text):
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(text)


def copy_model(repo, source, name):
    shutil.copytree(os.path.join(repo, source), os.path.join(repo, name))


class BatchingTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_batching_")
        cls.model_path = nc.write_default_model(cls.repo)
        cls.reference = nc.ReferenceModel(cls.model_path)
        copy_model(cls.repo, MODEL, BAD_SYNTAX)
        copy_model(cls.repo, MODEL, CONTRADICTS)
        write_config(cls.repo, MODEL, BATCHED_CONFIG)
        write_config(cls.repo, BAD_SYNTAX, "max_batch_size: 8\nmax_batch_sise: 4\n")
        write_config(cls.repo, CONTRADICTS,
                     'max_batch_size: 8\ninput { name: "pixels" data_type: "FP32" }\n')
        nc.write_model(cls.repo, SLOW, nc.deep_mlp_model(1024, 64))
        write_config(cls.repo, SLOW, SLOW_CONFIG)
        cls.server = nc.ServerProcess(
            cls.repo, ["--grpc-max-message-bytes", str(MAX_MESSAGE)]).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(4000)

    def assert_rpc_error(self, code, call, mentions=()):
        with self.assertRaises(grpc.RpcError) as caught:
            call()
        self.assertEqual(caught.exception.code(), code, caught.exception.details())
        for word in mentions:
            self.assertIn(word, caught.exception.details())
        return caught.exception

    def test_concurrent_callers_get_their_own_rows_from_shared_batches(self):
        before = self.server.metrics()
        # Caller i sends (i % 3) + 1 distinct rows: batches mix request sizes.
        rows = [(i % 3) + 1 for i in range(CALLERS)]
        images = [nc.random_images(r, seed=100 + i) for i, r in enumerate(rows)]
        expected = [self.reference.run({"image": x})["probabilities"] for x in images]
        results = nc.call_together(
            self.server, CALLERS,
            lambda i, stub: nc.infer(stub, MODEL, {"image": images[i]},
                                     deadline=60)["probabilities"])
        for i, got in enumerate(results):
            self.assertIsInstance(got, np.ndarray, "caller %d: %r%s" % (i, got, self.log()))
            np.testing.assert_allclose(got, expected[i], rtol=RTOL, atol=ATOL,
                                       err_msg="caller %d got rows that are not its own" % i)

        after = self.server.metrics()

        def delta(name, **labels):
            return after.sum(name, **labels) - before.sum(name, **labels)

        executions = delta("numaserve_executions_total", model=MODEL, version="1")
        inferences = delta("numaserve_inferences_total", model=MODEL)
        self.assertEqual(inferences, sum(rows))
        self.assertGreater(executions, 0)
        self.assertLess(executions, CALLERS,
                        "64 concurrent callers were computed in %d batches: no batching"
                        % executions)
        batch_rows = delta("numaserve_batch_size_rows_sum", model=MODEL, version="1")
        self.assertEqual(batch_rows, sum(rows))
        self.assertGreater(batch_rows / executions, 1.0)
        self.assertLessEqual(
            delta("numaserve_batch_size_rows_bucket", model=MODEL, version="1", le="64"),
            executions)
        self.assertEqual(
            delta("numaserve_batch_size_rows_bucket", model=MODEL, version="1", le="+Inf"),
            executions, "a batch exceeded max_batch_size 64")

    def test_full_queue_refuses_at_once_and_the_server_recovers(self):
        x = np.random.default_rng(3).random((SLOW_ROWS, 1024), dtype=np.float32)
        before = self.server.metrics().sum("numaserve_request_failures_total", model=SLOW,
                                           reason="rejected")
        codes = []
        lock = threading.Lock()

        def call():
            channel = self.server.new_channel()
            stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                nc.infer(stub, SLOW, {"x": x}, deadline=120)
                code = grpc.StatusCode.OK
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    self.assertIn("queue is full", e.details())
            finally:
                channel.close()
            with lock:
                codes.append(code)

        for attempt in range(5):
            threads = [threading.Thread(target=call) for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(180)
            if grpc.StatusCode.RESOURCE_EXHAUSTED in codes:
                break
        self.assertIn(grpc.StatusCode.RESOURCE_EXHAUSTED, codes,
                      "bursts of 16 never overflowed a queue of 1" + self.log())
        self.assertIn(grpc.StatusCode.OK, codes)
        self.assertEqual(set(codes) - {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED},
                         set())
        rejected = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
        after = self.server.metrics().sum("numaserve_request_failures_total", model=SLOW,
                                          reason="rejected")
        self.assertEqual(after - before, rejected)
        # Recovered: a lone request is served.
        y = nc.infer(self.stub, SLOW, {"x": x[:2]}, deadline=60)["y"]
        self.assertEqual(y.shape, (2, 1024))

    def test_request_over_max_batch_size_is_invalid(self):
        self.assert_rpc_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: nc.infer(self.stub, MODEL, {"image": nc.random_images(65)}),
            mentions=("65 rows", "max_batch_size"))

    def test_declared_shape_over_the_message_limit_is_refused_before_allocation(self):
        request = nc.make_request(MODEL, {"image": nc.random_images(1)})
        # Claims 2 million images (6 GB) but carries one.
        del request.inputs[0].shape[:]
        request.inputs[0].shape.extend([2000000, 1, 28, 28])
        self.assert_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                              lambda: self.stub.ModelInfer(request, timeout=30),
                              mentions=("image", "message limit"))
        # A message really over the limit is refused by gRPC itself.
        too_big = np.zeros((MAX_MESSAGE // 4096 + 8, 1024), dtype=np.float32)
        self.assert_rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              lambda: nc.infer(self.stub, SLOW, {"x": too_big}))
        # The server is fine afterwards.
        self.assertEqual(nc.infer(self.stub, MODEL, {"image": nc.random_images(2)})
                         ["probabilities"].shape, (2, 10))

    def test_config_errors_make_only_their_model_unavailable(self):
        for name, words in ((BAD_SYNTAX, ("config.pbtxt:2:", "max_batch_sise")),
                            (CONTRADICTS, ("pixels", "no such tensor"))):
            ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=name), timeout=10)
            self.assertFalse(ready.ready, name)
            self.assert_rpc_error(
                grpc.StatusCode.UNAVAILABLE,
                lambda: self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=name),
                                                timeout=10),
                mentions=words)
        self.assertTrue(self.stub.ModelReady(nc.pb.ModelReadyRequest(name=MODEL),
                                             timeout=10).ready)


class DrainUnderLoadTest(unittest.TestCase):
    """SIGTERM while 16 callers keep sending: every request the server took
    is answered correctly; the others are refused UNAVAILABLE."""

    def test_sigterm_under_load_loses_no_accepted_request(self):
        repo = tempfile.mkdtemp(prefix="numaserve_drain_")
        try:
            model_path = nc.write_default_model(repo)
            write_config(repo, MODEL, BATCHED_CONFIG)
            reference = nc.ReferenceModel(model_path)
            server = nc.ServerProcess(repo, ["--shutdown-timeout", "30"]).start()
            x = nc.random_images(4, seed=9)
            expected = reference.run({"image": x})["probabilities"]
            outcomes = []
            lock = threading.Lock()
            stop = threading.Event()

            def caller():
                channel = server.new_channel()
                stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
                while not stop.is_set():
                    try:
                        got = nc.infer(stub, MODEL, {"image": x}, deadline=60)["probabilities"]
                        ok = np.allclose(got, expected, rtol=RTOL, atol=ATOL)
                        outcome = "ok" if ok else "wrong"
                    except grpc.RpcError as e:
                        outcome = e.code().name
                        if e.code() != grpc.StatusCode.UNAVAILABLE:
                            outcome += ": " + str(e.details())
                        if e.code() == grpc.StatusCode.UNAVAILABLE:
                            # Readiness is gone: a client stops (or goes elsewhere).
                            with lock:
                                outcomes.append(outcome)
                            break
                    with lock:
                        outcomes.append(outcome)
                channel.close()

            threads = [threading.Thread(target=caller, daemon=True) for _ in range(16)]
            for t in threads:
                t.start()
            time.sleep(1.0)
            with lock:
                served_before = outcomes.count("ok")
            self.assertGreater(served_before, 0, server.stderr_text(4000))
            signalled = time.monotonic()
            code = server.stop(timeout=40)
            took = time.monotonic() - signalled
            stop.set()
            for t in threads:
                t.join(30)
            self.assertEqual(code, 0, server.stderr_text(4000))
            self.assertLess(took, 35.0)
            unexpected = [o for o in outcomes if o not in ("ok", "UNAVAILABLE")]
            self.assertEqual(unexpected, [], "accepted requests failed or were wrong during "
                             "the drain\n" + server.stderr_text(4000))
        finally:
            shutil.rmtree(repo, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
