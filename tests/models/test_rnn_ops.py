#!/usr/bin/python3
"""LSTM and GRU on the real numaserve against ONNX Runtime.

  ctest -R models.rnn_ops --output-on-failure
  NUMASERVE_BIN=build/release/bin/numaserve /usr/bin/python3 tests/models/test_rnn_ops.py -v

tests/models/reference/rnn_ops_opset14.onnx and rnn_ops_opset22.onnx (made
by make_rnn_ops_reference.py) hold LSTMs (forward with bias and initial
states; bidirectional with peepholes, clip and constant sequence_lens;
reverse with a Relu cell; bidirectional with initial states) and GRUs
(linear_before_reset 1 forward and reverse, 0 bidirectional): those whose
cell is oneDNN's run on oneDNN's RNN primitives, the others on the
reference. Each goes into a repository, is served, and its outputs
for the committed inputs must match ONNX Runtime's (requirements/peers.txt)
within 1e-4 relative, 1e-5 absolute (ONNX Runtime sums in FP32, numaserve's
reference in double).
"""
import os
import unittest

import numpy as np
import onnx

import served_reference as ref

REMAKE = ("make venv-peers && /usr/bin/python3 tests/models/make_rnn_ops_reference.py "
          "--ort-python build/release/venv/peers/bin/python")


class RnnOpsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.index = ref.load_index("rnn_ops.json")
        cls.inputs = dict(np.load(os.path.join(ref.REFERENCE, "rnn_ops_inputs.npz")))

    def test_the_files_are_what_the_reference_was_made_from(self):
        self.assertEqual(sorted(self.index["models"]), ["14", "22"])
        ref.check_files(self, self.index, "rnn_ops_inputs.npz", REMAKE)

    def test_the_models_hold_the_ops_at_their_opsets(self):
        for opset, entry in self.index["models"].items():
            model = onnx.load(os.path.join(ref.REFERENCE, entry["model"]))
            self.assertEqual({o.domain: o.version for o in model.opset_import}.get(""), int(opset))
            self.assertEqual([n.op_type for n in model.graph.node],
                             ["LSTM", "LSTM", "LSTM", "LSTM", "GRU", "GRU", "GRU"])

    def test_opset_14_outputs_match_onnx_runtime(self):
        ref.check_served(self, self.index["models"]["14"], "rnn_ops_14", self.inputs,
                         rtol=1e-4, atol=1e-5)

    def test_opset_22_outputs_match_onnx_runtime(self):
        ref.check_served(self, self.index["models"]["22"], "rnn_ops_22", self.inputs,
                         rtol=1e-4, atol=1e-5)


if __name__ == "__main__":
    unittest.main()
