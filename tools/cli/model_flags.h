#pragma once
// The flags every model-loading subcommand shares: --dtype, --init and --device.

#include <CLI/CLI.hpp>

#include <string>

#include "dschat/core/device.h"
#include "dschat/core/dtype.h"
#include "dschat/core/error.h"
#include "dschat/models/load_save.h"

namespace dschat {
namespace cli {

/// --device's help text, shared by every command that takes it.
inline constexpr const char* kDeviceHelp =
    "auto | cpu | cuda | cuda:N (auto: the GPU when this build has CUDA and one is visible, else the CPU)";

inline void add_device_flag(CLI::App& cmd, std::string& device) {
  cmd.add_option("--device", device, kDeviceHelp)->capture_default_str();
}

inline models::LoadOptions load_options(const std::string& dtype, const std::string& init,
                                        const std::string& device = "cpu") {
  DSCHAT_CHECK(init.empty() || init == "random", InvalidArgument, "--init: expected 'random', got '", init, "'");
  models::LoadOptions options;
  options.dtype = core::parse_dtype(dtype, "--dtype");
  options.random_init = init == "random";
  options.device = core::resolve_device(device, "--device");
  core::log_device_choice(options.device, device);
  return options;
}

}  // namespace cli
}  // namespace dschat
