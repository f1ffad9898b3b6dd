// ParseJsonInferRequest (infer_json.h): a SAX reader over the body, so a
// tensor's values go straight into its bytes in the input's datatype and no
// document tree is built; an input whose data comes before its datatype or
// shape is read again in a second pass, once both are known.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/ir/typed_tensor.h"
#include "engine/ir/types.h"
#include "serving/http/infer_json.h"
#include "serving/http/rapidjson.h"

namespace numaserve::serving::http {
namespace {

// Arrays and objects nested deeper than this are refused (the reader is
// iterative, so this bounds memory, not the stack).
constexpr size_t kMaxDepth = 32;
// The most dims a shape may list.
constexpr size_t kMaxRank = 64;

// One JSON scalar as the reader delivers it.
struct Scalar {
  enum Kind { kNull, kBool, kInt, kUint, kDouble, kString };
  Kind kind = kNull;
  bool b = false;
  int64_t i = 0;
  uint64_t u = 0;
  double d = 0;
  absl::string_view s;
};

std::string Describe(const Scalar& v) {
  switch (v.kind) {
    case Scalar::kNull:
      return "null";
    case Scalar::kBool:
      return v.b ? "true" : "false";
    case Scalar::kInt:
      return absl::StrCat(v.i);
    case Scalar::kUint:
      return absl::StrCat(v.u);
    case Scalar::kDouble:
      return absl::StrCat(v.d);
    case Scalar::kString:
      return "a string";
  }
  return "?";
}

using Parameters = google::protobuf::Map<std::string, inference::InferParameter>;

// A JSON number as RapidJSON delivers it with kParseNumbersAsStringsFlag
// (its grammar checked, the text untouched), typed as RapidJSON's own
// events would type it: a negative integer that fits int64 as kInt, a
// non-negative one that fits uint64 as kUint, anything else as a double,
// rounded correctly (std::from_chars); NaN and
// Infinity as RapidJSON's kParseNanAndInfFlag lets them through. Empty for
// a number beyond the double range. RapidJSON 1.1.0's own conversion is
// not used: its full-precision path reads past a table of cached powers
// and calls clz(0) on some inputs (found by the infer_json fuzz target).
std::optional<Scalar> NumberOf(absl::string_view text) {
  const char* first = text.data();
  const char* last = first + text.size();
  if (text.find_first_of(".eEnNiI") == absl::string_view::npos) {
    if (absl::StartsWith(text, "-")) {
      int64_t i = 0;
      if (auto [p, ec] = std::from_chars(first, last, i); ec == std::errc() && p == last) {
        return Scalar{.kind = Scalar::kInt, .i = i};
      }
    } else {
      uint64_t u = 0;
      if (auto [p, ec] = std::from_chars(first, last, u); ec == std::errc() && p == last) {
        return Scalar{.kind = Scalar::kUint, .u = u};
      }
    }
  }
  double d = 0;
  if (auto [p, ec] = std::from_chars(first, last, d); ec == std::errc() && p == last) {
    return Scalar{.kind = Scalar::kDouble, .d = d};
  }
  return std::nullopt;
}

struct InputDraft {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  bool has_name = false;
  bool has_datatype = false;
  bool has_shape = false;
  bool has_data = false;
  int64_t binary_size = -1;  // parameters.binary_data_size; -1: none
  Parameters parameters;     // the others
  // Set by Prepare, from the datatype and the shape.
  bool prepared = false;
  bool bytes = false;  // BYTES: strings, no fixed element size
  engine::DataType type = engine::DataType::kUnknown;
  int64_t elements = 0;   // what the shape holds
  int64_t count = 0;      // values read so far
  bool deferred = false;  // data came before datatype or shape: read in the second pass
  std::string raw;
  size_t binary_at = 0;  // where its binary part starts in the body's binary part
};

struct OutputDraft {
  std::string name;
  bool has_name = false;
  std::optional<bool> binary;
  Parameters parameters;
};

enum class Frame {
  kTop,
  kTopParams,
  kInputs,
  kInput,
  kInputParams,
  kShape,
  kData,
  kOutputs,
  kOutput,
  kOutputParams
};

// The reader's handler: the request's structure on a stack of frames, the
// key last read, and the inputs and outputs drafted so far.
class BodyReader : public rapidjson::BaseReaderHandler<rapidjson::UTF8<>, BodyReader> {
 public:
  explicit BodyReader(size_t max_tensor_bytes) : max_tensor_bytes_(max_tensor_bytes) {}

  absl::Status Run(absl::string_view json);
  bool needs_second_pass() const { return any_deferred_; }
  void StartSecondPass() {
    second_pass_ = true;
    next_input_ = 0;
    stack_.clear();
    started_ = false;
  }
  absl::StatusOr<JsonInferRequest> Finish(const std::vector<absl::string_view>& binary,
                                          std::shared_ptr<const void> binary_owner);

  // rapidjson's SAX events.
  bool Null() { return Value(Scalar{}); }
  bool Bool(bool b) { return Value(Scalar{.kind = Scalar::kBool, .b = b}); }
  bool Int(int i) { return Int64(i); }
  bool Uint(unsigned u) { return Uint64(u); }
  bool Int64(int64_t i) { return Value(Scalar{.kind = Scalar::kInt, .i = i}); }
  bool Uint64(uint64_t u) { return Value(Scalar{.kind = Scalar::kUint, .u = u}); }
  bool Double(double d) { return Value(Scalar{.kind = Scalar::kDouble, .d = d}); }
  bool RawNumber(const char* s, rapidjson::SizeType n, bool) {
    const absl::string_view text(s, n);
    std::optional<Scalar> v = NumberOf(text);
    if (!v.has_value()) {
      return Fail(absl::StrCat("the number ", text.substr(0, 32), " is out of range"));
    }
    return Value(*v);
  }
  bool String(const char* s, rapidjson::SizeType n, bool) {
    return Value(Scalar{.kind = Scalar::kString, .s = absl::string_view(s, n)});
  }
  bool Key(const char* s, rapidjson::SizeType n, bool) {
    key_.assign(s, n);
    return true;
  }
  bool StartObject();
  bool EndObject(rapidjson::SizeType);
  bool StartArray();
  bool EndArray(rapidjson::SizeType);

 private:
  bool Fail(const std::string& message) {
    if (error_.ok()) error_ = absl::InvalidArgumentError(message);
    return false;
  }
  bool Push(Frame frame) {
    if (stack_.size() >= kMaxDepth) return Fail("the request nests deeper than 32 levels");
    stack_.push_back(frame);
    return true;
  }
  InputDraft& input() { return inputs_[current_input_]; }
  std::string Label(const InputDraft& in) const;
  bool Value(const Scalar& v);
  bool TopValue(const Scalar& v);
  bool InputValue(const Scalar& v);
  bool OutputValue(const Scalar& v);
  bool ShapeValue(const Scalar& v);
  bool ParameterValue(const Scalar& v, const std::string& owner, Parameters* out);
  bool StartData();
  bool FinishData();
  bool FinishInput();
  // Checks the datatype and the shape (its bytes within the limit) and
  // makes room for the values; false (with the error) otherwise.
  bool Prepare(InputDraft& in);
  bool Append(const Scalar& v);
  template <typename T>
  bool PutInteger(InputDraft& in, const Scalar& v);
  template <typename T, typename Convert>
  bool PutFloat(InputDraft& in, const Scalar& v, Convert convert);

  const size_t max_tensor_bytes_;
  absl::Status error_;
  std::vector<Frame> stack_;
  std::string key_;
  bool started_ = false;
  bool second_pass_ = false;
  bool any_deferred_ = false;
  size_t data_depth_ = 0;    // arrays open inside the current `data`
  bool converting_ = false;  // the current `data`'s values are being read
  size_t next_input_ = 0;
  size_t current_input_ = 0;
  bool seen_id_ = false, seen_parameters_ = false, seen_inputs_ = false, seen_outputs_ = false;
  std::string id_;
  Parameters parameters_;
  bool binary_outputs_ = false;
  std::vector<InputDraft> inputs_;
  std::vector<OutputDraft> outputs_;
};

std::string BodyReader::Label(const InputDraft& in) const {
  if (in.has_name) return absl::StrCat("input '", in.name, "'");
  return absl::StrCat("input #", current_input_);
}

absl::Status BodyReader::Run(absl::string_view json) {
  rapidjson::MemoryStream stream(json.data(), json.size());
  rapidjson::Reader reader;
  // Numbers as their text, converted by NumberOf: correctly rounded, so an
  // FP64 input is the double its shortest decimal names (as a client's JSON
  // writer rounds it).
  constexpr unsigned kFlags =
      rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag |
      rapidjson::kParseNanAndInfFlag | rapidjson::kParseNumbersAsStringsFlag;
  rapidjson::ParseResult result = reader.Parse<kFlags>(stream, *this);
  if (!error_.ok()) return error_;
  if (result.IsError()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the request body is not valid JSON: %s (at byte %d)",
                        rapidjson::GetParseError_En(result.Code()), result.Offset()));
  }
  return absl::OkStatus();
}

bool BodyReader::Value(const Scalar& v) {
  if (stack_.empty()) return Fail("the request body must be a JSON object");
  switch (stack_.back()) {
    case Frame::kTop:
      return TopValue(v);
    case Frame::kTopParams:
      if (second_pass_) return true;
      if (key_ == "binary_data_output") {
        if (v.kind != Scalar::kBool)
          return Fail("request parameter 'binary_data_output' is a bool");
        binary_outputs_ = v.b;
        return true;
      }
      return ParameterValue(v, "request", &parameters_);
    case Frame::kInput:
      return InputValue(v);
    case Frame::kInputParams:
      if (second_pass_) return true;
      if (key_ == "binary_data_size") {
        if (input().binary_size >= 0)
          return Fail(Label(input()) + ": binary_data_size given twice");
        if (v.kind != Scalar::kUint ||
            v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Fail(absl::StrCat(Label(input()),
                                   ": binary_data_size must be a non-negative integer, got ",
                                   Describe(v)));
        }
        input().binary_size = static_cast<int64_t>(v.u);
        return true;
      }
      return ParameterValue(v, Label(input()), &input().parameters);
    case Frame::kShape:
      return ShapeValue(v);
    case Frame::kData:
      return !converting_ || Append(v);
    case Frame::kOutput:
      return OutputValue(v);
    case Frame::kOutputParams: {
      if (second_pass_) return true;
      OutputDraft& out = outputs_.back();
      const std::string owner = absl::StrCat("output '", out.name, "'");
      if (key_ == "binary_data") {
        if (v.kind != Scalar::kBool) return Fail(owner + ": parameter 'binary_data' is a bool");
        out.binary = v.b;
        return true;
      }
      if (key_ == "classification") {
        return Fail(owner + ": the classification extension is not supported");
      }
      return ParameterValue(v, owner, &out.parameters);
    }
    case Frame::kInputs:
      return Fail("each entry of 'inputs' must be an object");
    case Frame::kOutputs:
      return Fail("each entry of 'outputs' must be an object");
  }
  return Fail("unexpected value");
}

bool BodyReader::TopValue(const Scalar& v) {
  if (key_ == "id") {
    if (v.kind != Scalar::kString) return Fail("'id' must be a string");
    if (second_pass_) return true;
    if (seen_id_) return Fail("'id' is given twice");
    seen_id_ = true;
    id_ = std::string(v.s);
    return true;
  }
  if (key_ == "inputs" || key_ == "outputs") return Fail(absl::StrCat("'", key_, "' is an array"));
  if (key_ == "parameters") return Fail("'parameters' is an object");
  return Fail(absl::StrCat("unknown field '", key_,
                           "' in the request (it may have id, parameters, inputs, outputs)"));
}

bool BodyReader::InputValue(const Scalar& v) {
  InputDraft& in = input();
  if (key_ == "name" || key_ == "datatype") {
    if (v.kind != Scalar::kString)
      return Fail(absl::StrCat(Label(in), ": '", key_, "' is a string"));
    if (second_pass_) return true;
    bool& has = key_ == "name" ? in.has_name : in.has_datatype;
    if (has) return Fail(absl::StrCat(Label(in), ": '", key_, "' is given twice"));
    has = true;
    (key_ == "name" ? in.name : in.datatype) = std::string(v.s);
    return true;
  }
  if (key_ == "shape" || key_ == "data") {
    return Fail(absl::StrCat(Label(in), ": '", key_, "' is an array"));
  }
  if (key_ == "parameters") return Fail(absl::StrCat(Label(in), ": 'parameters' is an object"));
  return Fail(absl::StrCat(Label(in), ": unknown field '", key_,
                           "' (an input has name, datatype, shape, parameters, data)"));
}

bool BodyReader::OutputValue(const Scalar& v) {
  OutputDraft& out = outputs_.back();
  if (key_ == "name") {
    if (v.kind != Scalar::kString) return Fail("an output's 'name' is a string");
    if (second_pass_) return true;
    if (out.has_name) return Fail("an output's 'name' is given twice");
    out.has_name = true;
    out.name = std::string(v.s);
    return true;
  }
  return Fail(
      absl::StrCat("unknown field '", key_, "' in an output (an output has name and parameters)"));
}

bool BodyReader::ShapeValue(const Scalar& v) {
  if (second_pass_) return true;
  InputDraft& in = input();
  if (v.kind == Scalar::kInt) {
    return Fail(absl::StrCat(Label(in), ": shape dim ", v.i, " is negative"));
  }
  if (v.kind != Scalar::kUint || v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Fail(
        absl::StrCat(Label(in), ": shape dims are non-negative integers, got ", Describe(v)));
  }
  if (in.shape.size() >= kMaxRank) {
    return Fail(absl::StrCat(Label(in), ": shape has more than ", kMaxRank, " dims"));
  }
  in.shape.push_back(static_cast<int64_t>(v.u));
  return true;
}

bool BodyReader::ParameterValue(const Scalar& v, const std::string& owner, Parameters* out) {
  if (out->count(key_) > 0)
    return Fail(absl::StrCat(owner, ": parameter '", key_, "' given twice"));
  inference::InferParameter& p = (*out)[key_];
  switch (v.kind) {
    case Scalar::kBool:
      p.set_bool_param(v.b);
      return true;
    case Scalar::kInt:
      p.set_int64_param(v.i);
      return true;
    case Scalar::kUint:
      if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        p.set_uint64_param(v.u);
      } else {
        p.set_int64_param(static_cast<int64_t>(v.u));
      }
      return true;
    case Scalar::kDouble:
      p.set_double_param(v.d);
      return true;
    case Scalar::kString:
      p.set_string_param(std::string(v.s));
      return true;
    case Scalar::kNull:
      break;
  }
  return Fail(absl::StrCat(owner, ": parameter '", key_, "' is null"));
}

bool BodyReader::StartObject() {
  if (stack_.empty()) {
    if (started_) return Fail("the request body holds more than one JSON value");
    started_ = true;
    return Push(Frame::kTop);
  }
  switch (stack_.back()) {
    case Frame::kTop:
      if (key_ != "parameters") break;
      if (!second_pass_ && seen_parameters_) return Fail("'parameters' is given twice");
      seen_parameters_ = true;
      return Push(Frame::kTopParams);
    case Frame::kInputs:
      if (!second_pass_) inputs_.emplace_back();
      current_input_ = next_input_++;
      return Push(Frame::kInput);
    case Frame::kInput:
      if (key_ != "parameters") break;
      return Push(Frame::kInputParams);
    case Frame::kOutputs:
      if (!second_pass_) outputs_.emplace_back();
      return Push(Frame::kOutput);
    case Frame::kOutput:
      if (key_ != "parameters") break;
      return Push(Frame::kOutputParams);
    default:
      break;
  }
  if (stack_.back() == Frame::kData) return Fail(Label(input()) + ": 'data' holds an object");
  return Fail(absl::StrCat("'", key_, "' must not be an object here"));
}

bool BodyReader::EndObject(rapidjson::SizeType) {
  const Frame frame = stack_.back();
  stack_.pop_back();
  if (frame == Frame::kInput && !second_pass_) return FinishInput();
  if (frame == Frame::kOutput && !second_pass_ && !outputs_.back().has_name) {
    return Fail("an output has no 'name'");
  }
  return true;
}

bool BodyReader::StartArray() {
  if (stack_.empty()) return Fail("the request body must be a JSON object");
  switch (stack_.back()) {
    case Frame::kTop:
      if (key_ == "inputs" || key_ == "outputs") {
        bool& seen = key_ == "inputs" ? seen_inputs_ : seen_outputs_;
        if (!second_pass_ && seen) return Fail(absl::StrCat("'", key_, "' is given twice"));
        seen = true;
        return Push(key_ == "inputs" ? Frame::kInputs : Frame::kOutputs);
      }
      break;
    case Frame::kInput:
      if (key_ == "shape") {
        if (!second_pass_ && input().has_shape)
          return Fail(Label(input()) + ": two 'shape' fields");
        input().has_shape = true;
        return Push(Frame::kShape);
      }
      if (key_ == "data") return StartData() && Push(Frame::kData);
      break;
    case Frame::kData:
      if (++data_depth_ + stack_.size() > kMaxDepth) {
        return Fail("the request nests deeper than 32 levels");
      }
      return true;
    default:
      break;
  }
  return Fail(absl::StrCat("'", key_, "' must not be an array here"));
}

bool BodyReader::EndArray(rapidjson::SizeType) {
  if (stack_.back() == Frame::kData && data_depth_ > 1) {
    --data_depth_;
    return true;
  }
  const Frame frame = stack_.back();
  stack_.pop_back();
  return frame != Frame::kData || FinishData();
}

bool BodyReader::StartData() {
  InputDraft& in = input();
  data_depth_ = 1;
  if (second_pass_) {
    converting_ = in.deferred;
    return true;
  }
  if (in.has_data) return Fail(Label(in) + ": 'data' is given twice");
  in.has_data = true;
  if (in.has_datatype && in.has_shape) {
    converting_ = true;
    return Prepare(in);
  }
  // Read again once the datatype and shape are known.
  in.deferred = true;
  any_deferred_ = true;
  converting_ = false;
  return true;
}

bool BodyReader::FinishData() {
  data_depth_ = 0;
  if (!converting_) return true;
  converting_ = false;
  const InputDraft& in = input();
  if (in.count != in.elements) {
    return Fail(absl::StrFormat("%s: shape [%s] holds %d values, 'data' has %d", Label(in),
                                absl::StrJoin(in.shape, ","), in.elements, in.count));
  }
  return true;
}

bool BodyReader::FinishInput() {
  InputDraft& in = input();
  if (!in.has_name) return Fail(Label(in) + " has no 'name'");
  if (!in.has_datatype) return Fail(Label(in) + " has no 'datatype'");
  if (!in.has_shape) return Fail(Label(in) + " has no 'shape'");
  if (in.has_data == (in.binary_size >= 0)) {
    return Fail(Label(in) + " needs either 'data' or parameters.binary_data_size (one of them)");
  }
  return in.prepared || Prepare(in);
}

bool BodyReader::Prepare(InputDraft& in) {
  in.prepared = true;
  in.bytes = in.datatype == "BYTES";
  in.type = engine::DataTypeFromName(in.datatype);
  if (!in.bytes && in.type == engine::DataType::kUnknown) {
    return Fail(absl::StrCat(Label(in), ": unknown datatype '", in.datatype,
                             "' (BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, "
                             "FP16, BF16, FP32, FP64, BYTES)"));
  }
  // BYTES elements take at least their 4-byte length each.
  const int64_t element_bytes = in.bytes ? 4 : static_cast<int64_t>(engine::DataTypeSize(in.type));
  const int64_t max_elements = static_cast<int64_t>(max_tensor_bytes_) / element_bytes;
  int64_t elements = 1;
  for (int64_t d : in.shape) {
    if (d > 0 && elements > max_elements / d) {
      return Fail(absl::StrFormat("%s: shape [%s] of %s needs more than the %d-byte limit",
                                  Label(in), absl::StrJoin(in.shape, ","), in.datatype,
                                  max_tensor_bytes_));
    }
    elements *= d;
  }
  in.elements = elements;
  if (in.has_data && !in.bytes) in.raw.reserve(static_cast<size_t>(elements * element_bytes));
  return true;
}

template <typename T>
bool BodyReader::PutInteger(InputDraft& in, const Scalar& v) {
  bool fits = false;
  if (v.kind == Scalar::kInt) fits = std::in_range<T>(v.i);
  if (v.kind == Scalar::kUint) fits = std::in_range<T>(v.u);
  if (!fits) {
    using Wide = std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>;
    return Fail(absl::StrFormat("%s (%s): data[%d] = %s is not an integer in %s's range [%d, %d]",
                                Label(in), in.datatype, in.count, Describe(v), in.datatype,
                                Wide{std::numeric_limits<T>::min()},
                                Wide{std::numeric_limits<T>::max()}));
  }
  const T value = v.kind == Scalar::kInt ? static_cast<T>(v.i) : static_cast<T>(v.u);
  in.raw.append(reinterpret_cast<const char*>(&value), sizeof value);
  return true;
}

template <typename T, typename Convert>
bool BodyReader::PutFloat(InputDraft& in, const Scalar& v, Convert convert) {
  double x = 0;
  if (v.kind == Scalar::kInt) {
    x = static_cast<double>(v.i);
  } else if (v.kind == Scalar::kUint) {
    x = static_cast<double>(v.u);
  } else if (v.kind == Scalar::kDouble) {
    x = v.d;
  } else {
    return Fail(
        absl::StrFormat("%s (%s): data[%d] is %s; %s values are numbers (or NaN, "
                        "Infinity, -Infinity)",
                        Label(in), in.datatype, in.count, Describe(v), in.datatype));
  }
  const T value = convert(x);
  in.raw.append(reinterpret_cast<const char*>(&value), sizeof value);
  return true;
}

bool BodyReader::Append(const Scalar& v) {
  InputDraft& in = input();
  if (in.count >= in.elements) {
    return Fail(absl::StrFormat("%s: shape [%s] holds %d values, 'data' has more", Label(in),
                                absl::StrJoin(in.shape, ","), in.elements));
  }
  bool ok = true;
  if (in.bytes) {
    if (v.kind != Scalar::kString) {
      return Fail(absl::StrFormat("%s (BYTES): data[%d] is %s; BYTES values are strings", Label(in),
                                  in.count, Describe(v)));
    }
    const auto length = static_cast<uint32_t>(v.s.size());
    in.raw.append(reinterpret_cast<const char*>(&length), sizeof length);
    in.raw.append(v.s.data(), v.s.size());
  } else {
    using engine::DataType;
    switch (in.type) {
      case DataType::kBool:
        if (v.kind != Scalar::kBool) {
          return Fail(absl::StrFormat("%s (BOOL): data[%d] is %s; BOOL values are true or false",
                                      Label(in), in.count, Describe(v)));
        }
        in.raw.push_back(v.b ? 1 : 0);
        break;
      case DataType::kUint8:
        ok = PutInteger<uint8_t>(in, v);
        break;
      case DataType::kInt8:
        ok = PutInteger<int8_t>(in, v);
        break;
      case DataType::kInt16:
        ok = PutInteger<int16_t>(in, v);
        break;
      case DataType::kUint16:
        ok = PutInteger<uint16_t>(in, v);
        break;
      case DataType::kInt32:
        ok = PutInteger<int32_t>(in, v);
        break;
      case DataType::kUint32:
        ok = PutInteger<uint32_t>(in, v);
        break;
      case DataType::kInt64:
        ok = PutInteger<int64_t>(in, v);
        break;
      case DataType::kUint64:
        ok = PutInteger<uint64_t>(in, v);
        break;
      case DataType::kFloat16:
        ok = PutFloat<uint16_t>(
            in, v, [](double x) { return engine::FloatToHalf(static_cast<float>(x)); });
        break;
      case DataType::kBFloat16:
        ok = PutFloat<uint16_t>(
            in, v, [](double x) { return engine::FloatToBFloat16(static_cast<float>(x)); });
        break;
      case DataType::kFloat32:
        ok = PutFloat<float>(in, v, [](double x) { return static_cast<float>(x); });
        break;
      case DataType::kFloat64:
        ok = PutFloat<double>(in, v, [](double x) { return x; });
        break;
      case DataType::kUnknown:
        return Fail(Label(in) + ": unknown datatype");
    }
  }
  ++in.count;
  return ok;
}

// What a parsed request's input bytes live in: the values converted from
// JSON, and the body's binary part.
struct JsonInputBuffers {
  std::deque<std::string> converted;  // stable addresses as it grows
  std::shared_ptr<const void> binary_owner;
};

// Bytes [at, at + size) of `pieces` laid end to end (within them).
InputBytes Range(const std::vector<absl::string_view>& pieces, size_t at, size_t size) {
  InputBytes out;
  for (absl::string_view piece : pieces) {
    if (size == 0) break;
    if (at >= piece.size()) {
      at -= piece.size();
      continue;
    }
    const size_t n = std::min(size, piece.size() - at);
    out.Add({piece.data() + at, n});
    at = 0;
    size -= n;
  }
  return out;
}

absl::StatusOr<JsonInferRequest> BodyReader::Finish(const std::vector<absl::string_view>& binary,
                                                    std::shared_ptr<const void> binary_owner) {
  if (!seen_inputs_) return absl::InvalidArgumentError("the request has no 'inputs'");
  size_t binary_size = 0;
  for (absl::string_view piece : binary) binary_size += piece.size();
  JsonInferRequest out;
  size_t cursor = 0;
  for (InputDraft& in : inputs_) {
    if (in.binary_size < 0) continue;
    const auto size = static_cast<uint64_t>(in.binary_size);
    if (size > binary_size - cursor) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "input '%s': binary_data_size %d runs past the end of the body (%d bytes of binary "
          "data left)",
          in.name, size, binary_size - cursor));
    }
    if (!in.bytes && size != static_cast<uint64_t>(in.elements) * engine::DataTypeSize(in.type)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "input '%s': shape [%s] of %s needs %d bytes, binary_data_size is %d", in.name,
          absl::StrJoin(in.shape, ","), in.datatype,
          static_cast<uint64_t>(in.elements) * engine::DataTypeSize(in.type), size));
    }
    in.binary_at = cursor;
    cursor += size;
  }
  if (cursor != binary_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d bytes of binary data follow the JSON, the inputs' binary_data_size "
                        "account for %d",
                        binary_size, cursor));
  }
  auto buffers = std::make_shared<JsonInputBuffers>();
  buffers->binary_owner = std::move(binary_owner);
  auto inputs = std::make_shared<TransportInputs>();
  for (InputDraft& in : inputs_) {
    if (in.binary_size >= 0) {
      inputs->inputs.push_back(Range(binary, in.binary_at, static_cast<size_t>(in.binary_size)));
    } else {
      const std::string& bytes = buffers->converted.emplace_back(std::move(in.raw));
      inputs->inputs.emplace_back().Add({bytes.data(), bytes.size()});
    }
  }
  inputs->owner = std::move(buffers);
  out.inputs = std::move(inputs);
  inference::ModelInferRequest& request = out.request;
  request.set_id(id_);
  *request.mutable_parameters() = std::move(parameters_);
  for (InputDraft& in : inputs_) {
    auto* tensor = request.add_inputs();
    tensor->set_name(in.name);
    tensor->set_datatype(in.datatype);
    for (int64_t d : in.shape) tensor->add_shape(d);
    *tensor->mutable_parameters() = std::move(in.parameters);
  }
  for (OutputDraft& o : outputs_) {
    auto* tensor = request.add_outputs();
    tensor->set_name(o.name);
    *tensor->mutable_parameters() = std::move(o.parameters);
    if (o.binary.has_value()) out.output_binary[o.name] = *o.binary;
  }
  out.binary_outputs = binary_outputs_;
  return out;
}

}  // namespace

absl::StatusOr<JsonInferRequest> ParseJsonInferRequest(absl::string_view json,
                                                       const std::vector<absl::string_view>& binary,
                                                       std::shared_ptr<const void> binary_owner,
                                                       size_t max_tensor_bytes) {
  BodyReader reader(max_tensor_bytes);
  if (absl::Status s = reader.Run(json); !s.ok()) return s;
  if (reader.needs_second_pass()) {
    reader.StartSecondPass();
    if (absl::Status s = reader.Run(json); !s.ok()) return s;
  }
  return reader.Finish(binary, std::move(binary_owner));
}

absl::StatusOr<JsonInferRequest> ParseJsonInferRequest(absl::string_view json,
                                                       absl::string_view binary,
                                                       size_t max_tensor_bytes) {
  std::vector<absl::string_view> pieces;
  if (!binary.empty()) pieces.push_back(binary);
  return ParseJsonInferRequest(json, pieces, nullptr, max_tensor_bytes);
}

}  // namespace numaserve::serving::http
