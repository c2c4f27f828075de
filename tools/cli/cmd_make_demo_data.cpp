// `dschat make-demo-data --out DIR [--seed N] [--train N] [--eval N] [--kinds copy,add,bigger]`:
// writes the demo job's synthetic preference data (DIR/train.json, DIR/eval.json, JSON Lines) and
// its step-1 demonstrations (DIR/sft/train.json, DIR/sft/eval.json), and says what it wrote in one
// line on stderr. data/demo/ in the repository is this command's output.
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "dschat/data/demo_task.h"

namespace dschat {
namespace cli {
namespace {

struct MakeDemoDataOptions {
  std::string out;
  uint64_t seed = 1234;
  size_t train = 2000;
  size_t eval = 200;
  std::vector<std::string> kinds = data::demo_task_kinds();
};

void run_make_demo_data(const MakeDemoDataOptions& options) {
  data::write_demo_dataset(options.out, options.seed, options.train, options.eval, options.kinds);
  std::string kinds;
  for (const std::string& kind : options.kinds) kinds += (kinds.empty() ? "" : ",") + kind;
  const std::filesystem::path out = options.out;
  std::cerr << "make-demo-data: wrote " << options.train << " train and " << options.eval << " eval records (kinds "
            << kinds << ", seed " << options.seed << ") to " << (out / "train.json").string() << " and "
            << (out / "eval.json").string() << ", and the same prompts as step-1 demonstrations (60% of the answers "
            << "doubled, for RL to fix) to " << (out / "sft" / "train.json").string() << " and "
            << (out / "sft" / "eval.json").string() << "\n";
}

}  // namespace

void add_make_demo_data_command(CLI::App& app) {
  auto options = std::make_shared<MakeDemoDataOptions>();
  auto* cmd = app.add_subcommand("make-demo-data",
                                 "Write the demo job's synthetic data: DIR/train.json and DIR/eval.json (preference pairs), "
                                 "DIR/sft/train.json and DIR/sft/eval.json (step-1 demonstrations)");
  cmd->add_option("--out", options->out, "Output directory (created if missing)")->required();
  cmd->add_option("--seed", options->seed, "Random seed; the same seed writes the same files")->capture_default_str();
  cmd->add_option("--train", options->train, "Number of train records")->capture_default_str();
  cmd->add_option("--eval", options->eval, "Number of eval records (from prompts held out of train)")
      ->capture_default_str();
  cmd->add_option("--kinds", options->kinds, "Task kinds to mix: copy, add, bigger")
      ->delimiter(',')
      ->default_str("copy,add,bigger");
  cmd->callback([options] { run_make_demo_data(*options); });
}

}  // namespace cli
}  // namespace dschat
