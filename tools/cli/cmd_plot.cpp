// `dschat plot <run dir> [--output F.png] [--width N] [--panel-height N]`: training curves from
// every metrics.jsonl under a run directory (SFT, reward model, PPO) drawn into one PNG.
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "dschat/monitor/training_plot.h"

namespace dschat {
namespace cli {
namespace {

struct PlotCommandOptions {
  std::string run_dir;
  std::string output;
  int width = 1200;
  int panel_height = 260;
};

}  // namespace

void add_plot_command(CLI::App& app) {
  auto options = std::make_shared<PlotCommandOptions>();
  auto* cmd = app.add_subcommand("plot", "Draw the training curves of a run (its metrics.jsonl files) into a PNG");
  cmd->add_option("run_dir", options->run_dir, "Run directory (searched recursively for metrics.jsonl)")->required();
  cmd->add_option("--output,-o", options->output, "PNG to write (default: <run dir>/training_curves.png)");
  cmd->add_option("--width", options->width, "Image width in pixels")->capture_default_str();
  cmd->add_option("--panel-height", options->panel_height, "Height of each panel in pixels")->capture_default_str();
  cmd->callback([options] {
    const std::filesystem::path output = options->output.empty()
                                             ? std::filesystem::path(options->run_dir) / "training_curves.png"
                                             : std::filesystem::path(options->output);
    const int panels = monitor::plot_training_curves(options->run_dir, output, options->width, options->panel_height);
    std::cout << "wrote " << output.string() << " (" << panels << (panels == 1 ? " panel)" : " panels)") << "\n";
  });
}

}  // namespace cli
}  // namespace dschat
