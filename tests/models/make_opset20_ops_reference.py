#!/usr/bin/python3
"""Writes small models of ops in their opset 18-21 forms and ONNX Runtime's outputs.

  make venv-peers        # ONNX Runtime from PyPI, pinned (requirements/peers.txt)
  /usr/bin/python3 tests/models/make_opset20_ops_reference.py \\
      --ort-python build/release/venv/peers/bin/python

tests/models/test_opset20_ops.py runs the models on the real numaserve and
compares with what this writes into tests/models/reference/ (committed, so
no ONNX Runtime is needed at test time):

  opset20_ops_opsetN.onnx      at opsets 20 and 21: Gelu in both forms
                            (approximate "none" and "tanh", on a tensor and
                            after a MatMul with weights, where numaserve
                            fuses it), GroupNormalization with 2 groups of 3
                            channels (scale and bias per group at opset 20,
                            per channel at 21, as each opset defines them),
                            Resize with coordinate_transformation_mode
                            half_pixel_symmetric (opset 19; linear, scales
                            that do not give whole lengths)
  opset20_ops_inputs.npz       the seeded inputs
  opset20_ops_opsetN_outputs.npz  ONNX Runtime's outputs (CPU provider)
  opset20_ops.json             the ONNX Runtime version and the sha256 of the files
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ort_reference_maker

OPSETS = {20: 9, 21: 10}  # opset: the IR version that goes with it
SEED = 20


def make_inputs():
    rng = np.random.default_rng(SEED)
    return {"x": (rng.standard_normal((2, 5, 8)) * 2).astype(np.float32),
            "image": (rng.standard_normal((2, 6, 3, 4)) * 3 + 1).astype(np.float32),
            "picture": rng.standard_normal((1, 2, 8, 7)).astype(np.float32)}


def build_model(opset, ir_version, inputs):
    rng = np.random.default_rng(SEED + opset)
    params = 6 if opset >= 21 else 2
    inits = [numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(params).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.standard_normal(params).astype(np.float32), "bias"),
             numpy_helper.from_array(np.array([1, 1, 0.7, 1.6], np.float32), "resize_scales")]
    nodes = [helper.make_node("Gelu", ["x"], ["gelu"], name="gelu"),
             helper.make_node("Gelu", ["x"], ["gelu_tanh"], approximate="tanh", name="gelu_tanh"),
             helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Gelu", ["h"], ["fc_gelu"], name="fc_gelu"),
             helper.make_node("GroupNormalization", ["image", "scale", "bias"], ["grouped"],
                              num_groups=2, epsilon=1e-3, name="group_norm"),
             helper.make_node("Resize", ["picture", "", "resize_scales"], ["resized"],
                              mode="linear", coordinate_transformation_mode="half_pixel_symmetric",
                              name="resize_symmetric")]
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(a.shape))
                    for name, a in inputs.items()]
    graph = helper.make_graph(nodes, "opset20_ops", graph_inputs, [], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="numaserve tests/models/make_opset20_ops_reference.py")
    model.ir_version = ir_version
    x, image = list(inputs["x"].shape), list(inputs["image"].shape)
    for name, shape in (("gelu", x), ("gelu_tanh", x), ("fc_gelu", x[:-1] + [16]),
                        ("grouped", image), ("resized", [1, 2, 5, 11])):
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    return ort_reference_maker.main(__doc__.splitlines()[0], "opset20_ops", OPSETS, make_inputs,
                                    build_model)


if __name__ == "__main__":
    sys.exit(main())
