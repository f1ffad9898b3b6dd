#!/usr/bin/python3
"""A model in opset 18's forms on the real numaserve against ONNX Runtime.

  ctest -R models.opset18 --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve /usr/bin/python3 tests/models/test_opset18.py -v

tests/models/reference/opset18.onnx (made by make_opset18_reference.py)
holds Split by num_outputs into unequal parts, Pad with its axes input,
ReduceMean and ReduceSum with axes as an input and LayerNormalization
after a Conv, with a dynamic batch. It goes into a repository, is served,
and its output for the committed input (batch 3, then its first row
alone) must match ONNX Runtime's (opset18_output.npy, ONNX Runtime from
PyPI, requirements/peers.txt) within output_check's bounds.
"""
import hashlib
import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import onnx

SOURCE_DIR = os.environ.get("NUMASERVE_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "benchmarks", "models"))
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
import output_check  # noqa: E402
import numaserve_client as nc  # noqa: E402

REFERENCE = os.path.join(SOURCE_DIR, "tests", "models", "reference")
REMAKE = ("make venv-peers && /usr/bin/python3 tests/models/make_opset18_reference.py "
          "--ort-python build/release/venv/peers/bin/python")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Opset18Test(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model_path = os.path.join(REFERENCE, "opset18.onnx")
        with open(os.path.join(REFERENCE, "opset18.json")) as f:
            cls.index = json.load(f)
        cls.x = np.load(os.path.join(REFERENCE, "opset18_input.npy"))
        cls.want = np.load(os.path.join(REFERENCE, "opset18_output.npy"))

    def test_the_files_are_what_the_reference_was_made_from(self):
        for key, name in (("model_sha256", "opset18.onnx"), ("input_sha256", "opset18_input.npy"),
                          ("output_sha256", "opset18_output.npy")):
            self.assertEqual(sha256(os.path.join(REFERENCE, name)), self.index[key],
                             "%s changed; run %s" % (name, REMAKE))

    def test_the_model_uses_opset_18_forms(self):
        model = onnx.load(self.model_path)
        opset = {o.domain: o.version for o in model.opset_import}
        self.assertGreaterEqual(opset.get("", opset.get("ai.onnx", 0)), 18)
        nodes = {n.op_type: n for n in model.graph.node}
        self.assertIn("num_outputs", [a.name for a in nodes["Split"].attribute])
        self.assertEqual(len(nodes["Split"].input), 1, "Split's sizes come from num_outputs")
        self.assertEqual(len(nodes["Pad"].input), 4, "Pad's axes input")
        self.assertEqual(len(nodes["ReduceMean"].input), 2, "ReduceMean's axes as an input")

    def test_served_output_matches_onnx_runtime(self):
        repo = tempfile.mkdtemp(prefix="numaserve_opset18_")
        try:
            os.makedirs(os.path.join(repo, "opset18", "1"))
            shutil.copy(self.model_path, os.path.join(repo, "opset18", "1", "model.onnx"))
            with nc.ServerProcess(repo, ["--max-workers", "1"]) as server:
                stub = server.stub()
                got = nc.infer(stub, "opset18", {"x": self.x}, deadline=120.0)["y"]
                one = nc.infer(stub, "opset18", {"x": self.x[:1]}, deadline=120.0)["y"]
        finally:
            shutil.rmtree(repo, ignore_errors=True)
        self.assertEqual(got.shape, self.want.shape)
        for name, g, w in (("batch 3", got, self.want), ("row 0 alone", one, self.want[:1])):
            e = output_check.errors(g, w)
            print("opset18 %s: max abs error %.3g (max |output| %.4g, max_rel %.3g), nmse %.3g"
                  % (name, e["max_abs"], e["max_ref"], e["max_rel"], e["nmse"]))
            self.assertEqual(output_check.problems(e), [], name)


if __name__ == "__main__":
    unittest.main()
