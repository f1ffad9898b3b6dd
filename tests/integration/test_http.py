#!/usr/bin/python3
"""The HTTP/REST front end (KServe v2 REST) of a real server, with Python's
own http.client: every endpoint, inference over JSON and over Triton's
binary tensor data giving the numbers gRPC gives, every datatype, keep-alive,
hostile requests each answered with its documented status (the server
answering afterwards), clients that stall without holding up others, and
the gRPC port's TLS, client certificates and bearer tokens on HTTP.

Models (a temporary repository): the default `fashion_classifier`
(image FP32 [n,1,28,28] -> probabilities FP32 [n,10]) and `echo`, one
input per numeric datatype (x_<TYPE> [n,3]) returned as y_<TYPE>.
"""

import http.client
import json
import os
import shutil
import socket
import ssl
import sys
import tempfile
import time
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = nc.DEFAULT_MODEL_NAME
ECHO = "echo"
TYPES = ["BOOL", "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64",
         "FP16", "BF16", "FP32", "FP64"]
NUMPY = dict(nc.DATATYPES, BF16=np.uint16)  # BF16 as its bit patterns
MAX_BODY = 1 << 20  # --grpc-max-message-bytes of the main server
TOKEN = "http-test-token-0123456789abcdef"


def echo_model():
    from onnx import TensorProto, helper

    onnx_type = {"BOOL": TensorProto.BOOL, "UINT8": TensorProto.UINT8, "INT8": TensorProto.INT8,
                 "UINT16": TensorProto.UINT16, "INT16": TensorProto.INT16,
                 "UINT32": TensorProto.UINT32, "INT32": TensorProto.INT32,
                 "UINT64": TensorProto.UINT64, "INT64": TensorProto.INT64,
                 "FP16": TensorProto.FLOAT16, "BF16": TensorProto.BFLOAT16,
                 "FP32": TensorProto.FLOAT, "FP64": TensorProto.DOUBLE}
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x_" + t], ["y_" + t]) for t in TYPES], ECHO,
        [helper.make_tensor_value_info("x_" + t, onnx_type[t], ["batch", 3]) for t in TYPES],
        [helper.make_tensor_value_info("y_" + t, onnx_type[t], ["batch", 3]) for t in TYPES])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model


def echo_inputs(rows, seed):
    """{x_TYPE: array} using each type's whole range (BF16: bit patterns of
    floats, as the server keeps them)."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for t in TYPES:
        if t == "BOOL":
            a = rng.random((rows, 3)) < 0.5
        elif t in ("FP16", "FP32", "FP64"):
            a = (rng.standard_normal((rows, 3)) * 100).astype(NUMPY[t])
        elif t == "BF16":
            a = (rng.standard_normal((rows, 3)).astype(np.float32).view(np.uint32) >> 16)
            a = a.astype(np.uint16)
        else:
            info = np.iinfo(NUMPY[t])
            a = rng.integers(info.min, info.max, size=(rows, 3), dtype=NUMPY[t], endpoint=True)
        inputs["x_" + t] = a
    return inputs


def json_values(datatype, array):
    """ARRAY as the nested lists a JSON request carries (BF16 as floats)."""
    if datatype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32).tolist()
    if datatype == "FP16":
        return array.astype(np.float32).tolist()
    return array.tolist()


def from_json_values(datatype, values, shape):
    if datatype == "BF16":
        floats = np.array(values, dtype=np.float32)
        return (floats.view(np.uint32) >> 16).astype(np.uint16).reshape(shape)
    return np.array(values, dtype=NUMPY[datatype]).reshape(shape)


def datatype_of(name, array):
    return name.split("_", 1)[1] if name.startswith("x_") else nc.datatype_of(array)


def json_request(inputs, outputs=None):
    body = {"inputs": [{"name": n, "datatype": datatype_of(n, a), "shape": list(a.shape),
                        "data": json_values(datatype_of(n, a), a)} for n, a in inputs.items()]}
    if outputs is not None:
        body["outputs"] = [{"name": o} for o in outputs]
    return json.dumps(body).encode(), {"Content-Type": "application/json"}


def binary_request(inputs, binary_outputs=True):
    header = {"inputs": [], "parameters": {"binary_data_output": binary_outputs}}
    blobs = []
    for name, a in inputs.items():
        raw = np.ascontiguousarray(a).tobytes()
        header["inputs"].append({"name": name, "datatype": datatype_of(name, a),
                                 "shape": list(a.shape),
                                 "parameters": {"binary_data_size": len(raw)}})
        blobs.append(raw)
    js = json.dumps(header).encode()
    return js + b"".join(blobs), {"Inference-Header-Content-Length": str(len(js)),
                                  "Content-Type": "application/octet-stream"}


def decode_reply(response, data):
    """{output name: array} from an infer reply, JSON or JSON + binary."""
    length = response.getheader("Inference-Header-Content-Length")
    js = json.loads(data if length is None else data[:int(length)])
    binary = b"" if length is None else data[int(length):]
    outputs, offset = {}, 0
    for o in js["outputs"]:
        if "data" in o:
            outputs[o["name"]] = from_json_values(o["datatype"], o["data"], o["shape"])
        else:
            n = o["parameters"]["binary_data_size"]
            outputs[o["name"]] = np.frombuffer(binary[offset:offset + n],
                                               NUMPY[o["datatype"]]).reshape(o["shape"])
            offset += n
    return js, outputs


class Client:
    """One keep-alive connection; call() returns (status, response, body)."""

    def __init__(self, port, context=None, host="127.0.0.1"):
        if context is None:
            self.conn = http.client.HTTPConnection(host, port, timeout=30)
        else:
            self.conn = http.client.HTTPSConnection(host, port, timeout=30, context=context)

    def call(self, method, path, body=None, headers=None):
        self.conn.request(method, path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        return response.status, response, response.read()

    def json(self, method, path, body=None, headers=None):
        status, response, data = self.call(method, path, body, headers)
        return status, (json.loads(data) if data else None)

    def close(self):
        self.conn.close()


def raw_exchange(port, data, timeout=10):
    """Sends DATA on a new connection and returns what comes back until the
    server closes it or TIMEOUT passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        received = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                received += chunk
                if b"\r\n\r\n" in received and b"Content-Length: " in received:
                    head, _, rest = received.partition(b"\r\n\r\n")
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    if len(rest) >= length:
                        break
        except socket.timeout:
            pass
    return received


class HttpApiTest(unittest.TestCase):
    """One server: explicit model control, a 1 MiB message limit, a 1 MiB
    worker arena (half of it is the most one request may take: the way to a
    RESOURCE_EXHAUSTED), and a single HTTP event-loop thread, so anything
    one connection could block would block every other."""

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_http_")
        nc.write_default_model(cls.repo)
        nc.write_model(cls.repo, ECHO, echo_model())
        cls.server = nc.ServerProcess(cls.repo, [
            "--model-control-mode", "explicit", "--load-model", MODEL + "," + ECHO,
            "--grpc-max-message-bytes", str(MAX_BODY), "--worker-arena-mb", "1",
            "--http-threads", "1"]).start()
        cls.port = cls.server.http_port
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def setUp(self):
        self.client = Client(self.port)

    def tearDown(self):
        self.client.close()

    def assertAnswers(self):
        """The server still serves, on a new connection."""
        c = Client(self.port)
        try:
            self.assertEqual(c.call("GET", "/v2/health/ready")[0], 200)
            body, headers = json_request({"image": nc.random_images(1, seed=9)})
            status, reply = c.json("POST", "/v2/models/%s/infer" % MODEL, body, headers)
            self.assertEqual(status, 200, reply)
        finally:
            c.close()

    def test_port_is_announced(self):
        self.assertIsNotNone(self.port, "no http= in the ports line")
        self.assertNotEqual(self.port, self.server.grpc_port)

    def test_health_and_server_metadata(self):
        for path in ("/v2/health/live", "/v2/health/ready"):
            status, response, data = self.client.call("GET", path)
            self.assertEqual((status, data), (200, b""), path)
        status, meta = self.client.json("GET", "/v2")
        self.assertEqual(status, 200)
        self.assertEqual(meta["name"], "numaserve")
        grpc_meta = self.stub.ServerMetadata(nc.pb.ServerMetadataRequest(), timeout=10)
        self.assertEqual(meta["version"], grpc_meta.version)
        for extension in ("binary_tensor_data", "model_repository", "statistics",
                          "model_configuration"):
            self.assertIn(extension, meta["extensions"])

    def test_model_metadata_ready_and_config_match_grpc(self):
        grpc_meta = self.stub.ModelMetadata(nc.pb.ModelMetadataRequest(name=MODEL), timeout=10)
        for path in ("/v2/models/%s" % MODEL, "/v2/models/%s/versions/1" % MODEL):
            status, meta = self.client.json("GET", path)
            self.assertEqual(status, 200, meta)
            self.assertEqual(meta["name"], MODEL)
            self.assertEqual(meta["versions"], list(grpc_meta.versions))
            self.assertEqual(meta["platform"], grpc_meta.platform)
            self.assertEqual(meta["inputs"], [{"name": t.name, "datatype": t.datatype,
                                               "shape": list(t.shape)} for t in grpc_meta.inputs])
            self.assertEqual(meta["outputs"][0]["name"], "probabilities")
        for path in ("/v2/models/%s/ready" % MODEL, "/v2/models/%s/versions/1/ready" % MODEL):
            self.assertEqual(self.client.call("GET", path)[0], 200, path)
        grpc_config = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=MODEL), timeout=10).config
        status, config = self.client.json("GET", "/v2/models/%s/config" % MODEL)
        self.assertEqual(status, 200, config)
        self.assertEqual(config["name"], MODEL)
        self.assertEqual(config["max_batch_size"], grpc_config.max_batch_size)
        self.assertEqual(config["input"][0]["data_type"], "TYPE_FP32")
        self.assertEqual(config["input"][0]["dims"], list(grpc_config.input[0].dims))
        self.assertEqual(config["instance_group"][0]["kind"], "KIND_CPU")
        self.assertIn("gemm_backend", config["parameters"])

    def test_infer_over_json_binary_and_grpc_gives_the_same_numbers(self):
        images = nc.random_images(3, seed=1)
        expected = nc.infer(self.stub, MODEL, {"image": images})["probabilities"]
        path = "/v2/models/%s/infer" % MODEL
        body, headers = json_request({"image": images})
        status, response, data = self.client.call("POST", path, body, headers)
        self.assertEqual(status, 200, data[:300])
        self.assertEqual(response.getheader("Content-Type"), "application/json")
        js, out = decode_reply(response, data)
        self.assertEqual((js["model_name"], js["model_version"]), (MODEL, "1"))
        np.testing.assert_array_equal(out["probabilities"], expected)
        # Flat data, an id, the version in the path, the output asked for by name.
        flat = {"id": "r-7", "inputs": [{"name": "image", "datatype": "FP32",
                                         "shape": [3, 1, 28, 28],
                                         "data": images.ravel().tolist()}],
                "outputs": [{"name": "probabilities"}]}
        status, response, data = self.client.call(
            "POST", "/v2/models/%s/versions/1/infer" % MODEL, json.dumps(flat))
        self.assertEqual(status, 200, data[:300])
        js, out = decode_reply(response, data)
        self.assertEqual(js["id"], "r-7")
        np.testing.assert_array_equal(out["probabilities"], expected)
        # Binary in and out.
        body, headers = binary_request({"image": images})
        status, response, data = self.client.call("POST", path, body, headers)
        self.assertEqual(status, 200, data[:300])
        self.assertEqual(response.getheader("Content-Type"), "application/octet-stream")
        js, out = decode_reply(response, data)
        self.assertEqual(js["outputs"][0]["parameters"]["binary_data_size"], 3 * 10 * 4)
        np.testing.assert_array_equal(out["probabilities"], expected)
        # Binary in, JSON out for the output that says so.
        header = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [3, 1, 28, 28],
                              "parameters": {"binary_data_size": images.nbytes}}],
                  "outputs": [{"name": "probabilities", "parameters": {"binary_data": False}}],
                  "parameters": {"binary_data_output": True}}
        js_bytes = json.dumps(header).encode()
        status, response, data = self.client.call(
            "POST", path, js_bytes + images.tobytes(),
            {"Inference-Header-Content-Length": str(len(js_bytes))})
        self.assertEqual(status, 200, data[:300])
        self.assertIsNone(response.getheader("Inference-Header-Content-Length"))
        np.testing.assert_array_equal(decode_reply(response, data)[1]["probabilities"], expected)

    def test_every_datatype_round_trips(self):
        inputs = echo_inputs(2, seed=3)
        path = "/v2/models/%s/infer" % ECHO
        for name, (body, headers) in (("json", json_request(inputs)),
                                      ("binary", binary_request(inputs))):
            with self.subTest(encoding=name):
                status, response, data = self.client.call("POST", path, body, headers)
                self.assertEqual(status, 200, data[:300])
                _, out = decode_reply(response, data)
                for t in TYPES:
                    np.testing.assert_array_equal(out["y_" + t], inputs["x_" + t], err_msg=t)
                    self.assertEqual(out["y_" + t].dtype, np.dtype(NUMPY[t]), t)

    def test_statistics_and_metrics_count_http_requests(self):
        def successes(path):
            status, stats = self.client.json("GET", path)
            self.assertEqual(status, 200, stats)
            return sum(m["inference_stats"]["success"]["count"] for m in stats["model_stats"]
                       if m["name"] == MODEL)

        def http_requests():
            return self.server.metrics().sum("numaserve_requests_total", model=MODEL,
                                             protocol="http", outcome="success")

        paths = ("/v2/models/stats", "/v2/models/%s/stats" % MODEL,
                 "/v2/models/%s/versions/1/stats" % MODEL)
        before = [successes(p) for p in paths]
        metric_before = http_requests()
        grpc_before = self.server.metrics().sum("numaserve_requests_total", model=MODEL,
                                                protocol="grpc", outcome="success")
        body, headers = json_request({"image": nc.random_images(1, seed=2)})
        self.assertEqual(self.client.call("POST", "/v2/models/%s/infer" % MODEL, body,
                                          headers)[0], 200)
        self.assertEqual([successes(p) - b for p, b in zip(paths, before)], [1, 1, 1])
        self.assertEqual(http_requests() - metric_before, 1)
        self.assertEqual(self.server.metrics().sum("numaserve_requests_total", model=MODEL,
                                                   protocol="grpc", outcome="success"),
                         grpc_before)
        self.assertEqual(self.client.json("GET", "/v2/models/nope/stats")[0], 404)

    def test_repository_index_unload_and_load(self):
        index = lambda body=None: self.client.json("POST", "/v2/repository/index", body)  # noqa
        status, models = index()
        self.assertEqual(status, 200, models)
        self.assertIn({"name": ECHO, "version": "1", "state": "READY", "reason": ""}, models)
        ready_path = "/v2/models/%s/ready" % ECHO
        try:
            status, reply = self.client.json("POST", "/v2/repository/models/%s/unload" % ECHO)
            self.assertEqual(status, 200, reply)
            self.assertEqual(self.client.call("GET", ready_path)[0], 400)
            states = {m["name"]: m["state"] for m in index()[1]}
            self.assertEqual(states[ECHO], "UNAVAILABLE")
            self.assertNotIn(ECHO, [m["name"] for m in index(b'{"ready": true}')[1]])
            body, headers = json_request(echo_inputs(1, seed=1))
            status, reply = self.client.json("POST", "/v2/models/%s/infer" % ECHO, body, headers)
            self.assertEqual(status, 503, reply)
            self.assertIn("error", reply)
        finally:
            status, reply = self.client.json("POST", "/v2/repository/models/%s/load" % ECHO,
                                             b'{"parameters": {}}')
            self.assertEqual(status, 200, reply)
        self.assertEqual(self.client.call("GET", ready_path)[0], 200)
        status, reply = self.client.json("POST", "/v2/repository/models/nope/load")
        self.assertEqual(status, 404, reply)
        status, reply = self.client.json("POST", "/v2/repository/models/%s/load" % ECHO,
                                         b'{"parameters": {"file:1/model.onnx": "AA=="}}')
        self.assertEqual(status, 400, reply)
        self.assertIn("not supported", reply["error"])
        self.assertEqual(index(b'{"ready": 1}')[0], 400)
        self.assertEqual(index(b'{"ready": tru')[0], 400)

    def test_keep_alive_serves_many_requests_on_one_connection(self):
        body, headers = json_request({"image": nc.random_images(1, seed=4)})
        calls = [("GET", "/v2/health/live", None, {}), ("GET", "/v2", None, {}),
                 ("POST", "/v2/models/%s/infer" % MODEL, body, headers),
                 ("GET", "/v2/models/nope", None, {}),
                 ("POST", "/v2/models/%s/infer" % MODEL, b"{", {}),
                 ("POST", "/v2/models/%s/infer" % MODEL, body, headers)]
        sock = None
        for method, path, data, hdrs in calls:
            status, response, _ = self.client.call(method, path, data, hdrs)
            self.assertNotEqual((response.getheader("Connection") or "").lower(), "close", path)
            if sock is None:
                sock = self.client.conn.sock
            self.assertIs(self.client.conn.sock, sock, "reconnected before " + path)
        self.assertEqual(status, 200)

    def test_back_pressure_is_429(self):
        # 200 images need more than half of the 1 MiB worker arena.
        body, headers = binary_request({"image": nc.random_images(200)})
        status, reply = self.client.json("POST", "/v2/models/%s/infer" % MODEL, body, headers)
        self.assertEqual(status, 429, reply)
        self.assertIn("half of --worker-arena-mb", reply["error"])
        self.assertAnswers()

    def test_hostile_requests_get_their_status(self):
        infer = "/v2/models/%s/infer" % MODEL
        image = {"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28],
                 "data": [0.5] * 784}

        def request(**changes):
            return json.dumps({"inputs": [dict(image, **changes)]}).encode()

        binary_header = json.dumps({"inputs": [{
            "name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28],
            "parameters": {"binary_data_size": 3136}}]}).encode()
        nested = 0.5
        for _ in range(40):
            nested = [nested]

        cases = [
            ("truncated JSON", "POST", infer, request()[:100], {}, 400, "not valid JSON"),
            ("wrong count", "POST", infer, request(data=[0.5] * 700), {}, 400,
             "holds 784 values, 'data' has 700"),
            ("huge shape", "POST", infer, request(shape=[2 ** 40]), {}, 400, "more than the"),
            ("negative dim", "POST", infer, request(shape=[1, 1, -28, 28]), {}, 400,
             "is negative"),
            ("wrong datatype", "POST", infer, request(datatype="INT32", data=[1] * 784), {},
             400, "the model expects FP32"),
            ("wrong shape", "POST", infer, request(shape=[1, 784], data=[0.5] * 784), {}, 400,
             "the model expects"),
            ("unknown input", "POST", infer, request(name="img"), {}, 400, "unknown input"),
            ("header length past the body", "POST", infer, request(),
             {"Inference-Header-Content-Length": str(len(request()) + 1)}, 400,
             "more than the body"),
            ("bad header length", "POST", infer, request(),
             {"Inference-Header-Content-Length": "-5"}, 400, "byte count"),
            ("binary size past the body", "POST", infer, binary_header + b"\0" * 100,
             {"Inference-Header-Content-Length": str(len(binary_header))}, 400,
             "runs past the end of the body"),
            ("unknown model", "POST", "/v2/models/nope/infer", request(), {}, 404, "nope"),
            ("unknown version", "POST", "/v2/models/%s/versions/9/infer" % MODEL, request(), {},
             404, "version"),
            ("version not a number", "GET", "/v2/models/%s/versions/x1" % MODEL, None, {}, 404,
             "positive integers"),
            ("unknown path", "GET", "/v2/modelz", None, {}, 404, "no such path"),
            ("unknown model action", "GET", "/v2/models/%s/explain" % MODEL, None, {}, 404, ""),
            ("wrong method", "GET", infer, None, {}, 405, "takes POST"),
            ("wrong method on metadata", "DELETE", "/v2/models/%s" % MODEL, None, {}, 405,
             "takes GET"),
            ("non-UTF-8 model in the path", "POST", "/v2/models/%FF%FE/infer", request(), {},
             400, "not UTF-8"),
            ("NUL in the path", "GET", "/v2/models/a%00b", None, {}, 400, "NUL"),
            ("non-UTF-8 input name", "POST", infer,
             request().replace(b'"image"', b'"im\xffage"'), {}, 400, "not valid JSON"),
            ("not an object", "POST", infer, b"[1, 2, 3]", {}, 400, "JSON object"),
            ("deep nesting", "POST", infer, request(data=nested), {}, 400, "deeper than 32"),
            ("empty body", "POST", infer, b"", {}, 400, "not valid JSON"),
        ]
        for name, method, path, body, headers, expected, fragment in cases:
            with self.subTest(case=name):
                status, response, data = self.client.call(method, path, body, headers)
                self.assertEqual(status, expected, "%s: %s" % (name, data[:300]))
                self.assertEqual(response.getheader("Content-Type"), "application/json", name)
                reply = json.loads(data)
                self.assertIn(fragment, reply["error"], name)
                if expected == 405:
                    self.assertIn(response.getheader("Allow"), ("GET", "POST"))
        self.assertAnswers()

    def test_bodies_over_the_limit_are_refused_before_they_are_read(self):
        head = ("POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\n" % MODEL).encode()
        # A declared length over --grpc-max-message-bytes: 413 without a byte of body.
        reply = raw_exchange(self.port, head + b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        self.assertTrue(reply.startswith(b"HTTP/1.1 413"), reply[:200])
        # Chunked: refused once the chunks announced pass the limit.
        reply = raw_exchange(self.port, head + b"Transfer-Encoding: chunked\r\n\r\n"
                             + b"%x\r\n" % (MAX_BODY + 1) + b"x" * 1000)
        self.assertTrue(reply.startswith(b"HTTP/1.1 413"), reply[:200])
        # A body just under the limit is read (and refused for what it is).
        status, reply = self.client.json("POST", "/v2/models/%s/infer" % MODEL,
                                         b" " * (MAX_BODY - 10))
        self.assertEqual(status, 400, reply)
        # Not HTTP at all.
        self.assertTrue(raw_exchange(self.port, b"\x16\x03\x01hello\r\n\r\n").startswith(
            b"HTTP/1.1 400"))
        self.assertAnswers()

    def test_stalled_clients_do_not_hold_up_others(self):
        # Clients that send half a body, or half a request line, then stop:
        # the one event-loop thread keeps serving everyone else.
        stalled = []
        try:
            for i in range(16):
                s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
                if i % 2:
                    s.sendall(("POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\n"
                               "Content-Length: 100000\r\n\r\n" % MODEL).encode()
                              + b'{"inputs": [{"name": "image", "data": [0.5, 0.5')
                else:
                    s.sendall(b"GET /v2/heal")
                stalled.append(s)
            start = time.monotonic()
            for _ in range(5):
                self.assertAnswers()
            self.assertLess(time.monotonic() - start, 20)
        finally:
            for s in stalled:
                s.close()

    def test_http_can_be_turned_off(self):
        with nc.ServerProcess(self.repo, ["--http-port", "-1", "--model-control-mode", "explicit",
                                          "--load-model", ECHO]) as server:
            self.assertIsNone(server.http_port)
            self.assertTrue(server.stub().ServerLive(nc.pb.ServerLiveRequest(), timeout=10).live)


class HttpSecurityTest(unittest.TestCase):
    """The gRPC port's TLS, client certificates and bearer tokens, on HTTP."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="numaserve_http_tls_")
        cls.repo = os.path.join(cls.dir, "repo")
        nc.write_default_model(cls.repo)
        cls.pki = nc.make_test_pki(os.path.join(cls.dir, "pki"))
        tokens = os.path.join(cls.dir, "tokens")
        with open(tokens, "w") as f:
            f.write("alice %s\n" % TOKEN)
        os.chmod(tokens, 0o600)
        alice_cert, alice_key = cls.pki["client"]["alice"]
        cls.server = nc.ServerProcess(
            cls.repo, ["--grpc-tls-cert", cls.pki["server_cert"],
                       "--grpc-tls-key", cls.pki["server_key"],
                       "--grpc-tls-client-ca", cls.pki["ca"], "--grpc-auth-token-file", tokens],
            credentials=nc.tls_credentials(cls.pki["ca"], alice_cert, alice_key, TOKEN)).start()
        cls.port = cls.server.http_port

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def context(self, client="alice", ca=None):
        context = ssl.create_default_context(cafile=ca or self.pki["ca"])
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT  # the test CA has no keyUsage
        if client:
            cert, key = self.pki["client"][client]
            context.load_cert_chain(cert, key)
        return context

    def test_tokens_are_asked_for_but_health_is_open(self):
        c = Client(self.port, self.context())
        try:
            for path in ("/v2/health/live", "/v2/health/ready"):
                self.assertEqual(c.call("GET", path)[0], 200, path)
            for name, headers, challenge in (
                    ("missing", {}, 'Bearer realm="numaserve"'),
                    ("wrong", {"Authorization": "Bearer " + TOKEN[:-1] + "x"}, "invalid_token"),
                    ("truncated", {"Authorization": "Bearer " + TOKEN[:10]}, "invalid_token"),
                    ("not bearer", {"Authorization": "Basic " + TOKEN}, "invalid_token")):
                for path in ("/v2", "/v2/models/%s" % MODEL, "/v2/nothing/here"):
                    with self.subTest(token=name, path=path):
                        status, response, data = c.call("GET", path, headers=headers)
                        self.assertEqual(status, 401, data)
                        self.assertIn(challenge, response.getheader("WWW-Authenticate"))
                        self.assertIn("error", json.loads(data))
            auth = {"Authorization": "Bearer " + TOKEN}
            self.assertEqual(c.call("GET", "/v2", headers=auth)[0], 200)
            # Two Authorization headers, even with the right token in one, are refused.
            c.conn.putrequest("GET", "/v2")
            c.conn.putheader("Authorization", "Bearer " + TOKEN)
            c.conn.putheader("Authorization", "Bearer " + TOKEN)
            c.conn.endheaders()
            response = c.conn.getresponse()
            response.read()
            self.assertEqual(response.status, 401)
            body, headers = json_request({"image": nc.random_images(2, seed=5)})
            status, reply = c.json("POST", "/v2/models/%s/infer" % MODEL, body,
                                   dict(headers, **auth))
            self.assertEqual(status, 200, reply)
            expected = nc.infer(self.server.stub(), MODEL,
                                {"image": nc.random_images(2, seed=5)})["probabilities"]
            np.testing.assert_array_equal(
                np.array(reply["outputs"][0]["data"], np.float32).reshape(2, 10), expected)
            # Not in explicit mode: load is refused as over gRPC.
            status, reply = c.json("POST", "/v2/repository/models/%s/load" % MODEL, None, auth)
            self.assertEqual(status, 400, reply)
            self.assertIn("--model-control-mode explicit", reply["error"])
        finally:
            c.close()

    def test_tls_and_client_certificates_are_required(self):
        attempts = (("plain HTTP", None), ("no client certificate", self.context(client=None)),
                    ("a certificate of another CA", self.context(client="mallory")),
                    ("a server the client does not trust", self.context(ca=self.pki["other_ca"])))
        for name, context in attempts:
            with self.subTest(attempt=name):
                c = (Client(self.port) if context is None else Client(self.port, context))
                try:
                    with self.assertRaises((ssl.SSLError, ConnectionError, OSError,
                                            http.client.HTTPException)):
                        c.call("GET", "/v2/health/live")
                finally:
                    c.close()
        c = Client(self.port, self.context())
        try:
            self.assertEqual(c.call("GET", "/v2/health/live")[0], 200)
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
