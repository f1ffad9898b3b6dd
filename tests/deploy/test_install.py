#!/usr/bin/python3
"""`cmake --install`: the binary, the systemd unit (its paths rewritten for
the prefix), the example environment file and drop-in, the Prometheus and
Grafana files, the default model repository and the libraries HTTPS
/metrics needs land in their FHS places (DESTDIR honoured); the installed
unit passes `systemd-analyze verify`, the installed binary serves the
installed repository, and serves /metrics over HTTPS with the installed
libraries."""

import filecmp
import os
import shutil
import stat
import tempfile
import unittest

import deploy_common as dc
from deploy_common import nc
from test_systemd import verify_unit

MODEL = nc.DEFAULT_MODEL_NAME


def install(prefix, destdir=None):
    env = dict(os.environ)
    env.pop("DESTDIR", None)
    if destdir:
        env["DESTDIR"] = destdir
    return dc.run(["cmake", "--install", dc.build_dir(), "--prefix", prefix], env=env,
                  timeout=120)


class InstallTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_install_")
        cls.destdir = os.path.join(cls.tmp, "destdir")
        cls.log = install("/usr/local", cls.destdir).stdout
        cls.root = cls.destdir + "/usr/local"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def path(self, relative):
        return os.path.join(self.root, relative)

    def test_fhs_layout(self):
        expected = [
            "bin/numaserve",
            "bin/numaserve-dataset",
            "lib/numaserve/libnumaserve-civetweb-crypto.so",
            "lib/numaserve/libnumaserve-civetweb-ssl.so",
            "lib/systemd/system/numaserve.service",
            "share/numaserve/models/%s/1/model.onnx" % MODEL,
            "share/numaserve/prometheus/prometheus.yml",
            "share/numaserve/prometheus/numaserve-alerts.yml",
            "share/numaserve/prometheus/alerts_test.yml",
            "share/numaserve/grafana/numaserve.json",
            "share/doc/numaserve/README.md",
            "share/doc/numaserve/docs/architecture.md",
            "share/doc/numaserve/docs/deployment.md",
            "share/doc/numaserve/numaserve.default",
            "share/doc/numaserve/cpus.conf.example",
        ]
        for relative in expected:
            self.assertTrue(os.path.isfile(self.path(relative)), "%s not installed\n%s"
                            % (relative, self.log))
        for binary in ("bin/numaserve", "bin/numaserve-dataset"):
            mode = os.stat(self.path(binary)).st_mode
            self.assertTrue(mode & stat.S_IXOTH, "%s is not executable" % binary)
        # The default repository is the trained model the source tree serves.
        self.assertTrue(filecmp.cmp(self.path("share/numaserve/models/%s/1/model.onnx" % MODEL),
                                    os.path.join(dc.SOURCE_DIR, "models",
                                                 "fashion_classifier.trained.onnx"),
                                    shallow=False))
        # Nothing outside DESTDIR/usr/local.
        for entry in os.listdir(self.destdir):
            self.assertEqual(entry, "usr")
        self.assertEqual(os.listdir(os.path.join(self.destdir, "usr")), ["local"])

    def test_unit_paths_follow_the_prefix(self):
        with open(self.path("lib/systemd/system/numaserve.service")) as f:
            entries = dc.parse_unit(f.read())
        exec_start = dc.unit_values(entries, "Service", "ExecStart")[0]
        self.assertTrue(exec_start.startswith("/usr/local/bin/numaserve serve"), exec_start)
        env = dict(v.split("=", 1) for v in dc.unit_values(entries, "Service", "Environment"))
        self.assertEqual(env["NUMASERVE_MODEL_REPOSITORY"], "/usr/local/share/numaserve/models")

    def test_other_prefix_verifies_and_serves(self):
        # A prefix without DESTDIR: the installed unit's ExecStart exists, so
        # systemd-analyze verifies the unit exactly as installed.
        prefix = os.path.join(self.tmp, "opt")
        install(prefix)
        unit = os.path.join(prefix, "lib/systemd/system/numaserve.service")
        with open(unit) as f:
            text = f.read()
        self.assertIn("ExecStart=%s/bin/numaserve serve" % prefix, text)
        self.assertIn("NUMASERVE_MODEL_REPOSITORY=%s/share/numaserve/models" % prefix, text)
        self.assertNotIn("/usr/local", text)
        with open(os.path.join(prefix, "share/doc/numaserve/numaserve.default")) as f:
            self.assertNotIn("/usr/local", f.read())
        with open(os.path.join(prefix, "share/doc/numaserve/numaserve.default")) as f:
            self.assertIn("%s/share/numaserve/models" % prefix, f.read())
        verify_unit(self, unit)
        # The installed binary serves the installed repository.
        repo = os.path.join(prefix, "share/numaserve/models")
        with nc.ServerProcess(repo, ["--max-workers", "1"],
                              binary=os.path.join(prefix, "bin/numaserve")) as server:
            stub = server.stub()
            ready = stub.ModelReady(nc.pb.ModelReadyRequest(name=MODEL), timeout=30)
            self.assertTrue(ready.ready)
            outputs = nc.infer(stub, MODEL, {"image": nc.random_images(2)})
            self.assertEqual(next(iter(outputs.values())).shape, (2, 10))

    def test_installed_binary_serves_https_metrics(self):
        # The installed binary finds civetweb's OpenSSL 3 libraries in
        # ../lib/numaserve beside it, not in the build tree.
        import ssl
        import urllib.request
        pki = nc.make_test_pki(os.path.join(self.tmp, "pki"))
        repo = self.path("share/numaserve/models")
        args = ["--max-workers", "1", "--metrics-tls-cert", pki["server_cert"],
                "--metrics-tls-key", pki["server_key"]]
        with nc.ServerProcess(repo, args, binary=self.path("bin/numaserve")) as server:
            context = ssl.create_default_context(cafile=pki["ca"])
            context.verify_flags &= ~ssl.VERIFY_X509_STRICT  # the test CA has no keyUsage
            url = "https://127.0.0.1:%d/metrics" % server.metrics_port
            with urllib.request.urlopen(url, timeout=10, context=context) as response:
                self.assertIn("numaserve_worker_ready", response.read().decode())
            with open("/proc/%d/maps" % server.pid) as f:
                maps = f.read()
            for library in ("libnumaserve-civetweb-ssl.so", "libnumaserve-civetweb-crypto.so"):
                self.assertIn(os.path.realpath(self.path("lib/numaserve/" + library)), maps)


if __name__ == "__main__":
    unittest.main()
