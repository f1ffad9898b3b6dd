// A small command-line parser for numaserve's sub-commands: --name value,
// --name=value and boolean --flag. Errors name the command and the option.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace numaserve::server {

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

  // Parses args (without the program and sub-command names). --help sets
  // help_requested() and returns OK.
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
  };
  const Option* Find(const std::string& name) const;

  std::string command_;
  std::string summary_;
  std::vector<Option> options_;
  bool help_requested_ = false;
};

}  // namespace numaserve::server
