// A compiled model's step profile as data (StepProfile rows, StepEvent
// timeline events, PlannedStep rows of the plan at a batch size) and the
// profile's two renderings: the text table of `numaserve bench --profile`
// and `numaserve profile`, and the same as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace numaserve::engine {

// One row of a CompiledModel's step profile: a compiled step, or the
// residual a conv step copies/reorders into its output before it runs
// (kind "reorder", same index as its step).
struct StepProfile {
  int index = 0;               // the step's position in the plan
  std::string kind;            // "conv", "matmul", "pool", ..., "reorder"
  std::string description;     // the plan line ("conv: conv1+bn1+relu1")
  std::string layouts;         // "nChw16c->plain" where the step has a layout choice
  std::string implementation;  // oneDNN's implementation name where known
  int threads = 0;             // threads the step ran on (at the last batch profiled)
  int64_t calls = 0;
  double seconds = 0;  // wall time summed over calls
  double flops = 0;    // multiply-adds x2 summed over calls; 0 if not counted
  // Compulsory bytes moved, summed over calls: every tensor the step reads
  // (activations, constants, and the weights and bias it holds, once per
  // call at their logical size) plus what it writes, at the batch it ran.
  // A reorder row: the residual read plus the copy written. 0 where unknown.
  double bytes = 0;
  // The arithmetic its FLOPs ran in, for the peak they are held against:
  // "fp32", "bf16" (a conv or matmul under Precision::kBf16) or "int8" (a
  // QDQ conv or matmul on an INT8 kernel).
  std::string precision = "fp32";
  // Rows per slice when the step ran the batch in slices
  // (CompileOptions::batch_split_cache_bytes); 0: the whole batch at once.
  int64_t slice_rows = 0;
};

// One timed call of a compiled step while profiling, for a timeline
// (`numaserve profile --trace`). A step of a split batch has one event per
// slice.
struct StepEvent {
  int index = 0;             // the step's position in the plan (StepProfile::index)
  int64_t run = 0;           // the profiled Run it belongs to, from 0
  double start_seconds = 0;  // since profiling started
  double seconds = 0;        // its duration, a residual reorder included
};

// One compiled step as it ran at a batch size: what it stands for, its
// layouts and the implementation that ran it.
struct PlannedStep {
  int index = 0;               // position in the plan
  std::string kind;            // "conv", "matmul", "attention", "reference", ...
  std::string description;     // the plan line ("conv: conv1+bn1+relu1")
  std::string layouts;         // "nChw8c->nChw8c" where the step has a layout choice
  std::string implementation;  // "jit:avx2", "brg:avx512_core", "numaserve:attention_head avx2"
  bool reference = false;      // a reference implementation (kernels::IsReferenceImplementation)
  bool serial = false;         // runs on the calling thread alone at this batch
  int64_t slice_rows = 0;      // rows per slice when the batch runs in slices; 0: whole
};

// The profile as text: the time per run by step kind, the `top` costliest
// rows (0: all) with their share of the time in steps and their GFLOP/s,
// then every layout boundary (a step reading one layout and writing
// another) and residual reorder/copy. `runs` divides the sums; `wall_seconds`
// (the runs' total wall time, 0 if unknown) adds the time outside steps.
std::string FormatStepProfile(const std::vector<StepProfile>& profile, int64_t runs, int top,
                              double wall_seconds = 0);
// The same as one JSON object (every row, no trailing newline).
std::string StepProfileJson(const std::vector<StepProfile>& profile, int64_t runs,
                            double wall_seconds = 0);

}  // namespace numaserve::engine
