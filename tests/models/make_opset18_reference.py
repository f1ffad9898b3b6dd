#!/usr/bin/python3
"""Writes a small model in opset 18's forms and ONNX Runtime's output of it.

  make venv-peers        # ONNX Runtime from PyPI, pinned (requirements/peers.txt)
  /usr/bin/python3 tests/models/make_opset18_reference.py \\
      --ort-python build/release/venv/peers/bin/python

tests/models/test_opset18.py runs the model on the real numaserve and
compares with what this writes into tests/models/reference/ (committed, so
no ONNX Runtime is needed at test time):

  opset18.onnx        the model: Conv, then the forms opset 18 brought or
                      changed: Split by num_outputs into unequal parts, Pad
                      with its axes input, ReduceMean and ReduceSum with axes
                      as an input, LayerNormalization (opset 17); a dynamic
                      batch dimension
  opset18_input.npy   the seeded input, batch 3
  opset18_output.npy  ONNX Runtime's output (CPU provider)
  opset18.json        the ONNX Runtime version and the sha256 of the files

The model is built here with Debian's python3-onnx (helper API, random
weights from a fixed seed); ONNX Runtime runs in the peers' virtual
environment (--ort-python), as a child process.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
OPSET = 18
BATCH = 3
SEED = 18


def build_model():
    rng = np.random.default_rng(SEED)

    def init(name, array):
        return numpy_helper.from_array(np.asarray(array), name)

    inits = [
        init("w", rng.standard_normal((7, 4, 3, 3)).astype(np.float32) * 0.3),
        init("b", rng.standard_normal(7).astype(np.float32) * 0.1),
        init("pads", np.array([1, 0, 2, 1], np.int64)),  # begins of H, W; ends of H, W
        init("pad_axes", np.array([2, 3], np.int64)),
        init("pad_value", np.array(0.5, np.float32)),
        init("hw", np.array([2, 3], np.int64)),
        init("h", np.array([2], np.int64)),
        init("gamma", rng.standard_normal(6).astype(np.float32)),
        init("beta", rng.standard_normal(6).astype(np.float32)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        # 7 channels into 3 parts: 3, 3 and 1 (opset 18's num_outputs).
        helper.make_node("Split", ["r"], ["s0", "s1", "s2"], axis=1, num_outputs=3),
        # Pad only H and W (opset 18's axes input), constant 0.5.
        helper.make_node("Pad", ["s0", "pads", "pad_value", "pad_axes"], ["p"], mode="constant"),
        # Axes as an input: ReduceMean (opset 18), ReduceSum (opset 13).
        helper.make_node("ReduceMean", ["p", "hw"], ["m0"], keepdims=0),
        helper.make_node("ReduceSum", ["s1", "h"], ["m1"], keepdims=0),
        helper.make_node("ReduceMean", ["m1", "h"], ["m1w"], keepdims=0),
        helper.make_node("ReduceMean", ["s2", "hw"], ["m2"], keepdims=0),
        helper.make_node("Concat", ["m0", "m1w"], ["cat"], axis=1),
        helper.make_node("LayerNormalization", ["cat", "gamma", "beta"], ["ln"], axis=-1),
        helper.make_node("Add", ["ln", "m2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "opset18_forms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 9, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 6])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="numaserve tests/models/make_opset18_reference.py")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


ORT_RUN = """
import sys, numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
x = np.load(sys.argv[2])
np.save(sys.argv[3], session.run(None, {"x": x})[0])
print(ort.__version__)
"""


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ort-python", required=True,
                        help="the peers' virtual environment's python (make venv-peers)")
    parser.add_argument("--out", default=os.path.join(HERE, "reference"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model_path = os.path.join(args.out, "opset18.onnx")
    input_path = os.path.join(args.out, "opset18_input.npy")
    output_path = os.path.join(args.out, "opset18_output.npy")
    onnx.save(build_model(), model_path)
    x = np.random.default_rng(SEED + 1).standard_normal((BATCH, 4, 9, 10)).astype(np.float32)
    np.save(input_path, x)
    run = subprocess.run([args.ort_python, "-c", ORT_RUN, model_path, input_path, output_path],
                         check=True, capture_output=True, text=True)
    ort_version = run.stdout.strip().splitlines()[-1]
    index = {
        "generated_by": "tests/models/make_opset18_reference.py",
        "onnxruntime": ort_version,
        "opset": OPSET,
        "model_sha256": sha256(model_path),
        "input_sha256": sha256(input_path),
        "output_sha256": sha256(output_path),
    }
    with open(os.path.join(args.out, "opset18.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    y = np.load(output_path)
    print("opset18: output %s, max |output| %.4g, ONNX Runtime %s"
          % (list(y.shape), float(np.abs(y).max()), ort_version))


if __name__ == "__main__":
    sys.exit(main())
