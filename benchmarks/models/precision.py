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

The QDQ file is full QDQ where ONNX Runtime needs it (docs/precision.md,
"What the quantizer writes"), and two checks say what ONNX Runtime made of
it: its profile of the file at batch 1 (ort_peer.py profile --json) counts
the convs and matmuls it ran in integer (QLinearConv, ConvInteger,
QLinearMatMul, MatMulInteger, MatMulIntegerToFloat, QGemm) and in float
(Conv, FusedConv, MatMul, FusedMatMul, Gemm), and a model with convs of
which ONNX Runtime ran none in integer fails the run; and numaserve's INT8
outputs (the real server, output_check.numaserve_outputs) are compared
with ONNX Runtime's INT8 outputs of the same file on 2 rows drawn as the
calibration rows are, from output_check's seed, within INT8_AGREEMENT
(nmse and max_rel per model: the engines round some values to the other
side of a quantization step, so they agree within INT8's error, not to
FP32 rounding). A failed check exits 1 after the table.
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


# numaserve's INT8 outputs against ONNX Runtime's on the same QDQ file, per
# model: the largest nmse and max_rel allowed. Measured (2 vCPU Sapphire
# Rapids-class guest, 2026-12-07, ONNX Runtime 1.31.1, batch 2): mlp 7.6e-14
# and 3.4e-7 (ONNX Runtime's QGemm and numaserve's INT8 matmuls give the same
# integers), resnet50 4.0e-5 and 6.8e-3, mobilenetv2 1.7e-3 and 4.3e-2,
# bert_base 4.0e-4 and 1.9e-2. The bounds are about 3x those. MobileNetV2's
# is the widest, and it is ONNX Runtime's: its integer graph is 1.5e-3 (nmse)
# from the file's meaning (the same file run with its optimizations off,
# every QuantizeLinear and DequantizeLinear as written), numaserve's 3.8e-4.
INT8_AGREEMENT = {"mlp": (1e-9, 1e-5), "resnet50": (1.5e-4, 0.02),
                  "mobilenetv2": (5e-3, 0.12), "bert_base": (1.5e-3, 0.06)}
INTEGER_OPS = ("QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger",
               "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QGemm")
FLOAT_OPS = ("Conv", "FusedConv", "NhwcFusedConv", "MatMul", "FusedMatMul", "Gemm",
             "FusedGemm")


def ort_ops(python, qdq, threads):
    """{op type: nodes} of the graph ONNX Runtime ran for QDQ (its profile)."""
    out = subprocess.run([python, output_check.ORT_PEER, "profile", "--model", qdq, "--batch",
                          "1", "--threads", str(threads), "--runs", "2", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["nodes"]


def ort_check(python, numaserve, model, qdq, threads):
    """The lines saying which convs and matmuls ONNX Runtime ran in integer
    and how numaserve's INT8 outputs agree with ONNX Runtime's, and the
    problems (empty when none)."""
    ops = ort_ops(python, qdq, threads)
    integer = {op: n for op, n in ops.items() if op in INTEGER_OPS}
    fp = {op: n for op, n in ops.items() if op in FLOAT_OPS}
    lines = [f"{model}: ONNX Runtime ran integer "
             f"{', '.join(f'{n} {op}' for op, n in sorted(integer.items())) or 'none'}; "
             f"float {', '.join(f'{n} {op}' for op, n in sorted(fp.items())) or 'none'}"]
    problems = []
    import onnx  # Debian's python3-onnx
    has_conv = any(n.op_type == "Conv"
                   for n in onnx.load(qdq, load_external_data=False).graph.node)
    if has_conv and not any(op in integer for op in ("QLinearConv", "ConvInteger")):
        problems.append(f"{model}: ONNX Runtime ran none of the QDQ file's convs in integer")
    # Drawn as the calibration rows are (uniform in [-1, 1)), from the
    # model's fixed seed: inputs outside the calibrated range would be
    # clipped by the input's quantizer, an error of the inputs, not of
    # either engine.
    rng = np.random.default_rng(output_check.INPUT_SEEDS[model])
    x = rng.uniform(-1, 1, (2,) + tuple(output_check.MODELS[model][1])).astype(np.float32)
    ours = output_check.numaserve_outputs(numaserve, {model: qdq}, {model: x})[model]
    theirs = output_check.ort_output(python, qdq, x, threads)
    e = output_check.errors(ours, theirs)
    max_nmse, max_rel = INT8_AGREEMENT.get(model, (5e-3, 0.12))
    lines.append(f"{model}: numaserve INT8 against ONNX Runtime INT8 (batch 2): nmse "
                 f"{e['nmse']:.2e}, max_rel {e['max_rel']:.2e} (bounds {max_nmse:.1e}, "
                 f"{max_rel:.2g})")
    if not (e["nmse"] <= max_nmse and e["max_rel"] <= max_rel):
        problems.append(f"{model}: numaserve's and ONNX Runtime's INT8 outputs differ: {lines[-1]}")
    return lines, problems


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
    checks, ort_lines, problems = [], [], []
    for m in models:
        path = os.path.join(out_dir, m + ".onnx")
        qdq, check = quantize(args.numaserve, m, path, args.threads)
        checks.append(f"{m}: {check}")
        if python:
            lines, found = ort_check(python, args.numaserve, m, qdq, args.threads)
            ort_lines += lines
            problems += found
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
    if ort_lines:
        print("The QDQ files on ONNX Runtime (its profile at batch 1) and its INT8 outputs:")
        for line in ort_lines:
            print("  " + line)
    for p in problems:
        print("precision.py: " + p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
