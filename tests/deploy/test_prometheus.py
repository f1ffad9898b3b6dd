#!/usr/bin/python3
"""deploy/prometheus and deploy/grafana: `promtool check config`, `promtool
check rules` and `promtool test rules` (every alert has a test that fires
it) pass; the Grafana dashboard is well-formed, covers the figures it must,
and every metric name its queries and the alert rules use is one a real
numaserve exports (read from its /metrics page after some traffic)."""

import json
import os
import shutil
import signal
import unittest

import grpc
import yaml

import deploy_common as dc
from deploy_common import nc

PROMETHEUS_DIR = dc.deploy_path("prometheus")
RULES = os.path.join(PROMETHEUS_DIR, "numaserve-alerts.yml")
RULE_TESTS = os.path.join(PROMETHEUS_DIR, "alerts_test.yml")
DASHBOARD = dc.deploy_path("grafana", "numaserve.json")


def rule_expressions():
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    return {rule.get("alert") or rule.get("record"): rule["expr"]
            for group in rules["groups"] for rule in group["rules"]}


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def dashboard_panels(dashboard):
    for panel in dashboard["panels"]:
        yield panel
        for inner in panel.get("panels", []):
            yield inner


def dashboard_expressions(dashboard):
    """{where: PromQL} for every panel target and templating query."""
    exprs = {}
    for panel in dashboard_panels(dashboard):
        for target in panel.get("targets", []):
            exprs["panel %r %s" % (panel["title"], target["refId"])] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs["variable " + variable["name"]] = (
                query["query"] if isinstance(query, dict) else query)
    return exprs


class PromtoolTest(unittest.TestCase):

    def promtool(self, *args):
        return dc.run([dc.PROMTOOL] + list(args), cwd=PROMETHEUS_DIR, timeout=60)

    def test_check_config(self):
        result = self.promtool("check", "config", "prometheus.yml")
        self.assertIn("SUCCESS", result.stdout)

    def test_check_rules(self):
        result = self.promtool("check", "rules", "numaserve-alerts.yml")
        self.assertIn("SUCCESS", result.stdout)

    def test_rule_unit_tests(self):
        result = self.promtool("test", "rules", "alerts_test.yml")
        self.assertIn("SUCCESS", result.stdout)

    def test_every_alert_is_tested(self):
        with open(RULE_TESTS) as f:
            tests = yaml.safe_load(f)
        fired = {t["alertname"] for group in tests["tests"]
                 for t in group.get("alert_rule_test", []) if t.get("exp_alerts")}
        alerts = set(rule_expressions())
        self.assertEqual(alerts - fired, set(), "alerts without a test that fires them")

    def test_required_alerts(self):
        exprs = rule_expressions()
        joined = "\n".join(exprs.values())
        # error ratio, queue saturation, p99 over a target, restarts, slow worker
        self.assertIn('numaserve_requests_total{outcome!~"success', joined)
        self.assertIn("numaserve_pending_requests", joined)
        self.assertIn("histogram_quantile(0.99", joined)
        self.assertIn("numaserve_request_duration_seconds_bucket", joined)
        self.assertIn("increase(numaserve_worker_restarts_total", joined)
        self.assertIn("avg_over_time(rate(numaserve_worker_inferences_total", joined)


class DashboardTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.dashboard = load_dashboard()
        cls.exprs = dashboard_expressions(cls.dashboard)

    def test_structure(self):
        d = self.dashboard
        self.assertEqual(d["uid"], "numaserve")
        ids = [p["id"] for p in dashboard_panels(d)]
        self.assertEqual(len(ids), len(set(ids)), "panel ids repeat")
        names = [v["name"] for v in d["templating"]["list"]]
        self.assertIn("datasource", names)
        for panel in dashboard_panels(d):
            grid = panel["gridPos"]
            self.assertLessEqual(grid["x"] + grid["w"], 24, panel["title"])
            if panel["type"] == "row":
                continue
            self.assertEqual(panel["datasource"]["uid"], "${datasource}", panel["title"])
            self.assertTrue(panel["targets"], panel["title"])
            for target in panel["targets"]:
                self.assertTrue(target["expr"].strip())

    def test_covers_the_figures(self):
        joined = "\n".join(self.exprs.values())
        for needle in (
                "rate(numaserve_inferences_total",                  # throughput per model
                "histogram_quantile(0.99, sum by (model, le) "
                "(rate(numaserve_request_duration_seconds_bucket",
                "numaserve_batch_size_rows_bucket",                 # batch size
                "numaserve_executions_total",
                "numaserve_queue_duration_seconds_bucket",          # queue time
                "rate(numaserve_worker_busy_seconds_total",         # per-worker utilization
                "rate(numaserve_instance_busy_seconds_total",       # per-slot utilization
                "numaserve_worker_achieved_gflops",                 # GFLOP/s against peak
                "numaserve_worker_peak_fraction_ratio"):
            self.assertIn(needle, joined)


class ExportedNamesTest(unittest.TestCase):
    """Names used by the dashboard and the rules against a real server's page."""

    @classmethod
    def setUpClass(cls):
        cls.server, cls.repo = dc.serve_default_model(["--max-workers", "1"])
        try:
            dc.send_inferences(cls.server)
            # Some series appear with their first event: a failed request and
            # a worker restart make them.
            try:
                empty = nc.pb.ModelInferRequest(model_name=nc.DEFAULT_MODEL_NAME)
                cls.server.stub().ModelInfer(empty, timeout=30)
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            for pid in cls.server.worker_pids():
                os.kill(pid, signal.SIGKILL)
            nc.wait_until(lambda: "numaserve_worker_restarts_total{" in cls.server.scrape(), 30)
            nc.wait_until(lambda: cls.server.stub().ServerReady(
                nc.pb.ServerReadyRequest(), timeout=10).ready, 60)
            dc.send_inferences(cls.server, requests=1)
            # Sampled gauges (resident memory, once a second) appear a little
            # later: wait, at most 10 s, until every name used is on the page.
            used = set()
            for expr in list(dashboard_expressions(load_dashboard()).values()) + \
                    list(rule_expressions().values()):
                used |= dc.metric_names_in(expr)
            nc.wait_until(lambda: used <= dc.exported_metric_names(cls.server.scrape()), 10,
                          interval=0.25)
            cls.exported = dc.exported_metric_names(cls.server.scrape())
        finally:
            code = cls.server.stop()
            shutil.rmtree(cls.repo, ignore_errors=True)
        assert code == 0, cls.server.stderr_text()

    def check(self, exprs):
        unknown = {}
        for where, expr in exprs.items():
            names = dc.metric_names_in(expr)
            self.assertTrue(names, "%s uses no numaserve metric: %s" % (where, expr))
            for name in names - self.exported:
                unknown.setdefault(name, []).append(where)
        self.assertEqual(unknown, {}, "names numaserve does not export")

    def test_dashboard_names(self):
        self.check(dashboard_expressions(load_dashboard()))

    def test_rule_names(self):
        self.check(rule_expressions())

    def test_the_check_catches_a_wrong_name(self):
        self.assertNotIn("numaserve_inference_total", self.exported)
        self.assertIn("numaserve_request_duration_seconds_bucket", self.exported)


if __name__ == "__main__":
    unittest.main()
