#!/usr/bin/python3
"""Ops in their opset 18-21 forms on the real numaserve against ONNX Runtime.

  ctest -R models.opset20_ops --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve /usr/bin/python3 tests/models/test_opset20_ops.py -v

tests/models/reference/opset20_ops_opset20.onnx and opset20_ops_opset21.onnx
(made by make_opset20_ops_reference.py) hold Gelu in both forms (one after a
MatMul with weights, which numaserve fuses into the matmul) and
GroupNormalization (scale and bias per group at opset 20, per channel at
21) and Resize's half_pixel_symmetric coordinates (opset 19). Each goes into a repository, is served, and its outputs for the
committed inputs must match ONNX Runtime's (requirements/peers.txt)
within 1e-5 relative, 1e-6 absolute.
"""
import os
import unittest

import numpy as np
import onnx

import served_reference as ref

REMAKE = ("make venv-peers && /usr/bin/python3 tests/models/make_opset20_ops_reference.py "
          "--ort-python build/release/venv/peers/bin/python")


class Opset20OpsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.index = ref.load_index("opset20_ops.json")
        cls.inputs = dict(np.load(os.path.join(ref.REFERENCE, "opset20_ops_inputs.npz")))

    def test_the_files_are_what_the_reference_was_made_from(self):
        self.assertEqual(sorted(self.index["models"]), ["20", "21"])
        ref.check_files(self, self.index, "opset20_ops_inputs.npz", REMAKE)

    def test_the_models_hold_the_ops_at_their_opsets(self):
        for opset, entry in self.index["models"].items():
            model = onnx.load(os.path.join(ref.REFERENCE, entry["model"]))
            self.assertEqual({o.domain: o.version for o in model.opset_import}.get(""), int(opset))
            self.assertEqual({n.op_type for n in model.graph.node},
                             {"Gelu", "MatMul", "GroupNormalization", "Resize"})
            scale = [i for i in model.graph.initializer if i.name == "scale"][0]
            self.assertEqual(list(scale.dims), [6 if opset == "21" else 2])

    def test_opset_20_outputs_match_onnx_runtime(self):
        ref.check_served(self, self.index["models"]["20"], "opset20_ops_20", self.inputs, atol=1e-6)

    def test_opset_21_outputs_match_onnx_runtime(self):
        ref.check_served(self, self.index["models"]["21"], "opset20_ops_21", self.inputs, atol=1e-6)


if __name__ == "__main__":
    unittest.main()
