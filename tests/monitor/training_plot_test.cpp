// `dschat plot`: the PNG encoder (libpng; checked by Python's zlib and struct), the panels drawn from a
// run directory's metrics logs, and the CLI command.
#include "dschat/monitor/training_plot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dschat/monitor/metrics_log.h"
#include "monitor/png_canvas.h"
#include "test_util.h"

namespace dschat {
namespace {

using monitor::Rgb;
using testing::TempDir;

// Decodes the PNG at `path` with the standard library only; reports the chunk names (after
// checking every CRC), IHDR fields, the pixels at `probes` and how many pixels have each colour
// in `colours`.
nlohmann::json decode_png_in_python(const std::filesystem::path& path, const nlohmann::json& probes,
                                    const nlohmann::json& colours) {
  const std::string script = R"PY(
import collections, json, struct, sys, zlib
path = r""")PY" + path.string() + R"PY("""
probes = json.loads(r""")PY" + probes.dump() + R"PY(""")
colours = json.loads(r""")PY" + colours.dump() + R"PY(""")
data = open(path, "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "signature"
pos, chunks, idat = 8, [], b""
while pos < len(data):
    (n,) = struct.unpack(">I", data[pos:pos + 4])
    kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
    (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
    assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, "crc of %r" % kind
    chunks.append(kind.decode())
    if kind == b"IHDR":
        width, height, depth, colour_type, compression, filt, interlace = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)  # also checks the Adler-32 trailer
stride = 1 + 3 * width
assert len(raw) == height * stride, "raw size"
assert all(raw[y * stride] == 0 for y in range(height)), "filter bytes"
def pixel(x, y):
    i = y * stride + 1 + 3 * x
    return list(raw[i:i + 3])
counts = collections.Counter()
for y in range(height):
    row = raw[y * stride + 1:(y + 1) * stride]
    counts.update(zip(row[0::3], row[1::3], row[2::3]))
json.dump({"chunks": chunks, "width": width, "height": height, "depth": depth, "colour_type": colour_type,
           "interlace": interlace, "probes": [pixel(x, y) for x, y in probes],
           "counts": [counts[tuple(c)] for c in colours]}, open(sys.argv[1], "w"))
)PY";
  return testing::run_python_json(script);
}

nlohmann::json rgb_json(Rgb c) { return nlohmann::json::array({c.r, c.g, c.b}); }

TEST(TrainingPlot, CanvasEncodesAPngThatPythonDecodes) {
  // 200 x 150 RGB rows are 90150 bytes; compressed they are a small fraction of that.
  monitor::PngCanvas canvas(200, 150, monitor::palette::kWhite);
  canvas.fill_rect(10, 10, 19, 14, monitor::palette::kRed);
  canvas.draw_line(0, 149, 199, 0, monitor::palette::kBlue);
  canvas.draw_text(30, 100, "Step 12", monitor::palette::kBlack, 2);
  canvas.set_pixel(-5, 3, monitor::palette::kGreen);  // clipped, no error
  canvas.set_pixel(199, 149, monitor::palette::kGreen);
  TempDir tmp;
  const auto file = tmp / "sub" / "canvas.png";
  canvas.write_png(file);
  ASSERT_TRUE(std::filesystem::exists(file));
  EXPECT_LT(std::filesystem::file_size(file), 90150u / 10) << "the PNG is not compressed";

  const nlohmann::json probes = {{10, 10}, {19, 14}, {20, 14}, {199, 149}, {0, 149}, {100, 75}, {0, 0}};
  const nlohmann::json result = decode_png_in_python(
      file, probes, nlohmann::json::array({rgb_json(monitor::palette::kRed), rgb_json(monitor::palette::kBlack)}));
  ASSERT_TRUE(result.is_object()) << result.dump();
  EXPECT_EQ(result["chunks"], nlohmann::json({"IHDR", "IDAT", "IEND"}));
  EXPECT_EQ(result["width"], 200);
  EXPECT_EQ(result["height"], 150);
  EXPECT_EQ(result["depth"], 8);
  EXPECT_EQ(result["colour_type"], 2);
  EXPECT_EQ(result["interlace"], 0);
  for (size_t i = 0; i < probes.size(); ++i) {
    const Rgb expected = canvas.pixel(probes[i][0], probes[i][1]);
    EXPECT_EQ(result["probes"][i], rgb_json(expected)) << "pixel " << probes[i].dump();
  }
  EXPECT_EQ(result["probes"][0], rgb_json(monitor::palette::kRed));
  EXPECT_EQ(result["probes"][2], rgb_json(monitor::palette::kWhite));
  EXPECT_EQ(result["probes"][3], rgb_json(monitor::palette::kGreen));
  EXPECT_EQ(result["probes"][4], rgb_json(monitor::palette::kBlue));  // the line's first end point
  EXPECT_EQ(result["counts"][0], 50);                             // the 10 x 5 rectangle
  EXPECT_GT(result["counts"][1].get<int>(), 40);                  // the glyphs
  EXPECT_THROW(canvas.pixel(200, 0), core::InvalidArgument);
  EXPECT_THROW(monitor::PngCanvas(0, 10), core::InvalidArgument);
}

// A `dschat train` layout: step 1 logs under actor/, step 3 under step3/ (no reward model here).
void write_demo_run(const std::filesystem::path& run) {
  monitor::MetricsLog sft(run / "actor");
  for (int step = 0; step < 50; ++step) {
    sft.write("sft", step, {{"loss", 3.0 * std::exp(-step / 20.0)}, {"lr", 1e-4}});
    if (step % 10 == 9) sft.write("sft", step, {{"eval_loss", 3.2 * std::exp(-step / 25.0)}, {"eval_ppl", 9.0}});
  }
  monitor::MetricsLog ppo(run / "step3");
  for (int step = 1; step <= 30; ++step) {
    const double reward = step == 7 ? std::numeric_limits<double>::quiet_NaN() : -1.0 + step * 0.05;
    ppo.write("ppo", step,
              {{"reward", reward}, {"reward_ema", -1.0 + step * 0.04}, {"kl", 0.01 * step},
               {"actor_loss", 0.5 / step}, {"critic_loss", 1.0 / step}, {"answer_len", 12.0}});
  }
}

TEST(TrainingPlot, DrawsOnePanelPerCurveGroupFound) {
  TempDir tmp;
  write_demo_run(tmp / "run");
  const auto png = tmp / "curves.png";
  const int panels = monitor::plot_training_curves(tmp / "run", png, 1200, 260);
  EXPECT_EQ(panels, 4);  // sft loss; ppo reward, kl, losses

  const nlohmann::json colours = nlohmann::json::array(
      {rgb_json(monitor::palette::kBlue), rgb_json(monitor::palette::kOrange), rgb_json(monitor::palette::kRed),
       rgb_json(monitor::palette::kGreen)});
  const nlohmann::json result = decode_png_in_python(png, nlohmann::json::array(), colours);
  ASSERT_TRUE(result.is_object()) << result.dump();
  EXPECT_EQ(result["width"], 1200);
  EXPECT_EQ(result["height"], 4 * 260);
  EXPECT_GT(result["counts"][0].get<int>(), 2000);  // blue: the main curve of every panel
  EXPECT_GT(result["counts"][1].get<int>(), 200);   // orange: eval_loss points, reward_ema
  EXPECT_GT(result["counts"][2].get<int>(), 200);   // red: critic_loss
  EXPECT_EQ(result["counts"][3], 0);                // green: eval_acc of the (absent) reward model
  // The temp file of the atomic write is gone.
  for (const auto& entry : std::filesystem::directory_iterator(tmp.path())) {
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

TEST(TrainingPlot, ReportsMissingOrUnknownMetrics) {
  TempDir tmp;
  std::filesystem::create_directories(tmp / "empty" / "actor");
  EXPECT_THROW_WITH(monitor::plot_training_curves(tmp / "empty", tmp / "a.png"), core::NotFound,
                    (tmp / "empty").string());
  EXPECT_THROW_WITH(monitor::plot_training_curves(tmp / "absent", tmp / "a.png"), core::NotFound, "absent");

  monitor::MetricsLog log(tmp / "other");
  log.write("sft", 1, {{"lr", 1e-4}, {"loss", std::numeric_limits<double>::quiet_NaN()}});
  EXPECT_THROW_WITH(monitor::plot_training_curves(tmp / "other", tmp / "a.png"), core::InvalidArgument,
                    "none of the plotted curves");
  EXPECT_FALSE(std::filesystem::exists(tmp / "a.png"));
  EXPECT_THROW_WITH(monitor::plot_training_curves(tmp / "other", tmp / "a.png", 100), core::InvalidArgument,
                    "width");
}

TEST(TrainingPlot, CliPlotCommandWritesThePng) {
  TempDir tmp;
  {
    monitor::MetricsLog log(tmp / "run" / "reward");
    for (int step = 0; step < 5; ++step) log.write("rm", step, {{"loss", 0.7 - 0.1 * step}});
    log.write("rm", 4, {{"eval_acc", 0.75}, {"eval_chosen", 1.0}, {"eval_rejected", -1.0}});
  }
  std::string output;
  const std::string run = (tmp / "run").string();
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " plot " + run, &output), 0) << output;
  EXPECT_NE(output.find("wrote " + run + "/training_curves.png (1 panel)"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::exists(tmp / "run" / "training_curves.png"));

  const std::string custom = (tmp / "out" / "c.png").string();
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " plot " + run + " --output " + custom, &output), 0)
      << output;
  EXPECT_NE(output.find("wrote " + custom + " (1 panel)"), std::string::npos) << output;

  EXPECT_EQ(testing::run_command(std::string(DSCHAT_CLI_PATH) + " plot " + (tmp / "nothing").string(), &output), 1);
  EXPECT_NE(output.find("dschat: error: "), std::string::npos) << output;
}

}  // namespace
}  // namespace dschat
