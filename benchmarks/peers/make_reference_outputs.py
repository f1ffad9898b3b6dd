#!/usr/bin/python3
"""Writes ONNX Runtime's outputs of the benchmark models for `make test`.

  /usr/bin/python3 benchmarks/peers/make_reference_outputs.py [--models mlp,...]
      [--build build/release] [--models-dir benchmarks/models/out]
      [--out tests/models/reference]

tests/models/test_benchmark_outputs.py compares numaserve's outputs with
these, on a clean clone without ONNX Runtime. For each benchmark model
(benchmarks/models/generate.py; written into --models-dir if missing or
stale) and its fixed input of output_check.REFERENCE_BATCH rows (seeded,
benchmarks/models/output_check.py), it runs ONNX Runtime (PyPI, pinned in
requirements/peers.txt, in BUILD/venv/peers, made here if missing; ort_peer.py
run, CPU provider, one thread) and writes:

  OUT/NAME.npy        the model's output, float32 (bert_base's [2, 128, 768]
                      is 768 KiB, the others a few KiB)
  OUT/references.json what they were made from: the ONNX Runtime version,
                      the CPU, and per model the sha256 of the .onnx file and
                      of the input, the input's seed and the output's name

Run it again, and commit what it writes, after changing generate.py's
models, the inputs in output_check.py, or the pinned onnxruntime; the
test fails, naming this script, when the model files or inputs no longer
match references.json.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

PEERS_DIR = os.path.dirname(os.path.abspath(__file__))
MODELS_SCRIPTS = os.path.normpath(os.path.join(PEERS_DIR, "..", "models"))
sys.path.insert(0, MODELS_SCRIPTS)
import output_check  # noqa: E402


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(output_check.MODELS))
    p.add_argument("--build", default=os.path.join(PEERS_DIR, "..", "..", "build", "release"),
                   help="the build tree whose venv/peers holds ONNX Runtime")
    p.add_argument("--models-dir", default=os.path.join(MODELS_SCRIPTS, "out"))
    p.add_argument("--out", default=output_check.REFERENCE_DIR)
    args = p.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in output_check.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {','.join(output_check.MODELS)}")
    python = output_check.peer_python(os.path.abspath(args.build))
    if not python:
        sys.exit("make_reference_outputs.py: ONNX Runtime's environment could not be made")
    subprocess.run([sys.executable, os.path.join(MODELS_SCRIPTS, "generate.py"),
                    "--out", args.models_dir, "--if-stale", "--only", *models], check=True)
    ort_version = output_check.ort_version(python)

    os.makedirs(args.out, exist_ok=True)
    index_path = os.path.join(args.out, "references.json")
    index = {"models": {}}
    if os.path.exists(index_path):  # --models updates some, keeps the rest
        with open(index_path) as f:
            index = json.load(f)
    batch = output_check.REFERENCE_BATCH
    for m in models:
        path = os.path.join(args.models_dir, m + ".onnx")
        array = output_check.model_input(m, batch)
        output = output_check.ort_output(python, path, array, threads=1).astype(np.float32)
        np.save(os.path.join(args.out, m + ".npy"), output)
        index["models"][m] = {
            "model_sha256": output_check.sha256_of_file(path),
            "input_seed": output_check.INPUT_SEEDS[m],
            "input_shape": list(array.shape),
            "input_sha256": output_check.sha256_of_array(array),
            "output": output_check.MODELS[m][2],
            "output_shape": list(output.shape),
        }
        print(f"{m}: output {list(output.shape)}, max |output| {np.abs(output).max():.4g}")
    index.update({
        "generated_by": "benchmarks/peers/make_reference_outputs.py",
        "onnxruntime": ort_version,
        "cpu": cpu_name(),
        "batch": batch,
    })
    index["models"] = dict(sorted(index["models"].items()))
    with open(index_path, "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
