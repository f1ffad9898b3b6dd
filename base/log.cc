#include "base/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/mutex.h"

namespace numaserve::base {
namespace {

// The process's logger: options (atomics, read on every record), and the
// sink and clock tests replace.
struct Logger {
  std::atomic<LogFormat> format{LogFormat::kText};
  std::atomic<LogLevel> level{LogLevel::kInfo};
  base::Mutex mu;  // one record written at a time
  std::function<void(absl::string_view)> sink ABSL_GUARDED_BY(mu);
  std::function<absl::Time()> clock ABSL_GUARDED_BY(mu);
  std::vector<LogField> context ABSL_GUARDED_BY(mu);  // SetLogContext
};

Logger& TheLogger() {
  static Logger* logger = new Logger;  // never destroyed: records at exit still find it
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
          absl::string_view message, absl::Span<const LogField> fields) {
  base::MutexLock lock(&logger.mu);
  const absl::Time now = logger.clock ? logger.clock() : absl::Now();
  std::vector<LogField> with_context;
  if (format == LogFormat::kJson && !logger.context.empty()) {
    with_context.assign(fields.begin(), fields.end());
    for (const LogField& c : logger.context) {
      const bool own = std::any_of(fields.begin(), fields.end(),
                                   [&](const LogField& f) { return f.key() == c.key(); });
      if (!own) with_context.push_back(c);
    }
    fields = with_context;
  }
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

bool IsUtf8(absl::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t length = Utf8SequenceLength(text.substr(i));
    if (length == 0) return false;
    i += length;
  }
  return true;
}

namespace {

void AppendUtf8(std::string* out, uint32_t code) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

// A cursor over one line of JSON, reading what a record holds (ParseLogLine):
// strings, numbers, true, false and null; no nested objects or arrays.
class JsonReader {
 public:
  explicit JsonReader(absl::string_view text) : text_(text) {}

  bool Consume(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }
  bool AtString() {
    SkipSpace();
    return pos_ < text_.size() && text_[pos_] == '"';
  }

  // A string literal, decoded.
  bool String(std::string* out) {
    if (!Consume('"')) return false;
    out->clear();
    while (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;  // control characters come escaped
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (pos_ >= text_.size()) return false;
      switch (text_[pos_++]) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t code = 0;
          if (!Hex4(&code)) return false;
          if (code >= 0xD800 && code <= 0xDBFF) {
            // A high surrogate takes the low one after it.
            uint32_t low = 0;
            if (text_.substr(pos_, 2) != "\\u") return false;
            pos_ += 2;
            if (!Hex4(&low) || low < 0xDC00 || low > 0xDFFF) return false;
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          } else if (code >= 0xDC00 && code <= 0xDFFF) {
            return false;
          }
          AppendUtf8(out, code);
          break;
        }
        default:
          return false;
      }
    }
    return false;  // no closing quote
  }

  // A number, true, false or null: its text.
  bool Literal(absl::string_view* out) {
    SkipSpace();
    const size_t start = pos_;
    for (absl::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        *out = text_.substr(start, word.size());
        return true;
      }
    }
    // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    Accept("-");
    if (Accept("0")) {
    } else if (Digits() == 0) {
      return false;
    }
    if (Accept(".") && Digits() == 0) return false;
    if (Accept("eE")) {
      Accept("+-");
      if (Digits() == 0) return false;
    }
    *out = text_.substr(start, pos_ - start);
    return true;
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\r' || text_[pos_] == '\n')) {
      ++pos_;
    }
  }
  // One of CHARS, if next.
  bool Accept(absl::string_view chars) {
    if (pos_ < text_.size() && chars.find(text_[pos_]) != absl::string_view::npos) {
      ++pos_;
      return true;
    }
    return false;
  }
  size_t Digits() {
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ - start;
  }
  bool Hex4(uint32_t* code) {
    if (pos_ + 4 > text_.size()) return false;
    *code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      int digit = 0;
      if (c >= '0' && c <= '9') {
        digit = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        digit = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        digit = c - 'A' + 10;
      } else {
        return false;
      }
      *code = (*code << 4) | static_cast<uint32_t>(digit);
    }
    return true;
  }

  const absl::string_view text_;
  size_t pos_ = 0;
};

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

LogField LogField::Json(absl::string_view key, absl::string_view json) {
  LogField field;
  field.key_ = std::string(key);
  field.json_ = std::string(json);
  return field;
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

std::string JsonString(absl::string_view text) {
  std::string out;
  AppendJsonString(&out, text);
  return out;
}

std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view component, absl::string_view message,
                          absl::Span<const LogField> fields) {
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

absl::StatusOr<LogRecord> ParseLogLine(absl::string_view line) {
  const auto bad = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("not a log record: ", why));
  };
  JsonReader in(line);
  if (!in.Consume('{')) return bad("not a JSON object");
  LogRecord record;
  bool have_ts = false, have_level = false, have_component = false, have_msg = false;
  if (!in.Consume('}')) {
    do {
      std::string key;
      if (!in.String(&key)) return bad("a key is not a string");
      if (!in.Consume(':')) return bad(absl::StrCat("no ':' after \"", key, "\""));
      if (key == "ts" || key == "level" || key == "component" || key == "msg") {
        std::string value;
        if (!in.String(&value)) return bad(absl::StrCat("\"", key, "\" is not a string"));
        if (key == "ts") {
          record.ts = std::move(value);
          have_ts = true;
        } else if (key == "level") {
          absl::StatusOr<LogLevel> level = ParseLogLevel(value);
          if (!level.ok()) return bad(level.status().message());
          record.level = *level;
          have_level = true;
        } else if (key == "component") {
          record.component = std::move(value);
          have_component = true;
        } else {
          record.message = std::move(value);
          have_msg = true;
        }
      } else if (in.AtString()) {
        std::string value;
        if (!in.String(&value)) return bad(absl::StrCat("\"", key, "\" is not a JSON string"));
        record.fields.emplace_back(key, value);  // re-encoded: valid UTF-8 whatever came
      } else {
        absl::string_view value;
        if (!in.Literal(&value)) {
          return bad(absl::StrCat("\"", key, "\" is not a string, number, true, false or null"));
        }
        record.fields.push_back(LogField::Json(key, value));
      }
    } while (in.Consume(','));
    if (!in.Consume('}')) return bad("no closing '}'");
  }
  if (!in.AtEnd()) return bad("text after the object");
  if (!have_ts || !have_level || !have_component || !have_msg) {
    return bad("ts, level, component and msg are required");
  }
  return record;
}

void ConfigureLog(const LogOptions& options) {
  Logger& logger = TheLogger();
  logger.format = options.format;
  logger.level = options.level;
}

LogOptions CurrentLogOptions() {
  Logger& logger = TheLogger();
  return {logger.format.load(), logger.level.load()};
}

absl::StatusOr<LogOptions> LogOptionsFromFlags(absl::string_view format_name,
                                               absl::string_view level_name) {
  absl::StatusOr<LogFormat> format = ParseLogFormat(format_name);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-format: ", format.status().message()));
  }
  absl::StatusOr<LogLevel> level = ParseLogLevel(level_name);
  if (!level.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-level: ", level.status().message()));
  }
  return LogOptions{*format, *level};
}

bool LogEnabled(LogLevel level) { return level >= TheLogger().level.load(); }

void SetLogContext(std::vector<LogField> fields) {
  Logger& logger = TheLogger();
  base::MutexLock lock(&logger.mu);
  logger.context = std::move(fields);
}

void Log(LogLevel level, absl::string_view component, absl::string_view message,
         absl::Span<const LogField> fields) {
  Logger& logger = TheLogger();
  if (level < logger.level.load()) return;
  Emit(logger, logger.format.load(), level, component, message, fields);
}

void LogBlock(LogLevel level, absl::string_view component, absl::string_view text) {
  Logger& logger = TheLogger();
  if (level < logger.level.load()) return;
  if (logger.format.load() == LogFormat::kText) {
    base::MutexLock lock(&logger.mu);
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
  base::MutexLock lock(&logger.mu);
  logger.sink = std::move(sink);
  logger.clock = std::move(clock);
}

}  // namespace numaserve::base
