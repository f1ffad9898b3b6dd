#include "tools/numaserve/model_runs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/memory_bandwidth.h"
#include "kernels/tensor.h"
#include "serving/request/datatypes.h"

namespace numaserve::cli {

using serving::FillRandom;

namespace {

std::vector<uint64_t> Words(int64_t elements, engine::DataType type) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(elements, 1)) *
                       std::max<size_t>(engine::DataTypeSize(type), 1);
  return std::vector<uint64_t>((bytes + 7) / 8);
}

}  // namespace

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1,
                    static_cast<size_t>(std::llround(q * static_cast<double>(v.size() - 1))))];
}

absl::StatusOr<RunBuffers> MakeRunBuffers(engine::CompiledModel& model, int64_t batch) {
  const engine::ModelInfo& info = model.info();
  if (batch < 1) return absl::InvalidArgumentError("a batch below 1");
  // Element counts of every input and output, checked before any allocation.
  std::vector<int64_t> in_elements, out_elements;
  uint64_t bytes = 0;
  auto add = [&](const std::vector<int64_t>& dims, engine::DataType type,
                 std::vector<int64_t>* counts) -> absl::Status {
    absl::StatusOr<int64_t> n = kernels::NumElementsChecked(dims);
    if (!n.ok()) return absl::InvalidArgumentError(n.status().message());
    const uint64_t size = std::max<uint64_t>(engine::DataTypeSize(type), 1);
    bytes += static_cast<uint64_t>(*n) * size;
    counts->push_back(*n);
    return absl::OkStatus();
  };
  for (const engine::TensorInfo& t : info.inputs) {
    std::vector<int64_t> dims = t.shape;
    if (!dims.empty() && dims[0] < 0) dims[0] = batch;
    if (absl::Status s = add(dims, t.type, &in_elements); !s.ok()) return s;
  }
  const auto shapes = model.OutputShapes(batch);
  if (shapes.size() != info.outputs.size()) {
    return absl::InvalidArgumentError("the model cannot run at this batch");
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (absl::Status s = add(shapes[i], info.outputs[i].type, &out_elements); !s.ok()) return s;
  }
  const uint64_t available = affinity::AvailableMemoryBytes();
  // Each buffer is at most kMaxTensorElements x 8 bytes: the sum cannot wrap.
  if (available > 0 && bytes > available / 2) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the inputs and outputs take %.1f GiB, more than half the %.1f GiB of memory available",
        static_cast<double>(bytes) / (1 << 30), static_cast<double>(available) / (1 << 30)));
  }
  RunBuffers b;
  std::mt19937 rng(7);
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    const engine::TensorInfo& t = info.inputs[i];
    b.inputs.push_back(Words(in_elements[i], t.type));
    FillRandom(engine::DataTypeName(t.type), in_elements[i], -1.0f, 1.0f, &rng,
               reinterpret_cast<char*>(b.inputs.back().data()));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    b.outputs.push_back(Words(out_elements[i], info.outputs[i].type));
  }
  for (auto& v : b.inputs) b.in_ptrs.push_back(v.data());
  for (auto& v : b.outputs) b.out_ptrs.push_back(v.data());
  return b;
}

absl::StatusOr<ProfiledRuns> ProfileRuns(engine::CompiledModel& model, int64_t batch,
                                         double seconds, int64_t min_runs, int64_t max_events) {
  absl::StatusOr<RunBuffers> made = MakeRunBuffers(model, batch);
  if (!made.ok()) return made.status();
  RunBuffers& buffers = *made;
  using Clock = std::chrono::steady_clock;
  model.SetStepEventLimit(max_events);
  model.SetProfiling(true);
  ProfiledRuns result;
  const auto start = Clock::now();
  auto now = start;
  while (result.runs < min_runs || std::chrono::duration<double>(now - start).count() < seconds) {
    const auto before = now;
    absl::Status s = model.Run(batch, buffers.in_ptrs, buffers.out_ptrs);
    if (!s.ok()) {
      model.SetProfiling(false);
      return s;
    }
    ++result.runs;
    now = Clock::now();
    result.run_seconds.push_back(std::chrono::duration<double>(now - before).count());
  }
  model.SetProfiling(false);
  result.wall_seconds = std::chrono::duration<double>(now - start).count();
  result.steps = model.Profile();
  if (max_events > 0) result.events = model.StepEvents();
  return result;
}

}  // namespace numaserve::cli
