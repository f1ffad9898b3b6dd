#include "serving/repository/model_config.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "serving/repository/model_warmup.h"
#include "triton_config_file.pb.h"

namespace numaserve::serving {
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
    line_ = line;
    column_ = column;
  }
  const std::string& error() const { return error_; }
  // Whether this error lies further into the file than `other`'s.
  bool After(const FirstError& other) const {
    return std::pair(line_, column_) > std::pair(other.line_, other.column_);
  }

 private:
  std::string origin_;
  std::string error_;
  int line_ = -1;
  int column_ = -1;
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

// --- Triton's schema -------------------------------------------------------

namespace pb = google::protobuf;
namespace triton = config::triton;

// Where fields of a Triton file were written, for errors that point at them.
class TritonLocator {
 public:
  TritonLocator(const std::string& origin, const pb::TextFormat::ParseInfoTree* tree)
      : origin_(origin), tree_(tree) {}

  // "<origin>:<line>:<column>" of `field` of the top-level message (element
  // `index` of a repeated one), or of `nested_field` inside that element.
  std::string At(const char* field, int index = -1, const char* nested_field = nullptr,
                 int nested_index = -1) const {
    const pb::Descriptor* d = triton::ModelConfig::descriptor();
    const pb::FieldDescriptor* f = d->FindFieldByName(field);
    if (f == nullptr) return origin_;
    if (nested_field == nullptr) return Format(tree_->GetLocation(f, index));
    const pb::TextFormat::ParseInfoTree* nested = tree_->GetTreeForNested(f, index);
    const pb::FieldDescriptor* n =
        f->message_type() != nullptr ? f->message_type()->FindFieldByName(nested_field) : nullptr;
    if (nested == nullptr || n == nullptr) return Format(tree_->GetLocation(f, index));
    return Format(nested->GetLocation(n, nested_index));
  }

 private:
  std::string Format(const pb::TextFormat::ParseLocation& at) const {
    if (at.line < 0) return origin_;
    return absl::StrFormat("%s:%d:%d", origin_, at.line + 1, at.column + 1);
  }

  const std::string& origin_;
  const pb::TextFormat::ParseInfoTree* tree_;
};

absl::Status Refuse(const std::string& where, const std::string& field,
                    const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", field, ": ", problem));
}

// Triton's TYPE_FP32 as numaserve (and KServe) spell it: "FP32"; TYPE_STRING
// is "BYTES". Unset: "" (not checked).
std::string DataTypeFromTriton(inference::DataType type) {
  if (type == inference::TYPE_INVALID) return "";
  if (type == inference::TYPE_STRING) return "BYTES";
  return std::string(absl::StripPrefix(inference::DataType_Name(type), "TYPE_"));
}

// The Triton fields numaserve acts on, by dotted path; true where the
// field's own fields are looked at one by one (the others in it are
// reported as ignored), false where the whole field is used.
const std::map<std::string, bool>& UsedTritonFields() {
  static const auto* kUsed = new std::map<std::string, bool>{
      {"name", false},
      {"platform", false},
      {"backend", false},
      {"version_policy", false},
      {"max_batch_size", false},
      {"input", true},
      {"input.name", false},
      {"input.data_type", false},
      {"input.dims", false},
      {"input.reshape", false},  // refused unless it equals dims
      {"output", true},
      {"output.name", false},
      {"output.data_type", false},
      {"output.dims", false},
      {"output.reshape", false},
      {"instance_group", true},
      {"instance_group.kind", false},
      {"instance_group.count", false},
      {"instance_group.gpus", false},  // refused
      {"dynamic_batching", true},
      {"dynamic_batching.preferred_batch_size", false},
      {"dynamic_batching.max_queue_delay_microseconds", false},
      {"dynamic_batching.priority_levels", false},
      {"dynamic_batching.default_priority_level", false},
      {"dynamic_batching.default_queue_policy", true},
      {"dynamic_batching.default_queue_policy.default_timeout_microseconds", false},
      {"dynamic_batching.default_queue_policy.max_queue_size", false},
      // A shorter client deadline always wins on numaserve.
      {"dynamic_batching.default_queue_policy.allow_timeout_override", false},
      {"sequence_batching", false},       // refused
      {"ensemble_scheduling", false},     // refused
      {"default_model_filename", false},  // "model.onnx", or refused
      {"instance_placement", false},
      {"gemm_backend", false},
      {"precision", false},
      {"max_activation_bytes", false},
      {"model_warmup", false},
  };
  return *kUsed;
}

// Appends the paths of the fields set in `m` (at `prefix`) that numaserve
// does not act on to `ignored`, each once.
void CollectIgnored(const pb::Message& m, const std::string& prefix,
                    std::vector<std::string>* ignored) {
  std::vector<const pb::FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    const std::string path = prefix.empty() ? f->name() : absl::StrCat(prefix, ".", f->name());
    auto used = UsedTritonFields().find(path);
    if (used == UsedTritonFields().end()) {
      if (std::find(ignored->begin(), ignored->end(), path) == ignored->end()) {
        ignored->push_back(path);
      }
      continue;
    }
    if (!used->second || f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const pb::Reflection* r = m.GetReflection();
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(m, f); ++i) {
        CollectIgnored(r->GetRepeatedMessage(m, f, i), path, ignored);
      }
    } else {
      CollectIgnored(r->GetMessage(m, f), path, ignored);
    }
  }
}

template <typename TritonTensor>
absl::Status ConvertTensors(const pb::RepeatedPtrField<TritonTensor>& from, const char* field,
                            const TritonLocator& at,
                            pb::RepeatedPtrField<config::ModelTensor>* to) {
  for (int i = 0; i < from.size(); ++i) {
    const TritonTensor& t = from[i];
    if (t.has_reshape() && !std::equal(t.dims().begin(), t.dims().end(),
                                       t.reshape().shape().begin(), t.reshape().shape().end())) {
      return Refuse(at.At(field, i, "reshape"), absl::StrCat(field, " '", t.name(), "' reshape"),
                    absl::StrCat("numaserve passes tensors in the ONNX model's own shape; give "
                                 "dims as the model has them (",
                                 Dims({t.reshape().shape().begin(), t.reshape().shape().end()}),
                                 ") and leave out reshape"));
    }
    config::ModelTensor* out = to->Add();
    out->set_name(t.name());
    out->set_data_type(DataTypeFromTriton(t.data_type()));
    *out->mutable_dims() = t.dims();
  }
  return absl::OkStatus();
}

// Refuses a Triton config that asks for another runtime than numaserve's:
// another platform or backend, sequences, ensembles, another model file.
absl::Status CheckTritonRuntime(const triton::ModelConfig& t, const TritonLocator& at) {
  if (!t.platform().empty() && t.platform() != "onnxruntime_onnx") {
    return Refuse(at.At("platform"), "platform",
                  absl::StrCat("'", t.platform(),
                               "': numaserve serves ONNX models only (platform "
                               "\"onnxruntime_onnx\" or backend \"onnxruntime\")"));
  }
  if (!t.backend().empty() && t.backend() != "onnxruntime") {
    return Refuse(at.At("backend"), "backend",
                  absl::StrCat("'", t.backend(),
                               "': numaserve serves ONNX models only (backend \"onnxruntime\" "
                               "or platform \"onnxruntime_onnx\")"));
  }
  if (t.has_sequence_batching()) {
    return Refuse(at.At("sequence_batching"), "sequence_batching",
                  "stateful sequences are not supported (numaserve computes each request on its "
                  "own or in a dynamic batch)");
  }
  if (t.has_ensemble_scheduling()) {
    return Refuse(at.At("ensemble_scheduling"), "ensemble_scheduling",
                  "ensembles are not supported (numaserve serves one ONNX file per model)");
  }
  if (!t.default_model_filename().empty() && t.default_model_filename() != "model.onnx") {
    return Refuse(at.At("default_model_filename"), "default_model_filename",
                  absl::StrCat("'", t.default_model_filename(),
                               "': numaserve reads <version>/model.onnx; rename the file"));
  }
  return absl::OkStatus();
}

// Triton's instance_group as c's instance_placement.instances_per_domain
// (the CPU copies shared among the workers); refuses GPU groups, counts out
// of range and a config that gives both.
absl::Status ConvertInstanceGroups(const triton::ModelConfig& t, const TritonLocator& at,
                                   int num_workers, config::ModelConfig* c) {
  int64_t copies = 0;
  for (int i = 0; i < t.instance_group_size(); ++i) {
    const triton::ModelInstanceGroup& g = t.instance_group(i);
    const std::string field = absl::StrCat("instance_group[", i, "]");
    if (g.kind() == inference::ModelInstanceGroup::KIND_GPU ||
        g.kind() == inference::ModelInstanceGroup::KIND_MODEL) {
      return Refuse(at.At("instance_group", i, "kind"), absl::StrCat(field, ".kind"),
                    absl::StrCat(inference::ModelInstanceGroup::Kind_Name(g.kind()),
                                 ": numaserve runs models on CPU workers only (use KIND_CPU)"));
    }
    if (g.gpus_size() > 0) {
      return Refuse(at.At("instance_group", i, "gpus", 0), absl::StrCat(field, ".gpus"),
                    "numaserve runs models on CPU workers only (leave out gpus)");
    }
    if (g.count() < 0 || g.count() > kMaxInstances) {
      return Refuse(at.At("instance_group", i, "count"), absl::StrCat(field, ".count"),
                    absl::StrFormat("%d is outside 1..%d", g.count(), kMaxInstances));
    }
    copies += g.count() > 0 ? g.count() : 1;  // Triton's default count is 1
  }
  if (t.instance_group_size() > 0) {
    if (t.instance_placement().instances_per_domain() != 0) {
      return Refuse(at.At("instance_group", 0), "instance_group",
                    "give either Triton's instance_group or "
                    "instance_placement.instances_per_domain, not both");
    }
    // Triton's count is the model's copies on the CPU in all; numaserve's
    // is per worker. The workers holding the model share them, rounded up.
    std::set<int> domains(t.instance_placement().domains().begin(),
                          t.instance_placement().domains().end());
    const int64_t workers = std::max<int64_t>(1, domains.empty() ? num_workers : domains.size());
    const int64_t per_worker = (copies + workers - 1) / workers;
    c->mutable_instance_placement()->set_instances_per_domain(
        static_cast<int32_t>(std::min<int64_t>(per_worker, int64_t{kMaxInstances} + 1)));
  }
  return absl::OkStatus();
}

// Triton's model_warmup as numaserve's; input_data_file is refused.
absl::Status ConvertWarmups(const triton::ModelConfig& t, const TritonLocator& at,
                            config::ModelConfig* c) {
  for (int i = 0; i < t.model_warmup_size(); ++i) {
    const triton::ModelWarmup& w = t.model_warmup(i);
    config::ModelWarmup* out = c->add_model_warmup();
    out->set_name(w.name());
    out->set_batch_size(w.batch_size());
    out->set_count(w.count());
    for (const auto& [name, in] : w.inputs()) {
      if (in.input_data_type_case() == triton::ModelWarmup::Input::kInputDataFile) {
        return Refuse(at.At("model_warmup", i),
                      absl::StrCat("model_warmup.inputs['", name, "'].input_data_file"),
                      "numaserve warms up with zero_data or random_data only");
      }
      config::ModelWarmup::Input& o = (*out->mutable_inputs())[name];
      o.set_data_type(DataTypeFromTriton(in.data_type()));
      *o.mutable_dims() = in.dims();
      o.set_zero_data(in.zero_data());
      o.set_random_data(in.random_data());
    }
  }
  return absl::OkStatus();
}

// Triton's config as numaserve's. Refuses what numaserve cannot honour,
// naming the field and where it is written.
absl::StatusOr<config::ModelConfig> FromTriton(const triton::ModelConfig& t,
                                               const TritonLocator& at, int num_workers) {
  if (absl::Status s = CheckTritonRuntime(t, at); !s.ok()) return s;
  config::ModelConfig c;
  c.set_name(t.name());
  c.set_max_batch_size(t.max_batch_size());
  // Same messages, other package: copied through the wire format.
  if (t.has_version_policy()) {
    c.mutable_version_policy()->ParseFromString(t.version_policy().SerializeAsString());
  }
  if (absl::Status s = ConvertTensors(t.input(), "input", at, c.mutable_input()); !s.ok()) {
    return s;
  }
  if (absl::Status s = ConvertTensors(t.output(), "output", at, c.mutable_output()); !s.ok()) {
    return s;
  }
  *c.mutable_instance_placement() = t.instance_placement();
  c.set_gemm_backend(t.gemm_backend());
  c.set_precision(t.precision());
  c.set_max_activation_bytes(t.max_activation_bytes());
  if (absl::Status s = ConvertInstanceGroups(t, at, num_workers, &c); !s.ok()) return s;
  if (absl::Status s = ConvertWarmups(t, at, &c); !s.ok()) return s;
  if (t.has_dynamic_batching()) {
    const triton::ModelDynamicBatching& d = t.dynamic_batching();
    config::DynamicBatching* out = c.mutable_dynamic_batching();
    *out->mutable_preferred_batch_size() = d.preferred_batch_size();
    out->set_max_queue_delay_microseconds(d.max_queue_delay_microseconds());
    out->set_default_timeout_microseconds(d.default_queue_policy().default_timeout_microseconds());
    out->set_max_queue_size(d.default_queue_policy().max_queue_size());
    out->set_priority_levels(d.priority_levels());
    out->set_default_priority_level(d.default_priority_level());
  }
  return c;
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
  static const std::vector<std::string> kBackends = {"auto", "onednn", "blis", "openblas",
                                                     "numaserve"};
  return kBackends;
}

absl::StatusOr<ModelConfigFile> ReadModelConfigText(const std::string& text,
                                                    const std::string& origin, int num_workers) {
  std::string rewritten = text;
  if (absl::Status s = RewriteInstanceWords(&rewritten, origin); !s.ok()) return s;
  ModelConfigFile file;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors(origin);
  parser.RecordErrorsTo(&errors);
  if (parser.ParseFromString(rewritten, &file.config)) return file;

  // Not numaserve's schema: perhaps Triton's.
  triton::ModelConfig t;
  google::protobuf::TextFormat::Parser triton_parser;
  FirstError triton_errors(origin);
  triton_parser.RecordErrorsTo(&triton_errors);
  google::protobuf::TextFormat::ParseInfoTree locations;
  triton_parser.WriteLocationsTo(&locations);
  if (!triton_parser.ParseFromString(rewritten, &t)) {
    // The schema that read further is the one the file is written in.
    const FirstError& first = triton_errors.After(errors) ? triton_errors : errors;
    return absl::InvalidArgumentError(first.error().empty() ? absl::StrCat(origin, ": cannot parse")
                                                            : first.error());
  }
  auto converted = FromTriton(t, TritonLocator(origin, &locations), num_workers);
  if (!converted.ok()) return converted.status();
  file.config = *std::move(converted);
  file.triton = true;
  CollectIgnored(t, "", &file.ignored_fields);
  return file;
}

absl::StatusOr<ModelConfigFile> ReadModelConfigJson(const std::string& json,
                                                    const std::string& origin, int num_workers) {
  if (json.size() > kMaxConfigJsonBytes) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %d bytes, above the limit of %d", origin,
                                                      json.size(), kMaxConfigJsonBytes));
  }
  pb::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  ModelConfigFile file;
  const auto own = pb::util::JsonStringToMessage(json, &file.config, options);
  if (own.ok()) {
    if (file.config.instance_placement().instances_per_domain() < 0) {
      return Refuse(origin, "instance_placement.instances_per_domain",
                    "a negative count; give a count (auto and per_core have no JSON form here; "
                    "Triton's schema takes them as the parameter "
                    "instance_placement.instances_per_domain)");
    }
    return file;
  }
  // Not numaserve's schema: perhaps Triton's (what Triton's clients send).
  triton::ModelConfig t;
  const auto theirs = pb::util::JsonStringToMessage(json, &t, options);
  if (!theirs.ok()) {
    // The message names the field (protobuf's "... @ field: problem").
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": ", std::string(theirs.message()).substr(0, 512)));
  }
  if (t.instance_placement().instances_per_domain() < 0) {
    return Refuse(origin, "instance_placement.instances_per_domain",
                  "a negative count; give a count or the parameter "
                  "instance_placement.instances_per_domain (auto, per_core)");
  }
  const pb::TextFormat::ParseInfoTree no_locations;
  auto converted = FromTriton(t, TritonLocator(origin, &no_locations), num_workers);
  if (!converted.ok()) return converted.status();
  file.config = *std::move(converted);
  file.triton = true;
  CollectIgnored(t, "", &file.ignored_fields);
  return file;
}

absl::StatusOr<ModelConfigFile> ReadModelConfig(const std::string& path, int num_workers) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ReadModelConfigText(text.str(), path, num_workers);
}

absl::StatusOr<config::ModelConfig> ParseModelConfigText(const std::string& text,
                                                         const std::string& origin) {
  auto file = ReadModelConfigText(text, origin);
  if (!file.ok()) return file.status();
  return std::move(file->config);
}

absl::StatusOr<config::ModelConfig> ParseModelConfig(const std::string& path) {
  auto file = ReadModelConfig(path);
  if (!file.ok()) return file.status();
  return std::move(file->config);
}

namespace {

// ValidateModelConfigFields' checks of dynamic_batching's priority levels.
absl::Status CheckPriorityLevels(const config::DynamicBatching& d, const std::string& model) {
  const uint64_t levels = d.priority_levels();
  const uint64_t level = d.default_priority_level();
  if (levels > kMaxPriorityLevels) {
    return Invalid(model, "dynamic_batching.priority_levels",
                   absl::StrFormat("%u is above the limit of %d", levels, kMaxPriorityLevels));
  }
  if (levels == 0 && level != 0) {
    return Invalid(model, "dynamic_batching.default_priority_level",
                   absl::StrFormat("%u is set without dynamic_batching.priority_levels", level));
  }
  if (levels > 0 && (level < 1 || level > levels)) {
    return Invalid(model, "dynamic_batching.default_priority_level",
                   absl::StrFormat("%u is outside 1..priority_levels (%u)", level, levels));
  }
  return absl::OkStatus();
}

// ValidateModelConfigFields' checks of instance_placement.
absl::Status CheckInstancePlacement(const config::InstancePlacement& p, const std::string& model,
                                    int num_workers) {
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
  return absl::OkStatus();
}

}  // namespace

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
  if (absl::Status s = CheckPriorityLevels(d, model); !s.ok()) return s;
  if (absl::Status s = CheckInstancePlacement(c.instance_placement(), model, num_workers);
      !s.ok()) {
    return s;
  }
  const auto& backends = KnownGemmBackends();
  if (!c.gemm_backend().empty() &&
      std::find(backends.begin(), backends.end(), c.gemm_backend()) == backends.end()) {
    return Invalid(model, "gemm_backend",
                   absl::StrCat("'", c.gemm_backend(), "' is not built in (available: ",
                                absl::StrJoin(backends, ", "), ")"));
  }
  if (!c.precision().empty() && !engine::PrecisionFromName(c.precision()).ok()) {
    return Invalid(model, "precision",
                   absl::StrCat("'", absl::CHexEscape(c.precision()), "' is not one of ",
                                absl::StrJoin(engine::PrecisionChoices(), ", ")));
  }
  if (c.max_activation_bytes() > kMaxActivationBytes) {
    return Invalid(model, "max_activation_bytes",
                   absl::StrFormat("%u is above the limit of %d (1 PiB; 0: the server's "
                                   "--max-activation-mb)",
                                   c.max_activation_bytes(), kMaxActivationBytes));
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
    // Why the engine does not batch it, where it says (rows combined, a
    // dynamic dim besides the batch); else its batch dims are fixed.
    if (!info.unbatched_reason.empty()) {
      return Invalid(
          model, "max_batch_size",
          absl::StrCat(c.max_batch_size(), " batches requests together, but ", info.path,
                       " cannot be batched: ", info.unbatched_reason, " (use max_batch_size: 0)"));
    }
    return Invalid(model, "max_batch_size",
                   absl::StrCat(c.max_batch_size(),
                                " needs dim 0 of every input and output to be dynamic, but ",
                                info.path, " has fixed batch dimensions (use max_batch_size: 0)"));
  }
  const bool batched = c.max_batch_size() > 0;
  if (absl::Status s = CheckTensors(model, "input", c.input(), info.inputs, batched); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTensors(model, "output", c.output(), info.outputs, batched); !s.ok()) {
    return s;
  }
  return CheckWarmups(c, model, info);
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

}  // namespace numaserve::serving
