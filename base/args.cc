#include "base/args.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/errno_text.h"

namespace numaserve::base {

ArgParser::ArgParser(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void ArgParser::AddString(const std::string& name, std::string* value, const std::string& help) {
  options_.push_back({name, help, *value, false, [value](const std::string& v) {
                        *value = v;
                        return absl::OkStatus();
                      }});
}

void ArgParser::AddInt(const std::string& name, int64_t* value, const std::string& help) {
  options_.push_back({name, help, absl::StrCat(*value), false, [name, value](const std::string& v) {
                        if (!absl::SimpleAtoi(v, value)) {
                          return absl::InvalidArgumentError(
                              absl::StrFormat("--%s expects an integer, got '%s'", name, v));
                        }
                        return absl::OkStatus();
                      }});
}

void ArgParser::AddDouble(const std::string& name, double* value, const std::string& help) {
  options_.push_back({name, help, absl::StrCat(*value), false, [name, value](const std::string& v) {
                        if (!absl::SimpleAtod(v, value)) {
                          return absl::InvalidArgumentError(
                              absl::StrFormat("--%s expects a number, got '%s'", name, v));
                        }
                        return absl::OkStatus();
                      }});
}

void ArgParser::AddBool(const std::string& name, bool* value, const std::string& help) {
  options_.push_back(
      {name, help, *value ? "true" : "false", true, [name, value](const std::string& v) {
         if (v == "true" || v == "1" || v.empty()) {
           *value = true;
         } else if (v == "false" || v == "0") {
           *value = false;
         } else {
           return absl::InvalidArgumentError(
               absl::StrFormat("--%s expects true or false, got '%s'", name, v));
         }
         return absl::OkStatus();
       }});
}

void ArgParser::AddRepeated(const std::string& name, std::vector<std::string>* values,
                            const std::string& help) {
  options_.push_back({name, help, "", false,
                      [values](const std::string& v) {
                        values->push_back(v);
                        return absl::OkStatus();
                      },
                      /*is_repeated=*/true});
}

void ArgParser::AddConfigFile(const std::string& name, const std::string& help) {
  config_option_ = name;
  config_help_ = help;
}

const ArgParser::Option* ArgParser::Find(const std::string& name) const {
  for (const Option& o : options_) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

namespace {

// VALUE without the comment that follows it and the quotes around it.
std::string ConfigValue(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'')) {
    const size_t close = value.find(value.front(), 1);
    if (close != absl::string_view::npos) {
      absl::string_view rest = absl::StripAsciiWhitespace(value.substr(close + 1));
      if (rest.empty() || rest.front() == '#') return std::string(value.substr(1, close - 1));
    }
  }
  for (size_t i = 1; i < value.size(); ++i) {
    if (value[i] == '#' && absl::ascii_isspace(static_cast<unsigned char>(value[i - 1]))) {
      value = value.substr(0, i);
      break;
    }
  }
  return std::string(absl::StripAsciiWhitespace(value));
}

}  // namespace

absl::Status ArgParser::ReadConfigFile(const std::string& path,
                                       const std::set<std::string>& skip) const {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot read --%s %s: %s", config_option_, path, base::ErrnoText(errno)));
  }
  std::set<std::string> seen;
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    const auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrFormat("%s:%d: %s", path, line, what));
    };
    absl::string_view text = absl::StripAsciiWhitespace(raw);
    if (text.empty() || text.front() == '#') continue;
    const size_t separator = text.find_first_of(":=");
    if (separator == absl::string_view::npos) {
      return error(absl::StrFormat("expected 'name: value' or 'name = value', got '%s'", text));
    }
    std::string name(absl::StripAsciiWhitespace(text.substr(0, separator)));
    if (name.rfind("--", 0) == 0) name = name.substr(2);
    if (name == config_option_) {
      return error(absl::StrFormat("'%s' cannot be used in a config file", name));
    }
    const Option* option = Find(name);
    if (option == nullptr) return error(absl::StrFormat("unknown option '%s'", name));
    if (!option->is_repeated && !seen.insert(name).second) {
      return error(absl::StrFormat("option '%s' is set twice", name));
    }
    if (skip.count(name) != 0) continue;
    // The value's own message names the option; add where it came from.
    if (absl::Status s = option->set(ConfigValue(text.substr(separator + 1))); !s.ok()) {
      return error(std::string(s.message()));
    }
  }
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot read --%s %s: %s", config_option_, path, base::ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status ArgParser::Parse(const std::vector<std::string>& args) {
  // The command line first, checked but not applied: a config file it
  // names is applied before it, so that its flags override the file.
  std::vector<Setting> command_line;
  std::string config_file;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return absl::OkStatus();
    }
    if (arg.rfind("--", 0) != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unexpected argument '%s' (options start with --)", arg));
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const bool is_config = !config_option_.empty() && name == config_option_;
    const Option* option = is_config ? nullptr : Find(name);
    if (option == nullptr && !is_config) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown option --%s (see numaserve %s --help)", name, command_));
    }
    if (!has_value && (is_config || !option->is_bool)) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
      value = args[++i];
    }
    if (is_config) {
      if (!config_file.empty()) {
        return absl::InvalidArgumentError(absl::StrFormat("--%s given twice", name));
      }
      config_file = value;
      continue;
    }
    command_line.push_back({option, value});
  }
  if (!config_file.empty()) {
    // A repeated option given on the command line replaces the file's values.
    std::set<std::string> skip;
    for (const Setting& setting : command_line) {
      if (setting.option->is_repeated) skip.insert(setting.option->name);
    }
    if (absl::Status s = ReadConfigFile(config_file, skip); !s.ok()) return s;
  }
  for (const Setting& setting : command_line) {
    if (absl::Status s = setting.option->set(setting.value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string ArgParser::Usage() const {
  std::string out =
      absl::StrFormat("usage: numaserve %s [options]\n%s\n\noptions:\n", command_, summary_);
  if (!config_option_.empty()) {
    absl::StrAppendFormat(&out, "%-34s %s\n", absl::StrCat("  --", config_option_, " FILE"),
                          config_help_);
  }
  for (const Option& o : options_) {
    std::string left = absl::StrCat("  --", o.name, o.is_bool ? "" : " VALUE");
    absl::StrAppendFormat(&out, "%-34s %s", left, o.help);
    if (!o.default_text.empty()) absl::StrAppend(&out, " (default: ", o.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace numaserve::base
