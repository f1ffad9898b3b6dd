// CompiledModelImpl (compiled_model_impl.h): the step profile. Per-step
// timings, and FormatStepProfile / StepProfileJson (model.h).
#include "engine/compiled_model_impl.h"

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
    row.precision = step.Arithmetic();
    rows.push_back(row);
    // A conv or matmul writing into its residual's bytes has nothing to copy.
    const ValueId out = step.ResidualOutput();
    if (out != kNoValue && last_shapes_ != nullptr && BytesOwner(out, *last_shapes_) != out) {
      continue;
    }
    if (step.ResidualInput() != kNoValue) {
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
  double bytes = static_cast<double>(step.ParameterBytes());
  std::vector<ValueId> counted;
  auto add = [&](ValueId v) {
    if (v == kNoValue || v >= static_cast<ValueId>(shapes.size())) return;
    if (std::find(counted.begin(), counted.end(), v) != counted.end()) return;
    counted.push_back(v);
    const size_t size = DataTypeSize(RuntimeType(graph_, v));
    bytes += static_cast<double>(kernels::NumElements(shapes[v])) *
             static_cast<double>(size > 0 ? size : sizeof(float));
  };
  for (ValueId v : step.Reads()) add(v);
  for (ValueId v : step.Writes()) add(v);
  return bytes;
}

}  // namespace numaserve::engine::internal

namespace numaserve::engine {

namespace {

std::string ProfileRowNote(const StepProfile& row) {
  std::string note = row.layouts;
  if (row.threads == 1) absl::StrAppend(&note, note.empty() ? "" : ", ", "1 thread");
  if (row.slice_rows > 0) {
    absl::StrAppend(&note, note.empty() ? "" : ", ", "slices of ", row.slice_rows, " rows");
  }
  if (!row.implementation.empty()) {
    absl::StrAppend(&note, note.empty() ? "" : ", ", row.implementation);
  }
  return note.empty() ? "" : absl::StrCat(" [", note, "]");
}

std::string Gflops(const StepProfile& row) {
  if (row.flops <= 0 || row.seconds <= 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", row.flops / row.seconds / 1e9);
  return buf;
}

bool IsBoundary(const StepProfile& row) {
  if (row.kind == "reorder") return true;
  const size_t arrow = row.layouts.find("->");
  return arrow != std::string::npos &&
         row.layouts.substr(0, arrow) != row.layouts.substr(arrow + 2);
}

}  // namespace

std::string FormatStepProfile(const std::vector<StepProfile>& profile, int64_t runs, int top,
                              double wall_seconds) {
  const double per_run = 1e3 / static_cast<double>(std::max<int64_t>(runs, 1));  // s -> ms/run
  double total = 0;
  std::map<std::string, StepProfile> kinds;  // summed per kind
  std::map<std::string, int> kind_rows;
  for (const StepProfile& row : profile) {
    total += row.seconds;
    StepProfile& k = kinds[row.kind];
    k.seconds += row.seconds;
    k.flops += row.flops;
    ++kind_rows[row.kind];
  }
  auto share = [&](double seconds) { return total > 0 ? 100.0 * seconds / total : 0.0; };
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "  %lld runs: %.3f ms per run in %zu profiled rows",
                static_cast<long long>(runs), total * per_run, profile.size());
  out += line;
  if (wall_seconds > 0) {
    std::snprintf(line, sizeof(line), ", %.3f ms outside steps (run wall %.3f ms)",
                  std::max(0.0, wall_seconds - total) * per_run, wall_seconds * per_run);
    out += line;
  }
  out += "\n";
  std::vector<std::pair<std::string, StepProfile>> by_kind(kinds.begin(), kinds.end());
  std::stable_sort(by_kind.begin(), by_kind.end(), [](const auto& a, const auto& b) {
    return a.second.seconds > b.second.seconds;
  });
  std::snprintf(line, sizeof(line), "  %-16s %5s %10s %7s %8s\n", "kind", "rows", "ms/run", "share",
                "GFLOP/s");
  out += line;
  for (const auto& [kind, k] : by_kind) {
    std::snprintf(line, sizeof(line), "  %-16s %5d %10.3f %6.1f%% %8s\n", kind.c_str(),
                  kind_rows[kind], k.seconds * per_run, share(k.seconds), Gflops(k).c_str());
    out += line;
  }
  std::vector<const StepProfile*> sorted;
  for (const StepProfile& row : profile) sorted.push_back(&row);
  std::stable_sort(sorted.begin(), sorted.end(), [](const StepProfile* a, const StepProfile* b) {
    return a->seconds > b->seconds;
  });
  const size_t shown = top <= 0 ? sorted.size() : std::min(sorted.size(), static_cast<size_t>(top));
  std::snprintf(line, sizeof(line), "  top %zu of %zu rows %7s %7s %8s  step\n", shown,
                sorted.size(), "ms/run", "share", "GFLOP/s");
  out += line;
  auto print_row = [&](const StepProfile& row) {
    std::snprintf(line, sizeof(line), "  #%-4d %15.3f %6.1f%% %8s  ", row.index,
                  row.seconds * per_run, share(row.seconds), Gflops(row).c_str());
    absl::StrAppend(&out, line, row.description, ProfileRowNote(row), "\n");
  };
  for (size_t i = 0; i < shown; ++i) print_row(*sorted[i]);
  double boundary = 0;
  int boundaries = 0;
  for (const StepProfile& row : profile) {
    if (IsBoundary(row)) {
      boundary += row.seconds;
      ++boundaries;
    }
  }
  std::snprintf(line, sizeof(line),
                "  layout boundaries and residual reorders: %d rows, %.3f ms per run, %.1f%%\n",
                boundaries, boundary * per_run, share(boundary));
  out += line;
  for (const StepProfile& row : profile) {
    if (IsBoundary(row)) print_row(row);
  }
  return out;
}

std::string StepProfileJson(const std::vector<StepProfile>& profile, int64_t runs,
                            double wall_seconds) {
  const double per_run = 1e3 / static_cast<double>(std::max<int64_t>(runs, 1));
  double total = 0;
  for (const StepProfile& row : profile) total += row.seconds;
  std::string out = absl::StrCat("{\"runs\": ", runs, ", \"step_ms\": ", total * per_run,
                                 ", \"wall_ms\": ", wall_seconds * per_run, ", \"rows\": [");
  for (size_t i = 0; i < profile.size(); ++i) {
    const StepProfile& row = profile[i];
    absl::StrAppend(&out, i == 0 ? "" : ", ", "{\"index\": ", row.index,
                    ", \"kind\": ", base::JsonString(row.kind),
                    ", \"step\": ", base::JsonString(row.description),
                    ", \"layouts\": ", base::JsonString(row.layouts),
                    ", \"implementation\": ", base::JsonString(row.implementation),
                    ", \"threads\": ", row.threads, ", \"ms\": ", row.seconds * per_run,
                    ", \"share\": ", total > 0 ? row.seconds / total : 0.0,
                    ", \"gflops\": ", row.seconds > 0 ? row.flops / row.seconds / 1e9 : 0.0,
                    ", \"bytes\": ", row.bytes / static_cast<double>(std::max<int64_t>(runs, 1)),
                    ", \"precision\": ", base::JsonString(row.precision),
                    ", \"boundary\": ", IsBoundary(row) ? "true" : "false", "}");
  }
  return out + "]}";
}

}  // namespace numaserve::engine
