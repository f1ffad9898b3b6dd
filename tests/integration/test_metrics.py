#!/usr/bin/python3
"""Prometheus metrics of a real numaserve: the page passes
`promtool check metrics`, and the counters add up to the requests sent."""

import os
import subprocess
import sys
import tempfile
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")

# What setUpClass sends.
BATCHES = [1, 3, 8, 2, 16]          # successful requests
INVALID_ARGUMENT_REQUESTS = 3       # wrong datatype, wrong shape, missing input
NOT_FOUND_REQUESTS = 2              # unknown version of the model


class MetricsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_metrics_")
        nc.write_default_model(cls.repo)
        cls.server = nc.ServerProcess(cls.repo, args=("--measure-bandwidth",)).start()
        stub = cls.server.stub()
        cls.before = cls.server.metrics()
        for i, batch in enumerate(BATCHES):
            nc.infer(stub, MODEL, {"image": nc.random_images(batch, seed=i)})
        images = nc.random_images(2)
        invalid = [nc.make_request(MODEL, {"image": images.astype(np.float64)}),
                   nc.make_request(MODEL, {"image": images.reshape(2, 28, 28)}),
                   nc.pb.ModelInferRequest(model_name=MODEL)]
        not_found = [nc.make_request(MODEL, {"image": images}, version="2")] * NOT_FOUND_REQUESTS
        cls.failures = []
        for request, code in ([(r, grpc.StatusCode.INVALID_ARGUMENT) for r in invalid]
                              + [(r, grpc.StatusCode.NOT_FOUND) for r in not_found]):
            try:
                stub.ModelInfer(request, timeout=30)
                cls.failures.append("succeeded, expected %s" % code.name)
            except grpc.RpcError as e:
                if e.code() != code:
                    cls.failures.append("%s, expected %s" % (e.code(), code.name))
        cls.text = cls.server.scrape()
        cls.metrics = nc.Metrics(cls.text)

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def delta(self, name, **labels):
        return self.metrics.sum(name, **labels) - self.before.sum(name, **labels)

    def test_requests_failed_as_expected(self):
        self.assertEqual(self.failures, [], "error requests sent by setUpClass")

    def test_promtool_check_metrics(self):
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=self.text,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0,
                         "promtool check metrics failed:\n%s\n--- page ---\n%s"
                         % (result.stdout, self.text))

    def test_request_outcomes(self):
        where = "\n--- page ---\n" + self.text
        self.assertEqual(self.delta("numaserve_requests_total", model=MODEL, outcome="success"),
                         len(BATCHES),
                         "requests_total{outcome=success} after %d successful requests%s"
                         % (len(BATCHES), where))
        self.assertEqual(self.delta("numaserve_requests_total", model=MODEL,
                                    outcome="invalid_argument"),
                         INVALID_ARGUMENT_REQUESTS,
                         "requests_total{outcome=invalid_argument} after %d invalid requests%s"
                         % (INVALID_ARGUMENT_REQUESTS, where))
        self.assertEqual(self.delta("numaserve_requests_total", model=MODEL,
                                    outcome="not_found"),
                         NOT_FOUND_REQUESTS,
                         "requests_total{outcome=not_found} after %d requests for version '2'%s"
                         % (NOT_FOUND_REQUESTS, where))

    def test_inferences_count_rows(self):
        rows = sum(BATCHES)
        self.assertEqual(self.delta("numaserve_inferences_total", model=MODEL), rows,
                         "inferences_total after batches %s" % BATCHES)
        self.assertEqual(self.delta("numaserve_worker_inferences_total"), rows,
                         "worker_inferences_total (all workers) after batches %s" % BATCHES)

    def test_worker_counters(self):
        self.assertGreater(self.delta("numaserve_worker_flops_total"), 0,
                           "worker_flops_total after %d rows" % sum(BATCHES))
        self.assertGreater(self.delta("numaserve_worker_busy_seconds_total"), 0,
                           "worker_busy_seconds_total after %d rows" % sum(BATCHES))
        workers = self.metrics.find("numaserve_worker_ready")
        self.assertTrue(workers, "no numaserve_worker_ready samples")
        for _, labels, value in workers:
            self.assertIn("worker", labels)
            self.assertIn("numa_node", labels)
            self.assertEqual(value, 1, "worker_ready %s" % labels)
        self.assertEqual(self.metrics.sum("numaserve_worker_restarts_total"), 0,
                         "worker_restarts_total with no worker killed")

    def test_flops_match_model(self):
        # Dense layers 784->256->128->10: 2*(784*256 + 256*128 + 128*10) FLOPs
        # per row for the matrix products; bias, ReLU and softmax add a few.
        per_row = 2 * (784 * 256 + 256 * 128 + 128 * 10)
        flops = self.delta("numaserve_worker_flops_total")
        rows = sum(BATCHES)
        self.assertGreaterEqual(flops, per_row * rows,
                                "worker_flops_total %g for %d rows" % (flops, rows))
        self.assertLess(flops, 1.5 * per_row * rows,
                        "worker_flops_total %g for %d rows" % (flops, rows))

    def test_model_ready_and_weights(self):
        self.assertEqual(self.metrics.sum("numaserve_model_ready", model=MODEL, version="1"), 1,
                         "model_ready{model=%s,version=1}" % MODEL)
        weights = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
        samples = self.metrics.find("numaserve_model_weight_bytes", model=MODEL)
        self.assertTrue(samples, "no numaserve_model_weight_bytes for %s" % MODEL)
        for _, labels, value in samples:
            self.assertGreaterEqual(value, weights, "model_weight_bytes %s" % labels)

    def test_histograms(self):
        # Every answered request is timed, failed ones too.
        n = self.delta("numaserve_requests_total", model=MODEL)
        self.assertEqual(self.delta("numaserve_request_duration_seconds_count", model=MODEL), n,
                         "request_duration_seconds_count != requests_total (%d)" % n)
        for name in ("numaserve_request_duration_seconds", "numaserve_queue_duration_seconds",
                     "numaserve_compute_duration_seconds",
                     "numaserve_compute_input_duration_seconds",
                     "numaserve_compute_output_duration_seconds", "numaserve_batch_size_rows"):
            with self.subTest(histogram=name):
                self.assertTrue(self.metrics.has(name + "_count"), name + "_count missing")
                self.assertGreater(self.metrics.sum(name + "_count"), 0, name + "_count")
                self.assertTrue(self.metrics.has(name + "_bucket", le="+Inf"),
                                name + '_bucket{le="+Inf"} missing')
                self.assertEqual(self.metrics.sum(name + "_bucket", le="+Inf"),
                                 self.metrics.sum(name + "_count"),
                                 name + ': bucket{le="+Inf"} != count')
                self.assertGreater(self.metrics.sum(name + "_sum"), 0, name + "_sum")

    def test_executions_and_failure_reasons(self):
        # Without config.pbtxt every request is a batch of its own.
        self.assertEqual(self.delta("numaserve_executions_total", model=MODEL, version="1"),
                         len(BATCHES))
        self.assertEqual(self.delta("numaserve_batch_size_rows_sum", model=MODEL, version="1"),
                         sum(BATCHES))
        self.assertEqual(self.delta("numaserve_request_failures_total", model=MODEL,
                                    reason="invalid"), 3)
        self.assertEqual(self.delta("numaserve_request_failures_total", model=MODEL,
                                    reason="not_found"), NOT_FOUND_REQUESTS)
        self.assertEqual(self.metrics.sum("numaserve_pending_requests", model=MODEL, version="1"),
                         0)
        self.assertTrue(self.metrics.has("numaserve_pending_requests", model=MODEL, version="1"))

    def test_worker_utilisation_and_memory(self):
        gflops = self.metrics.find("numaserve_worker_achieved_gflops")
        self.assertTrue(gflops, "no numaserve_worker_achieved_gflops")
        self.assertGreater(sum(v for _, _, v in gflops), 0)
        fractions = [v for _, _, v in self.metrics.find("numaserve_worker_peak_fraction_ratio")]
        self.assertTrue(fractions, "no numaserve_worker_peak_fraction_ratio")
        self.assertTrue(all(0 <= f < 1.5 for f in fractions), fractions)
        self.assertGreater(max(fractions), 0)
        # Sampled once a second from /proc/<pid>/statm.
        resident = nc.wait_until(
            lambda: self.server.metrics().sum("numaserve_worker_resident_memory_bytes") > 0,
            timeout=10)
        self.assertTrue(resident, "numaserve_worker_resident_memory_bytes stayed 0")
        # The machine's limits, from the CPU model and (--measure-bandwidth)
        # a triad run at start.
        peaks = self.metrics.find("numaserve_worker_peak_flops", precision="fp32")
        self.assertTrue(peaks, "no numaserve_worker_peak_flops")
        self.assertTrue(all(1e9 < v < 1e14 for _, _, v in peaks), peaks)
        for _, labels, _ in self.metrics.find("numaserve_worker_peak_flops"):
            self.assertIn(labels["precision"], ("fp32", "bf16", "int8"), labels)
        bandwidth = self.metrics.find("numaserve_memory_bandwidth_bytes_per_second")
        self.assertTrue(bandwidth, "no numaserve_memory_bandwidth_bytes_per_second")
        self.assertTrue(all(1e8 < v < 1e13 for _, _, v in bandwidth), bandwidth)
        loads = self.metrics.find("numaserve_model_load_duration_seconds", model=MODEL)
        self.assertTrue(loads, "no numaserve_model_load_duration_seconds")
        self.assertTrue(all(v > 0 for _, _, v in loads), loads)

    def test_workers_memory_is_on_their_own_node(self):
        # Read by each worker from /proc/self/numa_maps after loading: its
        # weights are first touched by its own (node-bound) threads, so its
        # pages lie on its node; at most a sliver elsewhere (the process image).
        nodes = self.metrics.find("numaserve_worker_node_memory_bytes")
        self.assertTrue(nodes, "no numaserve_worker_node_memory_bytes")
        by_worker = {}
        for _, labels, value in nodes:
            self.assertIn("memory_node", labels)
            here = by_worker.setdefault(labels["worker"], [0.0, 0.0])
            here[0 if labels["memory_node"] == labels["numa_node"] else 1] += value
        weights = 4 * (784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10)
        for worker, (local, remote) in by_worker.items():
            self.assertGreater(local, weights, "worker %s: %r" % (worker, nodes))
            self.assertLess(remote, 0.05 * (local + remote), "worker %s: %r" % (worker, nodes))


if __name__ == "__main__":
    unittest.main()
