// The training loop of one rank: data-parallel SGD/AdamW over MPI. Every
// rank runs the same loop on its slice of each global batch; rank 0 reports
// progress, writes checkpoints and exports the model.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/status/statusor.h"
#include "training.pb.h"

namespace numaserve::training {

// Reads a TrainingConfig in protobuf text format. Errors name the file,
// line and field; missing required fields are named too.
absl::StatusOr<TrainingConfig> LoadTrainingConfig(const std::string& path);
// The same for config text already in memory; errors name `source` as the
// file (the training service passes "config_text").
absl::StatusOr<TrainingConfig> ParseTrainingConfig(const std::string& text,
                                                   const std::string& source);

struct TrainOptions {
  // Continue from config.checkpoint (same data order) instead of starting over.
  bool resume = false;
  // Where rank 0 writes its progress: lines, and with the JSON log format
  // each progress report as a record instead (a ProgressReport in its
  // "progress" field; trainer.cc, WriteProgress).
  FILE* progress = stdout;
  // Set (by the thread that takes the stop signals) to stop early: the ranks agree on it before
  // every step, stop together after the step in flight, and rank 0 writes
  // the checkpoint (when the config has one); no final weights, no export.
  const std::atomic<bool>* stop = nullptr;
  // Conv, the pools and the norms run on their reference implementations
  // (conv_pool::SetImplementation) instead of oneDNN's primitives, to
  // compare speed and results on a whole run (numaserve train
  // --training-reference-ops, NUMASERVE_TRAINING_REFERENCE_OPS=1). False
  // leaves the process's choice (oneDNN unless set otherwise).
  bool reference_ops = false;
  // Exports only into a model directory this owner made (onnx_export.h,
  // NextVersionPath); empty = any directory. The training service passes its
  // caller's id (`train --export-owner`).
  std::string export_owner;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;         // mean over the last log interval
  double test_accuracy = -1;     // after the last epoch; -1 without a test set
  double images_per_second = 0;  // over the whole run (this invocation)
  // Training GFLOP/s (3x the forward's Gemm/MatMul/Conv FLOPs; the eval
  // pass is not counted) and their fraction of the FP32 peak of the cores
  // used (rank 0 only).
  double gflops = 0;
  double peak_fraction = 0;
  std::string exported_model;  // path, when exported
  bool stopped = false;        // `stop` ended the run before its last step
};

// Runs the whole job on `comm` (MPI must be initialized).
absl::StatusOr<TrainResult> RunTraining(const TrainingConfig& config, const TrainOptions& options,
                                        MPI_Comm comm);

}  // namespace numaserve::training
