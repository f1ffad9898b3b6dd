#!/usr/bin/python3
"""If, Loop, RoiAlign and NonZero on the real numaserve against ONNX Runtime.

  ctest -R models.control_flow --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve /usr/bin/python3 tests/models/test_control_flow.py -v

tests/models/reference/control_flow_opset11.onnx and control_flow_opset21.onnx
(made by make_control_flow_reference.py) hold an If on x's channel count
(folded at load, its branch inlined), a Loop of 3 iterations with a
loop-carried value and a scan output (unrolled at load), RoiAlign in avg
mode (half_pixel at opset 21, adaptive sampling) and max mode
(output_half_pixel, 2 samples per axis), and NonZero of a constant mask
(folded at load) feeding a GatherND of an input. Each goes into a
repository, is served, and its outputs for the committed inputs must match
ONNX Runtime's (requirements/peers.txt) within 1e-5 relative, 1e-6
absolute.
"""
import os
import unittest

import numpy as np
import onnx

import served_reference as ref

REMAKE = ("make venv-peers && /usr/bin/python3 tests/models/make_control_flow_reference.py "
          "--ort-python build/release/venv/peers/bin/python")


class ControlFlowTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.index = ref.load_index("control_flow.json")
        cls.inputs = dict(np.load(os.path.join(ref.REFERENCE, "control_flow_inputs.npz")))

    def test_the_files_are_what_the_reference_was_made_from(self):
        self.assertEqual(sorted(self.index["models"]), ["11", "21"])
        ref.check_files(self, self.index, "control_flow_inputs.npz", REMAKE)

    def test_the_models_hold_the_ops_at_their_opsets(self):
        for opset, entry in self.index["models"].items():
            model = onnx.load(os.path.join(ref.REFERENCE, entry["model"]))
            self.assertEqual({o.domain: o.version for o in model.opset_import}.get(""), int(opset))
            ops = {n.op_type for n in model.graph.node}
            self.assertTrue({"If", "Loop", "RoiAlign", "NonZero"} <= ops, ops)

    def test_opset_11_outputs_match_onnx_runtime(self):
        ref.check_served(self, self.index["models"]["11"], "control_flow_11", self.inputs,
                         atol=1e-6)

    def test_opset_21_outputs_match_onnx_runtime(self):
        ref.check_served(self, self.index["models"]["21"], "control_flow_21", self.inputs,
                         atol=1e-6)


if __name__ == "__main__":
    unittest.main()
