#!/usr/bin/python3
"""Writes small models of the index ops and ONNX Runtime's outputs of them.

  make venv-peers        # ONNX Runtime from PyPI, pinned (requirements/peers.txt)
  /usr/bin/python3 tests/models/make_index_ops_reference.py \\
      --ort-python build/release/venv/peers/bin/python

tests/models/test_index_ops.py runs the models on the real numaserve and
compares with what this writes into tests/models/reference/ (committed, so
no ONNX Runtime is needed at test time):

  index_ops_opsetN.onnx     one graph, at opset 18 (what torch.onnx's
                            dynamo exporter emits) and at opset 21 (the
                            newest ONNX Runtime and Debian 13's libonnx 1.17
                            both run; libonnx knows up to 22): ArgMax and
                            ArgMin (ties, select_last_index, FP32 and INT64),
                            CumSum (exclusive, reverse), Trilu (upper, lower,
                            k), GatherElements, ScatterElements (none, add,
                            max), GatherND (with batch_dims), ScatterND (none,
                            mul), Mod (integer, and fmod on FP32) and Where
                            with its three inputs broadcast; negative axes and
                            negative indices; TopK (largest and
                            smallest, ties), OneHot (indices out of range)
                            and Range (constant inputs: it folds); Einsum
                            (batched MatMul, attention scores, transpose,
                            dot, sum, an implicit output, ellipses that
                            broadcast)
  index_ops_inputs.npz      the seeded inputs (fixed shapes)
  index_ops_opsetN_outputs.npz  ONNX Runtime's outputs (CPU provider)
  index_ops.json            the ONNX Runtime version and the sha256 of the files

The models are built here with Debian's python3-onnx (helper API, values
from a fixed seed); ONNX Runtime runs in the peers' virtual environment
(--ort-python), as a child process.
"""
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ort_reference_maker

OPSETS = {18: 8, 21: 10}  # opset: the IR version that goes with it
SEED = 38

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def make_inputs():
    rng = np.random.default_rng(SEED)
    # Halves of small integers: many ties for ArgMax/ArgMin.
    x = (np.round(rng.standard_normal((3, 4, 5)) * 2) / 2).astype(np.float32)
    n = rng.integers(-50, 50, (3, 4)).astype(np.int64)
    # Distinct indices per row where the last write would otherwise decide.
    si = np.stack([np.stack([rng.permutation(5)[:2] for _ in range(4)]) for _ in range(3)])
    si = (si - 5 * (si % 2)).astype(np.int64)  # odd ones counted from the end
    return {
        "x": x,
        "n": n,
        "gi": rng.integers(-5, 5, (3, 4, 2)).astype(np.int64),
        "si": si,
        "u": rng.standard_normal((3, 4, 2)).astype(np.float32),
        "ndi": np.array([[0, -1], [2, 1]], np.int64),
        "bi": np.array([[3], [-4], [1]], np.int64),
        "sndi": np.array([[2], [-3]], np.int64),
        "sndu": rng.standard_normal((2, 4, 5)).astype(np.float32),
        "mulu": (rng.integers(1, 4, (3, 4, 5))).astype(np.float32),
        "md": np.where(rng.integers(0, 2, (3, 4)) == 0, -1, 1).astype(np.int64)
        * rng.integers(1, 9, (3, 4)).astype(np.int64),
        "c": rng.integers(0, 2, (3, 1, 5)).astype(bool),
        "oh": rng.integers(-6, 6, (3, 4)).astype(np.int64),
        "ea": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "eb": rng.standard_normal((2, 4, 5)).astype(np.float32),
        "q": rng.standard_normal((1, 2, 3, 4)).astype(np.float32),
        "kk": rng.standard_normal((1, 2, 5, 4)).astype(np.float32),
        "q2": rng.standard_normal((3, 2, 3, 4)).astype(np.float32),
        "v1": rng.standard_normal(6).astype(np.float32),
        "v2": rng.standard_normal(6).astype(np.float32),
    }


def build_model(opset, ir_version, inputs):
    def init(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    inits = [
        init("axis1", np.array(1, np.int64)),
        init("axis_last", np.array([-1], np.int64)),
        init("k1", np.array(1, np.int64)),
        init("km1", np.array(-1, np.int64)),
        init("fdiv", np.array([0.7, -1.3, 2.0, 0.5, -0.25], np.float32)),
        init("w", np.array([[1.5], [-2.0], [0.25], [8.0]], np.float32)),
        init("dup", np.array([[0], [0], [2]], np.int64)),
        init("k3", np.array([3], np.int64)),
        init("k2", np.array([2], np.int64)),
        init("depth", np.array(5, np.int64)),
        init("onoff", np.array([-0.5, 2.0], np.float32)),
        init("start", np.array(-1.0, np.float32)),
        init("limit", np.array(1.5, np.float32)),
        init("delta", np.array(0.5, np.float32)),
    ]
    node = helper.make_node
    nodes = [
        node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0),
        node("ArgMin", ["x"], ["argmin_last"], axis=-1, select_last_index=1),
        node("ArgMax", ["n"], ["argmax_n"], axis=0),
        node("CumSum", ["x", "axis1"], ["cumsum"]),
        node("CumSum", ["n", "axis_last"], ["cumsum_er"], exclusive=1, reverse=1),
        node("Trilu", ["x", "k1"], ["triu"]),
        node("Trilu", ["n", "km1"], ["tril_n"], upper=0),
        node("GatherElements", ["x", "gi"], ["gather_el"], axis=2),
        node("ScatterElements", ["x", "si", "u"], ["scatter_el"], axis=-1),
        node("ScatterElements", ["x", "si", "u"], ["scatter_el_add"], axis=2, reduction="add"),
        node("ScatterElements", ["x", "si", "u"], ["scatter_el_max"], axis=2, reduction="max"),
        node("GatherND", ["x", "ndi"], ["gather_nd"]),
        node("GatherND", ["x", "bi"], ["gather_nd_b"], batch_dims=1),
        node("ScatterND", ["x", "sndi", "sndu"], ["scatter_nd"]),
        node("ScatterND", ["x", "dup", "mulu"], ["scatter_nd_mul"], reduction="mul"),
        node("Mod", ["n", "md"], ["mod_n"]),
        node("Mod", ["x", "fdiv"], ["fmod_x"], fmod=1),
        node("Where", ["c", "x", "w"], ["where"]),
        node("TopK", ["x", "k3"], ["topk", "topk_i"]),
        node("TopK", ["x", "k2"], ["bottomk", "bottomk_i"], axis=1, largest=0),
        node("TopK", ["n", "k2"], ["topk_n", "topk_n_i"], axis=0),
        # Indices from -6 to 5 into depth 5: -6 and 5 leave their rows off.
        node("OneHot", ["oh", "depth", "onoff"], ["onehot"], axis=1),
        # Constant inputs: Range folds at load; added to x so the output
        # is computed at run time.
        node("Range", ["start", "limit", "delta"], ["r"]),
        node("Add", ["x", "r"], ["range_x"]),
        # The equations exporters emit: batched MatMul, attention scores,
        # a transpose, a dot product, a sum; one implicit (output "bik").
        node("Einsum", ["ea", "eb"], ["einsum_bmm"], equation="bij,bjk->bik"),
        node("Einsum", ["q", "kk"], ["einsum_attn"], equation="bhqd,bhkd->bhqk"),
        node("Einsum", ["n"], ["einsum_t"], equation="ij->ji"),
        node("Einsum", ["v1", "v2"], ["einsum_dot"], equation="i,i->"),
        node("Einsum", ["x"], ["einsum_sum"], equation="bij->bi"),
        node("Einsum", ["ea", "eb"], ["einsum_implicit"], equation="bij,bjk"),
        # Ellipses: batched MatMul, and attention scores with q's batch
        # broadcast against a key of batch 1.
        node("Einsum", ["ea", "eb"], ["einsum_ellipsis"], equation="...ij,...jk->...ik"),
        node("Einsum", ["q2", "kk"], ["einsum_broadcast"], equation="...qd,...kd->...qk"),
    ]
    types = {name: {np.dtype(np.float32): F, np.dtype(np.int64): I64,
                    np.dtype(bool): B}[a.dtype] for name, a in inputs.items()}
    graph_inputs = [helper.make_tensor_value_info(name, types[name], list(a.shape))
                    for name, a in inputs.items()]
    graph = helper.make_graph(nodes, "index_ops", graph_inputs, [], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="numaserve tests/models/make_index_ops_reference.py")
    model.ir_version = ir_version
    # The outputs with the types and shapes ONNX's inference gives them.
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    known = {v.name: v for v in inferred.graph.value_info}
    for n in nodes:
        for name in n.output:
            if name != "r":
                model.graph.output.append(known[name])
    onnx.checker.check_model(model, full_check=True)
    return model


def main():
    return ort_reference_maker.main(__doc__.splitlines()[0], "index_ops", OPSETS, make_inputs,
                                    build_model)


if __name__ == "__main__":
    sys.exit(main())
