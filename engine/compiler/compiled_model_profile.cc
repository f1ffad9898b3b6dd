// CompiledModelImpl (compiled_model_impl.h): its step profile, from the
// per-step timings (rendered by engine/profile/step_profile.h).
#include "engine/compiler/compiled_model_impl.h"

namespace numaserve::engine::internal {

void CompiledModelImpl::PrintProfile() const {
  if (!print_profile_at_exit_ || times_.empty() || profile_runs_ == 0) return;
  base::Log(base::LogLevel::kInfo, "engine", absl::StrCat("step profile for ", info_.path),
            {{"path", info_.path}});
  base::LogBlock(base::LogLevel::kInfo, "engine", FormatStepProfile(Profile(), profile_runs_, 15));
}

std::vector<StepProfile> CompiledModelImpl::Profile() const {
  std::vector<StepProfile> rows;
  if (times_.size() != steps_.size()) return rows;
  for (size_t k = 0; k < steps_.size(); ++k) {
    const Step& step = *steps_[k];
    const std::string d = step.Describe();
    StepProfile row;
    row.index = static_cast<int>(k);
    row.kind = d.substr(0, d.find(':'));
    row.description = d;
    row.layouts = step.Layouts();
    const bool sliced = last_state_ != nullptr && static_cast<int>(k) < last_state_->split_steps;
    if (last_shapes_ != nullptr) {
      row.implementation = step.Implementation(sliced ? last_state_->slice_shapes : *last_shapes_);
    }
    if (last_state_ != nullptr) row.threads = last_state_->serial[k] ? 1 : threads_;
    if (sliced) row.slice_rows = last_state_->slice_rows;
    row.calls = times_[k].calls;
    row.seconds = times_[k].seconds;
    row.flops = times_[k].flops;
    row.bytes = times_[k].bytes;
    row.precision = step.traits().arithmetic;
    rows.push_back(row);
    // A conv or matmul writing into its residual's bytes has nothing to copy.
    const ValueId out = step.traits().residual_output;
    if (out != kNoValue && last_shapes_ != nullptr && BytesOwner(out, *last_shapes_) != out) {
      continue;
    }
    if (step.traits().residual_input != kNoValue) {
      StepProfile r;
      r.index = static_cast<int>(k);
      r.kind = "reorder";
      r.description = absl::StrCat("reorder: residual into ", d);
      if (const auto* conv = dynamic_cast<const ConvStep*>(&step); conv != nullptr) {
        r.layouts = conv->ResidualLayouts();
      }
      r.calls = times_[k].calls;
      r.seconds = times_[k].residual_seconds;
      r.bytes = times_[k].residual_bytes;
      rows.push_back(r);
    }
  }
  return rows;
}

double CompiledModelImpl::StepBytes(const Step& step, const std::vector<Shape>& shapes) const {
  double bytes = static_cast<double>(step.traits().parameter_bytes);
  std::vector<ValueId> counted;
  auto add = [&](ValueId v) {
    if (v == kNoValue || v >= static_cast<ValueId>(shapes.size())) return;
    if (std::find(counted.begin(), counted.end(), v) != counted.end()) return;
    counted.push_back(v);
    const size_t size = DataTypeSize(RuntimeType(graph_, v));
    bytes += static_cast<double>(kernels::NumElements(shapes[v])) *
             static_cast<double>(size > 0 ? size : sizeof(float));
  };
  for (ValueId v : step.traits().reads) add(v);
  for (ValueId v : step.traits().writes) add(v);
  return bytes;
}

}  // namespace numaserve::engine::internal
