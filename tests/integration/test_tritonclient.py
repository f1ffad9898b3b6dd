#!/usr/bin/python3
"""Triton's own Python client, unchanged (tritonclient from PyPI, pinned in
requirements/triton.txt), against a real server: tritonclient.grpc and
tritonclient.http making every call Triton's client examples make: server
and model liveness and readiness (an unknown model is not ready, not an
error), server metadata (its extensions), model metadata and config,
inference with JSON and binary tensors and raw gRPC contents, requested
outputs as binary or JSON, async inference, streaming on gRPC, statistics,
the repository index, load and unload in explicit mode, and errors raised
as InferenceServerException with the server's reason.

Two interpreters. tritonclient and what it imports live in the virtual
environment <build>/venv/triton (tools/python/venv.sh, made by make test);
ctest starts this file with Debian's python3, which re-executes it with
the environment's python (NUMASERVE_TRITON_PYTHON). The models and the
outputs they must give are made with Debian's python3-onnx by the same
file run as `--write-fixtures DIR` (the environment holds no onnx, and
numaserve_client's stubs of the same protos would clash with
tritonclient's in one process).

Models: the default `fashion_classifier` (image FP32 [n,1,28,28] ->
probabilities FP32 [n,10]), `echo` (x_<TYPE> [n,3] -> y_<TYPE>, one per
datatype below) and `echo_later`, the same as echo, not loaded at start.
"""

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CLIENTS = os.path.join(HERE, "..", "clients")
MODEL = "fashion_classifier"
ECHO = "echo"
LATER = "echo_later"
TYPES = ["BOOL", "UINT8", "INT8", "INT16", "UINT32", "INT32", "INT64", "FP16", "FP32", "FP64"]
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics"]
RTOL, ATOL = 1e-4, 1e-5
PORTS_LINE = re.compile(r"^grpc=\S+:(?P<grpc>\d+) metrics=\S+:\d+ http=\S+:(?P<http>\d+)")


def write_fixtures(directory):
    """With Debian's python3-onnx: the model repository in DIRECTORY/models
    and the images and outputs the tests compare with in expected.npz."""
    import numpy as np

    sys.path.insert(0, CLIENTS)
    import numaserve_fixtures as nf
    from onnx import TensorProto, helper

    repo = os.path.join(directory, "models")
    reference = nf.ReferenceModel(nf.write_default_model(repo))
    onnx_type = {t: getattr(TensorProto, n) for t, n in [
        ("BOOL", "BOOL"), ("UINT8", "UINT8"), ("INT8", "INT8"), ("INT16", "INT16"),
        ("UINT32", "UINT32"), ("INT32", "INT32"), ("INT64", "INT64"), ("FP16", "FLOAT16"),
        ("FP32", "FLOAT"), ("FP64", "DOUBLE")]}
    for name in (ECHO, LATER):
        graph = helper.make_graph(
            [helper.make_node("Identity", ["x_" + t], ["y_" + t]) for t in TYPES], name,
            [helper.make_tensor_value_info("x_" + t, onnx_type[t], ["batch", 3]) for t in TYPES],
            [helper.make_tensor_value_info("y_" + t, onnx_type[t], ["batch", 3]) for t in TYPES])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                  producer_name="numaserve-tests")
        model.ir_version = 8
        nf.write_model(repo, name, model)
    images = nf.random_images(3, seed=7)
    np.savez(os.path.join(directory, "expected.npz"), images=images,
             probabilities=reference.run({"image": images})["probabilities"])


if __name__ == "__main__" and sys.argv[1:2] == ["--write-fixtures"]:
    write_fixtures(sys.argv[2])
    sys.exit(0)

sys.path.insert(0, CLIENTS)
import prerequisites  # noqa: E402

TRITON_PYTHON = os.environ.get("NUMASERVE_TRITON_PYTHON", "")
try:
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
    MISSING = None
except ImportError as e:
    # Once only: the environment's python, if it lacks tritonclient too,
    # reports it rather than starting itself again.
    if (__name__ == "__main__" and os.access(TRITON_PYTHON, os.X_OK)
            and not os.environ.get("NUMASERVE_TRITON_REEXEC")):
        os.environ["NUMASERVE_TRITON_REEXEC"] = "1"
        os.execv(TRITON_PYTHON, [TRITON_PYTHON] + sys.argv)
    MISSING = "tritonclient is not importable (%s) and NUMASERVE_TRITON_PYTHON=%r is not a " \
              "python: make venv-triton (make test makes it)" % (e, TRITON_PYTHON)


def numaserve_binary():
    return os.environ.get("NUMASERVE_BIN") or os.path.join(
        HERE, "..", "..", "build", "release", "bin", "numaserve")


class Server:
    """`numaserve serve` on 127.0.0.1, free ports, explicit model control."""

    def __init__(self, repo, args):
        argv = [numaserve_binary(), "serve", "--model-repository", repo, "--host", "127.0.0.1",
                "--grpc-port", "0", "--metrics-port", "0", "--http-port", "0"] + args
        setpriv = shutil.which("setpriv")
        if setpriv:  # the server dies with this process
            argv = [setpriv, "--pdeathsig", "KILL", "--"] + argv
        self.stderr = tempfile.TemporaryFile(prefix="numaserve_stderr_")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=self.stderr)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line.decode()) for line in self.proc.stdout],
                         daemon=True).start()
        try:
            line = lines.get(timeout=120)
        except queue.Empty:
            line = ""
        match = PORTS_LINE.match(line)
        if not match:
            self.stop()
            raise RuntimeError("numaserve printed %r, not its ports\n--- stderr ---\n%s"
                               % (line, self.stderr_text()))
        self.grpc_url = "127.0.0.1:" + match.group("grpc")
        self.http_url = "127.0.0.1:" + match.group("http")

    def stderr_text(self):
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-20000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def setUpModule():
    global SERVER, WORKDIR, EXPECTED
    if MISSING:
        return
    WORKDIR = tempfile.mkdtemp(prefix="numaserve_tritonclient_")
    fixture_python = os.environ.get("NUMASERVE_FIXTURE_PYTHON", "/usr/bin/python3")
    subprocess.run([fixture_python, os.path.abspath(__file__), "--write-fixtures", WORKDIR],
                   check=True, env=dict(os.environ, PYTHONPATH=""))
    EXPECTED = dict(np.load(os.path.join(WORKDIR, "expected.npz")))
    SERVER = Server(os.path.join(WORKDIR, "models"),
                    ["--model-control-mode", "explicit", "--load-model", MODEL + "," + ECHO])


def tearDownModule():
    if MISSING:
        return
    code = SERVER.stop()
    shutil.rmtree(WORKDIR, ignore_errors=True)
    if code != 0:
        raise RuntimeError("numaserve exited with %d\n%s" % (code, SERVER.stderr_text()))


def echo_inputs(rows, seed):
    """{x_TYPE: array}, each type's values spread over its range."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for t in TYPES:
        dtype = np.bool_ if t == "BOOL" else {"FP16": np.float16, "FP32": np.float32,
                                               "FP64": np.float64}.get(t) or np.dtype(t.lower())
        if t == "BOOL":
            a = rng.random((rows, 3)) < 0.5
        elif t.startswith("FP"):
            a = (rng.standard_normal((rows, 3)) * 100).astype(dtype)
        else:
            info = np.iinfo(dtype)
            a = rng.integers(info.min, info.max, size=(rows, 3), dtype=dtype, endpoint=True)
        inputs["x_" + t] = a
    return inputs


class ClientCalls:
    """The calls both clients make; the subclasses give the module."""

    client_module = None

    @classmethod
    def setUpClass(cls):
        if MISSING:
            return
        cls.client = cls.make_client()

    @classmethod
    def tearDownClass(cls):
        if not MISSING:
            cls.client.close()

    def setUp(self):
        if MISSING:
            prerequisites.missing(self, MISSING)

    def inputs(self, arrays, binary=True):
        result = []
        for name, a in arrays.items():
            tensor = self.client_module.InferInput(name, list(a.shape),
                                                   tritonclient_datatype(a))
            self.set_data(tensor, a, binary)
            result.append(tensor)
        return result

    def set_data(self, tensor, array, binary):
        tensor.set_data_from_numpy(array)

    def assert_raises_naming(self, call, *words):
        with self.assertRaises(InferenceServerException) as caught:
            call()
        for word in words:
            self.assertIn(word, caught.exception.message(), str(caught.exception))
        return caught.exception

    # -- health, metadata, config

    def test_liveness_and_readiness(self):
        self.assertTrue(self.client.is_server_live())
        self.assertTrue(self.client.is_server_ready())
        self.assertTrue(self.client.is_model_ready(MODEL))
        self.assertTrue(self.client.is_model_ready(MODEL, "1"))
        # As Triton answers: not ready, not an error.
        self.assertFalse(self.client.is_model_ready("no_such_model"))
        self.assertFalse(self.client.is_model_ready(MODEL, "7"))
        self.assertFalse(self.client.is_model_ready(LATER))

    def test_server_metadata_names_the_extensions(self):
        meta = self.metadata_dict(self.client.get_server_metadata())
        self.assertEqual(meta["name"], "numaserve")
        self.assertTrue(meta["version"])
        self.assertEqual(sorted(meta["extensions"]), EXTENSIONS)

    def test_model_metadata(self):
        meta = self.metadata_dict(self.client.get_model_metadata(MODEL))
        self.assertEqual(meta["name"], MODEL)
        self.assertEqual(meta["versions"], ["1"])
        self.assertEqual(meta["platform"], "onnxruntime_onnx")
        self.assertEqual([(t["name"], t["datatype"], [int(d) for d in t["shape"]])
                          for t in meta["inputs"]], [("image", "FP32", [-1, 1, 28, 28])])
        self.assertEqual([(t["name"], t["datatype"]) for t in meta["outputs"]],
                         [("probabilities", "FP32")])
        meta = self.metadata_dict(self.client.get_model_metadata(ECHO, "1"))
        self.assertEqual(sorted(t["name"] for t in meta["inputs"]),
                         sorted("x_" + t for t in TYPES))

    def test_model_config(self):
        # No config.pbtxt: no batching dimension, the ONNX file's shapes.
        config = self.config_dict(self.client.get_model_config(MODEL))
        self.assertEqual(config["name"], MODEL)
        self.assertEqual(config["platform"], "onnxruntime_onnx")
        self.assertEqual(int(config.get("max_batch_size", 0)), 0)
        self.assertEqual(config["input"][0]["name"], "image")
        self.assertEqual(config["input"][0]["data_type"], "TYPE_FP32")
        self.assertEqual([int(d) for d in config["input"][0]["dims"]], [-1, 1, 28, 28])
        self.assertEqual(config["output"][0]["name"], "probabilities")
        self.assertEqual(config["instance_group"][0]["kind"], "KIND_CPU")

    # -- inference

    def test_infer_matches_the_model(self):
        images = EXPECTED["images"]
        for binary in (True, False):
            result = self.client.infer(MODEL, self.inputs({"image": images}, binary),
                                       request_id="r-%s" % binary)
            np.testing.assert_allclose(result.as_numpy("probabilities"),
                                       EXPECTED["probabilities"], rtol=RTOL, atol=ATOL)
            self.assertEqual(self.response_dict(result)["id"], "r-%s" % binary)
            self.assertEqual(self.response_dict(result)["model_name"], MODEL)

    def test_infer_every_datatype(self):
        arrays = echo_inputs(2, seed=3)
        for binary in (True, False):
            result = self.client.infer(ECHO, self.inputs(arrays, binary))
            for t in TYPES:
                got = result.as_numpy("y_" + t)
                self.assertEqual(got.dtype, arrays["x_" + t].dtype, t)
                np.testing.assert_array_equal(got, arrays["x_" + t], err_msg=t)

    def test_fp64_values_come_back_exactly(self):
        # Doubles whose shortest decimal a parser rounding carelessly reads
        # a unit in the last place off, and the extremes.
        x = np.array([[-95.96447598081417, 0.1, 1 / 3], [2.2250738585072014e-308, 5e-324,
                                                          1.7976931348623157e308]])
        arrays = dict(echo_inputs(2, seed=6), x_FP64=x)
        for binary in (True, False):
            result = self.client.infer(ECHO, self.inputs(arrays, binary),
                                       outputs=[self.requested_output("y_FP64", binary)])
            self.assertEqual(result.as_numpy("y_FP64").tobytes(), x.tobytes(), binary)

    def test_requested_outputs(self):
        arrays = echo_inputs(1, seed=4)
        for binary in (True, False):
            outputs = [self.requested_output("y_INT32", binary),
                       self.requested_output("y_FP64", binary)]
            result = self.client.infer(ECHO, self.inputs(arrays), outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("y_INT32"), arrays["x_INT32"])
            np.testing.assert_array_equal(result.as_numpy("y_FP64"), arrays["x_FP64"])
            self.assertIsNone(result.as_numpy("y_UINT8"))

    def test_statistics_count_the_requests(self):
        def successes():
            stats = self.metadata_dict(self.client.get_inference_statistics(MODEL))
            self.assertEqual([s["name"] for s in stats["model_stats"]], [MODEL])
            success = stats["model_stats"][0]["inference_stats"].get("success", {})
            return int(success.get("count", 0))

        before = successes()
        for _ in range(3):
            self.client.infer(MODEL, self.inputs({"image": EXPECTED["images"][:1]}))
        self.assertEqual(successes() - before, 3)
        all_models = self.metadata_dict(self.client.get_inference_statistics())
        self.assertIn(MODEL, [s["name"] for s in all_models["model_stats"]])

    # -- repository

    def test_repository_index_load_and_unload(self):
        index = {m["name"]: m for m in self.index()}
        self.assertEqual(index[MODEL].get("state"), "READY")
        self.assertIn(LATER, index)
        self.assertNotEqual(index[LATER].get("state"), "READY")
        try:
            self.client.load_model(LATER)
            self.assertTrue(self.client.is_model_ready(LATER))
            arrays = echo_inputs(1, seed=5)
            result = self.client.infer(LATER, self.inputs(arrays))
            np.testing.assert_array_equal(result.as_numpy("y_INT64"), arrays["x_INT64"])
            self.assertEqual({m["name"]: m.get("state") for m in self.index()}[LATER], "READY")
        finally:
            self.client.unload_model(LATER)
        self.assertFalse(self.client.is_model_ready(LATER))
        self.assert_raises_naming(lambda: self.client.load_model("no_such_model"),
                                  "no_such_model")

    # -- errors

    def test_errors_carry_the_servers_reason(self):
        images = EXPECTED["images"][:1]
        self.assert_raises_naming(
            lambda: self.client.infer("no_such_model", self.inputs({"image": images})),
            "no_such_model")
        self.assert_raises_naming(lambda: self.client.get_model_metadata("no_such_model"),
                                  "no_such_model")
        self.assert_raises_naming(lambda: self.client.get_model_config("no_such_model"),
                                  "no_such_model")
        wrong = np.zeros((1, 1, 28, 27), np.float32)
        self.assert_raises_naming(lambda: self.client.infer(MODEL, self.inputs({"image": wrong})),
                                  "image", "shape")
        self.assert_raises_naming(
            lambda: self.client.infer(MODEL, self.inputs({"image": images}),
                                      outputs=[self.requested_output("logits", True)]),
            "logits")
        # The server still answers.
        self.assertTrue(self.client.is_model_ready(MODEL))


def tritonclient_datatype(array):
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)


class GrpcClientTest(ClientCalls, unittest.TestCase):

    @classmethod
    def make_client(cls):
        cls.client_module = grpcclient
        return grpcclient.InferenceServerClient(SERVER.grpc_url)

    def requested_output(self, name, binary):
        return grpcclient.InferRequestedOutput(name)

    def metadata_dict(self, message):
        from google.protobuf import json_format

        return json_format.MessageToDict(message, preserving_proto_field_name=True)

    def response_dict(self, result):
        return self.metadata_dict(result.get_response())

    def config_dict(self, response):
        return self.metadata_dict(response.config)

    def index(self):
        return self.metadata_dict(self.client.get_model_repository_index()).get("models", [])

    def test_async_infer_calls_back(self):
        answers = queue.Queue()
        batches = [EXPECTED["images"][i:i + 1] for i in range(3)]
        for i, x in enumerate(batches):
            self.client.async_infer(MODEL, self.inputs({"image": x}), request_id=str(i),
                                    callback=lambda result, error: answers.put((result, error)))
        got = {}
        for _ in batches:
            result, error = answers.get(timeout=60)
            self.assertIsNone(error)
            got[result.get_response().id] = result.as_numpy("probabilities")
        for i in range(3):
            np.testing.assert_allclose(got[str(i)], EXPECTED["probabilities"][i:i + 1],
                                       rtol=RTOL, atol=ATOL)

    def test_stream_infer(self):
        answers = queue.Queue()
        client = grpcclient.InferenceServerClient(SERVER.grpc_url)
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for i in range(3):
                client.async_stream_infer(MODEL, self.inputs({"image": EXPECTED["images"][i:i + 1]}),
                                          request_id="s%d" % i)
            client.async_stream_infer("no_such_model",
                                      self.inputs({"image": EXPECTED["images"][:1]}),
                                      request_id="missing")
            got, errors = {}, []
            for _ in range(4):
                result, error = answers.get(timeout=60)
                if error is not None:
                    errors.append(error)
                else:
                    got[result.get_response().id] = result.as_numpy("probabilities")
        finally:
            client.stop_stream()
            client.close()
        self.assertEqual(sorted(got), ["s0", "s1", "s2"])
        for i in range(3):
            np.testing.assert_allclose(got["s%d" % i], EXPECTED["probabilities"][i:i + 1],
                                       rtol=RTOL, atol=ATOL)
        self.assertEqual(len(errors), 1)
        self.assertIn("no_such_model", errors[0].message())

    def test_stream_marks_the_final_response_when_asked(self):
        # perf_analyzer and Triton's C++ client ask for it on every request.
        answers = queue.Queue()
        client = grpcclient.InferenceServerClient(SERVER.grpc_url)
        try:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            client.async_stream_infer(MODEL, self.inputs({"image": EXPECTED["images"][:1]}),
                                      request_id="final", enable_empty_final_response=True)
            client.async_stream_infer(MODEL, self.inputs({"image": EXPECTED["images"][:1]}),
                                      request_id="plain")
            got = {}
            for _ in range(2):
                result, error = answers.get(timeout=60)
                self.assertIsNone(error)
                got[result.get_response().id] = result.get_response()
        finally:
            client.stop_stream()
            client.close()
        self.assertTrue(got["final"].parameters["triton_final_response"].bool_param)
        self.assertNotIn("triton_final_response", got["plain"].parameters)
        np.testing.assert_allclose(result.as_numpy("probabilities"),
                                   EXPECTED["probabilities"][:1], rtol=RTOL, atol=ATOL)


class HttpClientTest(ClientCalls, unittest.TestCase):

    @classmethod
    def make_client(cls):
        cls.client_module = httpclient
        return httpclient.InferenceServerClient(SERVER.http_url, concurrency=4)

    def set_data(self, tensor, array, binary):
        tensor.set_data_from_numpy(array, binary_data=binary)

    def requested_output(self, name, binary):
        return httpclient.InferRequestedOutput(name, binary_data=binary)

    def metadata_dict(self, answer):
        return answer

    def response_dict(self, result):
        return result.get_response()

    def config_dict(self, config):
        return config

    def index(self):
        return self.client.get_model_repository_index()

    def test_async_infer(self):
        requests = [self.client.async_infer(MODEL, self.inputs({"image": x}, binary))
                    for x, binary in ((EXPECTED["images"][:1], True),
                                      (EXPECTED["images"][1:2], False),
                                      (EXPECTED["images"][2:], True))]
        for i, request in enumerate(requests):
            np.testing.assert_allclose(request.get_result(timeout=60).as_numpy("probabilities"),
                                       EXPECTED["probabilities"][i:i + 1], rtol=RTOL, atol=ATOL)

    def test_unknown_model_is_not_ready_with_triton_status(self):
        # tritonclient.http's is_model_ready reads any non-200 as false;
        # Triton answers 400 (not ready), not 404.
        url = "http://%s/v2/models/no_such_model/ready" % SERVER.http_url
        with self.assertRaises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url, timeout=10)
        self.assertEqual(caught.exception.code, 400)

    def test_errors_are_http_statuses(self):
        error = self.assert_raises_naming(
            lambda: self.client.get_model_metadata("no_such_model"), "no_such_model")
        self.assertEqual(error.status(), "404")
        wrong = np.zeros((1, 1, 28, 27), np.float32)
        error = self.assert_raises_naming(
            lambda: self.client.infer(MODEL, self.inputs({"image": wrong})), "shape")
        self.assertEqual(error.status(), "400")


if __name__ == "__main__":
    unittest.main()
