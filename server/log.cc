#include "server/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "kernels/dispatch.h"

#ifndef NUMASERVE_VERSION
#define NUMASERVE_VERSION "unknown"
#endif
#ifndef NUMASERVE_GIT_REVISION
#define NUMASERVE_GIT_REVISION "unknown"
#endif

namespace numaserve::server {
namespace {

constexpr char kFormatVariable[] = "NUMASERVE_LOG_FORMAT";
constexpr char kLevelVariable[] = "NUMASERVE_LOG_LEVEL";

// The process's logger: options (atomics, read on every record), and the
// sink and clock tests replace.
struct Logger {
  std::atomic<LogFormat> format{LogFormat::kText};
  std::atomic<LogLevel> level{LogLevel::kInfo};
  std::mutex mu;  // one record written at a time; guards the two below
  std::function<void(absl::string_view)> sink;
  std::function<absl::Time()> clock;
};

Logger& TheLogger() {
  static Logger* logger = [] {
    auto* l = new Logger;
    // Children (workers, trainers) start with what their parent configured.
    if (const char* f = getenv(kFormatVariable); f != nullptr) {
      if (auto format = ParseLogFormat(f); format.ok()) l->format = *format;
    }
    if (const char* v = getenv(kLevelVariable); v != nullptr) {
      if (auto level = ParseLogLevel(v); level.ok()) l->level = *level;
    }
    return l;
  }();
  return *logger;
}

void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report a failing stderr
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void Emit(Logger& logger, LogFormat format, LogLevel level, absl::string_view component,
          absl::string_view message, std::initializer_list<LogField> fields) {
  std::lock_guard<std::mutex> lock(logger.mu);
  const absl::Time now = logger.clock ? logger.clock() : absl::Now();
  const std::string line = FormatLogLine(format, now, level, component, message, fields);
  if (logger.sink) {
    logger.sink(line);
  } else {
    WriteAll(STDERR_FILENO, line);
  }
}

// The length of the valid UTF-8 sequence starting TEXT, or 0 when it is not one.
size_t Utf8SequenceLength(absl::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  uint32_t min = 0;
  uint32_t code = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, min = 0x80, code = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, min = 0x800, code = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, min = 0x10000, code = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i) & 0x3F);
  }
  // Overlong forms, UTF-16 surrogates and beyond U+10FFFF are not UTF-8.
  if (code < min || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return length;
}

}  // namespace

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown log level '", name, "' (debug | info | warning | error)"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "text") return LogFormat::kText;
  if (lower == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(absl::StrCat("unknown log format '", name, "' (text | json)"));
}

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

const char* LogFormatName(LogFormat format) { return format == LogFormat::kJson ? "json" : "text"; }

LogField::LogField(absl::string_view key, absl::string_view value) : key_(key) {
  AppendJsonString(&json_, value);
}

LogField::LogField(absl::string_view key, bool value)
    : key_(key), json_(value ? "true" : "false") {}

LogField::LogField(absl::string_view key, double value) : key_(key) {
  // JSON has no NaN or infinity.
  json_ = std::isfinite(value) ? absl::StrCat(value) : "null";
}

void AppendJsonString(std::string* out, absl::string_view text) {
  out->push_back('"');
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      const size_t length = Utf8SequenceLength(text.substr(i));
      if (length == 0) {
        out->append("\xEF\xBF\xBD");  // U+FFFD for a byte that is not UTF-8
        ++i;
      } else {
        out->append(text.data() + i, length);
        i += length;
      }
      continue;
    }
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          char escaped[8];
          snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out->append(escaped);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
    ++i;
  }
  out->push_back('"');
}

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view component, absl::string_view message,
                          std::initializer_list<LogField> fields) {
  if (format == LogFormat::kText) {
    std::string line = absl::StrCat("numaserve: ", message);
    // One record, one line, whatever the message holds.
    for (char& c : line) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    line.push_back('\n');
    return line;
  }
  std::string line = "{\"ts\":";
  AppendJsonString(&line, absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()));
  absl::StrAppend(&line, ",\"level\":\"", LogLevelName(level), "\",\"component\":");
  AppendJsonString(&line, component);
  line.append(",\"msg\":");
  AppendJsonString(&line, message);
  for (const LogField& field : fields) {
    line.push_back(',');
    AppendJsonString(&line, field.key());
    line.push_back(':');
    line.append(field.json());
  }
  line.append("}\n");
  return line;
}

void ConfigureLog(const LogOptions& options) {
  Logger& logger = TheLogger();
  logger.format = options.format;
  logger.level = options.level;
  setenv(kFormatVariable, LogFormatName(options.format), 1);
  setenv(kLevelVariable, LogLevelName(options.level), 1);
}

LogOptions CurrentLogOptions() {
  Logger& logger = TheLogger();
  return {logger.format.load(), logger.level.load()};
}

bool LogEnabled(LogLevel level) { return level >= TheLogger().level.load(); }

void Log(LogLevel level, absl::string_view component, absl::string_view message,
         std::initializer_list<LogField> fields) {
  Logger& logger = TheLogger();
  if (level < logger.level.load()) return;
  Emit(logger, logger.format.load(), level, component, message, fields);
}

void LogBlock(LogLevel level, absl::string_view component, absl::string_view text) {
  Logger& logger = TheLogger();
  if (level < logger.level.load()) return;
  if (logger.format.load() == LogFormat::kText) {
    std::lock_guard<std::mutex> lock(logger.mu);
    if (logger.sink) {
      logger.sink(text);
    } else {
      WriteAll(STDERR_FILENO, text);
    }
    return;
  }
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    Emit(logger, LogFormat::kJson, level, component, absl::StripTrailingAsciiWhitespace(line), {});
  }
}

void SetLogSinkForTesting(std::function<void(absl::string_view line)> sink,
                          std::function<absl::Time()> clock) {
  Logger& logger = TheLogger();
  std::lock_guard<std::mutex> lock(logger.mu);
  logger.sink = std::move(sink);
  logger.clock = std::move(clock);
}

const char* BuildVersion() { return NUMASERVE_VERSION; }
const char* BuildRevision() { return NUMASERVE_GIT_REVISION; }

std::string VersionText() {
  return absl::StrCat("numaserve ", BuildVersion(), " (git ", BuildRevision(), ", isa ",
                      kernels::IsaDescription(), ")");
}

}  // namespace numaserve::server
