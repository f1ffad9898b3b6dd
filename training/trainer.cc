#include "training/trainer.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <google/protobuf/util/json_util.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "affinity/cpu_features.h"
#include "base/log.h"
#include "engine/import/onnx_import.h"
#include "kernels/dispatch.h"
#include "kernels/onednn/training_onednn.h"
#include "training/batch_prefetcher.h"
#include "training/checkpoint.h"
#include "training/conv_pool_ops.h"
#include "training/dataset.h"
#include "training/gradient_allreduce.h"
#include "training/onnx_export.h"
#include "training/optimizer.h"
#include "training/record_file.h"
#include "training/timeline.h"
#include "training/training_net.h"

namespace numaserve::training {
namespace {

class ConfigErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit ConfigErrors(std::string path) : path_(std::move(path)) {}
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(path_, ":", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string path_;
  std::string first_;
};

std::string FormatDuration(double seconds) {
  const int64_t s = std::llround(seconds);
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Accuracy of the net on a whole dataset, in batches.
absl::StatusOr<double> Evaluate(TrainingNet& net, const Dataset& data) {
  constexpr int64_t kBatch = 500;
  std::vector<int64_t> indices(kBatch);
  Tensor batch;
  std::vector<uint8_t> labels;
  int64_t correct = 0;
  for (int64_t start = 0; start < data.size; start += kBatch) {
    const int64_t n = std::min(kBatch, data.size - start);
    for (int64_t i = 0; i < n; ++i) indices[i] = start + i;
    GatherBatch(data, indices.data(), n, &batch, &labels);
    absl::StatusOr<const Tensor*> logits = net.Forward(batch, /*training=*/false);
    if (!logits.ok()) return logits.status();
    correct += SoftmaxCrossEntropy(**logits, labels.data(), 0, nullptr).correct;
  }
  return data.size == 0 ? 0.0 : static_cast<double>(correct) / data.size;
}

Checkpoint MakeCheckpoint(int64_t step, TrainingNet& net, Optimizer& optimizer) {
  Checkpoint c;
  c.step = step;
  for (const Parameter& p : net.parameters()) c.tensors.emplace_back(p.name, p.data->data);
  std::vector<std::vector<float>>& state = optimizer.state();
  for (size_t i = 0; i < state.size(); ++i)
    c.tensors.emplace_back(absl::StrCat("optimizer/", i), state[i]);
  return c;
}

absl::Status RestoreCheckpoint(const std::string& path, const Checkpoint& c, TrainingNet& net,
                               Optimizer& optimizer) {
  std::vector<Parameter>& params = net.parameters();
  std::vector<std::vector<float>>& state = optimizer.state();
  if (c.tensors.size() != params.size() + state.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", c.tensors.size(), " tensors, expected ", params.size() + state.size(),
        " (same model and optimizer as the run that wrote it)"));
  }
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    std::vector<float>& dst = i < params.size() ? params[i].data->data : state[i - params.size()];
    const std::string expected =
        i < params.size() ? params[i].name : absl::StrCat("optimizer/", i - params.size());
    if (c.tensors[i].first != expected || c.tensors[i].second.size() != dst.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", i, " is '", c.tensors[i].first, "' with ", c.tensors[i].second.size(),
          " elements, expected '", expected, "' with ", dst.size()));
    }
    dst = c.tensors[i].second;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open training config"));
  std::stringstream text;
  text << file.rdbuf();
  return ParseTrainingConfig(text.str(), path);
}

absl::StatusOr<TrainingConfig> ParseTrainingConfig(const std::string& text,
                                                   const std::string& source) {
  const std::string& path = source;
  TrainingConfig config;
  google::protobuf::TextFormat::Parser parser;
  ConfigErrors errors(path);
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &config)) {
    return absl::InvalidArgumentError(errors.first().empty() ? absl::StrCat(path, ": cannot parse")
                                                             : errors.first());
  }
  auto missing = [&](const char* field) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field '", field, "' is required"));
  };
  if (config.model().empty()) return missing("model");
  if (config.dataset().train_records().empty()) {
    if (config.dataset().train_images().empty())
      return missing("dataset.train_images (or train_records)");
    if (config.dataset().train_labels().empty()) return missing("dataset.train_labels");
  }
  if (config.global_batch_size() <= 0) return missing("global_batch_size (> 0)");
  if (config.learning_rate() <= 0) return missing("learning_rate (> 0)");
  if (config.epochs() <= 0 && config.max_steps() <= 0) return missing("epochs (> 0)");
  if (!config.export_repository().empty() && config.export_model_name().empty()) {
    return missing("export_model_name (with export_repository)");
  }
  if (!config.precision().empty() && config.precision() != "fp32" && config.precision() != "bf16") {
    return absl::InvalidArgumentError(absl::StrCat(path, ": field 'precision' is \"",
                                                   config.precision(),
                                                   "\"; expected \"fp32\" or \"bf16\""));
  }
  return config;
}

namespace {

// What the run is built from: this rank's place in `comm`, the net, the
// data and the step counts. Filled in place by SetUpNet and LoadData and
// never copied or moved: the in-memory source points into train_in_memory.
struct RunSetup {
  RunSetup() = default;
  RunSetup(const RunSetup&) = delete;
  RunSetup& operator=(const RunSetup&) = delete;

  int rank = 0;
  int ranks = 1;
  bool leader = false;
  int64_t global_batch = 0;
  int64_t local_batch = 0;
  bool bf16 = false;
  std::unique_ptr<TrainingNet> net;
  std::optional<Dataset> train_in_memory;
  std::unique_ptr<ExampleSource> train;
  std::optional<Dataset> test;  // rank 0 only
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t epochs = 0;
};

// This rank's place and batch share, the precision check, and the net
// built from the config's ONNX model.
absl::Status SetUpNet(const TrainingConfig& config, MPI_Comm comm, RunSetup* run) {
  MPI_Comm_rank(comm, &run->rank);
  MPI_Comm_size(comm, &run->ranks);
  run->leader = run->rank == 0;
  if (config.global_batch_size() % run->ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat("global_batch_size ", config.global_batch_size(),
                                                   " is not divisible by the ", run->ranks,
                                                   " ranks"));
  }
  run->global_batch = config.global_batch_size();
  run->local_batch = run->global_batch / run->ranks;

  run->bf16 = config.precision() == "bf16";
  if (run->bf16 && !kernels::GetBf16Support().native) {
    return absl::FailedPreconditionError(
        absl::StrCat("training config field 'precision' is \"bf16\", but this process has no "
                     "native BF16 path: ",
                     kernels::GetBf16Support().reason));
  }
  absl::StatusOr<engine::Graph> graph = engine::ImportOnnxModel(config.model());
  if (!graph.ok()) return graph.status();
  absl::StatusOr<std::unique_ptr<TrainingNet>> created = TrainingNet::Create(std::move(*graph));
  if (!created.ok()) return created.status();
  run->net = std::move(*created);
  run->net->set_bf16(run->bf16);
  return absl::OkStatus();
}

// The training set (and on rank 0 the test set), and the step counts the
// training set's size gives.
absl::Status LoadData(const TrainingConfig& config, RunSetup* run) {
  // The training set: a record file is read on demand, each rank only the
  // records of its shard (a step ahead, by the prefetcher); IDX files are
  // small and gzipped, so every rank loads them whole.
  const DatasetConfig& dc = config.dataset();
  if (!dc.train_records().empty()) {
    absl::StatusOr<std::unique_ptr<RecordFileReader>> reader =
        RecordFileReader::Open(dc.train_records(), dc.max_train_examples());
    if (!reader.ok()) return reader.status();
    run->train = std::move(*reader);
  } else {
    absl::StatusOr<Dataset> loaded =
        LoadIdxDataset(dc.train_images(), dc.train_labels(), dc.max_train_examples());
    if (!loaded.ok()) return loaded.status();
    run->train_in_memory = std::move(*loaded);
    run->train = std::make_unique<InMemorySource>(&*run->train_in_memory);
  }
  if (run->leader && (!dc.test_images().empty() || !dc.test_records().empty())) {
    absl::StatusOr<Dataset> t =
        !dc.test_records().empty()
            ? ReadRecordFile(dc.test_records(), dc.max_test_examples())
            : LoadIdxDataset(dc.test_images(), dc.test_labels(), dc.max_test_examples());
    if (!t.ok()) return t.status();
    run->test = std::move(*t);
  }
  const int64_t global_batch = run->global_batch;
  const int64_t steps_per_epoch = run->train->size() / global_batch;
  if (steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the training set has ", run->train->size(),
                                                   " examples, fewer than one global batch of ",
                                                   global_batch));
  }
  int64_t total_steps = std::max(1, config.epochs()) * steps_per_epoch;
  if (config.max_steps() > 0) total_steps = std::min<int64_t>(total_steps, config.max_steps());
  run->steps_per_epoch = steps_per_epoch;
  run->total_steps = total_steps;
  run->epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  return absl::OkStatus();
}

// The optimizer the config names (AdamW, else SGD) and its settings.
OptimizerOptions MakeOptimizerOptions(const TrainingConfig& config) {
  OptimizerOptions oo;
  oo.weight_decay = config.weight_decay();
  if (config.has_adamw()) {
    oo.kind = OptimizerOptions::Kind::kAdamW;
    if (config.adamw().beta1() > 0) oo.beta1 = config.adamw().beta1();
    if (config.adamw().beta2() > 0) oo.beta2 = config.adamw().beta2();
    if (config.adamw().epsilon() > 0) oo.epsilon = config.adamw().epsilon();
  } else {
    oo.momentum = config.sgd().momentum();
    oo.nesterov = config.sgd().nesterov();
  }
  return oo;
}

// The learning-rate schedule in steps (the config gives its spans in epochs).
ScheduleOptions MakeSchedule(const TrainingConfig& config, const RunSetup& run) {
  const int64_t steps_per_epoch = run.steps_per_epoch;
  ScheduleOptions so;
  so.peak_lr = config.learning_rate();
  const ScheduleConfig& sc = config.schedule();
  so.decay = sc.decay() == ScheduleConfig::COSINE ? ScheduleOptions::Decay::kCosine
             : sc.decay() == ScheduleConfig::STEP ? ScheduleOptions::Decay::kStep
                                                  : ScheduleOptions::Decay::kConstant;
  so.warmup_steps = static_cast<int64_t>(sc.warmup_epochs() * steps_per_epoch);
  so.total_steps = run.total_steps;
  so.min_lr = sc.min_learning_rate();
  so.step_every = static_cast<int64_t>(sc.step_epochs() * steps_per_epoch);
  so.gamma = sc.gamma() > 0 ? sc.gamma() : 0.1f;
  return so;
}

// Start: rank 0's weights everywhere, or the checkpoint's (with --resume;
// rank 0 says so). Returns the step to continue from, 0 without --resume.
// The broadcast is a collective: every rank that gets here calls it.
absl::StatusOr<int64_t> ResumeAndBroadcast(const TrainingConfig& config,
                                           const TrainOptions& options, RunSetup& run,
                                           Optimizer& optimizer, MPI_Comm comm) {
  TrainingNet& net = *run.net;
  int64_t step = 0;
  if (options.resume) {
    if (config.checkpoint().empty())
      return absl::InvalidArgumentError("--resume needs 'checkpoint' in the config");
    absl::StatusOr<Checkpoint> c = ReadCheckpoint(config.checkpoint());
    if (!c.ok()) return c.status();
    if (absl::Status s = RestoreCheckpoint(config.checkpoint(), *c, net, optimizer); !s.ok())
      return s;
    step = c->step;
    if (run.leader)
      fprintf(options.progress, "resumed from %s at step %lld\n", config.checkpoint().c_str(),
              static_cast<long long>(step));
  }
  for (Parameter& p : net.parameters()) {
    MPI_Bcast(p.data->data.data(), static_cast<int>(p.data->size()), MPI_FLOAT, 0, comm);
  }
  return step;
}

// Rank 0's first progress lines: the job's shape, and with bf16 what runs
// in BF16.
void PrintStart(const TrainingConfig& config, const TrainOptions& options, const RunSetup& run,
                int num_buckets) {
  fprintf(options.progress,
          "training %s: %lld parameters, %d ranks x %lld images per step, %lld steps/epoch, %lld "
          "epochs, %d all-reduce buckets\n",
          config.model().c_str(), static_cast<long long>(run.net->num_parameter_elements()),
          run.ranks, static_cast<long long>(run.local_batch),
          static_cast<long long>(run.steps_per_epoch), static_cast<long long>(run.epochs),
          num_buckets);
  if (options.reference_ops) {
    fprintf(options.progress,
            "ops: Conv, the pools and the norms on their reference implementations "
            "(--training-reference-ops)\n");
  }
  if (run.bf16) {
    fprintf(options.progress,
            "precision bf16 (%s): convolutions on BF16 copies of their operands with FP32 "
            "accumulation; weights, gradients and the other ops in FP32\n",
            kernels::GetBf16Support().path.c_str());
  }
  fflush(options.progress);
}

// Rank 0's progress report to options.progress: LINE in text (what a user
// at a terminal reads); with the JSON log format one record instead, LINE
// as its message and REPORT as protobuf JSON in its "progress" field (a
// string: records are flat), which the training service reads back. The
// record is this command's output, not a log message: it is written
// whatever the log level, in order with rank 0's other lines.
void WriteProgress(const TrainOptions& options, int rank, const ProgressReport& report,
                   const std::string& line) {
  if (base::CurrentLogOptions().format == base::LogFormat::kJson) {
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;
    std::string json;
    if (google::protobuf::util::MessageToJsonString(report, &json, print).ok()) {
      const base::LogField fields[] = {{"progress", json}, {"rank", rank}};
      const std::string record = base::FormatLogLine(
          base::LogFormat::kJson, absl::Now(), base::LogLevel::kInfo, "training", line, fields);
      fputs(record.c_str(), options.progress);
      fflush(options.progress);
      return;
    }
  }
  fprintf(options.progress, "%s\n", line.c_str());
  fflush(options.progress);
}

// What the training loop's phases share; all of it owned by RunTraining.
struct TrainLoop {
  const TrainingConfig& config;
  const TrainOptions& options;
  MPI_Comm comm;
  const RunSetup& run;
  TrainingNet& net;
  Optimizer& optimizer;
  const ScheduleOptions& schedule;
  GradientAllReduce& allreduce;
  BatchPrefetcher& prefetcher;
  Timeline& timeline;
  int log_every;
  int64_t timeline_steps;
};

// What the loop carries from step to step: the step, the running totals and
// clocks, the buffers every step reuses, and the result so far.
struct LoopState {
  int64_t step = 0;
  int64_t first_step = 0;
  // Loss sum, correct, examples, training FLOPs (this rank).
  double interval_stats[4] = {0, 0, 0, 0};
  double epoch_stats[4] = {0, 0, 0, 0};
  // FP32 peak of the cores all ranks compute on, for the fraction of peak.
  double peak_gflops = 0;
  double run_flops = 0;
  double run_start = 0;
  double interval_start = 0;
  double epoch_start = 0;
  Tensor batch, logits_grad;
  std::vector<uint8_t> labels;
  TrainResult result;
};

// The loop's starting totals: the FP32 peak of all ranks' cores (a
// collective) and the run's clock, from `step` on.
void StartLoop(MPI_Comm comm, bool leader, int64_t step, LoopState* state) {
  state->step = step;
  // FP32 peak of the cores all ranks compute on, for the fraction of peak.
  double threads = omp_get_max_threads(), total_threads = 0;
  MPI_Allreduce(&threads, &total_threads, 1, MPI_DOUBLE, MPI_SUM, comm);
  state->peak_gflops = leader ? kernels::Fp32PeakGflopsPerCore() * total_threads : 0;
  state->run_flops = 0;
  state->run_start = Now();
  state->interval_start = state->run_start;
  state->epoch_start = state->run_start;
  state->first_step = step;
}

// One step on this rank's slice of the global batch: forward, loss,
// backward with the gradient all-reduce, optimizer. Advances state->step,
// adds to the interval's totals and returns the step's learning rate.
absl::StatusOr<float> TrainStep(const TrainLoop& loop, LoopState* state) {
  const RunSetup& run = loop.run;
  TrainingNet& net = loop.net;
  int64_t& step = state->step;
  // The timeline covers the first timeline_steps steps of this invocation.
  Timeline* tl = loop.timeline.enabled() && step - state->first_step < loop.timeline_steps
                     ? &loop.timeline
                     : nullptr;
  loop.allreduce.set_timeline(tl);
  double t0 = tl != nullptr ? tl->Now() : 0;
  auto span = [&](const char* name) {
    if (tl == nullptr) return;
    const double t1 = tl->Now();
    tl->Add(name, 0, t0, t1);
    t0 = t1;
  };
  if (absl::Status s = loop.prefetcher.Get(step, &state->batch, &state->labels); !s.ok()) return s;
  span("wait for batch");
  net.SetDropoutContext(loop.config.seed(), step, run.rank * run.local_batch);
  absl::StatusOr<const Tensor*> logits = net.Forward(state->batch);
  if (!logits.ok()) return logits.status();
  const LossResult loss = SoftmaxCrossEntropy(**logits, state->labels.data(),
                                              1.0f / run.global_batch, &state->logits_grad);
  span("forward + loss");
  if (absl::Status s =
          net.Backward(state->logits_grad, [&](int p) { loop.allreduce.OnGradientReady(p); });
      !s.ok())
    return s;
  span("backward");
  loop.allreduce.Finish();
  span("wait for all-reduce");
  ++step;
  const float lr = LearningRate(loop.schedule, step - 1);
  std::vector<Parameter>& params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].trainable) {
      loop.optimizer.Update(static_cast<int>(i), step, lr, params[i].data, *params[i].grad);
    }
  span("optimizer");

  double* interval_stats = state->interval_stats;
  interval_stats[0] += loss.loss_sum;
  interval_stats[1] += loss.correct;
  interval_stats[2] += run.local_batch;
  // Backward is two products per forward one (data and weight gradients).
  interval_stats[3] += 3 * net.last_forward_flops();
  return lr;
}

// The end of a log interval: sums the interval's totals over the ranks (a
// collective) into the epoch's; rank 0 prints the progress line.
void ReportInterval(const TrainLoop& loop, int64_t epoch, float lr, LoopState* state) {
  const RunSetup& run = loop.run;
  const bool leader = run.leader;
  const int64_t step = state->step;
  double* interval_stats = state->interval_stats;
  double sums[4];
  MPI_Reduce(interval_stats, sums, 4, MPI_DOUBLE, MPI_SUM, 0, loop.comm);
  for (int i = 0; i < 4; ++i) state->epoch_stats[i] += leader ? sums[i] : 0;
  state->run_flops += leader ? sums[3] : 0;
  if (leader) {
    const double now = Now();
    const double rate = sums[2] / std::max(1e-9, now - state->interval_start);
    const double eta = (run.total_steps - step) * run.global_batch / std::max(1e-9, rate);
    state->result.final_loss = sums[0] / sums[2];
    ProgressReport report;
    report.set_kind(ProgressReport::INTERVAL);
    report.set_epoch(epoch + 1);
    report.set_epochs(run.epochs);
    report.set_step(step);
    report.set_total_steps(run.total_steps);
    report.set_loss(sums[0] / sums[2]);
    report.set_accuracy(sums[1] / sums[2]);
    report.set_learning_rate(lr);
    report.set_images_per_second(rate);
    report.set_eta_seconds(eta);
    report.set_test_accuracy(-1);
    WriteProgress(
        loop.options, run.rank, report,
        absl::StrFormat("epoch %d/%d step %d/%d loss %.4f acc %.2f%% lr %.5f %.0f images/s eta %s",
                        epoch + 1, run.epochs, step, run.total_steps, sums[0] / sums[2],
                        100.0 * sums[1] / sums[2], lr, rate, FormatDuration(eta)));
    state->interval_start = now;
  }
  interval_stats[0] = interval_stats[1] = interval_stats[2] = interval_stats[3] = 0;
}

// Rank 0 writes the checkpoint of `step`, when the config names one.
absl::Status WriteRunCheckpoint(const TrainLoop& loop, int64_t step) {
  if (!loop.run.leader || loop.config.checkpoint().empty()) return absl::OkStatus();
  return WriteCheckpoint(loop.config.checkpoint(), MakeCheckpoint(step, loop.net, loop.optimizer));
}

// Rank 0 at an epoch's end: the test-set accuracy (with a test set) and the
// epoch's summary line; then the epoch's totals and clocks start over.
absl::Status FinishEpoch(const TrainLoop& loop, int64_t epoch, LoopState* state) {
  const double now = Now();
  std::string test_text;
  if (loop.run.test.has_value()) {
    absl::StatusOr<double> acc = Evaluate(loop.net, *loop.run.test);
    if (!acc.ok()) return acc.status();
    state->result.test_accuracy = *acc;
    test_text = absl::StrFormat(" test acc %.2f%%", 100.0 * *acc);
  }
  double* epoch_stats = state->epoch_stats;
  const double peak_gflops = state->peak_gflops;
  const double seconds = std::max(1e-9, now - state->epoch_start);
  const double gflops = epoch_stats[3] / seconds / 1e9;
  ProgressReport report;
  report.set_kind(ProgressReport::EPOCH_END);
  report.set_epoch(epoch + 1);
  report.set_epochs(loop.run.epochs);
  report.set_step(state->step);
  report.set_total_steps(loop.run.total_steps);
  report.set_loss(epoch_stats[0] / std::max(1.0, epoch_stats[2]));
  report.set_accuracy(epoch_stats[1] / std::max(1.0, epoch_stats[2]));
  report.set_images_per_second(epoch_stats[2] / seconds);
  report.set_test_accuracy(state->result.test_accuracy);
  WriteProgress(
      loop.options, loop.run.rank, report,
      absl::StrFormat("epoch %d done: loss %.4f train acc %.2f%%%s %.1f s %.0f images/s %.1f "
                      "GFLOP/s (%.1f%% of FP32 peak)",
                      epoch + 1, epoch_stats[0] / std::max(1.0, epoch_stats[2]),
                      100.0 * epoch_stats[1] / std::max(1.0, epoch_stats[2]), test_text, seconds,
                      epoch_stats[2] / seconds, gflops,
                      peak_gflops > 0 ? 100.0 * gflops / peak_gflops : 0.0));
  epoch_stats[0] = epoch_stats[1] = epoch_stats[2] = epoch_stats[3] = 0;
  state->epoch_start = Now();
  state->interval_start = state->epoch_start;
  return absl::OkStatus();
}

// The steps from state->step to the last, or until any rank is asked to
// stop (then result.stopped is set). Every rank makes the same collective
// calls in the same order; rank 0 alone evaluates and writes.
absl::Status TrainSteps(const TrainLoop& loop, LoopState* state) {
  const TrainingConfig& config = loop.config;
  const RunSetup& run = loop.run;
  while (state->step < run.total_steps) {
    if (loop.options.stop != nullptr) {
      // One int all-reduce a step (microseconds): every rank stops at the
      // same step even when the signal reached them at different times.
      int local = loop.options.stop->load() ? 1 : 0, any = 0;
      MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, loop.comm);
      if (any != 0) {
        state->result.stopped = true;
        break;
      }
    }
    const int64_t epoch = state->step / run.steps_per_epoch;
    absl::StatusOr<float> lr = TrainStep(loop, state);
    if (!lr.ok()) return lr.status();
    const int64_t step = state->step;
    const bool epoch_end = step % run.steps_per_epoch == 0 || step == run.total_steps;
    if (step % loop.log_every == 0 || epoch_end) ReportInterval(loop, epoch, *lr, state);
    if (config.checkpoint_every_steps() > 0 && step % config.checkpoint_every_steps() == 0 &&
        step < run.total_steps) {
      if (absl::Status s = WriteRunCheckpoint(loop, step); !s.ok()) return s;
    }
    if (epoch_end && run.leader) {
      if (absl::Status s = FinishEpoch(loop, epoch, state); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// Rank 0's report of how the run ended (STOPPED or EXPORTED) at `step`.
ProgressReport EndReport(const TrainLoop& loop, ProgressReport::Kind kind, int64_t step,
                         const std::string& export_path) {
  ProgressReport report;
  report.set_kind(kind);
  report.set_epoch(std::clamp<int64_t>(
      (step + loop.run.steps_per_epoch - 1) / loop.run.steps_per_epoch, 1, loop.run.epochs));
  report.set_epochs(loop.run.epochs);
  report.set_step(step);
  report.set_total_steps(loop.run.total_steps);
  report.set_test_accuracy(-1);
  report.set_export_path(export_path);
  return report;
}

// Rank 0 after the last step: the final weights and the ONNX export, each
// when the config asks for it.
absl::Status SaveFinalModel(const TrainLoop& loop, int64_t step, TrainResult* result) {
  const TrainingConfig& config = loop.config;
  const bool leader = loop.run.leader;
  std::vector<Parameter>& params = loop.net.parameters();
  if (leader && !config.final_weights().empty()) {
    Checkpoint c;
    c.step = step;
    for (const Parameter& p : params) c.tensors.emplace_back(p.name, p.data->data);
    if (absl::Status s = WriteCheckpoint(config.final_weights(), c); !s.ok()) return s;
  }
  if (leader && !config.export_repository().empty()) {
    absl::StatusOr<std::string> path = NextVersionPath(
        config.export_repository(), config.export_model_name(), loop.options.export_owner);
    if (!path.ok()) return path.status();
    std::vector<NamedWeights> weights;
    for (const Parameter& p : params) weights.push_back({p.name, &p.data->data});
    if (absl::Status s = ExportOnnx(config.model(), weights, *path); !s.ok()) return s;
    result->exported_model = *path;
    WriteProgress(loop.options, loop.run.rank,
                  EndReport(loop, ProgressReport::EXPORTED, step, *path),
                  absl::StrCat("exported ", *path));
  }
  return absl::OkStatus();
}

// After the loop: the timeline (a collective), rank 0's bf16 line, the
// run's totals and the checkpoint; then the stop line, or the final
// weights and the export.
absl::StatusOr<TrainResult> FinishRun(const TrainLoop& loop, LoopState* state) {
  const TrainingConfig& config = loop.config;
  const TrainOptions& options = loop.options;
  const RunSetup& run = loop.run;
  const bool leader = run.leader;
  const int64_t step = state->step;
  TrainResult& result = state->result;
  if (loop.timeline.enabled()) {
    if (absl::Status s = loop.timeline.Write(config.timeline(), loop.comm); !s.ok()) return s;
    if (leader) fprintf(options.progress, "timeline %s\n", config.timeline().c_str());
  }
  if (run.bf16 && leader) {
    const kernels::training_onednn::Bf16ConvPrimitives counts =
        kernels::training_onednn::Bf16ConvPrimitiveCounts();
    fprintf(options.progress, "bf16: %lld convolution primitives in BF16, %lld in FP32%s\n",
            static_cast<long long>(counts.bf16), static_cast<long long>(counts.fp32_instead),
            counts.fp32_instead > 0 ? " (oneDNN has only a reference BF16 kernel for them)" : "");
  }
  result.steps = step;
  const double run_seconds = std::max(1e-9, Now() - state->run_start);
  result.images_per_second = (step - state->first_step) * run.global_batch / run_seconds;
  result.gflops = state->run_flops / run_seconds / 1e9;
  result.peak_fraction = state->peak_gflops > 0 ? result.gflops / state->peak_gflops : 0;
  if (absl::Status s = WriteRunCheckpoint(loop, step); !s.ok()) return s;
  if (result.stopped) {
    if (leader) {
      WriteProgress(options, run.rank, EndReport(loop, ProgressReport::STOPPED, step, ""),
                    absl::StrCat("stopped at step ", step, " of ", run.total_steps,
                                 config.checkpoint().empty()
                                     ? " (no checkpoint in the config)"
                                     : absl::StrCat(": checkpoint ", config.checkpoint(),
                                                    " (--resume continues)")));
    }
    return result;
  }
  if (absl::Status s = SaveFinalModel(loop, step, &result); !s.ok()) return s;
  return result;
}

}  // namespace

absl::StatusOr<TrainResult> RunTraining(const TrainingConfig& config, const TrainOptions& options,
                                        MPI_Comm comm) {
  if (options.reference_ops) conv_pool::SetImplementation(conv_pool::Implementation::kReference);
  RunSetup run;
  if (absl::Status s = SetUpNet(config, comm, &run); !s.ok()) return s;
  if (absl::Status s = LoadData(config, &run); !s.ok()) return s;
  TrainingNet& net = *run.net;
  std::vector<Parameter>& params = net.parameters();

  const OptimizerOptions oo = MakeOptimizerOptions(config);
  std::vector<int64_t> sizes;
  for (const Parameter& p : params) sizes.push_back(p.data->size());
  Optimizer optimizer(oo, sizes);
  const ScheduleOptions so = MakeSchedule(config, run);

  absl::StatusOr<int64_t> first_step = ResumeAndBroadcast(config, options, run, optimizer, comm);
  if (!first_step.ok()) return first_step.status();

  const int64_t fusion =
      config.fusion_threshold_bytes() > 0 ? config.fusion_threshold_bytes() : (4 << 20);
  GradientAllReduce allreduce(comm, &params, fusion);
  const int log_every = config.log_every_steps() > 0 ? config.log_every_steps() : 50;
  if (run.leader) PrintStart(config, options, run, allreduce.num_buckets());

  BatchPrefetcher prefetcher(run.train.get(), {.seed = config.seed(),
                                               .global_batch = run.global_batch,
                                               .rank = run.rank,
                                               .ranks = run.ranks,
                                               .total_steps = run.total_steps});
  LoopState state;
  StartLoop(comm, run.leader, *first_step, &state);
  Timeline timeline(!config.timeline().empty());
  const TrainLoop loop{
      .config = config,
      .options = options,
      .comm = comm,
      .run = run,
      .net = net,
      .optimizer = optimizer,
      .schedule = so,
      .allreduce = allreduce,
      .prefetcher = prefetcher,
      .timeline = timeline,
      .log_every = log_every,
      .timeline_steps = config.timeline_steps() > 0 ? config.timeline_steps() : 20};
  if (absl::Status s = TrainSteps(loop, &state); !s.ok()) return s;
  return FinishRun(loop, &state);
}

}  // namespace numaserve::training
