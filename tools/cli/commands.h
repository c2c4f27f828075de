#pragma once
// One function per `dschat` subcommand; each adds its flags and callback to the app.
// The CLI only parses arguments and calls the library: no logic lives here.

#include <CLI/CLI.hpp>

namespace dschat {
namespace cli {

void add_info_command(CLI::App& app);
void add_forward_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_make_demo_data_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_ckpt_command(CLI::App& app);
void add_plot_command(CLI::App& app);
void add_train_commands(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_serve_command(CLI::App& app);

}  // namespace cli
}  // namespace dschat
