#!/usr/bin/python3
"""Writes the default model: a small Fashion-MNIST-shaped classifier.

  image [batch,1,28,28] -> Flatten -> Gemm(784->256, transB=1) -> Relu
    -> MatMul(256->128) -> Add(bias) -> Relu -> Gemm(128->10) -> Softmax(axis=1)
    -> probabilities [batch,10]

Weights are deterministic (fixed seed, He-style scale), so every run writes
the same bytes. Needs Debian's python3-onnx and numpy (/usr/bin/python3).

Usage: generate_default_model.py --out DIR   (writes DIR/fashion_classifier/1/model.onnx)
"""

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL_NAME = "fashion_classifier"
OPSET = 13
SEED = 20261101


def he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def build_model():
    rng = np.random.default_rng(SEED)
    w1 = he(rng, (256, 784), 784)  # Gemm with transB=1: [N, K]
    b1 = (rng.standard_normal(256) * 0.01).astype(np.float32)
    w2 = he(rng, (256, 128), 256)  # MatMul: [K, N]
    b2 = (rng.standard_normal(128) * 0.01).astype(np.float32)
    w3 = he(rng, (128, 10), 128)   # Gemm: [K, N]
    b3 = (rng.standard_normal(10) * 0.01).astype(np.float32)
    inits = [numpy_helper.from_array(a, name) for a, name in
             [(w1, "fc1.weight"), (b1, "fc1.bias"), (w2, "fc2.weight"), (b2, "fc2.bias"),
              (w3, "fc3.weight"), (b3, "fc3.bias")]]
    nodes = [
        helper.make_node("Flatten", ["image"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["fc1"], name="fc1",
                         transB=1),
        helper.make_node("Relu", ["fc1"], ["relu1"], name="relu1"),
        helper.make_node("MatMul", ["relu1", "fc2.weight"], ["fc2_mm"], name="fc2"),
        helper.make_node("Add", ["fc2_mm", "fc2.bias"], ["fc2"], name="fc2_bias"),
        helper.make_node("Relu", ["fc2"], ["relu2"], name="relu2"),
        helper.make_node("Gemm", ["relu2", "fc3.weight", "fc3.bias"], ["logits"], name="fc3"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, MODEL_NAME,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="numaserve")
    model.ir_version = 8  # readable by libonnx 1.12 and older runtimes
    onnx.checker.check_model(model)
    return model


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="model repository directory")
    args = parser.parse_args(argv)
    path = os.path.join(args.out, MODEL_NAME, "1", "model.onnx")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = build_model().SerializeToString()
    # Write to a temporary name and rename, so a reader never sees half a file.
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
