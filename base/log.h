// The log of every numaserve process (the server, its workers, training
// ranks, the kernels and engine code running in them): one line per record
// on stderr, as text (what the lines always looked like: "numaserve:
// MESSAGE") or as JSON, one object a line:
//
//   {"ts":"2026-01-02T03:04:05.678Z","level":"info","component":"worker",
//    "msg":"worker 1: m:1: gemm backend blis","model":"m","version":1,
//    "worker":1,"pid":4242}
//
// for log shippers (journald, Fluent Bit, Vector, Loki). Records below the
// level are dropped. Text writes the message alone, so a message must read
// complete on its own; fields are its machine-readable copies for JSON.
//
// Thread-safe: a record is formatted first and written with one write(2)
// under a lock, so records from several threads never interleave.
// A process's settings are its own: child processes (workers, trainers)
// get them as --log-format and --log-level options on their command lines.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace numaserve::base {

enum class LogLevel { kDebug, kInfo, kWarning, kError };
enum class LogFormat { kText, kJson };

// "debug" | "info" | "warning" (or "warn") | "error".
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
// "text" | "json".
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);
const char* LogLevelName(LogLevel level);
const char* LogFormatName(LogFormat format);

// One key and its value, JSON-encoded when made (strings escaped, numbers
// as numbers). Keys ts, level, component and msg are the record's own.
class LogField {
 public:
  LogField(absl::string_view key, absl::string_view value);
  LogField(absl::string_view key, const char* value) : LogField(key, absl::string_view(value)) {}
  LogField(absl::string_view key, const std::string& value)
      : LogField(key, absl::string_view(value)) {}
  LogField(absl::string_view key, bool value);
  LogField(absl::string_view key, double value);
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  LogField(absl::string_view key, T value) : key_(key), json_(std::to_string(value)) {}
  // A value that is JSON already (a field read back by ParseLogLine).
  static LogField Json(absl::string_view key, absl::string_view json);

  const std::string& key() const { return key_; }
  const std::string& json() const { return json_; }

 private:
  LogField() = default;
  std::string key_;
  std::string json_;
};

// Appends TEXT to OUT as a JSON string literal (quotes included): control
// characters escaped, invalid UTF-8 replaced by U+FFFD.
void AppendJsonString(std::string* out, absl::string_view text);
// The same literal, returned.
std::string JsonString(absl::string_view text);
// Whether TEXT is valid UTF-8 (no overlong form, surrogate or code point
// beyond U+10FFFF).
bool IsUtf8(absl::string_view text);

// One record as the line it is written as (with its '\n').
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view component, absl::string_view message,
                          absl::Span<const LogField> fields);

// A JSON record read back: what a process that reads a child's stderr (the
// training service, its trainers') does to log the child's records as its
// own.
struct LogRecord {
  std::string ts;
  LogLevel level = LogLevel::kInfo;
  std::string component;
  std::string message;
  std::vector<LogField> fields;  // the other keys, in their order
};
// LINE (with or without its '\n') as a record: a flat JSON object with
// string ts, level, component and msg, other values strings, numbers,
// true, false or null. Anything else is INVALID_ARGUMENT.
absl::StatusOr<LogRecord> ParseLogLine(absl::string_view line);

struct LogOptions {
  LogFormat format = LogFormat::kText;
  // Records below it are dropped.
  LogLevel level = LogLevel::kInfo;
};

// Sets the process's log options (until it is called: text, info). Call at
// start-up, before anything is logged; a process that starts another
// passes its CurrentLogOptions on that one's command line.
void ConfigureLog(const LogOptions& options);
LogOptions CurrentLogOptions();
// The options the values of --log-format and --log-level name (the options
// of serve, worker and train); an error names the option.
absl::StatusOr<LogOptions> LogOptionsFromFlags(absl::string_view format_name,
                                               absl::string_view level_name);
bool LogEnabled(LogLevel level);

// Fields every JSON record of this process carries after its own: who the
// process is ({"worker", 1}, {"pid", 4242} in a worker; {"rank", 0} in a
// training rank), so records of the kernels it runs say so too. A field the
// record has itself wins. Set once at start-up; replaces what was set.
void SetLogContext(std::vector<LogField> fields);

// Writes one record (when LEVEL is enabled).
void Log(LogLevel level, absl::string_view component, absl::string_view message,
         absl::Span<const LogField> fields = {});

// A multi-line block (the placement report): verbatim in text, one record
// per non-empty line in JSON.
void LogBlock(LogLevel level, absl::string_view component, absl::string_view text);

// Tests: where lines go instead of stderr, and the clock; empty functions
// restore stderr and the real clock.
void SetLogSinkForTesting(std::function<void(absl::string_view line)> sink,
                          std::function<absl::Time()> clock);

}  // namespace numaserve::base
