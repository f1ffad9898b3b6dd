"""Shared by the tests of deploy/ (tests/deploy/test_*.py).

Environment (set by tests/deploy/CMakeLists.txt):
  NUMASERVE_BIN         the built numaserve binary
  NUMASERVE_SOURCE_DIR  the source tree
  NUMASERVE_BUILD_DIR   the build tree (cmake --install reads it)
  PROMTOOL, PROMETHEUS  Debian's promtool and prometheus
"""

import os
import re
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "clients"))
import numaserve_client as nc  # noqa: E402,F401  (re-exported)

SOURCE_DIR = nc.SOURCE_DIR
DEPLOY_DIR = os.path.join(SOURCE_DIR, "deploy")
PROMTOOL = os.environ.get("PROMTOOL", "/usr/bin/promtool")
PROMETHEUS = os.environ.get("PROMETHEUS", "/usr/bin/prometheus")


def deploy_path(*parts):
    return os.path.join(DEPLOY_DIR, *parts)


def binary():
    return nc.default_binary()


def build_dir():
    path = os.environ.get("NUMASERVE_BUILD_DIR")
    if path:
        return path
    # <build>/bin/numaserve
    return os.path.dirname(os.path.dirname(os.path.abspath(binary())))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(argv, timeout=60, check=True, **kwargs):
    """Runs ARGV; returns the CompletedProcess (stdout and stderr as text)."""
    result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=timeout, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError("%s exited %d\n--- stdout ---\n%s\n--- stderr ---\n%s"
                             % (" ".join(argv), result.returncode, result.stdout, result.stderr))
    return result


def parse_unit(text):
    """A systemd unit file as [(section, key, value)], continuation lines
    joined, comments dropped (keys may repeat, so not a dict)."""
    entries = []
    section = None
    pending = ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if pending:
            line = pending + " " + line.strip()
            pending = ""
        elif not line.strip() or line.lstrip()[0] in "#;":
            continue
        if line.endswith("\\"):
            pending = line[:-1].rstrip()
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        entries.append((section, key.strip(), value.strip()))
    return entries


def unit_values(entries, section, key):
    return [v for s, k, v in entries if s == section and k == key]


def exported_metric_names(text):
    """Every series name a /metrics page can carry: the families of its TYPE
    lines (with _bucket/_sum/_count for histograms, _sum/_count for
    summaries) and the sample names themselves."""
    names = set()
    for line in text.splitlines():
        match = re.match(r"# TYPE (\S+) (\S+)", line)
        if match:
            name, kind = match.groups()
            names.add(name)
            if kind == "histogram":
                names.update(name + s for s in ("_bucket", "_sum", "_count"))
            elif kind == "summary":
                names.update(name + s for s in ("_sum", "_count"))
        elif line and not line.startswith("#"):
            names.add(re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0))
    return names


def metric_names_in(expr):
    """The numaserve metric names a PromQL expression uses."""
    return set(re.findall(r"\bnumaserve_[a-zA-Z0-9_]+", expr))


def serve_default_model(args=(), env=None):
    """Starts numaserve on free loopback ports with the default model in a
    temporary repository; returns (server, repository)."""
    import tempfile
    repo = tempfile.mkdtemp(prefix="numaserve_deploy_")
    nc.write_default_model(repo)
    server = nc.ServerProcess(repo, list(args), env=env).start()
    return server, repo


def send_inferences(server, requests=5, batch=3):
    """Sends REQUESTS inferences of BATCH rows to the default model; returns the rows."""
    stub = server.stub()
    for i in range(requests):
        nc.infer(stub, nc.DEFAULT_MODEL_NAME, {"image": nc.random_images(batch, seed=i)})
    return requests * batch
