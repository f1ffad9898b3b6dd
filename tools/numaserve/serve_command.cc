#include "tools/numaserve/serve_command.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <malloc.h>
#include <signal.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "affinity/cpu_features.h"
#include "affinity/memory_bandwidth.h"
#include "affinity/memory_policy.h"
#include "affinity/pinning.h"
#include "affinity/placement.h"
#include "affinity/topology.h"
#include "base/args.h"
#include "base/clock.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "base/mutex.h"
#include "base/periodic_task.h"
#include "engine/model.h"
#include "kernels/dispatch.h"
#include "serving/frontend/grpc_auth.h"
#include "serving/frontend/inference_service.h"
#include "serving/frontend/training_service.h"
#include "serving/http/http_server.h"
#include "serving/http/rest_service.h"
#include "serving/observability/metrics.h"
#include "serving/observability/version.h"
#include "serving/repository/model_config.h"
#include "serving/repository/model_repository.h"
#include "serving/scheduling/model_manager.h"
#include "serving/scheduling/model_scheduler.h"
#include "serving/workers/input_copier.h"
#include "serving/workers/worker_pool.h"
#include "serving/workers/worker_supervisor.h"
#include "tools/numaserve/serve_options.h"
#include "training/rank_binding.h"

namespace numaserve::cli {

using base::CurrentLogOptions;
using base::Log;
using base::LogBlock;
using base::LogFormat;
using base::LogLevel;
using serving::BuildRevision;
using serving::BuildVersion;
using serving::GrpcAuth;
using serving::InferenceService;
using serving::Metrics;
using serving::MetricsAuth;
using serving::ModelControlMode;
using serving::ModelDefaults;
using serving::ModelManager;
using serving::ModelRepository;
using serving::ModelScheduler;
using serving::ModelStatistics;
using serving::ModelToLoadFor;
using serving::ParseInstances;
using serving::ParseModelControlMode;
using serving::RepositoryModel;
using serving::SupervisedWorkerPool;
using serving::TrainingService;
using serving::TrainingServiceOptions;
using serving::VersionText;
using serving::WorkerSupervisor;

namespace {

// Each worker's resident memory, from /proc/<pid>/statm.
void SampleResidentMemory(const WorkerSupervisor& workers, Metrics* metrics) {
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  for (int w = 0; w < workers.size(); ++w) {
    const pid_t pid = workers.Pid(w);
    if (pid <= 0) continue;
    FILE* f = fopen(absl::StrCat("/proc/", pid, "/statm").c_str(), "re");
    if (f == nullptr) continue;
    long size = 0, resident = 0;
    if (fscanf(f, "%ld %ld", &size, &resident) == 2) {
      metrics->SetWorkerResidentBytes(w, workers.placement(w).numa_node,
                                      static_cast<double>(resident) * page);
    }
    fclose(f);
  }
}

// systemd's watchdog (WatchdogSec= in the unit, WATCHDOG_USEC in the
// environment): the ping period, half of systemd's, or 0 when the watchdog
// is off. The pings go out for as long as the probe before each returns, so
// a server stuck on the locks the probe takes stops them and systemd
// restarts the service.
std::chrono::microseconds SystemdWatchdogPeriod() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::chrono::microseconds(0);
  const auto period = std::chrono::microseconds(std::max<uint64_t>(usec / 2, 1000));
  Log(LogLevel::kInfo, "serve",
      absl::StrFormat("systemd watchdog: a ping every %.3f s",
                      static_cast<double>(period.count()) / 1e6),
      {{"watchdog_period_s", static_cast<double>(period.count()) / 1e6}});
  return period;
}

// Takes gRPC's reflection plugin ("proto_server_reflection") out of a
// ServerBuilder: linking grpc++_reflection registers it for every builder
// (a static initializer), so --grpc-reflection=false removes it again.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name().find("reflection") != std::string::npos;
                                  }),
                   plugins->end());
  }
};

// Start-up failed: the reason, then exit code 1.
int Fail(const absl::Status& status) {
  if (CurrentLogOptions().format == LogFormat::kText) {
    fprintf(stderr, "numaserve serve: %s\n", std::string(status.message()).c_str());
  } else {
    Log(LogLevel::kError, "serve", status.message());
  }
  return 1;
}

// Sets the log format and level from the flags.
absl::Status ConfigureLogFromFlags(const std::string& format_name, const std::string& level_name) {
  auto options = base::LogOptionsFromFlags(format_name, level_name);
  if (!options.ok()) return options.status();
  base::ConfigureLog(*options);
  return absl::OkStatus();
}

// --- The parts the server is made of ------------------------------------------

// --weights-node: a node of the topology the process may allocate on
// (this machine's Mems_allowed_list; a --topology's nodes as they are).
absl::Status CheckWeightsNodeFlag(const ServeOptions& o, const affinity::Topology& topology) {
  const int node = serving::WeightsNode(o.process);
  if (node < 0) return absl::OkStatus();
  absl::StatusOr<std::vector<int>> mems;
  if (topology.is_this_machine) {
    mems = affinity::MemsAllowed();
    if (!mems.ok()) {
      return absl::Status(mems.status().code(),
                          absl::StrCat("--weights-node ", node, ": ", mems.status().message()));
    }
  }
  if (absl::Status s = affinity::CheckWeightsNode(
          topology, node, topology.is_this_machine ? &*mems : nullptr, "--weights-node");
      !s.ok()) {
    return s;
  }
  const char* policy = o.process.membind == "strict" ? "strict" : "prefer";
  Log(LogLevel::kInfo, "serve",
      absl::StrFormat("models' weights on NUMA node %d (%s); the rest of each worker's memory "
                      "on its own node",
                      node, policy),
      {{"weights_node", node}, {"weights_policy", policy}});
  return absl::OkStatus();
}

// This machine (or --topology) and the workers planned on it, logged.
absl::StatusOr<affinity::Plan> PlanWorkers(const ServeOptions& o, affinity::Topology* topology) {
  auto discovered = affinity::DiscoverTopology({o.topology, o.cpuset});
  if (!discovered.ok()) return discovered.status();
  *topology = *std::move(discovered);
  auto domain = affinity::ParseDomain(o.domain);
  if (!domain.ok()) return domain.status();
  affinity::PlacementOptions placement;
  placement.domain = *domain;
  placement.use_smt = o.use_smt;
  auto omp_wait = affinity::ParseOmpWait(o.omp_spin ? "spin" : o.omp_wait);
  if (!omp_wait.ok()) return omp_wait.status();
  placement.omp_wait = *omp_wait;
  placement.max_workers = static_cast<int>(o.max_workers);
  auto frontend = affinity::ParseFrontendCpus(o.frontend_cpus);
  if (!frontend.ok()) return frontend.status();
  placement.frontend = *std::move(frontend);
  auto plan = affinity::MakePlan(*topology, placement);
  if (!plan.ok()) return plan.status();
  Log(LogLevel::kInfo, "serve", absl::StrCat("starting ", VersionText()),
      {{"version", BuildVersion()}, {"revision", BuildRevision()}});
  LogBlock(LogLevel::kInfo, "placement", affinity::FormatReport(*topology, *plan));
  if (absl::Status s = CheckWeightsNodeFlag(o, *topology); !s.ok()) return s;
  return plan;
}

// The repository's models the server starts with, and what the workers load.
struct InitialModels {
  std::vector<RepositoryModel> initial;
  // Explicit mode: the models left for RepositoryModelLoad.
  std::vector<std::string> not_loaded;
  std::vector<WorkerSupervisor::ModelToLoad> to_load;
};

InitialModels ChooseInitialModels(const ModelRepository& repository, ModelControlMode mode,
                                  const ServeOptions& o, const ModelDefaults& defaults) {
  InitialModels out;
  // Explicit mode starts with the models --load-model names only.
  const std::vector<std::string> load_first = absl::StrSplit(o.load_model, ',', absl::SkipEmpty());
  for (const auto& m : repository.models()) {
    if (mode == ModelControlMode::kExplicit &&
        std::find(load_first.begin(), load_first.end(), m.name) == load_first.end()) {
      if (out.not_loaded.empty() || out.not_loaded.back() != m.name) {
        out.not_loaded.push_back(m.name);
      }
      continue;
    }
    out.initial.push_back(m);
  }
  for (const auto& m : out.initial) {
    if (m.error.empty()) {
      out.to_load.push_back(ModelToLoadFor(m, defaults));
      Log(LogLevel::kInfo, "serve",
          absl::StrFormat("model %s version %d: %s", m.name, m.version, m.path),
          {{"model", m.name}, {"version", m.version}, {"path", m.path}});
    } else {
      Log(LogLevel::kError, "serve",
          absl::StrFormat("model %s is not available: %s", m.name, m.error),
          {{"model", m.name}, {"error", m.error}});
    }
  }
  return out;
}

// The training service (serving/frontend/training_service.h): jobs run as child
// `numaserve train` processes. Null without --training-service.
absl::StatusOr<std::unique_ptr<TrainingService>> MakeTrainingService(const ServeOptions& o,
                                                                     const GrpcAuth* auth,
                                                                     const affinity::Plan& plan,
                                                                     Metrics* metrics) {
  if (!o.training_service) return nullptr;
  int max_ranks = static_cast<int>(o.training_max_ranks);
  if (max_ranks == 0) {
    absl::StatusOr<int> domains = training::AutoRankCount();
    if (!domains.ok()) return domains.status();
    max_ranks = *domains;
  }
  TrainingServiceOptions training_options;
  training_options.root = o.training_root;
  training_options.max_ranks = max_ranks;
  training_options.max_jobs = static_cast<int>(o.training_max_jobs);
  training_options.max_finished_jobs = static_cast<size_t>(o.training_max_finished_jobs);
  training_options.max_config_bytes = static_cast<size_t>(o.training_max_config_bytes);
  training_options.caller = [auth](const grpc::ServerContextBase& c) { return auth->Caller(c); };
  training_options.authenticated = auth->authenticates();
  training_options.metrics = metrics;
  training_options.process = o.process;
  // Called before PinFrontEnd: the cpus the server was started on, not the
  // front end's alone.
  if (!plan.frontend_cpus.empty()) training_options.job_cpus = affinity::CallingThreadCpus();
  return TrainingService::Create(std::move(training_options));
}

// Each worker's FP32 (and BF16, INT8 where the CPU has them) peak, for the
// fraction-of-peak metrics: the peak per core times its physical cores.
void PublishPeaks(const affinity::Plan& plan, Metrics* metrics) {
  const double peak_per_core = kernels::Fp32PeakGflopsPerCore();
  const affinity::PeakFlops& peaks = affinity::GetPeakFlops();
  for (const auto& p : plan.workers) {
    // Per physical core: a core's SMT threads share its FMA units.
    metrics->SetWorkerPeak(p.index, p.numa_node, affinity::WorkerPeak(p, peak_per_core));
    if (kernels::GetBf16Support().native && peaks.peak_bf16_gflops_per_core > 0) {
      metrics->SetWorkerPeakFlops(p.index, p.numa_node, "bf16",
                                  affinity::WorkerPeak(p, peaks.peak_bf16_gflops_per_core) * 1e9);
    }
    if (peaks.peak_int8_gops_per_core > 0) {
      metrics->SetWorkerPeakFlops(p.index, p.numa_node, "int8",
                                  affinity::WorkerPeak(p, peaks.peak_int8_gops_per_core) * 1e9);
    }
  }
}

// --frontend-cpus: every thread the server has started so far (metrics,
// timers, gRPC's own) moves to the front end's cpus, and those it starts
// later inherit them; each supervisor thread then moves to its worker's
// node (WorkerPlacement::supervisor_cpus), and each worker, a process of
// its own, binds itself to its cpus before exec. A plan for another
// topology (--topology) binds nothing.
// A pin that fails is a warning: the server runs unpinned.
void PinFrontEnd(const affinity::Plan& plan, const affinity::Topology& topology) {
  if (plan.frontend_cpus.empty() || !topology.is_this_machine) return;
  if (absl::Status s = affinity::BindProcess(plan.frontend_cpus, -1); !s.ok()) {
    Log(LogLevel::kWarning, "serve",
        absl::StrCat("--frontend-cpus: the front end runs unpinned: ", s.message()));
    return;
  }
  Log(LogLevel::kInfo, "serve",
      absl::StrCat("front end on cpus ", affinity::FormatCpuList(plan.frontend_cpus)),
      {{"frontend_cpus", affinity::FormatCpuList(plan.frontend_cpus)}});
}

// --input-copy (serving/workers/input_copier.h): the copier threads, after
// PinFrontEnd so that they keep their own cpus. A plan for another topology
// starts none (its cpus are not this machine's).
void StartInputCopiers(const ServeOptions& o, const affinity::Plan& plan,
                       const affinity::Topology& topology, SupervisedWorkerPool& pool) {
  const auto mode = serving::ParseInputCopy(o.input_copy);  // CheckServeFlags: valid
  if (!mode.ok() || !topology.is_this_machine) return;
  const std::vector<std::vector<int>> cpus = serving::InputCopyCpus(plan, *mode);
  std::string where;
  for (size_t i = 0; i < cpus.size(); ++i) {
    if (cpus[i].empty()) continue;
    absl::StrAppend(&where, where.empty() ? "" : ", ", "worker ", i, " on cpus ",
                    affinity::FormatCpuList(cpus[i]));
  }
  if (where.empty()) return;
  pool.StartCopiers(cpus);
  Log(LogLevel::kInfo, "serve",
      absl::StrCat("inputs copied into each worker's arena on its node: ", where),
      {{"input_copy", o.input_copy}});
}

// --measure-bandwidth: each NUMA node's triad bandwidth, measured before the
// workers start, on the cpus that node's workers will use.
void MeasureBandwidth(const affinity::Plan& plan, Metrics* metrics) {
  std::map<int, std::vector<int>> node_cpus;
  for (const auto& p : plan.workers) {
    std::vector<int>& cpus = node_cpus[std::max(p.numa_node, 0)];
    cpus.insert(cpus.end(), p.cpus.begin(), p.cpus.end());
  }
  for (const auto& [node, cpus] : node_cpus) {
    affinity::BandwidthOptions probe;
    probe.cpus = cpus;
    absl::StatusOr<affinity::BandwidthResult> r = affinity::MeasureMemoryBandwidth(probe);
    if (!r.ok()) {
      Log(LogLevel::kWarning, "serve",
          absl::StrCat("NUMA node ", node,
                       ": memory bandwidth not measured: ", r.status().message()));
      continue;
    }
    metrics->SetMemoryBandwidth(node, r->gb_per_second * 1e9);
    Log(LogLevel::kInfo, "serve",
        absl::StrFormat("NUMA node %d: memory bandwidth %.1f GB/s (triad, %d threads, %d MiB)",
                        node, r->gb_per_second, r->threads,
                        static_cast<int>(r->bytes_per_pass >> 20)));
  }
}

// After the workers' first loads: each initial model's readiness, and the
// reason of each that failed.
void ReportInitialLoads(const std::vector<RepositoryModel>& initial,
                        const WorkerSupervisor& workers, Metrics* metrics) {
  for (const auto& m : initial) {
    const bool ready = m.error.empty() && workers.ModelAvailable(m.key());
    metrics->SetModelReady(m.name, absl::StrCat(m.version), ready);
    if (m.error.empty() && !ready) {
      const std::string error = workers.LoadError(m.key());
      Log(LogLevel::kError, "serve", absl::StrFormat("model %s failed to load: %s", m.name, error),
          {{"model", m.name}, {"version", m.version}, {"error", error}});
    }
  }
}

// What one client can hold on a gRPC port (the inference port, and the
// training service's own): message sizes, memory for connections and
// messages (a quota per port, named QUOTA_NAME), calls per connection;
// idle or silent connections are closed.
void SetGrpcLimits(const ServeOptions& o, const char* quota_name, grpc::ServerBuilder& builder) {
  const int max_message = static_cast<int>(
      std::min<int64_t>(o.grpc_max_message_bytes, std::numeric_limits<int>::max()));
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  grpc::ResourceQuota quota(quota_name);
  quota.Resize(static_cast<size_t>(o.grpc_memory_quota_mb) << 20);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(o.grpc_max_concurrent_streams));
  // Ping a silent client every 60 s, drop it if it does not answer in 20 s;
  // a client may not ping more often than every 10 s without data.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60'000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 15 * 60'000);
}

// The training service on its own port (--training-address), started.
// Where it listens goes to *where: HOST:PORT, or unix:PATH.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartTrainingServer(const ServeOptions& o,
                                                                  const GrpcAuth& auth,
                                                                  TrainingService* service,
                                                                  std::string* where) {
  grpc::ServerBuilder builder;
  if (!o.grpc_reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(o.training_address, auth.ServerCredentials(), &port);
  // The gRPC port's limits (a quota of its own); configs are small, so
  // nothing bigger than the largest one is read here.
  SetGrpcLimits(o, "numaserve-training", builder);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>({o.training_max_config_bytes + 65536, o.grpc_max_message_bytes,
                         std::numeric_limits<int>::max()})));
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for training on --training-address ", o.training_address));
  }
  *where =
      o.training_address.rfind("unix:", 0) == 0
          ? o.training_address
          : absl::StrCat(o.training_address.substr(0, o.training_address.rfind(':')), ":", port);
  return server;
}

// The HTTP/REST server (--http-port; null when -1): the KServe v2 REST
// endpoints of `rest`, with the gRPC port's TLS (the same certificate, key
// and client CA), started on --host.
absl::StatusOr<std::unique_ptr<serving::http::HttpServer>> StartHttpServer(
    const ServeOptions& o, const GrpcAuth& auth, serving::http::RestService* rest) {
  if (o.http_port < 0) return nullptr;
  serving::http::HttpServerOptions options;
  options.host = o.host;
  options.port = static_cast<int>(o.http_port);
  options.threads = static_cast<int>(o.http_threads);
  // Request bodies are bounded as gRPC messages are.
  options.max_body_bytes = static_cast<size_t>(o.grpc_max_message_bytes);
  auto tls = auth.MakeHttpTlsContext();
  if (!tls.ok()) return tls.status();
  options.tls = *std::move(tls);
  return serving::http::HttpServer::Start(
      options, [rest](serving::http::HttpExchange* exchange) { rest->Handle(exchange); });
}

// The security in force, and a warning when the gRPC or HTTP port or
// /metrics is open to other machines without TLS or without authentication.
void LogSecurity(const ServeOptions& o, const GrpcAuth& auth, const MetricsAuth& metrics_auth) {
  Log(LogLevel::kInfo, "serve", absl::StrCat("gRPC security: ", auth.Describe()),
      {{"security", auth.Describe()}, {"reflection", o.grpc_reflection}});
  if (o.http_port >= 0) {
    Log(LogLevel::kInfo, "serve", absl::StrCat("HTTP security: ", auth.Describe()),
        {{"security", auth.Describe()}});
  }
  if (!auth.tls() && !IsLocalOnly(o.host)) {
    Log(LogLevel::kWarning, "serve",
        absl::StrFormat("gRPC%s on %s is plaintext and unauthenticated: anyone who reaches it "
                        "may infer and manage models (see --grpc-tls-cert, "
                        "--grpc-auth-token-file)",
                        o.http_port >= 0 ? " and HTTP" : "", o.host),
        {{"host", o.host}});
  }
  const std::string metrics_address = MetricsAddress(o);
  Log(LogLevel::kInfo, "serve", absl::StrCat("metrics security: ", metrics_auth.Describe()),
      {{"security", metrics_auth.Describe()}});
  if ((!metrics_auth.tls() || !metrics_auth.authenticates()) &&
      !IsLocalOnly(HostOf(metrics_address))) {
    Log(LogLevel::kWarning, "serve",
        absl::StrFormat("/metrics on %s is %s: whoever reaches it may read it (see "
                        "--metrics-tls-cert, --metrics-auth-token-file, or a NetworkPolicy or "
                        "firewall)",
                        metrics_address, metrics_auth.Describe()),
        {{"metrics_address", metrics_address}});
  }
}

// The one line scripts wait for on stdout ("grpc=HOST:PORT
// metrics=HOST:PORT", then " http=HOST:PORT" unless --http-port is -1
// (`http_port` < 0), then " training=HOST:PORT" with the training service:
// the gRPC port's own address when it shares it), the same in the log, and
// READY=1 to systemd (Type=notify; a no-op without NOTIFY_SOCKET).
void AnnounceServing(const ServeOptions& o, int grpc_port, const std::string& metrics_address,
                     int metrics_port, int http_port, const std::string& training_where) {
  const std::string http_part = http_port < 0 ? "" : absl::StrCat(" http=", o.host, ":", http_port);
  const std::string training_line =
      training_where.empty() ? "" : absl::StrCat(" training=", training_where);
  const std::string metrics_host = metrics_address.substr(0, metrics_address.rfind(':'));
  const std::string ports = absl::StrFormat("grpc=%s:%d metrics=%s:%d%s", o.host, grpc_port,
                                            metrics_host, metrics_port, http_part);
  printf("%s%s\n", ports.c_str(), training_line.c_str());
  fflush(stdout);
  Log(LogLevel::kInfo, "serve", absl::StrCat("serving: ", ports, training_line),
      {{"grpc_address", absl::StrCat(o.host, ":", grpc_port)},
       {"metrics_address", absl::StrCat(metrics_host, ":", metrics_port)}});
  sd_notifyf(0, "READY=1\nSTATUS=serving: %s", ports.c_str());
}

// Serves until SIGINT or SIGTERM (blocked in `stop_signals` before any
// thread started), then drains. Returns the exit code.
//
// Longer than ~80 lines on purpose: it is the composition. Each part is
// made in the order the next one needs it (plan, repository, metrics,
// workers, scheduler, model manager, gRPC, HTTP, health) and the stops at the
// end run in the reverse order, so both orders read top to bottom in one
// place.
// NOLINTNEXTLINE(readability-function-size): the reason is above.
int Serve(const ServeOptions& o, const GrpcAuth& auth, std::unique_ptr<MetricsAuth> metrics_auth,
          int default_instances, const sigset_t& stop_signals) {
  affinity::Topology topology;
  auto plan = PlanWorkers(o, &topology);
  if (!plan.ok()) return Fail(plan.status());
  auto repository =
      ModelRepository::Open(o.model_repository, static_cast<int>(plan->workers.size()));
  if (!repository.ok()) return Fail(repository.status());
  auto control_mode = ParseModelControlMode(o.model_control_mode);
  if (!control_mode.ok()) return Fail(control_mode.status());
  ModelDefaults model_defaults;
  model_defaults.instances = default_instances;
  model_defaults.gemm_backend = o.gemm;
  model_defaults.max_activation_bytes = o.max_activation_mb << 20;  // CheckServeFlags: <= 2^30
  const InitialModels start = ChooseInitialModels(**repository, *control_mode, o, model_defaults);

  const std::string metrics_address = MetricsAddress(o);
  auto metrics = Metrics::Create(metrics_address, std::move(metrics_auth));
  if (!metrics.ok()) return Fail(metrics.status());
  auto training_service = MakeTrainingService(o, &auth, *plan, metrics->get());
  if (!training_service.ok()) return Fail(training_service.status());
  // The supervisor's cue (a worker became ready or was lost) reaches the
  // scheduler and the health status through this hook, set once both exist.
  std::atomic<std::function<void()>*> on_workers_changed{nullptr};
  WorkerSupervisor::Options worker_options;
  worker_options.arena_bytes = static_cast<size_t>(o.worker_arena_mb) << 20;
  worker_options.test_batch_compute_us = o.test_batch_compute_us;
  worker_options.process = o.process;
  auto workers =
      WorkerSupervisor::Create(worker_options, *plan, start.to_load, metrics->get(), [&] {
        if (auto* hook = on_workers_changed.load()) (*hook)();
      });
  if (!workers.ok()) return Fail(workers.status());
  SupervisedWorkerPool pool(workers->get());
  ModelStatistics statistics;
  ModelScheduler::Options scheduler_options;
  scheduler_options.default_max_queue_size = static_cast<size_t>(o.max_queue_size);
  scheduler_options.statistics = &statistics;
  ModelScheduler scheduler(scheduler_options, &pool, metrics->get(), base::Clock::Real());
  scheduler.Start();
  std::function<void()> pump_scheduler = [&] { scheduler.Pump(); };
  on_workers_changed = &pump_scheduler;
  PublishPeaks(*plan, metrics->get());
  if (o.measure_bandwidth) MeasureBandwidth(*plan, metrics->get());
  base::PeriodicTask rss_sampler(
      std::chrono::seconds(1),
      [workers = workers->get(), m = metrics->get()] { SampleResidentMemory(*workers, m); });
  PinFrontEnd(*plan, topology);
  StartInputCopiers(o, *plan, topology, pool);
  (*workers)->Start(std::chrono::minutes(5));
  ModelManager::Options manager_options;
  manager_options.repository = o.model_repository;
  manager_options.num_workers = static_cast<int>(plan->workers.size());
  manager_options.mode = *control_mode;
  manager_options.poll_interval = std::chrono::seconds(o.repository_poll_secs);
  manager_options.defaults = model_defaults;
  ModelManager models(manager_options, workers->get(), &scheduler, metrics->get());
  models.Start(start.initial, start.not_loaded);
  ReportInitialLoads(start.initial, **workers, metrics->get());

  InferenceService::Options service_options;
  service_options.default_timeout = std::chrono::milliseconds(o.default_timeout_ms);
  service_options.max_message_bytes = static_cast<size_t>(o.grpc_max_message_bytes);
  service_options.statistics = &statistics;
  service_options.default_max_queue_size = static_cast<size_t>(o.max_queue_size);
  service_options.max_inflight_bytes = static_cast<size_t>(o.max_inflight_bytes_mb) << 20;
  service_options.max_stream_outstanding = o.max_stream_outstanding;
  InferenceService service(service_options, &models, workers->get(), &scheduler, metrics->get());
  grpc::EnableDefaultHealthCheckService(true);
  // Reflection describes every service a builder registers (the
  // inference, health and training services) to tools such as grpcurl.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!o.grpc_reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  int grpc_port = 0;
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.grpc_port), auth.ServerCredentials(),
                           &grpc_port);
  SetGrpcLimits(o, "numaserve-grpc", builder);
  // Every gRPC service the server offers is registered here or, for the
  // training service with --training-address, on its own port.
  builder.RegisterService(&service);
  TrainingService* training = training_service->get();
  std::string training_where;
  std::unique_ptr<grpc::Server> training_server;
  if (training != nullptr && o.training_address.empty()) {
    builder.RegisterService(training);
  } else if (training != nullptr) {
    auto started = StartTrainingServer(o, auth, training, &training_where);
    if (!started.ok()) return Fail(started.status());
    training_server = *std::move(started);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || grpc_port == 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("cannot listen for gRPC on ", o.host, ":", o.grpc_port)));
  }
  // The HTTP/REST port: the same service behind another protocol.
  serving::http::RestService rest({.max_message_bytes = service_options.max_message_bytes},
                                  &service, &auth);
  auto http_server = StartHttpServer(o, auth, &rest);
  if (!http_server.ok()) return Fail(http_server.status());
  LogSecurity(o, auth, (*metrics)->auth());
  if (training != nullptr) {
    if (training_where.empty()) training_where = absl::StrCat(o.host, ":", grpc_port);
    Log(LogLevel::kInfo, "serve",
        absl::StrCat("training service on ", training_where,
                     training_server == nullptr ? " (the gRPC port)" : "", ", files under ",
                     o.training_root),
        {{"training_address", training_where}, {"training_root", o.training_root}});
  }
  // Health follows readiness: NOT_SERVING while no worker is ready.
  base::Mutex health_mu;
  bool health_serving = false;
  std::function<void()> update_health = [&] {
    base::MutexLock lock(&health_mu);
    bool ready = service.Ready();
    if (ready == health_serving) return;
    health_serving = ready;
    server->GetHealthCheckService()->SetServingStatus(ready);
  };
  // Register the inference service's own name too; SetServingStatus(bool)
  // then keeps every registered name in step.
  server->GetHealthCheckService()->SetServingStatus(
      inference::GRPCInferenceService::service_full_name(), false);
  server->GetHealthCheckService()->SetServingStatus(false);
  update_health();
  std::function<void()> on_change = [&] {
    scheduler.Pump();
    update_health();
  };
  on_workers_changed = &on_change;
  AnnounceServing(o, grpc_port, metrics_address, (*metrics)->port(),
                  *http_server == nullptr ? -1 : (*http_server)->port(), training_where);
  // The probe: readiness, through the worker supervisor's locks.
  base::PeriodicTask watchdog(SystemdWatchdogPeriod(), [&] {
    (void)service.Ready();
    sd_notify(0, "WATCHDOG=1");
  });

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  Log(LogLevel::kInfo, "serve",
      absl::StrCat(base::SignalText(signal_number), " received, draining"),
      {{"signal", signal_number}});
  sd_notify(0, "STOPPING=1\nSTATUS=draining");

  // Stop taking work, finish what was accepted, then stop the workers.
  service.SetShuttingDown();
  // Training jobs stop after their current step with a checkpoint
  // (training_service.h); ~TrainingService waits for them.
  if (training != nullptr) training->StopAll();
  on_workers_changed = &pump_scheduler;
  {
    base::MutexLock lock(&health_mu);
    server->GetHealthCheckService()->SetServingStatus(false);
  }
  // Every accepted call (unary or read on a stream) is answered before gRPC
  // stops, and every stream ends once its requests are answered; calls
  // arriving meanwhile are refused UNAVAILABLE by the service. A load or
  // unload under way finishes and is answered.
  const auto drain_deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(o.shutdown_timeout_s);
  if (!service.WaitUntilIdle(drain_deadline, std::chrono::milliseconds(100))) {
    Log(LogLevel::kWarning, "serve", "accepted requests still running after --shutdown-timeout");
  }
  service.StopLifecycle();
  // Every HTTP reply already made is written before the connections close.
  if (*http_server != nullptr) {
    (*http_server)->Stop(std::chrono::steady_clock::now() + std::chrono::seconds(1));
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (training_server != nullptr) {
    training_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  }
  models.Stop();
  scheduler.Stop();
  pool.StopCopiers();
  rss_sampler.Stop();
  on_workers_changed = nullptr;
  (*workers)->Stop();
  watchdog.Stop();
  Log(LogLevel::kInfo, "serve", "stopped");
  return 0;
}

}  // namespace

// The front end allocates and frees buffers of a request's size many
// times a second (gRPC's slices, the replies). glibc hands a freed block of
// over 128 KiB back to the kernel (munmap, or trimming the heap's top), so
// the next request's buffers fault their pages in again: 6-10% of the
// front end's cpu at 588 KiB a request (docs/benchmarks.md, "Front-end
// copies"). Kept for reuse instead: blocks of up to 32 MiB (glibc's
// largest setting) come from the heap, and up to 256 MiB of free heap
// stays mapped; what requests hold at once is bounded by
// --max-inflight-bytes-mb. A GLIBC_TUNABLES malloc setting is left to rule.
// Called at start-up, before Serve starts the server's threads (getenv and
// mallopt are not to race with setenv or the allocator's users).
void KeepFreedHeapForReuse() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");  // NOLINT(concurrency-mt-unsafe): above
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);   // NOLINT(concurrency-mt-unsafe): above
  mallopt(M_TRIM_THRESHOLD, 256 << 20);  // NOLINT(concurrency-mt-unsafe): above
}

int ServeCommand(const std::vector<std::string>& args, const serving::ProcessOptions& process) {
  ServeOptions o;
  o.process = process;
  base::ArgParser parser("serve",
                         "Serve the models of a repository over gRPC and HTTP (KServe v2).");
  AddServeFlags(parser, o);
  const absl::Status parsed = parser.Parse(args);
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  // Even a parse error is reported in the format asked for, if it was read.
  if (absl::Status s = ConfigureLogFromFlags(o.log_format, o.log_level); !s.ok()) return Fail(s);
  if (!parsed.ok()) return Fail(parsed);
  // The server's own kernels too (the peaks, --version's ISA); the workers
  // and training jobs get the settings as flags.
  if (absl::Status s = serving::ApplyProcessOptions(o.process); !s.ok()) return Fail(s);
  if (o.version) {
    printf("%s\n", VersionText().c_str());
    return 0;
  }
  if (absl::Status s = CheckServeFlags(o); !s.ok()) return Fail(s);
  auto default_instances = ParseInstances(o.instances);
  if (!default_instances.ok()) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--instances: ", default_instances.status().message())));
  }
  auto auth = GrpcAuth::Create({.tls_cert_file = o.grpc_tls_cert,
                                .tls_key_file = o.grpc_tls_key,
                                .tls_client_ca_file = o.grpc_tls_client_ca,
                                .token_file = o.grpc_auth_token_file});
  if (!auth.ok()) return Fail(auth.status());
  if (absl::Status s = CheckTrainingFlags(o, **auth); !s.ok()) return Fail(s);
  if (absl::Status s = CheckMetricsFlags(o); !s.ok()) return Fail(s);
  auto metrics_auth = MetricsAuth::Create({.tls_cert_file = o.metrics_tls_cert,
                                           .tls_key_file = o.metrics_tls_key,
                                           .token_file = o.metrics_auth_token_file});
  if (!metrics_auth.ok()) return Fail(metrics_auth.status());

  // SIGINT/SIGTERM are taken by sigwait in Serve; block them before any thread starts.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  KeepFreedHeapForReuse();
  return Serve(o, **auth, *std::move(metrics_auth), *default_instances, stop_signals);
}

}  // namespace numaserve::cli
