// `numaserve infer`: a small KServe v2 client for trying a served model.
#pragma once

#include <string>
#include <vector>

namespace numaserve::cli {

int InferCommand(const std::vector<std::string>& args);

}  // namespace numaserve::cli
