#!/usr/bin/python3
"""`make report`: the engine and serving benchmarks of this machine in one
Markdown report with PNG plots, written to benchmarks/report/.

  /usr/bin/python3 benchmarks/report/make_report.py [--build build/release]
      [--out benchmarks/report] [--seconds 1] [--quick]
      [--models mlp,resnet50,mobilenetv2,bert_base] [--batches 1,2,4,8,16,32]
      [--thread-batch 8]
      [--threads 1,2] [--sections batch,threads,served,layouts,roofline]

Sections (each a plot, a table of its numbers and how they were measured):
  batch     in-process throughput against batch size, numaserve (`numaserve
            bench --json`) and ONNX Runtime (benchmarks/peers/ort_peer.py bench),
            with the settings of benchmarks/models/compare.py, on all cores
  threads   the same against threads, 1 to the machine's cores
  served    the real server under load (grpc_loadgen: 1 caller, saturation,
            open loop at half of it): the latency CDF from the load
            generator's percentiles and the server's latency histogram
  layouts   served throughput against workers and instances: the layouts of
            benchmarks/e2e/scaleout_bench.sh (run as it is, its summary read)
  roofline  each compiled step of each model (`numaserve profile --json`)
            as a point, arithmetic intensity against GFLOP/s, under this
            machine's roofs: FP32 peak and memory bandwidth (`numaserve
            topology --measure --json`)

Writes OUT/README.md, OUT/*.png (matplotlib, Agg backend, 100 dpi) and
OUT/data.json (every figure the plots were made from; --replot draws the
plots and writes README.md again from it, measuring nothing). --quick is
the short run of the test (tests/report): the MLP only, two batches, a
fraction of a second per point. ONNX Runtime (PyPI, BUILD/venv/peers, made
by tools/python/venv.sh) is left out, and said so, where its environment
cannot be made; --quick uses it only if it is already there.

Needs Debian's python3-matplotlib (deploy/install-deps.sh installs it);
without it this exits 3 after saying so.
"""
import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import markdown_report  # noqa: E402
import measure  # noqa: E402

MISSING_MATPLOTLIB = 3
SECTIONS = ["batch", "threads", "served", "layouts", "roofline"]
ALL_MODELS = "mlp,resnet50,mobilenetv2,bert_base"
# Defaults of the models with several GFLOP per row: (largest batch of the
# batch sweep, batch of the threads sweep).
HEAVY = {"resnet50": (16, 2), "bert_base": (16, 2)}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(measure.SOURCE_DIR, "build", "release"),
                   help="build tree with bin/numaserve and bin/grpc_loadgen")
    p.add_argument("--out", default=HERE, help="where README.md, the PNGs and data.json go")
    p.add_argument("--quick", action="store_true",
                   help="a short run (the test's): the MLP only, tiny time per point")
    p.add_argument("--seconds", type=float, default=None,
                   help="measured seconds per point (default 1; --quick 0.05)")
    p.add_argument("--models", default=None, help=f"benchmark models (default {ALL_MODELS})")
    p.add_argument("--models-dir", default=os.path.join(measure.BENCH_MODELS, "out"),
                   help="where generate.py writes the models (missing or stale ones are "
                        "written first)")
    p.add_argument("--batches", default=None,
                   help="batch sizes, for every model (default 1,2,4,8,16,32; 1,2,4,8,16 "
                        "for ResNet-50 and BERT-base)")
    p.add_argument("--threads", default=None, help="thread counts (default 1 to the cores)")
    p.add_argument("--thread-batch", type=int, default=None,
                   help="batch of the throughput-per-threads runs, for every model "
                        "(default 8; 2 for ResNet-50 and BERT-base)")
    p.add_argument("--profile-batches", default=None,
                   help="batches of the roofline's profiles (default 1,8)")
    p.add_argument("--serve-model", default="mlp", help="the model of the served runs")
    p.add_argument("--serve-seconds", type=float, default=None,
                   help="seconds per served load (default 2 x --seconds, at least 1)")
    p.add_argument("--layout-cases", default=None,
                   help="scaleout_bench.sh CASES (default: resnet50 at max batch 8, "
                        "mobilenetv2 at 16, those of --models)")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"which sections to run ({','.join(SECTIONS)})")
    p.add_argument("--no-ort", action="store_true", help="leave ONNX Runtime out")
    p.add_argument("--no-measure", action="store_true",
                   help="do not measure the memory bandwidth (roof 'not measured')")
    p.add_argument("--replot", action="store_true",
                   help="measure nothing: the plots and README.md again from OUT/data.json")
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    q = args.quick
    # scaleout_bench.sh runs in the source tree: paths from here on absolute.
    args.build = os.path.abspath(args.build)
    args.models_dir = os.path.abspath(args.models_dir)
    if args.seconds is None:
        args.seconds = 0.05 if q else 1.0
    if args.models is None:
        args.models = "mlp" if q else ALL_MODELS
    # Per model: the heavy ones (several GFLOP per row, seconds per run at
    # batch 32 on 2 cores, and every point runs at least 5 times) stop at a
    # smaller batch, so the full run stays near 10 minutes on 2 cores.
    explicit_batches = args.batches
    if args.batches is None:
        args.batches = "1,2" if q else "1,2,4,8,16,32"
    if args.threads is None:
        args.threads = ",".join(str(t) for t in range(1, cores + 1))
    explicit_thread_batch = args.thread_batch
    if args.thread_batch is None:
        args.thread_batch = 2 if q else 8
    if args.profile_batches is None:
        args.profile_batches = "2" if q else "1,8"
    if args.serve_seconds is None:
        args.serve_seconds = 0.3 if q else max(1.0, 2 * args.seconds)
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in measure.output_check.MODELS]
    if unknown:
        p.error(f"unknown models {unknown}; known: {ALL_MODELS}")
    args.batches = ints(p, "--batches", args.batches)
    args.batches_of = {m: args.batches if explicit_batches or q or m not in HEAVY
                       else [b for b in args.batches if b <= HEAVY[m][0]] for m in args.models}
    args.thread_batch_of = {m: args.thread_batch if explicit_thread_batch or q or m not in HEAVY
                            else HEAVY[m][1] for m in args.models}
    args.threads = ints(p, "--threads", args.threads)
    args.profile_batches = ints(p, "--profile-batches", args.profile_batches)
    args.sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in args.sections if s not in SECTIONS]
    if bad:
        p.error(f"unknown sections {bad}; known: {','.join(SECTIONS)}")
    if args.layout_cases is None:
        sizes = {"resnet50": 8, "mobilenetv2": 16}
        chosen = [m for m in ("resnet50", "mobilenetv2") if m in args.models] or [args.models[0]]
        # Relative to the source tree where they are in it (scaleout_bench.sh
        # runs there), so the report shows short paths.
        where = os.path.abspath(args.models_dir)
        if where.startswith(measure.SOURCE_DIR + os.sep):
            where = os.path.relpath(where, measure.SOURCE_DIR)
        args.layout_cases = " ".join(
            f"{m}={os.path.join(where, m + '.onnx')}:{sizes.get(m, 8)}" for m in chosen)
    return args


def ints(p, name, text):
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        p.error(f"{name}: a comma-separated list of integers, not {text!r}")
    if not values or min(values) < 1:
        p.error(f"{name}: positive integers")
    return values


def finite(value):
    """VALUE with NaN and infinities as None (strict JSON), keys as strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def ensure_peer(quick, build):
    """(python of ONNX Runtime's environment or None, why not): BUILD's
    venv/peers, made as compare.py makes it where missing (not in --quick:
    the test must not download; an environment already there is used)."""
    python = os.path.join(build, "venv", "peers", "bin", "python")
    if quick:
        if os.access(python, os.X_OK):
            return python, ""
        return None, "not installed (--quick does not install it: make venv-peers)"
    measure.log("ONNX Runtime from PyPI (tools/python/venv.sh BUILD peers)")
    python = measure.output_check.peer_python(build)
    if not python:
        return None, "not installed: tools/python/venv.sh could not make its environment"
    return python, ""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        import plots
    except ImportError as e:
        print(f"make_report: matplotlib is missing ({e}): apt-get install python3-matplotlib "
              "(deploy/install-deps.sh, which `make report` and `make test` run, installs it)",
              file=sys.stderr)
        return MISSING_MATPLOTLIB
    if args.replot:
        path = os.path.join(args.out, "data.json")
        if not os.path.isfile(path):
            print(f"make_report: --replot: {path} missing", file=sys.stderr)
            return 1
        with open(path) as f:
            data = int_keys(json.load(f))
        data.setdefault("sections", SECTIONS)
        data.setdefault("cores", max(data["settings"]["threads"]))
    else:
        data = measure_all(args, argv)
        if data is None:
            return 1
    figures = write_report(plots, data, args.out)
    measure.log(f"wrote {os.path.join(args.out, 'README.md')} and "
                f"{len([v for v in figures.values() if v])} plots"
                + ("" if args.replot else f" in {data['wall_seconds']} s"))
    return 0


def measure_all(args, argv):
    """Every measurement of the sections asked for, as one dict (data.json)."""
    numaserve = os.path.join(args.build, "bin", "numaserve")
    loadgen_bin = os.path.join(args.build, "bin", "grpc_loadgen")
    if not os.access(numaserve, os.X_OK):
        print(f"make_report: {numaserve} missing (build first: make build)", file=sys.stderr)
        return None
    started = time.time()
    cores = max(args.threads)
    data = {"command": "make_report.py " + " ".join(shlex.quote(a) for a in argv),
            "machine": measure.machine(numaserve),
            "sections": args.sections,
            "cores": cores,
            "settings": {"seconds": args.seconds, "models": args.models,
                         "batches": args.batches_of, "threads": args.threads,
                         "thread_batch": args.thread_batch_of,
                         "profile_batches": args.profile_batches,
                         "serve_seconds": args.serve_seconds, "quick": args.quick},
            "notes": {}}
    measure.generate_models(args.models_dir, sorted(set(args.models + [args.serve_model])))
    with_ort = False
    if args.no_ort:
        data["notes"]["ort"] = "left out (--no-ort)"
    elif {"batch", "threads"} & set(args.sections):
        with_ort, why = ensure_peer(args.quick, args.build)
        if not with_ort:
            data["notes"]["ort"] = why
            measure.log(f"ONNX Runtime {why}: numaserve only")
    data["limits"] = measure.limits(numaserve, measure=not args.no_measure)

    if {"batch", "threads"} & set(args.sections):
        data["in_process"] = measure.in_process(
            numaserve, args.models_dir, args.models, args.batches_of, args.threads,
            args.thread_batch_of, args.seconds, with_ort)
    if "served" in args.sections:
        if os.access(loadgen_bin, os.X_OK):
            try:
                data["served"] = measure.served(
                    numaserve, loadgen_bin, args.serve_model,
                    measure.model_path(args.models_dir, args.serve_model), args.serve_seconds)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                data["notes"]["served"] = f"failed: {e}"
                measure.log(f"served: {e}")
        else:
            data["notes"]["served"] = f"{loadgen_bin} missing (benchmarks not built)"
    if "layouts" in args.sections:
        if os.access(loadgen_bin, os.X_OK):
            seconds = args.serve_seconds
            measure.log(f"layouts: scaleout_bench.sh, CASES={args.layout_cases}")
            try:
                data["layouts"] = measure.layouts(args.build, args.layout_cases, seconds,
                                                  min(3.0, seconds))
                data["layouts"]["cases"] = args.layout_cases
                data["layouts"]["seconds"] = seconds
                del data["layouts"]["output"]  # its summary is in "rows"
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                data["notes"]["layouts"] = f"failed: {e}"
                measure.log(f"layouts: {e}")
        else:
            data["notes"]["layouts"] = f"{loadgen_bin} missing (benchmarks not built)"
    if "roofline" in args.sections:
        data["profile"] = measure.profile(numaserve, args.models_dir, args.models,
                                          args.profile_batches, cores,
                                          max(0.05, args.seconds))
        if measure.has_command(numaserve, "profile"):
            data["gemm_shapes"] = measure.gemm_shapes(
                numaserve, measure.QUICK_GEMM_SHAPES if args.quick else measure.GEMM_SHAPES,
                cores, max(0.05, args.seconds))
    data["machine"]["load_after"] = measure.load_average()
    data["wall_seconds"] = round(time.time() - started, 1)
    return data


def write_report(plots, data, out):
    """The plots, data.json and README.md into OUT; {section: PNG name}."""
    os.makedirs(out, exist_ok=True)
    sections, cores = data["sections"], data["cores"]
    figures = {}
    ip = data.get("in_process", {})
    # The models in the order they were asked for (as measured, and as
    # data.json keeps them).
    order = data["settings"]["models"]
    for key in ("batch", "threads"):
        if key in ip:
            ip[key] = {m: ip[key][m] for m in sorted(ip[key], key=lambda m: (
                order.index(m) if m in order else len(order), m))}
    if "batch" in sections:
        figures["batch"] = plots.throughput_vs_batch(ip.get("batch", {}), out, cores)
    if "threads" in sections:
        figures["threads"] = plots.throughput_vs_threads(ip.get("threads", {}), out,
                                                         data["settings"]["thread_batch"])
    if "served" in sections:
        figures["served"] = plots.latency_cdf(data.get("served"), out)
    if "layouts" in sections:
        figures["layouts"] = plots.throughput_vs_layout(data.get("layouts"), out)
    if "roofline" in sections:
        figures["roofline"], data["roofline_has_bytes"] = plots.roofline(
            data.get("profile"), data["limits"], out, cores, data.get("gemm_shapes"))
    with open(os.path.join(out, "data.json"), "w") as f:
        json.dump(finite(data), f, indent=1, default=str, allow_nan=False)
        f.write("\n")
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(markdown_report.render(data, figures, sections, cores))
    return figures


def int_keys(value):
    """data.json as read back: the keys that were integers (batches,
    threads) integers again."""
    if isinstance(value, dict):
        return {(int(k) if isinstance(k, str) and k.isdigit() else k): int_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [int_keys(v) for v in value]
    return value


if __name__ == "__main__":
    sys.exit(main())
