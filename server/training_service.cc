#include "server/training_service.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/training/trainer.h"
#include "server/metrics.h"

namespace numaserve::server {

using training::TrainingProgress;

// One `numaserve train` child and what it has reported.
class WatchReactor;

// What a job notifies: a watcher that may already be gone (reactor null).
// The mutex is recursive because gRPC may run OnDone inline from Finish.
struct WatchSink {
  std::recursive_mutex mu;
  WatchReactor* reactor = nullptr;
};

class TrainingJob {
 public:
  TrainingJob(std::string id, std::string model, pid_t pid, int output_fd, Metrics* metrics,
              std::chrono::milliseconds stop_grace)
      : id_(std::move(id)),
        model_(std::move(model)),
        pid_(pid),
        metrics_(metrics),
        stop_grace_(stop_grace) {
    progress_.set_job_id(id_);
    progress_.set_state(TrainingProgress::RUNNING);
    progress_.set_test_accuracy(-1);
    if (metrics_ != nullptr) metrics_->SetTrainingState(id_, model_, "running");
    reader_ = std::thread([this, output_fd] { ReadOutput(output_fd); });
  }
  ~TrainingJob() {
    if (reader_.joinable()) reader_.join();
    if (stopper_.joinable()) stopper_.join();
  }

  const std::string& id() const { return id_; }

  // The latest progress and its version (incremented on every change).
  std::pair<TrainingProgress, int64_t> Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return {progress_, version_};
  }
  bool finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return progress_.state() != TrainingProgress::RUNNING;
  }

  // Starts stopping the job (see training_service.h); returns false when it
  // has already ended. A job already stopping stays so.
  bool Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    if (progress_.state() != TrainingProgress::RUNNING) return false;
    if (cancelled_) return true;
    cancelled_ = true;
    kill(-pid_, SIGUSR1);
    stopper_ = std::thread([this] { Escalate(); });
    return true;
  }

  void AddSink(std::shared_ptr<WatchSink> sink) {
    std::lock_guard<std::mutex> lock(sinks_mu_);
    sinks_.push_back(std::move(sink));
  }
  void RemoveSink(const WatchSink* sink) {
    std::lock_guard<std::mutex> lock(sinks_mu_);
    std::erase_if(sinks_, [&](const auto& s) { return s.get() == sink; });
  }

 private:
  void Notify();

  // SIGTERM when the job has not ended stop_grace after SIGUSR1, SIGKILL
  // 5 s later.
  void Escalate() {
    std::unique_lock<std::mutex> lock(mu_);
    if (exited_cv_.wait_for(lock, stop_grace_, [&] { return exited_; })) return;
    fprintf(stderr, "numaserve: training job %s still running %.0f s after SIGUSR1: SIGTERM\n",
            id_.c_str(), stop_grace_.count() / 1000.0);
    kill(-pid_, SIGTERM);
    if (exited_cv_.wait_for(lock, std::chrono::seconds(5), [&] { return exited_; })) return;
    fprintf(stderr, "numaserve: training job %s still running 5 s after SIGTERM: SIGKILL\n",
            id_.c_str());
    kill(-pid_, SIGKILL);
  }

  // "eta 1:02:03" or "eta 2:03" in a progress line; -1 when absent.
  static double ParseEta(const std::string& line) {
    const size_t at = line.rfind(" eta ");
    if (at == std::string::npos) return -1;
    int a = 0, b = 0, c = 0;
    const int n = sscanf(line.c_str() + at, " eta %d:%d:%d", &a, &b, &c);
    if (n == 3) return a * 3600.0 + b * 60.0 + c;
    if (n == 2) return a * 60.0 + b;
    return -1;
  }

  void ExportFigures() {
    if (metrics_ == nullptr) return;
    Metrics::TrainingFigures f;
    f.epoch = progress_.epoch();
    f.step = progress_.step();
    f.total_steps = progress_.total_steps();
    f.loss = progress_.loss();
    f.accuracy = progress_.accuracy();
    f.images_per_second = progress_.images_per_second();
    f.eta_seconds = eta_seconds_;
    f.test_accuracy = progress_.test_accuracy();
    metrics_->SetTrainingProgress(id_, model_, f);
  }

  void ParseLine(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    long long epoch = 0, epochs = 0, step = 0, total = 0;
    double loss = 0, acc = 0, lr = 0, rate = 0, test = 0;
    if (sscanf(line.c_str(),
               "epoch %lld/%lld step %lld/%lld loss %lf acc %lf%% lr %lf %lf images/s", &epoch,
               &epochs, &step, &total, &loss, &acc, &lr, &rate) == 8) {
      progress_.set_epoch(epoch);
      progress_.set_step(step);
      progress_.set_total_steps(total);
      progress_.set_loss(loss);
      progress_.set_accuracy(acc / 100.0);
      progress_.set_images_per_second(rate);
      eta_seconds_ = std::max(0.0, ParseEta(line));
      ExportFigures();
    } else if (const size_t at = line.find(" test acc ");
               line.rfind("epoch ", 0) == 0 && at != std::string::npos &&
               sscanf(line.c_str() + at, " test acc %lf%%", &test) == 1) {
      progress_.set_test_accuracy(test / 100.0);
      ExportFigures();
    } else if (line.rfind("exported ", 0) == 0) {
      progress_.set_message(line);
    } else if (sscanf(line.c_str(), "stopped at step %lld of %lld", &step, &total) == 2) {
      progress_.set_step(step);
      progress_.set_total_steps(total);
      stop_line_ = line;
      ExportFigures();
    } else if (line.find("numaserve train") != std::string::npos &&
               line.find("rank ") == std::string::npos &&
               line.find("mpirun") == std::string::npos) {
      last_error_ = line;
    } else if (line.find("(rank ") != std::string::npos) {
      last_error_ = line;
    } else {
      return;
    }
    progress_.set_line(line);
    ++version_;
  }

  void ReadOutput(int fd) {
    FILE* in = fdopen(fd, "r");
    char* buffer = nullptr;
    size_t size = 0;
    ssize_t n;
    while ((n = getline(&buffer, &size, in)) > 0) {
      std::string line(buffer, n);
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
      ParseLine(line);
      Notify();
    }
    free(buffer);
    fclose(in);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    std::string state;
    {
      std::lock_guard<std::mutex> lock(mu_);
      exited_ = true;
      exited_cv_.notify_all();
      if (cancelled_) {
        progress_.set_state(TrainingProgress::CANCELLED);
        progress_.set_message(stop_line_.empty() ? "cancelled"
                                                 : absl::StrCat("cancelled: ", stop_line_));
        state = "cancelled";
      } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        progress_.set_state(TrainingProgress::SUCCEEDED);
        state = "succeeded";
      } else {
        progress_.set_state(TrainingProgress::FAILED);
        progress_.set_message(last_error_.empty()
                                  ? absl::StrCat("numaserve train exited with status ", status)
                                  : last_error_);
        state = "failed";
      }
      ++version_;
      fprintf(stderr, "numaserve: training job %s %s at step %lld%s%s\n", id_.c_str(),
              state.c_str(), static_cast<long long>(progress_.step()),
              progress_.message().empty() ? "" : ": ", progress_.message().c_str());
    }
    if (metrics_ != nullptr) metrics_->SetTrainingState(id_, model_, state);
    Notify();
  }

  const std::string id_;
  const std::string model_;  // metrics label
  const pid_t pid_;
  Metrics* const metrics_;
  const std::chrono::milliseconds stop_grace_;
  std::mutex mu_;  // guards the fields below
  std::condition_variable exited_cv_;
  TrainingProgress progress_;
  int64_t version_ = 1;
  bool cancelled_ = false;
  bool exited_ = false;
  double eta_seconds_ = 0;
  std::string last_error_;
  std::string stop_line_;
  std::mutex sinks_mu_;  // guards sinks_ only; never held while notifying
  std::vector<std::shared_ptr<WatchSink>> sinks_;
  std::thread reader_;
  std::thread stopper_;
};

// Streams a job's progress: each new version once, the final state last.
// All its state is guarded by its sink's mutex.
class WatchReactor final : public grpc::ServerWriteReactor<TrainingProgress> {
 public:
  explicit WatchReactor(std::shared_ptr<TrainingJob> job) : job_(std::move(job)) {
    sink_ = std::make_shared<WatchSink>();
    sink_->reactor = this;
    std::shared_ptr<WatchSink> sink = sink_;
    std::lock_guard<std::recursive_mutex> lock(sink->mu);
    job_->AddSink(sink);
    Pump();
  }

  void OnWriteDone(bool ok) override {
    std::shared_ptr<WatchSink> sink = sink_;  // `this` may be deleted inside Pump
    std::lock_guard<std::recursive_mutex> lock(sink->mu);
    in_flight_ = false;
    if (!ok) broken_ = true;
    Pump();
  }
  void OnDone() override {
    std::shared_ptr<WatchSink> sink = sink_;
    {
      std::lock_guard<std::recursive_mutex> lock(sink->mu);
      sink->reactor = nullptr;
    }
    job_->RemoveSink(sink.get());
    delete this;
  }

  // Called with the sink's mutex held. Finish is its last action.
  void Pump() {
    if (in_flight_ || finished_) return;
    if (broken_) {
      finished_ = true;
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    auto [progress, version] = job_->Snapshot();
    if (version > sent_version_) {
      sent_version_ = version;
      message_ = std::move(progress);
      in_flight_ = true;
      StartWrite(&message_);
    } else if (message_.state() != TrainingProgress::RUNNING && sent_version_ > 0) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

 private:
  std::shared_ptr<TrainingJob> job_;
  std::shared_ptr<WatchSink> sink_;
  TrainingProgress message_;
  int64_t sent_version_ = 0;
  bool in_flight_ = false;
  bool finished_ = false;
  bool broken_ = false;
};

void TrainingJob::Notify() {
  std::vector<std::shared_ptr<WatchSink>> sinks;
  {
    std::lock_guard<std::mutex> lock(sinks_mu_);
    sinks = sinks_;
  }
  for (const std::shared_ptr<WatchSink>& sink : sinks) {
    std::lock_guard<std::recursive_mutex> lock(sink->mu);
    if (sink->reactor != nullptr) sink->reactor->Pump();
  }
}

namespace {

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context, const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

std::string SelfExe() {
  char path[4096];
  const ssize_t len = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (len <= 0) return "numaserve";
  path[len] = '\0';
  return path;
}

}  // namespace

TrainingService::TrainingService(TrainingServiceOptions options) : options_(std::move(options)) {
  if (options_.binary.empty()) options_.binary = SelfExe();
  if (options_.work_dir.empty()) {
    const char* tmp = getenv("TMPDIR");
    options_.work_dir =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/numaserve-training-", getpid());
  }
}

void TrainingService::StopAll() {
  std::vector<std::shared_ptr<TrainingJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs = jobs_;
  }
  for (auto& job : jobs) {
    if (job->Cancel()) {
      fprintf(stderr, "numaserve: stopping training job %s (checkpoint, then exit)\n",
              job->id().c_str());
    }
  }
}

TrainingService::~TrainingService() {
  StopAll();
  std::vector<std::shared_ptr<TrainingJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(jobs_);
  }
  jobs.clear();  // joins the readers once the children have exited
}

std::shared_ptr<TrainingJob> TrainingService::Find(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& job : jobs_) {
    if (job->id() == id) return job;
  }
  return nullptr;
}

grpc::ServerUnaryReactor* TrainingService::StartTraining(
    grpc::CallbackServerContext* context, const training::StartTrainingRequest* request,
    training::StartTrainingResponse* response) {
  std::string id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = absl::StrCat("train-", next_id_++);
  }
  std::error_code ec;
  std::filesystem::create_directories(options_.work_dir, ec);
  const std::string config_path = absl::StrCat(options_.work_dir, "/", id, ".cfg");
  {
    std::ofstream out(config_path, std::ios::trunc);
    out << request->config_text();
    if (!out)
      return Done(context, grpc::Status(grpc::StatusCode::INTERNAL, "cannot write " + config_path));
  }
  absl::StatusOr<training::TrainingConfig> config = training::LoadTrainingConfig(config_path);
  if (!config.ok()) {
    return Done(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                      std::string(config.status().message())));
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return Done(context, grpc::Status(grpc::StatusCode::INTERNAL, "pipe failed"));
  }
  std::vector<std::string> args = {
      options_.binary, "train",   "--config",
      config_path,     "--ranks", request->ranks().empty() ? "auto" : request->ranks()};
  if (request->resume()) args.push_back("--resume");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return Done(context, grpc::Status(grpc::StatusCode::INTERNAL, "fork failed"));
  }
  if (pid == 0) {
    // Own process group, so Cancel reaches mpirun and its ranks; the job
    // does not share the server's terminal signals.
    setpgid(0, 0);
    // The server blocks SIGTERM/SIGINT for its signal thread and a blocked
    // mask survives exec: unblock, or CancelTraining could not stop mpirun.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipe_fds[1]);
  const std::string model =
      !config->export_model_name().empty() ? config->export_model_name() : config->model();
  auto job = std::make_shared<TrainingJob>(id, model, pid, pipe_fds[0], options_.metrics,
                                           options_.stop_grace);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  response->set_job_id(id);
  return Done(context, grpc::Status::OK);
}

grpc::ServerWriteReactor<TrainingProgress>* TrainingService::WatchTraining(
    grpc::CallbackServerContext* context, const training::WatchTrainingRequest* request) {
  std::shared_ptr<TrainingJob> job = Find(request->job_id());
  if (job == nullptr) {
    class NotFound final : public grpc::ServerWriteReactor<TrainingProgress> {
     public:
      explicit NotFound(const std::string& id) {
        Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "no training job '" + id + "'"));
      }
      void OnDone() override { delete this; }
    };
    return new NotFound(request->job_id());
  }
  return new WatchReactor(std::move(job));
}

grpc::ServerUnaryReactor* TrainingService::CancelTraining(
    grpc::CallbackServerContext* context, const training::CancelTrainingRequest* request,
    training::CancelTrainingResponse*) {
  std::shared_ptr<TrainingJob> job = Find(request->job_id());
  if (job == nullptr) {
    return Done(context, grpc::Status(grpc::StatusCode::NOT_FOUND,
                                      "no training job '" + request->job_id() + "'"));
  }
  if (!job->Cancel()) {
    return Done(context,
                grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                             "training job '" + request->job_id() + "' has already ended"));
  }
  return Done(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TrainingService::ListTrainings(
    grpc::CallbackServerContext* context, const training::ListTrainingsRequest*,
    training::ListTrainingsResponse* response) {
  std::vector<std::shared_ptr<TrainingJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs = jobs_;
  }
  for (auto& job : jobs) *response->add_jobs() = job->Snapshot().first;
  return Done(context, grpc::Status::OK);
}

}  // namespace numaserve::server
