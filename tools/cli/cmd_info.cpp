// `dschat info [--models]`: versions (dschat, LibTorch, CUDA, NCCL), devices and enabled
// features; with --models, the supported model families as docs/models.md's markdown table.
#include <iostream>
#include <memory>

#include "commands.h"
#include "dschat/core/build_info.h"
#include "dschat/models/families.h"

namespace dschat {
namespace cli {

void add_info_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print versions, devices and enabled features");
  auto models = std::make_shared<bool>(false);
  cmd->add_flag("--models", *models, "Print the supported model families (docs/models.md's table) instead");
  cmd->callback([models] {
    if (*models) {
      std::cout << models::supported_families_markdown();
    } else {
      std::cout << core::describe_build();
    }
  });
}

}  // namespace cli
}  // namespace dschat
