#include "serving/http/http_status.h"

#include <cstdint>

#include "serving/http/rapidjson.h"

namespace numaserve::serving::http {

HttpStatus HttpStatusFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return {200, ReasonPhrase(200)};
    case absl::StatusCode::kCancelled:
      return {499, ReasonPhrase(499)};
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return {400, ReasonPhrase(400)};
    case absl::StatusCode::kDeadlineExceeded:
      return {504, ReasonPhrase(504)};
    case absl::StatusCode::kNotFound:
      return {404, ReasonPhrase(404)};
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return {409, ReasonPhrase(409)};
    case absl::StatusCode::kPermissionDenied:
      return {403, ReasonPhrase(403)};
    case absl::StatusCode::kUnauthenticated:
      return {401, ReasonPhrase(401)};
    case absl::StatusCode::kResourceExhausted:
      return {429, ReasonPhrase(429)};
    case absl::StatusCode::kUnimplemented:
      return {501, ReasonPhrase(501)};
    case absl::StatusCode::kUnavailable:
      return {503, ReasonPhrase(503)};
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    default:
      return {500, ReasonPhrase(500)};
  }
}

const char* ReasonPhrase(int code) {
  switch (code) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 409:
      return "Conflict";
    case 413:
      return "Content Too Large";
    case 429:
      return "Too Many Requests";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "Unknown";
  }
}

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    size_t extra = 0;
    uint32_t code_point = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1;
      code_point = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      code_point = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      code_point = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= text.size()) return false;  // cut short
    for (size_t k = 1; k <= extra; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    // Overlong forms, UTF-16 surrogates and values past U+10FFFF.
    static constexpr uint32_t kLeast[] = {0, 0x80, 0x800, 0x10000};
    if (code_point < kLeast[extra] || (code_point >= 0xD800 && code_point <= 0xDFFF) ||
        code_point > 0x10FFFF) {
      return false;
    }
    i += extra + 1;
  }
  return true;
}

std::string ErrorBody(absl::string_view message) {
  // A message quoting bytes a client sent that are not UTF-8 still makes
  // valid JSON: such bytes become '?'.
  std::string text(message);
  if (!IsValidUtf8(text)) {
    for (char& c : text) {
      if (static_cast<unsigned char>(c) >= 0x80) c = '?';
    }
  }
  message = text;
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  writer.StartObject();
  writer.Key("error");
  writer.String(message.data(), static_cast<rapidjson::SizeType>(message.size()));
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

}  // namespace numaserve::serving::http
