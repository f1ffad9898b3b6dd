#include "tools/numaserve/profile_command.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/memory_bandwidth.h"
#include "base/args.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "tools/numaserve/model_runs.h"

namespace numaserve::cli {
namespace {

// Step events kept for --trace: every call of the first runs up to about
// this many (a run that would go past it, and every later one, is timed but
// not traced), ~25 MB of trace JSON.
constexpr int64_t kMaxTraceEvents = 100000;

std::string Json(absl::string_view text) {
  std::string out;
  base::AppendJsonString(&out, text);
  return out;
}

// A JSON number: ten significant digits, 0 for a figure that is not finite.
std::string Num(double v) { return absl::StrFormat("%.10g", std::isfinite(v) ? v : 0.0); }

struct ProfileSettings {
  std::string model_path;
  int64_t batch = 1;
  int threads = 1;
  double seconds = 0;
  std::string precision;
};

std::string LimitsLine(const MachineLimits& limits, const affinity::BandwidthResult& bandwidth,
                       int threads) {
  const PeakPerCore& p = limits.peak;
  std::string line = absl::StrFormat("limits: fp32 %.1f GFLOP/s per core (%.1f on %d threads)",
                                     p.fp32_gflops, p.fp32_gflops * threads, threads);
  absl::StrAppend(&line, p.bf16_gflops > 0 ? absl::StrFormat(", bf16 %.1f", p.bf16_gflops)
                                           : std::string(", bf16 -"));
  absl::StrAppend(&line, p.int8_gops > 0 ? absl::StrFormat(", int8 %.1f GOP/s", p.int8_gops)
                                         : std::string(", int8 -"));
  absl::StrAppend(&line,
                  absl::StrFormat("; memory %.1f GB/s (triad, %d threads, %.0f MiB)\n",
                                  limits.memory_gb_per_second, bandwidth.threads,
                                  static_cast<double>(bandwidth.bytes_per_pass) / (1 << 20)));
  return line;
}

std::string StepNote(const engine::StepProfile& step) {
  std::string note = step.layouts;
  auto add = [&](const std::string& part) {
    if (part.empty()) return;
    absl::StrAppend(&note, note.empty() ? "" : ", ", part);
  };
  if (step.threads == 1) add("1 thread");
  if (step.precision != "fp32") add(step.precision);
  if (step.slice_rows > 0) add(absl::StrCat("slices of ", step.slice_rows, " rows"));
  add(step.implementation);
  return note.empty() ? "" : absl::StrCat(" [", note, "]");
}

std::string FormatText(const ProfileSettings& settings, const ProfiledRuns& measured,
                       const Roofline& roofline, int top) {
  const RooflineTotals& t = roofline.totals;
  const double runs = static_cast<double>(std::max<int64_t>(measured.runs, 1));
  std::string out = absl::StrFormat(
      "%s: batch %d, %d threads, %s, %d runs in %.2f s: %.3f ms per run, %.3f ms in steps\n",
      settings.model_path, settings.batch, settings.threads, settings.precision, measured.runs,
      measured.wall_seconds, measured.wall_seconds / runs * 1e3, t.ms);
  absl::StrAppend(
      &out, absl::StrFormat("  %-5s %-14s %9s %6s %9s %9s %7s %8s %7s %9s %-7s %6s  %s\n", "step",
                            "kind", "ms/run", "share", "MFLOP", "MB", "FLOP/B", "GFLOP/s", "GB/s",
                            "roof", "bound", "of", "description"));
  const size_t shown =
      top <= 0 ? roofline.rows.size() : std::min(roofline.rows.size(), static_cast<size_t>(top));
  for (size_t i = 0; i < shown; ++i) {
    const RooflineRow& r = roofline.rows[i];
    const std::string roof = r.flops > 0 ? absl::StrFormat("%.1f", r.bound_gflops) : "-";
    absl::StrAppend(
        &out,
        absl::StrFormat(
            "  #%-4d %-14s %9.4f %5.1f%% %9.3f %9.3f %7.2f %8.1f %7.1f %9s %-7s %6.3f  %s%s\n",
            r.step.index, r.step.kind, r.ms, t.ms > 0 ? 100 * r.ms / t.ms : 0.0, r.flops / 1e6,
            r.bytes / 1e6, r.intensity, r.gflops, r.gb_per_second, roof,
            r.memory_bound ? "memory" : "compute", r.fraction, r.step.description,
            StepNote(r.step)));
  }
  if (shown < roofline.rows.size()) {
    absl::StrAppend(&out, absl::StrFormat("  (%d more rows; --top 0 lists all)\n",
                                          roofline.rows.size() - shown));
  }
  absl::StrAppend(
      &out,
      absl::StrFormat("  %-5s %-14s %9.4f %5.1f%% %9.3f %9.3f %7.2f %8.1f %7.1f %9s %-7s %6.3f  "
                      "%d rows; %.0f%% of the time in compute-bound steps\n",
                      "total", "", t.ms, t.ms > 0 ? 100.0 : 0.0, t.flops / 1e6, t.bytes / 1e6,
                      t.intensity, t.gflops, t.gb_per_second, "", "", t.fraction,
                      roofline.rows.size(), t.ms > 0 ? 100 * t.compute_bound_ms / t.ms : 0.0));
  return out;
}

std::string FormatJson(const ProfileSettings& settings, const ProfiledRuns& measured,
                       const Roofline& roofline, const MachineLimits& limits,
                       const affinity::BandwidthResult& bandwidth, const std::string& trace_path,
                       int64_t trace_runs) {
  const RooflineTotals& t = roofline.totals;
  const double runs = static_cast<double>(std::max<int64_t>(measured.runs, 1));
  std::string out = absl::StrCat(
      "{\"model\": ", Json(settings.model_path), ", \"batch\": ", settings.batch,
      ", \"threads\": ", settings.threads, ", \"precision\": ", Json(settings.precision),
      ", \"runs\": ", measured.runs, ", \"wall_ms\": ", Num(measured.wall_seconds / runs * 1e3),
      ", \"step_ms\": ", Num(t.ms));
  absl::StrAppend(&out, ", \"limits\": {\"fp32_gflops_per_core\": ", Num(limits.peak.fp32_gflops),
                  ", \"bf16_gflops_per_core\": ", Num(limits.peak.bf16_gflops),
                  ", \"int8_gops_per_core\": ", Num(limits.peak.int8_gops),
                  ", \"memory_gb_per_second\": ", Num(limits.memory_gb_per_second),
                  ", \"bandwidth_threads\": ", bandwidth.threads,
                  ", \"bandwidth_bytes\": ", bandwidth.bytes_per_pass, "}, \"steps\": [");
  for (size_t i = 0; i < roofline.rows.size(); ++i) {
    const RooflineRow& r = roofline.rows[i];
    absl::StrAppend(
        &out, i ? ", " : "", "{\"index\": ", r.step.index, ", \"kind\": ", Json(r.step.kind),
        ", \"step\": ", Json(r.step.description), ", \"layouts\": ", Json(r.step.layouts),
        ", \"implementation\": ", Json(r.step.implementation),
        ", \"precision\": ", Json(r.step.precision), ", \"threads\": ", r.step.threads,
        ", \"calls\": ", r.step.calls, ", \"ms\": ", Num(r.ms),
        ", \"share\": ", Num(t.ms > 0 ? r.ms / t.ms : 0), ", \"flops\": ", Num(r.flops),
        ", \"bytes\": ", Num(r.bytes), ", \"intensity\": ", Num(r.intensity),
        ", \"gflops\": ", Num(r.gflops), ", \"gb_per_second\": ", Num(r.gb_per_second),
        ", \"peak_gflops\": ", Num(r.peak_gflops), ", \"bound_gflops\": ", Num(r.bound_gflops),
        ", \"bound\": ", r.memory_bound ? "\"memory\"" : "\"compute\"",
        ", \"fraction\": ", Num(r.fraction), "}");
  }
  absl::StrAppend(&out, "], \"totals\": {\"ms\": ", Num(t.ms), ", \"flops\": ", Num(t.flops),
                  ", \"bytes\": ", Num(t.bytes), ", \"intensity\": ", Num(t.intensity),
                  ", \"gflops\": ", Num(t.gflops), ", \"gb_per_second\": ", Num(t.gb_per_second),
                  ", \"bound_ms\": ", Num(t.bound_ms), ", \"fraction\": ", Num(t.fraction),
                  ", \"compute_bound_share\": ", Num(t.ms > 0 ? t.compute_bound_ms / t.ms : 0),
                  "}");
  if (!trace_path.empty()) {
    absl::StrAppend(&out, ", \"trace\": {\"file\": ", Json(trace_path), ", \"runs\": ", trace_runs,
                    ", \"events\": ", measured.events.size(), "}");
  }
  return out + "}";
}

// Runs whose every step call is among the events.
int64_t TracedRuns(const std::vector<engine::StepEvent>& events) {
  return events.empty() ? 0 : events.back().run + 1;
}

int Fail(const std::string& message, int code = 1) {
  fprintf(stderr, "numaserve profile: %s\n", message.c_str());
  return code;
}

// --advise: profiles batch 1, 2, 4, ... up to `max_batch` (stopping after
// the first whose p99 alone exceeds the target) and prints the advice.
int Advise(engine::CompiledModel& model, const ProfileSettings& settings,
           const MachineLimits& limits, double p99_ms, int64_t max_batch, bool json) {
  std::vector<BatchPoint> points;
  std::string rows_json;
  if (!json) {
    printf("advice for p99 <= %.3f ms: batch sizes 1 to %lld, %.2f s each, %d threads\n", p99_ms,
           static_cast<long long>(max_batch), settings.seconds, settings.threads);
    printf("  %6s %10s %10s %12s %8s %14s\n", "batch", "ms/run", "p99_ms", "rows/s", "gain",
           "compute-bound");
  }
  for (int64_t batch = 1; batch <= max_batch; batch *= 2) {
    {
      absl::StatusOr<RunBuffers> warm = MakeRunBuffers(model, batch);
      if (!warm.ok()) return Fail(absl::StrCat("batch ", batch, ": ", warm.status().message()));
      for (int i = 0; i < 2; ++i) {
        if (absl::Status s = model.Run(batch, warm->in_ptrs, warm->out_ptrs); !s.ok()) {
          return Fail(absl::StrCat("batch ", batch, ": ", s.message()));
        }
      }
    }
    auto measured = ProfileRuns(model, batch, settings.seconds, 5);
    if (!measured.ok()) {
      return Fail(absl::StrCat("batch ", batch, ": ", measured.status().message()));
    }
    const Roofline roofline = MakeRoofline(measured->steps, measured->runs, limits);
    BatchPoint point;
    point.batch = batch;
    point.mean_ms = measured->wall_seconds / static_cast<double>(measured->runs) * 1e3;
    point.p99_ms = Percentile(measured->run_seconds, 0.99) * 1e3;
    point.compute_bound_share =
        roofline.totals.ms > 0 ? roofline.totals.compute_bound_ms / roofline.totals.ms : 0;
    const double rows = static_cast<double>(batch) / point.mean_ms * 1e3;
    const double gain =
        points.empty()
            ? 0
            : rows / (static_cast<double>(points.back().batch) / points.back().mean_ms * 1e3) - 1;
    if (json) {
      absl::StrAppend(&rows_json, points.empty() ? "" : ", ", "{\"batch\": ", batch,
                      ", \"mean_ms\": ", Num(point.mean_ms), ", \"p99_ms\": ", Num(point.p99_ms),
                      ", \"rows_per_second\": ", Num(rows),
                      ", \"compute_bound_share\": ", Num(point.compute_bound_share),
                      ", \"fraction_of_roofline\": ", Num(roofline.totals.fraction), "}");
    } else {
      printf("  %6lld %10.3f %10.3f %12.1f %7s %13.0f%%\n", static_cast<long long>(batch),
             point.mean_ms, point.p99_ms, rows,
             points.empty() ? "-" : absl::StrFormat("%+.0f%%", 100 * gain).c_str(),
             100 * point.compute_bound_share);
      fflush(stdout);
    }
    points.push_back(point);
    if (point.p99_ms > p99_ms || !model.info().batched) break;
  }
  const BatchAdvice advice = AdviseBatching(points, p99_ms);
  if (json) {
    std::string reasons;
    for (size_t i = 0; i < advice.reasons.size(); ++i) {
      absl::StrAppend(&reasons, i ? ", " : "", Json(advice.reasons[i]));
    }
    printf("%s\n",
           absl::StrCat("{\"model\": ", Json(settings.model_path),
                        ", \"threads\": ", settings.threads, ", \"p99_ms\": ", Num(p99_ms),
                        ", \"batches\": [", rows_json, "], \"advice\": {\"compute_bound_batch\": ",
                        advice.compute_bound_batch, ", \"max_batch_size\": ", advice.max_batch_size,
                        ", \"max_queue_delay_microseconds\": ", advice.max_queue_delay_microseconds,
                        ", \"target_met\": ", advice.target_met ? "true" : "false",
                        ", \"reasons\": [", reasons, "]}}")
               .c_str());
    return 0;
  }
  for (const std::string& reason : advice.reasons) printf("  %s\n", reason.c_str());
  printf(
      "config.pbtxt:\n  max_batch_size: %lld\n  dynamic_batching { "
      "max_queue_delay_microseconds: %lld }\n",
      static_cast<long long>(advice.max_batch_size),
      static_cast<long long>(advice.max_queue_delay_microseconds));
  return 0;
}

}  // namespace

std::string ChromeTraceJson(const std::vector<engine::StepEvent>& events,
                            const std::vector<engine::StepProfile>& steps,
                            const std::string& model_path, int64_t batch) {
  std::map<int, const engine::StepProfile*> by_index;
  for (const engine::StepProfile& s : steps) {
    if (s.kind != "reorder") by_index.emplace(s.index, &s);
  }
  const int pid = static_cast<int>(getpid());
  std::string out = absl::StrCat(
      "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"model\": ", Json(model_path),
      ", \"batch\": ", batch, "}, \"traceEvents\": [\n",
      "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": ", pid,
      ", \"tid\": 0, \"args\": {\"name\": ", Json(absl::StrCat("numaserve profile ", model_path)),
      "}}");
  for (const engine::StepEvent& e : events) {
    auto it = by_index.find(e.index);
    const engine::StepProfile* s = it == by_index.end() ? nullptr : it->second;
    const std::string name = s ? s->description : absl::StrCat("step ", e.index);
    absl::StrAppend(&out, ",\n{\"name\": ", Json(name), ", \"cat\": ", Json(s ? s->kind : "step"),
                    ", \"ph\": \"X\", \"ts\": ", absl::StrFormat("%.3f", e.start_seconds * 1e6),
                    ", \"dur\": ", absl::StrFormat("%.3f", e.seconds * 1e6), ", \"pid\": ", pid,
                    ", \"tid\": 0, \"args\": {\"index\": ", e.index, ", \"run\": ", e.run,
                    ", \"kind\": ", Json(s ? s->kind : ""),
                    ", \"implementation\": ", Json(s ? s->implementation : ""),
                    ", \"precision\": ", Json(s ? s->precision : ""), "}}");
  }
  return out + "\n]}\n";
}

namespace {

// The flags of `numaserve profile`, with their defaults.
struct ProfileOptions {
  std::string model_path, trace_path, precision_name = "fp32";
  int64_t batch = 1, threads = 0, top = 0, max_batch = 256;
  double seconds = 0, p99_ms = 0;
  bool json = false, advise = false;
  serving::ProcessOptions process;  // --max-isa, --gemm-cache, ...
};

// What is run: the model, its batch, threads, time and precision.
void AddRunFlags(base::ArgParser& parser, ProfileOptions& o) {
  parser.AddString("model", &o.model_path, "ONNX model file (required)");
  parser.AddInt("batch", &o.batch, "rows per run (>= 1)");
  parser.AddInt("threads", &o.threads, "kernel threads (0 = OMP_NUM_THREADS or all cores)");
  parser.AddDouble("seconds", &o.seconds,
                   "time spent profiling (at least 5 runs; 0 = 2 s, with --advise 0.5 s per "
                   "batch size)");
  parser.AddString("precision", &o.precision_name,
                   "fp32 | bf16 (convs and weight matmuls in BF16, as bench --precision)");
}

// What is printed or written: the table's rows, JSON, a Chrome trace.
void AddOutputFlags(base::ArgParser& parser, ProfileOptions& o) {
  parser.AddInt("top", &o.top, "text output: the costliest rows listed (0 = all)");
  parser.AddBool("json", &o.json, "print one JSON object");
  parser.AddString("trace", &o.trace_path,
                   "write a Chrome trace (JSON, for Perfetto / chrome://tracing) of every step "
                   "call to this file");
}

// --advise and its target.
void AddAdviseFlags(base::ArgParser& parser, ProfileOptions& o) {
  parser.AddBool("advise", &o.advise,
                 "instead of one batch: profile batch 1, 2, 4, ... and suggest max_batch_size "
                 "and max_queue_delay_microseconds for --p99-ms, with the batch where the model "
                 "turns compute-bound");
  parser.AddDouble("p99-ms", &o.p99_ms, "--advise: the p99 latency target, milliseconds");
  parser.AddInt("max-batch", &o.max_batch, "--advise: the largest batch size tried");
}

// Checks the flags' values (an error is a usage error, exit 2); the
// precision --precision names.
absl::StatusOr<engine::Precision> CheckProfileFlags(const ProfileOptions& o) {
  if (o.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (o.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--batch must be >= 1, got ", o.batch));
  }
  if (o.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 0, got ", o.threads));
  }
  if (o.seconds < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--seconds must be > 0, got ", o.seconds));
  }
  if (o.advise && !(o.p99_ms > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("--advise needs --p99-ms > 0, got ", o.p99_ms));
  }
  if (o.advise && o.max_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-batch must be >= 1, got ", o.max_batch));
  }
  if (o.advise && !o.trace_path.empty()) {
    return absl::InvalidArgumentError("--trace traces one batch size; leave it out with --advise");
  }
  if (o.top < 0) return absl::InvalidArgumentError(absl::StrCat("--top must be >= 0, got ", o.top));
  const absl::StatusOr<engine::Precision> precision = engine::PrecisionFromName(o.precision_name);
  if (!precision.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--precision: ", precision.status().message()));
  }
  return *precision;
}

// Writes the Chrome trace of `measured` to `trace_file` and closes it.
absl::Status WriteTrace(FILE* trace_file, const ProfileOptions& o, const ProfiledRuns& measured) {
  const std::string trace = ChromeTraceJson(measured.events, measured.steps, o.model_path, o.batch);
  const bool written = fwrite(trace.data(), 1, trace.size(), trace_file) == trace.size();
  const bool closed = fclose(trace_file) == 0;
  if (!written || !closed) {
    return absl::InternalError(
        absl::StrCat("--trace: writing '", o.trace_path, "' failed: ", base::ErrnoText(errno)));
  }
  return absl::OkStatus();
}

// Profiles --batch, writes the trace to `trace_file` (null: none; closed
// here, whatever the outcome) and prints the roofline. Returns the exit code.
int ProfileOneBatch(engine::CompiledModel& model, const ProfileOptions& o, int used_threads,
                    const MachineLimits& limits, const affinity::BandwidthResult& bandwidth,
                    FILE* trace_file) {
  auto close_trace = [&] {
    if (trace_file != nullptr) fclose(trace_file);
    trace_file = nullptr;
  };
  const int64_t batch = o.batch;
  // Warm-up: primitive creation, weight layouts, page faults.
  {
    absl::StatusOr<RunBuffers> warm = MakeRunBuffers(model, batch);
    if (!warm.ok()) {
      close_trace();
      return Fail(absl::StrCat("batch ", batch, ": ", warm.status().message()));
    }
    for (int i = 0; i < 2; ++i) {
      if (absl::Status s = model.Run(batch, warm->in_ptrs, warm->out_ptrs); !s.ok()) {
        close_trace();
        return Fail(absl::StrCat("batch ", batch, ": ", s.message()));
      }
    }
  }
  auto measured =
      ProfileRuns(model, batch, o.seconds, 5, trace_file != nullptr ? kMaxTraceEvents : 0);
  if (!measured.ok()) {
    close_trace();
    return Fail(absl::StrCat("batch ", batch, ": ", measured.status().message()));
  }
  const Roofline roofline = MakeRoofline(measured->steps, measured->runs, limits);
  const ProfileSettings settings{o.model_path, batch, used_threads, o.seconds, o.precision_name};
  const int64_t trace_runs = TracedRuns(measured->events);
  if (trace_file != nullptr) {
    absl::Status written = WriteTrace(trace_file, o, *measured);
    trace_file = nullptr;
    if (!written.ok()) return Fail(std::string(written.message()));
  }
  if (o.json) {
    printf("%s\n",
           FormatJson(settings, *measured, roofline, limits, bandwidth, o.trace_path, trace_runs)
               .c_str());
  } else {
    printf("%s", LimitsLine(limits, bandwidth, used_threads).c_str());
    printf("%s", FormatText(settings, *measured, roofline, static_cast<int>(o.top)).c_str());
    if (!o.trace_path.empty()) {
      printf("trace: %s (%lld of %lld runs, %zu step events)\n", o.trace_path.c_str(),
             static_cast<long long>(trace_runs), static_cast<long long>(measured->runs),
             measured->events.size());
    }
  }
  return 0;
}

}  // namespace

int ProfileCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process) {
  ProfileOptions o;
  o.process = process;
  base::ArgParser parser(
      "profile",
      "run a model in process with every compiled step timed and hold each step "
      "against the machine's roofline: time, FLOPs, bytes moved, arithmetic "
      "intensity, achieved GFLOP/s and GB/s, the bound for its intensity "
      "(min(peak, intensity x memory bandwidth)) and the fraction of it reached");
  AddRunFlags(parser, o);
  AddOutputFlags(parser, o);
  AddAdviseFlags(parser, o);
  serving::AddProcessFlags(parser, o.process, serving::kKernelFlags | serving::kModelFlags);
  if (absl::Status s = parser.Parse(args); !s.ok()) return Fail(std::string(s.message()), 2);
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (absl::Status s = serving::ApplyProcessOptions(o.process); !s.ok()) {
    return Fail(std::string(s.message()), 2);
  }
  const absl::StatusOr<engine::Precision> precision = CheckProfileFlags(o);
  if (!precision.ok()) return Fail(std::string(precision.status().message()), 2);
  if (o.seconds == 0) o.seconds = o.advise ? 0.5 : 2.0;
  // The trace file is opened first: a path that cannot be written fails
  // before minutes of profiling, not after.
  FILE* trace_file = nullptr;
  if (!o.trace_path.empty()) {
    trace_file = fopen(o.trace_path.c_str(), "w");
    if (trace_file == nullptr) {
      return Fail(
          absl::StrCat("--trace: cannot write '", o.trace_path, "': ", base::ErrnoText(errno)), 2);
    }
  }
  auto close_trace = [&] {
    if (trace_file != nullptr) fclose(trace_file);
    trace_file = nullptr;
  };
  engine::CompileOptions options{.num_threads = static_cast<int>(o.threads),
                                 .gemm_cache_file = o.process.gemm_cache};
  options.precision = *precision;
  options.profile_steps = o.process.profile_steps;
  auto model = engine::CompiledModel::Load(o.model_path, options);
  if (!model.ok()) {
    close_trace();
    return Fail(std::string(model.status().message()));
  }
  if (!(*model)->info().batched && (o.batch != 1 || o.advise)) {
    close_trace();
    return Fail(absl::StrCat(o.model_path, " is not batched (", (*model)->info().unbatched_reason,
                             "): it runs one request at a time (max_batch_size 0); profile it "
                             "with --batch 1"),
                2);
  }
  const int used_threads = o.threads > 0 ? static_cast<int>(o.threads) : omp_get_max_threads();

  // The machine's limits, once: the peaks from the CPU model, the memory
  // bandwidth measured with the model's thread count on this process's cpus.
  affinity::BandwidthOptions bandwidth_options;
  bandwidth_options.threads = used_threads;
  auto bandwidth = affinity::MeasureMemoryBandwidth(bandwidth_options);
  if (!bandwidth.ok()) {
    close_trace();
    return Fail(absl::StrCat("measuring memory bandwidth: ", bandwidth.status().message()));
  }
  MachineLimits limits{ThisMachinePeakPerCore(), bandwidth->gb_per_second};
  if (o.advise) {
    return Advise(**model, {o.model_path, o.batch, used_threads, o.seconds, o.precision_name},
                  limits, o.p99_ms, o.max_batch, o.json);
  }
  return ProfileOneBatch(**model, o, used_threads, limits, *bandwidth, trace_file);
}

}  // namespace numaserve::cli
