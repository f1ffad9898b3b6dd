#include "training/timeline.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/atomic_file.h"

namespace numaserve::training {

double Timeline::Now() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_)
      .count();
}

void Timeline::Add(const std::string& name, int tid, double begin_us, double end_us) {
  if (enabled_) spans_.push_back({name, tid, begin_us, end_us});
}

absl::Status Timeline::Write(const std::string& path, MPI_Comm comm) const {
  int rank = 0, ranks = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &ranks);
  std::string mine;
  for (const Span& s : spans_) {
    absl::StrAppend(
        &mine, mine.empty() ? "" : ",\n",
        absl::StrFormat(R"({"name":"%s","ph":"X","pid":%d,"tid":%d,"ts":%.1f,"dur":%.1f})", s.name,
                        rank, s.tid, s.begin_us, s.end_us - s.begin_us));
  }
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(ranks), offsets(ranks);
  MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, comm);
  std::string all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < ranks; ++r) {
      offsets[r] = total;
      total += lengths[r];
    }
    all.resize(total);
  }
  MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR,
              0, comm);
  if (rank != 0) return absl::OkStatus();
  std::string json = "{\"traceEvents\":[\n";
  bool first = true;
  for (int r = 0; r < ranks; ++r) {
    if (lengths[r] == 0) continue;
    absl::StrAppend(&json, first ? "" : ",\n",
                    absl::string_view(all).substr(offsets[r], lengths[r]));
    first = false;
  }
  for (int r = 0; r < ranks; ++r) {
    absl::StrAppend(
        &json, first ? "" : ",\n",
        absl::StrFormat(R"({"name":"process_name","ph":"M","pid":%d,"args":{"name":"rank %d"}})", r,
                        r));
    first = false;
  }
  json += "\n]}\n";
  return base::WriteFileAtomically(path, json);
}

}  // namespace numaserve::training
