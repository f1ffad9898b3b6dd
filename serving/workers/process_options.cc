#include "serving/workers/process_options.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "affinity/pinning.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"

namespace numaserve::serving {
namespace {

constexpr ProcessSetting kSettings[] = {
    {"max-isa", "NUMASERVE_MAX_ISA"},
    {"blis-arch", "NUMASERVE_BLIS_ARCH"},
    {"openblas-core", "NUMASERVE_OPENBLAS_CORE"},
    {"gemm-cache", "NUMASERVE_GEMM_CACHE"},
    {"profile-steps", "NUMASERVE_PROFILE_STEPS"},
    {"training-reference-ops", "NUMASERVE_TRAINING_REFERENCE_OPS"},
    {"membind", "NUMASERVE_MEMBIND"},
    {"weights-node", "NUMASERVE_WEIGHTS_NODE"},
};
enum Setting {
  kMaxIsa,
  kBlisArch,
  kOpenblasCore,
  kGemmCache,
  kProfileSteps,
  kReferenceOps,
  kMembind,
  kWeightsNode
};

// The longest --gemm-cache path (PATH_MAX).
constexpr size_t kMaxPathBytes = 4096;
// Above any node number Linux has (CONFIG_NODES_SHIFT is at most 10).
constexpr int kMaxNumaNode = 4095;

// --weights-node's value: -1 for "", the node, or -2 where it is not a
// node number.
int ParseWeightsNode(const std::string& text) {
  if (text.empty()) return -1;
  int node = -1;
  if (text.size() > 4 || !absl::SimpleAtoi(text, &node) || node < 0 || node > kMaxNumaNode ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return -2;
  }
  return node;
}

// "--max-isa (NUMASERVE_MAX_ISA)": how an error names a setting whose
// value may have come from either.
std::string Name(Setting s) {
  return absl::StrCat("--", kSettings[s].flag, " (", kSettings[s].variable, ")");
}

// The checks that need no kernel library; `where` names the setting.
absl::Status Check(const ProcessOptions& o, const std::function<std::string(Setting)>& where) {
  if (absl::Status s = kernels::CheckMaxIsa(o.max_isa); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where(kMaxIsa), ": ", s.message()));
  }
  if (absl::Status s = kernels::CheckGemmBackendOptions({.blis_arch = o.blis_arch}); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where(kBlisArch), ": ", s.message()));
  }
  if (absl::Status s = kernels::CheckGemmBackendOptions({.openblas_core = o.openblas_core});
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where(kOpenblasCore), ": ", s.message()));
  }
  if (o.gemm_cache.size() > kMaxPathBytes || o.gemm_cache.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(where(kGemmCache), ": a path of at most ",
                                                   kMaxPathBytes, " bytes without NUL"));
  }
  if (!o.membind.empty()) {
    if (absl::Status s = affinity::ParseMemoryPolicy(o.membind).status(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(where(kMembind), ": ", s.message()));
    }
  }
  if (ParseWeightsNode(o.weights_node) == -2) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(kWeightsNode), ": expected a NUMA node number (0 to ", kMaxNumaNode,
                     "), got '", absl::CHexEscape(o.weights_node.substr(0, 64)), "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BoolVariable(const char* name, const char* value) {
  const std::string v = value == nullptr ? "" : value;
  if (v == "1" || v == "true") return true;
  if (v.empty() || v == "0" || v == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(name, ": expected 1 or true, 0 or false, got '", v.substr(0, 64), "'"));
}

}  // namespace

absl::Span<const ProcessSetting> ProcessSettings() { return kSettings; }

bool IsProcessVariable(std::string_view name) {
  for (const ProcessSetting& s : kSettings) {
    if (name == s.variable) return true;
  }
  return false;
}

absl::StatusOr<ProcessOptions> ProcessOptionsFromVariables(
    const std::function<const char*(const char*)>& lookup, const std::string& default_gemm_cache) {
  const auto get = [&](Setting s) -> std::string {
    const char* v = lookup(kSettings[s].variable);
    return v == nullptr ? "" : v;
  };
  ProcessOptions o;
  o.max_isa = get(kMaxIsa);
  o.blis_arch = get(kBlisArch);
  o.openblas_core = get(kOpenblasCore);
  o.membind = get(kMembind);
  o.weights_node = get(kWeightsNode);
  o.gemm_cache =
      lookup(kSettings[kGemmCache].variable) != nullptr ? get(kGemmCache) : default_gemm_cache;
  const std::pair<Setting, bool*> booleans[] = {{kProfileSteps, &o.profile_steps},
                                                {kReferenceOps, &o.training_reference_ops}};
  for (const auto& [setting, field] : booleans) {
    absl::StatusOr<bool> on =
        BoolVariable(kSettings[setting].variable, lookup(kSettings[setting].variable));
    if (!on.ok()) return on.status();
    *field = *on;
  }
  const auto variable = [](Setting setting) { return std::string(kSettings[setting].variable); };
  if (absl::Status s = Check(o, variable); !s.ok()) return s;
  return o;
}

int WeightsNode(const ProcessOptions& o) { return std::max(-1, ParseWeightsNode(o.weights_node)); }

void AddProcessFlags(base::ArgParser& parser, ProcessOptions& o, unsigned groups) {
  if ((groups & kKernelFlags) != 0) {
    parser.AddString("max-isa", &o.max_isa,
                     "the widest ISA the kernels and oneDNN use: avx2 | avx512 | amx; empty: "
                     "the CPU's (NUMASERVE_MAX_ISA)");
    parser.AddString("blis-arch", &o.blis_arch,
                     "BLIS sub-configuration for --gemm blis: skx | zen3 | zen2 | zen | haswell "
                     "| generic | ...; empty: chosen from the CPU (NUMASERVE_BLIS_ARCH)");
    parser.AddString("openblas-core", &o.openblas_core,
                     "OpenBLAS core for --gemm openblas: SkylakeX | Zen | Haswell | ...; empty: "
                     "chosen from the CPU (NUMASERVE_OPENBLAS_CORE)");
  }
  if ((groups & kModelFlags) != 0) {
    parser.AddString("gemm-cache", &o.gemm_cache,
                     "file that remembers --gemm auto's choices; empty: none "
                     "(NUMASERVE_GEMM_CACHE)");
    parser.AddBool("profile-steps", &o.profile_steps,
                   "profile every step of every run; each model logs its profile when freed "
                   "(NUMASERVE_PROFILE_STEPS=1)");
  }
  if ((groups & kTrainingFlags) != 0) {
    parser.AddBool("training-reference-ops", &o.training_reference_ops,
                   "train Conv, the pools and the norms on their reference implementations, "
                   "not oneDNN (NUMASERVE_TRAINING_REFERENCE_OPS=1)");
  }
  if ((groups & kPlacementFlags) != 0) {
    parser.AddString("membind", &o.membind,
                     "how a worker (a training rank) binds its memory to its NUMA node: prefer "
                     "(the node first, others when it is full) | strict (the node only: "
                     "no spill, an allocation the node cannot hold fails); empty: prefer "
                     "(NUMASERVE_MEMBIND)");
  }
  if ((groups & kWeightsFlags) != 0) {
    parser.AddString("weights-node", &o.weights_node,
                     "the NUMA node a worker places its models' weights on, such as a memory-only "
                     "(CXL, HBM) node; its activations and arena stay on its own node; strict "
                     "there too with --membind strict; empty: the worker's node "
                     "(NUMASERVE_WEIGHTS_NODE)");
  }
}

absl::Status ApplyProcessOptions(const ProcessOptions& o) {
  if (absl::Status s = Check(o, Name); !s.ok()) return s;
  if (absl::Status s = kernels::SetDispatchOptions({.max_isa = o.max_isa}); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(Name(kMaxIsa), ": ", s.message()));
  }
  if (absl::Status s = kernels::SetGemmBackendOptions(
          {.blis_arch = o.blis_arch, .openblas_core = o.openblas_core});
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--blis-arch, --openblas-core: ", s.message()));
  }
  return absl::OkStatus();
}

std::vector<std::string> ProcessFlags(const ProcessOptions& o, unsigned groups) {
  std::vector<std::string> args;
  const auto add = [&](Setting s, const std::string& value) {
    if (!value.empty()) args.push_back(absl::StrCat("--", kSettings[s].flag, "=", value));
  };
  if ((groups & kKernelFlags) != 0) {
    add(kMaxIsa, o.max_isa);
    add(kBlisArch, o.blis_arch);
    add(kOpenblasCore, o.openblas_core);
  }
  if ((groups & kModelFlags) != 0) {
    args.push_back(absl::StrCat("--", kSettings[kGemmCache].flag, "=", o.gemm_cache));
    if (o.profile_steps) args.push_back(absl::StrCat("--", kSettings[kProfileSteps].flag));
  }
  if ((groups & kTrainingFlags) != 0 && o.training_reference_ops) {
    args.push_back(absl::StrCat("--", kSettings[kReferenceOps].flag));
  }
  if ((groups & kPlacementFlags) != 0) add(kMembind, o.membind);
  if ((groups & kWeightsFlags) != 0) add(kWeightsNode, o.weights_node);
  return args;
}

std::vector<std::string> EnvironmentWithoutProcessVariables(const char* const* environ) {
  std::vector<std::string> env;
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (!IsProcessVariable(kv.substr(0, kv.find('=')))) env.emplace_back(kv);
  }
  return env;
}

}  // namespace numaserve::serving
