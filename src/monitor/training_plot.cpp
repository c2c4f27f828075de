#include "dschat/monitor/training_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/monitor/metrics_log.h"
#include "monitor/png_canvas.h"

namespace dschat {
namespace monitor {
namespace {

namespace fs = std::filesystem;

struct CurveSpec {
  const char* name;  // metric name within the panel's phase
  Rgb colour;
  bool points;  // eval metrics are sparse: markers instead of a line
};

struct PanelSpec {
  const char* title;
  const char* phase;
  std::vector<CurveSpec> curves;
};

const std::vector<PanelSpec>& panel_specs() {
  static const std::vector<PanelSpec> specs = {
      {"SFT (step 1): loss", "sft", {{"loss", palette::kBlue, false}, {"eval_loss", palette::kOrange, true}}},
      {"Reward model (step 2): loss, eval accuracy",
       "rm",
       {{"loss", palette::kBlue, false}, {"eval_acc", palette::kGreen, true}}},
      {"PPO (step 3): reward", "ppo", {{"reward", palette::kBlue, false}, {"reward_ema", palette::kOrange, false}}},
      {"PPO (step 3): KL to the reference", "ppo", {{"kl", palette::kBlue, false}}},
      {"PPO (step 3): losses", "ppo", {{"actor_loss", palette::kBlue, false}, {"critic_loss", palette::kRed, false}}},
  };
  return specs;
}

using Series = std::vector<std::pair<int64_t, double>>;  // (step, value), finite values only
using SeriesKey = std::pair<std::string, std::string>;   // (phase, name)

std::vector<fs::path> find_metrics_files(const fs::path& run_dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  if (fs::is_regular_file(run_dir, ec)) {
    files.push_back(run_dir);
    return files;
  }
  DSCHAT_CHECK(fs::is_directory(run_dir, ec), NotFound, run_dir.string(), ": no such run directory");
  fs::recursive_directory_iterator it(run_dir, fs::directory_options::skip_permission_denied, ec);
  DSCHAT_CHECK(!ec, IoError, run_dir.string(), ": cannot list: ", ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    DSCHAT_CHECK(!ec, IoError, run_dir.string(), ": cannot list: ", ec.message());
    if (it->path().filename() == "metrics.jsonl" && it->is_regular_file(ec)) files.push_back(it->path());
  }
  DSCHAT_CHECK(!files.empty(), NotFound, run_dir.string(), ": no metrics.jsonl below this directory");
  std::sort(files.begin(), files.end());
  return files;
}

std::map<SeriesKey, Series> load_series(const std::vector<fs::path>& files) {
  std::map<SeriesKey, Series> series;
  for (const fs::path& file : files) {
    for (const MetricsRow& row : read_metrics_jsonl(file)) {
      for (const auto& value : row.values) {
        if (std::isfinite(value.second)) series[{row.phase, value.first}].emplace_back(row.step, value.second);
      }
    }
  }
  // A resumed run may log a step twice or out of order; lines are drawn in step order.
  for (auto& entry : series) {
    std::stable_sort(entry.second.begin(), entry.second.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
  }
  return series;
}

std::string format_value(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.4g", v);
  return buffer;
}

// One panel in the canvas rows [top, top + height).
class PanelPainter {
 public:
  PanelPainter(PngCanvas& canvas, int top, int height)
      : canvas_(canvas),
        left_(kLeftMargin),
        right_(canvas.width() - kRightMargin),
        plot_top_(top + kTopMargin),
        plot_bottom_(top + height - kBottomMargin),
        top_(top) {}

  void draw(const PanelSpec& spec, const std::vector<std::pair<const CurveSpec*, const Series*>>& curves) {
    int64_t x_min = curves.front().second->front().first, x_max = x_min;
    double y_min = curves.front().second->front().second, y_max = y_min;
    for (const auto& curve : curves) {
      for (const auto& point : *curve.second) {
        x_min = std::min(x_min, point.first);
        x_max = std::max(x_max, point.first);
        y_min = std::min(y_min, point.second);
        y_max = std::max(y_max, point.second);
      }
    }
    x_lo_ = static_cast<double>(x_min);
    x_hi_ = static_cast<double>(x_max);
    if (x_hi_ == x_lo_) {  // one step: centre it
      x_lo_ -= 1;
      x_hi_ += 1;
    }
    // 8% headroom above and below so curves do not run along the frame.
    const double span = y_max > y_min ? y_max - y_min : std::max(std::fabs(y_max) * 0.1, 0.5);
    y_lo_ = y_min - 0.08 * span;
    y_hi_ = y_max + 0.08 * span;
    if (y_max == y_min) {
      y_lo_ = y_min - span;
      y_hi_ = y_max + span;
    }

    draw_frame(x_min, x_max, y_min, y_max);
    canvas_.draw_text(left_, top_ + 10, spec.title, palette::kBlack, 2);
    int legend_x = left_ + PngCanvas::text_width(spec.title, 2) + 40;
    for (const auto& curve : curves) legend_x = draw_legend_entry(legend_x, *curve.first);
    for (const auto& curve : curves) draw_curve(*curve.first, *curve.second);
  }

 private:
  static constexpr int kLeftMargin = 120;
  static constexpr int kRightMargin = 30;
  static constexpr int kTopMargin = 38;
  static constexpr int kBottomMargin = 40;
  static constexpr int kTextScale = 2;

  double px(double step) const { return left_ + (step - x_lo_) / (x_hi_ - x_lo_) * (right_ - left_); }
  double py(double value) const { return plot_bottom_ - (value - y_lo_) / (y_hi_ - y_lo_) * (plot_bottom_ - plot_top_); }

  void draw_frame(int64_t x_min, int64_t x_max, double y_min, double y_max) {
    const int text_h = PngCanvas::text_height(kTextScale);
    // Light horizontal grid at the data min, max and the quarters between.
    for (int q = 0; q <= 4; ++q) {
      const int y = static_cast<int>(std::lround(py(y_min + (y_max - y_min) * q / 4.0)));
      canvas_.fill_rect(left_ + 1, y, right_ - 1, y, palette::kGrid);
    }
    canvas_.draw_rect(left_, plot_top_, right_, plot_bottom_, palette::kAxis);
    // y ticks: data max and min (one label when they coincide).
    std::vector<double> y_ticks = {y_max};
    if (y_min != y_max) y_ticks.push_back(y_min);
    for (double value : y_ticks) {
      const int y = static_cast<int>(std::lround(py(value)));
      canvas_.fill_rect(left_ - 6, y, left_ - 1, y, palette::kAxis);
      const std::string label = format_value(value);
      canvas_.draw_text(left_ - 10 - PngCanvas::text_width(label, kTextScale), y - text_h / 2, label,
                        palette::kBlack, kTextScale);
    }
    // x ticks: first and last step, with the axis name between them.
    const int label_y = plot_bottom_ + 10;
    std::vector<int64_t> x_ticks = {x_min};
    if (x_max != x_min) x_ticks.push_back(x_max);
    for (int64_t step : x_ticks) {
      const int x = static_cast<int>(std::lround(px(static_cast<double>(step))));
      canvas_.fill_rect(x, plot_bottom_ + 1, x, plot_bottom_ + 6, palette::kAxis);
      const std::string label = std::to_string(step);
      const int w = PngCanvas::text_width(label, kTextScale);
      const int text_x = std::max(left_ - w / 2, std::min(x - w / 2, right_ - w));
      canvas_.draw_text(text_x, label_y, label, palette::kBlack, kTextScale);
    }
    const std::string axis_name = "step";
    canvas_.draw_text((left_ + right_ - PngCanvas::text_width(axis_name, kTextScale)) / 2, label_y, axis_name,
                      palette::kAxis, kTextScale);
  }

  int draw_legend_entry(int x, const CurveSpec& curve) {
    const int mid = top_ + 10 + PngCanvas::text_height(kTextScale) / 2;
    if (curve.points) {
      canvas_.fill_rect(x + 6, mid - 3, x + 12, mid + 3, curve.colour);
    } else {
      canvas_.fill_rect(x, mid - 1, x + 18, mid + 1, curve.colour);
    }
    canvas_.draw_text(x + 26, top_ + 10, curve.name, palette::kBlack, kTextScale);
    return x + 26 + PngCanvas::text_width(curve.name, kTextScale) + 30;
  }

  void draw_curve(const CurveSpec& curve, const Series& points) {
    if (curve.points || points.size() == 1) {
      for (const auto& point : points) {
        const int x = static_cast<int>(std::lround(px(static_cast<double>(point.first))));
        const int y = static_cast<int>(std::lround(py(point.second)));
        canvas_.fill_rect(x - 3, y - 3, x + 3, y + 3, curve.colour);
      }
      if (curve.points) return;
    }
    for (size_t i = 1; i < points.size(); ++i) {
      canvas_.draw_line(px(static_cast<double>(points[i - 1].first)), py(points[i - 1].second),
                        px(static_cast<double>(points[i].first)), py(points[i].second), curve.colour, 2);
    }
  }

  PngCanvas& canvas_;
  int left_, right_, plot_top_, plot_bottom_, top_;
  double x_lo_ = 0, x_hi_ = 1, y_lo_ = 0, y_hi_ = 1;
};

}  // namespace

int plot_training_curves(const fs::path& run_dir, const fs::path& png_path, int width, int height_per_panel) {
  DSCHAT_CHECK(width >= 400 && width <= 16384, InvalidArgument, "plot_training_curves: width ", width,
               " is outside 400..16384");
  DSCHAT_CHECK(height_per_panel >= 120 && height_per_panel <= 3000, InvalidArgument,
               "plot_training_curves: height_per_panel ", height_per_panel, " is outside 120..3000");
  const std::vector<fs::path> files = find_metrics_files(run_dir);
  const std::map<SeriesKey, Series> series = load_series(files);

  // Panels with at least one curve that has a finite value, in the fixed order above.
  std::vector<std::pair<const PanelSpec*, std::vector<std::pair<const CurveSpec*, const Series*>>>> panels;
  for (const PanelSpec& spec : panel_specs()) {
    std::vector<std::pair<const CurveSpec*, const Series*>> curves;
    for (const CurveSpec& curve : spec.curves) {
      auto it = series.find({spec.phase, curve.name});
      if (it != series.end() && !it->second.empty()) curves.emplace_back(&curve, &it->second);
    }
    if (!curves.empty()) panels.emplace_back(&spec, std::move(curves));
  }
  DSCHAT_CHECK(!panels.empty(), InvalidArgument, run_dir.string(), ": the ", files.size(),
               " metrics.jsonl file(s) hold none of the plotted curves (sft loss/eval_loss, rm loss/eval_acc, "
               "ppo reward/reward_ema/kl/actor_loss/critic_loss)");

  PngCanvas canvas(width, static_cast<int>(panels.size()) * height_per_panel, palette::kWhite);
  for (size_t i = 0; i < panels.size(); ++i) {
    const int top = static_cast<int>(i) * height_per_panel;
    if (i > 0) canvas.fill_rect(0, top, width - 1, top, palette::kGrid);  // separator
    PanelPainter(canvas, top, height_per_panel).draw(*panels[i].first, panels[i].second);
  }
  canvas.write_png(png_path);
  core::log_debug("plot: ", panels.size(), " panels from ", files.size(), " metrics file(s) to ", png_path.string());
  return static_cast<int>(panels.size());
}

}  // namespace monitor
}  // namespace dschat
