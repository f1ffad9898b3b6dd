#include "serving/request/request_parameters.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "serving/request/infer_request.h"

namespace numaserve::serving {
namespace {

// A name from the request, as it may appear in a message.
std::string Quoted(const std::string& name) {
  return absl::StrCat("'", absl::CHexEscape(name.substr(0, 64)), name.size() > 64 ? "...'" : "'");
}

// A non-negative integer parameter (HTTP's JSON numbers arrive as int64,
// Triton's gRPC client sends int64 or uint64).
absl::StatusOr<uint64_t> Unsigned(const std::string& name, const inference::InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case inference::InferParameter::kUint64Param:
      return p.uint64_param();
    case inference::InferParameter::kInt64Param:
      if (p.int64_param() >= 0) return static_cast<uint64_t>(p.int64_param());
      return absl::InvalidArgumentError(absl::StrCat("request parameter '", name, "' is ",
                                                     p.int64_param(), "; it must not be negative"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("request parameter '", name, "' must be an integer (int64 or uint64)"));
  }
}

absl::Status Unsupported(const std::string& owner, const std::string& name) {
  if (absl::StartsWith(name, "sequence_")) {
    return absl::InvalidArgumentError(absl::StrCat(
        owner, " parameter ", Quoted(name),
        ": sequence batching is not supported (numaserve computes each request on its own, "
        "without state between requests)"));
  }
  if (absl::StartsWith(name, "shared_memory_")) {
    return absl::InvalidArgumentError(
        absl::StrCat(owner, " parameter ", Quoted(name),
                     ": the shared-memory extension is not supported; send the tensor's bytes "
                     "in the request"));
  }
  if (name == "classification") {
    return absl::InvalidArgumentError(absl::StrCat(
        owner, " parameter 'classification': the classification extension is not supported"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown ", owner, " parameter ", Quoted(name),
      owner == "request" ? " (numaserve takes timeout, priority, profile and "
                           "triton_enable_empty_final_response; see docs/api.md)"
                         : " (inputs and outputs take no parameters; see docs/api.md)"));
}

}  // namespace

absl::StatusOr<RequestParameters> ReadRequestParameters(const inference::ModelInferRequest& request,
                                                        const PriorityConfig& priorities) {
  RequestParameters out;
  const uint64_t levels = priorities.levels > 0 ? priorities.levels : 1;
  out.priority = priorities.default_level > 0 ? priorities.default_level : levels;
  for (const auto& [name, p] : request.parameters()) {
    if (name == kProfileParameter) continue;  // RequestsProfile below
    if (name == kTimeoutParameter) {
      auto us = Unsigned(name, p);
      if (!us.ok()) return us.status();
      if (*us > kMaxRequestTimeoutMicroseconds) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "request parameter 'timeout' is %u microseconds, above the limit of %u (24 hours)", *us,
            kMaxRequestTimeoutMicroseconds));
      }
      out.timeout_us = *us;
    } else if (name == kPriorityParameter) {
      auto level = Unsigned(name, p);
      if (!level.ok()) return level.status();
      if (*level > levels) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "request parameter 'priority' is %u; the model has %u priority level%s "
            "(dynamic_batching.priority_levels): give 0 (the model's default) or 1..%u",
            *level, levels, levels == 1 ? "" : "s", levels));
      }
      if (*level > 0) out.priority = *level;
    } else if (name == kEmptyFinalResponseParameter) {
      if (p.parameter_choice_case() != inference::InferParameter::kBoolParam) {
        return absl::InvalidArgumentError(
            absl::StrCat("request parameter '", name, "' must be a bool"));
      }
      out.mark_final_response = p.bool_param();
    } else {
      return Unsupported("request", name);
    }
  }
  for (const auto& input : request.inputs()) {
    if (!input.parameters().empty()) {
      return Unsupported(absl::StrCat("input ", Quoted(input.name())),
                         input.parameters().begin()->first);
    }
  }
  for (const auto& output : request.outputs()) {
    if (!output.parameters().empty()) {
      return Unsupported(absl::StrCat("output ", Quoted(output.name())),
                         output.parameters().begin()->first);
    }
  }
  auto profile = RequestsProfile(request);
  if (!profile.ok()) return profile.status();
  out.profile = *profile;
  return out;
}

}  // namespace numaserve::serving
