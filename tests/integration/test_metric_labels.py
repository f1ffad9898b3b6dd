#!/usr/bin/python3
"""Metric labels come from the model repository, never from request text:
300 requests naming made-up models (ModelInfer and ModelStreamInfer) leave
no trace of those names on /metrics; they are counted under model="" (the
documented label of requests for no known model), while requests for a
known model, even for a version it lacks, keep its name. The page still
passes `promtool check metrics`."""

import os
import subprocess
import sys
import tempfile
import unittest
import uuid

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
UNARY_NAMES = 280
STREAM_NAMES = 20
KNOWN_BAD_VERSION = 2


class MetricLabelsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_metric_labels_")
        nc.write_default_model(cls.repo)
        cls.server = nc.ServerProcess(cls.repo).start()
        stub = cls.server.stub()
        images = nc.random_images(1)
        tag = uuid.uuid4().hex[:8]
        cls.names = ["made_up_%s_%03d" % (tag, i) for i in range(UNARY_NAMES + STREAM_NAMES)]
        cls.codes = []
        for name in cls.names[:UNARY_NAMES]:
            try:
                stub.ModelInfer(nc.make_request(name, {"image": images}), timeout=30)
                cls.codes.append("OK")
            except grpc.RpcError as e:
                cls.codes.append(e.code().name)
        stream = [nc.make_request(name, {"image": images}) for name in cls.names[UNARY_NAMES:]]
        cls.stream_errors = [r.error_message for r in stub.ModelStreamInfer(iter(stream),
                                                                            timeout=60)]
        for _ in range(KNOWN_BAD_VERSION):
            try:
                stub.ModelInfer(nc.make_request(MODEL, {"image": images}, version="7"),
                                timeout=30)
            except grpc.RpcError as e:
                cls.codes.append("known:" + e.code().name)
        nc.infer(stub, MODEL, {"image": images})
        cls.text = cls.server.scrape()
        cls.metrics = nc.Metrics(cls.text)

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def test_requests_failed_as_expected(self):
        self.assertEqual(self.codes, ["NOT_FOUND"] * UNARY_NAMES
                         + ["known:NOT_FOUND"] * KNOWN_BAD_VERSION)
        self.assertEqual(len(self.stream_errors), STREAM_NAMES)
        for error in self.stream_errors:
            self.assertIn("NOT_FOUND", error)

    def test_made_up_names_never_become_labels(self):
        leaked = [name for name in self.names if name in self.text]
        self.assertEqual(leaked, [], "%d made-up model names on /metrics, e.g. %s"
                         % (len(leaked), leaked[:3]))
        models = {labels["model"] for _, labels, _ in self.metrics.samples if "model" in labels}
        self.assertEqual(models, {MODEL, ""}, "model label values on /metrics")

    def test_unknown_models_count_under_the_empty_label(self):
        unknown = UNARY_NAMES + STREAM_NAMES
        self.assertEqual(self.metrics.sum("numaserve_requests_total", model="",
                                          outcome="not_found"), unknown)
        self.assertEqual(self.metrics.sum("numaserve_request_failures_total", model="",
                                          reason="not_found"), unknown)
        self.assertEqual(self.metrics.sum("numaserve_request_duration_seconds_count", model=""),
                         unknown)

    def test_a_known_model_keeps_its_name(self):
        self.assertEqual(self.metrics.sum("numaserve_requests_total", model=MODEL,
                                          outcome="not_found"), KNOWN_BAD_VERSION)
        self.assertEqual(self.metrics.sum("numaserve_requests_total", model=MODEL,
                                          outcome="success"), 1)

    def test_promtool_check_metrics(self):
        result = subprocess.run([PROMTOOL, "check", "metrics"], input=self.text,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=60)
        self.assertEqual(result.returncode, 0, "promtool check metrics failed:\n%s"
                         % result.stdout)


if __name__ == "__main__":
    unittest.main()
