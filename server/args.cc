#include "server/args.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace numaserve::server {

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
  options_.push_back({name, help, "", false, [values](const std::string& v) {
                        values->push_back(v);
                        return absl::OkStatus();
                      }});
}

const ArgParser::Option* ArgParser::Find(const std::string& name) const {
  for (const Option& o : options_) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

absl::Status ArgParser::Parse(const std::vector<std::string>& args) {
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
    const Option* option = Find(name);
    if (option == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("unknown option --%s (see numaserve %s --help)", name, command_));
    }
    if (!has_value && !option->is_bool) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrFormat("--%s needs a value", name));
      }
      value = args[++i];
    }
    if (absl::Status s = option->set(value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string ArgParser::Usage() const {
  std::string out =
      absl::StrFormat("usage: numaserve %s [options]\n%s\n\noptions:\n", command_, summary_);
  for (const Option& o : options_) {
    std::string left = absl::StrCat("  --", o.name, o.is_bool ? "" : " VALUE");
    absl::StrAppendFormat(&out, "%-34s %s", left, o.help);
    if (!o.default_text.empty()) absl::StrAppend(&out, " (default: ", o.default_text, ")");
    absl::StrAppend(&out, "\n");
  }
  return out;
}

}  // namespace numaserve::server
