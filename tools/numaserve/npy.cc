#include "tools/numaserve/npy.h"

#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace numaserve::cli {
namespace {

// The value of 'key' in the header's Python dict literal, as text.
std::string DictValue(const std::string& header, const std::string& key) {
  size_t k = header.find(absl::StrCat("'", key, "'"));
  if (k == std::string::npos) return "";
  size_t colon = header.find(':', k);
  if (colon == std::string::npos) return "";
  size_t start = header.find_first_not_of(' ', colon + 1);
  if (start == std::string::npos) return "";
  size_t end = header[start] == '(' ? header.find(')', start) + 1 : header.find(',', start);
  return header.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

absl::StatusOr<size_t> NormalizeDescr(std::string* descr) {
  const std::string given = *descr;
  int64_t size = 0;
  if (given.size() < 3 || std::string("<>|=").find(given[0]) == std::string::npos ||
      std::string("fiub").find(given[1]) == std::string::npos ||
      !absl::SimpleAtoi(given.substr(2), &size)) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported dtype '", given, "'"));
  }
  const char kind = given[1];
  const bool known = kind == 'b'   ? size == 1
                     : kind == 'f' ? (size == 2 || size == 4 || size == 8)
                                   : (size == 1 || size == 2 || size == 4 || size == 8);
  if (!known) return absl::InvalidArgumentError(absl::StrCat("unsupported dtype '", given, "'"));
  if (size == 1) {
    *descr = absl::StrCat("|", given.substr(1));
  } else if (given[0] == '>') {
    return absl::InvalidArgumentError(absl::StrCat(
        "big-endian dtype '", given, "' is not supported; save it as '<", given.substr(1), "'"));
  } else {  // '=' is native order: little-endian on the machines numaserve runs on
    *descr = absl::StrCat("<", given.substr(1));
  }
  return static_cast<size_t>(size);
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", why));
  };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) return bad("not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return bad("truncated header");
    for (int i = 0; i < 4; ++i)
      header_len |= size_t{static_cast<unsigned char>(bytes[8 + i])} << (8 * i);
    header_start = 12;
  } else {
    return bad(absl::StrCat("unsupported .npy version ", major));
  }
  if (header_start + header_len > bytes.size()) return bad("truncated header");
  std::string header = bytes.substr(header_start, header_len);
  NpyArray array;
  array.dtype =
      std::string(absl::StripSuffix(absl::StripPrefix(DictValue(header, "descr"), "'"), "'"));
  if (DictValue(header, "fortran_order").rfind("True", 0) == 0) {
    return bad("Fortran order is not supported; save a C-ordered array");
  }
  std::string shape_text = DictValue(header, "shape");
  if (shape_text.size() < 2) return bad("no shape in header");
  shape_text = shape_text.substr(1, shape_text.size() - 2);
  int64_t elements = 1;
  for (absl::string_view dim : absl::StrSplit(shape_text, ',', absl::SkipWhitespace())) {
    int64_t d = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &d) || d < 0) return bad("bad shape");
    if (d > 0 && elements > (int64_t{1} << 40) / d) return bad("shape too large");
    array.shape.push_back(d);
    elements *= d;
  }
  auto item = NormalizeDescr(&array.dtype);
  if (!item.ok()) return bad(std::string(item.status().message()));
  size_t data_start = header_start + header_len;
  size_t want = static_cast<size_t>(elements) * *item;
  if (bytes.size() - data_start != want) {
    return bad(absl::StrCat("expected ", want, " bytes of data for the shape, found ",
                            bytes.size() - data_start));
  }
  array.data = bytes.substr(data_start);
  return array;
}

}  // namespace numaserve::cli
