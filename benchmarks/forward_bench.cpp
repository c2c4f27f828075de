// Forward-pass throughput of a causal LM on the CPU (or GPU): tokens/s of the best of `iters`
// timed runs after `warmup` runs, printed as one JSON line. Driven by forward_bench.py, which runs
// transformers on the same shapes in the same process tree and prints the ratio.
//   dschat_forward_bench --model opt-125m --init random --batch 4 --seq 128 --iters 5
#include <CLI/CLI.hpp>

#include <chrono>
#include <limits>
#include <iostream>

#include "dschat/core/host_memory.h"
#include "dschat/core/dtype.h"
#include "dschat/models/load_save.h"

int main(int argc, char** argv) {
  dschat::core::retain_freed_host_memory();  // as the dschat CLI runs
  CLI::App app{"dschat forward throughput"};
  std::string model = "opt-125m", init = "random", dtype = "fp32", device = "cpu";
  int64_t batch = 4, seq = 128, iters = 5, warmup = 2, threads = 0, seed = 1234;
  app.add_option("--model", model);
  app.add_option("--init", init);
  app.add_option("--dtype", dtype);
  app.add_option("--device", device);
  app.add_option("--batch", batch);
  app.add_option("--seq", seq);
  app.add_option("--iters", iters);
  app.add_option("--warmup", warmup);
  app.add_option("--threads", threads);
  app.add_option("--seed", seed);
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
    torch::manual_seed(seed);
    dschat::models::LoadOptions options;
    options.random_init = init == "random";
    options.dtype = dschat::core::parse_dtype(dtype, "--dtype");
    options.device = torch::Device(device);
    auto lm = dschat::models::load_causal_lm(model, options);
    torch::Tensor ids = torch::randint(3, lm->config().vocab_size, {batch, seq}, torch::kInt64).to(options.device);  // [B, T]
    torch::NoGradGuard no_grad;
    auto sync = [&] { if (options.device.is_cuda()) lm->forward(ids.narrow(1, 0, 1)).cpu(); };
    for (int64_t i = 0; i < warmup; ++i) lm->forward(ids);
    sync();
    // Best of `iters`: on a shared machine the fastest run is the least disturbed one.
    double best = std::numeric_limits<double>::infinity(), total = 0;
    for (int64_t i = 0; i < iters; ++i) {
      auto start = std::chrono::steady_clock::now();
      lm->forward(ids);
      sync();
      double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::min(best, seconds);
      total += seconds;
    }
    std::cout << "{\"impl\": \"dschat\", \"model\": \"" << model << "\", \"batch\": " << batch << ", \"seq\": " << seq
              << ", \"threads\": " << torch::get_num_threads() << ", \"best_seconds\": " << best
              << ", \"mean_seconds\": " << total / iters
              << ", \"tokens_per_s\": " << static_cast<double>(batch * seq) / best << "}\n";
  } catch (const std::exception& e) {
    std::cerr << "dschat_forward_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
