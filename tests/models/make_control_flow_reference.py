#!/usr/bin/python3
"""Writes a small model of If, Loop, RoiAlign and NonZero and ONNX Runtime's outputs of it.

  make venv-peers        # ONNX Runtime from PyPI, pinned (requirements/peers.txt)
  /usr/bin/python3 tests/models/make_control_flow_reference.py \\
      --ort-python build/release/venv/peers/bin/python

tests/models/test_control_flow.py runs the models on the real numaserve and
compares with what this writes into tests/models/reference/ (committed, so
no ONNX Runtime is needed at test time):

  control_flow_opsetN.onnx     at opsets 11 (RoiAlign-10, Unsqueeze's axes
                               attribute) and 21 (RoiAlign-16): an If on
                               x's channel count (Shape -> Gather -> Equal,
                               as exporters emit it), a Loop of 3 iterations
                               with a loop-carried value and a scan output,
                               RoiAlign in avg and max modes (adaptive and
                               fixed sampling), and NonZero of a constant
                               mask selecting elements of an input
                               (GatherND)
  control_flow_inputs.npz      the seeded inputs
  control_flow_opsetN_outputs.npz  ONNX Runtime's outputs (CPU provider)
  control_flow.json            the ONNX Runtime version and the sha256 of the files
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ort_reference_maker

OPSETS = {11: 6, 21: 10}  # opset: the IR version that goes with it
SEED = 38
ROIS = 5


def make_inputs():
    rng = np.random.default_rng(SEED)
    corner = rng.uniform(0, 10, (ROIS, 2))
    size = rng.uniform(1, 8, (ROIS, 2))
    return {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32),
            "rois": np.concatenate([corner, corner + size], axis=1).astype(np.float32),
            "batch_indices": np.array([0, 1, 1, 0, 1], np.int64),
            "m": rng.standard_normal((3, 4)).astype(np.float32)}


def const(name, array):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array, name))


def if_nodes():
    """If x has 3 channels: Relu(x * w) (w from outside the branch), else -x."""
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["scaled"]),
         helper.make_node("Relu", ["scaled"], ["then_out"])],
        "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2, 3, 8, 8])])
    else_graph = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["else_out"])],
        "else", [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2, 3, 8, 8])])
    return [helper.make_node("Shape", ["x"], ["x_shape"]),
            const("one", np.array(1, np.int64)),
            const("three", np.array(3, np.int64)),
            helper.make_node("Gather", ["x_shape", "one"], ["channels"], axis=0),
            helper.make_node("Equal", ["channels", "three"], ["has_3"]),
            helper.make_node("If", ["has_3"], ["if_out"], then_branch=then_graph,
                             else_branch=else_graph, name="if_channels")]


def scalar_info(name, elem_type):
    """A value info of a scalar (an empty shape, present)."""
    info = helper.make_tensor_value_info(name, elem_type, [])
    info.type.tensor_type.shape.SetInParent()
    return info


def loop_nodes(opset):
    """3 iterations: acc = acc * 0.5 + float(i) + mean of x (read from outside);
    scan output: each iteration's acc."""
    reduce_axes = {"axes": [2, 3]} if opset < 18 else {}
    reduce_inputs = ["x"] if opset < 18 else ["x", "hw"]
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["acc_in", "half"], ["halved"]),
         helper.make_node("Add", ["halved", "i_f"], ["stepped"]),
         helper.make_node("Add", ["stepped", "x_mean"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["acc_out"], ["scan_out"])],
        "body",
        [scalar_info("i", TensorProto.INT64),
         scalar_info("cond_in", TensorProto.BOOL),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [2, 3])],
        [scalar_info("cond_out", TensorProto.BOOL),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("scan_out", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(0.5, np.float32), "half")])
    nodes = [const("trips", np.array(3, np.int64)),
             const("go", np.array(True)),
             const("acc0", np.zeros((2, 3), np.float32))]
    if opset >= 18:
        nodes.append(const("hw", np.array([2, 3], np.int64)))
    nodes += [helper.make_node("ReduceMean", reduce_inputs, ["x_mean"], keepdims=0, **reduce_axes),
              helper.make_node("Loop", ["trips", "go", "acc0"], ["loop_acc", "loop_scan"],
                               body=body, name="loop_steps")]
    return nodes


def roi_nodes(opset):
    extra = {"coordinate_transformation_mode": "half_pixel"} if opset >= 16 else {}
    extra_max = {"coordinate_transformation_mode": "output_half_pixel"} if opset >= 16 else {}
    return [helper.make_node("RoiAlign", ["x", "rois", "batch_indices"], ["roi_avg"],
                             output_height=3, output_width=2, sampling_ratio=0,
                             spatial_scale=0.5, name="roi_avg", **extra),
            helper.make_node("RoiAlign", ["x", "rois", "batch_indices"], ["roi_max"],
                             mode="max", output_height=2, output_width=2, sampling_ratio=2,
                             spatial_scale=0.75, name="roi_max", **extra_max)]


def nonzero_nodes():
    mask = np.array([[1, 0, 0, 2], [0, 0, 3, 0], [4, 5, 0, 0]], np.float32)
    return [const("mask", mask),
            helper.make_node("NonZero", ["mask"], ["nz"], name="nonzero_mask"),
            helper.make_node("Transpose", ["nz"], ["nz_t"], perm=[1, 0]),
            helper.make_node("GatherND", ["m", "nz_t"], ["selected"])]


def build_model(opset, ir_version, inputs):
    rng = np.random.default_rng(SEED + opset)
    w = numpy_helper.from_array(rng.standard_normal((1, 3, 1, 1)).astype(np.float32), "w")
    nodes = if_nodes() + loop_nodes(opset) + roi_nodes(opset) + nonzero_nodes()
    graph_inputs = [helper.make_tensor_value_info(name, TensorProto.INT64 if a.dtype == np.int64
                                                  else TensorProto.FLOAT, list(a.shape))
                    for name, a in inputs.items()]
    graph = helper.make_graph(nodes, "control_flow", graph_inputs, [], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="numaserve tests/models/make_control_flow_reference.py")
    model.ir_version = ir_version
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {v.name: v for v in inferred.graph.value_info}
    # ONNX infers no shape for a Loop's carried output: it is declared.
    known["loop_acc"] = helper.make_tensor_value_info("loop_acc", TensorProto.FLOAT, [2, 3])
    for name in ["if_out", "loop_acc", "loop_scan", "roi_avg", "roi_max", "selected"]:
        model.graph.output.append(known[name])

    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    return ort_reference_maker.main(__doc__.splitlines()[0], "control_flow", OPSETS, make_inputs,
                                    build_model)


if __name__ == "__main__":
    sys.exit(main())
