// Checkpoint stall benchmark: how long training stops for each save, with synchronous saves
// (TrainingEngine::save_checkpoint, the write on the caller's time) against asynchronous ones (a
// snapshot into host memory, the write on an AsyncCheckpointWriter's thread, waited for at the
// next save, as rlhf::StepRunner does), and the cost of no saves at all, in one run on the same
// model, batches and save schedule. Modes alternate over --rounds, each with a fresh engine.
//
// Per mode: the stall of each save (from the call until training may continue: for async, the
// wait for the previous write plus the snapshot), the step time (forward, backward, optimizer)
// with no write in flight and while a background write is, the wait at the end for the last
// write, and the loop's wall time. Prints a markdown table; --out writes JSON.
//
//   dschat_checkpoint_bench [--out F] [--model opt-125m] [--device cpu] [--steps 12] [--save-every 4]
//       [--batch 2] [--seq 128] [--threads 2] [--rounds 2] [--dir /tmp/dschat_checkpoint_bench]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "bench_device.h"
#include "bench_util.h"
#include "dschat/core/host_memory.h"
#include "dschat/core/model_config.h"
#include "dschat/engine/async_checkpoint_writer.h"
#include "dschat/engine/training_engine.h"
#include "dschat/models/causal_lm.h"
#include "io/atomic_file.h"

namespace {

using nlohmann::json;
using namespace dschat;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string out, model = "opt-125m", device = "cpu", dir = "/tmp/dschat_checkpoint_bench";
  int64_t steps = 12, save_every = 4, batch = 2, seq = 128, threads = 2, rounds = 2;
};

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct ModeResult {
  std::vector<double> stalls, quiet_steps, busy_steps;
  double final_wait = 0.0, loop_seconds = 0.0;
  int64_t save_bytes = 0;
};

// One mode ("none", "sync", "async"): `steps` optimizer steps of a fresh engine, saving every
// save_every steps.
ModeResult run_mode(const Options& o, const std::string& mode, const fs::path& dir) {
  const torch::Device device(o.device);
  core::ModelConfig config = *core::model_preset(o.model);
  config.dropout = config.attention_dropout = config.activation_dropout = 0.0;
  torch::manual_seed(1);
  models::CausalLM model(config);
  model->to(device);
  model->train();
  engine::TrainingEngineOptions options;
  options.config = engine::DeepSpeedConfig::parse(
      {{"train_micro_batch_size_per_gpu", o.batch}, {"train_batch_size", o.batch}, {"steps_per_print", 0}}, 1,
      "checkpoint_bench");
  options.optimizer.lr = 1e-4;
  engine::TrainingEngine engine(model.ptr(), options);
  engine::AsyncCheckpointWriter writer;
  io::remove_directory_tree(dir);

  ModeResult r;
  const auto loop_start = Clock::now();
  for (int64_t step = 0; step < o.steps; ++step) {
    torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + step));
    const torch::Tensor ids = torch::randint(3, config.vocab_size, {o.batch, o.seq}, generator, torch::kInt64)
                                  .to(device);  // [B, T]
    const bool busy = writer.busy();
    const auto step_start = Clock::now();
    torch::Tensor logits = model->forward(ids);  // [B, T, V]
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        logits.narrow(1, 0, o.seq - 1).reshape({-1, logits.size(2)}).to(torch::kFloat32),
        ids.narrow(1, 1, o.seq - 1).reshape({-1}));
    engine.backward(loss);
    engine.step();
    bench::synchronize(device);
    (busy ? r.busy_steps : r.quiet_steps).push_back(seconds_since(step_start));
    if (mode == "none" || (step + 1) % o.save_every != 0) continue;
    const auto save_start = Clock::now();
    if (mode == "async") {
      engine::wait_for_checkpoint_writes(writer, nullptr);  // the previous save
      engine.save_checkpoint(dir, "", json::object(), &writer);
    } else {
      engine.save_checkpoint(dir, "");
    }
    r.stalls.push_back(seconds_since(save_start));
  }
  const auto wait_start = Clock::now();
  engine::wait_for_checkpoint_writes(writer, nullptr);
  r.final_wait = seconds_since(wait_start);
  r.loop_seconds = seconds_since(loop_start);
  if (mode != "none") {
    const fs::path tag = dir / ("global_step" + std::to_string(o.steps - o.steps % o.save_every));
    for (const auto& entry : fs::directory_iterator(tag)) r.save_bytes += static_cast<int64_t>(entry.file_size());
  }
  io::remove_directory_tree(dir);
  return r;
}

json summary(const std::vector<ModeResult>& rounds) {
  std::vector<double> stalls, quiet, busy, final_wait, loop;
  int64_t bytes = 0;
  for (const ModeResult& r : rounds) {
    stalls.insert(stalls.end(), r.stalls.begin(), r.stalls.end());
    quiet.insert(quiet.end(), r.quiet_steps.begin() + (r.quiet_steps.empty() ? 0 : 1), r.quiet_steps.end());
    busy.insert(busy.end(), r.busy_steps.begin(), r.busy_steps.end());
    final_wait.push_back(r.final_wait);
    loop.push_back(r.loop_seconds);
    bytes = r.save_bytes;
  }
  return {{"stall_per_save_s", bench::median(stalls)}, {"stalls_s", stalls},
          {"step_s_no_write", bench::median(quiet)}, {"step_s_during_write", bench::median(busy)},
          {"steps_during_write", busy.size()}, {"final_wait_s", bench::median(final_wait)},
          {"loop_s", bench::median(loop)}, {"bytes_per_save", bytes}};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("checkpoint stall: synchronous vs asynchronous saves");
  app.add_option("--out", o.out);
  app.add_option("--model", o.model, "model preset (random weights)");
  app.add_option("--device", o.device);
  app.add_option("--steps", o.steps);
  app.add_option("--save-every", o.save_every);
  app.add_option("--batch", o.batch);
  app.add_option("--seq", o.seq);
  app.add_option("--threads", o.threads);
  app.add_option("--rounds", o.rounds);
  app.add_option("--dir", o.dir, "where the checkpoints are written (removed after each mode)");
  CLI11_PARSE(app, argc, argv);
  try {
    at::set_num_threads(static_cast<int>(o.threads));
    core::retain_freed_host_memory();  // as the dschat CLI does: snapshot buffers are reused, not faulted in anew
    std::map<std::string, std::vector<ModeResult>> results;
    for (int64_t round = 0; round < o.rounds; ++round) {
      for (const char* mode : {"none", "sync", "async"}) {
        std::cerr << "[checkpoint] round " << round << ": " << mode << "\n";
        results[mode].push_back(run_mode(o, mode, fs::path(o.dir) / mode));
      }
    }
    json report = {{"model", o.model}, {"device", o.device}, {"steps", o.steps}, {"save_every", o.save_every},
                   {"batch", o.batch}, {"seq", o.seq}, {"threads", o.threads}, {"rounds", o.rounds}};
    for (const auto& [mode, rounds] : results) report[mode] = summary(rounds);
    const json &none = report["none"], &sync = report["sync"], &async = report["async"];
    std::cout << std::fixed << std::setprecision(3) << "| mode | stall per save (s) | step, no write (s) | "
              << "step, write in flight (s) | final wait (s) | loop (s) |\n|---|---|---|---|---|---|\n";
    for (const char* mode : {"none", "sync", "async"}) {
      const json& m = report[mode];
      std::cout << "| " << mode << " | " << m["stall_per_save_s"].get<double>() << " | "
                << m["step_s_no_write"].get<double>() << " | " << m["step_s_during_write"].get<double>() << " | "
                << m["final_wait_s"].get<double>() << " | " << m["loop_s"].get<double>() << " |\n";
    }
    const double ratio = async["stall_per_save_s"].get<double>() / sync["stall_per_save_s"].get<double>();
    report["stall_ratio_async_over_sync"] = ratio;
    std::cout << "\nbytes per save: " << sync["bytes_per_save"].get<int64_t>() << "; stall per save, async / sync: "
              << ratio << "; loop time over no saves: sync +"
              << sync["loop_s"].get<double>() - none["loop_s"].get<double>() << " s, async +"
              << async["loop_s"].get<double>() - none["loop_s"].get<double>() << " s\n";
    if (!o.out.empty()) std::ofstream(o.out) << report.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "dschat_checkpoint_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
