#!/usr/bin/python3
"""Per-model precision (config.pbtxt `precision`, `bench --precision`):
the trained Fashion-MNIST MLP served with precision "bf16" answers close to
the same model in FP32 (where the CPU has native BF16; elsewhere the model
is not ready and says why), and reports its precision in ModelConfig; an
unknown precision leaves its model not ready with the file and field named;
a server whose workers are capped to AVX2 (NUMASERVE_MAX_ISA=avx2, as an
AVX2-only EPYC) refuses the BF16 model at load with the reason while its
FP32 model serves; `bench` refuses an unknown precision."""

import gzip
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402

TRAINED = os.path.join(nc.SOURCE_DIR, "models", "fashion_classifier.trained.onnx")
TEST_IMAGES = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
TIMEOUT_S = 120
READY_TIMEOUT_S = 60


def run(args, env=None):
    return nc.run_numaserve(args, env=env, timeout=TIMEOUT_S)


describe = nc.describe_run


def images(count):
    """The first COUNT Fashion-MNIST test images scaled to [0, 1] as in
    training, or random images where the dataset is not installed."""
    if not os.path.isfile(TEST_IMAGES):
        return nc.random_images(count, seed=3)
    with gzip.open(TEST_IMAGES, "rb") as f:
        data = f.read(16 + count * 784)
    pixels = np.frombuffer(data[16:], dtype=np.uint8).astype(np.float32) / 255.0
    return pixels.reshape(count, 1, 28, 28)


def install(repo, name, config=None):
    os.makedirs(os.path.join(repo, name, "1"))
    shutil.copyfile(TRAINED, os.path.join(repo, name, "1", "model.onnx"))
    if config is not None:
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(config)


def index(stub):
    return nc.repository_index(stub, by_version=False)


def ready(stub, name):
    return stub.ModelReady(nc.pb.ModelReadyRequest(name=name), timeout=10).ready


def settled(stub, names):
    """Waits until every model in NAMES is ready or unavailable; the index."""
    state = {}

    def done():
        state.update(index(stub))
        return all(name in state and state[name][0] in ("READY", "UNAVAILABLE")
                   for name in names)

    nc.wait_until(done, READY_TIMEOUT_S)
    return state


class PrecisionTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_precision_")
        # Whether BF16 is native here: bench says so, or refuses with the reason.
        args = ("bench", "--model", TRAINED, "--precision", "bf16", "--batch", "1",
                "--seconds", "0.01")
        result = run(args)
        cls.bf16_refusal = None
        if result.returncode != 0:
            if "precision bf16 is not available on this CPU" not in result.stderr:
                raise AssertionError(describe(args, result))
            cls.bf16_refusal = result.stderr.strip()

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_bench_refuses_an_unknown_precision(self):
        args = ("bench", "--model", TRAINED, "--precision", "fp16")
        result = run(args)
        self.assertEqual(result.returncode, 2, describe(args, result))
        self.assertIn("numaserve bench: --precision: precision 'fp16' is not one of fp32, bf16",
                      result.stderr, describe(args, result))

    def test_bench_under_the_avx2_cap_refuses_bf16_with_the_reason(self):
        args = ("bench", "--model", TRAINED, "--precision", "bf16", "--batch", "1",
                "--seconds", "0.01")
        result = run(args, env=dict(os.environ, NUMASERVE_MAX_ISA="avx2"))
        self.assertEqual(result.returncode, 1, describe(args, result))
        self.assertIn("precision bf16 is not available on this CPU", result.stderr,
                      describe(args, result))
        self.assertRegex(result.stderr, r"--max-isa=avx2 \(NUMASERVE_MAX_ISA\)|neither AVX512_BF16",
                         describe(args, result))

    def test_bf16_model_serves_close_to_fp32_and_a_bad_precision_is_not_ready(self):
        repo = os.path.join(self.tmp, "served")
        install(repo, "fp32")
        install(repo, "bf16", 'precision: "bf16"\nmax_batch_size: 16\n'
                'dynamic_batching { max_queue_delay_microseconds: 100 }\n')
        install(repo, "bad_precision", 'precision: "fp16"\n')
        server = nc.ServerProcess(repo).start()
        try:
            stub = server.stub()
            state = settled(stub, ["fp32", "bf16", "bad_precision"])
            log = server.stderr_text()
            # The bad value: not ready, the file and the field named.
            self.assertFalse(ready(stub, "bad_precision"))
            s, reason = state["bad_precision"]
            self.assertEqual(s, "UNAVAILABLE", log)
            self.assertIn("config.pbtxt: precision: 'fp16' is not one of fp32, bf16", reason)
            self.assertTrue(ready(stub, "fp32"), state)
            if self.bf16_refusal:
                self.assertFalse(ready(stub, "bf16"))
                self.assertIn("precision bf16 is not available on this CPU", state["bf16"][1])
                self.skipTest("no native BF16 here: " + self.bf16_refusal)
            self.assertTrue(ready(stub, "bf16"), "%r\n%s" % (state, log))
            self.assertRegex(log, r"worker \d+: bf16:1: precision bf16 \((avx512|amx)_bf16\)",
                             log)
            config = stub.ModelConfig(nc.pb.ModelConfigRequest(name="bf16"), timeout=10).config
            self.assertEqual(config.parameters["precision"].string_value, "bf16")
            config = stub.ModelConfig(nc.pb.ModelConfigRequest(name="fp32"), timeout=10).config
            self.assertEqual(config.parameters["precision"].string_value, "fp32")
            x = images(64)
            for batch in (1, 5, 16):
                got = nc.infer(stub, "bf16", {"image": x[:batch]})["probabilities"]
                want = nc.infer(stub, "fp32", {"image": x[:batch]})["probabilities"]
                # Probabilities within BF16's error, and the same classes.
                self.assertLess(np.abs(got - want).max(), 2e-2,
                                "batch %d: max diff %g" % (batch, np.abs(got - want).max()))
                self.assertGreater(np.abs(got - want).max(), 0.0,
                                   "batch %d: bit-equal to FP32: BF16 did not run" % batch)
                agree = (got.argmax(axis=1) == want.argmax(axis=1)).mean()
                self.assertGreaterEqual(agree, 0.9, "batch %d: %.2f agree" % (batch, agree))
        finally:
            nc.stop_server_and_remove(server, repo)

    def test_a_worker_capped_to_avx2_refuses_the_bf16_model_with_the_reason(self):
        repo = os.path.join(self.tmp, "capped")
        install(repo, "fp32")
        install(repo, "bf16", 'precision: "bf16"\n')
        server = nc.ServerProcess(repo, env=dict(os.environ, NUMASERVE_MAX_ISA="avx2")).start()
        try:
            stub = server.stub()
            state = settled(stub, ["fp32", "bf16"])
            log = server.stderr_text()
            self.assertTrue(ready(stub, "fp32"), "%r\n%s" % (state, log))
            self.assertFalse(ready(stub, "bf16"))
            s, reason = state["bf16"]
            self.assertEqual(s, "UNAVAILABLE", "%r\n%s" % (state, log))
            self.assertIn("precision bf16 is not available on this CPU", reason)
            self.assertRegex(reason, r"--max-isa=avx2 \(NUMASERVE_MAX_ISA\)|neither AVX512_BF16",
                             reason)
            # The FP32 model answers; a request for the refused one says why.
            got = nc.infer(stub, "fp32", {"image": images(2)})["probabilities"]
            self.assertEqual(got.shape, (2, 10))
            with self.assertRaises(nc.grpc.RpcError) as raised:
                nc.infer(stub, "bf16", {"image": images(1)})
            self.assertIn("not available on this CPU", raised.exception.details())
        finally:
            nc.stop_server_and_remove(server, repo)


if __name__ == "__main__":
    unittest.main()
