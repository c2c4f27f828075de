#pragma once
// The flags every model-loading subcommand shares: --dtype and --init.

#include <string>

#include "dschat/core/error.h"
#include "dschat/inference/model_loader.h"

namespace dschat {
namespace cli {

inline inference::LoadOptions load_options(const std::string& dtype, const std::string& init) {
  DSCHAT_CHECK(init.empty() || init == "random", InvalidArgument, "--init: expected 'random', got '", init, "'");
  inference::LoadOptions options;
  options.dtype = inference::parse_dtype(dtype);
  options.random_init = init == "random";
  return options;
}

}  // namespace cli
}  // namespace dschat
