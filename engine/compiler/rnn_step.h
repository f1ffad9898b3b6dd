// LSTM and GRU as one step (compile_rnn.cc decides which way it runs, at
// compile time): on oneDNN's RNN primitives (kernels/onednn/rnn_onednn.h)
// where the node's cell is oneDNN's exactly, else on the op's reference
// kernel (engine/ops/rnn_ops.cc), with the reason in the step's
// description ("rnn: lstm1 [reference: clip]").
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/compiler/compiled_steps.h"
#include "kernels/onednn/rnn_onednn.h"

namespace numaserve::engine {

class RnnStep final : public Step {
 public:
  // On oneDNN: `kernel` holds the node's weights; `sequence_lens` are the
  // node's constant lengths (empty when it has none): a run where one is
  // below the sequence runs on the reference. On the reference: kernel
  // null, `reason` says why.
  RnnStep(const Graph* graph, int node_index, std::unique_ptr<kernels::RnnOnednn> kernel,
          std::vector<int64_t> sequence_lens, std::string reason);
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override;
  double Flops(const std::vector<Shape>& shapes) const override;
  // One time step's share: oneDNN's threads meet at every step, so a small
  // layer runs on one thread even when its whole sequence is large.
  double ParallelGrainFlops(const std::vector<Shape>& shapes) const override;
  std::string Implementation(const std::vector<Shape>& shapes) const override;
  size_t CachedShapes() const override { return kernel_ ? kernel_->cached_shapes() : 0; }

 private:
  static StepTraits Traits(const Graph& graph, int node_index, bool on_onednn);
  // Whether this run (sequence length `seq`, `batch` sequences) goes to oneDNN.
  bool OnOnednn(int64_t seq, int64_t batch) const;

  const Graph* graph_;
  int node_index_;
  std::unique_ptr<kernels::RnnOnednn> kernel_;
  std::vector<int64_t> sequence_lens_;
  std::string reason_;
  ReferenceStep reference_;
};

}  // namespace numaserve::engine
