#include "tools/numaserve/train_command.h"

#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "affinity/pinning.h"
#include "base/args.h"
#include "base/errno_text.h"
#include "base/log.h"
#include "training/onnx_export.h"
#include "training/rank_binding.h"
#include "training/trainer.h"

namespace numaserve::cli {

using base::Log;
using base::LogLevel;

namespace {

// The process settings `train` takes and hands to every rank.
constexpr unsigned kTrainSettings =
    serving::kKernelFlags | serving::kTrainingFlags | serving::kPlacementFlags;

// The command failed: its reason as a usage error in text (what a user at
// a terminal reads), else an error record, then exit code 1.
int Fail(const std::string& message) {
  if (base::CurrentLogOptions().format == base::LogFormat::kText) {
    fprintf(stderr, "numaserve train: %s\n", message.c_str());
  } else {
    Log(LogLevel::kError, "training", message);
  }
  return 1;
}

int EnvInt(const char* name, int default_value) {
  const char* v = getenv(name);
  int out = default_value;
  if (v == nullptr || !absl::SimpleAtoi(v, &out)) return default_value;
  return out;
}

// SIGUSR1 (mpirun forwards it to every rank) and SIGTERM (mpirun sends it
// when it is told to stop, then SIGKILL a second later) ask the rank to stop
// after the step in flight, with a checkpoint. Both are blocked in every
// thread of the rank (the mask is set before MPI and OpenMP start theirs,
// which inherit it), and one thread takes them with sigwait: a handler
// runs on whichever thread the kernel picks, a oneDNN kernel's or an MPI
// progress thread's; with one, 2 of 120 stops of a 2-rank job aborted a
// rank with a corrupted heap inside dnnl_sgemm, and none of 350 without.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGUSR1);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    waiter_ = std::thread([this] {
      for (;;) {
        int signal_number = 0;
        if (sigwait(&set_, &signal_number) != 0) continue;
        if (done_.load()) return;
        stop_.store(true);
      }
    });
  }
  ~StopSignals() {
    done_.store(true);
    pthread_kill(waiter_.native_handle(), SIGUSR1);
    waiter_.join();
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  const std::atomic<bool>* flag() const { return &stop_; }

 private:
  sigset_t set_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::thread waiter_;
};

// One rank of the job (under mpirun, or alone as an MPI singleton).
int RunRank(const std::string& config_path, bool resume, const serving::ProcessOptions& process,
            const std::string& export_owner) {
  StopSignals stop_signals;  // before any other thread starts
  // Bind before MPI and OpenMP start threads, like an inference worker.
  const int local_rank = EnvInt("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  const int local_size = EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  // --membind was checked with the other settings (CheckOwnerAndApply).
  const affinity::MemoryPolicy policy =
      affinity::ParseMemoryPolicy(process.membind).value_or(affinity::MemoryPolicy::kPrefer);
  absl::StatusOr<training::RankBinding> binding =
      training::BindRank(local_rank, local_size, policy);
  if (!binding.ok()) return Fail(std::string(binding.status().message()));
  absl::StatusOr<training::TrainingConfig> config = training::LoadTrainingConfig(config_path);
  if (!config.ok()) return Fail(std::string(config.status().message()));

  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Every record of this rank (the kernels' too) says which rank it is.
  base::SetLogContext({{"rank", rank}});
  Log(LogLevel::kInfo, "training", binding->description,
      {{"local_rank", local_rank}, {"threads", binding->num_threads}});
  training::TrainOptions options;
  options.resume = resume;
  options.stop = stop_signals.flag();
  options.reference_ops = process.training_reference_ops;
  options.export_owner = export_owner;
  absl::StatusOr<training::TrainResult> result =
      training::RunTraining(*config, options, MPI_COMM_WORLD);
  if (!result.ok()) {
    Log(LogLevel::kError, "training",
        absl::StrCat("training rank ", rank, " failed: ", result.status().message()),
        {{"error", result.status().message()}});
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
  if (rank == 0 && !result->stopped) {
    printf("done: %lld steps, %.0f images/s, %.1f GFLOP/s (%.1f%% of FP32 peak)",
           static_cast<long long>(result->steps), result->images_per_second, result->gflops,
           100.0 * result->peak_fraction);
    if (result->test_accuracy >= 0) printf(", test accuracy %.2f%%", 100.0 * result->test_accuracy);
    printf("\n");
    fflush(stdout);
  }
  MPI_Finalize();
  return 0;
}

// --ranks: a number, or for auto one per NUMA domain here, or 0 (one per
// NUMA domain of every host, which mpirun maps) with a hostfile.
absl::StatusOr<int> RankCount(const std::string& ranks_text, const std::string& hostfile) {
  if (ranks_text == "auto" && !hostfile.empty()) return 0;
  if (ranks_text == "auto") return training::AutoRankCount();
  int ranks = 0;
  if (!absl::SimpleAtoi(ranks_text, &ranks) || ranks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks: expected auto or a positive number, got '", ranks_text, "'"));
  }
  return ranks;
}

// --export-owner (when given) must be a valid owner id; the process
// settings are applied to this process (the launcher and each rank).
absl::Status CheckOwnerAndApply(const std::string& export_owner,
                                const serving::ProcessOptions& process) {
  if (!export_owner.empty()) {
    if (absl::Status s = training::CheckExportOwnerName(export_owner); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--export-owner: ", s.message()));
    }
  }
  return serving::ApplyProcessOptions(process);
}

}  // namespace

std::vector<std::string> MpirunCommand(const MpirunOptions& o,
                                       const std::vector<std::string>& train_args) {
  std::vector<std::string> argv = {o.mpirun};
  if (!o.hostfile.empty()) argv.insert(argv.end(), {"--hostfile", o.hostfile});
  if (o.ranks > 0) {
    argv.insert(argv.end(), {"-np", std::to_string(o.ranks)});
    // More ranks than NUMA domains on one machine (tests) must be allowed.
    if (o.hostfile.empty()) argv.push_back("--oversubscribe");
  } else {
    // One rank per NUMA domain of every host in the hostfile.
    argv.insert(argv.end(), {"--map-by", "ppr:1:numa"});
  }
  // Open MPI refuses root unless told; CI and containers run as root.
  if (geteuid() == 0) argv.push_back("--allow-run-as-root");
  // Each rank binds itself to its domain's share of the plan
  // (rank_binding.h), so mpirun must not bind.
  argv.insert(argv.end(), {"--bind-to", "none"});
  argv.push_back(o.self);
  argv.push_back("train");
  argv.insert(argv.end(), train_args.begin(), train_args.end());
  argv.insert(argv.end(), {"--log-format", base::LogFormatName(o.log.format), "--log-level",
                           base::LogLevelName(o.log.level)});
  const std::vector<std::string> process = serving::ProcessFlags(o.process, kTrainSettings);
  argv.insert(argv.end(), process.begin(), process.end());
  return argv;
}

int TrainCommand(const std::vector<std::string>& args, const serving::ProcessOptions& defaults) {
  serving::ProcessOptions process = defaults;
  std::string config_path, ranks_text = "auto", mpirun = "mpirun", hostfile;
  std::string log_format = "text", log_level = "info", export_owner;
  bool resume = false, dry_run = false;
  base::ArgParser parser(
      "train",
      "Train a model data-parallel on MPI, one rank per NUMA domain, and export it to a model "
      "repository.");
  parser.AddString("config", &config_path,
                   "training configuration (TrainingConfig in protobuf text format)");
  parser.AddString("ranks", &ranks_text,
                   "auto (one per NUMA domain) or a number of ranks on this machine");
  parser.AddBool("resume", &resume,
                 "continue from the config's checkpoint with the same data order");
  parser.AddString("mpirun", &mpirun, "the mpirun to launch ranks with");
  parser.AddString("hostfile", &hostfile,
                   "an Open MPI hostfile: run on those hosts (with --ranks auto, one rank per "
                   "NUMA domain of each)");
  parser.AddBool("dry-run", &dry_run, "print the mpirun command instead of running it");
  parser.AddString("export-owner", &export_owner,
                   "export only into model directories this owner made (a .numaserve-owner "
                   "file names it); the training service passes its caller's id");
  parser.AddString("log-format", &log_format,
                   "text (\"numaserve: ...\" lines) | json (one object a line: ts, level, "
                   "component, msg and fields); the ranks get the same");
  parser.AddString("log-level", &log_level,
                   "least level logged: debug | info | warning | error; the ranks get the same");
  serving::AddProcessFlags(parser, process, kTrainSettings);
  const absl::Status parsed = parser.Parse(args);
  // Even a parse error is reported in the format asked for, if it was read.
  absl::StatusOr<base::LogOptions> log_options = base::LogOptionsFromFlags(log_format, log_level);
  if (!log_options.ok()) return Fail(std::string(log_options.status().message()));
  base::ConfigureLog(*log_options);
  if (!parsed.ok()) return Fail(std::string(parsed.message()));
  if (parser.help_requested()) {
    printf("%s", parser.Usage().c_str());
    return 0;
  }
  if (config_path.empty()) return Fail("--config FILE is required");
  // Checked in the launcher too, before anything is launched.
  if (absl::Status s = CheckOwnerAndApply(export_owner, process); !s.ok()) {
    return Fail(std::string(s.message()));
  }
  // Under mpirun (or a multi-node launch): this process is one rank.
  if (getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    return RunRank(config_path, resume, process, export_owner);
  }
  const absl::StatusOr<int> ranks = RankCount(ranks_text, hostfile);
  if (!ranks.ok()) return Fail(std::string(ranks.status().message()));
  // Check the config before launching anything.
  if (absl::StatusOr<training::TrainingConfig> c = training::LoadTrainingConfig(config_path);
      !c.ok()) {
    return Fail(std::string(c.status().message()));
  }
  std::vector<std::string> train_args = {"--config", config_path};
  if (resume) train_args.push_back("--resume");
  if (!export_owner.empty()) train_args.insert(train_args.end(), {"--export-owner", export_owner});
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return Fail(absl::StrCat("cannot find this executable: ", base::ErrnoText(errno)));
  self[len] = '\0';
  const std::vector<std::string> command = MpirunCommand({.mpirun = mpirun,
                                                          .self = self,
                                                          .ranks = *ranks,
                                                          .hostfile = hostfile,
                                                          .log = *log_options,
                                                          .process = process},
                                                         train_args);
  if (dry_run) {
    printf("%s\n", absl::StrJoin(command, " ").c_str());
    return 0;
  }
  Log(LogLevel::kInfo, "training", absl::StrCat("running ", absl::StrJoin(command, " ")),
      {{"ranks", *ranks}, {"hostfile", hostfile}});
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  return Fail(absl::StrCat("cannot run ", mpirun, ": ", base::ErrnoText(errno)));
}

}  // namespace numaserve::cli
