#include "serving/frontend/training_service.h"

#include <fcntl.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/wrappers.pb.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "serving/frontend/training_paths.h"
#include "serving/observability/metrics.h"
#include "training/rank_binding.h"
#include "training/trainer.h"

namespace numaserve::serving {

using base::Log;
using base::LogLevel;
using training::TrainingProgress;

// The longest line of a job's output the server keeps (a progress record
// is a few hundred bytes).
constexpr size_t kMaxOutputLine = 64 << 10;

// A job's private directory (mkdtemp: a fresh name, mode 0700) and the
// config file in it; both are removed by Remove() or the destructor.
class PrivateDir {
 public:
  // Makes <parent>/numaserve-training-XXXXXX and writes `config` into it
  // as job.cfg (0600, O_EXCL | O_NOFOLLOW).
  static absl::StatusOr<std::unique_ptr<PrivateDir>> Create(const std::string& parent,
                                                            const std::string& config) {
    std::string dir = absl::StrCat(parent, "/numaserve-training-XXXXXX");
    if (mkdtemp(dir.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot make a private directory in ", parent, ": ",
                                              base::ErrnoText(errno)));
    }
    std::unique_ptr<PrivateDir> made(new PrivateDir(dir));
    const int fd = open(made->config_path().c_str(),
                        O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::InternalError(
          absl::StrCat("cannot create ", made->config_path(), ": ", base::ErrnoText(errno)));
    }
    size_t done = 0;
    while (done < config.size()) {
      const ssize_t n = write(fd, config.data() + done, config.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        close(fd);
        return absl::InternalError(absl::StrCat("cannot write ", made->config_path()));
      }
      done += n;
    }
    close(fd);
    return made;
  }
  ~PrivateDir() { Remove(); }

  std::string config_path() const { return dir_ + "/job.cfg"; }
  void Remove() {
    std::lock_guard<std::mutex> lock(mu_);
    if (removed_) return;
    removed_ = true;
    unlink(config_path().c_str());
    rmdir(dir_.c_str());
  }

 private:
  explicit PrivateDir(std::string dir) : dir_(std::move(dir)) {}
  const std::string dir_;
  std::mutex mu_;
  bool removed_ = false;
};

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
  // `label` is the public part of `id` (metrics, log); `files` is removed
  // when the process has exited.
  TrainingJob(std::string id, std::string label, std::string owner, std::string model, pid_t pid,
              int output_fd, std::unique_ptr<PrivateDir> files, Metrics* metrics,
              std::chrono::milliseconds stop_grace)
      : id_(std::move(id)),
        label_(std::move(label)),
        owner_(std::move(owner)),
        model_(std::move(model)),
        pid_(pid),
        metrics_(metrics),
        stop_grace_(stop_grace),
        files_(std::move(files)) {
    progress_.set_job_id(id_);
    progress_.set_state(TrainingProgress::RUNNING);
    progress_.set_test_accuracy(-1);
    if (metrics_ != nullptr) metrics_->SetTrainingState(label_, model_, "running");
    reader_ = std::thread([this, output_fd] { ReadOutput(output_fd); });
  }
  ~TrainingJob() {
    if (reader_.joinable()) reader_.join();
    if (stopper_.joinable()) stopper_.join();
  }

  const std::string& id() const { return id_; }
  const std::string& label() const { return label_; }
  const std::string& owner() const { return owner_; }

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
    Log(LogLevel::kWarning, "training",
        absl::StrFormat("training job %s still running %.0f s after SIGUSR1: SIGTERM", label_,
                        stop_grace_.count() / 1000.0),
        {{"job", label_}, {"signal", "SIGTERM"}});
    kill(-pid_, SIGTERM);
    if (exited_cv_.wait_for(lock, std::chrono::seconds(5), [&] { return exited_; })) return;
    Log(LogLevel::kWarning, "training",
        absl::StrCat("training job ", label_, " still running 5 s after SIGTERM: SIGKILL"),
        {{"job", label_}, {"signal", "SIGKILL"}});
    kill(-pid_, SIGKILL);
  }

  // The "progress" field of a record of rank 0 (trainer.cc, WriteProgress):
  // a JSON string holding a ProgressReport as protobuf JSON. Refused, with
  // the reason, when it is not one or when its figures cannot be (an epoch
  // or step out of range, a ratio outside 0..1, a negative or non-finite
  // rate or eta); the loss may be anything, NaN included (a diverged run).
  static absl::StatusOr<training::ProgressReport> ReadProgressReport(
      const std::string& field_json) {
    // A JSON string reads back as a StringValue, whose JSON form is a string.
    google::protobuf::StringValue text;
    if (!google::protobuf::util::JsonStringToMessage(field_json, &text).ok()) {
      return absl::InvalidArgumentError("its \"progress\" field is not a string");
    }
    training::ProgressReport report;
    if (const auto status = google::protobuf::util::JsonStringToMessage(text.value(), &report);
        !status.ok()) {
      // The parser's first line says what is wrong; the rest points at it.
      const std::string why = status.ToString();
      return absl::InvalidArgumentError(absl::StrCat(
          "its \"progress\" field is not a ProgressReport: ", why.substr(0, why.find('\n'))));
    }
    const auto ratio = [](double x) { return x >= 0 && x <= 1; };  // false for NaN
    const auto rate = [](double x) { return std::isfinite(x) && x >= 0; };
    if (report.kind() != training::ProgressReport::INTERVAL &&
        report.kind() != training::ProgressReport::EPOCH_END) {
      return absl::InvalidArgumentError(absl::StrCat("unknown kind ", report.kind()));
    }
    if (report.epoch() < 1 || report.epoch() > report.epochs() || report.step() < 0 ||
        report.step() > report.total_steps()) {
      return absl::InvalidArgumentError(absl::StrCat("epoch ", report.epoch(), " of ",
                                                     report.epochs(), ", step ", report.step(),
                                                     " of ", report.total_steps()));
    }
    // A test accuracy below 0 (-1) means none.
    if (!ratio(report.accuracy()) || report.test_accuracy() > 1 ||
        !rate(report.images_per_second()) || !rate(report.eta_seconds())) {
      return absl::InvalidArgumentError(
          "accuracy, test_accuracy, images_per_second or eta_seconds out of range");
    }
    return report;
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
    metrics_->SetTrainingProgress(label_, model_, f);
  }

  // One line of the job's output (mpirun's stdout and stderr): a log
  // record of a rank or of the launcher (JSON, see SpawnJob), among them
  // rank 0's progress reports (trainer.cc), another line of rank 0's
  // ("exported ...", "stopped at step ..."), or a message of mpirun's. The
  // progress it reports is kept; the line goes into the server's log as a
  // record naming the job.
  void ParseLine(const std::string& line) {
    if (absl::StatusOr<base::LogRecord> record = base::ParseLogLine(line); record.ok()) {
      if (const base::LogField* report = ProgressField(*record); report != nullptr) {
        ReadProgress(record->message, report->json());
      } else {
        ForwardRecord(*record);
      }
      return;
    }
    const std::string message = absl::StrCat("training job ", label_, ": ", line);
    std::lock_guard<std::mutex> lock(mu_);
    long long step = 0, total = 0;
    if (line.rfind("exported ", 0) == 0) {
      progress_.set_message(line);
      Log(LogLevel::kInfo, "training", message,
          {{"job", label_}, {"path", line.substr(std::strlen("exported "))}});
    } else if (sscanf(line.c_str(), "stopped at step %lld of %lld", &step, &total) == 2) {
      progress_.set_step(step);
      progress_.set_total_steps(total);
      stop_line_ = line;
      ExportFigures();
      Log(LogLevel::kInfo, "training", message,
          {{"job", label_}, {"step", step}, {"total_steps", total}});
    } else {
      // Rank 0's other lines (the job's shape, "done: ..."), mpirun's
      // own: logged, not progress. The rules of mpirun's message blocks
      // are left out.
      if (line.find_first_not_of("- \t") != std::string::npos) {
        Log(LogLevel::kInfo, "training", message, {{"job", label_}});
      }
      return;
    }
    progress_.set_line(line);
    ++version_;
  }

  // The "progress" field of a progress report's record (component
  // "training"), else null.
  static const base::LogField* ProgressField(const base::LogRecord& record) {
    if (record.component != "training") return nullptr;
    for (const base::LogField& f : record.fields) {
      if (f.key() == "progress") return &f;
    }
    return nullptr;
  }

  // Rank 0's progress report: LINE (the record's message) as `numaserve
  // train` prints it in text, and the "progress" field's JSON. A report
  // that does not read back is left out with a debug record saying why:
  // the job's output is not trusted to be well formed.
  void ReadProgress(const std::string& line, const std::string& field_json) {
    absl::StatusOr<training::ProgressReport> report = ReadProgressReport(field_json);
    if (!report.ok()) {
      Log(LogLevel::kDebug, "training",
          absl::StrCat("training job ", label_,
                       ": progress record ignored: ", report.status().message()),
          {{"job", label_}});
      return;
    }
    const std::string message = absl::StrCat("training job ", label_, ": ", line);
    std::lock_guard<std::mutex> lock(mu_);
    if (report->kind() == training::ProgressReport::INTERVAL) {
      progress_.set_epoch(report->epoch());
      progress_.set_step(report->step());
      progress_.set_total_steps(report->total_steps());
      progress_.set_loss(report->loss());
      progress_.set_accuracy(report->accuracy());
      progress_.set_images_per_second(report->images_per_second());
      eta_seconds_ = report->eta_seconds();
      ExportFigures();
      Log(LogLevel::kDebug, "training", message,
          {{"job", label_},
           {"epoch", report->epoch()},
           {"epochs", report->epochs()},
           {"step", report->step()},
           {"total_steps", report->total_steps()},
           {"loss", report->loss()},
           {"accuracy", report->accuracy()},
           {"learning_rate", report->learning_rate()},
           {"images_per_second", report->images_per_second()},
           {"eta_seconds", eta_seconds_}});
    } else if (report->test_accuracy() >= 0) {
      progress_.set_test_accuracy(report->test_accuracy());
      ExportFigures();
      Log(LogLevel::kInfo, "training", message,
          {{"job", label_},
           {"epoch", report->epoch()},
           {"test_accuracy", report->test_accuracy()}});
    } else {
      // An epoch's summary without a test set: logged, not progress.
      Log(LogLevel::kInfo, "training", message, {{"job", label_}});
      return;
    }
    progress_.set_line(line);
    ++version_;
  }

  // A record a rank or the launcher wrote, in the server's log with the
  // job's label; its error is what the job's failure reports.
  void ForwardRecord(const base::LogRecord& record) {
    std::vector<base::LogField> fields = {{"job", label_}};
    for (const base::LogField& f : record.fields) {
      if (f.key() != "job") fields.push_back(f);
    }
    Log(record.level, record.component, absl::StrCat("training job ", label_, ": ", record.message),
        fields);
    if (record.level != LogLevel::kError) return;
    std::lock_guard<std::mutex> lock(mu_);
    last_error_ = record.message;
    progress_.set_line(record.message);
    ++version_;
  }

  // One line of the job's output without its newline, at most
  // kMaxOutputLine bytes of it: the rest of a longer line is dropped, so a
  // job cannot make the server hold a line of any length. False at the end
  // of the output.
  static bool ReadBoundedLine(FILE* in, std::string* line) {
    line->clear();
    bool any = false;
    for (int c = getc(in); c != EOF; c = getc(in)) {
      any = true;
      if (c == '\n') return true;
      if (line->size() < kMaxOutputLine) line->push_back(static_cast<char>(c));
    }
    return any;
  }

  void ReadOutput(int fd) {
    FILE* in = fdopen(fd, "r");
    std::string line;
    while (ReadBoundedLine(in, &line)) {
      while (!line.empty() && line.back() == '\r') line.pop_back();
      ParseLine(line);
      Notify();
    }
    fclose(in);
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    files_->Remove();
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
      Log(state == "failed" ? LogLevel::kError : LogLevel::kInfo, "training",
          absl::StrCat("training job ", label_, " ", state, " at step ", progress_.step(),
                       progress_.message().empty() ? "" : ": ", progress_.message()),
          {{"job", label_},
           {"model", model_},
           {"state", state},
           {"step", progress_.step()},
           {"total_steps", progress_.total_steps()}});
    }
    if (metrics_ != nullptr) metrics_->SetTrainingState(label_, model_, state);
    Notify();
  }

  const std::string id_;
  const std::string label_;  // the public part of id_: metrics and log
  const std::string owner_;  // the caller that started it ("" = anonymous)
  const std::string model_;  // metrics label
  const pid_t pid_;
  Metrics* const metrics_;
  const std::chrono::milliseconds stop_grace_;
  const std::unique_ptr<PrivateDir> files_;
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
// paths inside `root` (TrainingService::ConfinePaths) and prints it back.
absl::StatusOr<JobConfig> ResolveJobConfig(const std::string& root,
                                           const std::string& config_text) {
  absl::StatusOr<training::TrainingConfig> config =
      training::ParseTrainingConfig(config_text, "config_text");
  if (!config.ok()) return absl::InvalidArgumentError(config.status().message());
  if (absl::Status s = TrainingService::ConfinePaths(root, &*config); !s.ok()) return s;
  // The job runs the config with the resolved paths.
  JobConfig resolved;
  if (!google::protobuf::TextFormat::PrintToString(*config, &resolved.text)) {
    return absl::InternalError("cannot print the training config");
  }
  resolved.config = *std::move(config);
  return resolved;
}

// Starts `args` (args[0] the binary, the job's log options among them: see
// StartTraining) in its own process group with the server's environment,
// its stdout and stderr into a pipe whose reading end goes to *output_fd.
absl::StatusOr<pid_t> SpawnJob(std::vector<std::string> args, int* output_fd) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
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
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    execv(argv[0], argv.data());  // the server's environment
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipe_fds[1]);
  *output_fd = pipe_fds[0];
  return pid;
}

}  // namespace

absl::Status TrainingService::ConfinePaths(const std::string& root,
                                           training::TrainingConfig* config) {
  training::DatasetConfig* data = config->mutable_dataset();
  const std::pair<const char*, std::string*> inputs[] = {
      {"model", config->mutable_model()},
      {"dataset.train_images", data->mutable_train_images()},
      {"dataset.train_labels", data->mutable_train_labels()},
      {"dataset.test_images", data->mutable_test_images()},
      {"dataset.test_labels", data->mutable_test_labels()},
      {"dataset.train_records", data->mutable_train_records()},
      {"dataset.test_records", data->mutable_test_records()},
  };
  for (const auto& [field, value] : inputs) {
    if (absl::Status s = training_paths::ConfineInput(root, field, value); !s.ok()) return s;
  }
  const std::pair<const char*, std::string*> outputs[] = {
      {"checkpoint", config->mutable_checkpoint()},
      {"final_weights", config->mutable_final_weights()},
      {"timeline", config->mutable_timeline()},
  };
  for (const auto& [field, value] : outputs) {
    if (absl::Status s = training_paths::ConfineOutput(root, field, value); !s.ok()) return s;
  }
  return training_paths::ConfineExport(root, config);
}

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
  struct stat st {};
  if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--training-root ", options.root, " is not a directory"));
  }
  options.root = real;
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
    std::lock_guard<std::mutex> lock(mu_);
    jobs = jobs_;
  }
  for (auto& job : jobs) {
    if (job->Cancel()) {
      Log(LogLevel::kInfo, "training",
          absl::StrCat("stopping training job ", job->label(), " (checkpoint, then exit)"),
          {{"job", job->label()}});
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

std::shared_ptr<TrainingJob> TrainingService::Find(const std::string& id,
                                                   const std::string& caller) {
  std::lock_guard<std::mutex> lock(mu_);
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
  absl::StatusOr<JobConfig> config = ResolveJobConfig(options_.root, request->config_text());
  if (!config.ok()) return Done(context, config.status());
  absl::StatusOr<std::string> secret = training_paths::RandomHex(16);
  if (!secret.ok()) return Done(context, secret.status());

  // A place among the running jobs, held until the job is in jobs_.
  std::string label;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(service->mu_);
      --service->starting_;
    }
  } release{this};
  const std::string id = absl::StrCat(label, "-", *secret);

  absl::StatusOr<std::unique_ptr<PrivateDir>> files =
      PrivateDir::Create(options_.work_dir, config->text);
  if (!files.ok()) return Done(context, files.status());
  // The job logs at the server's level, in JSON whatever the server's
  // format: ParseLine reads the records of `train` and its ranks back whole
  // (level, fields) and logs them in the server's own format.
  std::vector<std::string> args = {
      options_.binary, "train",
      "--config",      (*files)->config_path(),
      "--ranks",       absl::StrCat(*ranks),
      "--log-format",  base::LogFormatName(base::LogFormat::kJson),
      "--log-level",   base::LogLevelName(base::CurrentLogOptions().level)};
  if (request->resume()) args.push_back("--resume");
  int output_fd = -1;
  absl::StatusOr<pid_t> pid = SpawnJob(std::move(args), &output_fd);
  if (!pid.ok()) return Done(context, pid.status());
  const std::string model = !config->config.export_model_name().empty()
                                ? config->config.export_model_name()
                                : config->config.model();
  auto job =
      std::make_shared<TrainingJob>(id, label, *caller, model, *pid, output_fd, std::move(*files),
                                    options_.metrics, options_.stop_grace);
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(job);
  }
  Log(LogLevel::kInfo, "training",
      absl::StrCat("training job ", label, " started (", *ranks, " rank(s))",
                   caller->empty() ? "" : " for ", *caller),
      {{"job", label}, {"model", model}, {"ranks", *ranks}, {"caller", *caller}, {"pid", *pid}});
  response->set_job_id(id);
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
  if (!job->Cancel()) {
    return Done(context,
                grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                             "training job '" + request->job_id() + "' has already ended"));
  }
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
    std::lock_guard<std::mutex> lock(mu_);
    jobs = jobs_;
  }
  for (auto& job : jobs) {
    if (job->owner() == *caller) *response->add_jobs() = job->Snapshot().first;
  }
  return Done(context, grpc::Status::OK);
}

}  // namespace numaserve::serving
