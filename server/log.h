// The server's log: one line per record on stderr, as text (what the lines
// always looked like: "numaserve: MESSAGE") or as JSON, one object a line:
//
//   {"ts":"2026-01-02T03:04:05.678Z","level":"info","component":"serve",
//    "msg":"model m version 1: /repo/m/1/model.onnx","model":"m","version":1}
//
// for log shippers (journald, Fluent Bit, Vector, Loki). Records below the
// level are dropped. Text writes the message alone, so a message must read
// complete on its own; fields are its machine-readable copies for JSON.
//
// Thread-safe: a record is formatted first and written with one write(2)
// under a lock, so records from several threads never interleave.
// ConfigureLog also exports the settings to the environment
// (NUMASERVE_LOG_FORMAT, NUMASERVE_LOG_LEVEL), where child processes
// (workers, trainers) that log through here pick them up.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace numaserve::server {

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

  const std::string& key() const { return key_; }
  const std::string& json() const { return json_; }

 private:
  std::string key_;
  std::string json_;
};

// Appends TEXT to OUT as a JSON string literal (quotes included): control
// characters escaped, invalid UTF-8 replaced by U+FFFD.
void AppendJsonString(std::string* out, absl::string_view text);

// One record as the line it is written as (with its '\n').
std::string FormatLogLine(LogFormat format, absl::Time time, LogLevel level,
                          absl::string_view component, absl::string_view message,
                          std::initializer_list<LogField> fields);

struct LogOptions {
  LogFormat format = LogFormat::kText;
  // Records below it are dropped.
  LogLevel level = LogLevel::kInfo;
};

// Sets the process's log options and exports them to the environment for
// child processes. Until it is called the options come from that
// environment, else the defaults (text, info).
void ConfigureLog(const LogOptions& options);
LogOptions CurrentLogOptions();
bool LogEnabled(LogLevel level);

// Writes one record (when LEVEL is enabled).
void Log(LogLevel level, absl::string_view component, absl::string_view message,
         std::initializer_list<LogField> fields = {});

// A multi-line block (the placement report): verbatim in text, one record
// per non-empty line in JSON.
void LogBlock(LogLevel level, absl::string_view component, absl::string_view text);

// Tests: where lines go instead of stderr, and the clock; empty functions
// restore stderr and the real clock.
void SetLogSinkForTesting(std::function<void(absl::string_view line)> sink,
                          std::function<absl::Time()> clock);

// "numaserve 0.1.0 (git v0.1.0-12-gabcdef0, isa avx512, oneDNN avx512_core)":
// the version, the git revision the binary was built from ("unknown"
// outside a git checkout) and the ISA the kernels dispatch to here.
std::string VersionText();
// The parts, for the start-up record.
const char* BuildVersion();
const char* BuildRevision();

}  // namespace numaserve::server
