// A small command-line parser for numaserve's sub-commands: --name value,
// --name=value and boolean --flag. Errors name the command and the option.
//
// With AddConfigFile, `--config FILE` reads the same options from a file:
//
//   # serve.conf
//   grpc-port: 9001
//   training-service = true
//   cpuset: "0-7"          # quotes keep a '#' or spaces in a value
//
// one `name: value` or `name = value` a line, names as the long flags
// without "--", '#' starting a comment (at the start of a line or after a
// space). Flags given on the command line override the file; a repeated
// option given there replaces the file's values. Errors name the file, the
// line and the option ("serve.conf:3: unknown option 'grpc-prot'").
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace numaserve::base {

class ArgParser {
 public:
  // `command` is the sub-command as typed ("serve"), for messages and usage.
  ArgParser(std::string command, std::string summary);

  void AddString(const std::string& name, std::string* value, const std::string& help);
  void AddInt(const std::string& name, int64_t* value, const std::string& help);
  void AddDouble(const std::string& name, double* value, const std::string& help);
  void AddBool(const std::string& name, bool* value, const std::string& help);
  // May be given several times; each occurrence appends.
  void AddRepeated(const std::string& name, std::vector<std::string>* values,
                   const std::string& help);

  // Makes --NAME FILE read options from FILE (see above).
  void AddConfigFile(const std::string& name, const std::string& help);

  // Parses args (without the program and sub-command names), and the config
  // file they name. --help sets help_requested() and returns OK.
  absl::Status Parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  std::string Usage() const;

 private:
  struct Option {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<absl::Status(const std::string&)> set;
    bool is_repeated = false;
  };
  // An option and the value it was given.
  struct Setting {
    const Option* option;
    std::string value;
  };
  const Option* Find(const std::string& name) const;
  // Applies a config file's settings, but for the options named in SKIP.
  absl::Status ReadConfigFile(const std::string& path, const std::set<std::string>& skip) const;

  std::string command_;
  std::string summary_;
  std::vector<Option> options_;
  std::string config_option_;  // empty: no config file option
  std::string config_help_;
  bool help_requested_ = false;
};

}  // namespace numaserve::base
