#include "serving/frontend/training_job.h"

#include <fcntl.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/wrappers.pb.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/errno_text.h"
#include "base/mutex.h"
#include "serving/observability/metrics.h"

namespace numaserve::serving {

using base::Log;
using base::LogLevel;
using training::TrainingProgress;

namespace {

// The longest line of a job's output the server keeps (a progress record
// is a few hundred bytes).
constexpr size_t kMaxOutputLine = 64 << 10;

}  // namespace

absl::StatusOr<std::unique_ptr<PrivateDir>> PrivateDir::Create(const std::string& parent,
                                                               const std::string& config) {
  std::string dir = absl::StrCat(parent, "/numaserve-training-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::InternalError(
        absl::StrCat("cannot make a private directory in ", parent, ": ", base::ErrnoText(errno)));
  }
  std::unique_ptr<PrivateDir> made(new PrivateDir(dir));
  const int fd =
      open(made->config_path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
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

void PrivateDir::Remove() {
  base::MutexLock lock(&mu_);
  if (removed_) return;
  removed_ = true;
  unlink(config_path().c_str());
  rmdir(dir_.c_str());
}

TrainingJob::TrainingJob(std::string id, std::string label, std::string owner, std::string model,
                         pid_t pid, std::unique_ptr<PrivateDir> files, Metrics* metrics,
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
}

absl::Status TrainingJob::Start(int output_fd) {
  if (metrics_ != nullptr) metrics_->SetTrainingState(label_, model_, "running");
  std::string why;
  {
    base::MutexLock lock(&join_mu_);
    try {
      reader_ = std::thread([this, output_fd] { ReadOutput(output_fd); });
      return absl::OkStatus();
    } catch (const std::system_error& e) {
      why = e.what();
    }
  }
  // No thread to read the output and wait for the process: it does not run.
  kill(-pid_, SIGKILL);
  close(output_fd);
  while (waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  files_->Remove();
  const std::string message =
      absl::StrCat("cannot start a thread for training job ", label_, ": ", why);
  {
    base::MutexLock lock(&mu_);
    exited_ = true;
    exited_cv_.SignalAll();
    progress_.set_state(TrainingProgress::FAILED);
    progress_.set_message(message);
    ++version_;
  }
  if (metrics_ != nullptr) metrics_->SetTrainingState(label_, model_, "failed");
  Log(LogLevel::kError, "training", message, {{"job", label_}, {"error", why}});
  return absl::ResourceExhaustedError(message);
}

TrainingJob::~TrainingJob() { JoinThreads(); }

void TrainingJob::JoinThreads() {
  base::MutexLock join_lock(&join_mu_);
  if (reader_.joinable()) {
    // The reader may drop the last reference to its own job (a watcher's
    // end): it is then on its way out.
    if (reader_.get_id() == std::this_thread::get_id()) {
      reader_.detach();
    } else {
      reader_.join();
    }
  }
  std::thread stopper;
  {
    base::MutexLock lock(&mu_);
    stopper = std::move(stopper_);
  }
  if (stopper.joinable()) stopper.join();
}

void TrainingJob::RemoveMetrics() {
  if (metrics_ != nullptr) metrics_->RemoveTrainingJob(label_, model_);
}

std::pair<TrainingProgress, int64_t> TrainingJob::Snapshot() {
  base::MutexLock lock(&mu_);
  return {progress_, version_};
}

bool TrainingJob::finished() {
  base::MutexLock lock(&mu_);
  return progress_.state() != TrainingProgress::RUNNING;
}

absl::Status TrainingJob::Cancel() {
  base::MutexLock lock(&mu_);
  if (progress_.state() != TrainingProgress::RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("training job ", label_, " has already ended"));
  }
  if (cancelled_) return absl::OkStatus();
  try {
    stopper_ = std::thread([this] { Escalate(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("cannot start a thread to stop training job ",
                                                     label_, ": ", e.what(), "; try again"));
  }
  cancelled_ = true;
  kill(-pid_, SIGUSR1);
  return absl::OkStatus();
}

void TrainingJob::Terminate() {
  base::MutexLock lock(&mu_);
  if (exited_) return;
  cancelled_ = true;
  kill(-pid_, SIGTERM);
}

void TrainingJob::AddSink(std::shared_ptr<WatchSink> sink) {
  base::MutexLock lock(&sinks_mu_);
  sinks_.push_back(std::move(sink));
}

void TrainingJob::RemoveSink(const WatchSink* sink) {
  base::MutexLock lock(&sinks_mu_);
  std::erase_if(sinks_, [&](const auto& s) { return s.get() == sink; });
}

bool TrainingJob::WaitForExit(std::chrono::milliseconds timeout) {
  // Timed on the steady clock; a wakeup before the end waits out the rest.
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!exited_) {
    if (std::chrono::steady_clock::now() >= until) return false;
    exited_cv_.WaitUntil(&mu_, until);
  }
  return true;
}

void TrainingJob::Escalate() {
  base::MutexLock lock(&mu_);
  if (WaitForExit(stop_grace_)) return;
  Log(LogLevel::kWarning, "training",
      absl::StrFormat("training job %s still running %.0f s after SIGUSR1: SIGTERM", label_,
                      stop_grace_.count() / 1000.0),
      {{"job", label_}, {"signal", "SIGTERM"}});
  kill(-pid_, SIGTERM);
  if (WaitForExit(std::chrono::seconds(5))) return;
  Log(LogLevel::kWarning, "training",
      absl::StrCat("training job ", label_, " still running 5 s after SIGTERM: SIGKILL"),
      {{"job", label_}, {"signal", "SIGKILL"}});
  kill(-pid_, SIGKILL);
}

absl::StatusOr<training::ProgressReport> TrainingJob::ReadProgressReport(
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
  if (!training::ProgressReport::Kind_IsValid(report.kind())) {
    return absl::InvalidArgumentError(absl::StrCat("unknown kind ", report.kind()));
  }
  if (report.kind() == training::ProgressReport::EXPORTED && report.export_path().empty()) {
    return absl::InvalidArgumentError("an export without its path");
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

void TrainingJob::ExportFigures() {
  if (metrics_ == nullptr) return;
  Metrics::TrainingFigures f;
  f.epoch = progress_.epoch();
  f.step = progress_.step();
  f.total_steps = progress_.total_steps();
  f.loss = progress_.loss();
  f.accuracy = progress_.accuracy();
  f.images_per_second = progress_.images_per_second();
  f.eta_seconds = progress_.eta_seconds();
  f.test_accuracy = progress_.test_accuracy();
  metrics_->SetTrainingProgress(label_, model_, f);
}

void TrainingJob::ParseLine(const std::string& line) {
  if (absl::StatusOr<base::LogRecord> record = base::ParseLogLine(line); record.ok()) {
    if (const base::LogField* report = ProgressField(*record); report != nullptr) {
      ReadProgress(record->message, report->json());
    } else {
      ForwardRecord(*record);
    }
    return;
  }
  // Rank 0's other lines (the job's shape, "done: ..."), mpirun's own:
  // logged, not progress. The rules of mpirun's message blocks are left out.
  if (line.find_first_not_of("- \t") != std::string::npos) {
    Log(LogLevel::kInfo, "training", absl::StrCat("training job ", label_, ": ", line),
        {{"job", label_}});
  }
}

const base::LogField* TrainingJob::ProgressField(const base::LogRecord& record) {
  if (record.component != "training") return nullptr;
  for (const base::LogField& f : record.fields) {
    if (f.key() == "progress") return &f;
  }
  return nullptr;
}

void TrainingJob::ReadProgress(const std::string& line, const std::string& field_json) {
  absl::StatusOr<training::ProgressReport> report = ReadProgressReport(field_json);
  if (!report.ok()) {
    Log(LogLevel::kDebug, "training",
        absl::StrCat("training job ", label_,
                     ": progress record ignored: ", report.status().message()),
        {{"job", label_}});
    return;
  }
  const std::string message = absl::StrCat("training job ", label_, ": ", line);
  base::MutexLock lock(&mu_);
  if (report->kind() == training::ProgressReport::INTERVAL) {
    progress_.set_epoch(report->epoch());
    progress_.set_epochs(report->epochs());
    progress_.set_step(report->step());
    progress_.set_total_steps(report->total_steps());
    progress_.set_loss(report->loss());
    progress_.set_accuracy(report->accuracy());
    progress_.set_learning_rate(report->learning_rate());
    progress_.set_images_per_second(report->images_per_second());
    progress_.set_eta_seconds(report->eta_seconds());
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
         {"eta_seconds", report->eta_seconds()}});
  } else if (report->kind() == training::ProgressReport::STOPPED) {
    progress_.set_step(report->step());
    progress_.set_total_steps(report->total_steps());
    stop_line_ = line;
    ExportFigures();
    Log(LogLevel::kInfo, "training", message,
        {{"job", label_}, {"step", report->step()}, {"total_steps", report->total_steps()}});
  } else if (report->kind() == training::ProgressReport::EXPORTED) {
    progress_.set_message(line);
    Log(LogLevel::kInfo, "training", message, {{"job", label_}, {"path", report->export_path()}});
  } else if (report->test_accuracy() >= 0) {
    progress_.set_test_accuracy(report->test_accuracy());
    ExportFigures();
    Log(LogLevel::kInfo, "training", message,
        {{"job", label_}, {"epoch", report->epoch()}, {"test_accuracy", report->test_accuracy()}});
  } else {
    // An epoch's summary without a test set: logged, not progress.
    Log(LogLevel::kInfo, "training", message, {{"job", label_}});
    return;
  }
  progress_.set_line(line);
  ++version_;
}

void TrainingJob::ForwardRecord(const base::LogRecord& record) {
  std::vector<base::LogField> fields = {{"job", label_}};
  for (const base::LogField& f : record.fields) {
    if (f.key() != "job") fields.push_back(f);
  }
  Log(record.level, record.component, absl::StrCat("training job ", label_, ": ", record.message),
      fields);
  if (record.level != LogLevel::kError) return;
  base::MutexLock lock(&mu_);
  last_error_ = record.message;
  progress_.set_line(record.message);
  ++version_;
}

bool TrainingJob::ReadBoundedLine(FILE* in, std::string* line) {
  line->clear();
  bool any = false;
  for (int c = getc(in); c != EOF; c = getc(in)) {
    any = true;
    if (c == '\n') return true;
    if (line->size() < kMaxOutputLine) line->push_back(static_cast<char>(c));
  }
  return any;
}

void TrainingJob::ReadOutput(int fd) {
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
    base::MutexLock lock(&mu_);
    exited_ = true;
    exited_cv_.SignalAll();
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

}  // namespace numaserve::serving
