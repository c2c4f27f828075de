#pragma once
// The flags every model-loading subcommand shares: --dtype and --init.

#include <string>

#include "dschat/core/error.h"
#include "dschat/core/dtype.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace cli {

inline models::LoadOptions load_options(const std::string& dtype, const std::string& init) {
  DSCHAT_CHECK(init.empty() || init == "random", InvalidArgument, "--init: expected 'random', got '", init, "'");
  models::LoadOptions options;
  options.dtype = core::parse_dtype(dtype, "--dtype");
  options.random_init = init == "random";
  return options;
}

}  // namespace cli
}  // namespace dschat
