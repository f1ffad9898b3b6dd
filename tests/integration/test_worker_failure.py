#!/usr/bin/python3
"""A worker killed with SIGKILL under traffic: every request succeeds with
correct numbers (the batch the worker held runs again on another worker,
or on its replacement; requests that arrive while the only worker restarts
wait for it), nothing hangs, the supervisor restarts the worker, and
requests are served again within seconds."""

import collections
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

MODEL = nc.DEFAULT_MODEL_NAME
CLIENT_THREADS = 4
REQUEST_DEADLINE_S = 20.0
RECOVERY_S = 5.0            # requests succeed again within this long of the kill
TRAFFIC_AFTER_KILL_S = 7.0  # how long traffic goes on after the kill
RTOL, ATOL = 1e-4, 1e-5

Result = collections.namedtuple("Result", "thread start end code details batch")


class Traffic:
    """CLIENT_THREADS threads sending ModelInfer in a loop, each on its own
    channel, checking every answer against precomputed references."""

    def __init__(self, server, inputs, expected):
        self.server = server
        self.inputs = inputs
        self.expected = expected
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.results = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(CLIENT_THREADS)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        """Stops the threads; returns the names of threads still running
        after every request has had time to reach its deadline."""
        self.stop_event.set()
        deadline = time.monotonic() + REQUEST_DEADLINE_S + 10
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]

    def successes(self):
        with self.lock:
            return sum(1 for r in self.results if r.code == grpc.StatusCode.OK)

    def _run(self, index):
        channel = self.server.new_channel()
        stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
        n = index
        try:
            while not self.stop_event.is_set():
                k = n % len(self.inputs)
                n += 1
                images = self.inputs[k]
                start = time.monotonic()
                code, details = grpc.StatusCode.OK, ""
                try:
                    got = nc.infer(stub, MODEL, {"image": images},
                                   deadline=REQUEST_DEADLINE_S)["probabilities"]
                    if not np.allclose(got, self.expected[k], rtol=RTOL, atol=ATOL):
                        code, details = None, "wrong numbers: max abs error %g" % float(
                            np.max(np.abs(got - self.expected[k])))
                except grpc.RpcError as e:
                    code, details = e.code(), e.details()
                except Exception as e:  # a malformed answer is a failure too
                    code, details = None, "%s: %s" % (type(e).__name__, e)
                end = time.monotonic()
                with self.lock:
                    self.results.append(Result(index, start, end, code, details, len(images)))
                if code != grpc.StatusCode.OK:
                    time.sleep(0.01)  # no busy loop while no worker answers
        finally:
            channel.close()


class WorkerFailureTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_worker_failure_")
        path = nc.write_default_model(cls.repo)
        reference = nc.ReferenceModel(path)
        cls.inputs = [nc.random_images(b, seed=b) for b in (1, 4, 16, 64)]
        cls.expected = [reference.run({"image": x})["probabilities"] for x in cls.inputs]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.repo, ignore_errors=True)

    def kill_worker_under_traffic(self, server, expected_workers):
        """Runs traffic, SIGKILLs one worker, checks every outcome and the
        restart; returns the killed pid."""
        def log():
            return "\n--- server stderr (tail) ---\n" + server.stderr_text(6000)

        def workers_if(condition):
            pids = server.worker_pids()
            return pids if condition(pids) else None

        before = nc.wait_until(lambda: workers_if(lambda p: len(p) == expected_workers), 10)
        self.assertTrue(before, "expected %d worker processes, found %s%s"
                        % (expected_workers, server.worker_pids(), log()))
        restarts_before = server.metrics().sum("numaserve_worker_restarts_total")

        traffic = Traffic(server, self.inputs, self.expected).start()
        try:
            warmed = nc.wait_until(lambda: traffic.successes() >= 20, 15)
            self.assertTrue(warmed, "fewer than 20 successful requests before the kill%s" % log())
            victim = min(before)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            time.sleep(TRAFFIC_AFTER_KILL_S)
        finally:
            hung = traffic.stop()
        self.assertEqual(hung, [], "client threads still waiting %.0f s after the traffic "
                         "stopped (a request hung)%s" % (REQUEST_DEADLINE_S + 10, log()))

        results = traffic.results
        by_code = collections.Counter(str(r.code) for r in results)
        slowest = max((r.end - r.start for r in results), default=0.0)
        summary = "%d requests around the kill of worker pid %d: %s, slowest %.2f s" % (
            len(results), victim, dict(by_code), slowest)
        print("\n%d worker(s): %s" % (expected_workers, summary), file=sys.stderr)
        bad = [r for r in results if r.code != grpc.StatusCode.OK]
        self.assertEqual(bad[:5], [], "every request must succeed with the right numbers: "
                         "nothing accepted is lost to the kill; %s%s" % (summary, log()))

        recovered = [r for r in results if r.code == grpc.StatusCode.OK
                     and r.start >= killed_at and r.end <= killed_at + RECOVERY_S]
        self.assertTrue(recovered, "no request started after the kill succeeded within %.0f s; "
                        "%s%s" % (RECOVERY_S, summary, log()))
        late_failures = [r for r in results if r.start >= killed_at + RECOVERY_S
                         and r.code != grpc.StatusCode.OK]
        self.assertEqual(late_failures, [], "requests started more than %.0f s after the kill "
                         "still fail; %s%s" % (RECOVERY_S, summary, log()))
        late = [r for r in results if r.start >= killed_at + RECOVERY_S]
        self.assertTrue(late, "no request was sent after the recovery window; " + summary)

        # The supervisor replaced the worker: a new pid, the old one gone.
        after = nc.wait_until(lambda: workers_if(
            lambda p: len(p) == expected_workers and victim not in p), 10)
        self.assertTrue(after, "worker pids %s -> %s after killing %d%s"
                        % (sorted(before), sorted(server.worker_pids()), victim, log()))
        self.assertNotIn(victim, after)
        self.assertTrue(after - before, "no new worker pid: %s -> %s"
                        % (sorted(before), sorted(after)))
        self.assertEqual(before - after, {victim}, "only the killed worker should be replaced: "
                         "%s -> %s" % (sorted(before), sorted(after)))

        def restarted():
            m = server.metrics()
            return (m.sum("numaserve_worker_restarts_total") > restarts_before
                    and m.sum("numaserve_worker_ready") == expected_workers)

        self.assertTrue(nc.wait_until(restarted, 10),
                        "after the restart: worker_restarts_total should exceed %g and "
                        "worker_ready sum to %d\n%s" % (restarts_before, expected_workers,
                                                        server.scrape()))
        self.assertTrue(server.stub().ServerReady(nc.pb.ServerReadyRequest()).ready,
                        "ServerReady after the restart")
        return victim

    def test_two_workers_one_killed(self):
        with nc.ServerProcess(self.repo, ["--domain", "core"]) as server:
            self.kill_worker_under_traffic(server, expected_workers=2)

    def test_single_worker_killed(self):
        with nc.ServerProcess(self.repo) as server:
            self.kill_worker_under_traffic(server, expected_workers=1)


if __name__ == "__main__":
    unittest.main()
