#!/usr/bin/python3
"""The request parameters clients send (KServe v2, as Triton's clients
send them), over gRPC and HTTP/REST, on a real server:

  * `priority`: a high-priority request overtakes low-priority ones queued
    before it (Triton's 1 is the highest); a priority above the model's
    dynamic_batching.priority_levels is refused, naming it;
  * `timeout` (microseconds): a request still queued when it passes is
    answered DEADLINE_EXCEEDED (HTTP 504) and never computed; the request's
    own timeout replaces the model's default_timeout_microseconds;
  * `sequence_id` / `sequence_start` / `sequence_end`, unknown request
    parameters and input or output parameters: refused, never ignored;
  * RepositoryModelLoad's `config` (tritonclient's load_model(config=...)),
    over gRPC and HTTP: the JSON config replaces config.pbtxt for that load,
    a bad one is refused naming the field, `file:` overrides are refused.

One worker with one instance per model and `--test-batch-compute-us`:
every batch takes a fixed BATCH_MS, so who waits behind whom is known.
Models: `x FP32 [batch, 4] -> Add(x, b) -> y`, one row per batch.
"""

import http.client
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

BATCH_MS = 150
WIDTH = 4
PRIO = "prio"          # priority_levels 2, default 2
SHORT = "short"        # default_timeout_microseconds 60 ms
OVERRIDE = "override"  # reloaded with config overrides

CONFIGS = {
    PRIO: "max_batch_size: 1\n"
          "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n"
          "instance_placement { instances_per_domain: 1 }\n",
    SHORT: "max_batch_size: 1\n"
           "dynamic_batching { default_timeout_microseconds: 60000 }\n"
           "instance_placement { instances_per_domain: 1 }\n",
    OVERRIDE: "max_batch_size: 4\n",
}


def add_model(seed):
    from onnx import TensorProto, helper, numpy_helper

    bias = np.random.default_rng(seed).standard_normal(WIDTH).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTH])],
        initializer=[numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve-tests")
    model.ir_version = 8
    return model, bias


def row(value):
    return np.full((1, WIDTH), value, dtype=np.float32)


def request(model, value, **parameters):
    r = nc.make_request(model, {"x": row(value)})
    for name, v in parameters.items():
        if isinstance(v, bool):
            r.parameters[name].bool_param = v
        elif isinstance(v, str):
            r.parameters[name].string_param = v
        else:
            r.parameters[name].int64_param = v
    return r


class RequestParametersTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_request_parameters_")
        cls.bias = {}
        for seed, (name, config) in enumerate(CONFIGS.items()):
            model, cls.bias[name] = add_model(seed)
            nc.write_model(cls.repo, name, model)
            with open(os.path.join(cls.repo, name, "config.pbtxt"), "w") as f:
                f.write(config)
        cls.server = nc.ServerProcess(
            cls.repo, ["--max-workers", "1", "--test-batch-compute-us", str(BATCH_MS * 1000),
                       "--model-control-mode", "explicit",
                       "--load-model", ",".join(CONFIGS)]).start()
        cls.stub = cls.server.stub()
        for name in CONFIGS:
            nc.wait_until(lambda n=name: cls.stub.ModelReady(
                nc.pb.ModelReadyRequest(name=n)).ready, 60)

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(4000)

    def http(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.http_port, timeout=30)
        try:
            payload = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=payload,
                         headers={"Content-Type": "application/json"} if payload else {})
            response = conn.getresponse()
            data = response.read()
            return response.status, (json.loads(data) if data else None)
        finally:
            conn.close()

    def http_infer(self, model, value, parameters):
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, WIDTH],
                            "data": row(value).ravel().tolist()}],
                "parameters": parameters}
        return self.http("POST", "/v2/models/%s/infer" % model, body)

    def assert_invalid(self, r, *mentions):
        with self.assertRaises(grpc.RpcError) as caught:
            self.stub.ModelInfer(r, timeout=30)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         caught.exception.details())
        for m in mentions:
            self.assertIn(m, caught.exception.details())

    def send(self, model, value, done, **parameters):
        """Sends asynchronously; DONE receives (value, status code name) in
        the order answers arrive."""
        lock = threading.Lock()

        def answered(future):
            try:
                y = nc.decode_outputs(future.result())["y"]
                ok = np.allclose(y, row(value) + self.bias[model], atol=1e-6)
                outcome = "OK" if ok else "WRONG"
            except grpc.RpcError as e:
                outcome = e.code().name
            with lock:
                done.append((value, outcome))

        future = self.stub.ModelInfer.future(request(model, value, **parameters), timeout=60)
        future.add_done_callback(answered)
        return future

    def test_high_priority_overtakes_queued_low_priority_requests(self):
        done = []
        # The blocker computes; the first low one waits in the worker's
        # pipeline; the other low ones queue; then the high one comes.
        futures = [self.send(PRIO, 0, done)]
        time.sleep(0.03)
        for value in (1, 2, 3, 4):
            futures.append(self.send(PRIO, value, done, priority=2))
            time.sleep(0.01)
        time.sleep(0.02)
        futures.append(self.send(PRIO, 100, done, priority=1))
        for f in futures:
            f.exception(timeout=60)
        nc.wait_until(lambda: len(done) == len(futures), 10)
        self.assertTrue(all(outcome == "OK" for _, outcome in done), done)
        order = [value for value, _ in done]
        # Low requests 2, 3 and 4 were queued when the high one came: it
        # goes before them (without priorities it would come last).
        self.assertLess(order.index(100), order.index(2), order)
        self.assertEqual(order[-3:], [2, 3, 4], order)

    def test_priority_out_of_range_or_not_an_integer_is_refused(self):
        self.assert_invalid(request(PRIO, 1, priority=3), "'priority' is 3",
                            "2 priority levels")
        self.assert_invalid(request(SHORT, 1, priority=2), "'priority' is 2",
                            "1 priority level")
        self.assert_invalid(request(PRIO, 1, priority="high"), "'priority' must be an integer")
        status, reply = self.http_infer(PRIO, 1, {"priority": 3})
        self.assertEqual(status, 400, reply)
        self.assertIn("'priority' is 3", reply["error"])
        # In range, over both protocols.
        self.stub.ModelInfer(request(PRIO, 1, priority=1), timeout=30)
        self.assertEqual(self.http_infer(PRIO, 1, {"priority": 1})[0], 200)

    def test_timeout_expires_queued_requests_and_replaces_the_models_default(self):
        done = []
        # Two blockers: one computes, one waits in the worker's pipeline;
        # what follows waits in the queue for at least BATCH_MS.
        futures = [self.send(PRIO, 0, done), self.send(PRIO, 1, done)]
        time.sleep(0.03)
        futures.append(self.send(PRIO, 2, done, timeout=30000))  # 30 ms
        futures.append(self.send(PRIO, 3, done, timeout=30000000))  # 30 s
        status, reply = self.http_infer(PRIO, 4, {"timeout": 30000})
        self.assertEqual(status, 504, reply)
        self.assertIn("deadline", reply["error"])
        for f in futures:
            f.exception(timeout=60)
        nc.wait_until(lambda: len(done) == len(futures), 10)
        self.assertEqual(dict(done), {0: "OK", 1: "OK", 2: "DEADLINE_EXCEEDED", 3: "OK"})
        # SHORT's default_timeout is 60 ms: a request queued behind two
        # batches expires unless its own timeout is longer.
        done = []
        futures = [self.send(SHORT, 0, done), self.send(SHORT, 1, done)]
        time.sleep(0.03)
        futures.append(self.send(SHORT, 2, done))
        futures.append(self.send(SHORT, 3, done, timeout=30000000))
        for f in futures:
            f.exception(timeout=60)
        nc.wait_until(lambda: len(done) == len(futures), 10)
        self.assertEqual(dict(done), {0: "OK", 1: "OK", 2: "DEADLINE_EXCEEDED", 3: "OK"})

    def test_timeout_must_be_a_non_negative_integer_within_a_day(self):
        self.assert_invalid(request(PRIO, 1, timeout=-5), "'timeout' is -5")
        self.assert_invalid(request(PRIO, 1, timeout=86400000001), "above the limit")
        self.assert_invalid(request(PRIO, 1, timeout="soon"), "'timeout' must be an integer")

    def test_sequences_unknown_and_tensor_parameters_are_refused(self):
        for name in ("sequence_id", "sequence_start", "sequence_end"):
            self.assert_invalid(request(PRIO, 1, **{name: 1}),
                                "sequence batching is not supported", name)
            status, reply = self.http_infer(PRIO, 1, {name: 7})
            self.assertEqual(status, 400, reply)
            self.assertIn("sequence batching is not supported", reply["error"])
        self.assert_invalid(request(PRIO, 1, prioirty=1), "unknown request parameter 'prioirty'")
        status, reply = self.http_infer(PRIO, 1, {"custom": "x"})
        self.assertEqual(status, 400, reply)
        self.assertIn("unknown request parameter 'custom'", reply["error"])
        r = request(PRIO, 1)
        r.inputs[0].parameters["shared_memory_region"].string_param = "region"
        self.assert_invalid(r, "shared-memory extension is not supported")
        r = request(PRIO, 1)
        r.outputs.add(name="y").parameters["classification"].int64_param = 2
        self.assert_invalid(r, "classification extension is not supported")

    def load(self, config=None, **extra):
        r = nc.pb.RepositoryModelLoadRequest(model_name=OVERRIDE)
        if config is not None:
            r.parameters["config"].string_param = (config if isinstance(config, str)
                                                   else json.dumps(config))
        for key, value in extra.items():
            r.parameters[key].string_param = value
        return self.stub.RepositoryModelLoad(r, timeout=120)

    def config(self):
        return self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=OVERRIDE), timeout=30).config

    def assert_load_invalid(self, *mentions, **kwargs):
        with self.assertRaises(grpc.RpcError) as caught:
            self.load(**kwargs)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT,
                         caught.exception.details())
        for m in mentions:
            self.assertIn(m, caught.exception.details())

    def test_load_with_a_config_override(self):
        try:
            # Triton's schema, as tritonclient's load_model(config=...) sends it.
            self.load({"name": OVERRIDE, "platform": "onnxruntime_onnx", "max_batch_size": 2,
                       "instance_group": [{"kind": "KIND_CPU", "count": 1}],
                       "dynamic_batching": {"priority_levels": 3,
                                            "default_priority_level": 3}})
            c = self.config()
            self.assertEqual(c.max_batch_size, 2)
            self.assertEqual(c.dynamic_batching.priority_levels, 3)
            self.assertEqual(c.dynamic_batching.default_priority_level, 3)
            self.stub.ModelInfer(request(OVERRIDE, 1, priority=3), timeout=30)
            # Refused, naming the field; what serves stays as it was.
            self.assert_load_invalid("max_batch_size", config={"max_batch_size": "two"})
            self.assert_load_invalid("no_such_field", config={"no_such_field": 1})
            self.assert_load_invalid("default_priority_level", config={
                "max_batch_size": 2,
                "dynamic_batching": {"priority_levels": 2, "default_priority_level": 5}})
            self.assert_load_invalid("above the limit", config=" " * (1 << 20) + "{}")
            self.assert_load_invalid("'file:...'", config=None, **{"file:1/model.onnx": "AA=="})
            self.assert_load_invalid("unknown load parameter 'colour'", colour="red")
            self.assertEqual(self.config().max_batch_size, 2)
            # Over HTTP: the same parameter in the load body.
            status, reply = self.http(
                "POST", "/v2/repository/models/%s/load" % OVERRIDE,
                {"parameters": {"config": json.dumps({"max_batch_size": 3})}})
            self.assertEqual(status, 200, reply)
            self.assertEqual(self.config().max_batch_size, 3)
            self.assertEqual(self.config().dynamic_batching.priority_levels, 0)
            status, reply = self.http(
                "POST", "/v2/repository/models/%s/load" % OVERRIDE,
                {"parameters": {"config": json.dumps({"max_batch_size": "x"})}})
            self.assertEqual(status, 400, reply)
            self.assertIn("max_batch_size", reply["error"])
            status, reply = self.http("POST", "/v2/repository/models/%s/load" % OVERRIDE,
                                      {"parameters": {"config": 5}})
            self.assertEqual(status, 400, reply)
            self.assertIn("'config' must be a string", reply["error"])
        finally:
            # Without a config, config.pbtxt again.
            self.load()
        self.assertEqual(self.config().max_batch_size, 4, self.log())


if __name__ == "__main__":
    unittest.main()
