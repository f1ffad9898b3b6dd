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
import os
import unittest

import numpy as np
import onnx

import served_reference as ref

REMAKE = ("make venv-peers && /usr/bin/python3 tests/models/make_index_ops_reference.py "
          "--ort-python build/release/venv/peers/bin/python")
OPS = {"ArgMax", "ArgMin", "CumSum", "Trilu", "GatherElements", "ScatterElements", "GatherND",
       "ScatterND", "Mod", "Where", "TopK", "OneHot", "Range", "Add",
       "Einsum"}


class IndexOpsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.index = ref.load_index("index_ops.json")
        cls.inputs = dict(np.load(os.path.join(ref.REFERENCE, "index_ops_inputs.npz")))

    def test_the_files_are_what_the_reference_was_made_from(self):
        self.assertEqual(sorted(self.index["models"]), ["18", "21"])
        ref.check_files(self, self.index, "index_ops_inputs.npz", REMAKE)

    def test_the_models_hold_the_ops_at_their_opsets(self):
        for opset, entry in self.index["models"].items():
            model = onnx.load(os.path.join(ref.REFERENCE, entry["model"]))
            self.assertEqual({o.domain: o.version for o in model.opset_import}.get(""), int(opset))
            self.assertEqual({n.op_type for n in model.graph.node}, OPS)

    def check_served(self, opset):
        ref.check_served(self, self.index["models"][opset], "index_ops_%s" % opset, self.inputs)

    def test_opset_18_outputs_match_onnx_runtime(self):
        self.check_served("18")

    def test_opset_21_outputs_match_onnx_runtime(self):
        self.check_served("21")


if __name__ == "__main__":
    unittest.main()
