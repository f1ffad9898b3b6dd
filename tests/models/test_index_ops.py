#!/usr/bin/python3
"""The index ops on the real numaserve against ONNX Runtime.

  ctest -R models.index_ops --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve /usr/bin/python3 tests/models/test_index_ops.py -v

tests/models/reference/index_ops_opset18.onnx and index_ops_opset21.onnx
(made by make_index_ops_reference.py) hold ArgMax, ArgMin, CumSum, Trilu,
GatherElements, ScatterElements, GatherND, ScatterND, Mod, Where, TopK,
OneHot, Range (folded at load) and Einsum. Each
goes into a repository, is served, and its outputs for the committed inputs
must match ONNX Runtime's (ONNX Runtime from PyPI, requirements/peers.txt):
integer outputs exactly, FP32 ones within a relative error of 1e-5.
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
sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "clients"))
import numaserve_client as nc  # noqa: E402

REFERENCE = os.path.join(SOURCE_DIR, "tests", "models", "reference")
REMAKE = ("make venv-peers && /usr/bin/python3 tests/models/make_index_ops_reference.py "
          "--ort-python build/release/venv/peers/bin/python")
OPS = {"ArgMax", "ArgMin", "CumSum", "Trilu", "GatherElements", "ScatterElements", "GatherND",
       "ScatterND", "Mod", "Where", "TopK", "OneHot", "Range", "Add",
       "Einsum"}


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class IndexOpsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(REFERENCE, "index_ops.json")) as f:
            cls.index = json.load(f)
        cls.inputs = dict(np.load(os.path.join(REFERENCE, "index_ops_inputs.npz")))

    def test_the_files_are_what_the_reference_was_made_from(self):
        self.assertEqual(sha256(os.path.join(REFERENCE, "index_ops_inputs.npz")),
                         self.index["input_sha256"], "the inputs changed; run " + REMAKE)
        self.assertEqual(sorted(self.index["models"]), ["18", "21"])
        for entry in self.index["models"].values():
            for key in ("model", "outputs"):
                self.assertEqual(sha256(os.path.join(REFERENCE, entry[key])),
                                 entry[key + "_sha256"],
                                 "%s changed; run %s" % (entry[key], REMAKE))

    def test_the_models_hold_the_ops_at_their_opsets(self):
        for opset, entry in self.index["models"].items():
            model = onnx.load(os.path.join(REFERENCE, entry["model"]))
            self.assertEqual({o.domain: o.version for o in model.opset_import}.get(""), int(opset))
            self.assertEqual({n.op_type for n in model.graph.node}, OPS)

    def check_served(self, opset):
        entry = self.index["models"][opset]
        want = dict(np.load(os.path.join(REFERENCE, entry["outputs"])))
        name = "index_ops_%s" % opset
        repo = tempfile.mkdtemp(prefix="numaserve_index_ops_")
        try:
            os.makedirs(os.path.join(repo, name, "1"))
            shutil.copy(os.path.join(REFERENCE, entry["model"]),
                        os.path.join(repo, name, "1", "model.onnx"))
            with nc.ServerProcess(repo, ["--max-workers", "1"]) as server:
                got = nc.infer(server.stub(), name, self.inputs, deadline=120.0)
        finally:
            shutil.rmtree(repo, ignore_errors=True)
        self.assertEqual(sorted(got), sorted(want))
        for output, w in sorted(want.items()):
            g = got[output]
            self.assertEqual(g.dtype, w.dtype, output)
            self.assertEqual(g.shape, w.shape, output)
            if np.issubdtype(w.dtype, np.floating):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=0, err_msg=output)
            else:
                np.testing.assert_array_equal(g, w, err_msg=output)
            print("opset %s %s: %s %s matches" % (opset, output, w.dtype, list(w.shape)))

    def test_opset_18_outputs_match_onnx_runtime(self):
        self.check_served("18")

    def test_opset_21_outputs_match_onnx_runtime(self):
        self.check_served("21")


if __name__ == "__main__":
    unittest.main()
