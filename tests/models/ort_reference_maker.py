"""What the generators of committed ONNX Runtime outputs share
(make_index_ops_reference.py, make_opset20_ops_reference.py,
make_rnn_ops_reference.py): the command line, ONNX Runtime run as a child
process in the peers' virtual environment, and the index of the files
written (their sha256 and the ONNX Runtime version), which
served_reference.py checks."""
import argparse
import hashlib
import json
import os
import subprocess

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))

ORT_RUN = """
import sys, numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.intra_op_num_threads = 1
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
inputs = dict(np.load(sys.argv[2]))
names = [o.name for o in session.get_outputs()]
np.savez(sys.argv[3], **dict(zip(names, session.run(None, inputs))))
print(ort.__version__)
"""


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(description, stem, opsets, make_inputs, build_model):
    """Writes STEM_inputs.npz, for each opset: ir_version of OPSETS
    STEM_opsetN.onnx (build_model(opset, ir_version, inputs)) and ONNX
    Runtime's STEM_opsetN_outputs.npz, then STEM.json."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ort-python", required=True,
                        help="the peers' virtual environment's python (make venv-peers)")
    parser.add_argument("--out", default=os.path.join(HERE, "reference"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    inputs = make_inputs()
    input_path = os.path.join(args.out, stem + "_inputs.npz")
    np.savez(input_path, **inputs)
    index = {"generated_by": "tests/models/make_%s_reference.py" % stem,
             "input_sha256": sha256(input_path), "models": {}}
    for opset, ir_version in opsets.items():
        name = "%s_opset%d" % (stem, opset)
        model_path = os.path.join(args.out, name + ".onnx")
        output_path = os.path.join(args.out, name + "_outputs.npz")
        onnx.save(build_model(opset, ir_version, inputs), model_path)
        run = subprocess.run([args.ort_python, "-c", ORT_RUN, model_path, input_path,
                              output_path], check=True, capture_output=True, text=True)
        index["onnxruntime"] = run.stdout.strip().splitlines()[-1]
        index["models"][str(opset)] = {"model": name + ".onnx",
                                       "model_sha256": sha256(model_path),
                                       "outputs": name + "_outputs.npz",
                                       "outputs_sha256": sha256(output_path)}
        outputs = np.load(output_path)
        print("%s: %d outputs, ONNX Runtime %s" % (name, len(outputs.files), index["onnxruntime"]))
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    return 0
