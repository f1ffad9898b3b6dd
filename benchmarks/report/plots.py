"""The report's plots, from the data measure.py returns: one PNG each,
matplotlib on its Agg backend (no display), 100 dpi to keep the committed
files small. Each function returns the file name it wrote (None when there
was nothing to plot)."""
import io
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullLocator, ScalarFormatter  # noqa: E402

DPI = 100
ENGINES = {"numaserve": ("numaserve", "tab:blue", "o"),
           "onnxruntime": ("ONNX Runtime", "tab:orange", "s")}
MODEL_COLORS = ["tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:olive"]


def _grid(n, width=5.2, height=3.6):
    cols = min(n, 2)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _save(fig, out_dir, name, rect=(0, 0, 1, 1)):
    """Writes FIG as OUT_DIR/NAME: a PNG of 256 colours (Pillow, which
    matplotlib depends on) where Pillow quantizes, about a third of the
    size of matplotlib's RGBA file, which is written otherwise."""
    fig.tight_layout(rect=rect)
    path = os.path.join(out_dir, name)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    plt.close(fig)
    try:
        from PIL import Image
        buffer.seek(0)
        Image.open(buffer).convert("RGB").quantize(colors=256).save(path, optimize=True)
    except (ImportError, OSError, ValueError):
        with open(path, "wb") as f:
            f.write(buffer.getvalue())
    return name


def _rate(row):
    return row.get("inferences_per_second") if row else None


def throughput_vs_batch(data, out_dir, threads):
    models = list(data)
    if not models:
        return None
    fig, axes = _grid(len(models))
    for ax, m in zip(axes, models):
        for engine, rows in data[m].items():
            label, color, marker = ENGINES[engine]
            points = sorted((b, _rate(r)) for b, r in rows.items() if _rate(r))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker,
                        color=color, label=label)
        ax.set_xscale("log", base=2)
        batches = sorted({b for rows in data[m].values() for b in rows})
        ax.set_xticks(batches)
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_ylim(bottom=0)
        ax.set_title(f"{m} ({threads} threads)")
        ax.set_xlabel("batch size (rows per run)")
        ax.set_ylabel("throughput (inferences/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("In-process throughput against batch size")
    return _save(fig, out_dir, "throughput_vs_batch.png")


def throughput_vs_threads(data, out_dir, batch_of):
    models = list(data)
    if not models:
        return None
    fig, axes = _grid(len(models))
    for ax, m in zip(axes, models):
        top = 1
        for engine, rows in data[m].items():
            label, color, marker = ENGINES[engine]
            points = sorted((t, _rate(r)) for t, r in rows.items() if _rate(r))
            if not points:
                continue
            top = max(top, points[-1][0])
            ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker,
                    color=color, label=label)
            if engine == "numaserve" and points[0][0] == 1:
                ts = [p[0] for p in points]
                ax.plot(ts, [points[0][1] * t for t in ts], linestyle="--", color=color,
                        alpha=0.5, label="numaserve, linear from 1 thread")
        ax.set_xticks(range(1, top + 1))
        ax.set_ylim(bottom=0)
        ax.set_title(f"{m} (batch {batch_of.get(m, '?')})")
        ax.set_xlabel("threads")
        ax.set_ylabel("throughput (inferences/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle("In-process throughput against threads")
    return _save(fig, out_dir, "throughput_vs_threads.png")


PERCENTILES = [("p50_ms", 0.5), ("p90_ms", 0.9), ("p99_ms", 0.99), ("p999_ms", 0.999)]


def latency_cdf(served, out_dir):
    """Left: the CDF; right: the tail (1 - CDF, log). Markers: the load
    generator's percentiles (client side); steps: the server's latency
    histogram over the same run (receive to answer, Prometheus buckets)."""
    runs = served.get("runs", []) if served else []
    if not runs:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.8))
    handles = []
    for i, r in enumerate(runs):
        color = MODEL_COLORS[i % len(MODEL_COLORS)]
        points = [(r[k], q) for k, q in PERCENTILES if r.get(k)]
        if points:
            xs = [p[0] for p in points]
            left.plot(xs, [p[1] for p in points], marker="o", color=color)
            right.plot(xs, [1 - p[1] for p in points], marker="o", color=color)
            handles.append(Line2D([], [], color=color, marker="o",
                                  label=f"{r['load']}: load generator p50/p90/p99/p99.9"))
        hist = [(b, c) for b, c in r.get("server_histogram", [])
                if isinstance(b, (int, float)) and math.isfinite(b)]
        total = max((c for _, c in r.get("server_histogram", [])), default=0)
        if total > 0 and hist:
            bounds = [b * 1e3 for b, _ in hist]
            fractions = [c / total for _, c in hist]
            # Up to the first bucket that holds every request.
            last = next((k for k, f in enumerate(fractions) if f >= 1), len(fractions) - 1)
            bounds, fractions = bounds[:last + 1], fractions[:last + 1]
            left.step(bounds, fractions, where="post", color=color, linestyle=":")
            tail = [(b, 1 - f) for b, f in zip(bounds, fractions) if 1 - f > 0]
            if tail:
                right.step([t[0] for t in tail], [t[1] for t in tail], where="post",
                           color=color, linestyle=":")
            handles.append(Line2D([], [], color=color, linestyle=":",
                                  label=f"{r['load']}: server histogram"))
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.grid(True, which="both", alpha=0.3)
    left.set_ylabel("fraction of requests answered within")
    left.set_ylim(0, 1.02)
    right.set_yscale("log")
    right.set_ylabel("fraction of requests slower (1 - CDF)")
    right.set_ylim(5e-4, 1.1)
    left.set_title("latency CDF")
    right.set_title("tail")
    fig.legend(handles=handles, fontsize=7, loc="lower center", ncol=2)
    fig.suptitle(f"Served latency under load: {served['model']}, {served['rows_per_request']} "
                 f"row per request, max_batch_size {served['max_batch_size']}, "
                 f"max_queue_delay {served['max_queue_delay_us']} us")
    rows_of_legend = math.ceil(len(handles) / 2)
    return _save(fig, out_dir, "latency_cdf.png", rect=(0, 0.045 * rows_of_legend + 0.02, 1, 1))


def throughput_vs_layout(layouts, out_dir):
    rows = [r for r in (layouts or {}).get("rows", [])]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        return None
    fig, axes = _grid(len(models), width=6.4, height=4.2)
    for ax, m in zip(axes, models):
        mine = [r for r in rows if r["model"] == m]
        xs = range(len(mine))
        served = [r["served"] or 0 for r in mine]
        ax.bar(xs, served, color="tab:blue")
        refs = [(x, r["reference"]) for x, r in zip(xs, mine) if r["reference"]]
        ax.plot([x for x, _ in refs], [v for _, v in refs], linestyle="none", marker="_",
                markersize=30, markeredgewidth=2, color="black")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([short_layout(r["layout"]) for r in mine], fontsize=7)
        top = max(served + [v for _, v in refs] + [1])
        ax.set_ylim(0, top * 1.35)
        ax.set_title(m)
        ax.set_xlabel("layout (workers x instances x threads)")
        ax.set_ylabel("throughput (rows/s)")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(handles=[
            Patch(color="tab:blue", label="served (gRPC, closed loop)"),
            Line2D([], [], color="black", linewidth=2,
                   label="in-process reference (numaserve bench)")],
            fontsize=7, loc="upper center", ncol=2)
    fig.suptitle("Served throughput per layout (scaleout_bench.sh)")
    return _save(fig, out_dir, "throughput_vs_layout.png")


def short_layout(layout):
    """scaleout_bench.sh's layout name, shortened for a tick label."""
    text = layout.replace(" (--domain core)", "").replace(" (latency default)", "")
    text = text.replace("instances_per_domain: ", "instances: ")
    for old, new in ((", ", ",\n"), (" -> ", "\n-> "), (" x ", "\nx ")):
        text = text.replace(old, new)
    return text


def roofline(profile, limits, out_dir, cores, gemms=None):
    """x: arithmetic intensity (FLOP/byte), y: GFLOP/s, log-log; the compute
    roof (FP32 peak x cores) and, when measured, the memory roof (bandwidth
    x intensity). Each step a point (size: its share of the time), each
    model's whole run a star. Where no step has bytes (bench --profile of an
    older binary), achieved GFLOP/s per step against the compute roof
    instead, and `bytes` False is returned with the name."""
    runs = (profile or {}).get("runs", [])
    if not runs:
        return None, False
    peak = (limits.get("fp32_gflops_per_core") or 0) * cores
    bandwidth = limits.get("memory_gb_per_second")
    with_bytes = any(s["bytes"] and s["flops"] for r in runs for s in r["steps"])
    models = list(dict.fromkeys(r["model"] for r in runs))
    batches = sorted({r["batch"] for r in runs})
    markers = ["o", "^", "s", "D", "v", "P"]
    fig, ax = plt.subplots(figsize=(9, 5.5))
    handles = []
    if with_bytes:
        xs = [s["flops"] / s["bytes"] for r in runs for s in r["steps"]
              if s["flops"] and s["bytes"]]
        lo, hi = min(xs + [0.1]) / 2, max(xs + [100]) * 2
        if bandwidth:
            ridge = peak / bandwidth if peak else hi
            ax.plot([lo, ridge], [bandwidth * lo, bandwidth * ridge], color="darkred")
            handles.append(Line2D([], [], color="darkred",
                                  label=f"memory roof: {bandwidth:.1f} GB/s x intensity"))
        else:
            handles.append(Line2D([], [], color="white",
                                  label="memory roof: not measured"))
            ridge = lo
        if peak:
            ax.plot([ridge, hi], [peak, peak], color="black", linestyle="-")
            ax.text(hi, peak * 1.05, f"FP32 peak {peak:.0f} GFLOP/s ({cores} cores)",
                    ha="right", va="bottom", fontsize=8)
            handles.append(Line2D([], [], color="black", linestyle="-",
                                  label=f"compute roof: FP32 peak, {cores} cores"))
            if cores > 1:
                one = peak / cores
                ax.plot([one / bandwidth if bandwidth else lo, hi], [one, one], color="black",
                        linestyle="--", linewidth=0.8)
                handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.8,
                                      label="FP32 peak of 1 core (steps run serially)"))
        for i, m in enumerate(models):
            color = MODEL_COLORS[i % len(MODEL_COLORS)]
            for j, b in enumerate(batches):
                run = next((r for r in runs if r["model"] == m and r["batch"] == b), None)
                if not run:
                    continue
                pts = [(s["flops"] / s["bytes"], s["gflops"], s["share"] or 0)
                       for s in run["steps"] if s["flops"] and s["bytes"] and s["gflops"]]
                if pts:
                    ax.scatter([p[0] for p in pts], [p[1] for p in pts],
                               s=[10 + 300 * p[2] for p in pts], color=color,
                               marker=markers[j % len(markers)], alpha=0.5, linewidths=0)
                t = run["totals"]
                if t.get("flops") and t.get("bytes") and t.get("seconds"):
                    ax.scatter([t["flops"] / t["bytes"]], [t["flops"] / t["seconds"] / 1e9],
                               s=160, color=color, marker="*", edgecolors="black",
                               linewidths=0.8)
                handles.append(Line2D([], [], color=color, marker=markers[j % len(markers)],
                                      linestyle="none", alpha=0.6,
                                      label=f"{m}, batch {b}: steps"))
        handles.append(Line2D([], [], color="gray", marker="*", markeredgecolor="black",
                              markersize=12, linestyle="none", label="whole model (all steps)"))
        gemm_pts = [(g["flops"] / g["bytes"], g["gflops"], f"{g['m']}x{g['k']}x{g['n']}")
                    for g in (gemms or []) if g.get("flops") and g.get("bytes") and g.get("gflops")]
        if gemm_pts:
            ax.scatter([p[0] for p in gemm_pts], [p[1] for p in gemm_pts], s=60, color="black",
                       marker="X")
            for x, y, label in gemm_pts:
                ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, -10),
                            fontsize=7)
            handles.append(Line2D([], [], color="black", marker="X", linestyle="none",
                                  label="GEMM M x K x N (one MatMul)"))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(lo, hi)
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title("Roofline: each compiled step (marker area: its share of the run's time)")
    else:
        k = 0
        for i, m in enumerate(models):
            color = MODEL_COLORS[i % len(MODEL_COLORS)]
            for j, b in enumerate(batches):
                run = next((r for r in runs if r["model"] == m and r["batch"] == b), None)
                if not run:
                    continue
                ys = sorted((s["gflops"] for s in run["steps"] if s["gflops"]), reverse=True)
                ax.plot(range(k, k + len(ys)), ys, marker=markers[j % len(markers)],
                        linestyle="none", color=color, label=f"{m}, batch {b}")
                k += len(ys) + 2
        if peak:
            ax.axhline(peak, color="black", label=f"compute roof: FP32 peak, {cores} cores")
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("compiled step (each model's sorted by GFLOP/s)")
        ax.set_ylabel("achieved GFLOP/s")
        ax.set_title("Achieved GFLOP/s per step (no bytes per step: compute roof only)")
        handles = None
    ax.grid(True, which="both", alpha=0.3)
    if handles is not None:
        ax.legend(handles=handles, fontsize=7, loc="lower right")
    else:
        ax.legend(fontsize=7, loc="best")
    return _save(fig, out_dir, "roofline.png"), with_bytes
