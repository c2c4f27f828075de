// Decode bandwidth: how close dschat's InferenceEngine (or ContinuousEngine) decode step comes to
// the memory-bandwidth limit. A decode step must read every weight once and every row's KV cache up to its position,
// so bytes/step = parameter bytes + 2 (K and V) * layers * B * context * kv_heads * head_dim *
// element bytes, with context the step's mean position (prompt + new_tokens / 2). The step time
// is (t(N new tokens) - t(1 new token)) / (N - 1): the difference removes the prefill, each time
// the median of --iters calls after --warmup, taken after a device synchronise.
// For each batch size and mode (eager and graph: the static engine without and with CUDA-graph
// decode where the build has it; continuous and continuous-graph: the same for the continuous
// engine, every row submitted at once over a pool of batch x (prompt + new tokens)), prints
// step time, decode tokens/s, achieved TB/s and that as a fraction of --peak-bandwidth (4.3e12 B/s:
// the H200's HBM3e), and the whole call's tokens/s. Random weights of a preset (no checkpoint).
//
//   dschat_decode_bench [--preset opt-1.3b] [--dtype bf16] [--device cuda] [--batches 1,32,128]
//       [--prompt 256] [--new-tokens 256] [--modes eager,graph[,continuous,continuous-graph]] [--iters 3]
//       [--warmup 1] [--out F]
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>

#include "bench_device.h"
#include "bench_util.h"
#include "dschat/core/error.h"
#include "dschat/core/host_memory.h"
#include "dschat/core/model_config.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"

namespace {

using dschat::bench::median;
using nlohmann::json;
using namespace dschat;

struct Options {
  std::string preset = "opt-1.3b", dtype = "bf16", device = "cuda", out;
  std::vector<int64_t> batches = {1, 32, 128};
  std::vector<std::string> modes = {"eager", "graph"};
  int64_t prompt = 256, new_tokens = 256, iters = 3, warmup = 1, seed = 1234, threads = 0;
  double peak_bandwidth = 4.3e12;
};

torch::ScalarType parse_dtype(const std::string& name) {
  if (name == "bf16") return torch::kBFloat16;
  if (name == "fp16") return torch::kFloat16;
  DSCHAT_CHECK(name == "fp32", InvalidArgument, "--dtype: fp32, bf16 or fp16, not '", name, "'");
  return torch::kFloat32;
}

using Generate = std::function<void(const torch::Tensor& prompts, const torch::Tensor& mask,
                                    const core::GenerationConfig& config)>;

// Median seconds of generate calls of `new_tokens` tokens (after a device synchronise).
double time_generate(const Generate& generate, const torch::Tensor& prompts, int64_t new_tokens,
                     const models::CausalLM& model, const Options& o, const torch::Device& device) {
  core::GenerationConfig config;
  config.max_new_tokens = config.min_new_tokens = new_tokens;
  config.eos_token_id = model->config().eos_token_id;
  config.pad_token_id = model->config().pad_token_id;
  const torch::Tensor mask = torch::ones_like(prompts);  // [B, P]
  std::vector<double> seconds;
  for (int64_t i = 0; i < o.warmup + o.iters; ++i) {
    bench::synchronize(device);
    const auto start = std::chrono::steady_clock::now();
    generate(prompts, mask, config);
    bench::synchronize(device);
    if (i >= o.warmup) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(seconds);
}

int run(const Options& o) {
  if (o.threads > 0) at::set_num_threads(static_cast<int>(o.threads));
  DSCHAT_CHECK(o.new_tokens >= 2, InvalidArgument, "--new-tokens must be at least 2 (got ", o.new_tokens, ")");
  models::LoadOptions load;
  load.random_init = true;
  load.dtype = parse_dtype(o.dtype);
  load.device = torch::Device(o.device);
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  models::CausalLM model = models::load_causal_lm(o.preset, load);
  model->eval();
  const torch::Device device = model->parameters().front().device();
  const core::ModelConfig& c = model->config();
  int64_t parameter_bytes = 0;
  for (const auto& p : model->parameters()) parameter_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  const int64_t element = static_cast<int64_t>(torch::elementSize(load.dtype));
  const int64_t kv_heads = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const int64_t head_dim = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads;
  const double context = static_cast<double>(o.prompt) + static_cast<double>(o.new_tokens) / 2.0;
  std::cout << o.preset << " (random, " << o.dtype << ", " << device << "): " << parameter_bytes / 1e9
            << " GB of parameters; prompt " << o.prompt << ", new tokens " << o.new_tokens << "\n\n"
            << "| mode | batch | step (ms) | decode tokens/s | GB/step | TB/s | of peak | call tokens/s |\n"
            << "|---|---|---|---|---|---|---|---|\n";
  json rows = json::array();
  for (const std::string& mode : o.modes) {
    DSCHAT_CHECK(mode == "eager" || mode == "graph" || mode == "continuous" || mode == "continuous-graph",
                 InvalidArgument, "--modes: eager, graph, continuous, continuous-graph; not '", mode, "'");
    const bool continuous = mode.rfind("continuous", 0) == 0;
    const bool graph = mode == "graph" || mode == "continuous-graph";
    for (int64_t batch : o.batches) {
      std::unique_ptr<inference::InferenceEngine> engine;
      std::unique_ptr<inference::ContinuousEngine> continuous_engine;
      if (continuous) {
        inference::ContinuousEngineOptions options;
        options.max_running_sequences = batch;
        options.size_pool(0, batch, o.prompt + o.new_tokens);
        options.enable_cuda_graph = graph;
        continuous_engine = std::make_unique<inference::ContinuousEngine>(model, options);
      } else {
        inference::InferenceEngineOptions options;
        options.max_out_tokens = o.prompt + o.new_tokens;
        options.enable_cuda_graph = graph;
        options.log_stats = false;
        engine = std::make_unique<inference::InferenceEngine>(model, options);
      }
      const Generate generate = [&](const torch::Tensor& ids, const torch::Tensor& mask,
                                    const core::GenerationConfig& config) {
        if (continuous) {
          continuous_engine->generate(ids, mask, config);
        } else {
          engine->generate(ids, mask, config);
        }
      };
      torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
      const torch::Tensor prompts =
          torch::randint(3, c.vocab_size, {batch, o.prompt}, generator, torch::kInt64).to(device);  // [B, P]
      const int64_t replays_before = continuous ? continuous_engine->stats().cuda_graph_replays : 0;
      const double full = time_generate(generate, prompts, o.new_tokens, model, o, device);
      const int64_t replays = continuous ? continuous_engine->stats().cuda_graph_replays - replays_before
                                         : engine->last_stats().cuda_graph_replays;
      const double prefill = time_generate(generate, prompts, 1, model, o, device);
      const double step = (full - prefill) / static_cast<double>(o.new_tokens - 1);
      const double kv_bytes = 2.0 * static_cast<double>(c.num_hidden_layers * batch * kv_heads * head_dim * element) *
                              context;
      const double bytes = static_cast<double>(parameter_bytes) + kv_bytes;
      const double rate = bytes / step;
      std::printf("| %s%s | %lld | %.3f | %.0f | %.3f | %.3f | %.1f%% | %.0f |\n", mode.c_str(),
                  graph && replays == 0 ? " (no graph ran)" : "", static_cast<long long>(batch), 1e3 * step,
                  static_cast<double>(batch) / step, bytes / 1e9, rate / 1e12, 100.0 * rate / o.peak_bandwidth,
                  static_cast<double>(batch * o.new_tokens) / full);
      rows.push_back({{"mode", mode}, {"batch", batch}, {"step_seconds", step}, {"call_seconds", full},
                      {"prefill_seconds", prefill}, {"bytes_per_step", bytes}, {"bytes_per_second", rate},
                      {"fraction_of_peak", rate / o.peak_bandwidth}, {"cuda_graph_replays", replays}});
    }
  }
  if (!o.out.empty()) {
    std::ofstream(o.out) << json{{"preset", o.preset}, {"dtype", o.dtype}, {"prompt", o.prompt},
                                 {"new_tokens", o.new_tokens}, {"parameter_bytes", parameter_bytes},
                                 {"peak_bandwidth", o.peak_bandwidth}, {"rows", rows}}
                                .dump(1);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dschat::core::retain_freed_host_memory();  // as the dschat CLI runs
  CLI::App app{"dschat decode bandwidth benchmark"};
  Options o;
  app.add_option("--preset", o.preset, "Model shape (a preset name), random weights")->capture_default_str();
  app.add_option("--dtype", o.dtype, "fp32 | bf16 | fp16")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda | cuda:N")->capture_default_str();
  app.add_option("--batches", o.batches, "Batch sizes")->delimiter(',')->capture_default_str();
  app.add_option("--modes", o.modes,
                 "eager, graph (CUDA-graph decode), continuous, continuous-graph (the ContinuousEngine's)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--prompt", o.prompt)->capture_default_str();
  app.add_option("--new-tokens", o.new_tokens)->capture_default_str();
  app.add_option("--iters", o.iters, "Timed calls per point")->capture_default_str();
  app.add_option("--warmup", o.warmup)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--threads", o.threads, "Intra-op threads (0: LibTorch's default)")->capture_default_str();
  app.add_option("--peak-bandwidth", o.peak_bandwidth, "The device's memory bandwidth, bytes/s")->capture_default_str();
  app.add_option("--out", o.out, "JSON report");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "dschat_decode_bench: " << e.what() << "\n";
    return 1;
  }
}
