"""The Markdown of benchmarks/report/README.md, from make_report.py's data
(the same dict it writes to data.json) and the names of the plots."""
import math

SERVED_PERCENTILES = [("p50_ms", "p50"), ("p90_ms", "p90"), ("p99_ms", "p99"),
                      ("p999_ms", "p99.9")]


def fmt(value, digits=3):
    """A number with `digits` significant digits, thousands as k/M."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    value = float(value)
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale * (1 - 0.5 * 10 ** -digits):  # 999.7 -> "1k"
            return f"{value / scale:.{digits}g}{suffix}"
    if value != 0 and abs(value) < 1e-3:
        return f"{value:.{digits - 1}e}"
    return f"{value:.{digits}g}"


def image(name, alt):
    return f"![{alt}]({name})\n" if name else f"*({alt}: nothing to plot)*\n"


def render(data, figures, sections, cores):
    m = data["machine"]
    lim = data["limits"]
    s = data["settings"]
    peak = lim.get("fp32_gflops_per_core")
    bw = lim.get("memory_gb_per_second")
    out = ["# numaserve performance report\n",
           "<!-- Written by benchmarks/report/make_report.py (`make report`); "
           "edits here are overwritten. -->\n",
           f"- date: {m['date']}",
           f"- CPU (lscpu): `{m['lscpu_model_name']}`",
           f"- cores: {lim.get('cores') or cores} ({m['cpus']} logical CPUs, "
           f"{m['numa_nodes'] if m['numa_nodes'] is not None else '?'} NUMA node"
           f"{'' if m['numa_nodes'] == 1 else 's'})",
           f"- numaserve commit: {m['commit']}"
           f"{' (with uncommitted changes)' if m['uncommitted_changes'] else ''}; binary: "
           f"`{m['numaserve_version']}`",
           f"- FP32 peak: {fmt(peak)} GFLOP/s per core, {fmt(peak * cores if peak else None)} "
           f"for {cores} cores ({lim.get('peak_source') or 'not found'})",
           f"- memory bandwidth: " + (f"{fmt(bw)} GB/s ({lim['bandwidth_source']})" if bw
                                      else lim.get("bandwidth_source") or "not measured"),
           f"- run: `{data['command']}`: {fmt(s['seconds'])} s per point, "
           f"{data['wall_seconds']:.0f} s in all; load average {m['load_before']} before, "
           f"{m.get('load_after', '?')} after (other work on the machine shows here)",
           ""]
    busy = load_of(m["load_before"])
    if busy is not None and busy >= 0.5 * cores:
        out.append(f"**The machine was not idle: load average {busy:g} on {cores} cores when "
                   "the run started. Other processes took cpu time from these measurements, "
                   "most visibly from the points that use every core.**\n")
    if s.get("quick"):
        out.append("**A --quick run: tiny time per point, numbers only to show the report "
                   "works.**\n")
    notes = data.get("notes", {})
    ip = data.get("in_process", {})
    number = 0
    if "batch" in sections:
        number += 1
        out += section_batch(number, ip.get("batch", {}), figures.get("batch"), cores, s,
                             notes.get("ort"))
    if "threads" in sections:
        number += 1
        out += section_threads(number, ip.get("threads", {}), figures.get("threads"), s)
    if "served" in sections:
        number += 1
        out += section_served(number, data.get("served"), figures.get("served"),
                              notes.get("served"))
    if "layouts" in sections:
        number += 1
        out += section_layouts(number, data.get("layouts"), figures.get("layouts"),
                               notes.get("layouts"))
    if "roofline" in sections:
        number += 1
        out += section_roofline(number, data.get("profile"), lim, figures.get("roofline"),
                                data.get("roofline_has_bytes"), cores, data.get("gemm_shapes"))
    return "\n".join(out).rstrip() + "\n"


def load_of(text):
    """The 1-minute load average of "/proc/loadavg"'s first fields."""
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return None


def rate(row):
    return row.get("inferences_per_second") if row else None


def ratio(a, b):
    return f"{a / b:.2f}" if a and b else "n/a"


def section_batch(n, data, figure, cores, s, ort_note):
    out = [f"## {n}. Throughput against batch size\n",
           f"In process, {cores} threads: `numaserve bench --json` and ONNX Runtime "
           "(PyPI's `onnxruntime`, `benchmarks/peers/ort_peer.py bench --json`, CPU provider, "
           "inputs and outputs bound once) with the same model, "
           "batches and threads, idle threads as each engine ships (as "
           "`benchmarks/models/compare.py --wait short`), one run of "
           f"{fmt(s['seconds'])} s per point.",
           "" if not ort_note else f"ONNX Runtime: {ort_note}.", "",
           image(figure, "throughput against batch size"),
           "| model | batch | numaserve inferences/s | ONNX Runtime inferences/s | ratio "
           "| numaserve p50 ms | numaserve GFLOP/s | fraction of peak |",
           "|---|---|---|---|---|---|---|---|"]
    for m, engines in data.items():
        ours = engines.get("numaserve", {})
        peer = engines.get("onnxruntime", {})
        for b in sorted(ours):
            r, o = ours[b], peer.get(b)
            out.append(f"| {m} | {b} | {fmt(rate(r))} | {fmt(rate(o))} | "
                       f"{ratio(rate(r), rate(o))} | {fmt(r.get('p50_ms'))} | "
                       f"{fmt(r.get('gflops'))} | {fmt(r.get('peak_fraction'), 2)} |")
    out.append("\nratio: numaserve / ONNX Runtime throughput (> 1: numaserve is faster). "
               "`make bench` (compare.py) repeats each point in alternated rounds and gives "
               "the spread.\n")
    return out


def section_threads(n, data, figure, s):
    out = [f"## {n}. Throughput against threads\n",
           "In process at batch "
           + ", ".join(f"{s['thread_batch'][m]} ({m})" for m in s["models"]
                       if m in s["thread_batch"])
           + ", threads "
           f"{', '.join(map(str, s['threads']))}, both engines as above. The dashed line is "
           "numaserve's one-thread throughput times the threads (linear scaling).\n",
           image(figure, "throughput against threads"),
           "| model | threads | numaserve inferences/s | speed-up over 1 thread | "
           "ONNX Runtime inferences/s | ratio |",
           "|---|---|---|---|---|---|"]
    for m, engines in data.items():
        ours = engines.get("numaserve", {})
        peer = engines.get("onnxruntime", {})
        one = rate(ours.get(1)) if ours.get(1) else None
        for t in sorted(ours):
            r, o = ours[t], peer.get(t)
            out.append(f"| {m} | {t} | {fmt(rate(r))} | {ratio(rate(r), one)} | "
                       f"{fmt(rate(o))} | {ratio(rate(r), rate(o))} |")
    out.append("")
    return out


def section_served(n, served, figure, note):
    out = [f"## {n}. Served latency under load\n"]
    if not served:
        out.append(f"Not measured: {note or 'no data'}.\n")
        return out
    split = ("the worker on cpu " + ",".join(map(str, served["compute_cpus"])) +
             ", the server's front end and the load generator on cpu " +
             ",".join(map(str, served["front_cpus"])) + " (as `serving_bench.sh` splits them)"
             if served.get("compute_cpus") else "nothing pinned (one cpu)")
    out += [f"`numaserve serve` with `{served['model']}` (max_batch_size "
            f"{served['max_batch_size']}, max_queue_delay {served['max_queue_delay_us']} us), "
            f"driven by `grpc_loadgen` over loopback, {served['rows_per_request']} row per "
            f"request; {split}. Loads: one caller in closed loop, many callers over 4 "
            "connections (saturation), and open loops at fixed fractions of the saturation "
            "rate (latency counted from each request's scheduled send time, so a backlog "
            "shows). Markers: the load generator's p50, p90, p99 and p99.9 (from sending a "
            "request to its answer; it prints no other points). Dotted steps: the "
            "server's `numaserve_request_duration_seconds` histogram over the same run (from "
            "receiving a request to answering it, Prometheus bucket bounds; includes the "
            "run's warm-up).\n",
            image(figure, "served latency CDF"),
            "| load | requests/s | rows/s | p50 / p90 / p99 / p99.9 ms | errors |",
            "|---|---|---|---|---|"]
    for r in served["runs"]:
        out.append(f"| {r['load']} | {fmt(r.get('requests_per_second'))} | "
                   f"{fmt(r.get('rows_per_second'))} | "
                   + " / ".join(fmt(r.get(k)) for k, _ in SERVED_PERCENTILES)
                   + f" | {r.get('errors', 'n/a')} |")
    out.append("")
    return out


def section_layouts(n, layouts, figure, note):
    out = [f"## {n}. Throughput against workers and instances\n"]
    if not layouts or not layouts.get("rows"):
        out.append(f"Not measured: {note or 'scaleout_bench.sh printed no summary'}.\n")
        return out
    out += ["`benchmarks/e2e/scaleout_bench.sh` as it is (CASES "
            f"`{layouts.get('cases', '')}`, {fmt(layouts.get('seconds'))} s per run): one "
            "server per layout, closed loop with enough callers to keep every instance busy, "
            "one row per request. (a) one single-core worker per core, (b) one worker with an "
            "instance per core, (c) one worker with one instance on all cores, (d) `--instances "
            "auto`. The reference is `numaserve bench` in process (cores x the one-thread rate "
            "for (a) and (b), all threads for (c), the better for (d)); the load generator and "
            "the front end share the cores with the workers.\n",
            image(figure, "throughput against workers and instances"),
            "| model | layout | served rows/s | in-process reference rows/s | ratio | "
            "p50 / p99 ms | mean batch |",
            "|---|---|---|---|---|---|---|"]
    for r in layouts["rows"]:
        out.append(f"| {r['model']} | {r['layout']} | {fmt(r['served'])} | "
                   f"{fmt(r['reference'])} ({r['reference_kind']}) | {fmt(r['ratio'], 2)} | "
                   f"{fmt(r['p50_ms'])} / {fmt(r['p99_ms'])} | {fmt(r['batch'])} |")
    out.append("")
    return out


def section_roofline(n, profile, lim, figure, has_bytes, cores, gemms=None):
    out = [f"## {n}. Roofline\n"]
    runs = (profile or {}).get("runs", [])
    if not runs:
        out.append("Not measured.\n")
        return out
    peak = (lim.get("fp32_gflops_per_core") or 0) * cores
    bw = lim.get("memory_gb_per_second")
    source = ("`numaserve profile --json`" if profile["source"] == "profile"
              else "`numaserve bench --profile --json` (this numaserve has no profile command)")
    out.append(f"Every compiled step of each model, timed by {source} on {cores} threads. "
               f"Roofs: FP32 peak {fmt(peak)} GFLOP/s ({cores} cores x "
               f"{fmt(lim.get('fp32_gflops_per_core'))}) and "
               + (f"memory bandwidth {fmt(bw)} GB/s x intensity ({lim['bandwidth_source']})."
                  if bw else f"memory bandwidth {lim.get('bandwidth_source') or 'not measured'}"
                  " (no memory roof drawn).")
               + " Steps that run on one thread have one core's peak, and a step whose data "
               "stays in cache can pass the memory roof (it is DRAM's).\n")
    if not has_bytes:
        out.append("**This numaserve gives no bytes per step: the plot shows achieved GFLOP/s "
                   "per step against the compute roof only (no intensity, no memory roof).**\n")
    out.append(image(figure, "roofline"))
    out += ["| model | batch | steps | time per run ms | GFLOP per run | GFLOP/s | "
            "fraction of peak | intensity FLOP/byte | steps under the memory roof's ridge |",
            "|---|---|---|---|---|---|---|---|---|"]
    ridge = peak / bw if peak and bw else None
    for r in runs:
        t = r["totals"]
        sec, flops, bytes_ = t.get("seconds"), t.get("flops"), t.get("bytes")
        gflops = flops / sec / 1e9 if flops and sec else None
        steps = [x for x in r["steps"] if x.get("flops")]
        memory = (sum(1 for x in steps if x.get("bytes") and x["flops"] / x["bytes"] < ridge)
                  if ridge and has_bytes else None)
        out.append(f"| {r['model']} | {r['batch']} | {len(r['steps'])} | "
                   f"{fmt(sec * 1e3 if sec else None)} | {fmt(flops / 1e9 if flops else None)} | "
                   f"{fmt(gflops)} | {fmt(gflops / peak if gflops and peak else None, 2)} | "
                   f"{fmt(flops / bytes_ if flops and bytes_ else None)} | "
                   f"{'n/a' if memory is None else f'{memory} of {len(steps)}'} |")
    out.append("\nsteps under the ridge: steps with FLOPs whose intensity is below peak / "
               "bandwidth (memory-bound on this machine); steps without FLOPs (copies, "
               "reorders) are not plotted.\n")
    if gemms:
        out += ["GEMM shapes (black crosses): a model of one MatMul `y[M,N] = x[M,K] @ W[K,N]` "
                "profiled at batch M, its weights and input read and its output written once "
                "per call.\n",
                "| M x K x N | GFLOP per call | MB per call | intensity FLOP/byte | time ms | "
                "GFLOP/s | fraction of the roof |",
                "|---|---|---|---|---|---|---|"]
        for g in gemms:
            flops, bytes_, sec, gf = g.get("flops"), g.get("bytes"), g.get("seconds"), g.get(
                "gflops")
            ai = flops / bytes_ if flops and bytes_ else None
            roof = min(peak, ai * bw) if ai and peak and bw else (peak or None)
            out.append(f"| {g['m']} x {g['k']} x {g['n']} | {fmt(flops / 1e9 if flops else None)} "
                       f"| {fmt(bytes_ / 1e6 if bytes_ else None)} | {fmt(ai)} | "
                       f"{fmt(sec * 1e3 if sec else None)} | {fmt(gf)} | "
                       f"{fmt(gf / roof if gf and roof else None, 2)} |")
        out.append("")
    return out
