// numaserve: the command line. serve | topology | infer | train | bench |
// profile | quantize, and the internal `worker` command (a worker process,
// started by serve). `train` under mpirun is one rank of the job.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model.h"
#include "serving/observability/version.h"
#include "serving/workers/process_options.h"
#include "serving/workers/worker_main.h"
#include "tools/numaserve/bench_command.h"
#include "tools/numaserve/infer_command.h"
#include "tools/numaserve/profile_command.h"
#include "tools/numaserve/quantize_command.h"
#include "tools/numaserve/serve_command.h"
#include "tools/numaserve/topology_command.h"
#include "tools/numaserve/train_command.h"

namespace {

void PrintUsage() {
  printf(
      "numaserve %s: inference and training server for CPU nodes\n\n"
      "usage: numaserve COMMAND [options]\n\n"
      "commands:\n"
      "  serve      serve a model repository over gRPC (KServe v2) with Prometheus metrics\n"
      "  topology   print the machine (hwloc) and the worker placement plan\n"
      "  infer      send one request to a running server and print the outputs\n"
      "  train      train a model data-parallel on MPI and export it to a model repository\n"
      "  bench      run a model in process per batch size: throughput, latency, GFLOP/s\n"
      "  profile    time every compiled step of a model against the roofline (peak FLOP/s,\n"
      "             memory bandwidth); Chrome trace with --trace\n"
      "  quantize   quantize an FP32 ONNX model to INT8 (QDQ), calibrated on data\n\n"
      "`numaserve COMMAND --help` lists a command's options; `numaserve --version` prints the\n"
      "version, the git revision and the ISA the kernels dispatch to.\n",
      numaserve::serving::BuildVersion());
}

// The process settings' NUMASERVE_* variables (serving/workers/
// process_options.h), read here once and removed from the environment:
// the commands take them as their flags' defaults and hand them to the
// processes they start as flags, so no worker, job or rank inherits them
// and nothing reads them later. First thing in main, before any thread.
absl::StatusOr<numaserve::serving::ProcessOptions> TakeProcessVariables() {
  auto options = numaserve::serving::ProcessOptionsFromVariables(
      [](const char* name) { return getenv(name); },  // NOLINT(concurrency-mt-unsafe)
      numaserve::engine::DefaultGemmCacheFile());
  for (const numaserve::serving::ProcessSetting& s : numaserve::serving::ProcessSettings()) {
    unsetenv(s.variable);  // NOLINT(concurrency-mt-unsafe): one thread so far
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const absl::StatusOr<numaserve::serving::ProcessOptions> process = TakeProcessVariables();
  // Every process numaserve forks (workers, training jobs) calls exec at
  // once, so gRPC's fork handlers have nothing to protect; where they are
  // on, a fork from a busy server waits for gRPC's thread pool to idle.
  // Before gRPC starts (one thread so far); a value the user set is kept.
  setenv("GRPC_ENABLE_FORK_SUPPORT", "false", 0);  // NOLINT(concurrency-mt-unsafe)
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    PrintUsage();
    return argc < 2 ? 2 : 0;
  }
  if (!process.ok()) {
    fprintf(stderr, "numaserve: %s\n", std::string(process.status().message()).c_str());
    return 2;
  }
  if (strcmp(argv[1], "--version") == 0) {
    // The version, the git revision built from and the ISA dispatched to
    // (under NUMASERVE_MAX_ISA's cap).
    if (absl::Status s = numaserve::serving::ApplyProcessOptions(*process); !s.ok()) {
      fprintf(stderr, "numaserve: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    printf("%s\n", numaserve::serving::VersionText().c_str());
    return 0;
  }
  const std::string command = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  using namespace numaserve::cli;
  if (command == "serve") return ServeCommand(args, *process);
  if (command == "topology") return TopologyCommand(args, *process);
  if (command == "infer") return InferCommand(args);
  if (command == "train") return TrainCommand(args, *process);
  if (command == "bench") return BenchCommand(args, *process);
  if (command == "profile") return ProfileCommand(args, *process);
  if (command == "quantize") return QuantizeCommand(args, *process);
  // A worker's settings are its flags alone (the server passes its own).
  if (command == "worker") return numaserve::serving::WorkerCommand(args);
  fprintf(stderr, "numaserve: unknown command '%s' (try numaserve --help)\n", command.c_str());
  return 2;
}
