// Generates the default model (models/generate_default_model.py) into the
// test temp dir with Debian's python; empty when that python is missing.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace numaserve::engine::testing {

inline std::string GenerateDefaultModel() {
  const std::string python = NUMASERVE_PYTHON;
  if (access(python.c_str(), X_OK) != 0) return "";
  const std::string dir = absl::StrCat(::testing::TempDir(), "/numaserve_repo_", getpid());
  const std::string cmd =
      absl::StrCat(python, " ", NUMASERVE_MODEL_GENERATOR, " --out ", dir, " > /dev/null");
  if (std::system(cmd.c_str()) != 0) return "";
  return dir + "/fashion_classifier/1/model.onnx";
}

}  // namespace numaserve::engine::testing
