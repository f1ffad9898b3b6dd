// Concat of FP32 tensors as a step: per input, its block of each outer
// index copied into place (memcpy), OpenMP-parallel over the outer
// indices, or over each block's bytes where there are fewer outer indices
// than threads. A decoder's cache update (past keys and the new ones,
// along the sequence) is the case that made it: on the reference, copying
// into a fresh tensor per input, it ran at a fifth of the memory's speed.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/compiler/compiled_steps.h"

namespace numaserve::engine {

class ConcatStep final : public Step {
 public:
  // AXIS: non-negative, below the inputs' rank.
  ConcatStep(std::vector<ValueId> inputs, int64_t axis, ValueId dst, std::string name)
      : Step(StepTraits::ReadsWrites(inputs, {dst})),
        inputs_(std::move(inputs)),
        axis_(axis),
        dst_(dst),
        name_(std::move(name)) {}
  absl::Status Run(const StepContext& ctx) override;
  std::string Describe() const override { return "concat: " + name_; }
  std::string Implementation(const std::vector<Shape>& shapes) const override {
    return "numaserve:memcpy";
  }

 private:
  std::vector<ValueId> inputs_;
  int64_t axis_;
  ValueId dst_;
  std::string name_;
};

}  // namespace numaserve::engine
