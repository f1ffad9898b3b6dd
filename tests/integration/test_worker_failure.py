#!/usr/bin/python3
"""A worker killed with SIGKILL under traffic: every request succeeds with
correct numbers (the batch the worker held runs again on another worker,
or on its replacement; requests that arrive while the only worker restarts
wait for it), nothing hangs, the supervisor restarts the worker, and
requests are served again within seconds. A model loaded by request
while a worker restarts is served on that worker too, and one unloaded
meanwhile is freed there."""

import collections
import os
import re
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


# Two workers on any machine, one per node of a synthetic topology.
TOPOLOGY = "package:1 numa:2 core:1 pu:1"


def worker_index(pid):
    """The --index of worker PID, or None when PID is not a worker."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            args = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if len(args) < 4 or args[1] != "worker" or "--index" not in args:
        return None
    return int(args[args.index("--index") + 1])


class ModelsChangedWhileAWorkerRestartsTest(unittest.TestCase):
    """Worker 1 is SIGKILLed; its replacement is sent the models of the
    list as it was when it started, the slow one first (a 4096 x 4096
    layer: a second or more to load). A model loaded by request meanwhile
    must be loaded there too, and one unloaded meanwhile freed there. The
    workers log each load and unload (--log-level debug)."""

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_restart_models_")
        nc.write_model(cls.repo, "slow", nc.deep_mlp_model(4096, 1, seed=3))
        nc.write_model(cls.repo, "small", nc.deep_mlp_model(64, 2, seed=4))
        cls.x = np.random.default_rng(6).random((2, 64), dtype=np.float32)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.repo, ignore_errors=True)

    def serve(self):
        return nc.ServerProcess(self.repo, [
            "--model-control-mode", "explicit", "--topology", TOPOLOGY, "--domain", "numa",
            "--log-level", "debug"])

    @staticmethod
    def load(server, name):
        server.stub().RepositoryModelLoad(nc.pb.RepositoryModelLoadRequest(model_name=name),
                                          timeout=120)

    @staticmethod
    def unload(server, name):
        server.stub().RepositoryModelUnload(nc.pb.RepositoryModelUnloadRequest(model_name=name),
                                            timeout=60)

    @staticmethod
    def ready(server):
        """{worker index: numaserve_worker_ready}."""
        return {int(labels["worker"]): value for _, labels, value
                in server.metrics().find("numaserve_worker_ready")}

    def wait_ready(self, server):
        self.assertTrue(nc.wait_until(lambda: self.ready(server) == {0: 1, 1: 1}, 60),
                        "workers not ready: %s\n%s" % (self.ready(server), server.stderr_text()))

    def restart_worker_1(self, server):
        """SIGKILLs worker 1 and waits until its replacement has started
        (the supervisor then sends it its loads); returns the length of the
        server's stderr up to that line."""
        victims = [pid for pid in server.worker_pids() if worker_index(pid) == 1]
        self.assertEqual(len(victims), 1, server.stderr_text())
        os.kill(victims[0], signal.SIGKILL)
        started = re.compile(r"worker 1 \(.*\) pid (\d+) started")

        def replacement_started():
            text = server.stderr_text(tail=0)
            for match in started.finditer(text):
                if int(match.group(1)) != victims[0]:
                    return match.end()
            return None
        offset = nc.wait_until(replacement_started, 30)
        self.assertTrue(offset, "worker 1 was not restarted\n" + server.stderr_text())
        return offset

    def rows(self, server):
        """{worker index: numaserve_worker_inferences_total}."""
        return {int(labels["worker"]): value for _, labels, value
                in server.metrics().find("numaserve_worker_inferences_total")}

    def test_a_model_loaded_while_a_worker_restarts_serves_on_every_worker(self):
        with self.serve() as server:
            self.load(server, "slow")
            self.wait_ready(server)
            offset = self.restart_worker_1(server)
            self.load(server, "small")
            self.assertEqual(self.ready(server)[1], 0,
                             "worker 1 finished restarting before the load was answered")
            self.wait_ready(server)
            log = server.stderr_text(tail=0)[offset:]
            self.assertIn("worker 1: small:1 loaded", log, "the restarted worker never loaded "
                          "the model loaded while it restarted\n" + log)
            before = self.rows(server)
            for _ in range(8):
                nc.infer(server.stub(), "small", {"x": self.x})
            after = self.rows(server)
            for w in (0, 1):
                self.assertGreater(after.get(w, 0), before.get(w, 0),
                                   "no request reached worker %d: %s -> %s" % (w, before, after))

    def test_a_model_unloaded_while_a_worker_restarts_is_freed_there(self):
        with self.serve() as server:
            self.load(server, "slow")
            self.load(server, "small")
            self.wait_ready(server)
            offset = self.restart_worker_1(server)
            self.unload(server, "small")
            self.assertEqual(self.ready(server)[1], 0,
                             "worker 1 finished restarting before the unload was answered")
            self.wait_ready(server)

            def worker_1_log():
                return server.stderr_text(tail=0)[offset:]
            # Sent small:1 when it started, before the unload: it loads it,
            # then frees it.
            self.assertTrue(nc.wait_until(lambda: "worker 1: small:1 loaded" in worker_1_log(), 30),
                            worker_1_log())
            self.assertTrue(nc.wait_until(lambda: "worker 1: small:1 unloaded" in worker_1_log(),
                                          10),
                            "the restarted worker keeps the model unloaded while it restarted\n"
                            + worker_1_log())
            with self.assertRaises(grpc.RpcError) as caught:
                nc.infer(server.stub(), "small", {"x": self.x})
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)


if __name__ == "__main__":
    unittest.main()
