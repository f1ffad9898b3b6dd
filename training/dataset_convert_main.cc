// numaserve-dataset: converts IDX files or a directory of raw tensors into
// numaserve's packed record format (record_file.h).
//
//   numaserve-dataset --idx IMAGES LABELS --out FILE
//   numaserve-dataset --dir DIR --shape 28,28 --out FILE
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "training/record_file.h"

int main(int argc, char** argv) {
  using namespace numaserve::training;
  std::string images, labels, dir, shape, out;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--idx" && i + 2 < argc) {
      images = argv[++i];
      labels = argv[++i];
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--shape" && i + 1 < argc) {
      shape = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else {
      fprintf(stderr,
              "usage: numaserve-dataset --idx IMAGES LABELS --out FILE\n"
              "       numaserve-dataset --dir DIR --shape D1,D2,... --out FILE\n");
      return 2;
    }
  }
  if (out.empty() || (images.empty() == dir.empty())) {
    fprintf(stderr, "numaserve-dataset: give --out and one of --idx or --dir (see --help)\n");
    return 2;
  }
  absl::StatusOr<Dataset> data;
  if (!images.empty()) {
    data = LoadIdxDataset(images, labels, 0);
  } else {
    std::vector<int64_t> dims;
    for (absl::string_view d : absl::StrSplit(shape, ',')) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(d, &v) || v <= 0) {
        fprintf(stderr, "numaserve-dataset: --shape: expected positive dims like 28,28, got '%s'\n",
                shape.c_str());
        return 2;
      }
      dims.push_back(v);
    }
    data = ReadRawTensorDirectory(dir, dims);
  }
  if (!data.ok()) {
    fprintf(stderr, "numaserve-dataset: %s\n", std::string(data.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = WriteRecordFile(out, *data); !s.ok()) {
    fprintf(stderr, "numaserve-dataset: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  printf("%s: %lld examples\n", out.c_str(), static_cast<long long>(data->size));
  return 0;
}
