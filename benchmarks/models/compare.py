#!/usr/bin/python3
"""numaserve vs ONNX Runtime on the benchmark models, in one run.

  /usr/bin/python3 benchmarks/models/compare.py --numaserve BUILD/bin/numaserve
      [--models mlp,resnet50,mobilenetv2,bert_base] [--batch 1,8,32]
      [--threads 2] [--seconds 5] [--wait short|passive|active] [--rounds 3]

Generates missing models (generate.py), runs `numaserve bench --json` and
benchmarks/peers/ort_bench.js --json with the same model, batches and
threads, and prints one table row per model and batch with the ratio
numaserve / ONNX Runtime (throughput; > 1 means numaserve is faster) and
both p50 latencies. Each model runs --rounds times, numaserve and ONNX
Runtime alternated within a round, so that a slow stretch of a shared
machine falls on both; the table shows the medians over the rounds, the
ratio of the medians and the range of the rounds' own ratios. ONNX
Runtime is skipped (ratio "n/a") when benchmarks/peers/node_modules is
missing: `cd benchmarks/peers && npm install --ignore-scripts`.

--wait sets how idle worker threads wait, as the server's --omp-wait does:
"short" (the default) is each engine as it ships: numaserve's workers spin
~1000 pauses (~25 us here) before sleeping (OMP_WAIT_POLICY=passive,
GOMP_SPINCOUNT=1000), ONNX Runtime spins as its default
session.intra_op.allow_spinning=1 does. "passive" sleeps at once in both
(GOMP_SPINCOUNT=0, allow_spinning=0): every operator then pays a thread
wake-up. "active" spins long in both (OMP_WAIT_POLICY=active,
GOMP_SPINCOUNT=10000, allow_spinning=1): the best choice only on dedicated,
idle cores; on shared ones spinning threads steal the working threads'
time slices (measured here: up to 40x slower small batches).
"""
import argparse
import json
import os
import subprocess
import sys
from statistics import median

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = os.path.join(HERE, "..", "peers")
SHAPES = {"mlp": "784", "resnet50": "3,224,224", "mobilenetv2": "3,224,224",
          "bert_base": "128,768"}


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return {r["batch"]: r for r in (json.loads(l) for l in out.splitlines() if l.startswith("{"))}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--numaserve", required=True)
    p.add_argument("--models", default="mlp,resnet50,mobilenetv2,bert_base")
    p.add_argument("--batch", default="1,8,32")
    p.add_argument("--threads", default="2")
    p.add_argument("--seconds", default="5")
    p.add_argument("--wait", choices=["short", "passive", "active"], default="short")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    models = args.models.split(",")
    out_dir = os.path.join(HERE, "out")
    missing = [m for m in models if not os.path.exists(os.path.join(out_dir, m + ".onnx"))]
    if missing:
        subprocess.run([sys.executable, os.path.join(HERE, "generate.py"), "--only", *missing],
                       check=True)
    have_ort = os.path.isdir(os.path.join(PEERS, "node_modules", "onnxruntime-node"))
    print(f"threads {args.threads}, idle threads {args.wait}, {args.rounds} rounds (numaserve and "
          f"ONNX Runtime alternated; medians); ratio = numaserve / ONNX Runtime")
    print(f"{'model':12} {'batch':>5} {'numaserve/s':>12} {'ORT/s':>10} {'ratio':>6} "
          f"{'rounds':>11} {'p50 ms':>8} {'ORT p50':>8} {'GFLOP/s':>8} {'peak':>6}")
    for m in models:
        path = os.path.join(out_dir, m + ".onnx")
        env = dict(os.environ, OMP_WAIT_POLICY="ACTIVE" if args.wait == "active" else "PASSIVE",
                   GOMP_SPINCOUNT={"short": "1000", "passive": "0", "active": "10000"}[args.wait])
        ours, peer = [], []  # one {batch: row} per round
        for _ in range(args.rounds):
            ours.append(run_json([args.numaserve, "bench", "--model", path, "--batch", args.batch,
                                  "--threads", args.threads, "--seconds", args.seconds, "--json"],
                                 env))
            if have_ort:
                peer.append(run_json(["node", os.path.join(PEERS, "ort_bench.js"), "--model",
                                      path, "--shape", SHAPES[m], "--batch", args.batch,
                                      "--threads", args.threads, "--seconds", args.seconds,
                                      "--spin", "0" if args.wait == "passive" else "1",
                                      "--json"]))
        for b in sorted(ours[0]):
            r = {k: median([o[b][k] for o in ours])
                 for k in ("inferences_per_second", "p50_ms", "gflops", "peak_fraction")}
            o = None
            ratio, spread = "n/a", ""
            if peer and all(b in q for q in peer):
                o = {k: median([q[b][k] for q in peer]) for k in ("inferences_per_second", "p50_ms")}
                ratio = f"{r['inferences_per_second'] / o['inferences_per_second']:.2f}"
                # Each round's own ratio (its numaserve run over the ONNX
                # Runtime run right after it): the spread of the median.
                each = [a[b]["inferences_per_second"] / q[b]["inferences_per_second"]
                        for a, q in zip(ours, peer)]
                spread = f"{min(each):.2f}-{max(each):.2f}"
            print(f"{m:12} {b:5d} {r['inferences_per_second']:12.1f} "
                  f"{(o['inferences_per_second'] if o else float('nan')):10.1f} {ratio:>6} "
                  f"{spread:>11} {r['p50_ms']:8.2f} {(o['p50_ms'] if o else float('nan')):8.2f} "
                  f"{r['gflops']:8.1f} {r['peak_fraction']:6.3f}", flush=True)

if __name__ == "__main__":
    main()
