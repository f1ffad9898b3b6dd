#include "server/model_runs.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "server/datatypes.h"

namespace numaserve::server {
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
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

RunBuffers MakeRunBuffers(engine::CompiledModel& model, int64_t batch) {
  const engine::ModelInfo& info = model.info();
  RunBuffers b;
  std::mt19937 rng(7);
  for (const engine::TensorInfo& t : info.inputs) {
    int64_t n = 1;
    for (size_t d = 0; d < t.shape.size(); ++d)
      n *= (d == 0 && t.shape[d] < 0) ? batch : t.shape[d];
    b.inputs.push_back(Words(n, t.type));
    FillRandom(engine::DataTypeName(t.type), n, -1.0f, 1.0f, &rng,
               reinterpret_cast<char*>(b.inputs.back().data()));
  }
  const auto shapes = model.OutputShapes(batch);
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : shapes[i]) n *= d;
    b.outputs.push_back(Words(n, info.outputs[i].type));
  }
  for (auto& v : b.inputs) b.in_ptrs.push_back(v.data());
  for (auto& v : b.outputs) b.out_ptrs.push_back(v.data());
  return b;
}

absl::StatusOr<ProfiledRuns> ProfileRuns(engine::CompiledModel& model, int64_t batch,
                                         double seconds, int64_t min_runs, int64_t max_events) {
  RunBuffers buffers = MakeRunBuffers(model, batch);
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

}  // namespace numaserve::server
