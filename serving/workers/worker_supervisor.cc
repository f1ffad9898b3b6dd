#include "serving/workers/worker_supervisor.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/topology.h"
#include "base/child_fds.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "base/mutex.h"
#include "serving/observability/metrics.h"
#include "serving/repository/model_repository.h"
#include "serving/workers/framing.h"
#include "serving/workers/supervisor_thread.h"
#include "serving/workers/worker_main.h"

extern char** environ;

namespace numaserve::serving {

using base::Log;
using base::LogLevel;

namespace {

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    return absl::StrFormat("killed by signal %d (%s)", WTERMSIG(status),
                           base::SignalText(WTERMSIG(status)));
  }
  if (WIFEXITED(status)) return absl::StrFormat("exited with status %d", WEXITSTATUS(status));
  return "stopped";
}

// The parent's environment without the process settings' variables (a
// worker gets those settings as flags), with the plan's OpenMP settings on
// top, as "KEY=VALUE" strings for execve.
std::vector<std::string> WorkerEnvironment(const affinity::WorkerPlacement& p) {
  std::map<std::string, std::string> env;
  for (const std::string& kv : EnvironmentWithoutProcessVariables(environ)) {
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : p.env) env[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env) env_strings.push_back(absl::StrCat(k, "=", v));
  return env_strings;
}

// Sets `mask` to `cpus` (those below CPU_SETSIZE); false when none is, and
// the worker starts with the parent's mask.
bool CpuMaskOf(const std::vector<int>& cpus, cpu_set_t* mask) {
  CPU_ZERO(mask);
  bool have_mask = false;
  for (int cpu : cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) {
      CPU_SET(cpu, mask);
      have_mask = true;
    }
  }
  return have_mask;
}

// Logs a worker's hello: where it started, and a warning when it runs
// unpinned.
void LogWorkerStarted(int index, const affinity::WorkerPlacement& p, const worker::Hello& h) {
  Log(LogLevel::kInfo, "supervisor",
      absl::StrFormat("worker %d (%s) pid %d started: %s", index, p.domain, h.pid(), h.binding()),
      {{"worker", index},
       {"domain", p.domain},
       {"numa_node", p.numa_node},
       {"pid", h.pid()},
       {"binding", h.binding()}});
  if (!h.bind_warning().empty()) {
    Log(LogLevel::kWarning, "supervisor",
        absl::StrFormat("worker %d runs unpinned: %s", index, h.bind_warning()),
        {{"worker", index}, {"pid", h.pid()}, {"bind_warning", h.bind_warning()}});
  }
}

}  // namespace

bool WorkerSupervisor::ModelToLoad::LoadsOn(int worker) const {
  return workers.empty() || std::find(workers.begin(), workers.end(), worker) != workers.end();
}

WorkerSupervisor::WorkerSupervisor(const Options& options, std::vector<ModelToLoad> models,
                                   Metrics* metrics, std::function<void()> on_change)
    : options_(options),
      models_(std::move(models)),
      metrics_(metrics),
      on_change_(std::move(on_change)) {}

absl::StatusOr<std::unique_ptr<WorkerSupervisor>> WorkerSupervisor::Create(
    const Options& options, const affinity::Plan& plan, std::vector<ModelToLoad> models,
    Metrics* metrics, std::function<void()> on_change) {
  if (plan.workers.empty()) return absl::InvalidArgumentError("the placement plan has no worker");
  std::unique_ptr<WorkerSupervisor> s(
      new WorkerSupervisor(options, std::move(models), metrics, std::move(on_change)));
  for (const auto& placement : plan.workers) {
    auto slot = std::make_unique<Slot>();
    slot->index = placement.index;
    slot->placement = placement;
    // Room for the most batches the router may have in flight here: N + 1
    // for a model with N instances (a model loaded later with more
    // instances shares this arena; a batch that does not fit is refused).
    // auto and per_core pick at most one copy per core (per cpu: no cores).
    const int cores =
        !placement.cores.empty()
            ? static_cast<int>(placement.cores.size())
            : std::max({1, placement.num_threads, static_cast<int>(placement.cpus.size())});
    int most_instances = 1;
    {
      base::MutexLock lock(&s->models_mu_);  // no thread runs yet; uncontended
      for (const auto& model : s->models_) {
        if (!model.LoadsOn(placement.index)) continue;
        most_instances = std::max(most_instances, model.instances < 0 ? cores : model.instances);
      }
    }
    const size_t arena_bytes = ArenaBytesForBatches(options.arena_bytes, most_instances + 1);
    auto arena =
        SharedArena::Create(absl::StrCat("numaserve-worker-", placement.index), arena_bytes);
    if (!arena.ok()) return arena.status();
    slot->arena = *std::move(arena);
    slot->allocator = std::make_unique<ArenaAllocator>(arena_bytes);
    s->slots_.push_back(std::move(slot));
  }
  return s;
}

WorkerSupervisor::~WorkerSupervisor() { Stop(); }

std::vector<std::string> WorkerSupervisor::WorkerArgs(const Slot& slot) const {
  const auto& p = slot.placement;
  // The server's log settings, so the worker logs as the server does.
  const base::LogOptions log = base::CurrentLogOptions();
  std::vector<std::string> args = {"numaserve-worker", "worker",
                                   "--index",          absl::StrCat(slot.index),
                                   "--cpus",           affinity::FormatCpuList(p.cpus),
                                   "--numa-node",      absl::StrCat(p.numa_node),
                                   "--arena-bytes",    absl::StrCat(slot.arena->size()),
                                   "--log-format",     base::LogFormatName(log.format),
                                   "--log-level",      base::LogLevelName(log.level)};
  if (!p.cores.empty()) {  // by core, in the plan's order: instances take whole cores
    args.push_back("--cores");
    args.push_back(affinity::FormatCoreList(p.cores));
  }
  for (std::string& flag : ProcessFlags(
           options_.process, kKernelFlags | kModelFlags | kPlacementFlags | kWeightsFlags)) {
    args.push_back(std::move(flag));
  }
  if (options_.test_batch_compute_us > 0) {
    args.push_back("--test-batch-compute-us");
    args.push_back(absl::StrCat(options_.test_batch_compute_us));
  }
  return args;
}

absl::StatusOr<pid_t> WorkerSupervisor::Spawn(Slot* slot, int* control_fd) {
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
    return absl::InternalError(absl::StrCat("socketpair: ", base::ErrnoText(errno)));
  }
  const auto& p = slot->placement;
  std::vector<std::string> args = WorkerArgs(*slot);
  std::vector<std::string> env_strings = WorkerEnvironment(p);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  cpu_set_t mask;
  const bool have_mask = CpuMaskOf(p.cpus, &mask);
  const char* exe = options_.executable.c_str();
  // The arenas are close-on-exec: this worker gets its own, and no other
  // descriptor of the server's (see the child below).
  const int arena_fd = slot->arena->fd();
  const int fd_limit = base::DescriptorLimit();
  // What the child resets before exec: the server blocks SIGINT/SIGTERM
  // (taken with sigwait) and ignores SIGPIPE, and both a blocked mask and
  // ignored signals survive exec. A worker starts with every signal
  // unblocked and at its default action, so `kill -TERM` reaches it.
  sigset_t no_signals;
  sigemptyset(&no_signals);
  struct sigaction default_action = {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);

  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", base::ErrnoText(errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec. The cpu mask is set
    // here so the OpenMP runtime starts inside it; the worker then binds
    // memory and confirms the binding itself.
    for (int sig = 1; sig < NSIG; ++sig) {
      if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &default_action, nullptr);
    }
    pthread_sigmask(SIG_SETMASK, &no_signals, nullptr);
    if (have_mask) sched_setaffinity(0, sizeof(mask), &mask);
    // Both moved above the descriptors they go to first: the arena's or the
    // socket's own number may be 3 or 4 (a process with few files open), and
    // the first dup2 would close it. dup2 leaves its copy open across exec.
    const int control = fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
    const int arena = fcntl(arena_fd, F_DUPFD_CLOEXEC, 10);
    if (control < 0 || arena < 0 || dup2(control, kWorkerControlFd) < 0 ||
        dup2(arena, kWorkerArenaFd) < 0) {
      _exit(127);
    }
    // Then everything else goes: the other workers' arenas and sockets, the
    // server's listening sockets, and whatever a library or another thread
    // opened without close-on-exec (or was opening during the fork).
    static_assert(kWorkerControlFd == STDERR_FILENO + 1 && kWorkerArenaFd == kWorkerControlFd + 1);
    base::CloseDescriptorsFrom(kWorkerArenaFd + 1, fd_limit);
    execve(exe, argv.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  *control_fd = fds[0];
  return pid;
}

bool WorkerSupervisor::SendLocked(Slot* slot, worker::Command command, ReplyFn fn) {
  // Caller holds slot->mu.
  if (slot->fd < 0) return false;
  uint64_t id = slot->next_id++;
  command.set_id(id);
  Slot::Pending& pending = slot->pending[id];
  pending.fn = std::move(fn);
  if (command.has_load()) {
    pending.model = command.load().key();
    pending.load = true;
  } else if (command.has_run()) {
    pending.model = command.run().key();
    pending.run = true;
  }
  base::MutexLock write_lock(&slot->write_mu);
  // A failed write means the worker is gone: the reader sees the same end of
  // stream and answers this command (now pending) as lost, so the command is
  // taken either way.
  WriteFramed(slot->fd, command).IgnoreError();
  return true;
}

void WorkerSupervisor::ForgetModelLocked(Slot* slot, const std::string& key) {
  slot->load_errors.erase(key);
  slot->instances.erase(key);
  slot->instances_reports.erase(key);
  if (slot->models.erase(key) == 0) return;
  if (metrics_ != nullptr) {
    // key is "name:version"; the version has no ':'.
    const size_t colon = key.rfind(':');
    if (colon != std::string::npos) {
      metrics_->RemoveModelFromWorker(key.substr(0, colon), key.substr(colon + 1), slot->index,
                                      slot->placement.numa_node);
    }
  }
  worker::Command unload;
  unload.mutable_unload()->set_key(key);
  SendLocked(slot, unload, [](const worker::Reply&, bool) {});
}

bool WorkerSupervisor::Send(int w, worker::Command command, ReplyFn fn) {
  Slot* slot = slots_[w].get();
  base::MutexLock lock(&slot->mu);
  if (!slot->ready) return false;
  return SendLocked(slot, std::move(command), std::move(fn));
}

worker::Command WorkerSupervisor::LoadCommand(const ModelToLoad& model) {
  worker::Command load;
  load.mutable_load()->set_key(model.key);
  load.mutable_load()->set_path(model.path);
  load.mutable_load()->set_gemm_backend(model.gemm_backend);
  load.mutable_load()->set_instances(model.instances);
  load.mutable_load()->set_precision(model.precision);
  load.mutable_load()->set_max_activation_bytes(model.max_activation_bytes);
  for (const worker::Warmup& w : model.warmups) *load.mutable_load()->add_warmup() = w;
  return load;
}

void WorkerSupervisor::RecordLoad(Slot* slot, const ModelToLoad& model,
                                  const worker::Reply& reply) {
  {
    base::MutexLock lock(&slot->mu);
    if (reply.ok()) {
      slot->models.insert(model.key);
      // What the worker runs; a worker that does not say (none of numaserve's
      // own) runs what was asked for.
      const int instances = reply.instances() > 0 ? reply.instances() : model.instances;
      if (instances > 1) {
        slot->instances[model.key] = instances;
      } else {
        slot->instances.erase(model.key);
      }
      if (!reply.instances_report().empty()) {
        slot->instances_reports[model.key] = reply.instances_report();
      } else {
        slot->instances_reports.erase(model.key);
      }
      if (!reply.memory_nodes().empty()) slot->memory_nodes = reply.memory_nodes();
    } else {
      slot->load_errors[model.key] = reply.error();
    }
  }
  if (reply.ok() && metrics_) {
    metrics_->SetWorkerNodePages(slot->index, slot->placement.numa_node, reply.memory_nodes());
    metrics_->SetModelWeightBytes(model.name, model.version, slot->index, slot->placement.numa_node,
                                  static_cast<double>(reply.weight_bytes()));
    metrics_->SetModelLoadSeconds(model.name, model.version, slot->index, slot->placement.numa_node,
                                  static_cast<double>(reply.load_ns()) * 1e-9);
  }
}

bool WorkerSupervisor::ChargeCrash(const Slot::Pending& oldest, const std::string& why) {
  if (oldest.model.empty()) return false;
  std::string failed;
  int crashes = 0;
  {
    base::MutexLock lock(&models_mu_);
    auto it = std::find_if(models_.begin(), models_.end(),
                           [&](const ModelToLoad& m) { return m.key == oldest.model; });
    if (it == models_.end()) return false;  // unloaded meanwhile: nothing to resend
    // Every crash counts, a batch's too: a model that ran batches before
    // is no safer from a request that kills the worker (one that runs it
    // out of memory, say), which the router retries once.
    const base::Clock* clock = options_.clock != nullptr ? options_.clock : base::Clock::Real();
    const base::Clock::TimePoint now = clock->Now();
    std::deque<Crash>& charged = crashes_[oldest.model];
    charged.push_back({now, oldest.load});
    while (now - charged.front().at > options_.crash_window) charged.pop_front();
    crashes = static_cast<int>(charged.size());
    if (crashes < std::max(1, options_.max_model_crashes)) return oldest.load;
    const bool loads =
        std::any_of(charged.begin(), charged.end(), [](const Crash& c) { return c.load; });
    const bool runs =
        std::any_of(charged.begin(), charged.end(), [](const Crash& c) { return !c.load; });
    failed = absl::StrFormat("crashed the worker %d time%s while %s; not loaded again (last: %s)",
                             crashes, crashes == 1 ? "" : "s",
                             loads && runs ? "loading and running batches"
                             : loads       ? "loading"
                                           : "running batches",
                             why);
    failed_[oldest.model] = failed;
    models_.erase(it);
  }
  const ModelKeyParts key = SplitModelKey(oldest.model);
  Log(LogLevel::kError, "supervisor", absl::StrCat("model ", oldest.model, " ", failed),
      {{"model", key.name}, {"version", key.version}, {"crashes", crashes}, {"last", why}});
  UnloadFailed(oldest.model);
  return false;
}

void WorkerSupervisor::UnloadFailed(const std::string& key) {
  // Workers that hold it (it crashed another while running) free it; none
  // is chosen for it from now on.
  for (auto& other_ptr : slots_) {
    Slot* other = other_ptr.get();
    base::MutexLock lock(&other->mu);
    other->instances.erase(key);
    other->instances_reports.erase(key);
    if (other->models.erase(key) == 0) continue;
    worker::Command unload;
    unload.mutable_unload()->set_key(key);
    SendLocked(other, unload, [](const worker::Reply&, bool) {});
  }
}

bool WorkerSupervisor::Lose(Slot* slot, const std::string& why) {
  std::map<uint64_t, Slot::Pending> pending;
  const Slot::Pending* culprit = nullptr;  // in `pending`
  {
    base::MutexLock lock(&slot->mu);
    pending.swap(slot->pending);
    // The worker runs loads, unloads and the batches of single-instance
    // models one at a time in the order sent: the oldest of those it had not
    // answered is what it was doing when it died. Batches of models with
    // several instances run beside them on their own threads: one of those
    // is blamed only when nothing else was outstanding.
    const Slot::Pending* oldest_pooled = nullptr;
    for (const auto& [id, p] : pending) {
      if (!p.load && slot->instances.count(p.model) > 0) {
        if (oldest_pooled == nullptr) oldest_pooled = &p;
        continue;
      }
      culprit = &p;
      break;
    }
    if (culprit == nullptr) culprit = oldest_pooled;
    slot->ready = false;
    slot->models.clear();
    slot->instances.clear();
    slot->instances_reports.clear();
    slot->memory_nodes.clear();
    slot->sent.clear();
    if (slot->fd >= 0) close(slot->fd);
    slot->fd = -1;
  }
  bool resend = false;
  if (!stopping_ && culprit != nullptr) resend = ChargeCrash(*culprit, why);
  worker::Reply lost;
  lost.set_ok(false);
  lost.set_error(why);
  for (auto& [id, p] : pending) {
    lost.set_id(id);
    p.fn(lost, /*worker_lost=*/true);
  }
  return resend;
}

void WorkerSupervisor::Run(Slot* slot) {
  const auto& p = slot->placement;
  PlaceSupervisorThread(slot->index, p);  // its worker's node, with front-end cpus
  bool first = true;
  while (!stopping_) {
    if (!first) {
      std::this_thread::sleep_for(options_.restart_delay);
      if (stopping_) break;
      if (metrics_) metrics_->RecordWorkerRestart(slot->index, p.numa_node);
    }
    first = false;
    int fd = -1;
    auto pid = Spawn(slot, &fd);
    if (!pid.ok()) {
      Log(LogLevel::kError, "supervisor",
          absl::StrCat("cannot start worker ", slot->index, ": ", pid.status().message()),
          {{"worker", slot->index}, {"error", pid.status().message()}});
      continue;
    }
    {
      // Stop() sees the worker from its spawn on (not ready: no command is
      // sent to it before its hello) and stops it like the others. A Stop()
      // that came before this looked at the slot without it: the worker is
      // killed here, or Stop() would wait for this thread forever.
      base::MutexLock lock(&slot->mu);
      slot->pid = *pid;
      slot->fd = fd;
      slot->load_errors.clear();
      if (stopping_) kill(*pid, SIGKILL);
    }
    worker::Reply hello;
    absl::Status s = ReadFramed(fd, &hello);
    if (s.ok() && hello.has_hello()) {
      LogWorkerStarted(slot->index, p, hello.hello());
      LoadModels(slot);
      ServeReplies(slot, fd);
    }
    ReapWorker(slot, *pid);
  }
}

void WorkerSupervisor::LoadModels(Slot* slot) {
  // Under models_mu_ throughout the comparison and the turn to ready: a
  // LoadModel or UnloadModel either changed models_ before (and is seen
  // here) or finds the worker ready and sends it the load or unload itself.
  {
    base::MutexLock models_lock(&models_mu_);
    base::MutexLock lock(&slot->mu);
    if (slot->fd < 0) return;  // lost meanwhile; ReapWorker answers for it
    // The last of their replies calls LoadModels again.
    if (SendMissingLoads(slot) > 0) return;
    slot->ready = true;
    slot->started_once = true;
  }
  if (metrics_) metrics_->SetWorkerReady(slot->index, slot->placement.numa_node, true);
  {
    // Under start_mu_, so Start() cannot miss it between its check and its wait.
    base::MutexLock lock(&start_mu_);
    start_cv_.SignalAll();
  }
  on_change_();
}

int WorkerSupervisor::SendMissingLoads(Slot* slot) {
  std::set<std::string> wanted;
  std::vector<ModelToLoad> to_load;
  for (const auto& model : models_) {
    if (!model.LoadsOn(slot->index)) continue;
    wanted.insert(model.key);
    if (slot->sent.insert(model.key).second) to_load.push_back(model);
  }
  // Unloaded (or marked failed) since it was sent: the worker frees it.
  for (auto it = slot->sent.begin(); it != slot->sent.end();) {
    if (wanted.count(*it) > 0) {
      ++it;
      continue;
    }
    const std::string key = *it;
    it = slot->sent.erase(it);
    ForgetModelLocked(slot, key);
  }
  auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(to_load.size()));
  for (const auto& model : to_load) {
    SendLocked(slot, LoadCommand(model),
               [this, slot, model, remaining](const worker::Reply& reply, bool lost) {
                 RecordLoad(slot, model, reply);
                 if (!lost && remaining->fetch_sub(1) == 1) LoadModels(slot);
               });
  }
  return static_cast<int>(to_load.size());
}

void WorkerSupervisor::ServeReplies(Slot* slot, int fd) {
  // Serve replies until the worker goes away.
  while (true) {
    worker::Reply reply;
    if (!ReadFramed(fd, &reply).ok()) break;
    ReplyFn fn;
    bool run = false;  // a batch's reply
    {
      base::MutexLock lock(&slot->mu);
      auto it = slot->pending.find(reply.id());
      if (it == slot->pending.end()) continue;
      fn = std::move(it->second.fn);
      run = it->second.run;
      slot->pending.erase(it);
    }
    fn(reply, /*worker_lost=*/false);
    // A batch's `fn` launches what its freed instance can take already.
    if (!run) on_change_();
  }
}

void WorkerSupervisor::ReapWorker(Slot* slot, pid_t pid) {
  const auto& p = slot->placement;
  // The worker is gone (or is being stopped): reap it, answer what it held.
  int status = 0;
  waitpid(pid, &status, 0);
  std::string why =
      absl::StrFormat("worker %d (pid %d) %s", slot->index, pid, DescribeExit(status));
  if (metrics_) metrics_->SetWorkerReady(slot->index, p.numa_node, false);
  if (!stopping_) {
    Log(LogLevel::kWarning, "supervisor", absl::StrCat(why, "; restarting"),
        {{"worker", slot->index}, {"pid", pid}, {"exit", DescribeExit(status)}});
  }
  const bool resend = Lose(slot, why);
  {
    base::MutexLock lock(&slot->mu);
    slot->pid = -1;
    // Start() keeps waiting while a load that crashed the worker is tried
    // again (a bounded number of times), so it returns with the model
    // either loaded or failed with its reason.
    if (!resend) slot->started_once = true;
  }
  {
    // Under start_mu_, so Start() cannot miss it between its check and its wait.
    base::MutexLock lock(&start_mu_);
    start_cv_.SignalAll();
  }
  on_change_();
}

void WorkerSupervisor::Start(std::chrono::milliseconds timeout) {
  for (auto& slot : slots_) {
    Slot* s = slot.get();
    s->thread = std::thread([this, s] { Run(s); });
  }
  auto all_started = [this] {
    for (auto& slot : slots_) {
      base::MutexLock l(&slot->mu);
      if (!slot->started_once) return false;
    }
    return true;
  };
  base::MutexLock lock(&start_mu_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!all_started()) {
    // True once `timeout` has passed on the steady clock.
    if (start_cv_.WaitUntil(&start_mu_, deadline)) {
      break;
    }
  }
}

void WorkerSupervisor::Stop() {
  if (stopping_.exchange(true)) return;
  std::vector<pid_t> pids;
  for (auto& slot : slots_) {
    base::MutexLock lock(&slot->mu);
    slot->ready = false;
    // Half-close: the worker sees end of stream and exits; our reader then
    // sees the worker's end close.
    if (slot->fd >= 0) shutdown(slot->fd, SHUT_WR);
    pids.push_back(slot->pid);
  }
  auto deadline = std::chrono::steady_clock::now() + options_.stop_grace;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot* slot = slots_[i].get();
    while (std::chrono::steady_clock::now() < deadline) {
      {
        base::MutexLock lock(&slot->mu);
        if (slot->pid < 0) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    {
      base::MutexLock lock(&slot->mu);
      if (slot->pid > 0) kill(slot->pid, SIGKILL);
    }
    if (slot->thread.joinable()) slot->thread.join();
  }
}

bool WorkerSupervisor::Ready(int w) const {
  base::MutexLock lock(&slots_[w]->mu);
  return slots_[w]->ready;
}

bool WorkerSupervisor::HasModel(int w, const std::string& key) const {
  base::MutexLock lock(&slots_[w]->mu);
  return slots_[w]->ready && slots_[w]->models.count(key) > 0;
}

int WorkerSupervisor::Instances(int w, const std::string& key) const {
  base::MutexLock lock(&slots_[w]->mu);
  auto it = slots_[w]->instances.find(key);
  return it == slots_[w]->instances.end() ? 1 : it->second;
}

std::string WorkerSupervisor::InstancesReport(int w, const std::string& key) const {
  base::MutexLock lock(&slots_[w]->mu);
  auto it = slots_[w]->instances_reports.find(key);
  return it == slots_[w]->instances_reports.end() ? "" : it->second;
}

std::string WorkerSupervisor::MemoryNodes(int w) const {
  base::MutexLock lock(&slots_[w]->mu);
  return slots_[w]->memory_nodes;
}

int WorkerSupervisor::Outstanding(int w) const {
  base::MutexLock lock(&slots_[w]->mu);
  return static_cast<int>(slots_[w]->pending.size());
}

pid_t WorkerSupervisor::Pid(int w) const {
  base::MutexLock lock(&slots_[w]->mu);
  return slots_[w]->pid;
}

absl::Status WorkerSupervisor::LoadModel(const ModelToLoad& model,
                                         std::chrono::milliseconds timeout) {
  {
    base::MutexLock lock(&models_mu_);
    // Asked for again: a model marked failed gets its chances back.
    crashes_.erase(model.key);
    failed_.erase(model.key);
    auto it = std::find_if(models_.begin(), models_.end(),
                           [&](const ModelToLoad& m) { return m.key == model.key; });
    if (it != models_.end()) {
      *it = model;
    } else {
      models_.push_back(model);
    }
  }
  struct Wait {
    base::Mutex mu;
    base::CondVar cv;
    int outstanding ABSL_GUARDED_BY(mu) = 0;
    int loaded ABSL_GUARDED_BY(mu) = 0;
    std::string error ABSL_GUARDED_BY(mu);
  };
  auto wait = std::make_shared<Wait>();
  for (auto& slot_ptr : slots_) {
    Slot* slot = slot_ptr.get();
    if (!model.LoadsOn(slot->index)) continue;
    base::MutexLock lock(&slot->mu);
    // A worker still starting loads it before it turns ready (LoadModels).
    if (!slot->ready) continue;
    {
      base::MutexLock w(&wait->mu);
      ++wait->outstanding;
    }
    slot->load_errors.erase(model.key);
    SendLocked(slot, LoadCommand(model),
               [this, slot, model, wait](const worker::Reply& reply, bool) {
                 RecordLoad(slot, model, reply);
                 base::MutexLock w(&wait->mu);
                 --wait->outstanding;
                 if (reply.ok()) {
                   ++wait->loaded;
                 } else if (wait->error.empty()) {
                   wait->error = absl::StrCat("worker ", slot->index, ": ", reply.error());
                 }
                 wait->cv.SignalAll();
               });
  }
  int loaded = 0, outstanding = 0;
  std::string error;
  {
    // Released before models_mu_ is taken below: LoadModels holds
    // models_mu_ while it takes a slot's mu, and this thread held a slot's
    // mu while it took wait->mu.
    base::MutexLock w(&wait->mu);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (wait->outstanding != 0) {
      // True once `timeout` has passed on the steady clock.
      if (wait->cv.WaitUntil(&wait->mu, deadline)) {
        break;
      }
    }
    loaded = wait->loaded;
    outstanding = wait->outstanding;
    error = wait->error;
  }
  if (loaded > 0) return absl::OkStatus();
  {
    base::MutexLock lock(&models_mu_);
    if (auto it = failed_.find(model.key); it != failed_.end()) {
      return absl::InternalError(it->second);
    }
  }
  if (!error.empty()) return absl::InternalError(error);
  if (outstanding > 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("no worker finished loading ", model.key, " in time"));
  }
  return absl::UnavailableError(absl::StrCat("no ready worker could load ", model.key));
}

void WorkerSupervisor::UnloadModel(const std::string& key) {
  {
    base::MutexLock lock(&models_mu_);
    crashes_.erase(key);
    failed_.erase(key);
    models_.erase(std::remove_if(models_.begin(), models_.end(),
                                 [&](const ModelToLoad& m) { return m.key == key; }),
                  models_.end());
  }
  for (auto& slot_ptr : slots_) {
    Slot* slot = slot_ptr.get();
    base::MutexLock lock(&slot->mu);
    ForgetModelLocked(slot, key);
  }
}

std::string WorkerSupervisor::LoadError(const std::string& key) const {
  {
    base::MutexLock lock(&models_mu_);
    if (auto it = failed_.find(key); it != failed_.end()) return it->second;
  }
  std::string error;
  for (const auto& slot : slots_) {
    base::MutexLock lock(&slot->mu);
    if (slot->models.count(key) > 0) return "";
    auto it = slot->load_errors.find(key);
    if (it != slot->load_errors.end()) error = it->second;
  }
  return error;
}

bool WorkerSupervisor::ModelAvailable(const std::string& key) const {
  for (int w = 0; w < size(); ++w) {
    if (HasModel(w, key)) return true;
  }
  return false;
}

bool WorkerSupervisor::ModelExpected(const std::string& key) const {
  if (stopping_) return false;
  std::vector<bool> loads_on(slots_.size(), false);
  {
    base::MutexLock lock(&models_mu_);
    if (failed_.count(key) > 0) return false;
    bool found = false;
    for (const auto& m : models_) {
      if (m.key != key) continue;
      found = true;
      for (size_t w = 0; w < slots_.size(); ++w) loads_on[w] = m.LoadsOn(static_cast<int>(w));
    }
    if (!found) return false;  // unloaded, or never sent to workers
  }
  for (size_t w = 0; w < slots_.size(); ++w) {
    if (!loads_on[w]) continue;
    const Slot& slot = *slots_[w];
    base::MutexLock lock(&slot.mu);
    const bool holds = slot.ready && slot.models.count(key) > 0;
    // A worker whose load of `key` failed will not hold it; any other
    // worker of its placement either holds it or is on its way to.
    if (!holds && slot.load_errors.count(key) == 0) return true;
  }
  return false;
}

}  // namespace numaserve::serving
