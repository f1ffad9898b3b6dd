#include "serving/frontend/raw_infer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"

namespace numaserve::serving {
namespace {

// ModelInferRequest's raw_input_contents and ModelInferResponse's
// raw_output_contents (proto/grpc_service.proto).
constexpr uint32_t kRawInputContentsField = 7;
constexpr uint32_t kRawOutputContentsField = 6;
// ModelStreamInferResponse's infer_response.
constexpr uint32_t kInferResponseField = 2;

// Wire types (protobuf's encoding).
constexpr uint32_t kVarint = 0;
constexpr uint32_t kFixed64 = 1;
constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kFixed32 = 5;

// A position in a list of slices, and reads from it that never pass the
// end.
class SliceReader {
 public:
  explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
    for (const grpc::Slice& s : slices) size_ += s.size();
    SkipEmpty();
  }
  size_t offset() const { return offset_; }
  size_t left() const { return size_ - offset_; }

  bool ReadVarint(uint64_t* value) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (left() == 0) return false;
      const auto byte = static_cast<uint8_t>(*Here());
      Advance(1);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) {
        *value = v;
        return true;
      }
    }
    return false;  // more than ten bytes
  }

  // A field's tag as protobuf reads it: a varint of at most five bytes,
  // kept to 32 bits.
  bool ReadTag(uint32_t* tag) {
    uint32_t v = 0;
    for (int i = 0; i < 5; ++i) {
      if (left() == 0) return false;
      const auto byte = static_cast<uint8_t>(*Here());
      Advance(1);
      v |= static_cast<uint32_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) {
        *tag = v;
        return true;
      }
    }
    return false;
  }

  // The next `n` bytes (n <= left()), in the slices' pieces; moves past them.
  void Take(size_t n, InputBytes* out) {
    while (n > 0) {
      const grpc::Slice& s = slices_[slice_];
      const size_t here = std::min(n, s.size() - in_slice_);
      out->Add({Here(), here});
      Advance(here);
      n -= here;
    }
  }

 private:
  const char* Here() const {
    return reinterpret_cast<const char*>(slices_[slice_].begin()) + in_slice_;
  }
  void Advance(size_t n) {
    in_slice_ += n;
    offset_ += n;
    SkipEmpty();
  }
  void SkipEmpty() {
    while (slice_ < slices_.size() && in_slice_ == slices_[slice_].size()) {
      ++slice_;
      in_slice_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t size_ = 0;
  size_t offset_ = 0;
  size_t slice_ = 0;
  size_t in_slice_ = 0;
};

absl::Status Malformed(size_t offset, const char* what) {
  return absl::InvalidArgumentError(
      absl::StrFormat("the ModelInferRequest is malformed at byte %d: %s", offset, what));
}

// Moves past the payload of a field of `wire_type` (its tag read), into
// `payload`; what protobuf refuses is refused.
absl::Status TakePayload(SliceReader* reader, uint32_t wire_type, size_t field_start,
                         InputBytes* payload) {
  uint64_t n = 0;
  switch (wire_type) {
    case kVarint: {
      uint64_t ignored = 0;
      if (!reader->ReadVarint(&ignored)) return Malformed(field_start, "a truncated varint");
      return absl::OkStatus();
    }
    case kFixed64:
      n = 8;
      break;
    case kFixed32:
      n = 4;
      break;
    case kLengthDelimited:
      if (!reader->ReadVarint(&n)) return Malformed(field_start, "a truncated length");
      break;
    default:
      return Malformed(field_start, "a group or an unknown wire type");
  }
  if (n > reader->left()) return Malformed(field_start, "a field runs past the end");
  reader->Take(static_cast<size_t>(n), payload);
  return absl::OkStatus();
}

void Append(const InputBytes& bytes, std::string* out) {
  for (const auto& [data, size] : bytes.pieces) out->append(data, size);
}

// A varint's bytes.
std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

}  // namespace

absl::StatusOr<RawInferRequest> ReadRawInferRequest(const grpc::ByteBuffer& buffer) {
  auto slices = std::make_shared<std::vector<grpc::Slice>>();
  // An empty message may come as a buffer never filled.
  if (buffer.Valid() && !buffer.Dump(slices.get()).ok()) {
    return absl::InvalidArgumentError("the ModelInferRequest could not be read from its buffer");
  }
  auto transport = std::make_shared<TransportInputs>();
  std::string rest;  // every other field, as received
  SliceReader reader(*slices);
  // Follows `reader` one field behind: the field's bytes, tag and all.
  SliceReader copier(*slices);
  while (reader.left() > 0) {
    const size_t field_start = reader.offset();
    uint32_t tag = 0;
    if (!reader.ReadTag(&tag)) return Malformed(field_start, "a truncated or oversized tag");
    const uint32_t field = tag >> 3;
    const uint32_t wire_type = tag & 7;
    if (field == 0) return Malformed(field_start, "field number 0");
    InputBytes payload;
    if (absl::Status s = TakePayload(&reader, wire_type, field_start, &payload); !s.ok()) {
      return s;
    }
    InputBytes whole;
    copier.Take(reader.offset() - copier.offset(), &whole);
    if (field == kRawInputContentsField && wire_type == kLengthDelimited) {
      transport->inputs.push_back(std::move(payload));
    } else {
      Append(whole, &rest);
    }
  }
  RawInferRequest out;
  if (!out.message.ParseFromString(rest)) {
    return absl::InvalidArgumentError("the ModelInferRequest does not parse");
  }
  transport->owner = std::move(slices);
  out.transport = std::move(transport);
  return out;
}

namespace {

// Each output's field prefix (tag and length), then the output.
void AppendOutputs(std::vector<grpc::Slice> outputs, std::vector<grpc::Slice>* wire) {
  for (grpc::Slice& data : outputs) {
    const std::string prefix =
        Varint((kRawOutputContentsField << 3) | kLengthDelimited) + Varint(data.size());
    wire->emplace_back(prefix);
    wire->push_back(std::move(data));
  }
}

size_t OutputsSize(const std::vector<grpc::Slice>& outputs) {
  size_t size = 0;
  for (const grpc::Slice& data : outputs) {
    size += Varint((kRawOutputContentsField << 3) | kLengthDelimited).size() +
            Varint(data.size()).size() + data.size();
  }
  return size;
}

}  // namespace

grpc::ByteBuffer WriteRawInferResponse(const inference::ModelInferResponse& head,
                                       std::vector<grpc::Slice> outputs) {
  std::vector<grpc::Slice> wire;
  wire.reserve(1 + 2 * outputs.size());
  wire.emplace_back(head.SerializeAsString());
  AppendOutputs(std::move(outputs), &wire);
  return grpc::ByteBuffer(wire.data(), wire.size());
}

grpc::ByteBuffer WriteRawStreamResponse(const inference::ModelStreamInferResponse& head,
                                        std::vector<grpc::Slice> outputs) {
  inference::ModelStreamInferResponse outer = head;
  outer.clear_infer_response();
  const std::string inner = head.infer_response().SerializeAsString();
  std::vector<grpc::Slice> wire;
  wire.reserve(3 + 2 * outputs.size());
  // The outer fields, then infer_response: its tag and length, its fields,
  // its outputs.
  wire.emplace_back(outer.SerializeAsString() +
                    Varint((kInferResponseField << 3) | kLengthDelimited) +
                    Varint(inner.size() + OutputsSize(outputs)));
  wire.emplace_back(inner);
  AppendOutputs(std::move(outputs), &wire);
  return grpc::ByteBuffer(wire.data(), wire.size());
}

}  // namespace numaserve::serving
