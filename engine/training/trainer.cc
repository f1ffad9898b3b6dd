#include "engine/training/trainer.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "affinity/cpu_features.h"
#include "engine/onnx_import.h"
#include "engine/training/batch_prefetcher.h"
#include "engine/training/checkpoint.h"
#include "engine/training/dataset.h"
#include "engine/training/gradient_allreduce.h"
#include "engine/training/onednn_training_ops.h"
#include "engine/training/onnx_export.h"
#include "engine/training/optimizer.h"
#include "engine/training/record_file.h"
#include "engine/training/timeline.h"
#include "engine/training/training_net.h"
#include "kernels/dispatch.h"

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

absl::StatusOr<TrainResult> RunTraining(const TrainingConfig& config, const TrainOptions& options,
                                        MPI_Comm comm) {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  const bool leader = rank == 0;
  if (config.global_batch_size() % ranks != 0) {
    return absl::InvalidArgumentError(absl::StrCat("global_batch_size ", config.global_batch_size(),
                                                   " is not divisible by the ", ranks, " ranks"));
  }
  const int64_t global_batch = config.global_batch_size();
  const int64_t local_batch = global_batch / ranks;

  const bool bf16 = config.precision() == "bf16";
  if (bf16 && !kernels::GetBf16Support().native) {
    return absl::FailedPreconditionError(
        absl::StrCat("training config field 'precision' is \"bf16\", but this process has no "
                     "native BF16 path: ",
                     kernels::GetBf16Support().reason));
  }
  absl::StatusOr<engine::Graph> graph = engine::ImportOnnxModel(config.model());
  if (!graph.ok()) return graph.status();
  absl::StatusOr<std::unique_ptr<TrainingNet>> created = TrainingNet::Create(std::move(*graph));
  if (!created.ok()) return created.status();
  TrainingNet& net = **created;
  net.set_bf16(bf16);
  std::vector<Parameter>& params = net.parameters();

  // The training set: a record file is read on demand, each rank only the
  // records of its shard (a step ahead, by the prefetcher); IDX files are
  // small and gzipped, so every rank loads them whole.
  const DatasetConfig& dc = config.dataset();
  std::optional<Dataset> train_in_memory;
  std::unique_ptr<ExampleSource> train;
  if (!dc.train_records().empty()) {
    absl::StatusOr<std::unique_ptr<RecordFileReader>> reader =
        RecordFileReader::Open(dc.train_records(), dc.max_train_examples());
    if (!reader.ok()) return reader.status();
    train = std::move(*reader);
  } else {
    absl::StatusOr<Dataset> loaded =
        LoadIdxDataset(dc.train_images(), dc.train_labels(), dc.max_train_examples());
    if (!loaded.ok()) return loaded.status();
    train_in_memory = std::move(*loaded);
    train = std::make_unique<InMemorySource>(&*train_in_memory);
  }
  std::optional<Dataset> test;
  if (leader && (!dc.test_images().empty() || !dc.test_records().empty())) {
    absl::StatusOr<Dataset> t =
        !dc.test_records().empty()
            ? ReadRecordFile(dc.test_records(), dc.max_test_examples())
            : LoadIdxDataset(dc.test_images(), dc.test_labels(), dc.max_test_examples());
    if (!t.ok()) return t.status();
    test = std::move(*t);
  }
  const int64_t steps_per_epoch = train->size() / global_batch;
  if (steps_per_epoch == 0) {
    return absl::InvalidArgumentError(absl::StrCat("the training set has ", train->size(),
                                                   " examples, fewer than one global batch of ",
                                                   global_batch));
  }
  int64_t total_steps = std::max(1, config.epochs()) * steps_per_epoch;
  if (config.max_steps() > 0) total_steps = std::min<int64_t>(total_steps, config.max_steps());
  const int64_t epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;

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
  std::vector<int64_t> sizes;
  for (const Parameter& p : params) sizes.push_back(p.data->size());
  Optimizer optimizer(oo, sizes);

  ScheduleOptions so;
  so.peak_lr = config.learning_rate();
  const ScheduleConfig& sc = config.schedule();
  so.decay = sc.decay() == ScheduleConfig::COSINE ? ScheduleOptions::Decay::kCosine
             : sc.decay() == ScheduleConfig::STEP ? ScheduleOptions::Decay::kStep
                                                  : ScheduleOptions::Decay::kConstant;
  so.warmup_steps = static_cast<int64_t>(sc.warmup_epochs() * steps_per_epoch);
  so.total_steps = total_steps;
  so.min_lr = sc.min_learning_rate();
  so.step_every = static_cast<int64_t>(sc.step_epochs() * steps_per_epoch);
  so.gamma = sc.gamma() > 0 ? sc.gamma() : 0.1f;

  // Start: rank 0's weights everywhere, or the checkpoint's.
  int64_t step = 0;
  if (options.resume) {
    if (config.checkpoint().empty())
      return absl::InvalidArgumentError("--resume needs 'checkpoint' in the config");
    absl::StatusOr<Checkpoint> c = ReadCheckpoint(config.checkpoint());
    if (!c.ok()) return c.status();
    if (absl::Status s = RestoreCheckpoint(config.checkpoint(), *c, net, optimizer); !s.ok())
      return s;
    step = c->step;
    if (leader)
      fprintf(options.progress, "resumed from %s at step %lld\n", config.checkpoint().c_str(),
              static_cast<long long>(step));
  }
  for (Parameter& p : params) {
    MPI_Bcast(p.data->data.data(), static_cast<int>(p.data->size()), MPI_FLOAT, 0, comm);
  }

  const int64_t fusion =
      config.fusion_threshold_bytes() > 0 ? config.fusion_threshold_bytes() : (4 << 20);
  GradientAllReduce allreduce(comm, &params, fusion);
  const int log_every = config.log_every_steps() > 0 ? config.log_every_steps() : 50;
  if (leader) {
    fprintf(options.progress,
            "training %s: %lld parameters, %d ranks x %lld images per step, %lld steps/epoch, %lld "
            "epochs, %d all-reduce buckets\n",
            config.model().c_str(), static_cast<long long>(net.num_parameter_elements()), ranks,
            static_cast<long long>(local_batch), static_cast<long long>(steps_per_epoch),
            static_cast<long long>(epochs), allreduce.num_buckets());
    if (bf16) {
      fprintf(options.progress,
              "precision bf16 (%s): convolutions on BF16 copies of their operands with FP32 "
              "accumulation; weights, gradients and the other ops in FP32\n",
              kernels::GetBf16Support().path.c_str());
    }
    fflush(options.progress);
  }

  TrainResult result;
  BatchPrefetcher prefetcher(train.get(), {.seed = config.seed(),
                                           .global_batch = global_batch,
                                           .rank = rank,
                                           .ranks = ranks,
                                           .total_steps = total_steps});
  Tensor batch, logits_grad;
  std::vector<uint8_t> labels;
  // Loss sum, correct, examples, training FLOPs (this rank).
  double interval_stats[4] = {0, 0, 0, 0};
  double epoch_stats[4] = {0, 0, 0, 0};
  // FP32 peak of the cores all ranks compute on, for the fraction of peak.
  double threads = omp_get_max_threads(), total_threads = 0;
  MPI_Allreduce(&threads, &total_threads, 1, MPI_DOUBLE, MPI_SUM, comm);
  const double peak_gflops = leader ? kernels::Fp32PeakGflopsPerCore() * total_threads : 0;
  double run_flops = 0;
  const double run_start = Now();
  double interval_start = run_start, epoch_start = run_start;
  const int64_t first_step = step;
  auto write_checkpoint = [&]() -> absl::Status {
    if (!leader || config.checkpoint().empty()) return absl::OkStatus();
    return WriteCheckpoint(config.checkpoint(), MakeCheckpoint(step, net, optimizer));
  };

  Timeline timeline(!config.timeline().empty());
  const int64_t timeline_steps = config.timeline_steps() > 0 ? config.timeline_steps() : 20;
  while (step < total_steps) {
    if (options.stop != nullptr) {
      // One int all-reduce a step (microseconds): every rank stops at the
      // same step even when the signal reached them at different times.
      int local = *options.stop != 0 ? 1 : 0, any = 0;
      MPI_Allreduce(&local, &any, 1, MPI_INT, MPI_MAX, comm);
      if (any != 0) {
        result.stopped = true;
        break;
      }
    }
    const int64_t epoch = step / steps_per_epoch;
    // The timeline covers the first timeline_steps steps of this invocation.
    Timeline* tl = timeline.enabled() && step - first_step < timeline_steps ? &timeline : nullptr;
    allreduce.set_timeline(tl);
    double t0 = tl != nullptr ? tl->Now() : 0;
    auto span = [&](const char* name) {
      if (tl == nullptr) return;
      const double t1 = tl->Now();
      tl->Add(name, 0, t0, t1);
      t0 = t1;
    };
    if (absl::Status s = prefetcher.Get(step, &batch, &labels); !s.ok()) return s;
    span("wait for batch");
    net.SetDropoutContext(config.seed(), step, rank * local_batch);
    absl::StatusOr<const Tensor*> logits = net.Forward(batch);
    if (!logits.ok()) return logits.status();
    const LossResult loss =
        SoftmaxCrossEntropy(**logits, labels.data(), 1.0f / global_batch, &logits_grad);
    span("forward + loss");
    if (absl::Status s = net.Backward(logits_grad, [&](int p) { allreduce.OnGradientReady(p); });
        !s.ok())
      return s;
    span("backward");
    allreduce.Finish();
    span("wait for all-reduce");
    ++step;
    const float lr = LearningRate(so, step - 1);
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].trainable) {
        optimizer.Update(static_cast<int>(i), step, lr, params[i].data, *params[i].grad);
      }
    span("optimizer");

    interval_stats[0] += loss.loss_sum;
    interval_stats[1] += loss.correct;
    interval_stats[2] += local_batch;
    // Backward is two products per forward one (data and weight gradients).
    interval_stats[3] += 3 * net.last_forward_flops();
    const bool epoch_end = step % steps_per_epoch == 0 || step == total_steps;
    if (step % log_every == 0 || epoch_end) {
      double sums[4];
      MPI_Reduce(interval_stats, sums, 4, MPI_DOUBLE, MPI_SUM, 0, comm);
      for (int i = 0; i < 4; ++i) epoch_stats[i] += leader ? sums[i] : 0;
      run_flops += leader ? sums[3] : 0;
      if (leader) {
        const double now = Now();
        const double rate = sums[2] / std::max(1e-9, now - interval_start);
        const double eta = (total_steps - step) * global_batch / std::max(1e-9, rate);
        result.final_loss = sums[0] / sums[2];
        fprintf(
            options.progress,
            "epoch %lld/%lld step %lld/%lld loss %.4f acc %.2f%% lr %.5f %.0f images/s eta %s\n",
            static_cast<long long>(epoch) + 1, static_cast<long long>(epochs),
            static_cast<long long>(step), static_cast<long long>(total_steps), sums[0] / sums[2],
            100.0 * sums[1] / sums[2], lr, rate, FormatDuration(eta).c_str());
        fflush(options.progress);
        interval_start = now;
      }
      interval_stats[0] = interval_stats[1] = interval_stats[2] = interval_stats[3] = 0;
    }
    if (config.checkpoint_every_steps() > 0 && step % config.checkpoint_every_steps() == 0 &&
        step < total_steps) {
      if (absl::Status s = write_checkpoint(); !s.ok()) return s;
    }
    if (epoch_end && leader) {
      const double now = Now();
      std::string test_text;
      if (test.has_value()) {
        absl::StatusOr<double> acc = Evaluate(net, *test);
        if (!acc.ok()) return acc.status();
        result.test_accuracy = *acc;
        test_text = absl::StrFormat(" test acc %.2f%%", 100.0 * *acc);
      }
      const double seconds = std::max(1e-9, now - epoch_start);
      const double gflops = epoch_stats[3] / seconds / 1e9;
      fprintf(options.progress,
              "epoch %lld done: loss %.4f train acc %.2f%%%s %.1f s %.0f images/s %.1f GFLOP/s "
              "(%.1f%% of FP32 peak)\n",
              static_cast<long long>(epoch) + 1, epoch_stats[0] / std::max(1.0, epoch_stats[2]),
              100.0 * epoch_stats[1] / std::max(1.0, epoch_stats[2]), test_text.c_str(), seconds,
              epoch_stats[2] / seconds, gflops,
              peak_gflops > 0 ? 100.0 * gflops / peak_gflops : 0.0);
      fflush(options.progress);
      epoch_stats[0] = epoch_stats[1] = epoch_stats[2] = epoch_stats[3] = 0;
      epoch_start = Now();
      interval_start = epoch_start;
    }
  }
  if (timeline.enabled()) {
    if (absl::Status s = timeline.Write(config.timeline(), comm); !s.ok()) return s;
    if (leader) fprintf(options.progress, "timeline %s\n", config.timeline().c_str());
  }
  if (bf16 && leader) {
    const onednn::Bf16ConvPrimitives counts = onednn::Bf16ConvPrimitiveCounts();
    fprintf(options.progress, "bf16: %lld convolution primitives in BF16, %lld in FP32%s\n",
            static_cast<long long>(counts.bf16), static_cast<long long>(counts.fp32_instead),
            counts.fp32_instead > 0 ? " (oneDNN has only a reference BF16 kernel for them)" : "");
  }
  result.steps = step;
  const double run_seconds = std::max(1e-9, Now() - run_start);
  result.images_per_second = (step - first_step) * global_batch / run_seconds;
  result.gflops = run_flops / run_seconds / 1e9;
  result.peak_fraction = peak_gflops > 0 ? result.gflops / peak_gflops : 0;
  if (absl::Status s = write_checkpoint(); !s.ok()) return s;
  if (result.stopped) {
    if (leader) {
      fprintf(options.progress, "stopped at step %lld of %lld%s\n", static_cast<long long>(step),
              static_cast<long long>(total_steps),
              config.checkpoint().empty()
                  ? " (no checkpoint in the config)"
                  : absl::StrCat(": checkpoint ", config.checkpoint(), " (--resume continues)")
                        .c_str());
      fflush(options.progress);
    }
    return result;
  }
  if (leader && !config.final_weights().empty()) {
    Checkpoint c;
    c.step = step;
    for (const Parameter& p : params) c.tensors.emplace_back(p.name, p.data->data);
    if (absl::Status s = WriteCheckpoint(config.final_weights(), c); !s.ok()) return s;
  }
  if (leader && !config.export_repository().empty()) {
    absl::StatusOr<std::string> path =
        NextVersionPath(config.export_repository(), config.export_model_name());
    if (!path.ok()) return path.status();
    std::vector<NamedWeights> weights;
    for (const Parameter& p : params) weights.push_back({p.name, &p.data->data});
    if (absl::Status s = ExportOnnx(config.model(), weights, *path); !s.ok()) return s;
    result.exported_model = *path;
    fprintf(options.progress, "exported %s\n", path->c_str());
    fflush(options.progress);
  }
  return result;
}

}  // namespace numaserve::training
