#include "tools/numaserve/model_runs.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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

// The largest value an integer of `type` holds (0 for other types).
int64_t IntegerMax(engine::DataType type) {
  using engine::DataType;
  switch (type) {
    case DataType::kInt8:
      return INT8_MAX;
    case DataType::kUint8:
      return UINT8_MAX;
    case DataType::kInt16:
      return INT16_MAX;
    case DataType::kUint16:
      return UINT16_MAX;
    case DataType::kInt32:
      return INT32_MAX;
    case DataType::kUint32:
      return UINT32_MAX;
    case DataType::kInt64:
    case DataType::kUint64:
      return INT64_MAX;
    default:
      return 0;
  }
}

// `elements` integers of `type` (IntegerMax > 0) uniform in [0, bound),
// little-endian, into `out`.
void FillIndices(engine::DataType type, int64_t elements, int64_t bound, std::mt19937* rng,
                 char* out) {
  std::uniform_int_distribution<int64_t> index(0, bound - 1);
  const size_t size = engine::DataTypeSize(type);
  for (int64_t i = 0; i < elements; ++i) {
    const uint64_t v = static_cast<uint64_t>(index(*rng));
    for (size_t b = 0; b < size; ++b) out[i * size + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  }
}

}  // namespace

absl::StatusOr<IndexBounds> ParseIndexBounds(const std::string& text) {
  IndexBounds bounds;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, '=');
    int64_t bound = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &bound) || bound < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", part, "' is not an input's name, '=' and a bound >= 1 (input_ids=30522)"));
    }
    bounds[std::string(kv.first)] = bound;
  }
  return bounds;
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1,
                    static_cast<size_t>(std::llround(q * static_cast<double>(v.size() - 1))))];
}

absl::StatusOr<RunBuffers> MakeRunBuffers(engine::CompiledModel& model, int64_t batch,
                                          const IndexBounds& bounds) {
  const engine::ModelInfo& info = model.info();
  if (batch < 1) return absl::InvalidArgumentError("a batch below 1");
  for (const auto& [name, bound] : bounds) {
    auto it = std::find_if(info.inputs.begin(), info.inputs.end(),
                           [&](const engine::TensorInfo& t) { return t.name == name; });
    if (it == info.inputs.end() || IntegerMax(it->type) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "index bound for '", name, "': the model has no integer input of that name"));
    }
    if (bound - 1 > IntegerMax(it->type)) {
      return absl::InvalidArgumentError(absl::StrCat("index bound ", bound, " for '", name,
                                                     "': past what its type (",
                                                     engine::DataTypeName(it->type), ") holds"));
    }
  }
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
    char* data = reinterpret_cast<char*>(b.inputs.back().data());
    if (auto bound = bounds.find(t.name); bound != bounds.end()) {
      FillIndices(t.type, in_elements[i], bound->second, &rng, data);
      continue;
    }
    FillRandom(engine::DataTypeName(t.type), in_elements[i], -1.0f, 1.0f, &rng, data);
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    b.outputs.push_back(Words(out_elements[i], info.outputs[i].type));
  }
  for (auto& v : b.inputs) b.in_ptrs.push_back(v.data());
  for (auto& v : b.outputs) b.out_ptrs.push_back(v.data());
  return b;
}

absl::StatusOr<ProfiledRuns> ProfileRuns(engine::CompiledModel& model, int64_t batch,
                                         double seconds, int64_t min_runs, int64_t max_events,
                                         const IndexBounds& bounds) {
  absl::StatusOr<RunBuffers> made = MakeRunBuffers(model, batch, bounds);
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
