#pragma once
// `dschat plot`: training curves from the metrics logs of a run, drawn into one PNG.
//
// Reads every metrics.jsonl under run_dir (recursively: a `dschat train` run has
// <out>/actor/metrics.jsonl, <out>/reward/metrics.jsonl, <out>/step3/metrics.jsonl) and draws
// one panel, stacked top to bottom, for each of these that has data:
//   1. sft  loss (line) and eval_loss (points)
//   2. rm   loss (line) and eval_acc (points)
//   3. ppo  reward (mean, line) and reward_ema (line)
//   4. ppo  kl
//   5. ppo  actor_loss and critic_loss
// Each panel has a title, a legend, a frame, min/max tick labels on both axes and step on x.
// NaN values (logged as JSON null) are skipped; missing metrics are simply not drawn.

#include <filesystem>

namespace dschat {
namespace monitor {

/// Draws the panels into png_path (written atomically, width x panels * height_per_panel pixels)
/// and returns the number of panels. run_dir may also be one metrics.jsonl file.
/// Throws core::NotFound naming run_dir when no metrics.jsonl exists below it,
/// core::InvalidArgument when none of the known curves has a finite value (or for a width below
/// 400 or a height_per_panel below 120), core::FormatError for a malformed metrics line.
int plot_training_curves(const std::filesystem::path& run_dir, const std::filesystem::path& png_path,
                         int width = 1200, int height_per_panel = 260);

}  // namespace monitor
}  // namespace dschat
