// What a run shows and leaves, through the CLI on the tiny pipeline (tests/tiny_pipeline.h):
//  * on a terminal (a pseudo-terminal from util-linux `script`) the progress bar is one row that
//    redraws in place, with each print_interval's DeepSpeed line above it; through a pipe, plain
//    lines, one per print_interval;
//  * each step's log starts with the overview table, and training_summary.json holds it;
//  * `--save-format bin` writes pytorch_model.bin that transformers and DeepSpeed-Chat's own
//    RewardModel load (strictly: every key) with dschat's outputs.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/json_object.h"
#include "dschat/models/load_save.h"
#include "test_util.h"
#include "tiny_pipeline.h"

namespace dschat {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The rows a terminal shows for `bytes`: "\r" returns to the row's start, "ESC[K" erases to its
// end, other bytes overwrite; "\n" starts a new row.
std::vector<std::string> terminal_rows(const std::string& bytes) {
  std::vector<std::string> rows(1);
  size_t cursor = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    std::string& row = rows.back();
    if (c == '\n') {
      rows.emplace_back();
      cursor = 0;
    } else if (c == '\r') {
      cursor = 0;
    } else if (c == '\033' && bytes.compare(i, 3, "\033[K") == 0) {
      row.resize(std::min(row.size(), cursor));
      i += 2;
    } else {
      if (cursor < row.size()) {
        row[cursor] = c;
      } else {
        row.push_back(c);
      }
      ++cursor;
    }
  }
  if (rows.back().empty()) rows.pop_back();
  return rows;
}

int count_containing(const std::vector<std::string>& rows, const std::string& text) {
  int n = 0;
  for (const std::string& row : rows) n += row.find(text) != std::string::npos;
  return n;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// SFT alone: 24 records in batches of 2 -> 12 optimizer steps (the count is read back from the
// summary), a DeepSpeed line every 3.
json sft_only() {
  return {{"steps", {1}}, {"step1", {{"per_device_train_batch_size", 2}, {"print_interval", 3}}}};
}

TEST(RunDisplay, OnATerminalTheBarRedrawsInPlaceBelowTheLogLines) {
  testing::TempDir tmp;
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), sft_only());
  // `script` runs the command on a pseudo-terminal and copies what it writes there to out.txt.
  const std::string command = std::string(DSCHAT_CLI_PATH) + " train --config " + config.string();
  std::string out;
  ASSERT_EQ(testing::run_command("script -qfec '" + command + "' " + (tmp / "typescript").string() + " > " +
                                     (tmp / "out.txt").string() + " 2>&1 < /dev/null",
                                 &out),
            0)
      << out << read_file(tmp / "out.txt");
  const std::string bytes = read_file(tmp / "out.txt");
  const int64_t steps =
      core::read_json_file((tmp / "out/actor/training_summary.json").string()).at("optimizer_steps").get<int64_t>();
  ASSERT_GE(steps, 6) << bytes;
  const std::vector<std::string> rows = terminal_rows(bytes);
  std::string screen;
  for (const std::string& row : rows) screen += row + "\n";
  // One bar row for the step's progress, left on screen when it ends.
  EXPECT_EQ(count_containing(rows, "] " + std::to_string(steps) + "/" + std::to_string(steps)), 1) << screen;
  EXPECT_EQ(count_containing(rows, "/" + std::to_string(steps) + "  "), 1) << screen;
  // The DeepSpeed line once per print_interval, each on its own row, none on the bar's.
  EXPECT_EQ(count_containing(rows, "Model Parameters:"), steps / 3) << screen;
  for (const std::string& row : rows) {
    if (row.find("Model Parameters:") != std::string::npos) EXPECT_EQ(row.find("#"), std::string::npos) << row;
  }
  // The bar was drawn many times (it redraws, and again below each log line), yet occupies one row.
  size_t draws = 0;
  for (size_t at = bytes.find("SFT ["); at != std::string::npos; at = bytes.find("SFT [", at + 1)) ++draws;
  EXPECT_GT(draws, 2u);
  EXPECT_EQ(count_containing(rows, "SFT ["), 1) << screen;
}

TEST(RunDisplay, ThroughAPipeOnePlainLinePerPrintInterval) {
  testing::TempDir tmp;
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), sft_only());
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " train --config " + config.string() + " 2>&1 | cat",
                                 &out),
            0)
      << out;
  EXPECT_EQ(out.find('\r'), std::string::npos);
  EXPECT_EQ(out.find("\033["), std::string::npos);
  const json summary = core::read_json_file((tmp / "out/actor/training_summary.json").string());
  const int64_t steps = summary.at("optimizer_steps").get<int64_t>();
  std::vector<std::string> rows = terminal_rows(out);
  EXPECT_EQ(count_containing(rows, "Model Parameters:"), steps / 3) << out;
  // Progress lines at every print_interval and at the end.
  EXPECT_EQ(count_containing(rows, "/" + std::to_string(steps) + "  "), steps / 3 + (steps % 3 != 0)) << out;

  // The overview table, logged as the step starts and kept in the summary.
  const size_t table = out.find("step1 (sft) on cpu, 1 rank:");
  ASSERT_NE(table, std::string::npos) << out;
  EXPECT_LT(table, out.find("Model Parameters:"));
  EXPECT_NE(out.find("planned per rank: resident"), std::string::npos) << out;
  const json& overview = summary.at("run_overview");
  EXPECT_EQ(overview.at("device"), "cpu");
  EXPECT_EQ(overview.at("world_size"), 1);
  ASSERT_EQ(overview.at("models").size(), 1u);
  const json& model = overview["models"][0];
  EXPECT_EQ(model.at("role"), "model");
  EXPECT_EQ(model.at("dtype"), "fp32");
  EXPECT_EQ(model.at("offload"), "no");
  const auto saved = models::load_causal_lm((tmp / "out/actor").string());
  int64_t parameters = 0;
  for (const auto& p : saved->parameters()) parameters += p.numel();
  EXPECT_EQ(model.at("parameters").get<int64_t>(), parameters);
  EXPECT_GT(model.at("planned_resident_bytes_per_rank").get<int64_t>(), parameters * 4);  // weights + Adam
  EXPECT_GE(overview.at("planned_peak_bytes_per_rank").get<int64_t>(),
            overview.at("planned_resident_bytes_per_rank").get<int64_t>());
}

TEST(RunDisplay, SaveFormatBinLoadsInTransformersAndDeepSpeedChatsRewardModel) {
  testing::TempDir tmp;
  const fs::path config = testing::write_tiny_pipeline_config(tmp.path(), {{"steps", {1, 2}}});
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " train --config " + config.string() +
                                     " --save-format bin --no-progress",
                                 &out),
            0)
      << out;
  for (const char* dir : {"out/actor", "out/reward"}) {
    EXPECT_TRUE(fs::exists(tmp / dir / "pytorch_model.bin")) << dir;
    EXPECT_FALSE(fs::exists(tmp / dir / "model.safetensors")) << dir;
    EXPECT_TRUE(fs::exists(tmp / dir / "config.json")) << dir;
  }
  // The actor through transformers; the reward model as DeepSpeed-Chat's step 3 builds its critic:
  // AutoModel.from_config, then torch.load of pytorch_model.bin into RewardModel (strict).
  const std::vector<int64_t> ids = {2, 464, 2068, 7586, 21831, 18045, 625, 262};
  const std::string script =
      "import json, sys, torch\n"
      "from transformers import AutoConfig, AutoModel, AutoModelForCausalLM\n"
      "ids = torch.tensor([" + json(ids).dump() + "])\n"
      "lm = AutoModelForCausalLM.from_pretrained('" + (tmp / "out/actor").string() + "', dtype=torch.float32).eval()\n"
      "class RewardModel(torch.nn.Module):\n"
      "    def __init__(self, base, hidden):\n"
      "        super().__init__()\n"
      "        self.rwtransformer = base\n"
      "        self.v_head = torch.nn.Linear(hidden, 1, bias=False)\n"
      "cfg = AutoConfig.from_pretrained('" + (tmp / "out/reward").string() + "')\n"
      "hidden = getattr(cfg, 'word_embed_proj_dim', cfg.hidden_size)\n"
      "rm = RewardModel(AutoModel.from_config(cfg), hidden).eval()\n"
      "state = torch.load('" + (tmp / "out/reward/pytorch_model.bin").string() + "', map_location='cpu')\n"
      "rm.load_state_dict(state, strict=True)\n"
      "with torch.no_grad():\n"
      "    logits = lm(input_ids=ids).logits[0]\n"
      "    values = rm.v_head(rm.rwtransformer(input_ids=ids).last_hidden_state).squeeze(-1)[0]\n"
      "json.dump({'logits': logits.tolist(), 'values': values.tolist()}, open(sys.argv[1], 'w'))\n";
  const json expected = testing::run_python_json(script);
  ASSERT_TRUE(expected.is_object()) << expected;
  torch::NoGradGuard no_grad;
  const torch::Tensor input = torch::tensor(ids).unsqueeze(0);  // [1, T]
  auto lm = models::load_causal_lm((tmp / "out/actor").string());
  const torch::Tensor logits = lm->forward(input)[0];  // [T, V]
  for (size_t t = 0; t < ids.size(); ++t) {
    EXPECT_LT(testing::max_abs_diff(logits[t], torch::tensor(expected["logits"][t].get<std::vector<float>>())), 1e-4)
        << "position " << t;
  }
  auto rm = models::load_value_model((tmp / "out/reward").string());
  const torch::Tensor values = rm->forward(input)[0];  // [T]
  EXPECT_LT(testing::max_abs_diff(values, torch::tensor(expected["values"].get<std::vector<float>>())), 1e-4);
}

}  // namespace
}  // namespace dschat
