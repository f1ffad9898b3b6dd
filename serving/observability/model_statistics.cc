#include "serving/observability/model_statistics.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/mutex.h"

namespace numaserve::serving {
namespace {

void Put(uint64_t count, uint64_t ns, inference::StatisticDuration* out) {
  out->set_count(count);
  out->set_ns(ns);
}

}  // namespace

void ModelStatistics::Duration::Add(double seconds) {
  ++count;
  ns += static_cast<uint64_t>(std::llround(std::max(0.0, seconds) * 1e9));
}

void ModelStatistics::RecordSuccess(const std::string& model, int64_t version, int64_t rows,
                                    double total_s, double queue_s, double input_s, double infer_s,
                                    double output_s) {
  const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  base::MutexLock lock(&mu_);
  Stats& s = stats_[{model, version}];
  s.last_inference_ms = static_cast<uint64_t>(now_ms);
  s.inference_count += static_cast<uint64_t>(rows);
  s.success.Add(total_s);
  s.queue.Add(queue_s);
  s.input.Add(input_s);
  s.infer.Add(infer_s);
  s.output.Add(output_s);
}

void ModelStatistics::Register(const std::string& model, int64_t version) {
  base::MutexLock lock(&mu_);
  stats_[{model, version}];
}

void ModelStatistics::RecordFailure(const std::string& model, int64_t version, double total_s) {
  base::MutexLock lock(&mu_);
  stats_[{model, version}].fail.Add(total_s);
}

void ModelStatistics::RecordExecution(const std::string& model, int64_t version, int64_t rows,
                                      double input_s, double infer_s, double output_s) {
  base::MutexLock lock(&mu_);
  Stats& s = stats_[{model, version}];
  ++s.execution_count;
  BatchStats& b = s.batches[rows];
  b.input.Add(input_s);
  b.infer.Add(infer_s);
  b.output.Add(output_s);
}

void ModelStatistics::Fill(const std::string& model, int64_t version,
                           inference::ModelStatisticsResponse* response) const {
  base::MutexLock lock(&mu_);
  for (const auto& [key, s] : stats_) {
    if (!model.empty() && key.first != model) continue;
    if (version != 0 && key.second != version) continue;
    auto* m = response->add_model_stats();
    m->set_name(key.first);
    m->set_version(absl::StrCat(key.second));
    m->set_last_inference(s.last_inference_ms);
    m->set_inference_count(s.inference_count);
    m->set_execution_count(s.execution_count);
    auto* i = m->mutable_inference_stats();
    Put(s.success.count, s.success.ns, i->mutable_success());
    Put(s.fail.count, s.fail.ns, i->mutable_fail());
    Put(s.queue.count, s.queue.ns, i->mutable_queue());
    Put(s.input.count, s.input.ns, i->mutable_compute_input());
    Put(s.infer.count, s.infer.ns, i->mutable_compute_infer());
    Put(s.output.count, s.output.ns, i->mutable_compute_output());
    i->mutable_cache_hit();
    i->mutable_cache_miss();
    for (const auto& [rows, b] : s.batches) {
      auto* out = m->add_batch_stats();
      out->set_batch_size(static_cast<uint64_t>(rows));
      Put(b.input.count, b.input.ns, out->mutable_compute_input());
      Put(b.infer.count, b.infer.ns, out->mutable_compute_infer());
      Put(b.output.count, b.output.ns, out->mutable_compute_output());
    }
  }
}

}  // namespace numaserve::serving
