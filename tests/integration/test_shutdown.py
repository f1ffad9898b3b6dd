#!/usr/bin/python3
"""Graceful shutdown: SIGTERM with requests in flight (unary calls, or a
stream the client keeps open) lets them finish successfully and the server
exits 0 within a bounded time; a cancelled queued call leaves the queue at
once without being computed."""

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

SLOW = "deep_mlp"
WIDTH, LAYERS = 1024, 64      # about 0.13 GFLOP per row
BATCH = 256                   # a fraction of a second per request on 2 cores
REQUESTS = 6
EXIT_WITHIN_S = 40.0


class ShutdownTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_shutdown_")
        model = nc.deep_mlp_model(WIDTH, LAYERS)
        nc.write_model(cls.repo, SLOW, model)
        # One input for every request: the NumPy reference costs as much as
        # the server's work, so it is computed once.
        cls.x = np.random.default_rng(1).random((BATCH, WIDTH), dtype=np.float32)
        cls.expected = nc.ReferenceModel(model).run({"x": cls.x})["y"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.repo, ignore_errors=True)

    def test_sigterm_drains_in_flight_requests(self):
        server = nc.ServerProcess(self.repo, ["--shutdown-timeout", "30"],
                                  stop_timeout=EXIT_WITHIN_S).start()
        try:
            results = [None] * REQUESTS
            done = threading.Event()
            lock = threading.Lock()

            def send(i):
                channel = server.new_channel()
                stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
                try:
                    y = nc.infer(stub, SLOW, {"x": self.x}, deadline=60)["y"]
                    outcome = (grpc.StatusCode.OK, y)
                except grpc.RpcError as e:
                    outcome = (e.code(), e.details())
                finally:
                    channel.close()
                with lock:
                    results[i] = outcome + (time.monotonic(),)
                done.set()

            threads = [threading.Thread(target=send, args=(i,), daemon=True)
                       for i in range(REQUESTS)]
            for t in threads:
                t.start()
            # Once the first answer is back, the others have long been sent
            # and wait for the one worker.
            self.assertTrue(done.wait(60), "no answer within 60 s\n" + server.stderr_text(4000))
            os.kill(server.pid, signal.SIGTERM)
            signalled = time.monotonic()

            for t in threads:
                t.join(70)
            self.assertFalse([t for t in threads if t.is_alive()],
                             "requests still waiting 70 s after SIGTERM\n"
                             + server.stderr_text(4000))
            try:
                server.proc.wait(EXIT_WITHIN_S)
            except Exception:
                self.fail("numaserve still running %.0f s after SIGTERM\n%s"
                          % (EXIT_WITHIN_S, server.stderr_text(4000)))
            exited = time.monotonic()
        finally:
            code = server.stop()

        log = "\n--- server stderr ---\n" + server.stderr_text(4000)
        in_flight = [i for i, r in enumerate(results) if r[2] > signalled]
        self.assertGreaterEqual(len(in_flight), 2,
                                "the test needs requests in flight at SIGTERM; only %s were "
                                "(make the model slower)" % in_flight)
        for i, (code_i, value, _) in enumerate(results):
            what = "request %d (%d x %d rows, %s SIGTERM)" % (
                i, BATCH, WIDTH, "in flight at" if i in in_flight else "answered before")
            self.assertEqual(code_i, grpc.StatusCode.OK,
                             "%s: %s %r%s" % (what, code_i, value, log))
            np.testing.assert_allclose(value, self.expected, rtol=1e-3, atol=1e-4,
                                       err_msg=what)
        self.assertEqual(code, 0, "exit code after SIGTERM" + log)
        self.assertLess(exited - signalled, EXIT_WITHIN_S)
        print("\n%d of %d requests in flight at SIGTERM; exit 0 %.2f s after it"
              % (len(in_flight), REQUESTS, exited - signalled), file=sys.stderr)

    def test_new_requests_refused_while_draining(self):
        """After SIGTERM a new request is refused (UNAVAILABLE) or served,
        never left hanging."""
        server = nc.ServerProcess(self.repo, stop_timeout=EXIT_WITHIN_S).start()
        try:
            stub = server.stub()
            # Four slow calls (~0.1 s each on 2 cores, run one after another
            # or batched together) keep the drain open well past the late
            # request below, so that it arrives while the server drains and
            # not during gRPC's own final shutdown.
            slow = [threading.Thread(target=lambda: self.call_quietly(stub), daemon=True)
                    for _ in range(4)]
            for t in slow:
                t.start()
            time.sleep(0.05)
            os.kill(server.pid, signal.SIGTERM)
            time.sleep(0.05)
            late = server.new_channel()
            try:
                nc.infer(nc.pb_grpc.GRPCInferenceServiceStub(late), SLOW,
                         {"x": self.x[:1]}, deadline=30)
                outcome = grpc.StatusCode.OK
            except grpc.RpcError as e:
                outcome = e.code()
            finally:
                late.close()
            self.assertIn(outcome, (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE),
                          "a request sent while draining\n" + server.stderr_text(4000))
            for t in slow:
                t.join(60)
        finally:
            code = server.stop()
        self.assertEqual(code, 0, "exit code after SIGTERM\n" + server.stderr_text(4000))

    def test_sigterm_answers_every_request_read_on_a_stream(self):
        """A ModelStreamInfer stream the client keeps open: at SIGTERM every
        request it has sent is computed and answered, then the server ends
        the stream itself (UNAVAILABLE, not a cancelled call) and exits 0."""
        server = nc.ServerProcess(self.repo, ["--shutdown-timeout", "30"],
                                  stop_timeout=EXIT_WITHIN_S).start()
        channel = server.new_channel()
        release = threading.Event()
        ids = ["s%d" % i for i in range(REQUESTS)]
        answers = {}
        first = threading.Event()
        final = {}

        def requests():
            for rid in ids:
                yield nc.make_request(SLOW, {"x": self.x}, request_id=rid)
            release.wait(120)  # the client never half-closes on its own

        def read():
            stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                for reply in stub.ModelStreamInfer(requests(), timeout=120):
                    answers[reply.infer_response.id] = reply
                    first.set()
                final["code"] = grpc.StatusCode.OK
            except grpc.RpcError as e:
                final["code"], final["details"] = e.code(), e.details()

        reader = threading.Thread(target=read, daemon=True)
        try:
            reader.start()
            self.assertTrue(first.wait(60), "no answer within 60 s\n" + server.stderr_text(4000))
            os.kill(server.pid, signal.SIGTERM)
            answered_before = len(answers)
            reader.join(70)
            self.assertFalse(reader.is_alive(), "the stream was still open 70 s after SIGTERM\n"
                             + server.stderr_text(4000))
            try:
                server.proc.wait(EXIT_WITHIN_S)
            except Exception:
                self.fail("numaserve still running %.0f s after SIGTERM\n%s"
                          % (EXIT_WITHIN_S, server.stderr_text(4000)))
        finally:
            release.set()
            code = server.stop()
            channel.close()

        log = "\n--- server stderr ---\n" + server.stderr_text(4000)
        self.assertLess(answered_before, REQUESTS,
                        "the test needs requests in flight at SIGTERM (make the model slower)")
        self.assertEqual(sorted(answers), sorted(ids), "requests left unanswered" + log)
        for rid in ids:
            reply = answers[rid]
            self.assertEqual(reply.error_message, "", rid + log)
            np.testing.assert_allclose(nc.decode_outputs(reply.infer_response)["y"],
                                       self.expected, rtol=1e-3, atol=1e-4, err_msg=rid)
        self.assertEqual(final.get("code"), grpc.StatusCode.UNAVAILABLE, repr(final) + log)
        self.assertIn("shutting down", final.get("details", ""))
        self.assertEqual(code, 0, "exit code after SIGTERM" + log)
        print("\n%d of %d stream requests in flight at SIGTERM, all answered"
              % (REQUESTS - answered_before, REQUESTS), file=sys.stderr)

    def test_cancelled_request_leaves_the_queue_at_once(self):
        """A queued call the client cancels is answered at once (counted as
        a failure, reason canceled) and never computed, while the worker is
        still busy with the calls ahead of it."""
        server = nc.ServerProcess(self.repo, ["--max-workers", "1"],
                                  stop_timeout=EXIT_WITHIN_S).start()
        try:
            stub = server.stub()
            # Several seconds each on 2 cores (about 1.5 s per 1024 rows
            # when the machine is otherwise idle): the first busy call must
            # still be running when the cancel has gone through, even when
            # ctest runs other tests beside this one (at 1024 rows it once
            # finished first and the third busy call left the queue too).
            busy_x = np.tile(self.x, (12, 1))

            def statistics():
                stats = stub.ModelStatistics(nc.pb.ModelStatisticsRequest(name=SLOW),
                                             timeout=10).model_stats
                return stats[0] if stats else nc.pb.ModelStatistics()

            def counts():
                m = server.metrics()
                return (m.sum("numaserve_request_failures_total", model=SLOW,
                              reason="canceled"),
                        m.sum("numaserve_pending_requests", model=SLOW))

            before_stats = statistics()
            canceled_before, _ = counts()
            busy_results = []

            def busy():
                channel = server.new_channel()
                try:
                    nc.infer(nc.pb_grpc.GRPCInferenceServiceStub(channel), SLOW,
                             {"x": busy_x}, deadline=120)
                    busy_results.append("ok")
                except grpc.RpcError as e:
                    busy_results.append(e.code())
                finally:
                    channel.close()

            # The one worker takes two commands at once: two busy calls fill
            # it and a third waits in the queue; the victim queues behind it.
            busy_threads = [threading.Thread(target=busy, daemon=True) for _ in range(3)]
            for t in busy_threads:
                t.start()
            self.assertTrue(nc.wait_until(lambda: counts()[1] == 1, timeout=30),
                            "the third busy call never waited in the queue: %r" % (counts(),))
            victim = stub.ModelInfer.future(nc.make_request(SLOW, {"x": self.x[:1]}),
                                            timeout=60)
            self.assertTrue(nc.wait_until(lambda: counts()[1] == 2, timeout=30),
                            "the victim never waited in the queue: %r" % (counts(),))
            self.assertTrue(victim.cancel())
            left = nc.wait_until(lambda: counts() == (canceled_before + 1, 1), timeout=20)
            still_busy = [t for t in busy_threads if t.is_alive()]
            self.assertTrue(left, "the cancelled call did not leave the queue: %r"
                            % (counts(),))
            self.assertTrue(still_busy, "the cancelled call left the queue only once the "
                            "worker was free")
            for t in busy_threads:
                t.join(120)
            self.assertEqual(busy_results, ["ok"] * 3)
            after = statistics()
            # The cancelled row was never computed.
            self.assertEqual(after.inference_count - before_stats.inference_count,
                             3 * busy_x.shape[0])
            self.assertEqual(after.inference_stats.fail.count
                             - before_stats.inference_stats.fail.count, 1)
        finally:
            code = server.stop()
        self.assertEqual(code, 0, server.stderr_text(4000))

    def test_sigint_when_idle(self):
        server = nc.ServerProcess(self.repo, stop_timeout=EXIT_WITHIN_S).start()
        started = time.monotonic()
        code = server.stop(sig=signal.SIGINT)
        self.assertEqual(code, 0, "exit code after SIGINT\n" + server.stderr_text(4000))
        self.assertLess(time.monotonic() - started, 15, "an idle server should stop promptly")
        self.assertEqual(nc.child_pids(server.pid), set(), "workers left behind")

    def call_quietly(self, stub):
        try:
            nc.infer(stub, SLOW, {"x": self.x}, deadline=60)
        except grpc.RpcError:
            pass


if __name__ == "__main__":
    unittest.main()
