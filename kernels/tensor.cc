#include "kernels/tensor.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace numaserve::kernels {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::OutOfRangeError(absl::StrCat(a, " * ", b, " overflows int64"));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return absl::OutOfRangeError(absl::StrCat(a, " + ", b, " overflows int64"));
  }
  return out;
}

absl::StatusOr<int64_t> NumElementsChecked(const Shape& shape, int64_t max_elements) {
  // The product of the non-zero dims is bounded too: a zero-size tensor may
  // not carry dims whose product overflows when a sub-shape is multiplied
  // out ([0, 2^40, 2^40] flattened from axis 1).
  int64_t nonzero = 1;
  bool any_zero = false, over = false;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has a negative dim (", d, ")"));
    }
    if (d == 0) {
      any_zero = true;
      continue;
    }
    over = over || d > max_elements || __builtin_mul_overflow(nonzero, d, &nonzero) ||
           nonzero > max_elements;
  }
  if (over) {
    return absl::OutOfRangeError(absl::StrCat("shape ", ShapeToString(shape),
                                              " exceeds the limit of ", max_elements,
                                              " elements per tensor"));
  }
  return any_zero ? 0 : nonzero;
}

absl::StatusOr<int64_t> ByteSizeChecked(const Shape& shape, int64_t element_bytes,
                                        int64_t max_elements) {
  auto n = NumElementsChecked(shape, max_elements);
  if (!n.ok()) return n.status();
  return CheckedMul(*n, element_bytes);
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::vector<int64_t> RowMajorStrides(const Shape& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    strides[i] = strides[i + 1] * shape[i + 1];
  }
  return strides;
}

}  // namespace numaserve::kernels
