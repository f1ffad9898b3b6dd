#!/usr/bin/python3
"""End to end: Debian's real `prometheus` on 127.0.0.1 (free port, temporary
storage, scrape and rule evaluation every second) scrapes a real numaserve
and loads deploy/prometheus/numaserve-alerts.yml; after some inferences
numaserve_inferences_total reads back through the HTTP API (/api/v1/query),
every alert rule evaluates without error, and every query of the Grafana
dashboard runs. A second Prometheus scrapes a numaserve whose /metrics
needs HTTPS and a bearer token, with the scrape settings the shipped
config documents: the job with the CA and the token is up and reads the
series back; the same job without the token is down with a 401."""

import copy
import json
import os
import shutil
import subprocess
import tempfile
import unittest
import urllib.parse
import urllib.request

import yaml

import deploy_common as dc
from deploy_common import nc
from test_prometheus import dashboard_expressions, load_dashboard

MODEL = nc.DEFAULT_MODEL_NAME
READ_BACK_SECONDS = 20


class Prometheus:

    def __init__(self, directory, metrics_port, job_settings=None, more_jobs=()):
        """JOB_SETTINGS update the shipped job; MORE_JOBS ({name: settings})
        are copies of it with those settings, scraping the same server."""
        self.port = dc.free_port()
        shutil.copy(dc.deploy_path("prometheus", "numaserve-alerts.yml"), directory)
        # The shipped scrape config, pointed at this server and sped up.
        with open(dc.deploy_path("prometheus", "prometheus.yml")) as f:
            config = yaml.safe_load(f)
        config["global"].update(scrape_interval="1s", evaluation_interval="1s")
        job = config["scrape_configs"][0]
        job["static_configs"] = [{"targets": ["127.0.0.1:%d" % metrics_port]}]
        shipped = copy.deepcopy(job)
        job.update(copy.deepcopy(job_settings or {}))
        for name, settings in dict(more_jobs).items():
            config["scrape_configs"].append(
                dict(copy.deepcopy(shipped), job_name=name, **copy.deepcopy(settings)))
        self.config = os.path.join(directory, "prometheus.yml")
        with open(self.config, "w") as f:
            yaml.safe_dump(config, f)
        self.log = open(os.path.join(directory, "prometheus.log"), "w+")
        self.proc = subprocess.Popen(
            [dc.PROMETHEUS, "--config.file=" + self.config,
             "--storage.tsdb.path=" + os.path.join(directory, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd=directory)

    def url(self, path, **params):
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        return "http://127.0.0.1:%d%s%s" % (self.port, path, query)

    def get(self, path, **params):
        with urllib.request.urlopen(self.url(path, **params), timeout=10) as response:
            return json.loads(response.read().decode())

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("prometheus exited %d:\n%s"
                                 % (self.proc.returncode, self.output()))
        try:
            with urllib.request.urlopen(self.url("/-/ready"), timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def query(self, expr):
        answer = self.get("/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-6000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class PrometheusEndToEndTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_prometheus_")
        cls.server, cls.repo = dc.serve_default_model(["--max-workers", "1"])
        cls.prometheus = Prometheus(cls.tmp, cls.server.metrics_port)
        if not nc.wait_until(cls.prometheus.ready, 30, interval=0.2):
            raise AssertionError("prometheus not ready in 30 s:\n" + cls.prometheus.output())
        cls.rows = dc.send_inferences(cls.server, requests=5, batch=3)

    @classmethod
    def tearDownClass(cls):
        cls.prometheus.stop()
        code = cls.server.stop()
        shutil.rmtree(cls.repo, ignore_errors=True)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert code == 0, cls.server.stderr_text()

    def wait_for_rows(self):
        expr = 'sum(numaserve_inferences_total{job="numaserve",model="%s"})' % MODEL
        seen = []

        def read_back():
            result = self.prometheus.query(expr)
            seen[:] = result
            return result and float(result[0]["value"][1]) >= self.rows

        self.assertTrue(nc.wait_until(read_back, READ_BACK_SECONDS, interval=0.25),
                        "%s did not reach %d within %d s (last: %s)\n%s"
                        % (expr, self.rows, READ_BACK_SECONDS, seen, self.prometheus.output()))

    def test_1_inferences_read_back(self):
        self.wait_for_rows()
        targets = self.prometheus.get("/api/v1/targets")["data"]["activeTargets"]
        self.assertEqual([t["health"] for t in targets], ["up"], targets)
        self.assertEqual(targets[0]["labels"]["job"], "numaserve")

    def test_2_alert_rules_evaluate(self):
        self.wait_for_rows()
        expected = set()
        with open(dc.deploy_path("prometheus", "numaserve-alerts.yml")) as f:
            for group in yaml.safe_load(f)["groups"]:
                expected.update(r["alert"] for r in group["rules"])

        def evaluated():
            groups = self.prometheus.get("/api/v1/rules")["data"]["groups"]
            rules = {r["name"]: r for g in groups for r in g["rules"]}
            if set(rules) != expected:
                return None
            if any(r.get("lastEvaluation", "").startswith("0001") for r in rules.values()):
                return None
            return rules

        rules = nc.wait_until(evaluated, 15, interval=0.25)
        self.assertTrue(rules, "rules not loaded or not evaluated:\n" + self.prometheus.output())
        for name, rule in rules.items():
            self.assertEqual(rule["health"], "ok", "%s: %s" % (name, rule.get("lastError")))
        # A healthy, idle server fires nothing but (at most) pending alerts.
        firing = [a for a in self.prometheus.get("/api/v1/alerts")["data"]["alerts"]
                  if a["state"] == "firing"]
        self.assertEqual(firing, [])

    def test_3_dashboard_queries_run(self):
        self.wait_for_rows()
        substitutions = {"$__rate_interval": "5s", "$__range": "1m", "$instance": ".*",
                         "$model": ".*"}
        for where, expr in dashboard_expressions(load_dashboard()).items():
            if expr.startswith("label_values("):
                # Grafana's own function: the series it lists must exist.
                expr = expr[len("label_values("):expr.rindex(",")]
            for key, value in substitutions.items():
                expr = expr.replace(key, value)
            answer = self.prometheus.get("/api/v1/query", query=expr)
            self.assertEqual(answer["status"], "success", "%s: %s" % (where, answer))
        # The slot label of numaserve_instance_busy_seconds_total reaches
        # Prometheus as such (not renamed: `instance` is the target's), as
        # the dashboard's legend expects.
        result = self.prometheus.query("numaserve_instance_busy_seconds_total")
        self.assertTrue(result)
        for series in result:
            self.assertIn("slot", series["metric"])
            self.assertNotIn("exported_instance", series["metric"])
            self.assertEqual(series["metric"]["instance"],
                             "127.0.0.1:%d" % self.server.metrics_port)


class ProtectedEndpointTest(unittest.TestCase):
    """The scrape settings deploy/prometheus/prometheus.yml documents for a
    numaserve started with --metrics-tls-cert/--metrics-tls-key and
    --metrics-auth-token-file."""

    TOKEN = "prometheus-0123456789abcdef0123456789abcdef"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_prometheus_tls_")
        pki = nc.make_test_pki(os.path.join(cls.tmp, "pki"))
        tokens = os.path.join(cls.tmp, "metrics-tokens")
        with open(tokens, "w") as f:
            f.write("prometheus %s\n" % cls.TOKEN)
        os.chmod(tokens, 0o600)
        # Prometheus's side: the token alone in its file.
        cls.token_file = os.path.join(cls.tmp, "prometheus-token")
        with open(cls.token_file, "w") as f:
            f.write(cls.TOKEN + "\n")
        cls.server, cls.repo = dc.serve_default_model(
            ["--max-workers", "1", "--metrics-tls-cert", pki["server_cert"],
             "--metrics-tls-key", pki["server_key"], "--metrics-auth-token-file", tokens])
        https = {"scheme": "https", "tls_config": {"ca_file": pki["ca"]}}
        cls.prometheus = Prometheus(
            cls.tmp, cls.server.metrics_port,
            job_settings=dict(https, authorization={"credentials_file": cls.token_file}),
            more_jobs={"numaserve-without-token": https})
        if not nc.wait_until(cls.prometheus.ready, 30, interval=0.2):
            raise AssertionError("prometheus not ready in 30 s:\n" + cls.prometheus.output())
        cls.rows = dc.send_inferences(cls.server, requests=2, batch=3)

    @classmethod
    def tearDownClass(cls):
        cls.prometheus.stop()
        code = cls.server.stop()
        shutil.rmtree(cls.repo, ignore_errors=True)
        shutil.rmtree(cls.tmp, ignore_errors=True)
        assert code == 0, cls.server.stderr_text()

    def targets(self):
        """{job: target} once every job has been scraped, else None."""
        active = self.prometheus.get("/api/v1/targets")["data"]["activeTargets"]
        if len(active) != 2 or any(t["health"] == "unknown" for t in active):
            return None
        return {t["labels"]["job"]: t for t in active}

    def test_https_with_the_token_is_up_and_without_it_is_refused(self):
        targets = nc.wait_until(self.targets, READ_BACK_SECONDS, interval=0.25)
        self.assertTrue(targets, "not every job scraped:\n" + self.prometheus.output())
        self.assertEqual(targets["numaserve"]["health"], "up", targets["numaserve"])
        self.assertEqual(targets["numaserve"]["scrapeUrl"],
                         "https://127.0.0.1:%d/metrics" % self.server.metrics_port)
        refused = targets["numaserve-without-token"]
        self.assertEqual(refused["health"], "down", refused)
        self.assertIn("401", refused["lastError"])
        expr = 'sum(numaserve_inferences_total{job="numaserve",model="%s"})' % MODEL

        def read_back():
            result = self.prometheus.query(expr)
            return result and float(result[0]["value"][1]) >= self.rows

        self.assertTrue(nc.wait_until(read_back, READ_BACK_SECONDS, interval=0.25),
                        self.prometheus.output())
        self.assertEqual(self.prometheus.query('up{job="numaserve-without-token"}')[0]["value"][1],
                         "0")


if __name__ == "__main__":
    unittest.main()
