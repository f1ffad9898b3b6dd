#!/usr/bin/python3
"""Several instances of a model per worker (config.pbtxt
instance_placement.instances_per_domain) against the real server on a
2-core worker: two copies, each on its own core, run batches at once and
concurrent callers get correct results; the ModelConfig response counts
the instances; more instances than the worker's cores is a load error that
names the file and field, and leaves the other models serving."""

import os
import sys
import tempfile
import threading
import unittest

import grpc
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

TWO = "two_instances"
ONE = "one_instance"
TOO_MANY = "too_many_instances"
CALLERS = 16
REQUESTS_PER_CALLER = 2
# A batch of 256 rows is about 0.8 GFLOP, a few milliseconds on one core:
# long beside the time a request takes to reach the worker, so batches queue
# there and the second instance starts one while the first computes, even
# when other processes delay every thread's wake-up by a time slice. With 8
# rows (0.2 ms) on a loaded machine the batches arrived and finished one at
# a time, and the two instances were sometimes never busy at once.
WIDTH, LAYERS, ROWS = 256, 24, 256
RTOL, ATOL = 1e-4, 1e-4


def write_config(repo, name, text):
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(text)


class InstancesTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.repo = tempfile.mkdtemp(prefix="numaserve_instances_")
        model = nc.deep_mlp_model(WIDTH, LAYERS)
        path = nc.write_model(cls.repo, TWO, model)
        nc.write_model(cls.repo, ONE, model)
        nc.write_model(cls.repo, TOO_MANY, model)
        cls.reference = nc.ReferenceModel(path)
        # No batching: every request is its own batch, so the callers keep
        # several batches of the model in flight on the one worker.
        write_config(cls.repo, TWO, "instance_placement { instances_per_domain: 2 }\n")
        write_config(cls.repo, ONE, "")
        write_config(cls.repo, TOO_MANY, "instance_placement { instances_per_domain: 3 }\n")
        # One worker on two cores.
        cls.server = nc.ServerProcess(cls.repo, ["--cpuset", "0-1"]).start()
        cls.stub = cls.server.stub()

    @classmethod
    def tearDownClass(cls):
        nc.stop_server_and_remove(cls.server, cls.repo)

    def log(self):
        return "\n--- server stderr (tail) ---\n" + self.server.stderr_text(6000)

    def call_concurrently(self, model):
        inputs = [[np.random.default_rng(1000 * i + j).standard_normal((ROWS, WIDTH))
                   .astype(np.float32) for j in range(REQUESTS_PER_CALLER)]
                  for i in range(CALLERS)]
        results = [[None] * REQUESTS_PER_CALLER for _ in range(CALLERS)]
        start = threading.Barrier(CALLERS)

        def call(i):
            channel = self.server.new_channel()
            stub = nc.pb_grpc.GRPCInferenceServiceStub(channel)
            try:
                start.wait(30)
                # Every request of the caller is sent before any reply is
                # read, so the batches wait in the server however slowly
                # this process gets the CPU back between calls.
                futures = [stub.ModelInfer.future(nc.make_request(model, {"x": x}), timeout=60)
                           for x in inputs[i]]
                for j, future in enumerate(futures):
                    try:
                        results[i][j] = nc.decode_outputs(future.result())["y"]
                    except grpc.RpcError as e:
                        results[i][j] = e
            finally:
                channel.close()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(CALLERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i in range(CALLERS):
            for j in range(REQUESTS_PER_CALLER):
                got = results[i][j]
                self.assertIsInstance(got, np.ndarray,
                                      "caller %d request %d: %r%s" % (i, j, got, self.log()))
                expected = self.reference.run({"x": inputs[i][j]})["y"]
                np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL,
                                           err_msg="caller %d request %d" % (i, j))

    def test_two_instances_each_on_its_own_core(self):
        log = self.server.stderr_text(0)
        self.assertIn("%s:1: instance 1 of 2 on cpus 0 (1 threads)" % TWO, log, self.log())
        self.assertIn("%s:1: instance 2 of 2 on cpus 1 (1 threads)" % TWO, log, self.log())
        self.assertNotIn("%s:1: instance" % ONE, log, self.log())

    def test_concurrent_callers_get_correct_results_from_overlapping_batches(self):
        self.call_concurrently(TWO)
        # Each instance thread logs when a new peak of batches computing at
        # once is reached: two instances, two batches at once.
        self.assertIn("%s:1: 2 batches computing at once" % TWO, self.server.stderr_text(0),
                      self.log())
        self.assertNotIn("%s:1: 3 batches computing at once" % TWO, self.server.stderr_text(0),
                         self.log())

    def test_a_model_with_one_instance_still_serves_beside_them(self):
        self.call_concurrently(ONE)

    def test_model_config_counts_the_instances(self):
        response = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=TWO))
        groups = response.config.instance_group
        self.assertEqual(len(groups), 1, response)
        self.assertEqual(groups[0].count, 2, response)  # one worker x 2 instances
        response = self.stub.ModelConfig(nc.pb.ModelConfigRequest(name=ONE))
        self.assertEqual(response.config.instance_group[0].count, 1, response)

    def test_more_instances_than_cores_is_a_load_error_naming_the_field(self):
        ready = self.stub.ModelReady(nc.pb.ModelReadyRequest(name=TOO_MANY))
        self.assertFalse(ready.ready)
        self.assertIn("model '%s' config.pbtxt: instance_placement.instances_per_domain: "
                      "3 instances need a core each, but worker 0 has 2 cores" % TOO_MANY,
                      self.server.stderr_text(0), self.log())
        with self.assertRaises(grpc.RpcError) as caught:
            nc.infer(self.stub, TOO_MANY, {"x": np.zeros((1, WIDTH), np.float32)})
        self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE,
                         caught.exception.details())
        self.assertIn("instances_per_domain", caught.exception.details())


if __name__ == "__main__":
    unittest.main()
