#include "kernels/shape_ops.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace numaserve::kernels {

absl::StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape pa = PadShapeLeft(a, rank);
  Shape pb = PadShapeLeft(b, rank);
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    if (pa[i] == pb[i] || pb[i] == 1) {
      out[i] = pa[i];
    } else if (pa[i] == 1) {
      out[i] = pb[i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", ShapeToString(a), " and ",
                                                     ShapeToString(b), " do not broadcast"));
    }
  }
  return out;
}

Shape PadShapeLeft(const Shape& shape, size_t rank) {
  Shape out(rank - shape.size(), 1);
  out.insert(out.end(), shape.begin(), shape.end());
  return out;
}

absl::StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("axis ", axis, " is out of range for rank ", rank));
  }
  return axis < 0 ? axis + rank : axis;
}

absl::StatusOr<Shape> FlattenShape(const Shape& input, int64_t axis) {
  const int64_t rank = static_cast<int64_t>(input.size());
  // Flatten accepts axis in [-r, r]: axis == r gives [prod, 1].
  if (axis < -rank || axis > rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("Flatten axis ", axis, " is out of range for rank ", rank));
  }
  // A checked shape: any product of its dims fits.
  if (auto n = NumElementsChecked(input); !n.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Flatten: ", n.status().message()));
  }
  if (axis < 0) axis += rank;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= input[i];
  return Shape{outer, inner};
}

absl::StatusOr<Shape> ReshapeShape(const Shape& input, const std::vector<int64_t>& target,
                                   bool allowzero) {
  auto total = NumElementsChecked(input);
  if (!total.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("Reshape: input ", total.status().message()));
  }
  Shape out(target.size());
  int64_t infer_at = -1;
  int64_t known = 1;  // product of the target's given dims, at most kMaxTensorElements
  for (size_t i = 0; i < target.size(); ++i) {
    int64_t d = target[i];
    if (d == 0 && !allowzero) {
      if (i >= input.size()) {
        return absl::InvalidArgumentError(absl::StrCat("Reshape: 0 at position ", i,
                                                       " but the input ", ShapeToString(input),
                                                       " has no such dim"));
      }
      d = input[i];
    } else if (d == -1) {
      if (infer_at >= 0) {
        return absl::InvalidArgumentError("Reshape: more than one -1 in the target shape");
      }
      infer_at = static_cast<int64_t>(i);
      continue;
    } else if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Reshape: invalid target dim ", d));
    }
    out[i] = d;
    if (d > kMaxTensorElements || __builtin_mul_overflow(known, d, &known) ||
        known > kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Reshape: the target [", absl::StrJoin(target, ","), "] exceeds the limit of ",
          kMaxTensorElements, " elements per tensor (the input ", ShapeToString(input), " has ",
          *total, ")"));
    }
  }
  if (infer_at >= 0) {
    if (known == 0 || *total % known != 0) {
      return absl::InvalidArgumentError(absl::StrCat("Reshape: cannot infer -1 reshaping ",
                                                     ShapeToString(input), " to [",
                                                     absl::StrJoin(target, ","), "]"));
    }
    out[infer_at] = *total / known;
  } else if (known != *total) {
    return absl::InvalidArgumentError(absl::StrCat("Reshape: ", ShapeToString(input), " has ",
                                                   *total, " elements, target ", ShapeToString(out),
                                                   " has ", known));
  }
  return out;
}

}  // namespace numaserve::kernels
