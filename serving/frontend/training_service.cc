#include "serving/frontend/training_service.h"

#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <functional>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/child_fds.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "base/mutex.h"
#include "serving/frontend/training_job.h"
#include "serving/frontend/training_paths.h"
#include "training/rank_binding.h"
#include "training/trainer.h"

extern char** environ;

namespace numaserve::serving {

using base::Log;
using base::LogLevel;
using training::TrainingProgress;

// Streams a job's progress: each new version once, the final state last.
// Its state below is guarded by its sink's mutex (sink_->mu). What to do
// next is decided under that mutex (Decide) and done after it is released
// (Act): only the caller that set in_flight_ calls StartWrite, only the one
// that set finished_ calls Finish, and gRPC deletes nothing before Finish,
// so the reactor is alive for both.
class WatchReactor final : public grpc::ServerWriteReactor<TrainingProgress> {
 public:
  // The next call into gRPC, if any.
  struct Next {
    enum Kind { kNothing, kWrite, kFinish } kind = kNothing;
    grpc::Status status;  // kFinish
  };

  explicit WatchReactor(std::shared_ptr<TrainingJob> job)
      : job_(std::move(job)), sink_(std::make_shared<WatchSink>()) {
    Next next;
    {
      base::MutexLock lock(&sink_->mu);
      sink_->reactor = this;
      job_->AddSink(sink_);
      next = Decide();
    }
    Act(next);
  }

  void OnWriteDone(bool ok) override {
    Next next;
    {
      base::MutexLock lock(&sink_->mu);
      in_flight_ = false;
      if (!ok) broken_ = true;
      next = Decide();
    }
    Act(next);
  }
  void OnDone() override {
    {
      base::MutexLock lock(&sink_->mu);
      sink_->reactor = nullptr;
    }
    job_->RemoveSink(sink_.get());
    delete this;
  }

  // Called with the sink's mutex held: the next write or the finish, each
  // decided once.
  Next Decide() {
    if (in_flight_ || finished_) return {};
    if (broken_) {
      finished_ = true;
      return {Next::kFinish, grpc::Status(grpc::StatusCode::CANCELLED, "client went away")};
    }
    auto [progress, version] = job_->Snapshot();
    if (version > sent_version_) {
      sent_version_ = version;
      message_ = std::move(progress);
      in_flight_ = true;
      return {Next::kWrite, {}};
    }
    if (message_.state() != TrainingProgress::RUNNING && sent_version_ > 0) {
      finished_ = true;
      return {Next::kFinish, grpc::Status::OK};
    }
    return {};
  }
  // Called without the sink's mutex, with what Decide returned. message_
  // does not change until the write is done.
  void Act(const Next& next) {
    if (next.kind == Next::kWrite) {
      StartWrite(&message_);
    } else if (next.kind == Next::kFinish) {
      Finish(next.status);  // `this` may be deleted from here on
    }
  }

 private:
  const std::shared_ptr<TrainingJob> job_;
  const std::shared_ptr<WatchSink> sink_;  // shared with the job's sink list
  TrainingProgress message_;
  int64_t sent_version_ = 0;
  bool in_flight_ = false;
  bool finished_ = false;
  bool broken_ = false;
};

// TrainingJob's (training_job.h), here because it needs WatchReactor whole.
void TrainingJob::Notify() {
  std::vector<std::shared_ptr<WatchSink>> sinks;
  {
    base::MutexLock lock(&sinks_mu_);
    sinks = sinks_;
  }
  for (const std::shared_ptr<WatchSink>& sink : sinks) {
    WatchReactor* reactor = nullptr;
    WatchReactor::Next next;
    {
      base::MutexLock lock(&sink->mu);
      reactor = sink->reactor;
      if (reactor != nullptr) next = reactor->Decide();
    }
    if (reactor != nullptr) reactor->Act(next);
  }
}

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const absl::Status& status) {
  // absl and gRPC number their codes alike.
  return Done(context, grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                                    std::string(status.message())));
}

std::string SelfExe() {
  char path[4096];
  const ssize_t len = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (len <= 0) return "numaserve";
  path[len] = '\0';
  return path;
}

// A StartTraining request's config, as the job runs it.
struct JobConfig {
  training::TrainingConfig config;  // its paths resolved inside the root
  std::string text;                 // `config` printed: the job's config file
};

// Parses `config_text` (INVALID_ARGUMENT naming the field), resolves its
// paths for the caller of `scope` (training_paths::ConfineConfig) and
// prints it back.
absl::StatusOr<JobConfig> ResolveJobConfig(const training_paths::CallerScope& scope,
                                           const std::string& config_text) {
  absl::StatusOr<training::TrainingConfig> config =
      training::ParseTrainingConfig(config_text, "config_text");
  if (!config.ok()) return absl::InvalidArgumentError(config.status().message());
  if (absl::Status s = training_paths::ConfineConfig(scope, &*config); !s.ok()) return s;
  // The job runs the config with the resolved paths.
  JobConfig resolved;
  if (!google::protobuf::TextFormat::PrintToString(*config, &resolved.text)) {
    return absl::InternalError("cannot print the training config");
  }
  resolved.config = *std::move(config);
  return resolved;
}

// A job's metrics label: the export name (checked: a model name in UTF-8),
// else the model's path, escaped unless it is UTF-8 (a client may have
// named a file in the root with any bytes).
std::string ModelLabel(const training::TrainingConfig& config) {
  std::string model =
      !config.export_model_name().empty() ? config.export_model_name() : config.model();
  if (!base::IsUtf8(model)) model = absl::CHexEscape(model);
  return model;
}

// Starts `args` (args[0] the binary, the job's log options and process
// settings among them: see StartTraining) in its own process group with
// the server's environment less the process settings' variables, its
// stdout and stderr into a pipe whose reading end goes to *output_fd.
// The job gets /dev/null as stdin (mpirun forwards stdin to rank 0), the
// pipe, and no other file: no worker's arena or socket, no connection of a
// client.
absl::StatusOr<pid_t> SpawnJob(std::vector<std::string> args, const std::vector<int>& job_cpus,
                               int* output_fd) {
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    return absl::InternalError(absl::StrCat("/dev/null: ", base::ErrnoText(errno)));
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    close(null_fd);
    return absl::InternalError("pipe failed");
  }
  const int fd_limit = base::DescriptorLimit();
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = EnvironmentWithoutProcessVariables(environ);
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  cpu_set_t job_mask;
  CPU_ZERO(&job_mask);
  bool have_mask = false;
  for (int cpu : job_cpus) {
    if (cpu >= 0 && cpu < CPU_SETSIZE) {
      CPU_SET(cpu, &job_mask);
      have_mask = true;
    }
  }
  const pid_t pid = fork();
  if (pid < 0) {
    close(null_fd);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    // Own process group, so Cancel reaches mpirun and its ranks; the job
    // does not share the server's terminal signals.
    setpgid(0, 0);
    // The server blocks SIGTERM/SIGINT for its signal thread and a blocked
    // mask survives exec: unblock, or CancelTraining could not stop mpirun.
    sigset_t none;
    sigemptyset(&none);
    pthread_sigmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (have_mask) sched_setaffinity(0, sizeof(job_mask), &job_mask);
    // Moved above 2 first: a server started with 0, 1 or 2 closed may hold
    // the pipe or /dev/null there, where dup2 would close or keep it
    // close-on-exec. dup2 leaves its copies open across exec.
    const int in = fcntl(null_fd, F_DUPFD_CLOEXEC, 10);
    const int out = fcntl(pipe_fds[1], F_DUPFD_CLOEXEC, 10);
    if (in < 0 || out < 0 || dup2(in, STDIN_FILENO) < 0 || dup2(out, STDOUT_FILENO) < 0 ||
        dup2(out, STDERR_FILENO) < 0) {
      _exit(127);
    }
    base::CloseDescriptorsFrom(STDERR_FILENO + 1, fd_limit);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(null_fd);
  close(pipe_fds[1]);
  *output_fd = pipe_fds[0];
  return pid;
}

// `numaserve train`'s command line for a job. The job logs at the server's
// level, in JSON whatever the server's format: ParseLine reads the records
// of `train` and its ranks back whole (level, fields) and logs them in the
// server's own format. The caller's id is the owner of its export
// (--export-owner). The server's kernel and training settings follow.
std::vector<std::string> JobArgs(const TrainingServiceOptions& options,
                                 const std::string& config_path, int ranks, bool resume,
                                 const std::string& owner) {
  std::vector<std::string> args = {
      options.binary,   "train",
      "--config",       config_path,
      "--ranks",        absl::StrCat(ranks),
      "--log-format",   base::LogFormatName(base::LogFormat::kJson),
      "--log-level",    base::LogLevelName(base::CurrentLogOptions().level),
      "--export-owner", owner};
  if (resume) args.push_back("--resume");
  for (std::string& flag :
       ProcessFlags(options.process, kKernelFlags | kTrainingFlags | kPlacementFlags)) {
    args.push_back(std::move(flag));
  }
  return args;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainingService>> TrainingService::Create(
    TrainingServiceOptions options) {
  if (options.root.empty()) {
    return absl::InvalidArgumentError(
        "the training service needs a root directory for the files of its jobs "
        "(--training-root DIR)");
  }
  char real[PATH_MAX];
  if (realpath(options.root.c_str(), real) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--training-root ", options.root, ": ", base::ErrnoText(errno)));
  }
  struct stat st{};
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--training-root ", options.root, " is not a directory"));
  }
  options.root = real;
  if (absl::Status s = training_paths::MakeCallersDir(options.root); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--training-root ", options.root, ": ", s.message()));
  }
  if (options.max_ranks < 1 || options.max_jobs < 1 || options.max_config_bytes < 1) {
    return absl::InvalidArgumentError(
        "--training-max-ranks, --training-max-jobs and --training-max-config-bytes must be at "
        "least 1");
  }
  if (options.work_dir.empty()) {
    const char* tmp = getenv("TMPDIR");
    options.work_dir = tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp";
  }
  return std::unique_ptr<TrainingService>(new TrainingService(std::move(options)));
}

TrainingService::TrainingService(TrainingServiceOptions options) : options_(std::move(options)) {
  if (options_.binary.empty()) options_.binary = SelfExe();
}

void TrainingService::StopAll() {
  std::vector<std::shared_ptr<TrainingJob>> jobs;
  {
    base::MutexLock lock(&mu_);
    jobs = jobs_;
  }
  for (auto& job : jobs) {
    const absl::Status cancelled = job->Cancel();
    if (cancelled.ok()) {
      Log(LogLevel::kInfo, "training",
          absl::StrCat("stopping training job ", job->label(), " (checkpoint, then exit)"),
          {{"job", job->label()}});
    } else if (absl::IsResourceExhausted(cancelled)) {
      // No thread to escalate with: stopped at once, without a checkpoint.
      Log(LogLevel::kWarning, "training",
          absl::StrCat(cancelled.message(), ": SIGTERM instead (no checkpoint)"),
          {{"job", job->label()}});
      job->Terminate();
    }
  }
}

void TrainingService::Reap() {
  std::vector<std::shared_ptr<TrainingJob>> ended;
  std::vector<std::shared_ptr<TrainingJob>> forgotten;
  {
    base::MutexLock lock(&mu_);
    for (const auto& job : jobs_) {
      if (job->finished()) ended.push_back(job);
    }
    // jobs_ is in the order the jobs started: the oldest ended ones go.
    size_t excess =
        ended.size() > options_.max_finished_jobs ? ended.size() - options_.max_finished_jobs : 0;
    std::erase_if(jobs_, [&](const std::shared_ptr<TrainingJob>& job) {
      if (excess == 0 || !job->finished()) return false;
      --excess;
      forgotten.push_back(job);
      return true;
    });
  }
  for (const auto& job : ended) job->JoinThreads();
  for (const auto& job : forgotten) job->RemoveMetrics();
}

TrainingService::~TrainingService() {
  StopAll();
  std::vector<std::shared_ptr<TrainingJob>> jobs;
  {
    base::MutexLock lock(&mu_);
    jobs.swap(jobs_);
  }
  jobs.clear();  // joins the readers once the children have exited
}

std::shared_ptr<TrainingJob> TrainingService::Find(const std::string& id,
                                                   const std::string& caller) {
  base::MutexLock lock(&mu_);
  for (auto& job : jobs_) {
    if (job->id() == id && job->owner() == caller) return job;
  }
  return nullptr;
}

absl::StatusOr<std::string> TrainingService::Caller(const grpc::ServerContextBase& context) const {
  std::string caller = options_.caller ? options_.caller(context) : "";
  if (caller.empty() && options_.authenticated) {
    return absl::UnauthenticatedError("the caller could not be identified");
  }
  return caller;
}

absl::StatusOr<training_paths::CallerScope> TrainingService::Scope(
    const std::string& caller) const {
  bool made = false;
  absl::StatusOr<training_paths::CallerScope> scope =
      training_paths::OpenCallerScope(options_.root, caller, &made);
  if (!scope.ok()) {
    Log(LogLevel::kError, "training", std::string(scope.status().message()));
    return absl::InternalError(
        absl::StrCat("cannot make this caller's directory: ", scope.status().message()));
  }
  if (made) {
    Log(LogLevel::kInfo, "training",
        absl::StrCat("training directory of ", caller.empty() ? "anonymous callers" : caller, ": ",
                     scope->area),
        {{"caller", caller}, {"path", scope->area}});
  }
  return scope;
}

absl::StatusOr<int> TrainingService::Ranks(const std::string& requested) const {
  if (requested.empty() || requested == "auto") {
    absl::StatusOr<int> domains = training::AutoRankCount();
    if (!domains.ok()) return domains.status();
    return std::min(*domains, options_.max_ranks);
  }
  int ranks = 0;
  if (!absl::SimpleAtoi(requested, &ranks) || ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ranks: expected auto or a positive number, got '", training_paths::Shown(requested), "'"));
  }
  if (ranks > options_.max_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks: ", ranks, " is more than the ", options_.max_ranks,
                     " this server runs for one job (serve --training-max-ranks)"));
  }
  return ranks;
}

grpc::ServerUnaryReactor* TrainingService::StartTraining(
    grpc::CallbackServerContext* context, const training::StartTrainingRequest* request,
    training::StartTrainingResponse* response) {
  absl::StatusOr<std::string> caller = Caller(*context);
  if (!caller.ok()) return Done(context, caller.status());
  if (request->config_text().size() > options_.max_config_bytes) {
    return Done(context, absl::InvalidArgumentError(absl::StrCat(
                             "config_text: ", request->config_text().size(),
                             " bytes, more than the ", options_.max_config_bytes,
                             " this server accepts (serve --training-max-config-bytes)")));
  }
  absl::StatusOr<int> ranks = Ranks(request->ranks());
  if (!ranks.ok()) return Done(context, ranks.status());
  absl::StatusOr<training_paths::CallerScope> scope = Scope(*caller);
  if (!scope.ok()) return Done(context, scope.status());
  absl::StatusOr<JobConfig> config = ResolveJobConfig(*scope, request->config_text());
  if (!config.ok()) return Done(context, config.status());
  absl::StatusOr<std::string> secret = training_paths::RandomHex(16);
  if (!secret.ok()) return Done(context, secret.status());

  Reap();
  // A place among the running jobs, held until the job is in jobs_.
  std::string label;
  {
    base::MutexLock lock(&mu_);
    const int running =
        starting_ + static_cast<int>(std::count_if(jobs_.begin(), jobs_.end(),
                                                   [](const auto& j) { return !j->finished(); }));
    if (running >= options_.max_jobs) {
      return Done(context, absl::ResourceExhaustedError(absl::StrCat(
                               running,
                               " training job(s) running, the most this server runs at "
                               "once (serve --training-max-jobs); try again later")));
    }
    ++starting_;
    label = absl::StrCat("train-", next_id_++);
  }
  struct Release {
    TrainingService* service;
    ~Release() {
      base::MutexLock lock(&service->mu_);
      --service->starting_;
    }
  } release{this};
  const std::string id = absl::StrCat(label, "-", *secret);

  absl::StatusOr<std::unique_ptr<PrivateDir>> files =
      PrivateDir::Create(options_.work_dir, config->text);
  if (!files.ok()) return Done(context, files.status());
  int output_fd = -1;
  absl::StatusOr<pid_t> pid =
      SpawnJob(JobArgs(options_, (*files)->config_path(), *ranks, request->resume(), scope->owner),
               options_.job_cpus, &output_fd);
  if (!pid.ok()) return Done(context, pid.status());
  const std::string model = ModelLabel(config->config);
  auto job = std::make_shared<TrainingJob>(id, label, *caller, model, *pid, std::move(*files),
                                           options_.metrics, options_.stop_grace);
  if (absl::Status started = job->Start(output_fd); !started.ok()) {
    job->RemoveMetrics();
    return Done(context, started);
  }
  {
    base::MutexLock lock(&mu_);
    jobs_.push_back(job);
  }
  Log(LogLevel::kInfo, "training",
      absl::StrCat("training job ", label, " started (", *ranks, " rank(s))",
                   caller->empty() ? "" : " for ", *caller),
      {{"job", label}, {"model", model}, {"ranks", *ranks}, {"caller", *caller}, {"pid", *pid}});
  response->set_job_id(id);
  response->set_output_directory(scope->area);
  return Done(context, grpc::Status::OK);
}

grpc::ServerWriteReactor<TrainingProgress>* TrainingService::WatchTraining(
    grpc::CallbackServerContext* context, const training::WatchTrainingRequest* request) {
  class Refused final : public grpc::ServerWriteReactor<TrainingProgress> {
   public:
    explicit Refused(const grpc::Status& status) { Finish(status); }
    void OnDone() override { delete this; }
  };
  absl::StatusOr<std::string> caller = Caller(*context);
  if (!caller.ok()) {
    return new Refused(
        grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(caller.status().message())));
  }
  std::shared_ptr<TrainingJob> job = Find(request->job_id(), *caller);
  if (job == nullptr) {
    return new Refused(
        grpc::Status(grpc::StatusCode::NOT_FOUND,
                     "no training job '" + training_paths::Shown(request->job_id()) + "'"));
  }
  return new WatchReactor(std::move(job));
}

grpc::ServerUnaryReactor* TrainingService::CancelTraining(
    grpc::CallbackServerContext* context, const training::CancelTrainingRequest* request,
    training::CancelTrainingResponse*) {
  absl::StatusOr<std::string> caller = Caller(*context);
  if (!caller.ok()) return Done(context, caller.status());
  std::shared_ptr<TrainingJob> job = Find(request->job_id(), *caller);
  if (job == nullptr) {
    return Done(context,
                grpc::Status(grpc::StatusCode::NOT_FOUND,
                             "no training job '" + training_paths::Shown(request->job_id()) + "'"));
  }
  if (absl::Status cancelled = job->Cancel(); !cancelled.ok()) return Done(context, cancelled);
  Log(LogLevel::kInfo, "training",
      absl::StrCat("training job ", job->label(), " cancelled by its caller"),
      {{"job", job->label()}});
  return Done(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TrainingService::ListTrainings(
    grpc::CallbackServerContext* context, const training::ListTrainingsRequest*,
    training::ListTrainingsResponse* response) {
  absl::StatusOr<std::string> caller = Caller(*context);
  if (!caller.ok()) return Done(context, caller.status());
  if (caller->empty()) {
    return Done(context,
                absl::PermissionDeniedError(
                    "ListTrainings needs an authenticated caller (serve --grpc-auth-token-file "
                    "or --grpc-tls-client-ca); without authentication a job is reached only by "
                    "the id StartTraining returned"));
  }
  std::vector<std::shared_ptr<TrainingJob>> jobs;
  {
    base::MutexLock lock(&mu_);
    jobs = jobs_;
  }
  for (auto& job : jobs) {
    if (job->owner() == *caller) *response->add_jobs() = job->Snapshot().first;
  }
  return Done(context, grpc::Status::OK);
}

}  // namespace numaserve::serving
