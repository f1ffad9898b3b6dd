// numaserve_op_docs: writes the list of supported ONNX operators, from the
// op registry (engine/ops/op_registry.cc), into the generated block of a
// Markdown file, so the documentation cannot drift from the code:
//
//   numaserve_op_docs --print                 the block on stdout
//   numaserve_op_docs --update docs/engine.md rewrite the block in place
//   numaserve_op_docs --check docs/engine.md  exit 1 if the block is stale
//
// The block sits between the lines kBegin and kEnd; everything outside them
// is left as it is. `make docs` runs --update; a ctest runs --check.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/op_registry.h"

namespace numaserve {
namespace {

constexpr char kBegin[] = "<!-- BEGIN GENERATED: ops (make docs) -->";
constexpr char kEnd[] = "<!-- END GENERATED: ops -->";

std::string OpTable() {
  absl::Span<const engine::OpSchema> ops = engine::AllOpSchemas();
  std::string out = absl::StrCat(
      ops.size(),
      " operators (ONNX domain ai.onnx). \"Other types\": the op also runs on tensors of types "
      "other than FP32 (integers, booleans, FP64, quantized), on its typed reference.\n\n"
      "| Operator | Family | Other types |\n|---|---|---|\n");
  for (const engine::OpSchema& op : ops) {
    absl::StrAppend(&out, "| ", op.op_type, " | ", op.family, " | ",
                    op.typed_reference != nullptr ? "yes" : "", " |\n");
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// `text` with the block between the markers replaced by `table`.
absl::StatusOr<std::string> Splice(const std::string& path, const std::string& text,
                                   const std::string& table) {
  const size_t begin = text.find(kBegin);
  const size_t end = text.find(kEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": needs the lines \"", kBegin, "\" and, after it, \"", kEnd, "\""));
  }
  const size_t body = begin + sizeof(kBegin) - 1;
  return absl::StrCat(text.substr(0, body), "\n", table, text.substr(end));
}

int Main(int argc, char** argv) {
  const std::string mode = argc >= 2 ? argv[1] : "";
  if (mode == "--print" && argc == 2) {
    std::fputs(OpTable().c_str(), stdout);
    return 0;
  }
  if ((mode != "--update" && mode != "--check") || argc != 3) {
    std::fprintf(stderr, "usage: %s --print | --update FILE.md | --check FILE.md\n", argv[0]);
    return 2;
  }
  const std::string path = argv[2];
  absl::StatusOr<std::string> text = ReadFile(path);
  absl::StatusOr<std::string> spliced = text.ok() ? Splice(path, *text, OpTable()) : text.status();
  if (!spliced.ok()) {
    std::fprintf(stderr, "numaserve_op_docs: %s\n",
                 std::string(spliced.status().message()).c_str());
    return 2;
  }
  if (mode == "--check") {
    if (*spliced == *text) return 0;
    std::fprintf(stderr,
                 "numaserve_op_docs: %s: the operator list differs from the op registry; "
                 "run `make docs` and commit the result\n",
                 path.c_str());
    return 1;
  }
  if (*spliced == *text) return 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << *spliced;
  if (!out.flush()) {
    std::fprintf(stderr, "numaserve_op_docs: %s: cannot write\n", path.c_str());
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace numaserve

int main(int argc, char** argv) { return numaserve::Main(argc, argv); }
