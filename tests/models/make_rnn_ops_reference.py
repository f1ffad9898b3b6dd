#!/usr/bin/python3
"""Writes small LSTM and GRU models and ONNX Runtime's outputs of them.

  make venv-peers        # ONNX Runtime from PyPI, pinned (requirements/peers.txt)
  /usr/bin/python3 tests/models/make_rnn_ops_reference.py \\
      --ort-python build/release/venv/peers/bin/python

tests/models/test_rnn_ops.py runs the models on the real numaserve and
compares with what this writes into tests/models/reference/ (committed, so
no ONNX Runtime is needed at test time):

  rnn_ops_opsetN.onnx       at opsets 14 (what PyTorch's exporters emit for
                            nn.LSTM and nn.GRU) and 22: LSTM forward with
                            bias and initial states; LSTM bidirectional with
                            peepholes, clip and constant sequence_lens;
                            LSTM reverse with Relu as its cell activation
                            and no Y_c; LSTM bidirectional with initial
                            states and nothing else (numaserve runs it on
                            oneDNN); GRU forward
                            (linear_before_reset 1, as PyTorch exports),
                            reverse (linear_before_reset 1, no initial
                            state) and bidirectional (linear_before_reset
                            0) with initial state
  rnn_ops_inputs.npz        the seeded inputs
  rnn_ops_opsetN_outputs.npz  ONNX Runtime's outputs (CPU provider)
  rnn_ops.json              the ONNX Runtime version and the sha256 of the files
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ort_reference_maker

OPSETS = {14: 8, 22: 10}  # opset: the IR version that goes with it
SEED = 14
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def make_inputs():
    rng = np.random.default_rng(SEED)
    return {"x": rng.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32),
            "h0": (rng.standard_normal((1, BATCH, HIDDEN)) * 0.5).astype(np.float32),
            "c0": (rng.standard_normal((1, BATCH, HIDDEN)) * 0.5).astype(np.float32),
            "h2": (rng.standard_normal((2, BATCH, HIDDEN)) * 0.5).astype(np.float32),
            "c2": (rng.standard_normal((2, BATCH, HIDDEN)) * 0.5).astype(np.float32)}


def build_model(opset, ir_version, inputs):
    rng = np.random.default_rng(SEED + opset)

    def weights(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32), name)

    inits = [weights("lw", 1, 4 * HIDDEN, INPUT), weights("lr", 1, 4 * HIDDEN, HIDDEN),
             weights("lb", 1, 8 * HIDDEN),
             weights("bw", 2, 4 * HIDDEN, INPUT), weights("br", 2, 4 * HIDDEN, HIDDEN),
             weights("bb", 2, 8 * HIDDEN), weights("bp", 2, 3 * HIDDEN),
             numpy_helper.from_array(np.array([5, 3, 1], np.int32), "lens"),
             weights("gw", 1, 3 * HIDDEN, INPUT), weights("gr", 1, 3 * HIDDEN, HIDDEN),
             weights("gb", 1, 6 * HIDDEN),
             weights("g2w", 2, 3 * HIDDEN, INPUT), weights("g2r", 2, 3 * HIDDEN, HIDDEN),
             weights("g2b", 2, 6 * HIDDEN)]
    nodes = [
        helper.make_node("LSTM", ["x", "lw", "lr", "lb", "", "h0", "c0"],
                         ["lstm_y", "lstm_h", "lstm_c"], hidden_size=HIDDEN, name="lstm"),
        helper.make_node("LSTM", ["x", "bw", "br", "bb", "lens", "", "", "bp"],
                         ["bi_y", "bi_h", "bi_c"], hidden_size=HIDDEN, direction="bidirectional",
                         clip=2.5, name="lstm_bidirectional"),
        helper.make_node("LSTM", ["x", "lw", "lr", "lb"], ["rev_y", "rev_h"],
                         hidden_size=HIDDEN, direction="reverse",
                         activations=["Sigmoid", "Relu", "Tanh"], name="lstm_reverse"),
        helper.make_node("LSTM", ["x", "bw", "br", "bb", "", "h2", "c2"],
                         ["bi2_y", "bi2_h", "bi2_c"], hidden_size=HIDDEN,
                         direction="bidirectional", name="lstm_bidirectional_initial"),
        helper.make_node("GRU", ["x", "gw", "gr", "gb", "", "h0"], ["gru_y", "gru_h"],
                         hidden_size=HIDDEN, linear_before_reset=1, name="gru"),
        helper.make_node("GRU", ["x", "gw", "gr", "gb"], ["grev_y", "grev_h"],
                         hidden_size=HIDDEN, linear_before_reset=1, direction="reverse",
                         name="gru_reverse"),
        helper.make_node("GRU", ["x", "g2w", "g2r", "g2b", "", "h2"], ["gru2_y", "gru2_h"],
                         hidden_size=HIDDEN, direction="bidirectional", name="gru_bidirectional"),
    ]
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape))
                    for name, a in inputs.items()]
    graph = helper.make_graph(nodes, "rnn_ops", graph_inputs, [], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="numaserve tests/models/make_rnn_ops_reference.py")
    model.ir_version = ir_version
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {v.name: v for v in inferred.graph.value_info}
    for n in nodes:
        for name in n.output:
            model.graph.output.append(known[name])
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    return ort_reference_maker.main(__doc__.splitlines()[0], "rnn_ops", OPSETS, make_inputs,
                                    build_model)


if __name__ == "__main__":
    sys.exit(main())
