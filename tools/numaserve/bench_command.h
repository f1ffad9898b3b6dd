// `numaserve bench`: runs a model in process at several batch sizes and
// prints throughput, latency percentiles, achieved GFLOP/s and the fraction
// of the machine's FP32 peak (affinity's FMA probe x threads).
#pragma once

#include <string>
#include <vector>

namespace numaserve::cli {

int BenchCommand(const std::vector<std::string>& args);

}  // namespace numaserve::cli
