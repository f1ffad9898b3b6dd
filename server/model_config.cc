#include "server/model_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
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

bool IsIdentifierStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsIdentifierChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The offset of the first character at or after `i` that is neither white
// space nor part of a # comment.
size_t SkipSpace(const std::string& text, size_t i) {
  while (i < text.size()) {
    if (text[i] == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
    } else if (std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
    } else {
      break;
    }
  }
  return i;
}

// "<origin>:<line>:<column>" of byte `offset`, both counted from 1.
std::string Position(const std::string& text, size_t offset, const std::string& origin) {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::StrFormat("%s:%d:%d", origin, line, offset - line_start + 1);
}

// instances_per_domain is an int32, so before TextFormat reads the file the
// words `auto` and `per_core` written as its value become kInstancesAuto
// and kInstancesPerCore, padded with spaces to the word's length so the line
// and column of every later error stay those of the file. Strings and
// comments are left alone. A negative number written there is an error
// (those values stand for the words).
absl::Status RewriteInstanceWords(std::string* text, const std::string& origin) {
  constexpr std::string_view kField = "instances_per_domain";
  std::string& t = *text;
  size_t i = 0;
  while (i < t.size()) {
    const char c = t[i];
    if (c == '#') {
      while (i < t.size() && t[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      for (++i; i < t.size() && t[i] != c && t[i] != '\n'; ++i) {
        if (t[i] == '\\') ++i;  // the escaped character
      }
      ++i;
    } else if (IsIdentifierStart(c) || std::isdigit(static_cast<unsigned char>(c))) {
      // An identifier, or a number (digits and letters: 0x1F, 1e5).
      const size_t start = i;
      while (i < t.size() && IsIdentifierChar(t[i])) ++i;
      if (std::string_view(t).substr(start, i - start) != kField) continue;
      size_t v = SkipSpace(t, i);
      if (v >= t.size() || t[v] != ':') continue;
      v = SkipSpace(t, v + 1);
      if (v < t.size() && t[v] == '-') {
        size_t end = v + 1;
        while (end < t.size() && IsIdentifierChar(t[end])) ++end;
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: instance_placement.instances_per_domain: %s: expected a count "
                            ">= 1, auto or per_core",
                            Position(t, v, origin), t.substr(v, end - v)));
      }
      size_t end = v;
      while (end < t.size() && IsIdentifierChar(t[end])) ++end;
      const std::string_view word = std::string_view(t).substr(v, end - v);
      int value = 0;
      if (word == "auto") {
        value = kInstancesAuto;
      } else if (word == "per_core") {
        value = kInstancesPerCore;
      } else {
        continue;
      }
      std::string replacement = absl::StrCat(value);
      replacement.resize(word.size(), ' ');
      t.replace(v, word.size(), replacement);
      i = end;
    } else {
      ++i;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> ParseInstances(std::string_view text) {
  if (text == "auto") return kInstancesAuto;
  if (text == "per_core") return kInstancesPerCore;
  const absl::string_view digits(text.data(), text.size());
  int n = 0;
  if (absl::SimpleAtoi(digits, &n) && n >= 1 && n <= kMaxInstances) return n;
  return absl::InvalidArgumentError(
      absl::StrFormat("instances '%s': expected a count 1..%d, auto or per_core",
                      absl::CHexEscape(digits), kMaxInstances));
}

std::string FormatInstances(int instances) {
  if (instances == kInstancesAuto) return "auto";
  if (instances == kInstancesPerCore) return "per_core";
  return absl::StrCat(std::max(1, instances));
}

const std::vector<std::string>& KnownGemmBackends() {
  static const std::vector<std::string> kBackends = {"auto", "onednn", "blis", "openblas"};
  return kBackends;
}

absl::StatusOr<config::ModelConfig> ParseModelConfigText(const std::string& text,
                                                         const std::string& origin) {
  std::string rewritten = text;
  if (absl::Status s = RewriteInstanceWords(&rewritten, origin); !s.ok()) return s;
  config::ModelConfig config;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors(origin);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(rewritten, &config)) {
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
  // auto and per_core were read as kInstancesAuto and kInstancesPerCore.
  if (p.instances_per_domain() < kInstancesPerCore) {
    return Invalid(
        model, "instance_placement.instances_per_domain",
        absl::StrCat(p.instances_per_domain(), ": expected a count >= 1, auto or per_core"));
  }
  if (p.instances_per_domain() > kMaxInstances) {
    return Invalid(
        model, "instance_placement.instances_per_domain",
        absl::StrFormat("%d is above the limit of %d", p.instances_per_domain(), kMaxInstances));
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
