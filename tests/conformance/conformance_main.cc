// numaserve_conformance: prints passed / failed / unsupported per suite of
// the ONNX backend test data, and each failure with its reason.
//   numaserve_conformance [--root DIR] [--suite NAME]... [--verbose]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/conformance/onnx_conformance.h"

int main(int argc, char** argv) {
  using namespace numaserve::conformance;
  std::string root = kDefaultRoot;
  std::vector<std::string> suites;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--root") == 0 && i + 1 < argc) {
      root = argv[++i];
    } else if (std::strcmp(argv[i], "--suite") == 0 && i + 1 < argc) {
      suites.push_back(argv[++i]);
    } else if (std::strcmp(argv[i], "--verbose") == 0) {
      verbose = true;
    } else {
      std::fprintf(stderr, "usage: %s [--root DIR] [--suite NAME]... [--verbose]\n", argv[0]);
      return 2;
    }
  }
  if (suites.empty()) suites = {"node", "pytorch-converted", "pytorch-operator", "simple"};
  int total_failed = 0;
  std::printf("%-20s %8s %8s %12s\n", "suite", "passed", "failed", "unsupported");
  for (const std::string& suite : suites) {
    const auto results = RunSuite(root + "/" + suite, Options{});
    for (const CaseResult& r : results) {
      if (r.outcome == Outcome::kFailed || verbose) {
        std::fprintf(stderr, "%s/%s: %s %s\n", suite.c_str(), r.name.c_str(),
                     OutcomeName(r.outcome), r.detail.c_str());
      }
    }
    const Tally t = Count(results);
    total_failed += t.failed;
    std::printf("%-20s %8d %8d %12d\n", suite.c_str(), t.passed, t.failed, t.unsupported);
  }
  return total_failed == 0 ? 0 : 1;
}
