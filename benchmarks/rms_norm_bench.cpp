// rms_norm throughput: the fused op vs its ATen reference on the same tensors, GB/s of
// input+output traffic. On CPU both run the reference (the kernel is CUDA only).
//   dschat_rms_norm_bench [--device cuda] [--rows 8192] [--cols 4096] [--dtype bf16]
#include <CLI/CLI.hpp>

#include <chrono>
#include <iostream>

#include "dschat/core/dtype.h"
#include "dschat/models/load_save.h"
#include "dschat/ops/rms_norm.h"

int main(int argc, char** argv) {
  CLI::App app{"rms_norm throughput"};
  std::string device = "cpu", dtype = "fp32";
  int64_t rows = 2048, cols = 4096, iters = 20;
  app.add_option("--device", device);
  app.add_option("--dtype", dtype);
  app.add_option("--rows", rows);
  app.add_option("--cols", cols);
  app.add_option("--iters", iters);
  CLI11_PARSE(app, argc, argv);
  try {
    auto options = torch::dtype(dschat::core::parse_dtype(dtype, "--dtype")).device(torch::Device(device));
    torch::Tensor x = torch::randn({rows, cols}, options);  // [R, C]
    torch::Tensor w = torch::randn({cols}, options);        // [C]
    torch::NoGradGuard no_grad;
    auto time = [&](auto&& fn) {
      fn();
      if (x.is_cuda()) torch::cuda::synchronize();
      auto start = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < iters; ++i) fn();
      if (x.is_cuda()) torch::cuda::synchronize();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    };
    double fused = time([&] { dschat::ops::rms_norm(x, w, 1e-6); });
    double reference = time([&] { dschat::ops::rms_norm_reference(x, w, 1e-6); });
    double bytes = 2.0 * x.numel() * x.element_size();
    std::cout << "{\"op\": \"rms_norm\", \"device\": \"" << device << "\", \"dtype\": \"" << dtype << "\", \"rows\": "
              << rows << ", \"cols\": " << cols << ", \"fused_gb_per_s\": " << bytes / fused / 1e9
              << ", \"reference_gb_per_s\": " << bytes / reference / 1e9 << ", \"speedup\": " << reference / fused
              << "}\n";
  } catch (const std::exception& e) {
    std::cerr << "dschat_rms_norm_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
