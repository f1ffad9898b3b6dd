"""Python client helpers for numaserve: tests and benchmarks share them.

Runs on Debian's interpreter (/usr/bin/python3) with python3-grpcio,
python3-grpc-tools, python3-onnx and numpy.

What is here:
  * gRPC stubs for proto/grpc_service.proto (KServe v2) and the standard
    health service (tests/clients/health.proto), generated with
    grpc_tools.protoc at import time into a temporary directory, never
    checked in: ``pb``, ``pb_grpc``, ``health_pb``, ``health_pb_grpc``;
    ``config_pb`` (numaserve's config.pbtxt schema) and ``triton_config_pb``
    (the Triton-numbered ModelConfig the ModelConfig RPC answers).
  * ServerProcess: starts ``numaserve serve`` on 127.0.0.1 with free ports,
    waits for its ports line, keeps its stderr, stops it with SIGTERM.
  * make_request / infer / decode_outputs: KServe v2 requests from NumPy
    arrays and back.
  * parse_metrics / Metrics: the Prometheus text exposition format.
  * tls_credentials: gRPC channel credentials (TLS, mTLS, bearer token)
    for ServerProcess(credentials=...), from make_test_pki's files.
  * Re-exported from numaserve_fixtures.py, what the tests make without a
    server: ONNX models (write_default_model, deep_mlp_model, write_model),
    inputs (random_images), training data and checkpoints
    (synthetic_idx_dataset, read_checkpoint), a test PKI (make_test_pki)
    and ReferenceModel, the NumPy evaluator server outputs are compared to.

Environment:
  NUMASERVE_BIN         the numaserve binary (default: <source>/build/server/bin/numaserve)
  NUMASERVE_SOURCE_DIR  the source tree (default: two levels above this file)
"""

import atexit
import ctypes
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

# The tests start servers with subprocess while their channels are open:
# gRPC's fork handlers (on by default in grpcio) then wait for its thread
# pool to idle, which on a loaded machine hung a test past its limit. The
# child execs at once, so they protect nothing here. (ctest sets it too,
# for test files that import grpc before this module.)
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
import grpc  # noqa: E402
import numpy as np

# Re-exported: the tests reach these as nc.NAME too.
from numaserve_fixtures import (  # noqa: E402,F401
    CLIENTS_DIR, DEFAULT_MODEL_NAME, SOURCE_DIR, ReferenceModel, deep_mlp_model, make_test_pki,
    random_images, read_checkpoint, synthetic_idx_dataset, write_default_model, write_idx,
    write_model)

PROTO_DIR = os.path.join(SOURCE_DIR, "proto")

__all__ = [
    "pb", "pb_grpc", "health_pb", "health_pb_grpc", "config_pb", "triton_config_pb", "SOURCE_DIR",
    "DEFAULT_MODEL_NAME",
    "default_binary", "write_default_model", "deep_mlp_model", "write_model",
    "ServerProcess", "ServerStartError", "child_pids", "insecure_channel", "wait_until",
    "make_request", "decode_outputs", "infer", "random_images", "datatype_of",
    "ReferenceModel", "parse_metrics", "Metrics", "make_test_pki", "tls_credentials",
]

_PORTS_LINE = re.compile(r"^grpc=(?P<ghost>[^\s]+):(?P<gport>\d+) "
                         r"metrics=(?P<mhost>[^\s]+):(?P<mport>\d+)"
                         r"(?: http=(?P<hhost>[^\s]+):(?P<hport>\d+))?"
                         r"(?: training=(?P<thost>[^\s]+):(?P<tport>\d+))?\s*$")


# --- Stubs -------------------------------------------------------------------

def _generate_stubs():
    """Compiles the .proto files into a temporary directory on sys.path."""
    from grpc_tools import protoc

    out_dir = tempfile.mkdtemp(prefix="numaserve_stubs_")
    atexit.register(shutil.rmtree, out_dir, ignore_errors=True)
    includes = [PROTO_DIR, CLIENTS_DIR]
    well_known = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    if os.path.isdir(well_known):
        includes.append(well_known)
    args = ["grpc_tools.protoc"]
    args += ["-I" + d for d in includes]
    args += ["--python_out=" + out_dir, "--grpc_python_out=" + out_dir,
             "grpc_service.proto", "triton_model_config.proto", "model_config.proto",
             "health.proto"]
    rc = protoc.main(args)
    if rc != 0:
        raise RuntimeError("grpc_tools.protoc failed (%d) on %s" % (rc, " ".join(args)))
    sys.path.insert(0, out_dir)
    return out_dir


STUB_DIR = _generate_stubs()

import grpc_service_pb2 as pb  # noqa: E402  (generated just above)
import grpc_service_pb2_grpc as pb_grpc  # noqa: E402
import health_pb2 as health_pb  # noqa: E402
import model_config_pb2 as config_pb  # noqa: E402
import triton_model_config_pb2 as triton_config_pb  # noqa: E402
import health_pb2_grpc as health_pb_grpc  # noqa: E402


# --- The binary --------------------------------------------------------------

def default_binary():
    """The numaserve binary: $NUMASERVE_BIN, else the default build tree."""
    path = os.environ.get("NUMASERVE_BIN")
    if path:
        return path
    candidates = [os.path.join(SOURCE_DIR, "build", sub, "bin", "numaserve")
                  for sub in ("server", "release", "integ", "debug", ".")]
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    raise FileNotFoundError(
        "numaserve binary not found; set NUMASERVE_BIN (looked in %s)" % ", ".join(candidates))


# --- The numaserve command line ---------------------------------------------

def run_numaserve(args, env=None, timeout=120):
    """Runs `numaserve ARGS` (no stdin); returns the CompletedProcess (text)."""
    return subprocess.run([default_binary()] + list(args), stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, env=env)


def describe_run(args, result):
    """A failed run_numaserve, for an assertion message."""
    return "numaserve %s -> exit %d\n--- stdout ---\n%s\n--- stderr ---\n%s" % (
        " ".join(args), result.returncode, result.stdout, result.stderr)


def repository_index(stub, by_version=True):
    """RepositoryIndex as {(name, version): (state, reason)}, or keyed by
    name alone with by_version=False."""
    response = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10)
    return {((m.name, m.version) if by_version else m.name): (m.state, m.reason)
            for m in response.models}


# --- The server process ------------------------------------------------------

class ServerStartError(RuntimeError):
    pass


def _is_zombie(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return True
    # The state follows the parenthesised command name.
    return stat[stat.rindex(")") + 2:].startswith(("Z", "X"))


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: nothing to import after fork
_PR_SET_PDEATHSIG = 1


_SETPRIV = shutil.which("setpriv")


def _die_with_parent():
    """In the child before exec: SIGKILL when the thread that started it
    exits, so a test runner killed on timeout leaves no server behind (the
    workers follow their server the same way)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def child_pids(pid):
    """Live (non-zombie) children of PID, from /proc/PID/task/*/children."""
    pids = set()
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return pids
    for task in tasks:
        try:
            with open("/proc/%d/task/%s/children" % (pid, task)) as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return {p for p in pids if not _is_zombie(p)}


class ServerProcess:
    """Runs ``numaserve serve`` for the length of a ``with`` block.

        with ServerProcess(repo, ["--domain", "core"]) as server:
            stub = server.stub()
            ...

    Start-up waits (at most startup_timeout seconds) for the one ports line
    on stdout; stderr goes to an unlinked temporary file, so the pipe never
    fills, and is available as stderr_text() for failure messages. Leaving
    the block sends SIGTERM and checks the exit code (expect_exit_code; None
    checks nothing); a server that does not exit within stop_timeout seconds
    is killed with SIGKILL and reported.

    With die_with_parent (the default) the server is SIGKILLed when the
    thread that started it exits: start it from a thread that outlives it
    (the main thread, a setUpClass).

    credentials (grpc.ChannelCredentials, see tls_credentials) make
    channel() and new_channel() TLS channels; the server's TLS flags go in
    ARGS. A server run with --training-service prints its training address
    too: training_port, training_channel(). The HTTP/REST port (--http-port
    0, unless ARGS turns it off with -1) is http_port.
    """

    def __init__(self, model_repository, args=(), binary=None, host="127.0.0.1",
                 startup_timeout=120.0, stop_timeout=60.0, env=None, expect_exit_code=0,
                 die_with_parent=True, credentials=None):
        self.binary = binary or default_binary()
        self.model_repository = model_repository
        self.host = host
        self.argv = [self.binary, "serve", "--model-repository", model_repository,
                     "--host", host, "--grpc-port", "0", "--metrics-port", "0",
                     "--http-port", "0"] + list(args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.env = env
        self.expect_exit_code = expect_exit_code
        self.die_with_parent = die_with_parent
        self.credentials = credentials
        self.proc = None
        self.grpc_port = None
        self.metrics_port = None
        self.http_port = None
        self.training_host = None
        self.training_port = None
        self.returncode = None
        self._stderr = None
        self._stderr_final = None
        self._stdout_thread = None
        self._stdout_lines = queue.Queue()
        self._stdout_rest = []
        self._channel = None
        self._known_workers = set()

    # -- life cycle

    def start(self):
        self._stderr = tempfile.TemporaryFile(prefix="numaserve_stderr_")
        # The parent-death signal from util-linux's setpriv, which execs the
        # server in its own process (same pid), rather than from a
        # preexec_fn: with one, Python forks instead of vforking, and the
        # fork runs gRPC's fork handlers, which wait for its thread pool to
        # idle (a test hung there for minutes on a loaded machine).
        argv, preexec = self.argv, None
        if self.die_with_parent:
            if _SETPRIV:
                argv = [_SETPRIV, "--pdeathsig", "KILL", "--"] + list(self.argv)
            else:
                preexec = _die_with_parent
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=self._stderr,
                                     env=self.env, preexec_fn=preexec)
        self._stdout_thread = threading.Thread(target=self._read_stdout, daemon=True)
        self._stdout_thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while True:
            try:
                line = self._stdout_lines.get(timeout=0.1)
            except queue.Empty:
                line = None
            if line is not None:
                match = _PORTS_LINE.match(line)
                if not match:
                    self._fail_start("unexpected first stdout line %r" % line)
                self.grpc_port = int(match.group("gport"))
                self.metrics_port = int(match.group("mport"))
                if match.group("hport"):
                    self.http_port = int(match.group("hport"))
                if match.group("tport"):
                    self.training_host = match.group("thost")
                    self.training_port = int(match.group("tport"))
                break
            if self.proc.poll() is not None:
                self._fail_start("exited with code %d before printing its ports"
                                 % self.proc.returncode)
            if time.monotonic() > deadline:
                self._fail_start("printed no ports line within %.0f s" % self.startup_timeout)
        self._known_workers = self.worker_pids()
        return self

    def _fail_start(self, why):
        self._kill_everything()
        raise ServerStartError("%s: %s\n--- stderr ---\n%s"
                               % (" ".join(self.argv), why, self.stderr_text()))

    def _read_stdout(self):
        first = True
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if first:
                self._stdout_lines.put(line)
                first = False
            else:
                self._stdout_rest.append(line)
        if first:
            self._stdout_lines.put(None)

    def stop(self, timeout=None, sig=signal.SIGTERM):
        """Sends SIG (SIGTERM) and waits; returns the exit code.

        Raises AssertionError when the server does not exit within TIMEOUT
        seconds (it is then killed with SIGKILL, its workers too).
        """
        if self.proc is None:
            return None
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        timeout = self.stop_timeout if timeout is None else timeout
        if self.proc.poll() is None:
            self._known_workers |= self.worker_pids()
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_everything()
                self.returncode = self.proc.returncode
                raise AssertionError("numaserve did not exit within %.0f s of %s\n"
                                     "--- stderr ---\n%s"
                                     % (timeout, signal.Signals(sig).name, self.stderr_text()))
        self.returncode = self.proc.returncode
        self._reap_orphans()
        self._close_pipes()
        return self.returncode

    def _close_pipes(self):
        """Keeps the stderr text, closes the file and the stdout pipe."""
        if self._stderr is not None:
            self._stderr_final = self.stderr_text(tail=0)
            self._stderr.close()
            self._stderr = None
        if self._stdout_thread is not None:
            self._stdout_thread.join(5)
            self._stdout_thread = None
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()

    def _kill_everything(self):
        if self.proc.poll() is None:
            self._known_workers |= self.worker_pids()
            self.proc.kill()
            self.proc.wait()
        self._reap_orphans()
        self._close_pipes()

    def _reap_orphans(self):
        """SIGKILLs workers this object saw that outlived the server."""
        for pid in self._known_workers:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    argv0 = f.read().split(b"\0")[0]
            except OSError:
                continue
            if b"numaserve" in argv0 and not _is_zombie(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        self._known_workers = set()

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        code = self.stop()
        if exc_type is None and self.expect_exit_code is not None \
                and code != self.expect_exit_code:
            raise AssertionError("numaserve exited with %r, expected %r\n--- stderr ---\n%s"
                                 % (code, self.expect_exit_code, self.stderr_text()))
        return False

    # -- what it is

    @property
    def pid(self):
        return self.proc.pid

    @property
    def grpc_address(self):
        return "%s:%d" % (self.host, self.grpc_port)

    @property
    def metrics_url(self):
        return "http://%s:%d/metrics" % (self.host, self.metrics_port)

    def worker_pids(self):
        """The live worker processes: the server's children."""
        pids = child_pids(self.proc.pid)
        self._known_workers |= pids
        return pids

    def stderr_text(self, tail=20000):
        """What the server wrote to stderr so far (the last TAIL characters)."""
        if self._stderr is None:
            text = self._stderr_final or ""
            return text[-tail:] if tail else text
        size = os.fstat(self._stderr.fileno()).st_size
        start = max(0, size - tail) if tail else 0
        data = os.pread(self._stderr.fileno(), size - start, start)
        return data.decode("utf-8", "replace")

    def stdout_after_ports(self):
        return list(self._stdout_rest)

    # -- talking to it

    def channel(self):
        if self._channel is None:
            self._channel = self.new_channel()
        return self._channel

    def new_channel(self, credentials=None):
        """A channel of its own (one per client thread, for real concurrency);
        TLS with CREDENTIALS (default: the server's credentials, if any)."""
        return self._channel_to(self.grpc_address, credentials)

    @property
    def training_address(self):
        return "%s:%d" % (self.training_host, self.training_port)

    def training_channel(self, credentials=None):
        """A new channel to the training service's address (--training-service)."""
        if self.training_port is None:
            raise AssertionError("the server printed no training address")
        return self._channel_to(self.training_address, credentials)

    def _channel_to(self, address, credentials):
        credentials = credentials or self.credentials
        if credentials is None:
            return insecure_channel(address)
        return grpc.secure_channel(address, credentials, options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])

    def stub(self):
        return pb_grpc.GRPCInferenceServiceStub(self.channel())

    def health_stub(self):
        return health_pb_grpc.HealthStub(self.channel())

    def scrape(self, timeout=10.0):
        """The /metrics page as text."""
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as response:
            return response.read().decode("utf-8")

    def metrics(self, timeout=10.0):
        return Metrics(self.scrape(timeout))


# The server's default --grpc-max-message-bytes; gRPC's client default (4 MiB)
# is too small for large batches.
MAX_MESSAGE_BYTES = 64 << 20


def insecure_channel(address, max_message_bytes=MAX_MESSAGE_BYTES):
    """A channel to ADDRESS that sends and receives messages that large."""
    return grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes)])


def call_together(server, count, call, timeout=120):
    """Runs call(i, stub) for i in range(count), each on its own thread and
    gRPC channel, released together by a barrier so their requests meet in
    the server's queue. Returns each call's result, or the grpc.RpcError it
    raised (None if it did not finish within `timeout` seconds)."""
    results = [None] * count
    start = threading.Barrier(count)

    def run(i):
        channel = server.new_channel()
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        try:
            start.wait(30)
            results[i] = call(i, stub)
        except grpc.RpcError as e:
            results[i] = e
        finally:
            channel.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return results


def wait_until(predicate, timeout, interval=0.05):
    """Polls PREDICATE until it returns a true value or TIMEOUT s pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


# --- TLS ---------------------------------------------------------------------

def tls_credentials(ca, cert=None, key=None, token=None):
    """grpc.ChannelCredentials trusting the CA file CA; with CERT and KEY
    files the client presents that certificate (mTLS); with TOKEN every call
    carries `authorization: Bearer TOKEN`."""
    def read(path):
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(ca), private_key=read(key) if key else None,
        certificate_chain=read(cert) if cert else None)
    if token is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token))
    return credentials


# --- Requests ----------------------------------------------------------------

DATATYPES = {
    "FP32": np.float32, "FP64": np.float64, "FP16": np.float16,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "BOOL": np.bool_,
}
_NUMPY_TO_DATATYPE = {np.dtype(v): k for k, v in DATATYPES.items()}
# Outputs decode BF16 (which NumPy lacks) as its uint16 bit patterns.
_OUTPUT_DTYPES = dict(DATATYPES, BF16=np.uint16)


def datatype_of(array):
    return _NUMPY_TO_DATATYPE[np.asarray(array).dtype]


def _items(inputs):
    return inputs.items() if isinstance(inputs, dict) else inputs


def make_request(model, inputs, raw=True, version="", outputs=None, request_id=""):
    """A ModelInferRequest for INPUTS ({name: array} or [(name, array)]).

    raw=True puts the bytes in raw_input_contents; raw=False uses the typed
    contents fields (fp32_contents for FP32, ...). OUTPUTS names the
    requested outputs (None: all). The message can be edited afterwards to
    build invalid requests.
    """
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    for name, array in _items(inputs):
        array = np.ascontiguousarray(array)
        tensor = request.inputs.add(name=name, datatype=datatype_of(array),
                                    shape=list(array.shape))
        if raw:
            request.raw_input_contents.append(array.tobytes())
        else:
            _fill_contents(tensor.contents, tensor.datatype, array)
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def _fill_contents(contents, datatype, array):
    flat = array.ravel()
    if datatype == "FP32":
        contents.fp32_contents.extend(flat.tolist())
    elif datatype == "FP64":
        contents.fp64_contents.extend(flat.tolist())
    elif datatype in ("INT8", "INT16", "INT32"):
        contents.int_contents.extend(flat.tolist())
    elif datatype == "INT64":
        contents.int64_contents.extend(flat.tolist())
    elif datatype in ("UINT8", "UINT16", "UINT32"):
        contents.uint_contents.extend(flat.tolist())
    elif datatype == "UINT64":
        contents.uint64_contents.extend(flat.tolist())
    elif datatype == "BOOL":
        contents.bool_contents.extend(flat.tolist())
    else:
        raise ValueError("no typed contents field for " + datatype)


def decode_outputs(response):
    """{name: ndarray} from a ModelInferResponse (raw_output_contents); BF16 as uint16 bits."""
    result = {}
    for i, tensor in enumerate(response.outputs):
        dtype = _OUTPUT_DTYPES[tensor.datatype]
        shape = tuple(tensor.shape)
        if i < len(response.raw_output_contents):
            data = np.frombuffer(response.raw_output_contents[i], dtype=dtype)
        else:
            data = np.asarray(_typed_contents(tensor), dtype=dtype)
        expected = int(np.prod(shape, dtype=np.int64))
        if data.size != expected:
            raise ValueError("output %r: %d values for shape %s"
                             % (tensor.name, data.size, list(shape)))
        result[tensor.name] = data.reshape(shape)
    return result


def _typed_contents(tensor):
    c = tensor.contents
    for field in ("fp32_contents", "fp64_contents", "int_contents", "int64_contents",
                  "uint_contents", "uint64_contents", "bool_contents"):
        values = getattr(c, field)
        if len(values):
            return list(values)
    return []


def infer(stub, model, inputs, raw=True, version="", outputs=None, deadline=30.0):
    """Sends one ModelInfer; returns {output name: ndarray}.

    Raises grpc.RpcError on failure (.code(), .details()).
    """
    request = make_request(model, inputs, raw=raw, version=version, outputs=outputs)
    response = stub.ModelInfer(request, timeout=deadline)
    return decode_outputs(response)


# --- Prometheus text format --------------------------------------------------

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
                     r"(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    """[(name, {label: value}, float)] from a Prometheus text exposition."""
    samples = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            raise ValueError("not a sample line: %r" % line)
        labels = {}
        if match.group("labels"):
            for key, value in _LABEL.findall(match.group("labels")):
                labels[key] = (value.replace("\\n", "\n").replace('\\"', '"')
                               .replace("\\\\", "\\"))
        samples.append((match.group("name"), labels, float(match.group("value"))))
    return samples


class Metrics:
    """A scraped /metrics page with lookups by name and labels."""

    def __init__(self, text):
        self.text = text
        self.samples = parse_metrics(text)

    def find(self, name, **labels):
        """The samples named NAME whose labels include LABELS."""
        return [(n, l, v) for n, l, v in self.samples
                if n == name and all(l.get(k) == str(val) for k, val in labels.items())]

    def sum(self, name, **labels):
        """The sum of matching samples (0.0 when none match)."""
        return float(sum(v for _, _, v in self.find(name, **labels)))

    def has(self, name, **labels):
        return bool(self.find(name, **labels))


def stop_server_and_remove(server, repo):
    """Stops `server` with SIGTERM and removes the repository `repo`. Raises
    AssertionError, with the server's stderr, unless it exited 0."""
    try:
        code = server.stop()
        if code != 0:
            raise AssertionError("numaserve exited with %r\n%s" % (code, server.stderr_text()))
    finally:
        shutil.rmtree(repo, ignore_errors=True)
