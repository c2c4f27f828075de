// `dschat info`: versions (dschat, LibTorch, CUDA, NCCL), devices and enabled features.
#include <iostream>

#include "commands.h"
#include "dschat/core/build_info.h"

namespace dschat {
namespace cli {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print versions, devices and enabled features");
  cmd->callback([] { std::cout << core::describe_build(); });
}

}  // namespace cli
}  // namespace dschat
