#include "server/model_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace numaserve::server {
namespace {

// Keeps the first problem TextFormat reports, with its position.
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  explicit FirstError(std::string origin) : origin_(std::move(origin)) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (!error_.empty()) return;
    // TextFormat counts from 0; editors count from 1.
    error_ = absl::StrFormat("%s:%d:%d: %s", origin_, line + 1, column + 1, message);
  }
  const std::string& error() const { return error_; }

 private:
  std::string origin_;
  std::string error_;
};

absl::Status Invalid(const std::string& model, const std::string& field,
                     const std::string& problem) {
  return absl::InvalidArgumentError(
      absl::StrFormat("model '%s' %s: %s: %s", model, kModelConfigFile, field, problem));
}

std::string Dims(const std::vector<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

absl::Status CheckTensors(const std::string& model, const char* field,
                          const google::protobuf::RepeatedPtrField<config::ModelTensor>& listed,
                          const std::vector<engine::TensorInfo>& actual, bool batched_config) {
  std::set<std::string> seen;
  for (const auto& t : listed) {
    const std::string where = absl::StrCat(field, " '", t.name(), "'");
    if (!seen.insert(t.name()).second) return Invalid(model, where, "listed twice");
    auto it = std::find_if(actual.begin(), actual.end(),
                           [&](const engine::TensorInfo& a) { return a.name == t.name(); });
    if (it == actual.end()) {
      std::vector<std::string> names;
      for (const auto& a : actual) names.push_back(a.name);
      return Invalid(model, where,
                     absl::StrCat("the ONNX model has no such tensor (it has ",
                                  absl::StrJoin(names, ", "), ")"));
    }
    const std::string type = engine::DataTypeName(it->type);
    // "INT64", or Triton's spelling "TYPE_INT64".
    const absl::string_view given = absl::StripPrefix(t.data_type(), "TYPE_");
    if (!t.data_type().empty() && given != type) {
      return Invalid(model, absl::StrCat(where, " data_type"),
                     absl::StrCat("'", t.data_type(), "' but the ONNX model says ", type));
    }
    std::vector<int64_t> expected = it->shape;
    if (batched_config && !expected.empty()) expected.erase(expected.begin());
    std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
    bool match = dims.size() == expected.size();
    for (size_t d = 0; match && d < dims.size(); ++d) {
      match = expected[d] < 0 || dims[d] == expected[d];
    }
    if (!match) {
      return Invalid(model, absl::StrCat(where, " dims"),
                     absl::StrCat(Dims(dims), " but the ONNX model has ", Dims(expected),
                                  batched_config ? " (without the batch dimension)" : ""));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& KnownGemmBackends() {
  static const std::vector<std::string> kBackends = {"auto", "onednn", "blis", "openblas"};
  return kBackends;
}

absl::StatusOr<config::ModelConfig> ParseModelConfigText(const std::string& text,
                                                         const std::string& origin) {
  config::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors(origin);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(
        errors.error().empty() ? absl::StrCat(origin, ": cannot parse") : errors.error());
  }
  return config;
}

absl::StatusOr<config::ModelConfig> ParseModelConfig(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseModelConfigText(text.str(), path);
}

absl::Status ValidateModelConfigFields(const config::ModelConfig& c, const std::string& model,
                                       int num_workers) {
  if (!c.name().empty() && c.name() != model) {
    return Invalid(model, "name",
                   absl::StrCat("'", c.name(), "' differs from the directory name '", model, "'"));
  }
  if (c.max_batch_size() < 0) {
    return Invalid(model, "max_batch_size", absl::StrCat(c.max_batch_size(), " is negative"));
  }
  if (c.has_dynamic_batching()) {
    if (c.max_batch_size() == 0) {
      return Invalid(model, "dynamic_batching", "needs max_batch_size > 0");
    }
    for (int size : c.dynamic_batching().preferred_batch_size()) {
      if (size < 1 || size > c.max_batch_size()) {
        return Invalid(
            model, "dynamic_batching.preferred_batch_size",
            absl::StrFormat("%d is outside 1..max_batch_size (%d)", size, c.max_batch_size()));
      }
    }
  }
  // Durations become std::chrono values in nanoseconds and are added to
  // clocks: a uint64 count above 2^63 / 1000 would overflow there. Nothing
  // useful lies beyond a day.
  const auto& d = c.dynamic_batching();
  for (const auto& [field, us] :
       {std::pair<const char*, uint64_t>{"dynamic_batching.default_timeout_microseconds",
                                         d.default_timeout_microseconds()},
        std::pair<const char*, uint64_t>{"dynamic_batching.max_queue_delay_microseconds",
                                         d.max_queue_delay_microseconds()}}) {
    if (us > kMaxConfigMicroseconds) {
      return Invalid(
          model, field,
          absl::StrFormat("%u is above the limit of %d (24 hours)", us, kMaxConfigMicroseconds));
    }
  }
  const auto& p = c.instance_placement();
  // Whether N copies fit is checked by each worker when it loads the model
  // (CheckInstancesFit), against its own cores.
  if (p.instances_per_domain() < 0) {
    return Invalid(model, "instance_placement.instances_per_domain", "is negative");
  }
  if (p.all() && p.domains_size() > 0) {
    return Invalid(model, "instance_placement", "give either `all` or `domains`, not both");
  }
  for (int d : p.domains()) {
    if (d < 0 || d >= num_workers) {
      return Invalid(model, "instance_placement.domains",
                     absl::StrFormat("worker %d does not exist (this server has workers 0..%d)", d,
                                     num_workers - 1));
    }
  }
  const auto& backends = KnownGemmBackends();
  if (!c.gemm_backend().empty() &&
      std::find(backends.begin(), backends.end(), c.gemm_backend()) == backends.end()) {
    return Invalid(model, "gemm_backend",
                   absl::StrCat("'", c.gemm_backend(), "' is not built in (available: ",
                                absl::StrJoin(backends, ", "), ")"));
  }
  if (c.version_policy().has_latest() && c.version_policy().latest().num_versions() > 1000) {
    return Invalid(model, "version_policy.latest.num_versions", "is unreasonably large");
  }
  return absl::OkStatus();
}

absl::Status ValidateModelConfig(const config::ModelConfig& c, const std::string& model,
                                 const engine::ModelInfo& info, int num_workers) {
  if (absl::Status s = ValidateModelConfigFields(c, model, num_workers); !s.ok()) return s;
  if (c.max_batch_size() > 0 && !info.batched) {
    return Invalid(model, "max_batch_size",
                   absl::StrCat(c.max_batch_size(),
                                " needs dim 0 of every input and output to be dynamic, but ",
                                info.path, " has fixed batch dimensions (use max_batch_size: 0)"));
  }
  const bool batched = c.max_batch_size() > 0;
  if (absl::Status s = CheckTensors(model, "input", c.input(), info.inputs, batched); !s.ok()) {
    return s;
  }
  return CheckTensors(model, "output", c.output(), info.outputs, batched);
}

absl::Status CheckInstancesFit(const std::string& model, int instances, int worker, int cores) {
  if (instances <= 1 || instances <= cores) return absl::OkStatus();
  return Invalid(model, "instance_placement.instances_per_domain",
                 absl::StrFormat("%d instances need a core each, but worker %d has %d core%s",
                                 instances, worker, cores, cores == 1 ? "" : "s"));
}

absl::StatusOr<std::vector<int64_t>> SelectVersions(const config::ModelConfig& c,
                                                    const std::vector<int64_t>& available) {
  const auto& policy = c.version_policy();
  if (policy.has_all()) return available;
  if (policy.has_specific()) {
    std::vector<int64_t> chosen;
    for (int64_t v : policy.specific().versions()) {
      if (!std::binary_search(available.begin(), available.end(), v)) {
        return absl::NotFoundError(
            absl::StrFormat("%s: version_policy.specific names version %d, which has no directory",
                            kModelConfigFile, v));
      }
      chosen.push_back(v);
    }
    std::sort(chosen.begin(), chosen.end());
    chosen.erase(std::unique(chosen.begin(), chosen.end()), chosen.end());
    return chosen;
  }
  size_t n = policy.has_latest() ? std::max<uint32_t>(1, policy.latest().num_versions()) : 1;
  n = std::min(n, available.size());
  return std::vector<int64_t>(available.end() - static_cast<std::ptrdiff_t>(n), available.end());
}

std::vector<int> PlacementWorkers(const config::ModelConfig& c, int num_workers) {
  std::vector<int> workers;
  if (c.instance_placement().domains_size() == 0) {
    for (int w = 0; w < num_workers; ++w) workers.push_back(w);
    return workers;
  }
  std::set<int> chosen(c.instance_placement().domains().begin(),
                       c.instance_placement().domains().end());
  return std::vector<int>(chosen.begin(), chosen.end());
}

}  // namespace numaserve::server
