// FormatStepProfile and StepProfileJson (engine/profile/step_profile.h).
#include "engine/profile/step_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"

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
