#!/usr/bin/python3
"""The benchmark models' outputs on the real numaserve against ONNX Runtime's.

  ctest -R benchmark_models --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve \\
      /usr/bin/python3 tests/models/test_benchmark_outputs.py -v

The models (mlp, resnet50, mobilenetv2, bert_base) come from
benchmarks/models/generate.py, written into $NUMASERVE_BENCHMARK_MODELS_DIR
by the ctest fixture benchmark_models.generate (by hand: generate.py's own
benchmarks/models/out, the default). Each gets its fixed seeded input at
batch 2 (benchmarks/models/output_check.py) in one request to `numaserve
serve`; the output must match ONNX Runtime's for the same model and input,
committed in tests/models/reference/ (made by
benchmarks/peers/make_reference_outputs.py, so neither node nor npm is
needed here), within output_check's bounds on the normalized error and on
the max abs error over the largest |output|.

Before comparing, the model file and the input are checked against the
sha256 the references were made from: a mismatch means generate.py or the
inputs changed, and the references must be made again.

The binary is $NUMASERVE_BIN, else the first numaserve in
build/{server,release,...}/bin, as for the integration tests
(tests/clients/numaserve_client.py).
"""
import json
import os
import sys
import unittest

import numpy as np

SOURCE_DIR = os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "benchmarks", "models"))
import output_check  # noqa: E402

REMAKE = "/usr/bin/python3 benchmarks/peers/make_reference_outputs.py"
MODELS_DIR = os.environ.get("NUMASERVE_BENCHMARK_MODELS_DIR") or os.path.join(
    SOURCE_DIR, "benchmarks", "models", "out")


class BenchmarkOutputsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(output_check.REFERENCE_DIR, "references.json")) as f:
            cls.index = json.load(f)
        cls.paths = {m: os.path.join(MODELS_DIR, m + ".onnx") for m in output_check.MODELS}
        missing = [p for p in cls.paths.values() if not os.path.isfile(p)]
        if missing:
            raise AssertionError("missing %s: the fixture benchmark_models.generate writes them "
                                 "(or benchmarks/models/generate.py --out DIR)" % missing)
        cls.inputs = {m: output_check.model_input(m, cls.index["batch"])
                      for m in output_check.MODELS}
        cls.outputs = output_check.numaserve_outputs(os.environ.get("NUMASERVE_BIN"),
                                                     cls.paths, cls.inputs)

    def reference(self, model):
        return np.load(os.path.join(output_check.REFERENCE_DIR, model + ".npy"))

    def check(self, model):
        made_from = self.index["models"][model]
        self.assertEqual(
            output_check.sha256_of_file(self.paths[model]), made_from["model_sha256"],
            "%s: %s is not the model tests/models/reference/%s.npy was made from (did "
            "generate.py change?); run %s and commit its output"
            % (model, self.paths[model], model, REMAKE))
        self.assertEqual(
            output_check.sha256_of_array(self.inputs[model]), made_from["input_sha256"],
            "%s: the seeded input differs from the one the reference was made from (did "
            "output_check.py or NumPy's generator change?); run %s" % (model, REMAKE))
        want = self.reference(model)
        got = self.outputs[model]
        self.assertEqual(got.shape, want.shape, "%s: output shape" % model)
        e = output_check.errors(got, want)
        found = output_check.problems(e)
        if found:
            self.fail("%s at batch %d: numaserve's %s vs ONNX Runtime's: %s"
                      % (model, len(want), made_from["output"], "; ".join(found)))
        print("%s: max abs error %.3g (max |output| %.4g, max_rel %.2e), nmse %.2e"
              % (model, e["max_abs"], e["max_ref"], e["max_rel"], e["nmse"]), file=sys.stderr)

    def test_mlp(self):
        self.check("mlp")

    def test_resnet50(self):
        self.check("resnet50")

    def test_mobilenetv2(self):
        self.check("mobilenetv2")

    def test_bert_base(self):
        self.check("bert_base")

    def test_bounds_tell_the_rows_apart(self):
        # The bounds are strict enough to catch a batch answered in the
        # wrong order: with the rows swapped, every reference breaks them
        # (ResNet-50's rows, the closest, by 2.3e-4 nmse).
        for model in output_check.MODELS:
            want = self.reference(model)
            swapped = output_check.errors(want[::-1], want)
            self.assertTrue(output_check.problems(swapped),
                            "%s: its two reference rows are within the bounds of each other"
                            % model)


if __name__ == "__main__":
    unittest.main()
