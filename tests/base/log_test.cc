#include "base/log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace numaserve::base {
namespace {

const absl::Time kTime = absl::FromUnixMillis(1767323045678);  // 2026-01-02T03:04:05.678Z

// AppendJsonString's literal, checked to be what JsonString returns.
std::string Json(absl::string_view text) {
  std::string out = "prefix:";
  AppendJsonString(&out, text);
  EXPECT_EQ(out.substr(7), JsonString(text));
  return out.substr(7);
}

TEST(LogTest, ParsesLevelsAndFormats) {
  EXPECT_EQ(*ParseLogLevel("debug"), LogLevel::kDebug);
  EXPECT_EQ(*ParseLogLevel("INFO"), LogLevel::kInfo);
  EXPECT_EQ(*ParseLogLevel("warn"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("warning"), LogLevel::kWarning);
  EXPECT_EQ(*ParseLogLevel("error"), LogLevel::kError);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  absl::StatusOr<LogLevel> bad = ParseLogLevel("loud");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("loud"), absl::string_view::npos);
  EXPECT_FALSE(ParseLogFormat("xml").ok());
}

TEST(LogTest, OptionsFromFlagsNameTheBadOption) {
  absl::StatusOr<LogOptions> options = LogOptionsFromFlags("JSON", "warn");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->format, LogFormat::kJson);
  EXPECT_EQ(options->level, LogLevel::kWarning);
  EXPECT_EQ(LogOptionsFromFlags("xml", "info").status().message(),
            "--log-format: unknown log format 'xml' (text | json)");
  EXPECT_EQ(LogOptionsFromFlags("text", "loud").status().message(),
            "--log-level: unknown log level 'loud' (debug | info | warning | error)");
}

TEST(LogTest, TextKeepsTheUsualLook) {
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kTime, LogLevel::kWarning, "serve",
                          "model m version 1: /r/m/1/model.onnx", {{"model", "m"}}),
            "numaserve: model m version 1: /r/m/1/model.onnx\n");
  // One record is one line.
  EXPECT_EQ(FormatLogLine(LogFormat::kText, kTime, LogLevel::kInfo, "serve", "a\nb", {}),
            "numaserve: a b\n");
}

TEST(LogTest, JsonIsOneObjectALine) {
  const std::string line =
      FormatLogLine(LogFormat::kJson, kTime, LogLevel::kInfo, "serve", "model m loaded",
                    {{"model", "m"}, {"version", 3}, {"ready", true}, {"seconds", 0.25}});
  EXPECT_EQ(line,
            "{\"ts\":\"2026-01-02T03:04:05.678Z\",\"level\":\"info\",\"component\":\"serve\","
            "\"msg\":\"model m loaded\",\"model\":\"m\",\"version\":3,\"ready\":true,"
            "\"seconds\":0.25}\n");
  EXPECT_NE(FormatLogLine(LogFormat::kJson, kTime, LogLevel::kError, "c", "x", {})
                .find("\"level\":\"error\""),
            std::string::npos);
  // No NaN in JSON.
  EXPECT_NE(FormatLogLine(LogFormat::kJson, kTime, LogLevel::kInfo, "c", "x", {{"v", std::nan("")}})
                .find("\"v\":null"),
            std::string::npos);
}

TEST(LogTest, EscapesJsonStrings) {
  EXPECT_EQ(Json("plain"), "\"plain\"");
  EXPECT_EQ(Json("q\"b\\s/"), "\"q\\\"b\\\\s/\"");
  EXPECT_EQ(Json("a\nb\tc\rd"), "\"a\\nb\\tc\\rd\"");
  EXPECT_EQ(Json(std::string("odd\x01name\x7f", 9)), "\"odd\\u0001name\\u007f\"");
  EXPECT_EQ(Json(std::string("nul\0x", 5)), "\"nul\\u0000x\"");
  // Valid UTF-8 passes, invalid bytes become U+FFFD.
  EXPECT_EQ(Json("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"),
            "\"caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80\"");
  EXPECT_EQ(Json("bad\xFF"), "\"bad\xEF\xBF\xBD\"");
  EXPECT_EQ(Json("cut\xE2\x82"), "\"cut\xEF\xBF\xBD\xEF\xBF\xBD\"");
  EXPECT_EQ(Json("overlong\xC0\xAF"), "\"overlong\xEF\xBF\xBD\xEF\xBF\xBD\"");
  EXPECT_EQ(Json("surrogate\xED\xA0\x80"), "\"surrogate\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

class LogSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = CurrentLogOptions();
    SetLogSinkForTesting([this](absl::string_view line) { lines_.emplace_back(line); },
                         [] { return kTime; });
  }
  void TearDown() override {
    SetLogSinkForTesting(nullptr, nullptr);
    ConfigureLog(saved_);
  }
  LogOptions saved_;
  std::vector<std::string> lines_;
};

TEST_F(LogSinkTest, LevelFiltersRecords) {
  ConfigureLog({.format = LogFormat::kText, .level = LogLevel::kWarning});
  EXPECT_FALSE(LogEnabled(LogLevel::kInfo));
  EXPECT_TRUE(LogEnabled(LogLevel::kError));
  Log(LogLevel::kDebug, "serve", "d");
  Log(LogLevel::kInfo, "serve", "i");
  Log(LogLevel::kWarning, "serve", "w");
  Log(LogLevel::kError, "serve", "e");
  EXPECT_EQ(lines_, (std::vector<std::string>{"numaserve: w\n", "numaserve: e\n"}));
}

TEST_F(LogSinkTest, ConfigureSetsThisProcessOnly) {
  // Child processes get the settings as options on their command lines
  // (CurrentLogOptions), not through the environment.
  unsetenv("NUMASERVE_LOG_FORMAT");
  unsetenv("NUMASERVE_LOG_LEVEL");
  ConfigureLog({.format = LogFormat::kJson, .level = LogLevel::kDebug});
  EXPECT_EQ(getenv("NUMASERVE_LOG_FORMAT"), nullptr);
  EXPECT_EQ(getenv("NUMASERVE_LOG_LEVEL"), nullptr);
  const LogOptions current = CurrentLogOptions();
  EXPECT_EQ(current.format, LogFormat::kJson);
  EXPECT_EQ(current.level, LogLevel::kDebug);
  Log(LogLevel::kDebug, "worker", "hello", {{"worker", 2}});
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_EQ(lines_[0],
            "{\"ts\":\"2026-01-02T03:04:05.678Z\",\"level\":\"debug\",\"component\":\"worker\","
            "\"msg\":\"hello\",\"worker\":2}\n");
}

TEST_F(LogSinkTest, BlocksAreVerbatimInTextAndOneRecordALineInJson) {
  ConfigureLog({.format = LogFormat::kText, .level = LogLevel::kInfo});
  LogBlock(LogLevel::kInfo, "placement", "line one\n  line two\n");
  EXPECT_EQ(lines_, (std::vector<std::string>{"line one\n  line two\n"}));
  lines_.clear();
  ConfigureLog({.format = LogFormat::kJson, .level = LogLevel::kInfo});
  LogBlock(LogLevel::kInfo, "placement", "line one\n\n  line two  \n");
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_NE(lines_[0].find("\"msg\":\"line one\""), std::string::npos) << lines_[0];
  EXPECT_NE(lines_[1].find("\"msg\":\"  line two\""), std::string::npos) << lines_[1];
}

TEST_F(LogSinkTest, ThreadsWriteWholeRecords) {
  ConfigureLog({.format = LogFormat::kJson, .level = LogLevel::kInfo});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) Log(LogLevel::kInfo, "t", "record", {{"thread", t}, {"i", i}});
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(lines_.size(), 800u);
  for (const std::string& line : lines_) {
    ASSERT_EQ(line.front(), '{');
    ASSERT_EQ(line.substr(line.size() - 2), "}\n");
  }
}

TEST_F(LogSinkTest, ContextFieldsFollowEachJsonRecord) {
  ConfigureLog({.format = LogFormat::kJson, .level = LogLevel::kInfo});
  SetLogContext({{"worker", 1}, {"pid", 4242}});
  Log(LogLevel::kInfo, "dispatch", "kernels: avx2");
  // The record's own field wins over the context's.
  Log(LogLevel::kInfo, "worker", "w", {{"worker", 7}});
  ConfigureLog({.format = LogFormat::kText, .level = LogLevel::kInfo});
  Log(LogLevel::kInfo, "dispatch", "text has no fields");
  SetLogContext({});
  ASSERT_EQ(lines_.size(), 3u);
  EXPECT_EQ(lines_[0],
            "{\"ts\":\"2026-01-02T03:04:05.678Z\",\"level\":\"info\",\"component\":\"dispatch\","
            "\"msg\":\"kernels: avx2\",\"worker\":1,\"pid\":4242}\n");
  EXPECT_NE(lines_[1].find("\"msg\":\"w\",\"worker\":7,\"pid\":4242}"), std::string::npos)
      << lines_[1];
  EXPECT_EQ(lines_[2], "numaserve: text has no fields\n");
}

TEST_F(LogSinkTest, FieldsMayBeBuiltAtRunTime) {
  ConfigureLog({.format = LogFormat::kJson, .level = LogLevel::kInfo});
  std::vector<LogField> fields = {{"a", 1}};
  fields.emplace_back("b", "two");
  Log(LogLevel::kInfo, "c", "m", fields);
  ASSERT_EQ(lines_.size(), 1u);
  EXPECT_NE(lines_[0].find("\"msg\":\"m\",\"a\":1,\"b\":\"two\"}"), std::string::npos) << lines_[0];
}

TEST(ParseLogLineTest, ReadsBackWhatFormatWrote) {
  const std::string line = FormatLogLine(
      LogFormat::kJson, kTime, LogLevel::kWarning, "worker", "odd \"name\"\n\x01 caf\xC3\xA9",
      {{"model", "m"}, {"version", 3}, {"ready", true}, {"seconds", 0.25}, {"v", std::nan("")}});
  absl::StatusOr<LogRecord> record = ParseLogLine(line);
  ASSERT_TRUE(record.ok()) << record.status() << line;
  EXPECT_EQ(record->ts, "2026-01-02T03:04:05.678Z");
  EXPECT_EQ(record->level, LogLevel::kWarning);
  EXPECT_EQ(record->component, "worker");
  EXPECT_EQ(record->message, "odd \"name\"\n\x01 caf\xC3\xA9");
  std::vector<std::pair<std::string, std::string>> fields;
  for (const LogField& f : record->fields) fields.emplace_back(f.key(), f.json());
  EXPECT_EQ(fields, (std::vector<std::pair<std::string, std::string>>{{"model", "\"m\""},
                                                                      {"version", "3"},
                                                                      {"ready", "true"},
                                                                      {"seconds", "0.25"},
                                                                      {"v", "null"}}));
  // Written again, the record is the same line.
  EXPECT_EQ(FormatLogLine(LogFormat::kJson, kTime, record->level, record->component,
                          record->message, record->fields),
            line);
}

TEST(ParseLogLineTest, DecodesJsonEscapes) {
  absl::StatusOr<LogRecord> record = ParseLogLine(
      " {\"msg\":\"a\\/b \\u00e9 \\ud83d\\ude00\\t\", \"level\" : \"error\", \"component\":\"c\","
      "\"ts\":\"t\", \"n\": -1.5e+3 }\n");
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->message, "a/b \xC3\xA9 \xF0\x9F\x98\x80\t");
  EXPECT_EQ(record->level, LogLevel::kError);
  ASSERT_EQ(record->fields.size(), 1u);
  EXPECT_EQ(record->fields[0].json(), "-1.5e+3");
}

TEST(ParseLogLineTest, RefusesWhatIsNotARecord) {
  for (const char* line : {
           "numaserve: model m loaded",
           "",
           "{}",
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\"}",                // no msg
           "{\"ts\":\"t\",\"level\":\"loud\",\"component\":\"c\",\"msg\":\"m\"}",  // level
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\",\"msg\":\"m\"",   // unclosed
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\",\"msg\":\"m\"} x",
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\",\"msg\":\"m\",\"a\":[1]}",
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\",\"msg\":\"m\",\"a\":01}",
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\",\"msg\":\"\\ud800\"}",
           "{\"ts\":\"t\",\"level\":\"info\",\"component\":\"c\",\"msg\":\"a\tb\"}",
           "{\"ts\":1,\"level\":\"info\",\"component\":\"c\",\"msg\":\"m\"}",
       }) {
    EXPECT_FALSE(ParseLogLine(line).ok()) << line;
  }
}

}  // namespace
}  // namespace numaserve::base
