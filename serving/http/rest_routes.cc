#include "serving/http/rest_routes.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "serving/http/http_status.h"

namespace numaserve::serving::http {
namespace {

absl::Status NoSuchPath() { return absl::NotFoundError("no such path (docs/api.md lists them)"); }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A model or version name from the path: decoded, UTF-8, without NUL.
absl::StatusOr<std::string> Name(absl::string_view what, absl::string_view segment) {
  absl::StatusOr<std::string> decoded = PercentDecode(segment);
  if (!decoded.ok()) return decoded.status();
  if (decoded->empty()) return absl::NotFoundError(absl::StrCat("empty ", what, " in the path"));
  if (decoded->find('\0') != std::string::npos || !IsValidUtf8(*decoded)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " in the path is not UTF-8 text without NUL"));
  }
  return decoded;
}

// /v2/models/M[/versions/V][/ACTION]: `rest` is what follows "models".
absl::StatusOr<Route> ModelRoute(const std::vector<absl::string_view>& rest) {
  Route route;
  size_t next = 1;
  absl::StatusOr<std::string> model = Name("model name", rest[0]);
  if (!model.ok()) return model.status();
  route.model = *std::move(model);
  if (rest.size() >= 3 && rest[1] == "versions") {
    absl::StatusOr<std::string> version = Name("model version", rest[2]);
    if (!version.ok()) return version.status();
    route.version = *std::move(version);
    next = 3;
  }
  if (rest.size() == next) {
    route.kind = Route::Kind::kModelMetadata;
    return route;
  }
  if (rest.size() == next + 1) {
    const absl::string_view action = rest[next];
    if (action == "ready" || action == "config" || action == "stats" || action == "infer") {
      route.kind = action == "ready"    ? Route::Kind::kModelReady
                   : action == "config" ? Route::Kind::kModelConfig
                   : action == "stats"  ? Route::Kind::kModelStats
                                        : Route::Kind::kInfer;
      if (route.kind == Route::Kind::kInfer) route.method = "POST";
      return route;
    }
  }
  return absl::NotFoundError("no such path");
}

}  // namespace

absl::StatusOr<std::string> PercentDecode(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    const int high = i + 2 < text.size() ? HexValue(text[i + 1]) : -1;
    const int low = i + 2 < text.size() ? HexValue(text[i + 2]) : -1;
    if (high < 0 || low < 0) {
      return absl::InvalidArgumentError("a '%' in the path is not followed by two hex digits");
    }
    out.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return out;
}

absl::StatusOr<Route> MatchRoute(absl::string_view path) {
  if (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  if (parts.size() < 2 || !parts[0].empty() || parts[1] != "v2") return NoSuchPath();
  parts.erase(parts.begin(), parts.begin() + 2);
  Route route;
  if (parts.empty()) {
    route.kind = Route::Kind::kServerMetadata;
    return route;
  }
  if (parts.size() == 2 && parts[0] == "health" && (parts[1] == "live" || parts[1] == "ready")) {
    route.kind = parts[1] == "live" ? Route::Kind::kLive : Route::Kind::kReady;
    return route;
  }
  if (parts[0] == "models" && parts.size() == 2 && parts[1] == "stats") {
    route.kind = Route::Kind::kModelStats;
    return route;
  }
  if (parts[0] == "models" && parts.size() >= 2) {
    absl::StatusOr<Route> model = ModelRoute({parts.begin() + 1, parts.end()});
    if (!model.ok() && absl::IsNotFound(model.status())) return NoSuchPath();
    return model;
  }
  route.method = "POST";
  if (parts.size() == 2 && parts[0] == "repository" && parts[1] == "index") {
    route.kind = Route::Kind::kRepositoryIndex;
    return route;
  }
  if (parts.size() == 4 && parts[0] == "repository" && parts[1] == "models" &&
      (parts[3] == "load" || parts[3] == "unload")) {
    absl::StatusOr<std::string> model = Name("model name", parts[2]);
    if (!model.ok()) return absl::IsNotFound(model.status()) ? NoSuchPath() : model.status();
    route.model = *std::move(model);
    route.kind = parts[3] == "load" ? Route::Kind::kLoad : Route::Kind::kUnload;
    return route;
  }
  return NoSuchPath();
}

}  // namespace numaserve::serving::http
