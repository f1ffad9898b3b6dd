#include "serving/workers/warmup.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace numaserve::serving {
namespace {

// A buffer of `bytes`, 8-byte aligned, zeroed.
std::vector<uint64_t> Buffer(size_t bytes) { return std::vector<uint64_t>((bytes + 7) / 8, 0); }

// Fills `elements` elements of `type` at `data` with random values.
void FillRandom(engine::DataType type, int64_t elements, void* data, std::mt19937* rng) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  if (type == engine::DataType::kFloat32) {
    auto* f = static_cast<float*>(data);
    for (int64_t i = 0; i < elements; ++i) f[i] = static_cast<float>(uniform(*rng));
  } else if (type == engine::DataType::kFloat64) {
    auto* d = static_cast<double*>(data);
    for (int64_t i = 0; i < elements; ++i) d[i] = uniform(*rng);
  } else {
    const size_t size = engine::DataTypeSize(type);
    auto* b = static_cast<unsigned char*>(data);
    for (int64_t i = 0; i < elements; ++i) b[static_cast<size_t>(i) * size] = (*rng)() & 1;
  }
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// One warm-up: its buffers made once, then `count` runs.
absl::Status RunWarmup(engine::CompiledModel& model, const worker::Warmup& w) {
  const engine::ModelInfo& info = model.info();
  if (static_cast<size_t>(w.input_shapes_size()) != info.inputs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("it gives ", w.input_shapes_size(),
                                                   " input shapes; the model has ",
                                                   info.inputs.size(), " inputs"));
  }
  engine::CompiledModel::InputShapes shapes;
  for (const worker::Shape& s : w.input_shapes())
    shapes.emplace_back(s.dims().begin(), s.dims().end());
  auto out_shapes = model.OutputShapes(shapes);  // checks the signature first
  if (!out_shapes.ok()) return out_shapes.status();
  std::mt19937 rng(12345);
  std::vector<std::vector<uint64_t>> buffers;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t n = Elements(shapes[i]);
    buffers.push_back(Buffer(static_cast<size_t>(n) * engine::DataTypeSize(info.inputs[i].type)));
    if (static_cast<int>(i) < w.random_data_size() && w.random_data(static_cast<int>(i))) {
      FillRandom(info.inputs[i].type, n, buffers.back().data(), &rng);
    }
    inputs.push_back(buffers.back().data());
  }
  for (size_t j = 0; j < out_shapes->size() && j < info.outputs.size(); ++j) {
    buffers.push_back(Buffer(static_cast<size_t>(Elements((*out_shapes)[j])) *
                             engine::DataTypeSize(info.outputs[j].type)));
    outputs.push_back(buffers.back().data());
  }
  for (uint32_t run = 0; run < std::max<uint32_t>(1, w.count()); ++run) {
    if (absl::Status s = model.Run(shapes, inputs, outputs); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunWarmups(engine::CompiledModel& model, const worker::LoadModel& load,
                        std::string* report) {
  for (const worker::Warmup& w : load.warmup()) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status s = RunWarmup(model, w); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("warm-up '", w.name(), "': ", s.message()));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (report != nullptr) {
      absl::StrAppend(
          report, report->empty() ? "" : ", ",
          absl::StrFormat("'%s' %d run%s in %.1f ms", w.name(), std::max<uint32_t>(1, w.count()),
                          std::max<uint32_t>(1, w.count()) == 1 ? "" : "s", ms));
    }
  }
  return absl::OkStatus();
}

}  // namespace numaserve::serving
