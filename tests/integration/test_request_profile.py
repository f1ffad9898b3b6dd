#!/usr/bin/python3
"""A served request asks for its own step profile with the request parameter
`profile` (bool true, or the string "true"): the batch it joins runs with
the engine's step timing on for that one run, and the response parameter
`profile` carries the batch's profile as JSON text (one entry per compiled
step, with positive times). A request that did not ask, even in the same
batch, gets no such parameter; a bad value is INVALID_ARGUMENT naming
`profile`.

  x [n,64] -> 3 x (MatMul W -> Add b -> Relu) -> y [n,64]   (three matmul steps)
"""

import json
import os
import sys
import tempfile
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

MODEL = "mlp"
LAYERS = 3
WIDTH = 64


def request(x, profile=None, request_id=""):
    """A ModelInferRequest for MODEL; PROFILE (bool, str or int) sets the
    request parameter `profile` in the field of its type."""
    r = nc.make_request(MODEL, {"x": x}, request_id=request_id)
    if isinstance(profile, bool):
        r.parameters["profile"].bool_param = profile
    elif isinstance(profile, str):
        r.parameters["profile"].string_param = profile
    elif isinstance(profile, int):
        r.parameters["profile"].int64_param = profile
    return r


class RequestProfileTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_request_profile_")
        model = nc.deep_mlp_model(width=WIDTH, layers=LAYERS)
        nc.write_model(cls.repo, MODEL, model)
        with open(os.path.join(cls.repo, MODEL, "config.pbtxt"), "w") as f:
            # A long queue delay, so requests sent together share a batch.
            f.write("max_batch_size: 16\n"
                    "dynamic_batching { max_queue_delay_microseconds: 200000 }\n")
        cls.reference = nc.ReferenceModel(model)
        cls.server = nc.ServerProcess(cls.repo).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def inputs(self, rows, seed):
        return np.random.default_rng(seed).standard_normal((rows, WIDTH)).astype(np.float32)

    def check_outputs(self, response, x):
        y = nc.decode_outputs(response)["y"]
        np.testing.assert_allclose(y, self.reference.run({"x": x})["y"], rtol=1e-4, atol=1e-4)

    def check_profile(self, response, min_batch):
        """The response's `profile` parameter, parsed and checked."""
        self.assertIn("profile", response.parameters, response.parameters)
        parameter = response.parameters["profile"]
        self.assertEqual(parameter.WhichOneof("parameter_choice"), "string_param")
        profile = json.loads(parameter.string_param)
        what = parameter.string_param
        self.assertGreaterEqual(profile["batch"], min_batch, what)
        self.assertLessEqual(profile["batch"], 16, what)
        self.assertEqual(profile["runs"], 1, what)
        self.assertGreater(profile["compute_ms"], 0, what)
        self.assertGreater(profile["step_ms"], 0, what)
        self.assertGreater(profile["wall_ms"], 0, what)
        # The steps ran inside the engine's run, which ran inside the compute time.
        self.assertLessEqual(profile["step_ms"], profile["wall_ms"] * 1.001 + 1e-3, what)
        self.assertLessEqual(profile["wall_ms"], profile["compute_ms"] * 1.001 + 1e-3, what)
        steps = profile["rows"]
        # One entry per compiled step of the plan, in plan order.
        indices = [s["index"] for s in steps if s["kind"] != "reorder"]
        self.assertEqual(indices, list(range(len(indices))), what)
        self.assertEqual(len([s for s in steps if s["kind"] == "matmul"]), LAYERS, what)
        for s in steps:
            for field in ("kind", "step", "layouts", "implementation", "threads", "ms", "share",
                          "gflops", "bytes", "precision", "boundary"):
                self.assertIn(field, s, what)
            self.assertGreater(s["ms"], 0, what)
            self.assertGreaterEqual(s["threads"], 1, what)
            if s["kind"] == "matmul":
                self.assertGreater(s["gflops"], 0, what)
                self.assertGreater(s["bytes"], 0, what)
        self.assertAlmostEqual(sum(s["share"] for s in steps), 1.0, delta=1e-3, msg=what)
        return profile

    def test_a_request_that_asks_gets_its_batchs_profile(self):
        x = self.inputs(3, seed=1)
        response = self.stub.ModelInfer(request(x, profile=True), timeout=60)
        self.check_outputs(response, x)
        self.assertEqual(self.check_profile(response, min_batch=3)["batch"], 3)
        # The string "true" asks too; false (bool or string) and no parameter do not.
        response = self.stub.ModelInfer(request(x, profile="true"), timeout=60)
        self.check_profile(response, min_batch=3)
        for profile in (None, False, "false"):
            response = self.stub.ModelInfer(request(x, profile=profile), timeout=60)
            self.check_outputs(response, x)
            self.assertNotIn("profile", response.parameters, profile)

    def test_only_the_request_that_asked_gets_it_from_a_shared_batch(self):
        count = 6
        xs = [self.inputs(1 + i % 2, seed=10 + i) for i in range(count)]
        shared = False
        # Sent together, the six usually land in one batch; a few tries
        # make sure the profiled batch also held requests that did not ask.
        for attempt in range(5):
            def call(i, stub):
                return stub.ModelInfer(request(xs[i], profile=True if i == 0 else None),
                                       timeout=60)

            responses = nc.call_together(self.server, count, call)
            for i, response in enumerate(responses):
                self.assertIsInstance(response, nc.pb.ModelInferResponse,
                                      "call %d: %r" % (i, response))
                self.check_outputs(response, xs[i])
                if i != 0:
                    self.assertNotIn("profile", response.parameters,
                                     "call %d did not ask: %s" % (i, response.parameters))
            profile = self.check_profile(responses[0], min_batch=xs[0].shape[0])
            if profile["batch"] > xs[0].shape[0]:
                shared = True
                break
        self.assertTrue(shared, "the profiling request never shared a batch in 5 tries")

    def test_stream_requests_ask_the_same_way(self):
        xs = {"p%d" % i: self.inputs(2, seed=30 + i) for i in range(4)}

        def requests():
            for rid, x in xs.items():
                yield request(x, profile=(rid == "p1"), request_id=rid)
            yield request(xs["p0"], profile=7, request_id="bad")

        answers = {}
        for reply in self.stub.ModelStreamInfer(requests(), timeout=60):
            answers[reply.infer_response.id] = reply
        self.assertEqual(set(answers), set(xs) | {"bad"})
        for rid, x in xs.items():
            reply = answers[rid]
            self.assertEqual(reply.error_message, "", rid)
            self.check_outputs(reply.infer_response, x)
            if rid == "p1":
                self.check_profile(reply.infer_response, min_batch=2)
            else:
                self.assertNotIn("profile", reply.infer_response.parameters, rid)
        self.assertIn("INVALID_ARGUMENT", answers["bad"].error_message)
        self.assertIn("'profile'", answers["bad"].error_message)

    def test_a_bad_value_is_invalid_argument_naming_the_parameter(self):
        x = self.inputs(1, seed=3)
        for bad in (5, "yes", "TRUE"):
            with self.assertRaises(grpc.RpcError) as caught:
                self.stub.ModelInfer(request(x, profile=bad), timeout=60)
            error = caught.exception
            self.assertEqual(error.code(), grpc.StatusCode.INVALID_ARGUMENT, error.details())
            self.assertIn("'profile'", error.details())
        # The server still answers.
        self.check_outputs(self.stub.ModelInfer(request(x), timeout=60), x)


if __name__ == "__main__":
    unittest.main()
