// The settings a numaserve process takes once, at its start, and hands to
// the processes it starts (its workers; a training job and its ranks) as
// flags: the ISA cap, the BLAS libraries' kernels, the GEMM choice cache,
// step profiling, the training ops' implementation, the memory policy
// of a process bound to a NUMA node and the node of a worker's weights
// (docs/configuration.md, "Process settings").
//
// Each has a flag and a NUMASERVE_* environment variable. numaserve's main
// reads the variables once (ProcessOptionsFromVariables) and removes them
// from its environment; a command's flag wins over the variable. Nothing
// below tools/numaserve reads them: the libraries take them as options
// (kernels::DispatchOptions, kernels::GemmBackendOptions,
// engine::CompileOptions, training::TrainOptions), and a child process gets
// them on its command line (ProcessFlags), its environment without the
// variables (IsProcessVariable), so that what a worker or a rank runs with
// is in its arguments, and a variable set for the server alone reaches no
// job.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/args.h"

namespace numaserve::serving {

struct ProcessOptions {
  // --max-isa, NUMASERVE_MAX_ISA: the widest ISA of the own kernels and
  // oneDNN ("" none, avx2, avx512, amx; kernels::DispatchOptions).
  std::string max_isa;
  // --blis-arch, NUMASERVE_BLIS_ARCH; --openblas-core,
  // NUMASERVE_OPENBLAS_CORE: the BLAS libraries' kernels ("" chosen from the
  // CPU; kernels::GemmBackendOptions).
  std::string blis_arch;
  std::string openblas_core;
  // --gemm-cache, NUMASERVE_GEMM_CACHE: the file that remembers gemm "auto"
  // choices ("" none; engine::CompileOptions::gemm_cache_file). Unset, main
  // makes it engine::DefaultGemmCacheFile().
  std::string gemm_cache;
  // --profile-steps, NUMASERVE_PROFILE_STEPS=1
  // (engine::CompileOptions::profile_steps).
  bool profile_steps = false;
  // --training-reference-ops, NUMASERVE_TRAINING_REFERENCE_OPS=1
  // (training::TrainOptions::reference_ops).
  bool training_reference_ops = false;
  // --membind, NUMASERVE_MEMBIND: how a worker or a training rank binds its
  // memory to its NUMA node, "strict" or "prefer" (affinity::MemoryPolicy);
  // "" is prefer.
  std::string membind;
  // --weights-node, NUMASERVE_WEIGHTS_NODE: the NUMA node a worker places
  // its models' weights on (engine::CompileOptions::weights_numa_node),
  // typically a memory-only node; the rest of its memory stays on its own
  // node. "" none; else a node number, checked against the machine by
  // serve (affinity::CheckWeightsNode).
  std::string weights_node;
};

// The settings a command takes, as a set of bits.
enum ProcessFlagGroup : unsigned {
  kKernelFlags = 1,     // --max-isa, --blis-arch, --openblas-core
  kModelFlags = 2,      // --gemm-cache, --profile-steps
  kTrainingFlags = 4,   // --training-reference-ops
  kPlacementFlags = 8,  // --membind
  kWeightsFlags = 16,   // --weights-node (serve and its workers only)
  kAllProcessFlags = kKernelFlags | kModelFlags | kTrainingFlags | kPlacementFlags | kWeightsFlags,
};

// One setting: its flag (without "--") and its environment variable.
struct ProcessSetting {
  const char* flag;
  const char* variable;
};
// The eight, in ProcessOptions' order.
absl::Span<const ProcessSetting> ProcessSettings();

// Whether NAME is one of the settings' variables.
bool IsProcessVariable(std::string_view name);

// The settings from the variables as LOOKUP gives them (null: unset), each
// checked (INVALID_ARGUMENT naming the variable and what it accepts);
// `default_gemm_cache` where NUMASERVE_GEMM_CACHE is unset. Booleans take
// 1 or true, 0 or false, or empty (false).
absl::StatusOr<ProcessOptions> ProcessOptionsFromVariables(
    const std::function<const char*(const char*)>& lookup, const std::string& default_gemm_cache);

// --weights-node as a node number: -1 when unset. O must have been checked
// (ProcessOptionsFromVariables, ApplyProcessOptions).
int WeightsNode(const ProcessOptions& o);

// Declares the flags of GROUPS on PARSER, each writing its field of O; O's
// values (the variables') are their defaults.
void AddProcessFlags(base::ArgParser& parser, ProcessOptions& o, unsigned groups);

// Checks O (INVALID_ARGUMENT naming the flag and its variable) and applies
// what the kernels take for the whole process: kernels::SetDispatchOptions
// and kernels::SetGemmBackendOptions. Call once the flags are parsed,
// before anything runs a kernel or touches oneDNN.
absl::Status ApplyProcessOptions(const ProcessOptions& o);

// The arguments that hand O's settings of GROUPS to a child process: each
// set one, and --gemm-cache always (the child takes the parent's file, not
// a default of its own).
std::vector<std::string> ProcessFlags(const ProcessOptions& o, unsigned groups);

// The environment `environ` (KEY=VALUE strings) without the settings'
// variables: what a child process is started with.
std::vector<std::string> EnvironmentWithoutProcessVariables(const char* const* environ);

}  // namespace numaserve::serving
