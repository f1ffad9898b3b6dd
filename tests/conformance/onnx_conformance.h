// Runs the ONNX backend test data (Debian's libonnx-testdata: one folder
// per case with model.onnx and test_data_set_*/{input,output}_*.pb) through
// CompiledModel and classifies each case as passed, failed or unsupported.
//
// A case is unsupported when the engine declines it at load with
// UNIMPLEMENTED (an op, attribute or data type it does not support), or when
// an input or output has a type the engine has no DataType for (STRING,
// sequences, optionals). Inputs of every supported type are fed at runtime,
// except inputs used in a slot the engine needs as a constant (shapes, axes,
// pads, slice bounds, resize parameters, ...: see IsParameterSlot), which are
// frozen into the model as initializers (the test data are fixed, so those
// parameters become the constants the engine requires and folds). Outputs
// are compared as their type: integers and BOOL exactly, floating types as
// double within the tolerances. Everything else that does not match is a
// failure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace numaserve::conformance {

enum class Outcome { kPassed, kFailed, kUnsupported };
const char* OutcomeName(Outcome outcome);

struct CaseResult {
  std::string name;  // folder name, e.g. "test_conv_with_strides_padding"
  Outcome outcome = Outcome::kFailed;
  std::string detail;  // why it failed or is unsupported
};

struct Options {
  // Element-wise |got - want| <= atol + rtol * |want|.
  double rtol = 1e-3;
  double atol = 1e-5;
  // Where rewritten models are written.
  std::string scratch_dir = "/tmp";
};

// One case folder.
CaseResult RunCase(const std::string& case_dir, const Options& options);

// Every case folder in `suite_dir`, in name order.
std::vector<CaseResult> RunSuite(const std::string& suite_dir, const Options& options);

struct Tally {
  int passed = 0, failed = 0, unsupported = 0;
};
Tally Count(const std::vector<CaseResult>& results);

// The default data location (the libonnx-testdata package).
inline constexpr char kDefaultRoot[] = "/usr/share/libonnx-testdata/data";

}  // namespace numaserve::conformance
