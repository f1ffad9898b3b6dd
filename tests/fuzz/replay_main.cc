// Replays inputs through a target's FuzzOne without libFuzzer, for ctest:
//
//   fuzz_replay_<target> DIR_OR_FILE...
//
// feeds every regular file (in name order; README files and dot files
// skipped) of each directory, or each file named, to FuzzOne. A crash or a
// failed FUZZ_CHECK aborts, which fails the test; the name of the input is
// printed before it runs, so the failing one is the last line.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace fs = std::filesystem;

namespace {

bool IsInput(const fs::path& path) {
  const std::string name = path.filename().string();
  return fs::is_regular_file(path) && !name.starts_with(".") && !name.starts_with("README");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  int replayed = 0;
  for (int a = 1; a < argc; ++a) {
    const fs::path arg = argv[a];
    std::vector<fs::path> inputs;
    if (fs::is_directory(arg)) {
      for (const fs::directory_entry& e : fs::directory_iterator(arg)) {
        if (IsInput(e.path())) inputs.push_back(e.path());
      }
      std::sort(inputs.begin(), inputs.end());
    } else if (fs::exists(arg)) {
      inputs.push_back(arg);
    } else {
      // A target without regression inputs yet has no directory.
      printf("%s: not there, skipped\n", argv[a]);
      continue;
    }
    for (const fs::path& input : inputs) {
      std::ifstream in(input, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      if (!in.good() && !in.eof()) {
        fprintf(stderr, "%s: cannot read\n", input.c_str());
        return 1;
      }
      printf("%s (%zu bytes)\n", input.c_str(), bytes.size());
      fflush(stdout);
      numaserve::fuzz::FuzzOne(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  printf("replayed %d inputs\n", replayed);
  return 0;
}
