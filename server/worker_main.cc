#include "server/worker_main.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/cpu_features.h"
#include "affinity/pinning.h"
#include "affinity/topology.h"
#include "engine/model.h"
#include "server/args.h"
#include "server/framing.h"
#include "server/shared_arena.h"
#include "worker.pb.h"

namespace numaserve::server {
namespace {

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

std::string OpenMpEnvironmentSeen() {
  std::string out;
  for (const char* name :
       {"OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND", "OMP_WAIT_POLICY", "KMP_AFFINITY",
        "KMP_BLOCKTIME", "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT"}) {
    if (const char* v = getenv(name)) absl::StrAppend(&out, out.empty() ? "" : " ", name, "=", v);
  }
  return out;
}

class Worker {
 public:
  Worker(int index, SharedArena* arena) : index_(index), arena_(arena) {}

  // Serves commands until the server closes the socket.
  int Serve() {
    worker::Command command;
    while (true) {
      absl::Status s = ReadFramed(kWorkerControlFd, &command);
      if (!s.ok()) return 0;  // the server went away or shut us down
      worker::Reply reply;
      reply.set_id(command.id());
      switch (command.kind_case()) {
        case worker::Command::kLoad:
          Load(command.load(), &reply);
          break;
        case worker::Command::kRun:
          Run(command.run(), &reply);
          break;
        case worker::Command::kUnload:
          models_.erase(command.unload().key());
          reply.set_ok(true);
          break;
        default:
          reply.set_error("unknown command");
      }
      if (!WriteFramed(kWorkerControlFd, reply).ok()) return 0;
    }
  }

 private:
  void Load(const worker::LoadModel& load, worker::Reply* reply) {
    auto start = std::chrono::steady_clock::now();
    // config.pbtxt's gemm_backend, else `numaserve serve --gemm` (passed
    // down as NUMASERVE_GEMM), else auto.
    engine::CompileOptions options;
    options.gemm_backend = load.gemm_backend();
    if (options.gemm_backend.empty()) {
      const char* fallback = getenv("NUMASERVE_GEMM");
      options.gemm_backend = fallback != nullptr && *fallback != '\0' ? fallback : "auto";
    }
    options.gemm_cache_file = engine::DefaultGemmCacheFile();
    auto model = engine::CompiledModel::Load(load.path(), options);
    reply->set_load_ns(NanosSince(start));
    if (!model.ok()) {
      reply->set_error(std::string(model.status().message()));
      fprintf(stderr, "worker %d: cannot load %s: %s\n", index_, load.key().c_str(),
              std::string(model.status().message()).c_str());
      return;
    }
    if (options.gemm_backend != "auto") {
      fprintf(stderr, "numaserve: worker %d: %s: gemm backend %s\n", index_, load.key().c_str(),
              options.gemm_backend.c_str());
    }
    reply->set_weight_bytes((*model)->info().parameter_bytes);
    models_[load.key()] = *std::move(model);
    reply->set_ok(true);
  }

  void Run(const worker::RunBatch& run, worker::Reply* reply) {
    auto it = models_.find(run.key());
    if (it == models_.end()) {
      reply->set_error(absl::StrCat("model ", run.key(), " is not loaded on this worker"));
      return;
    }
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    for (const auto& slice : run.inputs()) {
      if (!InArena(slice)) return reply->set_error("input slice outside the arena");
      inputs.push_back(arena_->data() + slice.offset());
    }
    for (const auto& slice : run.outputs()) {
      if (!InArena(slice)) return reply->set_error("output slice outside the arena");
      outputs.push_back(arena_->data() + slice.offset());
    }
    auto start = std::chrono::steady_clock::now();
    absl::Status s = it->second->Run(run.batch(), inputs, outputs);
    reply->set_compute_ns(NanosSince(start));
    if (!s.ok()) return reply->set_error(std::string(s.message()));
    reply->set_ok(true);
  }

  bool InArena(const worker::TensorSlice& slice) const {
    return slice.offset() <= arena_->size() && slice.bytes() <= arena_->size() - slice.offset();
  }

  int index_;
  SharedArena* arena_;
  std::map<std::string, std::unique_ptr<engine::CompiledModel>> models_;
};

}  // namespace

int WorkerCommand(const std::vector<std::string>& args) {
  // Die with the server: a worker never outlives the process that feeds it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGINT, SIG_IGN);  // the server decides when workers stop

  std::string cpus_text;
  int64_t index = 0, node = -1, arena_bytes = 0;
  ArgParser parser("worker", "Internal: one worker process, started by `numaserve serve`.");
  parser.AddInt("index", &index, "worker index");
  parser.AddString("cpus", &cpus_text, "cpus to bind to, e.g. 0-7");
  parser.AddInt("numa-node", &node, "NUMA node for memory, -1 for none");
  parser.AddInt("arena-bytes", &arena_bytes, "size of the shared arena at fd 4");
  if (absl::Status s = parser.Parse(args); !s.ok()) {
    fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }

  // 1. Pin, before any OpenMP or oneDNN code runs in this process.
  worker::Reply hello;
  worker::Hello* h = hello.mutable_hello();
  h->set_worker_index(static_cast<int>(index));
  h->set_pid(getpid());
  auto cpus = affinity::ParseCpuList(cpus_text);
  if (!cpus.ok()) {
    h->set_bind_warning(std::string(cpus.status().message()));
  } else if (absl::Status s = affinity::BindProcess(*cpus, static_cast<int>(node)); !s.ok()) {
    h->set_bind_warning(std::string(s.message()));
  }

  // 2. Map the arena and bind its pages to this worker's node.
  auto arena = SharedArena::Attach(kWorkerArenaFd, static_cast<size_t>(arena_bytes));
  if (!arena.ok()) {
    fprintf(stderr, "worker %ld: %s\n", index, std::string(arena.status().message()).c_str());
    return 1;
  }
  if (absl::Status s =
          affinity::BindMemoryToNode((*arena)->data(), (*arena)->size(), static_cast<int>(node));
      !s.ok() && h->bind_warning().empty()) {
    h->set_bind_warning(std::string(s.message()));
  }

  h->set_binding(affinity::DescribeBinding());
  h->set_environment(OpenMpEnvironmentSeen());
  h->set_isa(affinity::FeatureList(affinity::GetCpuFeatures()));
  hello.set_ok(true);
  fprintf(stderr, "worker %ld pid %d: %s; %s%s%s\n", index, getpid(), h->binding().c_str(),
          h->environment().c_str(),
          h->bind_warning().empty() ? "" : "; warning: ", h->bind_warning().c_str());
  if (!WriteFramed(kWorkerControlFd, hello).ok()) return 1;

  // 3. Serve.
  Worker worker(static_cast<int>(index), arena->get());
  return worker.Serve();
}

}  // namespace numaserve::server
