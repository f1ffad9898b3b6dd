#!/usr/bin/python3
"""deploy/kubernetes, read with Debian's python3-yaml: every manifest parses
and has the fields the deployment relies on (Guaranteed QoS with integer
cpus, gRPC probes, the Service, the PodMonitor and scrape annotations, the
HorizontalPodAutoscaler on a metric numaserve exports, the PrometheusRule
equal to the unit-tested alert rules, no training service, /metrics on the
pod's IP, the NetworkPolicy admitting gRPC from client pods and metrics from
the monitoring namespace's Prometheus only); the ConfigMap's model config
loads in a real server."""

import glob
import os
import re
import shutil
import tempfile
import unittest

import yaml

import deploy_common as dc
from deploy_common import nc

KUBERNETES = dc.deploy_path("kubernetes")
MODEL = nc.DEFAULT_MODEL_NAME
SERVED_PORTS = {8001, 8002}


def load_all():
    documents = []
    for path in sorted(glob.glob(os.path.join(KUBERNETES, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    documents.append((os.path.basename(path), doc))
    return documents


def dockerfile_uid():
    with open(dc.deploy_path("container", "Dockerfile")) as f:
        users = re.findall(r"^USER (\d+)", f.read(), re.M)
    return int(users[-1])


def parse_memory(value):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "": 1}
    number, unit = re.fullmatch(r"(\d+)([KMGT]i)?", str(value)).groups()
    return int(number) * units[unit or ""]


class ManifestTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.documents = load_all()
        cls.by_kind = {}
        for name, doc in cls.documents:
            cls.by_kind.setdefault(doc["kind"], []).append(doc)

    def one(self, kind):
        docs = self.by_kind.get(kind, [])
        self.assertEqual(len(docs), 1, "expected one %s, found %d" % (kind, len(docs)))
        return docs[0]

    def deployment(self):
        return self.one("Deployment")

    def container(self):
        containers = self.deployment()["spec"]["template"]["spec"]["containers"]
        self.assertEqual(len(containers), 1)
        return containers[0]

    def test_every_document_is_an_object(self):
        self.assertGreaterEqual(len(self.documents), 6)
        for name, doc in self.documents:
            for field in ("apiVersion", "kind", "metadata"):
                self.assertIn(field, doc, name)
            self.assertTrue(doc["metadata"].get("name"), name)

    def test_guaranteed_qos(self):
        pod = self.deployment()["spec"]["template"]["spec"]
        for c in pod["containers"] + pod.get("initContainers", []):
            requests, limits = c["resources"]["requests"], c["resources"]["limits"]
            self.assertEqual(set(requests), {"cpu", "memory"})
            self.assertEqual(requests, limits, "requests must equal limits: Guaranteed QoS")
            # Integer cpus: the static CPU manager gives such a pod whole cores.
            self.assertRegex(str(requests["cpu"]), r"^[1-9]\d*$")
            self.assertGreater(parse_memory(requests["memory"]), 2**30)

    def test_grpc_probes(self):
        c = self.container()
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            self.assertEqual(c[probe]["grpc"], {"port": 8001}, probe)
        # Liveness gives a worker restart time before killing the pod.
        liveness = c["livenessProbe"]
        self.assertGreaterEqual(liveness["periodSeconds"] * liveness["failureThreshold"], 30)

    def test_no_training_service_and_drain_time(self):
        c = self.container()
        args = c.get("args", []) + c.get("command", [])
        self.assertFalse([a for a in args if "training" in a], args)
        for env in c.get("env", []):
            self.assertNotIn("training", str(env.get("value", "")))
        self.assertEqual({p["containerPort"] for p in c["ports"]}, SERVED_PORTS)
        shutdown = int(args[args.index("--shutdown-timeout") + 1])
        grace = self.deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        self.assertGreater(grace, shutdown)

    def test_security_context(self):
        pod = self.deployment()["spec"]["template"]["spec"]
        self.assertTrue(pod["securityContext"]["runAsNonRoot"])
        self.assertEqual(pod["securityContext"]["runAsUser"], dockerfile_uid())
        c = self.container()["securityContext"]
        self.assertFalse(c["allowPrivilegeEscalation"])
        self.assertEqual(c["capabilities"]["drop"], ["ALL"])
        if c.get("readOnlyRootFilesystem"):
            # The GEMM cache directory of the image must be writable.
            mounts = [m["mountPath"] for m in self.container()["volumeMounts"]]
            self.assertIn("/var/cache/numaserve", mounts)

    def test_selectors_and_service(self):
        deployment = self.deployment()
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = deployment["spec"]["selector"]["matchLabels"]
        self.assertLessEqual(selector.items(), labels.items())
        service = self.one("Service")
        self.assertLessEqual(service["spec"]["selector"].items(), labels.items())
        self.assertEqual(service["spec"].get("type", "ClusterIP"), "ClusterIP")
        port_names = {p["name"]: p["containerPort"] for p in self.container()["ports"]}
        self.assertEqual({p["port"] for p in service["spec"]["ports"]}, SERVED_PORTS)
        for p in service["spec"]["ports"]:
            self.assertIn(p["targetPort"], port_names)
            self.assertEqual(port_names[p["targetPort"]], p["port"])

    def test_scraping(self):
        template = self.deployment()["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(annotations["prometheus.io/port"], "8002")
        monitor = self.one("PodMonitor")
        self.assertEqual(monitor["apiVersion"], "monitoring.coreos.com/v1")
        self.assertLessEqual(monitor["spec"]["selector"]["matchLabels"].items(),
                             template["metadata"]["labels"].items())
        port_names = {p["name"] for p in self.container()["ports"]}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            self.assertIn(endpoint["port"], port_names)
            self.assertEqual(endpoint.get("path", "/metrics"), "/metrics")

    def test_metrics_listen_on_the_pod_ip(self):
        env = {e["name"]: e for e in self.container().get("env", [])}
        self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP")
        self.assertEqual(env["NUMASERVE_METRICS_HOST"]["value"], "$(POD_IP)")
        # Kubernetes expands $(VAR) only from variables declared before it.
        names = [e["name"] for e in self.container()["env"]]
        self.assertLess(names.index("POD_IP"), names.index("NUMASERVE_METRICS_HOST"))
        with open(dc.deploy_path("container", "entrypoint.sh")) as f:
            self.assertIn("NUMASERVE_METRICS_HOST", f.read())

    def test_network_policy(self):
        policy = self.one("NetworkPolicy")
        self.assertEqual(policy["apiVersion"], "networking.k8s.io/v1")
        spec = policy["spec"]
        labels = self.deployment()["spec"]["template"]["metadata"]["labels"]
        self.assertLessEqual(spec["podSelector"]["matchLabels"].items(), labels.items())
        self.assertEqual(spec["policyTypes"], ["Ingress"])
        ports = {p["name"]: p["containerPort"] for p in self.container()["ports"]}
        allowed = {}
        for rule in spec["ingress"]:
            # A rule without `from` (or with an empty peer) admits everyone.
            self.assertTrue(rule.get("from"), rule)
            self.assertTrue(rule.get("ports"), rule)
            for peer in rule["from"]:
                self.assertTrue(peer, rule)
                self.assertNotIn("ipBlock", peer)
            for port in rule["ports"]:
                self.assertEqual(port.get("protocol", "TCP"), "TCP")
                number = ports.get(port["port"], port["port"])
                self.assertIn(number, SERVED_PORTS)
                allowed.setdefault(number, []).extend(rule["from"])
        self.assertEqual(set(allowed), SERVED_PORTS)
        # gRPC: labelled client pods of this namespace.
        self.assertEqual(allowed[8001],
                         [{"podSelector": {"matchLabels": {"numaserve-client": "true"}}}])
        # Metrics: the Prometheus pods of the monitoring namespace only.
        self.assertEqual(allowed[8002], [{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}])

    def test_prometheus_rule_matches_the_tested_rules(self):
        rule = self.one("PrometheusRule")
        self.assertEqual(rule["apiVersion"], "monitoring.coreos.com/v1")
        with open(dc.deploy_path("prometheus", "numaserve-alerts.yml")) as f:
            tested = yaml.safe_load(f)
        self.assertEqual(rule["spec"]["groups"], tested["groups"],
                         "prometheusrule.yaml differs from deploy/prometheus/numaserve-alerts.yml")

    def hpa_metric(self):
        hpa = self.one("HorizontalPodAutoscaler")
        self.assertEqual(hpa["apiVersion"], "autoscaling/v2")
        target = hpa["spec"]["scaleTargetRef"]
        self.assertEqual((target["kind"], target["name"]),
                         ("Deployment", self.deployment()["metadata"]["name"]))
        self.assertLessEqual(hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"])
        pods = [m for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
        self.assertEqual(len(pods), 1)
        self.assertEqual(pods[0]["pods"]["target"]["type"], "AverageValue")
        return pods[0]["pods"]["metric"]["name"]

    def model_config(self):
        """The ConfigMap key mounted as a config.pbtxt, and its text."""
        volumes = {v["name"]: v for v in self.deployment()["spec"]["template"]["spec"]["volumes"]}
        configmaps = {c["metadata"]["name"]: c for c in self.by_kind["ConfigMap"]}
        for mount in self.container()["volumeMounts"]:
            if mount["mountPath"].endswith("/config.pbtxt"):
                volume = volumes[mount["name"]]
                data = configmaps[volume["configMap"]["name"]]["data"]
                self.assertTrue(mount["mountPath"].startswith("/models/"))
                self.assertTrue(mount.get("readOnly"))
                return mount["mountPath"], data[mount["subPath"]]
        self.fail("no config.pbtxt mounted from a ConfigMap")

    def test_model_config_and_hpa_metric_on_a_real_server(self):
        mount_path, config = self.model_config()
        model = mount_path.split("/")[2]
        self.assertEqual(model, MODEL)
        metric = self.hpa_metric()
        repo = tempfile.mkdtemp(prefix="numaserve_k8s_")
        self.addCleanup(shutil.rmtree, repo, ignore_errors=True)
        nc.write_default_model(repo)
        with open(os.path.join(repo, MODEL, "config.pbtxt"), "w") as f:
            f.write(config)
        with nc.ServerProcess(repo, ["--max-workers", "1"]) as server:
            stub = server.stub()
            self.assertTrue(stub.ModelReady(nc.pb.ModelReadyRequest(name=MODEL), timeout=30).ready,
                            server.stderr_text())
            answer = stub.ModelConfig(nc.pb.ModelConfigRequest(name=MODEL), timeout=30)
            self.assertEqual(answer.config.max_batch_size, 64)
            nc.infer(stub, MODEL, {"image": nc.random_images(3)})
            exported = dc.exported_metric_names(server.scrape())
        self.assertIn(metric, exported, "the HPA's metric is not one numaserve exports")


if __name__ == "__main__":
    unittest.main()
