#!/usr/bin/python3
"""Writes an untrained small CNN for Fashion-MNIST, for `numaserve train`:

  image [batch,1,28,28] -> Conv 3x3 (32) -> Relu -> MaxPool 2 -> Conv 3x3 (64)
    -> Relu -> MaxPool 2 -> Flatten -> Gemm (3136->128) -> Relu
    -> Gemm (128->10) -> Softmax -> probabilities [batch,10]

He-initialized from a fixed seed (the same bytes every run). Same input and
output names as the default model, so the trained result can replace it.

Usage: make_fashion_cnn.py --out FILE
"""

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20261121


def he(rng, shape, fan_in):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)


def build_model():
    rng = np.random.default_rng(SEED)
    weights = [
        ("conv1.weight", he(rng, (32, 1, 3, 3), 9)),
        ("conv1.bias", np.zeros(32, np.float32)),
        ("conv2.weight", he(rng, (64, 32, 3, 3), 288)),
        ("conv2.bias", np.zeros(64, np.float32)),
        ("fc1.weight", he(rng, (128, 3136), 3136)),
        ("fc1.bias", np.zeros(128, np.float32)),
        ("fc2.weight", he(rng, (10, 128), 128)),
        ("fc2.bias", np.zeros(10, np.float32)),
    ]
    pad1 = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    pool = dict(kernel_shape=[2, 2], strides=[2, 2])
    nodes = [
        helper.make_node("Conv", ["image", "conv1.weight", "conv1.bias"], ["c1"], name="conv1", **pad1),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", **pool),
        helper.make_node("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], name="conv2", **pad1),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("MaxPool", ["r2"], ["p2"], name="pool2", **pool),
        helper.make_node("Flatten", ["p2"], ["flat"], name="flatten", axis=1),
        helper.make_node("Gemm", ["flat", "fc1.weight", "fc1.bias"], ["f1"], name="fc1", transB=1),
        helper.make_node("Relu", ["f1"], ["r3"], name="relu3"),
        helper.make_node("Gemm", ["r3", "fc2.weight", "fc2.bias"], ["logits"], name="fc2", transB=1),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "fashion_cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10])],
        initializer=[numpy_helper.from_array(a, n) for n, a in weights])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="numaserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the .onnx file to write")
    args = parser.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(build_model().SerializeToString())
    os.replace(tmp, args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
