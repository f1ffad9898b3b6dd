#!/usr/bin/python3
"""Writes the benchmark models with random weights and a dynamic batch.

  /usr/bin/python3 benchmarks/models/generate.py [--out DIR] [--only NAME ...] [--if-stale]

The files are the same bytes on every run (fixed seeds; checked by
tests/models/test_benchmark_outputs.py against the sha256 its committed
references were made from). Each NAME.onnx is written whole, then
NAME.onnx.stamp with the sha256 of this script; --if-stale skips a model
whose file and stamp are there and whose stamp names this script as it is
now (`make test`'s benchmark_models.generate and compare.py use it, so an
edit here regenerates the models and nothing else does).

Models (FP32, ONNX opset 13; the BERT encoder uses opset 17 for
LayerNormalization):
  mlp.onnx          MLP 784-1024-1024-10 (Gemm + Relu)
  resnet50.onnx     ResNet-50 v1.5, 224x224 (Conv + BatchNormalization + Relu,
                    stride 2 in the 3x3 conv of each downsampling bottleneck)
  mobilenetv2.onnx  MobileNetV2 1.0, 224x224 (depthwise convs, ReLU6 as Clip)
  bert_base.onnx    BERT-base encoder: 12 layers, hidden 768, 12 heads,
                    sequence 128; the input is the embedded sequence
                    [batch, 128, 768] (embedding lookup and attention mask are
                    not part of the benchmark); GELU in its Erf form.
Uses Debian's python3-onnx and numpy only.
"""
import argparse
import hashlib
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Builder:
    def __init__(self, seed):
        self.nodes = []
        self.inits = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def name(self, prefix):
        self.count += 1
        return f"{prefix}_{self.count}"

    def const(self, prefix, array):
        n = self.name(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(array), n))
        return n

    def node(self, op, inputs, prefix=None, **attrs):
        out = self.name(prefix or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def weights(self, shape, fan_in):
        return (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    def conv_bn(self, x, cin, cout, k, stride=1, group=1, act="relu"):
        w = self.const("w", self.weights((cout, cin // group, k, k), cin // group * k * k))
        pad = k // 2
        y = self.node("Conv", [x, w], "conv", kernel_shape=[k, k], strides=[stride, stride],
                      pads=[pad] * 4, group=group)
        c = cout
        scale = self.const("bn_scale", (1.0 + 0.1 * self.rng.standard_normal(c)).astype(np.float32))
        bias = self.const("bn_bias", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        mean = self.const("bn_mean", (0.1 * self.rng.standard_normal(c)).astype(np.float32))
        var = self.const("bn_var", (1.0 + 0.1 * np.abs(self.rng.standard_normal(c))).astype(np.float32))
        y = self.node("BatchNormalization", [y, scale, bias, mean, var], "bn", epsilon=1e-5)
        if act == "relu":
            y = self.node("Relu", [y])
        elif act == "relu6":
            y = self.node("Clip", [y, self.const("zero", np.float32(0)), self.const("six", np.float32(6))])
        return y

    def linear(self, x, cin, cout, transposed_gemm=True):
        w = self.const("fc_w", self.weights((cout, cin), cin))
        b = self.const("fc_b", np.zeros(cout, np.float32))
        return self.node("Gemm", [x, w, b], "fc", transB=1)

    def model(self, name, inputs, outputs, opset):
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="numaserve-benchmarks")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model


def image_io(classes):
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])
    return x, y


def finish_classifier(b, x, channels, classes):
    g = b.node("GlobalAveragePool", [x])
    f = b.node("Flatten", [g], axis=1)
    w = b.const("fc_w", b.weights((classes, channels), channels))
    bias = b.const("fc_b", np.zeros(classes, np.float32))
    b.nodes.append(helper.make_node("Gemm", [f, w, bias], ["logits"], name="classifier", transB=1))


def mlp():
    b = Builder(1)
    h = "input"
    sizes = [784, 1024, 1024, 10]
    for i in range(3):
        w = b.const("w", b.weights((sizes[i], sizes[i + 1]), sizes[i]))
        bias = b.const("b", np.zeros(sizes[i + 1], np.float32))
        out = "logits" if i == 2 else None
        if out:
            b.nodes.append(helper.make_node("Gemm", [h, w, bias], [out], name="fc3"))
        else:
            h = b.node("Relu", [b.node("Gemm", [h, w, bias], "fc")])
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 784])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])
    return b.model("mlp", [x], [y], 13)


def resnet50():
    b = Builder(2)
    x = b.conv_bn("input", 3, 64, 7, stride=2)
    x = b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            cout = width * 4
            identity = x
            if i == 0:
                identity = b.conv_bn(x, cin, cout, 1, stride=s, act=None)
            y = b.conv_bn(x, cin, width, 1)
            y = b.conv_bn(y, width, width, 3, stride=s)
            y = b.conv_bn(y, width, cout, 1, act=None)
            x = b.node("Relu", [b.node("Add", [y, identity])])
            cin = cout
    finish_classifier(b, x, 2048, 1000)
    return b.model("resnet50_v1_5", *map(lambda v: [v], image_io(1000)), 13)


def mobilenetv2():
    b = Builder(3)
    x = b.conv_bn("input", 3, 32, 3, stride=2, act="relu6")
    cin = 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                       (6, 160, 3, 2), (6, 320, 1, 1)]:
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = b.conv_bn(y, cin, hidden, 1, act="relu6")
            y = b.conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden, act="relu6")
            y = b.conv_bn(y, hidden, c, 1, act=None)
            if stride == 1 and cin == c:
                y = b.node("Add", [y, x])
            x = y
            cin = c
    x = b.conv_bn(x, cin, 1280, 1, act="relu6")
    finish_classifier(b, x, 1280, 1000)
    return b.model("mobilenetv2", *map(lambda v: [v], image_io(1000)), 13)


def bert_base(layers=12, hidden=768, heads=12, seq=128, ffn=3072):
    b = Builder(4)
    head = hidden // heads
    split = b.const("split_heads", np.array([0, seq, heads, head], np.int64))
    merge = b.const("merge_heads", np.array([0, seq, hidden], np.int64))
    scale = b.const("attn_scale", np.float32(1.0 / np.sqrt(head)))
    sqrt2 = b.const("sqrt2", np.float32(np.sqrt(2.0)))
    one = b.const("one", np.float32(1.0))
    half = b.const("half", np.float32(0.5))

    def dense(x, cin, cout):
        w = b.const("w", (b.rng.standard_normal((cin, cout)) * 0.02).astype(np.float32))
        bias = b.const("b", np.zeros(cout, np.float32))
        return b.node("Add", [b.node("MatMul", [x, w]), bias])

    def layer_norm(x):
        g = b.const("ln_g", np.ones(hidden, np.float32))
        beta = b.const("ln_b", np.zeros(hidden, np.float32))
        return b.node("LayerNormalization", [x, g, beta], axis=-1, epsilon=1e-12)

    x = "input"
    for _ in range(layers):
        q = b.node("Transpose", [b.node("Reshape", [dense(x, hidden, hidden), split])], perm=[0, 2, 1, 3])
        k = b.node("Transpose", [b.node("Reshape", [dense(x, hidden, hidden), split])], perm=[0, 2, 3, 1])
        v = b.node("Transpose", [b.node("Reshape", [dense(x, hidden, hidden), split])], perm=[0, 2, 1, 3])
        scores = b.node("Mul", [b.node("MatMul", [q, k]), scale])
        probs = b.node("Softmax", [scores], axis=-1)
        ctx = b.node("Transpose", [b.node("MatMul", [probs, v])], perm=[0, 2, 1, 3])
        ctx = b.node("Reshape", [ctx, merge])
        x = layer_norm(b.node("Add", [dense(ctx, hidden, hidden), x]))
        h = dense(x, hidden, ffn)
        gelu = b.node("Mul", [b.node("Mul", [h, b.node("Add", [b.node("Erf", [b.node("Div", [h, sqrt2])]), one])]), half])
        x = layer_norm(b.node("Add", [dense(gelu, ffn, hidden), x]))
    b.nodes.append(helper.make_node("Identity", [x], ["output"], name="output"))
    xi = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", seq, hidden])
    yo = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", seq, hidden])
    return b.model("bert_base_encoder", [xi], [yo], 17)


MODELS = {"mlp": mlp, "resnet50": resnet50, "mobilenetv2": mobilenetv2, "bert_base": bert_base}


def script_sha256():
    with open(os.path.abspath(__file__), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def is_current(path, stamp, version):
    if not os.path.isfile(path) or not os.path.isfile(stamp):
        return False
    with open(stamp) as f:
        return f.read().strip() == version


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--if-stale", action="store_true",
                        help="skip models already written by this version of the script")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    version = script_sha256()
    for name in args.only:
        path = os.path.join(args.out, f"{name}.onnx")
        stamp = path + ".stamp"
        if args.if_stale and is_current(path, stamp, version):
            print(f"{path}: up to date")
            continue
        if os.path.exists(stamp):
            os.remove(stamp)
        model = MODELS[name]()
        # Renamed into place whole, so that an interrupted run leaves no
        # truncated model behind a valid stamp.
        onnx.save(model, path + ".tmp")
        os.replace(path + ".tmp", path)
        with open(stamp, "w") as f:
            f.write(version + "\n")
        print(f"{path}: {len(model.graph.node)} nodes, "
              f"{sum(np.prod(t.dims) for t in model.graph.initializer) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
