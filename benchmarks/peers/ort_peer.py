"""ONNX Runtime (PyPI `onnxruntime`, CPU provider), the peer numaserve is
measured against. Runs under the peers' virtual environment
(requirements/peers.txt, `make venv-peers`), never Debian's python:

  python ort_peer.py bench --model PATH [--batch 1,8,32] [--threads N]
                           [--seconds S] [--spin 0|1] [--json]
  python ort_peer.py run --model PATH --input IN.npy --output OUT.npy [--threads N]
  python ort_peer.py profile --model PATH [--batch 32] [--threads 2] [--runs 20]
                             [--spin 0|1] [--top 15] [--json]
  python ort_peer.py version

bench: the same measurement as `numaserve bench`, with the same care on
both sides. numaserve's bench runs the engine on input and output buffers
allocated once; here the input is an OrtValue made once and the outputs
are OrtValues allocated once, all bound with IOBinding, and each timed
call is run_with_iobinding alone: no per-call conversion from NumPy, no
output allocation. Inputs are uniform in [-1, 1) as numaserve's bench
draws them; every dim but the first is taken from the model (a dynamic one
is an error naming it). One JSON object per batch with the keys numaserve
bench uses (inferences_per_second, p50_ms, p99_ms, iterations).

run: one inference, the model's first input from a .npy file, its first
output to one (the peer side of the output checks).

profile: ONNX Runtime's own per-operator profile, summed by operator type
and by node, in ms per run, the way `numaserve bench --profile` prints
numaserve's. With --json, one JSON object instead: per operator type of
the optimized graph that ran, its nodes ("nodes") and ms per run ("ms"),
which says whether a QDQ file's convs ran in integer (QLinearConv,
ConvInteger) or in float (Conv).

--spin 0 stops idle intra-op threads from spinning
(session.intra_op.allow_spinning=0), the counterpart of numaserve's
OMP_WAIT_POLICY=passive with GOMP_SPINCOUNT=0.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

# The input element types the benchmark models use (others are refused by name).
NUMPY_TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64,
               "tensor(int32)": np.int32, "tensor(uint8)": np.uint8, "tensor(int8)": np.int8}


def session(model, threads, spin, profile=False):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads > 0:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", str(spin))
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="numaserve_ort_"),
                                                   "profile")
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def row_shape(node_arg):
    """The input's shape without its first dim; a dynamic one is an error."""
    dims = node_arg.shape[1:]
    for i, d in enumerate(dims, start=1):
        if not isinstance(d, int) or d < 0:
            sys.exit(f"ort_peer: input '{node_arg.name}' has dynamic dim {i} ({d!r}); "
                     "only the first may be dynamic")
    return dims


def random_input(node_arg, batch, rng, bounds=None):
    """Floats in [-1, 1); integers 0 or 1, or below their bound where BOUNDS
    ({input name: bound}, --index-bounds) names them."""
    kind = NUMPY_TYPES.get(node_arg.type)
    if kind is None:
        sys.exit(f"ort_peer: input '{node_arg.name}' has type {node_arg.type}; "
                 f"supported: {', '.join(NUMPY_TYPES)}")
    shape = (batch, *row_shape(node_arg))
    if kind == np.float32:
        return rng.uniform(-1, 1, shape).astype(np.float32)
    return rng.integers(0, (bounds or {}).get(node_arg.name, 2), shape).astype(kind)


def bound(sess, batch, rng, bounds=None):
    """An IOBinding holding every input (random) and every output
    (allocated once, at the shapes one plain run gives)."""
    feeds = {i.name: random_input(i, batch, rng, bounds) for i in sess.get_inputs()}
    outputs = sess.run(None, feeds)
    binding = sess.io_binding()
    keep = []  # the OrtValues must outlive the binding's use
    for name, array in feeds.items():
        value = ort.OrtValue.ortvalue_from_numpy(array)
        keep.append(value)
        binding.bind_ortvalue_input(name, value)
    for node_arg, array in zip(sess.get_outputs(), outputs):
        value = ort.OrtValue.ortvalue_from_numpy(np.empty_like(array))
        keep.append(value)
        binding.bind_ortvalue_output(node_arg.name, value)
    return binding, keep


def parse_index_bounds(text):
    """--index-bounds "name=bound,..." as {name: bound}."""
    bounds = {}
    for part in filter(None, (text or "").split(",")):
        name, _, value = part.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            sys.exit(f"ort_peer: --index-bounds: '{part}' is not a name, '=' and a bound >= 1")
        bounds[name] = int(value)
    return bounds


def percentile(ordered, q):
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench(args):
    sess = session(args.model, args.threads, args.spin)
    rng = np.random.default_rng(1)
    bounds = parse_index_bounds(args.index_bounds)
    for batch in (int(b) for b in args.batch.split(",")):
        binding, keep = bound(sess, batch, rng, bounds)
        for _ in range(2):
            sess.run_with_iobinding(binding)
        latencies = []
        start = now = time.perf_counter()
        while len(latencies) < 5 or now - start < args.seconds:
            t0 = time.perf_counter()
            sess.run_with_iobinding(binding)
            now = time.perf_counter()
            latencies.append(now - t0)
        del keep
        latencies.sort()
        result = {"model": args.model, "batch": batch, "threads": args.threads,
                  "iterations": len(latencies),
                  "inferences_per_second": batch * len(latencies) / (now - start),
                  "p50_ms": percentile(latencies, 0.5) * 1e3,
                  "p99_ms": percentile(latencies, 0.99) * 1e3,
                  "onnxruntime": ort.__version__}
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{args.model} batch {batch}: {result['inferences_per_second']:.1f} infer/s, "
                  f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms", flush=True)


def run(args):
    sess = session(args.model, args.threads, 1)
    array = np.load(args.input)
    first = sess.get_inputs()[0]
    outputs = sess.run([sess.get_outputs()[0].name], {first.name: array})
    np.save(args.output, outputs[0])


def profile(args):
    sess = session(args.model, args.threads, args.spin, profile=True)
    rng = np.random.default_rng(1)
    binding, keep = bound(sess, args.batch, rng)
    for _ in range(args.runs):
        sess.run_with_iobinding(binding)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    by_type, by_node = {}, {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        node = e["name"][:-len("_kernel_time")]
        by_type[op] = by_type.get(op, 0.0) + e["dur"] / 1e3
        by_node[(node, op)] = by_node.get((node, op), 0.0) + e["dur"] / 1e3
    total = sum(by_type.values())
    # The first run is the warm-up bound() made; the timed ones follow it.
    runs = args.runs + 1
    if args.json:
        nodes = {}
        for _, op in by_node:
            nodes[op] = nodes.get(op, 0) + 1
        print(json.dumps({"nodes": nodes, "ms": {op: ms / runs for op, ms in by_type.items()}}))
        del keep
        return
    print(f"ONNX Runtime {ort.__version__}: {args.model}, batch {args.batch}, "
          f"{args.threads} threads, {total / runs:.3f} ms per run in kernels")
    print(f"{'op type':24} {'ms/run':>8} {'share':>6}")
    for op, ms in sorted(by_type.items(), key=lambda kv: -kv[1]):
        print(f"{op:24} {ms / runs:8.3f} {ms / total:6.1%}")
    print(f"{'node':40} {'op':16} {'ms/run':>8} {'share':>6}")
    for (node, op), ms in sorted(by_node.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{node[:40]:40} {op[:16]:16} {ms / runs:8.3f} {ms / total:6.1%}")
    del keep


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--model", required=True)
    b.add_argument("--batch", default="1,8,32")
    b.add_argument("--threads", type=int, default=0)
    b.add_argument("--seconds", type=float, default=3)
    b.add_argument("--spin", type=int, choices=[0, 1], default=1)
    b.add_argument("--json", action="store_true")
    b.add_argument("--index-bounds", default="",
                   help="integer inputs drawn below a bound: name=bound,... (others 0 or 1)")
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--input", required=True)
    r.add_argument("--output", required=True)
    r.add_argument("--threads", type=int, default=0)
    f = sub.add_parser("profile")
    f.add_argument("--model", required=True)
    f.add_argument("--batch", type=int, default=32)
    f.add_argument("--threads", type=int, default=2)
    f.add_argument("--runs", type=int, default=20)
    f.add_argument("--spin", type=int, choices=[0, 1], default=0)
    f.add_argument("--top", type=int, default=15)
    f.add_argument("--json", action="store_true")
    sub.add_parser("version")
    args = p.parse_args()
    if args.command == "version":
        print(ort.__version__)
    else:
        {"bench": bench, "run": run, "profile": profile}[args.command](args)


if __name__ == "__main__":
    main()
