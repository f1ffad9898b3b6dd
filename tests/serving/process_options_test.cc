// The process settings (serving/workers/process_options.h; docs/security.md,
// "Round two: hidden configuration"): read from their variables once and
// checked, overridden by their flags, handed to children as flags; and the
// libraries that once read the variables themselves now follow only their
// explicit options. main() sets all six variables, as a user's
// environment would, before any test runs: a library that still read one
// would show it.
#include "serving/workers/process_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "affinity/cpu_features.h"
#include "base/args.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "kernels/gemm/gemm_backend.h"
#include "training/conv_pool_ops.h"

namespace numaserve::serving {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// What main() sets: every variable at a value other than its default.
constexpr std::pair<const char*, const char*> kEnvironment[] = {
    {"NUMASERVE_MAX_ISA", "avx2"},
    {"NUMASERVE_BLIS_ARCH", "generic"},
    {"NUMASERVE_OPENBLAS_CORE", "Haswell"},
    {"NUMASERVE_GEMM_CACHE", "/nonexistent/from_the_environment.tsv"},
    {"NUMASERVE_PROFILE_STEPS", "1"},
    {"NUMASERVE_TRAINING_REFERENCE_OPS", "1"},
    {"NUMASERVE_MEMBIND", "strict"},
};

// A lookup over `vars`, as ProcessOptionsFromVariables takes it.
std::function<const char*(const char*)> Lookup(const std::map<std::string, std::string>& vars) {
  return [&vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

bool CpuHasAvx512() {
  const affinity::CpuFeatures& f = affinity::GetCpuFeatures();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.fma;
}

// ---- reading, flags, children ----

TEST(ProcessOptionsTest, VariablesAreReadAndChecked) {
  const std::map<std::string, std::string> vars(std::begin(kEnvironment), std::end(kEnvironment));
  absl::StatusOr<ProcessOptions> o = ProcessOptionsFromVariables(Lookup(vars), "/default.tsv");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_isa, "avx2");
  EXPECT_EQ(o->blis_arch, "generic");
  EXPECT_EQ(o->openblas_core, "Haswell");
  EXPECT_EQ(o->gemm_cache, "/nonexistent/from_the_environment.tsv");
  EXPECT_TRUE(o->profile_steps);
  EXPECT_TRUE(o->training_reference_ops);
}

TEST(ProcessOptionsTest, UnsetVariablesGiveTheDefaults) {
  const std::map<std::string, std::string> none;
  absl::StatusOr<ProcessOptions> o = ProcessOptionsFromVariables(Lookup(none), "/default.tsv");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->max_isa, "");
  EXPECT_EQ(o->gemm_cache, "/default.tsv");
  EXPECT_FALSE(o->profile_steps);
  EXPECT_FALSE(o->training_reference_ops);
  // Set and empty: no cache file at all.
  const std::map<std::string, std::string> empty = {{"NUMASERVE_GEMM_CACHE", ""},
                                                    {"NUMASERVE_PROFILE_STEPS", "0"}};
  o = ProcessOptionsFromVariables(Lookup(empty), "/default.tsv");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->gemm_cache, "");
  EXPECT_FALSE(o->profile_steps);
}

TEST(ProcessOptionsTest, ABadVariableIsAnErrorNamingIt) {
  const std::string long_path(5000, 'x');
  const std::pair<const char*, const char*> bad[] = {
      {"NUMASERVE_MAX_ISA", "sse9"},
      {"NUMASERVE_BLIS_ARCH", "zen9"},
      {"NUMASERVE_OPENBLAS_CORE", "../Haswell"},
      {"NUMASERVE_PROFILE_STEPS", "yes"},
      {"NUMASERVE_TRAINING_REFERENCE_OPS", "2"},
      {"NUMASERVE_GEMM_CACHE", long_path.c_str()},
  };
  for (const auto& [name, value] : bad) {
    const std::map<std::string, std::string> vars = {{name, value}};
    absl::StatusOr<ProcessOptions> o = ProcessOptionsFromVariables(Lookup(vars), "");
    ASSERT_FALSE(o.ok()) << name;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(o.status().message(), HasSubstr(name));
  }
  const std::map<std::string, std::string> isa = {{"NUMASERVE_MAX_ISA", "sse9"}};
  EXPECT_THAT(ProcessOptionsFromVariables(Lookup(isa), "").status().message(),
              HasSubstr("'sse9' is not one of avx2, avx512, amx"));
}

TEST(ProcessOptionsTest, AFlagWinsOverItsVariable) {
  const std::map<std::string, std::string> vars(std::begin(kEnvironment), std::end(kEnvironment));
  ProcessOptions o = *ProcessOptionsFromVariables(Lookup(vars), "");
  base::ArgParser parser("serve", "test");
  AddProcessFlags(parser, o, kAllProcessFlags);
  ASSERT_TRUE(parser
                  .Parse({"--max-isa", "avx512", "--blis-arch=zen3", "--gemm-cache", "",
                          "--profile-steps=false", "--training-reference-ops=false"})
                  .ok());
  EXPECT_EQ(o.max_isa, "avx512");
  EXPECT_EQ(o.blis_arch, "zen3");
  EXPECT_EQ(o.openblas_core, "Haswell");  // not given: the variable's
  EXPECT_EQ(o.gemm_cache, "");
  EXPECT_FALSE(o.profile_steps);
  EXPECT_FALSE(o.training_reference_ops);
}

TEST(ProcessOptionsTest, OnlyTheGroupsAskedForAreFlags) {
  ProcessOptions o;
  base::ArgParser parser("topology", "test");
  AddProcessFlags(parser, o, kKernelFlags);
  EXPECT_TRUE(parser.Parse({"--max-isa", "avx2"}).ok());
  base::ArgParser again("topology", "test");
  AddProcessFlags(again, o, kKernelFlags);
  EXPECT_THAT(again.Parse({"--gemm-cache", "x"}).message(), HasSubstr("unknown option"));
}

TEST(ProcessOptionsTest, ABadFlagIsAnErrorNamingTheFlagAndItsVariable) {
  // Checked before anything is applied: the process stays uncapped.
  const absl::Status s = ApplyProcessOptions({.max_isa = "avx1024"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--max-isa (NUMASERVE_MAX_ISA): 'avx1024' is not one of"));
  EXPECT_THAT(ApplyProcessOptions({.openblas_core = "Has well"}).message(),
              HasSubstr("--openblas-core (NUMASERVE_OPENBLAS_CORE)"));
  EXPECT_THAT(ApplyProcessOptions({.blis_arch = "skylake"}).message(),
              HasSubstr("--blis-arch (NUMASERVE_BLIS_ARCH): blis arch 'skylake' is not one of"));
}

TEST(ProcessOptionsTest, ChildFlagsCarryEverySettingOfTheirGroups) {
  const ProcessOptions o = {.max_isa = "avx2",
                            .blis_arch = "zen",
                            .openblas_core = "Zen",
                            .gemm_cache = "/var/cache/c.tsv",
                            .profile_steps = true,
                            .training_reference_ops = true};
  EXPECT_THAT(ProcessFlags(o, kKernelFlags | kModelFlags),
              ElementsAre("--max-isa=avx2", "--blis-arch=zen", "--openblas-core=Zen",
                          "--gemm-cache=/var/cache/c.tsv", "--profile-steps"));
  EXPECT_THAT(ProcessFlags(o, kKernelFlags | kTrainingFlags),
              ElementsAre("--max-isa=avx2", "--blis-arch=zen", "--openblas-core=Zen",
                          "--training-reference-ops"));
  // The defaults: only the cache file, which the child must not resolve
  // again (empty: none).
  EXPECT_THAT(ProcessFlags({}, kAllProcessFlags), ElementsAre("--gemm-cache="));
  EXPECT_THAT(ProcessFlags({}, kKernelFlags | kTrainingFlags), IsEmpty());
  // What a child parses back is what the parent had.
  ProcessOptions parsed;
  base::ArgParser parser("worker", "test");
  AddProcessFlags(parser, parsed, kAllProcessFlags);
  ASSERT_TRUE(parser.Parse(ProcessFlags(o, kAllProcessFlags)).ok());
  EXPECT_EQ(parsed.max_isa, o.max_isa);
  EXPECT_EQ(parsed.blis_arch, o.blis_arch);
  EXPECT_EQ(parsed.openblas_core, o.openblas_core);
  EXPECT_EQ(parsed.gemm_cache, o.gemm_cache);
  EXPECT_TRUE(parsed.profile_steps);
  EXPECT_TRUE(parsed.training_reference_ops);
}

// --membind (NUMASERVE_MEMBIND): a worker's or a rank's memory policy,
// checked, and handed on with the placement group only.
TEST(ProcessOptionsTest, MembindIsCheckedAndHandedOnWithThePlacementGroup) {
  const std::map<std::string, std::string> strict = {{"NUMASERVE_MEMBIND", "strict"}};
  absl::StatusOr<ProcessOptions> o = ProcessOptionsFromVariables(Lookup(strict), "");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->membind, "strict");
  EXPECT_THAT(ProcessFlags(*o, kKernelFlags | kModelFlags | kPlacementFlags),
              ElementsAre("--gemm-cache=", "--membind=strict"));
  EXPECT_THAT(ProcessFlags(*o, kKernelFlags | kModelFlags), ElementsAre("--gemm-cache="));
  ProcessOptions parsed;
  base::ArgParser parser("worker", "test");
  AddProcessFlags(parser, parsed, kPlacementFlags);
  ASSERT_TRUE(parser.Parse(ProcessFlags(*o, kPlacementFlags)).ok());
  EXPECT_EQ(parsed.membind, "strict");
  const std::map<std::string, std::string> bad = {{"NUMASERVE_MEMBIND", "bind"}};
  EXPECT_THAT(ProcessOptionsFromVariables(Lookup(bad), "").status().message(),
              HasSubstr("NUMASERVE_MEMBIND: memory policy 'bind': expected strict or prefer"));
  const absl::Status s = ApplyProcessOptions({.membind = "interleave"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("--membind (NUMASERVE_MEMBIND): memory policy 'interleave'"));
  EXPECT_TRUE(ApplyProcessOptions({.membind = "prefer"}).ok());
}

// --weights-node (NUMASERVE_WEIGHTS_NODE): a node number, checked, and
// handed on to serve's workers (kWeightsFlags), never to training ranks
// (whose settings are kPlacementFlags without it).
TEST(ProcessOptionsTest, WeightsNodeIsCheckedAndHandedOnToWorkersOnly) {
  const std::map<std::string, std::string> two = {{"NUMASERVE_WEIGHTS_NODE", "2"}};
  absl::StatusOr<ProcessOptions> o = ProcessOptionsFromVariables(Lookup(two), "");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(WeightsNode(*o), 2);
  EXPECT_EQ(WeightsNode(ProcessOptions()), -1);
  EXPECT_THAT(ProcessFlags(*o, kPlacementFlags | kWeightsFlags), ElementsAre("--weights-node=2"));
  EXPECT_THAT(ProcessFlags(*o, kKernelFlags | kTrainingFlags | kPlacementFlags), IsEmpty());
  ProcessOptions parsed;
  base::ArgParser parser("worker", "test");
  AddProcessFlags(parser, parsed, kWeightsFlags);
  ASSERT_TRUE(parser.Parse(ProcessFlags(*o, kWeightsFlags)).ok());
  EXPECT_EQ(WeightsNode(parsed), 2);
  base::ArgParser train("train", "test");
  ProcessOptions rank;
  AddProcessFlags(train, rank, kKernelFlags | kTrainingFlags | kPlacementFlags);
  EXPECT_FALSE(train.Parse({"--weights-node=2"}).ok()) << "train takes no --weights-node";
  for (const char* bad : {"-1", "two", "4096", "1e3", " 2", "0x2", "99999999999"}) {
    const std::map<std::string, std::string> vars = {{"NUMASERVE_WEIGHTS_NODE", bad}};
    EXPECT_THAT(ProcessOptionsFromVariables(Lookup(vars), "").status().message(),
                HasSubstr("NUMASERVE_WEIGHTS_NODE: expected a NUMA node number"))
        << bad;
    const absl::Status s = ApplyProcessOptions({.weights_node = bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--weights-node (NUMASERVE_WEIGHTS_NODE)")) << bad;
  }
  EXPECT_TRUE(ApplyProcessOptions({.weights_node = "0"}).ok());
  EXPECT_TRUE(ApplyProcessOptions({.weights_node = "4095"}).ok());
}

TEST(ProcessOptionsTest, AChildEnvironmentHasNoneOfTheVariables) {
  const char* environ[] = {"PATH=/bin",
                           "NUMASERVE_MAX_ISA=avx2",
                           "NUMASERVE_GEMM_CACHE=",
                           "NUMASERVE_PROFILE_STEPS=1",
                           "NUMASERVE_TRAINING_REFERENCE_OPS=1",
                           "NUMASERVE_BLIS_ARCH=zen",
                           "NUMASERVE_OPENBLAS_CORE=Zen",
                           "NUMASERVE_MAX_ISA_NOT=kept",
                           "DNNL_MAX_CPU_ISA=AVX2",
                           nullptr};
  EXPECT_THAT(EnvironmentWithoutProcessVariables(environ),
              ElementsAre("PATH=/bin", "NUMASERVE_MAX_ISA_NOT=kept", "DNNL_MAX_CPU_ISA=AVX2"));
  for (const ProcessSetting& s : ProcessSettings()) EXPECT_TRUE(IsProcessVariable(s.variable));
  EXPECT_FALSE(IsProcessVariable("NUMASERVE_GRPC_PORT"));
}

// ---- the libraries ignore the variables main() set ----

TEST(LibrariesIgnoreTheEnvironmentTest, DispatchRunsTheCpusWidestTier) {
  const kernels::DispatchDecision& d = kernels::GetDispatchDecision();
  EXPECT_EQ(d.cap, "");
  EXPECT_EQ(d.onednn_cap, "");
  if (CpuHasAvx512()) {
    EXPECT_EQ(d.max_tier, kernels::IsaTier::kAvx512) << kernels::IsaDescription();
    EXPECT_THAT(kernels::IsaDescription(), Not(HasSubstr("oneDNN avx2")));
  }
}

TEST(LibrariesIgnoreTheEnvironmentTest, BlasKernelsAreChosenFromTheCpu) {
  for (kernels::GemmBackend b : {kernels::GemmBackend::kBlis, kernels::GemmBackend::kOpenblas}) {
    if (!kernels::GemmBackendAvailable(b).ok()) continue;
    const std::string details = kernels::GemmBackendDetails(b);
    EXPECT_THAT(details, Not(HasSubstr("NUMASERVE_"))) << details;
    EXPECT_THAT(details, Not(HasSubstr("--blis-arch"))) << details;
    EXPECT_THAT(details, Not(HasSubstr("--openblas-core"))) << details;
  }
}

TEST(LibrariesIgnoreTheEnvironmentTest, TheDefaultGemmCacheIsNotTheVariable) {
  EXPECT_NE(engine::DefaultGemmCacheFile(), "/nonexistent/from_the_environment.tsv");
  EXPECT_TRUE(engine::CompileOptions().gemm_cache_file.empty());
}

// Runs `model` once at batch 1 on zeros.
absl::Status RunOnce(engine::CompiledModel& model) {
  std::vector<std::vector<char>> in, out;
  std::vector<const void*> inputs;
  std::vector<void*> outputs;
  for (const auto& t : model.info().inputs) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d < 0 ? 1 : d;
    in.emplace_back(n * 8);
    inputs.push_back(in.back().data());
  }
  for (const auto& shape : model.OutputShapes(1)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out.emplace_back(n * 8);
    outputs.push_back(out.back().data());
  }
  return model.Run(1, inputs, outputs);
}

TEST(LibrariesIgnoreTheEnvironmentTest, StepsAreProfiledOnlyWhenTheOptionSaysSo) {
  auto plain = engine::CompiledModel::Load(NUMASERVE_DEFAULT_MODEL, {});
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(RunOnce(**plain).ok());
  EXPECT_THAT((*plain)->Profile(), IsEmpty());
  auto profiled = engine::CompiledModel::Load(NUMASERVE_DEFAULT_MODEL, {.profile_steps = true});
  ASSERT_TRUE(profiled.ok()) << profiled.status();
  ASSERT_TRUE(RunOnce(**profiled).ok());
  EXPECT_THAT((*profiled)->Profile(), Not(IsEmpty()));
}

TEST(LibrariesIgnoreTheEnvironmentTest, TrainingOpsRunOnOnednn) {
  EXPECT_EQ(training::conv_pool::CurrentImplementation(),
            training::conv_pool::Implementation::kOnednn);
}

// ---- the explicit settings do apply (each in a process of its own) ----

TEST(ExplicitSettingsTest, TheIsaCapCapsTheKernelsAndOnednn) {
  EXPECT_EXIT(
      {
        const absl::Status s = kernels::SetDispatchOptions({.max_isa = "avx2"});
        const kernels::DispatchDecision& d = kernels::GetDispatchDecision();
        const std::string description = kernels::IsaDescription();
        std::fprintf(stderr, "%s; %s\n", std::string(s.message()).c_str(), description.c_str());
        const bool capped = s.ok() && d.cap == "avx2" && d.max_tier != kernels::IsaTier::kAvx512 &&
                            (!CpuHasAvx512() || description == "avx2, oneDNN avx2");
        std::exit(capped ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(ExplicitSettingsTest, TheIsaCapIsSetBeforeTheFirstKernel) {
  kernels::GetKernelTable();
  const absl::Status late = kernels::SetDispatchOptions({.max_isa = "avx2"});
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(late.message(), HasSubstr("set once, at the start of the process"));
  // What is in force already is no change.
  EXPECT_TRUE(kernels::SetDispatchOptions({}).ok());
  EXPECT_EQ(kernels::SetDispatchOptions({.max_isa = "sse9"}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ExplicitSettingsTest, TheBlisArchIsTheOptions) {
  EXPECT_EXIT(
      {
        const absl::Status s = kernels::SetGemmBackendOptions({.blis_arch = "haswell"});
        const absl::Status available = kernels::GemmBackendAvailable(kernels::GemmBackend::kBlis);
        const std::string details = kernels::GemmBackendDetails(kernels::GemmBackend::kBlis);
        std::fprintf(stderr, "%s; %s\n", std::string(s.message()).c_str(), details.c_str());
        const bool set =
            s.ok() && (!available.ok() || details.find("sub-configuration haswell (chosen from "
                                                       "--blis-arch") != std::string::npos);
        // Once BLIS is loaded its configuration stays.
        const bool late =
            kernels::SetGemmBackendOptions({.blis_arch = "zen"}).code() ==
            (available.ok() ? absl::StatusCode::kFailedPrecondition : absl::StatusCode::kOk);
        std::exit(set && late ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace numaserve::serving

int main(int argc, char** argv) {
  // The variables are in the environment from the start of the process, as
  // a user's would be (a library could read one while it initialises its
  // statics, before main): set them, and run again where they were not.
  bool set = true;
  for (const auto& [name, value] : numaserve::serving::kEnvironment) {
    const char* now = std::getenv(name);
    set = set && now != nullptr && std::string(now) == value;
    setenv(name, value, 1);
  }
  if (!set) {
    execv("/proc/self/exe", argv);
    std::perror("execv /proc/self/exe");
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  // Each death test's child runs this binary again, from main: a process
  // whose dispatch table and libraries are not set up yet.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  return RUN_ALL_TESTS();
}
