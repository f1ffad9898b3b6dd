#include "tools/numaserve/roofline.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "affinity/cpu_features.h"
#include "kernels/dispatch.h"

namespace numaserve::cli {

PeakPerCore ThisMachinePeakPerCore() {
  const affinity::PeakFlops& peak = affinity::GetPeakFlops();
  return {kernels::Fp32PeakGflopsPerCore(), peak.peak_bf16_gflops_per_core,
          peak.peak_int8_gops_per_core};
}

double PeakGflopsPerCore(const PeakPerCore& peak, const std::string& precision) {
  if (precision == "bf16" && peak.bf16_gflops > 0) return peak.bf16_gflops;
  if (precision == "int8" && peak.int8_gops > 0) return peak.int8_gops;
  return peak.fp32_gflops;
}

Roofline MakeRoofline(const std::vector<engine::StepProfile>& profile, int64_t runs,
                      const MachineLimits& limits) {
  const double per_run = 1.0 / static_cast<double>(std::max<int64_t>(runs, 1));
  const double bandwidth = limits.memory_gb_per_second;  // GB/s = bytes/ns
  Roofline roofline;
  RooflineTotals& totals = roofline.totals;
  for (const engine::StepProfile& step : profile) {
    RooflineRow row;
    row.step = step;
    const double seconds = step.seconds * per_run;
    row.ms = seconds * 1e3;
    row.flops = step.flops * per_run;
    row.bytes = step.bytes * per_run;
    row.intensity = row.bytes > 0 ? row.flops / row.bytes : 0;
    row.gflops = seconds > 0 ? row.flops / seconds / 1e9 : 0;
    row.gb_per_second = seconds > 0 ? row.bytes / seconds / 1e9 : 0;
    row.peak_gflops = PeakGflopsPerCore(limits.peak, step.precision) * std::max(step.threads, 1);
    const double memory_roof = row.intensity * bandwidth;
    if (row.flops > 0) {
      row.memory_bound = row.bytes > 0 && bandwidth > 0 && memory_roof < row.peak_gflops;
      row.bound_gflops = row.memory_bound ? memory_roof : row.peak_gflops;
    } else {
      row.memory_bound = true;
    }
    // The least time for its FLOPs at the peak and its bytes at the bandwidth.
    double least = 0;
    if (row.flops > 0 && row.peak_gflops > 0) least = row.flops / (row.peak_gflops * 1e9);
    if (row.bytes > 0 && bandwidth > 0) least = std::max(least, row.bytes / (bandwidth * 1e9));
    row.fraction = seconds > 0 ? least / seconds : 0;
    totals.ms += row.ms;
    totals.flops += row.flops;
    totals.bytes += row.bytes;
    totals.bound_ms += least * 1e3;
    if (!row.memory_bound) totals.compute_bound_ms += row.ms;
    roofline.rows.push_back(std::move(row));
  }
  std::stable_sort(roofline.rows.begin(), roofline.rows.end(),
                   [](const RooflineRow& a, const RooflineRow& b) { return a.ms > b.ms; });
  totals.intensity = totals.bytes > 0 ? totals.flops / totals.bytes : 0;
  totals.gflops = totals.ms > 0 ? totals.flops / (totals.ms * 1e-3) / 1e9 : 0;
  totals.gb_per_second = totals.ms > 0 ? totals.bytes / (totals.ms * 1e-3) / 1e9 : 0;
  totals.fraction = totals.ms > 0 ? totals.bound_ms / totals.ms : 0;
  return roofline;
}

BatchAdvice AdviseBatching(const std::vector<BatchPoint>& points, double p99_ms) {
  BatchAdvice advice;
  auto rows_per_second = [](const BatchPoint& p) {
    return p.mean_ms > 0 ? static_cast<double>(p.batch) / p.mean_ms * 1e3 : 0.0;
  };
  for (size_t i = 0; i < points.size() && advice.compute_bound_batch == 0; ++i) {
    const BatchPoint& p = points[i];
    if (p.compute_bound_share > 0.5) {
      advice.compute_bound_batch = p.batch;
      advice.reasons.push_back(absl::StrFormat(
          "compute-bound from batch %d: %.0f%% of its step time is in compute-bound steps", p.batch,
          100 * p.compute_bound_share));
    } else if (i + 1 < points.size() && rows_per_second(p) > 0 &&
               rows_per_second(points[i + 1]) <= (1 + kSaturationGain) * rows_per_second(p)) {
      advice.compute_bound_batch = p.batch;
      advice.reasons.push_back(absl::StrFormat(
          "saturated at batch %d: batch %d runs %.0f rows/s against %.0f (+%.0f%%, under "
          "%.0f%%); %.0f%% of its step time is in compute-bound steps",
          p.batch, points[i + 1].batch, rows_per_second(points[i + 1]), rows_per_second(p),
          100 * (rows_per_second(points[i + 1]) / rows_per_second(p) - 1), 100 * kSaturationGain,
          100 * p.compute_bound_share));
    }
  }
  if (advice.compute_bound_batch == 0 && !points.empty()) {
    advice.reasons.push_back(absl::StrFormat(
        "not compute-bound up to batch %d: throughput per row still grows by more than %.0f%% "
        "per doubling and most step time is in memory-bound steps",
        points.back().batch, 100 * kSaturationGain));
  }
  const BatchPoint* chosen = nullptr;
  for (const BatchPoint& p : points) {
    if (2 * p.p99_ms > p99_ms) continue;
    if (advice.compute_bound_batch > 0 && p.batch > advice.compute_bound_batch) continue;
    chosen = &p;
  }
  if (chosen == nullptr) {
    advice.max_batch_size = 1;
    advice.max_queue_delay_microseconds = 0;
    advice.reasons.push_back(
        points.empty() ? std::string("nothing measured")
                       : absl::StrFormat("the target cannot be met: batch 1 runs in %.3f ms at "
                                         "p99, and a request may wait for a running batch "
                                         "first (2 x %.3f > %.3f ms); no batching, no delay",
                                         points.front().p99_ms, points.front().p99_ms, p99_ms));
    return advice;
  }
  advice.target_met = true;
  advice.max_batch_size = chosen->batch;
  advice.reasons.push_back(absl::StrFormat(
      "max_batch_size %d: %s whose p99 (%.3f ms) fits twice in %.3f ms (a request may wait "
      "for a running batch, then run in the next)",
      chosen->batch,
      advice.compute_bound_batch > 0 && chosen->batch == advice.compute_bound_batch
          ? "the compute-bound batch, the largest worth waiting for,"
          : "the largest batch",
      chosen->p99_ms, p99_ms));
  const double left_ms = p99_ms - 2 * chosen->p99_ms;
  const double delay_ms = std::clamp(left_ms, 0.0, chosen->mean_ms);
  advice.max_queue_delay_microseconds = static_cast<int64_t>(delay_ms * 1e3);
  advice.reasons.push_back(absl::StrFormat(
      "max_queue_delay_microseconds %d: the target leaves %.3f ms after two runs of batch %d; "
      "at most one mean run (%.3f ms) of waiting for company pays",
      advice.max_queue_delay_microseconds, left_ms, chosen->batch, chosen->mean_ms));
  return advice;
}

}  // namespace numaserve::cli
