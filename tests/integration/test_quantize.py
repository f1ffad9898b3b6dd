#!/usr/bin/python3
"""`numaserve quantize`: the trained Fashion-MNIST MLP quantized to INT8
(QDQ) on training images read from an IDX file, a .npy file and a
numaserve record file; the quantized model served beside its FP32 original
answers the same classes (and keeps the test accuracy within 0.5 point on
the images sent, calibrated by min-max and by entropy), also from a worker
capped to AVX2 (an AVX2-only EPYC: no VNNI, so the QDQ matmuls run FP32 on
their dequantized weights, and the worker's log says so); and the
command's errors name the file and the option."""

import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients"))
import numaserve_client as nc  # noqa: E402
import prerequisites  # noqa: E402

TRAINED = os.path.join(nc.SOURCE_DIR, "models", "fashion_classifier.trained.onnx")
DATA = "/usr/share/datasets/fashion-mnist"
TRAIN_IMAGES = os.path.join(DATA, "train-images-idx3-ubyte.gz")
TEST_IMAGES = os.path.join(DATA, "t10k-images-idx3-ubyte.gz")
TEST_LABELS = os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")
TIMEOUT_S = 300
READY_TIMEOUT_S = 60


def cpu_has_vnni():
    """Whether this CPU has VNNI (AVX512_VNNI or AVX-VNNI), where the INT8
    kernels run by default."""
    with open("/proc/cpuinfo") as f:
        flags = set(f.read().split())
    return bool(flags & {"avx512_vnni", "avx_vnni"})


def run(args, env=None):
    return nc.run_numaserve(args, env=env, timeout=TIMEOUT_S)


describe = nc.describe_run


def idx(path, count, header):
    with gzip.open(path, "rb") as f:
        data = f.read(header + count * (784 if header == 16 else 1))
    return np.frombuffer(data[header:], dtype=np.uint8)


def have_data():
    return all(os.path.isfile(p) for p in (TRAIN_IMAGES, TEST_IMAGES, TEST_LABELS))


class QuantizeTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="numaserve_quantize_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def quantize(self, calibration, out, *extra):
        args = ("quantize", "--model", TRAINED, "--calibration", calibration, "--out", out,
                "--calibration-size", "256") + extra
        result = run(args)
        self.assertEqual(result.returncode, 0, describe(args, result))
        self.assertIn("quantized 3 nodes to INT8: fc1 (Gemm) fc2 (MatMul) fc3 (Gemm)",
                      result.stdout, describe(args, result))
        self.assertIn("calibrated on 256 rows", result.stdout, describe(args, result))
        self.assertRegex(result.stdout, r"same argmax in \d+ of 32 rows", describe(args, result))
        self.assertTrue(os.path.isfile(out))
        return result

    def test_quantized_model_serves_the_same_classes_as_fp32(self):
        if not have_data():
            prerequisites.missing(self, "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")
        out = os.path.join(self.tmp, "mlp_int8.onnx")
        self.quantize(TRAIN_IMAGES, out)
        entropy = os.path.join(self.tmp, "mlp_int8_entropy.onnx")
        result = self.quantize(TRAIN_IMAGES, entropy, "--method", "entropy")
        self.assertIn("calibrated on 256 rows (entropy)", result.stdout)
        repo = os.path.join(self.tmp, "repo")
        for name, path in (("fp32", TRAINED), ("int8", out), ("int8_entropy", entropy)):
            os.makedirs(os.path.join(repo, name, "1"))
            shutil.copyfile(path, os.path.join(repo, name, "1", "model.onnx"))
        count = 1000
        x = (idx(TEST_IMAGES, count, 16).astype(np.float32) / 255.0).reshape(count, 1, 28, 28)
        labels = idx(TEST_LABELS, count, 8)
        for env in (None, dict(os.environ, NUMASERVE_MAX_ISA="avx2")):
            tier = "native" if env is None else "AVX2 cap"
            server = nc.ServerProcess(repo, env=env).start()
            try:
                stub = server.stub()
                nc.wait_until(lambda: all(
                    stub.ModelReady(nc.pb.ModelReadyRequest(name=n), timeout=10).ready
                    for n in ("fp32", "int8", "int8_entropy")), READY_TIMEOUT_S)

                def classify(name):
                    return np.concatenate([nc.infer(stub, name, {"image": x[i:i + 100]})
                                           ["probabilities"] for i in range(0, count, 100)])
                want = classify("fp32")
                got = {name: classify(name) for name in ("int8", "int8_entropy")}
                log = server.stderr_text()
            finally:
                nc.stop_server_and_remove(server, os.path.join(self.tmp, "no-such-dir"))
            fp32_acc = (want.argmax(1) == labels).mean() * 100
            self.assertGreater(fp32_acc, 85.0, tier)
            for name, probabilities in got.items():
                what = "%s, %s" % (tier, name)
                self.assertEqual(probabilities.shape, (count, 10), what)
                diff = np.abs(probabilities - want).max()
                self.assertGreater(diff, 0.0, "%s: bit-equal to FP32: INT8 did not run" % what)
                self.assertLess(diff, 0.1, "%s: largest probability difference %g" % (what, diff))
                int8_acc = (probabilities.argmax(1) == labels).mean() * 100
                print("%s: FP32 %.2f%%, INT8 %.2f%% on %d test images" %
                      (what, fp32_acc, int8_acc, count))
                self.assertLessEqual(abs(int8_acc - fp32_acc), 0.5,
                                     "%s: FP32 %.2f%%, INT8 %.2f%%" % (what, fp32_acc, int8_acc))
            self.assertNotIn("ref:", log, tier)
            off = env is not None or not cpu_has_vnni()
            for name in ("int8", "int8_entropy"):
                line = "%s:1: INT8 kernels off (no VNNI on this CPU" % name
                self.assertEqual(line in log, off, "%s: %r in the log: %s" % (tier, line, log[-3000:]))
            self.assertNotIn("fp32:1: INT8 kernels off", log, tier)
        shutil.rmtree(repo, ignore_errors=True)

    def test_npy_and_record_calibration_give_the_same_model_as_idx(self):
        if not have_data():
            prerequisites.missing(self, "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)")
        pixels = idx(TRAIN_IMAGES, 256, 16)
        npy = os.path.join(self.tmp, "calibration.npy")
        np.save(npy, (pixels.astype(np.float32) / 255.0).reshape(256, 1, 28, 28))
        from_idx = os.path.join(self.tmp, "from_idx.onnx")
        from_npy = os.path.join(self.tmp, "from_npy.onnx")
        self.quantize(TRAIN_IMAGES, from_idx)
        self.quantize(npy, from_npy)
        # The record file of the same images (the converter training uses).
        records = os.path.join(self.tmp, "train.rec")
        tool = os.path.join(os.path.dirname(nc.default_binary()), "numaserve-dataset")
        args = [tool, "--idx", TRAIN_IMAGES, os.path.join(DATA, "train-labels-idx1-ubyte.gz"),
                "--out", records]
        converter = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, timeout=TIMEOUT_S)
        self.assertEqual(converter.returncode, 0, "%s\n%s" % (" ".join(args), converter.stdout))
        from_rec = os.path.join(self.tmp, "from_rec.onnx")
        self.quantize(records, from_rec)
        with open(from_idx, "rb") as a, open(from_npy, "rb") as b, open(from_rec, "rb") as c:
            first = a.read()
            self.assertEqual(first, b.read(), "the .npy calibration gave another model")
            self.assertEqual(first, c.read(), "the record file calibration gave another model")

    def test_percentile_calibration_is_accepted(self):
        npy = os.path.join(self.tmp, "random.npy")
        np.save(npy, np.random.default_rng(5).random((64, 1, 28, 28), dtype=np.float32))
        out = os.path.join(self.tmp, "pct.onnx")
        args = ("quantize", "--model", TRAINED, "--calibration", npy, "--out", out,
                "--method", "percentile", "--percentile", "99.9")
        result = run(args)
        self.assertEqual(result.returncode, 0, describe(args, result))
        self.assertIn("calibrated on 64 rows (percentile 99.9)", result.stdout)

    def test_errors_name_the_file_and_the_option(self):
        out = os.path.join(self.tmp, "never.onnx")
        bad_rows = os.path.join(self.tmp, "bad_rows.npy")
        np.save(bad_rows, np.zeros((4, 100), dtype=np.float32))
        text = os.path.join(self.tmp, "notes.txt")
        with open(text, "w") as f:
            f.write("not calibration data\n")
        cases = [
            (("--model", TRAINED, "--out", out), "--calibration FILE is required"),
            (("--model", TRAINED, "--calibration", bad_rows, "--out", out),
             bad_rows + ": a row holds 100 values, a row of the model input 784"),
            (("--model", TRAINED, "--calibration", text, "--out", out),
             text + ": not a calibration file"),
            (("--model", TRAINED, "--calibration", "/nonexistent.npy", "--out", out),
             "/nonexistent.npy: cannot open"),
            (("--model", TRAINED, "--calibration", "pixels=" + bad_rows, "--out", out),
             "no input 'pixels'"),
            (("--model", TRAINED, "--calibration", bad_rows, "--out", out, "--method", "kl"),
             "--method: unknown calibration method 'kl' (expected minmax, percentile or entropy)"),
            (("--model", TRAINED, "--calibration", bad_rows, "--out", TRAINED),
             "--out names the input model"),
        ]
        for args, message in cases:
            result = run(("quantize",) + args)
            self.assertNotEqual(result.returncode, 0, describe(args, result))
            self.assertIn("numaserve quantize: ", result.stderr, describe(args, result))
            self.assertIn(message, result.stderr, describe(args, result))
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
