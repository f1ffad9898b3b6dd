#!/usr/bin/python3
"""deploy/container, checked without a Docker engine: the Dockerfile's
stages and settings; its runtime package list resolves with apt-get
--dry-run (as on a bare Debian: an empty dpkg status) and covers every
library the built binary links (ldd) or opens (the BLAS libraries); the
entrypoint runs the real server on free loopback ports from its environment
variables and the image's health check answers from it."""

import os
import re
import shlex
import shutil
import signal
import tempfile
import unittest

import deploy_common as dc
import prerequisites
from deploy_common import nc

CONTAINER = dc.deploy_path("container")
DOCKERFILE = os.path.join(CONTAINER, "Dockerfile")
ENTRYPOINT = os.path.join(CONTAINER, "entrypoint.sh")
HEALTHCHECK = os.path.join(CONTAINER, "healthcheck.py")
BLAS_SOURCE = os.path.join(dc.SOURCE_DIR, "kernels", "gemm", "blas_gemm.cc")


def dockerfile_stages(text):
    """[(from, [(instruction, arguments)])], continuation lines joined."""
    text = re.sub(r"\\\n", " ", text)
    stages = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            stages.append((args.strip(), []))
        else:
            stages[-1][1].append((instruction, args.strip()))
    return stages


def runtime_packages(stage):
    """The packages the stage's `apt-get install` lines name."""
    packages = []
    for instruction, args in stage[1]:
        if instruction != "RUN":
            continue
        for command in re.split(r"&&|;", args):
            words = shlex.split(command)
            if words[:2] == ["apt-get", "install"]:
                packages += [w for w in words[2:] if not w.startswith("-")]
    return packages


def packages_of(paths):
    """{path: the Debian package that installed it} (dpkg -S, one call), for
    each of PATHS or its resolved path; paths no package owns are left out."""
    candidates = {}
    for path in paths:
        candidates[path] = [path, os.path.realpath(path)]
    queried = sorted({c for cs in candidates.values() for c in cs})
    result = dc.run(["dpkg", "-S"] + queried, check=False, timeout=120)
    owner = {}
    for line in result.stdout.splitlines():
        package, _, path = line.partition(": ")
        for p in path.split(", "):
            owner[p.strip()] = package.split(":")[0].split(",")[0].strip()
    found = {}
    for path, cs in candidates.items():
        for c in cs:
            if c in owner:
                found[path] = owner[c]
                break
    return found


def apt_has_lists():
    lists = "/var/lib/apt/lists"
    return os.path.isdir(lists) and any("_Packages" in n for n in os.listdir(lists))


class DockerfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(DOCKERFILE) as f:
            cls.stages = dockerfile_stages(f.read())
        cls.build, cls.runtime = cls.stages[0], cls.stages[-1]
        cls.packages = runtime_packages(cls.runtime)

    def instructions(self, stage, name):
        return [args for instruction, args in stage[1] if instruction == name]

    def test_stages(self):
        self.assertEqual(len(self.stages), 2)
        self.assertEqual(self.build[0], "debian:trixie AS build")
        self.assertEqual(self.runtime[0], "debian:trixie")
        build_runs = " ".join(self.instructions(self.build, "RUN"))
        self.assertIn("deploy/install-deps.sh", build_runs)
        self.assertIn("cmake --build", build_runs)
        # Every program `cmake --install` installs is built by the build
        # stage (an unbuilt target fails the install) and copied into the
        # runtime stage.
        with open(os.path.join(dc.SOURCE_DIR, "cmake", "Install.cmake")) as f:
            programs = re.findall(r"\$<TARGET_FILE:([\w-]+)>", f.read())
        self.assertIn("numaserve", programs)
        targets = re.search(r"--target((?:\s+[\w-]+)+)", build_runs)
        self.assertIsNotNone(targets, build_runs)
        copies = " ".join(self.instructions(self.runtime, "COPY"))
        for program in programs:
            self.assertIn(program, targets.group(1).split())
            self.assertIn("/staging/usr/bin/%s /usr/bin/%s" % (program, program), copies)
        # The libraries `cmake --install` puts in lib/numaserve (civetweb's
        # OpenSSL 3 libraries, loaded from ../lib/numaserve beside the binary).
        with open(os.path.join(dc.SOURCE_DIR, "cmake", "Install.cmake")) as f:
            self.assertIn("LIBRARY DESTINATION lib/numaserve", f.read())
        self.assertIn("/staging/usr/lib/numaserve /usr/lib/numaserve", copies)
        # The runtime stage installs no compiler and no -dev package.
        for p in self.packages:
            self.assertFalse(p.endswith("-dev") or p in ("build-essential", "cmake", "clang"), p)

    def test_runtime_settings(self):
        users = self.instructions(self.runtime, "USER")
        self.assertTrue(users)
        self.assertNotIn(users[-1].split(":")[0], ("root", "0"))
        self.assertEqual(set(" ".join(self.instructions(self.runtime, "EXPOSE")).split()),
                         {"8001", "8002"})
        self.assertIn("/models", " ".join(self.instructions(self.runtime, "VOLUME")))
        healthcheck = self.instructions(self.runtime, "HEALTHCHECK")
        self.assertEqual(len(healthcheck), 1)
        self.assertIn("numaserve-healthcheck", healthcheck[0])
        self.assertIn("numaserve-entrypoint", self.instructions(self.runtime, "ENTRYPOINT")[0])
        copies = " ".join(self.instructions(self.runtime, "COPY"))
        for source in ("deploy/container/entrypoint.sh", "deploy/container/healthcheck.py"):
            self.assertIn(source, copies)
            self.assertTrue(os.access(os.path.join(dc.SOURCE_DIR, source), os.X_OK), source)
        with open(DOCKERFILE) as f:
            text = f.read()
        self.assertNotIn("--training-service", re.sub(r"#.*", "", text))
        self.assertTrue(os.path.isfile(DOCKERFILE + ".dockerignore"))

    def required_packages(self):
        """Packages of the libraries the binary links, and of those it opens
        (the BLAS libraries, and what its own libraries in lib/numaserve link)."""
        ldd = dc.run(["ldd", dc.binary()]).stdout
        private = os.path.join(dc.build_dir(), "lib", "numaserve")
        own = sorted(os.path.join(private, n) for n in os.listdir(private) if n.endswith(".so"))
        self.assertEqual([os.path.basename(p) for p in own],
                         ["libnumaserve-civetweb-crypto.so", "libnumaserve-civetweb-ssl.so"])
        for library in own:
            ldd += dc.run(["ldd", library]).stdout
        libraries = sorted(set(re.findall(r"=> (/\S+)", ldd)))
        self.assertNotIn("not found", ldd)
        with open(BLAS_SOURCE) as f:
            opened = re.findall(r'"(/usr/lib/\S+?\.so[.\d]*)"', f.read())
        self.assertTrue(opened, "no BLAS library paths found in %s" % BLAS_SOURCE)
        owners = packages_of(libraries + opened)
        linked, loaded = {}, {}
        for lib in libraries:
            self.assertIn(lib, owners, "no Debian package owns %s" % lib)
            linked.setdefault(owners[lib], []).append(lib)
        for lib in opened:
            self.assertIn(lib, owners, "no Debian package owns %s (install-deps.sh?)" % lib)
            loaded.setdefault(owners[lib], []).append(lib)
        return linked, loaded

    def test_libraries_covered_and_resolvable(self):
        linked, loaded = self.required_packages()
        # Opened with dlopen: nothing depends on them, they must be listed.
        for package, libs in loaded.items():
            self.assertIn(package, self.packages, "runtime stage lacks %s (%s)" % (package, libs))
        if not apt_has_lists():
            print("\n*** SKIPPED the apt-get --dry-run check: apt has no package lists here "
                  "(run apt-get update) ***\n", flush=True)
            prerequisites.missing(self, "apt has no package lists")
        with tempfile.NamedTemporaryFile(prefix="numaserve_dpkg_status_") as status:
            # An empty dpkg status: apt resolves as for a bare image.
            result = dc.run(["apt-get", "install", "--dry-run", "--no-install-recommends",
                             "-o", "Dir::State::status=" + status.name,
                             "-o", "Debug::NoLocking=1"] + self.packages,
                            check=False, timeout=90)
        self.assertEqual(result.returncode, 0, "apt-get --dry-run failed:\n%s" % result.stderr)
        installed = set(re.findall(r"^Inst (\S+)", result.stdout, re.M))
        for package in self.packages:
            self.assertIn(package, installed)
        for package, libs in linked.items():
            self.assertIn(package, installed,
                          "%s (for %s) is not in the runtime stage's closure" % (package, libs))


class HealthcheckEncodingTest(unittest.TestCase):

    def test_messages(self):
        import importlib.util
        spec = importlib.util.spec_from_file_location("healthcheck", HEALTHCHECK)
        health = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(health)
        for service in ("", "inference.GRPCInferenceService", "x" * 300):
            request = nc.health_pb.HealthCheckRequest(service=service)
            self.assertEqual(health.encode_request(service), request.SerializeToString())
        for status in (0, 1, 2, 3):
            response = nc.health_pb.HealthCheckResponse(status=status)
            self.assertEqual(health.decode_status(response.SerializeToString()), status)


class EntrypointTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_entrypoint_")
        cls.repo = os.path.join(cls.tmp, "models")
        nc.write_default_model(cls.repo)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def entrypoint_env(self, **extra):
        env = dict(os.environ)
        env.update(NUMASERVE_BIN=os.path.abspath(dc.binary()), NUMASERVE_MODEL_REPOSITORY=self.repo,
                   NUMASERVE_HOST="127.0.0.1", NUMASERVE_GRPC_PORT="0",
                   NUMASERVE_METRICS_PORT="0", NUMASERVE_ARGS="--max-workers 1")
        env.update(extra)
        return env

    def healthcheck(self, address):
        return dc.run([HEALTHCHECK, "--address", address, "--timeout", "5"], check=False)

    def test_serves_and_answers_health(self):
        server = nc.ServerProcess(self.repo, env=self.entrypoint_env())
        # The entrypoint instead of `numaserve serve`; ports from its variables.
        server.argv = [ENTRYPOINT, "--shutdown-timeout", "5"]
        server.start()
        try:
            # exec: the process started is the server itself.
            self.assertEqual(os.path.realpath("/proc/%d/exe" % server.pid),
                             os.path.realpath(dc.binary()))
            with open("/proc/%d/cmdline" % server.pid, "rb") as f:
                argv = f.read().decode().split("\0")
            self.assertEqual(argv[1], "serve")
            for flag, value in (("--model-repository", self.repo), ("--host", "127.0.0.1"),
                                ("--max-workers", "1"), ("--shutdown-timeout", "5"),
                                ("--metrics-address", "127.0.0.1:0")):
                self.assertEqual(argv[argv.index(flag) + 1], value, argv)
            self.assertRegex(server.stderr_text(),
                             r"numaserve-entrypoint: cpus [0-9,-]+ \(\d+\), memory nodes")
            result = self.healthcheck(server.grpc_address)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertIn("SERVING", result.stdout)
            # The health check's default address: 127.0.0.1:$NUMASERVE_GRPC_PORT.
            result = dc.run([HEALTHCHECK], check=False,
                            env=dict(os.environ, NUMASERVE_GRPC_PORT=str(server.grpc_port)))
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            self.assertTrue(server.stub().ServerReady(nc.pb.ServerReadyRequest(), timeout=10).ready)
        finally:
            code = server.stop(sig=signal.SIGTERM)
        self.assertEqual(code, 0, server.stderr_text())
        result = self.healthcheck(server.grpc_address)
        self.assertEqual(result.returncode, 1, "health check of a stopped server passed")

    def test_metrics_address(self):
        # /bin/echo stands in for the server: the command line it would get.
        for host, address in (("", "0.0.0.0:8002"), ("10.1.2.3", "10.1.2.3:8002"),
                              ("fd00::1", "[fd00::1]:8002"), ("[fd00::2]", "[fd00::2]:8002")):
            env = self.entrypoint_env(NUMASERVE_BIN="/bin/echo", NUMASERVE_HOST="0.0.0.0",
                                      NUMASERVE_METRICS_PORT="8002", NUMASERVE_ARGS="")
            env.pop("NUMASERVE_METRICS_HOST", None)
            if host:
                env["NUMASERVE_METRICS_HOST"] = host
            argv = dc.run([ENTRYPOINT], env=env).stdout.split()
            self.assertEqual(argv[argv.index("--metrics-address") + 1], address, argv)
            self.assertEqual(argv[argv.index("--host") + 1], "0.0.0.0", argv)
            self.assertNotIn("--metrics-port", argv)

    def test_subcommands_pass_through(self):
        result = dc.run([ENTRYPOINT, "topology", "--topology", "package:2 numa:1 core:2 pu:1"],
                        env=self.entrypoint_env())
        self.assertIn("worker", result.stdout + result.stderr)
        # Every numaserve command but the internal `worker` passes through.
        for command in ("serve", "topology", "infer", "train", "bench", "profile", "quantize"):
            result = dc.run([ENTRYPOINT, command, "--help"], env=self.entrypoint_env())
            self.assertIn("numaserve " + command, result.stdout + result.stderr, command)
        result = dc.run([ENTRYPOINT, "echo", "hello"], env=self.entrypoint_env())
        self.assertEqual(result.stdout.strip(), "hello")

    def test_cpu_quota_warning(self):
        cgroup = os.path.join(self.tmp, "cgroup")
        os.makedirs(cgroup, exist_ok=True)
        allowed = len(os.sched_getaffinity(0))
        for quota, warns in (("max 100000", False), ("%d 100000" % (100000 * allowed), False),
                             ("50000 100000", allowed > 1)):
            with open(os.path.join(cgroup, "cpu.max"), "w") as f:
                f.write(quota + "\n")
            # /bin/true stands in for the server: only the entrypoint's report matters.
            result = dc.run([ENTRYPOINT], env=self.entrypoint_env(NUMASERVE_BIN="/bin/true",
                                                                  NUMASERVE_CGROUP_ROOT=cgroup))
            self.assertEqual("warning: a quota" in result.stderr, warns,
                             quota + ": " + result.stderr)

    def test_shellcheck(self):
        shellcheck = shutil.which("shellcheck")
        if shellcheck is None:
            print("\n*** SKIPPED shellcheck: not installed (deploy/install-deps.sh installs it) "
                  "***\n", flush=True)
            prerequisites.missing(self, "shellcheck not installed")
        dc.run([shellcheck, "--shell=sh", ENTRYPOINT])


if __name__ == "__main__":
    unittest.main()
