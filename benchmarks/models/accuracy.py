#!/usr/bin/python3
"""Fashion-MNIST test accuracy of a trained model in FP32, BF16 and INT8,
served by the real server.

  /usr/bin/python3 benchmarks/models/accuracy.py --numaserve BUILD/bin/numaserve \\
      --model MODEL.onnx [--calibration-size 1024] [--images 10000]

`numaserve quantize` writes MODEL's INT8 (QDQ) twin, calibrated on the
first --calibration-size training images; a repository then holds MODEL
under precision "fp32" and "bf16" (the latter only where the CPU has native
BF16) and the QDQ file, `numaserve serve` loads it, and every test image
(pixels / 255, as training feeds them) goes through gRPC to each. Prints
each variant's accuracy, how often it picks FP32's class and its largest
probability difference from FP32.
"""
import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "clients"))
import numaserve_client as nc  # noqa: E402

DATA = "/usr/share/datasets/fashion-mnist"


def idx(name, header, row):
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        data = f.read()
    return np.frombuffer(data[header:], dtype=np.uint8).reshape(-1, *row)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--numaserve", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--calibration-size", default="1024")
    p.add_argument("--images", type=int, default=10000)
    args = p.parse_args()
    os.environ["NUMASERVE_BIN"] = args.numaserve
    tmp = tempfile.mkdtemp(prefix="numaserve_accuracy_")
    try:
        qdq = os.path.join(tmp, "int8.onnx")
        q = subprocess.run([args.numaserve, "quantize", "--model", args.model, "--calibration",
                            os.path.join(DATA, "train-images-idx3-ubyte.gz"), "--out", qdq,
                            "--calibration-size", args.calibration_size],
                           capture_output=True, text=True)
        if q.returncode != 0:
            sys.exit(q.stderr)
        bf16 = subprocess.run([args.numaserve, "bench", "--model", args.model, "--precision",
                               "bf16", "--batch", "1", "--seconds", "0.01"],
                              capture_output=True, text=True).returncode == 0
        repo = os.path.join(tmp, "repo")
        variants = [("fp32", args.model, 'precision: "fp32"\n')]
        if bf16:
            variants.append(("bf16", args.model, 'precision: "bf16"\n'))
        variants.append(("int8", qdq, ""))
        for name, path, config in variants:
            os.makedirs(os.path.join(repo, name, "1"))
            shutil.copyfile(path, os.path.join(repo, name, "1", "model.onnx"))
            with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
                f.write(config)
        images = idx("t10k-images-idx3-ubyte.gz", 16, (1, 28, 28))[:args.images]
        labels = idx("t10k-labels-idx1-ubyte.gz", 8, ())[:args.images]
        x = images.astype(np.float32) / 255.0
        server = nc.ServerProcess(repo).start()
        try:
            stub = server.stub()
            names = [v[0] for v in variants]
            nc.wait_until(lambda: all(stub.ModelReady(nc.pb.ModelReadyRequest(name=n),
                                                      timeout=10).ready for n in names), 120)
            meta = stub.ModelMetadata(nc.pb.ModelMetadataRequest(name="fp32"), timeout=10)
            input_name, output_name = meta.inputs[0].name, meta.outputs[0].name
            probs = {}
            for n in names:
                probs[n] = np.concatenate([
                    nc.infer(stub, n, {input_name: x[i:i + 500]})[output_name]
                    for i in range(0, len(x), 500)])
        finally:
            server.stop()
        print(f"{args.model}: {len(x)} Fashion-MNIST test images")
        print(f"{'variant':8} {'accuracy':>9} {'same class as FP32':>19} {'largest |p - p_FP32|':>21}")
        for n in names:
            acc = (probs[n].argmax(1) == labels).mean() * 100
            same = (probs[n].argmax(1) == probs["fp32"].argmax(1)).mean() * 100
            diff = np.abs(probs[n] - probs["fp32"]).max()
            print(f"{n:8} {acc:8.2f}% {same:18.2f}% {diff:21.4f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
