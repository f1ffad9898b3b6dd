#!/usr/bin/python3
"""deploy/systemd: the unit passes `systemd-analyze verify` (with the
cpus.conf.example drop-in in place) without a warning, carries the
hardening, readiness and drain settings, and the server speaks the
sd_notify protocol the unit relies on (READY=1 once serving, WATCHDOG=1
every WATCHDOG_USEC/2, STOPPING=1 at SIGTERM, all from the main process)."""

import os
import re
import shutil
import shlex
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

import deploy_common as dc
from deploy_common import nc

UNIT = dc.deploy_path("systemd", "numaserve.service")
DROP_IN = dc.deploy_path("systemd", "numaserve.service.d", "cpus.conf.example")
DEFAULTS = dc.deploy_path("systemd", "numaserve.default")
SYSTEMD_ANALYZE = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"


def verify_unit(test, unit_path):
    """Runs systemd-analyze verify on UNIT_PATH; fails on a non-zero exit or
    on any line it prints about the unit or its drop-ins (every warning is a
    failure; lines about the machine's own units are only shown)."""
    result = dc.run([SYSTEMD_ANALYZE, "verify", "--man=no", unit_path], check=False,
                    cwd=os.path.dirname(unit_path))
    output = (result.stdout + result.stderr).strip()
    test.assertEqual(result.returncode, 0, "systemd-analyze verify %s:\n%s" % (unit_path, output))
    about_unit = [line for line in output.splitlines() if "numaserve" in line]
    test.assertEqual(about_unit, [], "systemd-analyze verify %s warned:\n%s" % (unit_path, output))
    if output:
        print("systemd-analyze verify: about other units:\n" + output, flush=True)


class UnitFileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(UNIT) as f:
            cls.text = f.read()
        cls.entries = dc.parse_unit(cls.text)

    def value(self, key, section="Service"):
        values = dc.unit_values(self.entries, section, key)
        self.assertTrue(values, "%s= missing from [%s]" % (key, section))
        return values[-1]

    def test_verify_with_drop_in(self):
        self.assertTrue(os.access(SYSTEMD_ANALYZE, os.X_OK), "systemd-analyze not found")
        with tempfile.TemporaryDirectory(prefix="numaserve_unit_") as tmp:
            # The unit names /usr/local/bin/numaserve; verify checks that the
            # binary exists, so the copy points at the built one.
            binary = os.path.abspath(dc.binary())
            text = self.text.replace("/usr/local/bin/numaserve", binary)
            self.assertNotEqual(text, self.text)
            path = os.path.join(tmp, "numaserve.service")
            with open(path, "w") as f:
                f.write(text)
            verify_unit(self, path)
            # The example drop-in, as an administrator would enable it.
            os.mkdir(os.path.join(tmp, "numaserve.service.d"))
            shutil.copy(DROP_IN, os.path.join(tmp, "numaserve.service.d", "cpus.conf"))
            verify_unit(self, path)
            # verify does complain about what is wrong (the check is live).
            with open(os.path.join(tmp, "numaserve.service.d", "bad.conf"), "w") as f:
                f.write("[Service]\nNoSuchSetting=1\n")
            result = dc.run([SYSTEMD_ANALYZE, "verify", "--man=no", path], check=False, cwd=tmp)
            self.assertIn("NoSuchSetting", result.stdout + result.stderr)

    def test_readiness_and_watchdog(self):
        self.assertEqual(self.value("Type"), "notify")
        self.assertEqual(self.value("NotifyAccess"), "main")
        self.assertGreater(int(self.value("WatchdogSec")), 0)

    def test_dedicated_user_and_hardening(self):
        self.assertEqual(self.value("DynamicUser"), "yes")
        self.assertEqual(self.value("User"), "numaserve")
        self.assertEqual(self.value("ProtectSystem"), "strict")
        self.assertEqual(self.value("ProtectHome"), "yes")
        self.assertEqual(self.value("PrivateTmp"), "yes")
        self.assertEqual(self.value("NoNewPrivileges"), "yes")
        self.assertEqual(self.value("CapabilityBoundingSet"), "")
        self.assertEqual(self.value("AmbientCapabilities"), "")
        self.assertEqual(set(self.value("RestrictAddressFamilies").split()),
                         {"AF_UNIX", "AF_INET", "AF_INET6"})
        self.assertEqual(self.value("LimitMEMLOCK"), "infinity")
        # oneDNN generates code at run time: W^X would break it.
        self.assertFalse(dc.unit_values(self.entries, "Service", "MemoryDenyWriteExecute"))

    def test_writes_only_its_cache(self):
        cache = self.value("CacheDirectory")
        env = dict(v.split("=", 1) for v in dc.unit_values(self.entries, "Service", "Environment"))
        cache_file = env["NUMASERVE_GEMM_CACHE"]
        self.assertTrue(cache_file.startswith("/var/cache/%s/" % cache), cache_file)
        writable = [p.lstrip("-") for p in self.value("ReadWritePaths").split()]
        self.assertIn("/var/cache/" + cache, writable)

    def test_options_and_drain(self):
        self.assertEqual(self.value("EnvironmentFile"), "-/etc/default/numaserve")
        exec_start = self.value("ExecStart")
        self.assertTrue(exec_start.startswith("/usr/local/bin/numaserve serve "), exec_start)
        self.assertRegex(exec_start, r"\$NUMASERVE_ARGS\s*$", "options from the environment file")
        self.assertNotIn("--training-service", exec_start)
        self.assertEqual(self.value("KillMode"), "mixed")
        timeout = int(re.search(r"--shutdown-timeout (\d+)", exec_start).group(1))
        self.assertGreater(int(self.value("TimeoutStopSec")), timeout)
        self.assertEqual(self.value("WantedBy", "Install"), "multi-user.target")
        # Every variable the environment file example sets is one the unit uses.
        with open(DEFAULTS) as f:
            names = set(re.findall(r"^#?(NUMASERVE_[A-Z_]+)=", f.read(), re.M))
        self.assertIn("NUMASERVE_ARGS", names)
        for name in names:
            self.assertIn(name, exec_start, "%s in numaserve.default is not used" % name)

    def test_metrics_on_loopback(self):
        # A Prometheus on this host scrapes; others need HTTPS and a token.
        env = dict(v.split("=", 1) for v in dc.unit_values(self.entries, "Service", "Environment"))
        host, _, port = env["NUMASERVE_METRICS_ADDRESS"].rpartition(":")
        self.assertEqual((host, port), ("127.0.0.1", "8002"))
        exec_start = self.value("ExecStart")
        self.assertIn("--metrics-address ${NUMASERVE_METRICS_ADDRESS}", exec_start)
        self.assertNotIn("--metrics-port", exec_start)

    def test_the_old_metrics_port_variable_stops_the_start(self):
        # An environment file from before NUMASERVE_METRICS_ADDRESS must not
        # have its port ignored silently: ExecStartPre, run as systemd would
        # (its $$ a literal $), fails naming both variables.
        argv = shlex.split(self.value("ExecStartPre").replace("$$", "$"))
        self.assertEqual(argv[:2], ["/bin/sh", "-c"])
        base = {"PATH": "/usr/bin:/bin"}
        ok = subprocess.run(argv, env=base, capture_output=True, text=True, timeout=10)
        self.assertEqual((ok.returncode, ok.stderr), (0, ""))
        old = subprocess.run(argv, env=dict(base, NUMASERVE_METRICS_PORT="9102"),
                             capture_output=True, text=True, timeout=10)
        self.assertEqual(old.returncode, 1)
        self.assertIn("NUMASERVE_METRICS_PORT=9102", old.stderr)
        self.assertIn("NUMASERVE_METRICS_ADDRESS=127.0.0.1:9102", old.stderr)

    def test_drop_in_example(self):
        with open(DROP_IN) as f:
            entries = dc.parse_unit(f.read())
        self.assertTrue(dc.unit_values(entries, "Service", "AllowedCPUs"))
        self.assertTrue(dc.unit_values(entries, "Service", "AllowedMemoryNodes"))


class NotifySocket:
    """An AF_UNIX datagram socket like systemd's NOTIFY_SOCKET, recording
    each message with the sender's pid (SCM_CREDENTIALS)."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(self.path)
        self.messages = []  # (monotonic time, pid, {key: value})

    def poll(self, timeout):
        """Receives what arrives within TIMEOUT seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                return
            pid = None
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", payload[:12])[0]
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((time.monotonic(), pid, fields))

    def wait_for(self, key, value, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.messages:
                if m[2].get(key) == value:
                    return m
            self.poll(0.1)
        return None

    def close(self):
        self.sock.close()


class SdNotifyTest(unittest.TestCase):
    """The server under a fake NOTIFY_SOCKET, as systemd runs it."""

    def start(self, extra_env):
        self.tmp = tempfile.mkdtemp(prefix="numaserve_notify_")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.notify = NotifySocket(self.tmp)
        self.addCleanup(self.notify.close)
        repo = os.path.join(self.tmp, "models")
        nc.write_default_model(repo)
        env = dict(os.environ, NOTIFY_SOCKET=self.notify.path, **extra_env)
        server = nc.ServerProcess(repo, ["--max-workers", "1", "--shutdown-timeout", "5"], env=env)
        server.start()
        self.addCleanup(lambda: server.proc.poll() is None and server.stop())
        return server

    def test_ready_watchdog_stopping(self):
        # WATCHDOG_PID unset: libsystemd then takes the variable as meant for this process.
        server = self.start({"WATCHDOG_USEC": "400000"})
        ready = self.notify.wait_for("READY", "1", 10)
        self.assertIsNotNone(ready, "no READY=1; got %s" % self.notify.messages)
        self.assertIn("grpc=127.0.0.1:%d" % server.grpc_port, ready[2].get("STATUS", ""))
        # Ready means serving: the health service says so.
        answer = server.health_stub().Check(nc.health_pb.HealthCheckRequest(), timeout=10)
        self.assertEqual(answer.status, nc.health_pb.HealthCheckResponse.SERVING)
        # Pings every 0.2 s: at least 4 in 1.5 s.
        start = time.monotonic()
        self.notify.poll(1.5)
        pings = [m for m in self.notify.messages if m[2].get("WATCHDOG") == "1" and m[0] >= start]
        self.assertGreaterEqual(len(pings), 4, "watchdog pings in 1.5 s: %d" % len(pings))
        self.assertLessEqual(len(pings), 12, "watchdog pings in 1.5 s: %d" % len(pings))
        server.proc.send_signal(signal.SIGTERM)
        stopping = self.notify.wait_for("STOPPING", "1", 10)
        self.assertIsNotNone(stopping, "no STOPPING=1 after SIGTERM")
        self.assertEqual(server.stop(timeout=30), 0, server.stderr_text())
        # NotifyAccess=main: every message came from the server itself, not a worker.
        senders = {m[1] for m in self.notify.messages}
        self.assertEqual(senders, {server.pid}, "senders %s, server %d" % (senders, server.pid))
        self.assertLess(ready[0], stopping[0])

    def test_no_watchdog_unless_asked(self):
        server = self.start({})
        self.assertIsNotNone(self.notify.wait_for("READY", "1", 10))
        self.notify.poll(0.5)
        self.assertEqual(server.stop(timeout=30), 0, server.stderr_text())
        self.notify.poll(0.2)
        self.assertFalse([m for m in self.notify.messages if "WATCHDOG" in m[2]])
        self.assertTrue([m for m in self.notify.messages if m[2].get("STOPPING") == "1"])

    def test_no_socket_no_messages(self):
        # Outside systemd nothing changes: the server starts and stops as before.
        repo = tempfile.mkdtemp(prefix="numaserve_notify_")
        self.addCleanup(shutil.rmtree, repo, ignore_errors=True)
        nc.write_default_model(repo)
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        with nc.ServerProcess(repo, ["--max-workers", "1"], env=env) as server:
            self.assertTrue(server.stub().ServerReady(nc.pb.ServerReadyRequest(), timeout=10).ready)


if __name__ == "__main__":
    unittest.main()
