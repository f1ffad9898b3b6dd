#!/usr/bin/python3
"""numaserve vs ONNX Runtime on the benchmark models: same outputs, then speed.

  /usr/bin/python3 benchmarks/models/compare.py --numaserve BUILD/bin/numaserve
      [--models mlp,resnet50,mobilenetv2,bert_base] [--batch 1,8,32]
      [--threads 2] [--seconds 5] [--wait short|passive|active] [--rounds 5]
      [--check-batch 2]

ONNX Runtime is PyPI's `onnxruntime` (CPU provider), pinned with its
wheels' hashes in requirements/peers.txt, in the virtual environment
BUILD/venv/peers that tools/python/venv.sh makes on first use (network
needed once); benchmarks/peers/ort_peer.py runs it. Writes the models that
are missing or stale (generate.py --if-stale), then:

1. Outputs. Each model gets one fixed input of --check-batch rows (2 by
   default, so the batch dimension is exercised; seeded, from
   output_check.py) on the real numaserve (`numaserve serve`, one gRPC
   request) and on ONNX Runtime (ort_peer.py run). One line per model gives
   the largest |output| of ONNX Runtime, numaserve's max abs error, that
   error over the largest |output| (max_rel) and the normalized error
   mse(ort, ours) / mse(ort, 0), and "ok" or "FAIL" against output_check.py's
   bounds (MAX_NMSE, MAX_REL; measured there). A failing model is marked
   FAIL in the speed table too, and compare.py exits 1 at the end, naming it.
2. Cost per call. Both engines on a model of one Identity ([batch, 16]):
   what a call costs each of them with no work in it, printed in
   microseconds, so that a small model's ratio can be read against it.
3. Speed. `numaserve bench --json` and `ort_peer.py bench --json` with the
   same model, batches and threads. Both time calls on inputs and outputs
   allocated once: numaserve's bench in C++ on its buffers, ONNX Runtime
   with IOBinding (OrtValues bound once, run_with_iobinding timed). Each
   model runs --rounds times (5 by default), the engines alternated ABBA
   (numaserve first in even rounds, ONNX Runtime first in odd ones), so that
   neither always runs on a warmer or a quieter machine. One table row per
   model and batch: the medians over the rounds of each engine's throughput
   and p50 latency, the ratio numaserve / ONNX Runtime of the medians (> 1:
   numaserve is faster) and the range of the rounds' own ratios.
   --rounds 0 checks the outputs only.

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

import output_check

HERE = os.path.dirname(os.path.abspath(__file__))


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return {r["batch"]: r for r in (json.loads(l) for l in out.splitlines() if l.startswith("{"))}


def check_outputs(numaserve, python, models, out_dir, batch, threads):
    """{model: "ok" | "FAIL"}, printing one line of errors per model."""
    paths = {m: os.path.join(out_dir, m + ".onnx") for m in models}
    inputs = {m: output_check.model_input(m, batch) for m in models}
    ours = output_check.numaserve_outputs(numaserve, paths, inputs)
    print(f"{'model':12} {'batch':>5} {'max |ORT|':>10} {'max abs err':>12} {'max_rel':>9} "
          f"{'nmse':>9}  outputs")
    verdicts = {}
    for m in models:
        reference = output_check.ort_output(python, paths[m], inputs[m], threads)
        e = output_check.errors(ours[m], reference)
        found = output_check.problems(e)
        verdicts[m] = "FAIL" if found else "ok"
        print(f"{m:12} {batch:5d} {e['max_ref']:10.4g} {e['max_abs']:12.3e} {e['max_rel']:9.2e} "
              f"{e['nmse']:9.2e}  {verdicts[m]}{': ' + '; '.join(found) if found else ''}",
              flush=True)
    return verdicts


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--numaserve", required=True)
    p.add_argument("--models", default="mlp,resnet50,mobilenetv2,bert_base")
    p.add_argument("--batch", default="1,8,32")
    p.add_argument("--threads", default="2")
    p.add_argument("--seconds", default="5")
    p.add_argument("--wait", choices=["short", "passive", "active"], default="short")
    p.add_argument("--rounds", type=int, default=5, help="0: check the outputs only")
    p.add_argument("--check-batch", type=int, default=output_check.REFERENCE_BATCH)
    args = p.parse_args()
    if args.rounds < 0:
        p.error("--rounds must be >= 0")
    if args.check_batch < 1:
        p.error("--check-batch must be >= 1")
    models = args.models.split(",")
    unknown = [m for m in models if m not in output_check.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {','.join(output_check.MODELS)}")
    out_dir = os.path.join(HERE, "out")
    subprocess.run([sys.executable, os.path.join(HERE, "generate.py"), "--out", out_dir,
                    "--if-stale", "--only", *models], check=True, stdout=subprocess.DEVNULL)
    python = output_check.peer_python(output_check.build_dir_of(args.numaserve))
    verdicts = {}
    print(f"outputs at batch {args.check_batch}: numaserve vs ONNX Runtime on the same seeded "
          f"input (bounds: nmse {output_check.MAX_NMSE:.0e}, max_rel {output_check.MAX_REL:.0e})")
    if python:
        print(f"ONNX Runtime {output_check.ort_version(python)} (PyPI, CPU provider)")
        verdicts = check_outputs(args.numaserve, python, models, out_dir, args.check_batch,
                                 args.threads)
    else:
        print("  not checked: ONNX Runtime's environment could not be made (see above)")
    failed = [m for m, v in verdicts.items() if v != "ok"]
    if args.rounds == 0:
        return report(failed)
    env = dict(os.environ, OMP_WAIT_POLICY="ACTIVE" if args.wait == "active" else "PASSIVE",
               GOMP_SPINCOUNT={"short": "1000", "passive": "0", "active": "10000"}[args.wait])
    spin = 0 if args.wait == "passive" else 1

    def ours_cmd(path, batches, seconds):
        return [args.numaserve, "bench", "--model", path, "--batch", batches,
                "--threads", args.threads, "--seconds", seconds, "--json"]

    def peer_cmd(path, batches, seconds):
        return output_check.ort_bench_command(python, path, batches, args.threads, seconds, spin)

    if python:
        identity = output_check.identity_model(out_dir)
        us = {}
        for name, cmd in (("numaserve", ours_cmd), ("ONNX Runtime", peer_cmd)):
            rows = [run_json(cmd(identity, "1", "1"), env)[1] for _ in range(3)]
            us[name] = median([1e6 / r["inferences_per_second"] for r in rows])
        print(f"cost per call (one Identity, batch 1, median of 3 runs of 1 s): numaserve "
              f"{us['numaserve']:.2f} us, ONNX Runtime {us['ONNX Runtime']:.2f} us")
    print(f"threads {args.threads}, idle threads {args.wait}, {args.rounds} rounds (numaserve and "
          f"ONNX Runtime alternated ABBA; medians); ratio = numaserve / ONNX Runtime")
    print(f"{'model':12} {'batch':>5} {'numaserve/s':>12} {'ORT/s':>10} {'ratio':>6} "
          f"{'rounds':>11} {'p50 ms':>8} {'ORT p50':>8} {'GFLOP/s':>8} {'peak':>6}  outputs"
          "   (peak e: effective, Winograd convs counted at their direct FLOPs)")
    for m in models:
        path = os.path.join(out_dir, m + ".onnx")
        ours, peer = [], []  # one {batch: row} per round
        for i in range(args.rounds):
            first_ours = i % 2 == 0
            if first_ours:
                ours.append(run_json(ours_cmd(path, args.batch, args.seconds), env))
            if python:
                peer.append(run_json(peer_cmd(path, args.batch, args.seconds), env))
            if not first_ours:
                ours.append(run_json(ours_cmd(path, args.batch, args.seconds), env))
        print_rows(m, ours, peer, verdicts)
    return report(failed)


def print_rows(m, ours, peer, verdicts):
    """One row per batch: medians over the rounds, ratio, the rounds' range."""
    for b in sorted(ours[0]):
        r = {k: median([o[b][k] for o in ours])
             for k in ("inferences_per_second", "p50_ms", "gflops", "peak_fraction")}
        o = None
        ratio, spread = "n/a", ""
        if peer and all(b in q for q in peer):
            o = {k: median([q[b][k] for q in peer]) for k in ("inferences_per_second", "p50_ms")}
            ratio = f"{r['inferences_per_second'] / o['inferences_per_second']:.2f}"
            # Each round's own ratio (its two runs, back to back): the spread
            # of the median.
            each = [a[b]["inferences_per_second"] / q[b]["inferences_per_second"]
                    for a, q in zip(ours, peer)]
            spread = f"{min(each):.2f}-{max(each):.2f}"
        print(f"{m:12} {b:5d} {r['inferences_per_second']:12.1f} "
              f"{(o['inferences_per_second'] if o else float('nan')):10.1f} {ratio:>6} "
              f"{spread:>11} {r['p50_ms']:8.2f} {(o['p50_ms'] if o else float('nan')):8.2f} "
              f"{r['gflops']:8.1f} {r['peak_fraction']:6.3f}"
              f"{'e' if ours[0][b].get('peak_fraction_kind') == 'effective' else ' '}"
              f"{verdicts.get(m, 'n/a')}",
              flush=True)


def report(failed):
    """The exit status: 1, said loudly, when any model's outputs were wrong."""
    if not failed:
        return 0
    print(f"compare.py: FAIL: the outputs of {', '.join(failed)} differ from ONNX Runtime's "
          f"beyond the bounds (see the outputs table above)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
