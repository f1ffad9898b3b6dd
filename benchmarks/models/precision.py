#!/usr/bin/python3
"""The benchmark models in FP32, BF16 and INT8 on numaserve, and FP32 and
INT8 on ONNX Runtime (the same QDQ file), in one run.

  /usr/bin/python3 benchmarks/models/precision.py --numaserve BUILD/bin/numaserve
      [--models mlp,resnet50,mobilenetv2,bert_base] [--batch 1,32]
      [--threads 2] [--seconds 3] [--rounds 2]

For each model (generate.py writes those missing), `numaserve quantize`
writes benchmarks/models/out/<model>_int8.onnx (QDQ, per-channel INT8
weights, UINT8 activations) calibrated on random inputs drawn as the
benchmark's own inputs are (uniform in [-1, 1)); its report gives the
largest |INT8 - FP32| logit over the largest |FP32| one on the first
calibration batch. Then `numaserve bench --json` runs the FP32 model, the
same model with --precision bf16 (where the CPU has native BF16) and the
QDQ model, and ONNX Runtime (PyPI, pinned in requirements/peers.txt;
benchmarks/peers/ort_peer.py bench, inputs and outputs bound once with
IOBinding) runs the FP32 model and the QDQ model, all five alternated
within each of --rounds rounds, in reverse order in every other round
(the table shows medians). Ratios: INT8 / FP32 on numaserve, and
numaserve INT8 / the faster of ONNX Runtime's FP32 and INT8 on that row
(ORT best: which one it was), so that a file ONNX Runtime runs slower in
"INT8" than in FP32 does not flatter numaserve. peak: the fraction of the INT8 peak (VNNI or AMX
operations per cycle from the CPU model, `numaserve bench`'s figure) the
INT8 model reaches; BF16's of the BF16 peak. On a CPU without VNNI the
QDQ model runs FP32 on its dequantized weights (numaserve's default there,
`bench --int8-kernels`), and the table says so.
"""
import argparse
import json
import os
import subprocess
import sys
from statistics import median

import numpy as np

import output_check

HERE = os.path.dirname(os.path.abspath(__file__))
# Calibration rows per model: enough to see every activation's range on
# random inputs, few enough that calibrating ResNet-50 takes seconds.
CALIBRATION_ROWS = {"mlp": 256, "resnet50": 16, "mobilenetv2": 32, "bert_base": 8}


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {r["batch"]: r for r in rows}


def quantize(numaserve, model, path, threads):
    """Writes <model>_int8.onnx next to the model (again when the model is
    newer); returns its path and the quantizer's output check line."""
    out = path[:-len(".onnx")] + "_int8.onnx"
    shape = output_check.MODELS[model][1]
    calibration = path[:-len(".onnx")] + "_calibration.npy"
    rows = CALIBRATION_ROWS.get(model, 16)
    rng = np.random.default_rng(7)
    np.save(calibration, rng.uniform(-1, 1, (rows,) + tuple(shape)).astype(np.float32))
    result = subprocess.run([numaserve, "quantize", "--model", path, "--calibration", calibration,
                             "--out", out, "--batch", str(min(rows, 8)), "--threads", threads],
                            capture_output=True, text=True)
    os.remove(calibration)
    if result.returncode != 0:
        sys.exit(f"precision.py: quantizing {path} failed:\n{result.stderr}")
    check = [line for line in result.stdout.splitlines() if line.startswith("output ")]
    return out, check[0] if check else ""


def bf16_native(numaserve, path):
    result = subprocess.run([numaserve, "bench", "--model", path, "--precision", "bf16",
                             "--batch", "1", "--seconds", "0.01"], capture_output=True, text=True)
    return result.returncode == 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--numaserve", required=True)
    p.add_argument("--models", default="mlp,resnet50,mobilenetv2,bert_base")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--threads", default="2")
    p.add_argument("--seconds", default="3")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    models = args.models.split(",")
    out_dir = os.path.join(HERE, "out")
    subprocess.run([sys.executable, os.path.join(HERE, "generate.py"), "--out", out_dir,
                    "--if-stale", "--only", *models], check=True, stdout=subprocess.DEVNULL)
    python = output_check.peer_python(output_check.build_dir_of(args.numaserve))
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", GOMP_SPINCOUNT="1000")
    bench = [args.numaserve, "bench", "--batch", args.batch, "--threads", args.threads,
             "--seconds", args.seconds, "--json"]
    if python:
        print(f"ONNX Runtime {output_check.ort_version(python)} (PyPI, CPU provider)")
    print(f"threads {args.threads}, {args.rounds} rounds (engines alternated, order reversed "
          "every other round; medians); inferences/s")
    print(f"{'model':12} {'batch':>5} {'FP32':>9} {'BF16':>9} {'INT8':>9} {'INT8/FP32':>9} "
          f"{'ORT FP32':>9} {'ORT INT8':>9} {'INT8/ORT':>8} {'ORT best':>8} {'INT8 peak':>9} "
          f"{'BF16 peak':>9}")
    checks = []
    for m in models:
        path = os.path.join(out_dir, m + ".onnx")
        qdq, check = quantize(args.numaserve, m, path, args.threads)
        checks.append(f"{m}: {check}")
        with_bf16 = bf16_native(args.numaserve, path)
        runs = {k: [] for k in ("fp32", "bf16", "int8", "ort_fp32", "ort_int8")}
        commands = [("fp32", bench + ["--model", path]), ("int8", bench + ["--model", qdq])]
        if with_bf16:
            commands.insert(1, ("bf16", bench + ["--model", path, "--precision", "bf16"]))
        if python:
            commands += [(key, output_check.ort_bench_command(python, model_path, args.batch,
                                                              args.threads, args.seconds))
                         for key, model_path in (("ort_fp32", path), ("ort_int8", qdq))]
        for i in range(args.rounds):
            for key, cmd in (commands if i % 2 == 0 else commands[::-1]):
                runs[key].append(run_json(cmd, env))

        def med(key, b, field="inferences_per_second"):
            values = [r[b][field] for r in runs[key] if b in r]
            return median(values) if values else float("nan")

        for b in sorted(runs["fp32"][0]):
            fp32, bf16, int8 = med("fp32", b), med("bf16", b), med("int8", b)
            ort32, ort8 = med("ort_fp32", b), med("ort_int8", b)
            best = "INT8" if ort8 >= ort32 else "FP32" if ort32 > ort8 else "n/a"
            print(f"{m:12} {b:5d} {fp32:9.1f} {bf16:9.1f} {int8:9.1f} {int8 / fp32:9.2f} "
                  f"{ort32:9.1f} {ort8:9.1f} {int8 / max(ort32, ort8):8.2f} {best:>8} "
                  f"{med('int8', b, 'peak_fraction'):9.3f} {med('bf16', b, 'peak_fraction'):9.3f}",
                  flush=True)
        # Without VNNI the QDQ model runs FP32 on its dequantized weights by
        # default (bench --int8-kernels), and bench quotes the FP32 peak.
        kinds = {r[b].get("peak_of", "?") for r in runs["int8"] for b in r}
        if kinds != {"INT8"}:
            print(f"{'':12} (INT8 model on {'/'.join(sorted(kinds))} kernels, no VNNI: its peak "
                  "column is of that peak; `bench --int8-kernels on` forces the INT8 kernels)",
                  flush=True)
    print("INT8 against FP32 outputs (the quantizer's check on its first calibration batch):")
    for c in checks:
        print("  " + c)
    return 0


if __name__ == "__main__":
    sys.exit(main())
