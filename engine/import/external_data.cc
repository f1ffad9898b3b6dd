#include "engine/import/external_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/errno_text.h"
#include "engine/import/onnx_read.h"
#include "engine/ir/types.h"
#include "kernels/tensor.h"

namespace numaserve::engine {
namespace {

constexpr int kMaxDepth = 64;  // subgraphs a hostile file may nest

// A file a location resolved to, however many tensors read it.
struct DataFile {
  std::string path;        // resolved
  int64_t size = 0;        // when first seen
  int64_t bytes_read = 0;  // by all tensors so far: at most `size`
};

// An open descriptor, closed when it goes (one file open at a time: a
// model may keep each tensor in a file of its own).
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The model's folder, resolved when first needed, and the files seen in it.
class ExternalFiles {
 public:
  explicit ExternalFiles(std::string model_path) : model_path_(std::move(model_path)) {}

  // The file at LOCATION, relative to the model's folder and confined to it.
  absl::StatusOr<DataFile*> Find(const std::string& location) {
    if (absl::Status s = ResolveFolder(); !s.ok()) return s;
    if (location.empty() || location.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError("an empty location");
    }
    if (location[0] == '/') {
      return absl::PermissionDeniedError(
          "an absolute path: a location is relative to the model's folder");
    }
    for (absl::string_view part : absl::StrSplit(location, '/')) {
      if (part == "..") {
        return absl::PermissionDeniedError("a path leaving the model's folder ('..')");
      }
    }
    const std::string joined = absl::StrCat(dir_, "/", location);
    char resolved[PATH_MAX];
    if (realpath(joined.c_str(), resolved) == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("no such file beside the model (", joined, "): ", base::ErrnoText(errno)));
    }
    const std::string real = resolved;
    if (real.compare(0, dir_.size() + 1, dir_ + "/") != 0) {
      return absl::PermissionDeniedError(
          absl::StrCat("a link to '", real, "', outside the model's folder"));
    }
    auto it = files_.find(real);
    if (it != files_.end()) return &it->second;
    struct stat st{};
    if (stat(real.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("'", real, "' is not a regular file"));
    }
    DataFile& file = files_[real];
    file.path = real;
    file.size = st.st_size;
    return &file;
  }

 private:
  // The model's folder, resolved once, when a tensor first names a file.
  absl::Status ResolveFolder() {
    if (!dir_.empty()) return absl::OkStatus();
    const size_t slash = model_path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : model_path_.substr(0, slash + 1);
    char resolved[PATH_MAX];
    if (realpath(dir.c_str(), resolved) == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("cannot resolve the model's folder '", dir, "': ", base::ErrnoText(errno)));
    }
    dir_ = resolved;
    return absl::OkStatus();
  }

  std::string model_path_;
  std::string dir_;  // resolved; empty until then
  std::map<std::string, DataFile> files_;
};

// BYTES bytes of F at OFFSET (checked to lie within it) into OUT.
absl::Status ReadRegion(const DataFile& f, int64_t offset, int64_t bytes, std::string& out) {
  const Descriptor fd(open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat st{};
  if (fd.get() < 0 || fstat(fd.get(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open '", f.path, "': ", base::ErrnoText(errno)));
  }
  if (!S_ISREG(st.st_mode) || st.st_size != f.size) {
    return absl::DataLossError(absl::StrCat("'", f.path, "' changed while the model loaded"));
  }
  out.assign(static_cast<size_t>(bytes), '\0');
  int64_t done = 0;
  while (done < bytes) {
    const ssize_t n = pread(fd.get(), out.data() + done, static_cast<size_t>(bytes - done),
                            static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::DataLossError(absl::StrCat("reading bytes at ", offset + done, ": ",
                                              n < 0 ? base::ErrnoText(errno) : "the file shrank"));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseCount(const std::string& key, const std::string& text) {
  int64_t v = 0;
  if (text.empty() || text[0] < '0' || text[0] > '9' || !absl::SimpleAtoi(text, &v) || v < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' is '", absl::CHexEscape(text), "', not a byte count"));
  }
  return v;
}

// T's region into its raw_data; what it says is checked first.
absl::Status LoadTensor(onnx::TensorProto& t, ExternalFiles& files) {
  std::string location;
  int64_t offset = 0;
  int64_t length = -1;
  for (const onnx::StringStringEntryProto& e : t.external_data()) {
    if (e.key() == "location") {
      location = e.value();
    } else if (e.key() == "offset" || e.key() == "length") {
      auto v = ParseCount(e.key(), e.value());
      if (!v.ok()) return v.status();
      (e.key() == "offset" ? offset : length) = *v;
    } else if (e.key() != "checksum") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key '", absl::CHexEscape(e.key()),
                       "' (known: location, offset, length, checksum)"));
    }
  }
  if (location.empty()) return absl::InvalidArgumentError("no location");
  const DataType type = FromOnnxType(t.data_type());
  const size_t element = DataTypeSize(type);
  if (type == DataType::kUnknown || element == 0) {
    return absl::UnimplementedError(
        absl::StrCat("element type ", t.data_type(), " has no fixed size to read"));
  }
  Shape shape(t.dims().begin(), t.dims().end());
  auto count = kernels::NumElementsChecked(shape);
  if (!count.ok()) return count.status();
  const int64_t bytes = *count * static_cast<int64_t>(element);  // fits: count is bounded
  if (length >= 0 && length != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("length ", length, " where its dims need ", bytes, " bytes"));
  }
  auto file = files.Find(location);
  if (!file.ok()) return file.status();
  DataFile& f = **file;
  if (offset > f.size || bytes > f.size - offset) {
    return absl::OutOfRangeError(absl::StrCat(bytes, " bytes at offset ", offset,
                                              " pass the end of a file of ", f.size, " bytes"));
  }
  if (bytes > f.size - f.bytes_read) {
    return absl::ResourceExhaustedError(absl::StrCat("the tensors read ", f.bytes_read + bytes,
                                                     " bytes from a file of ", f.size,
                                                     " bytes: a region is named more than once"));
  }
  f.bytes_read += bytes;
  std::string data;
  if (absl::Status s = ReadRegion(f, offset, bytes, data); !s.ok()) return s;
  t.clear_external_data();
  t.set_data_location(onnx::TensorProto::DEFAULT);
  *t.mutable_raw_data() = std::move(data);
  return absl::OkStatus();
}

absl::Status LoadOne(onnx::TensorProto& t, ExternalFiles& files) {
  if (!UsesExternalData(t)) return absl::OkStatus();
  std::string location;
  for (const auto& e : t.external_data()) {
    if (e.key() == "location") location = e.value();
  }
  absl::Status s = LoadTensor(t, files);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("tensor '", t.name(), "' in external data '",
                                             absl::CHexEscape(location), "': ", s.message()));
}

absl::Status LoadGraph(onnx::GraphProto& g, ExternalFiles& files, int depth) {
  if (depth > kMaxDepth) return absl::InvalidArgumentError("subgraphs nested too deep");
  for (onnx::TensorProto& t : *g.mutable_initializer()) {
    if (absl::Status s = LoadOne(t, files); !s.ok()) return s;
  }
  for (onnx::NodeProto& n : *g.mutable_node()) {
    for (onnx::AttributeProto& a : *n.mutable_attribute()) {
      if (a.has_t()) {
        if (absl::Status s = LoadOne(*a.mutable_t(), files); !s.ok()) return s;
      }
      for (onnx::TensorProto& t : *a.mutable_tensors()) {
        if (absl::Status s = LoadOne(t, files); !s.ok()) return s;
      }
      if (a.has_g()) {
        if (absl::Status s = LoadGraph(*a.mutable_g(), files, depth + 1); !s.ok()) return s;
      }
      for (onnx::GraphProto& sub : *a.mutable_graphs()) {
        if (absl::Status s = LoadGraph(sub, files, depth + 1); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LoadExternalData(onnx::ModelProto& model, const std::string& model_path) {
  ExternalFiles files(model_path);
  return LoadGraph(*model.mutable_graph(), files, 0);
}

}  // namespace numaserve::engine
