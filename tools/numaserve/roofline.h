// The machine's limits (compute peak per precision from the CPU model,
// memory bandwidth from the triad probe) and a step profile held against
// them: the roofline of each compiled step, for `numaserve profile` and
// `numaserve topology --measure`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"

namespace numaserve::cli {

// What one core computes at most, per precision (affinity's CPU model at the
// probed clock; FP32 under the process's ISA cap, --max-isa).
struct PeakPerCore {
  double fp32_gflops = 0;
  double bf16_gflops = 0;  // 0: no native BF16 (BF16 steps then count against FP32)
  double int8_gops = 0;    // 0: no VNNI / AMX-INT8
};

// This machine's figures.
PeakPerCore ThisMachinePeakPerCore();

// One core's peak for a step's precision ("fp32", "bf16", "int8"): the
// BF16/INT8 figure where the machine has one, else FP32's.
double PeakGflopsPerCore(const PeakPerCore& peak, const std::string& precision);

struct MachineLimits {
  PeakPerCore peak;
  double memory_gb_per_second = 0;  // measured (triad), for the threads the model runs on
};

// One step (or residual reorder) against the roofline, per run.
struct RooflineRow {
  engine::StepProfile step;
  double ms = 0;             // time per run
  double flops = 0;          // per run
  double bytes = 0;          // per run, compulsory
  double intensity = 0;      // flops / bytes (0 without bytes)
  double gflops = 0;         // achieved
  double gb_per_second = 0;  // achieved
  double peak_gflops = 0;    // the step's precision's peak x the threads it ran on
  // min(peak, intensity x bandwidth); for a step without FLOPs, the time
  // bound is its bytes at the bandwidth.
  double bound_gflops = 0;
  bool memory_bound = false;  // intensity x bandwidth < peak (or no FLOPs)
  // The least time the roofline allows for its FLOPs and bytes,
  // max(flops / peak, bytes / bandwidth), over the time it took (0..1,
  // above 1 where data stayed in cache across calls).
  double fraction = 0;
};

struct RooflineTotals {
  double ms = 0, flops = 0, bytes = 0, intensity = 0, gflops = 0, gb_per_second = 0;
  double bound_ms = 0;          // sum of the rows' least times
  double fraction = 0;          // bound_ms / ms
  double compute_bound_ms = 0;  // time in rows whose roofline is the compute peak
};

struct Roofline {
  std::vector<RooflineRow> rows;  // sorted by time per run, costliest first
  RooflineTotals totals;
};

// The profile of `runs` runs held against `limits`.
Roofline MakeRoofline(const std::vector<engine::StepProfile>& profile, int64_t runs,
                      const MachineLimits& limits);

// One batch size as `numaserve profile --advise` measured it.
struct BatchPoint {
  int64_t batch = 0;
  double mean_ms = 0;              // wall time per run
  double p99_ms = 0;               // 99th percentile of the runs' wall times
  double compute_bound_share = 0;  // RooflineTotals::compute_bound_ms / ms
};

// A batching configuration for a p99 latency target, with its reasons.
struct BatchAdvice {
  // The smallest batch where the model turns compute-bound: more than half
  // its step time in compute-bound steps, or throughput per row gaining
  // no more than kSaturationGain from doubling it. 0: none measured.
  int64_t compute_bound_batch = 0;
  int64_t max_batch_size = 1;
  int64_t max_queue_delay_microseconds = 0;
  bool target_met = false;           // even batch 1 misses the target otherwise
  std::vector<std::string> reasons;  // one line each, for people
};

// Doubling a batch that gains less than this (rows per second) is past the
// knee.
inline constexpr double kSaturationGain = 0.10;

// Pure: the advice for `points` (ascending batch sizes, each double the
// last) under `p99_ms`. A request may arrive just after a batch started:
// it waits for that batch, then runs in the next, so the largest batch
// whose p99 fits twice in the target is the most that can be allowed (and
// no more than the compute-bound batch, past which rows per second barely
// grow while latency doubles). The queue delay gets what the target leaves,
// at most one mean run of that batch (waiting longer for company gains
// nothing: the worker is busy that long anyway).
BatchAdvice AdviseBatching(const std::vector<BatchPoint>& points, double p99_ms);

}  // namespace numaserve::cli
