// The decode step's GEMM on the CPU, side by side in one process: ops::skinny_linear (the kernel
// ops::linear runs for 1..8 rows) against at::linear (MKL's sgemm/sgemv, what ran before), on the
// weight shapes of OPT-125m (q/k/v/out 768x768, fc1 3072x768, fc2 768x3072, the tied LM head
// 50272x768), fp32, random N(0, 1) data. A figure is the median of --reps calls after one warm-up;
// GB/s = weight bytes / time (each weight is read once per call). Rows above the skinny limit show
// at::linear alone. Also prints the largest |skinny - at::linear| per case.
//
//   dschat_linear_bench [--rows 1,2,4,8,16] [--threads 2] [--reps 21]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "bench_util.h"
#include "dschat/ops/skinny_linear.h"

int main(int argc, char** argv) {
  CLI::App app{"dschat skinny-linear benchmark against at::linear"};
  std::vector<int64_t> row_counts = {1, 2, 4, 8, 16};
  int64_t threads = 2, reps = 21;
  app.add_option("--rows", row_counts, "Row counts (comma separated)")->delimiter(',')->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--reps", reps, "Timed calls per case")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(static_cast<int>(threads));
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  std::printf("| rows | out x in | at::linear ms | skinny ms | at::linear / skinny | at::linear GB/s | skinny GB/s | max abs diff |\n"
              "|---|---|---|---|---|---|---|---|\n");
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{768, 768}, {3072, 768}, {768, 3072}, {50272, 768}};
  for (int64_t rows : row_counts) {
    for (const auto& [out, in] : shapes) {
      const torch::Tensor x = torch::randn({rows, in});     // [R, K]
      const torch::Tensor w = torch::randn({out, in});      // [N, K]
      const torch::Tensor b = torch::randn({out});          // [N]
      const double gb = 4e-9 * static_cast<double>(out * in);
      const double aten_ms = dschat::bench::median_call_ms([&] { at::linear(x, w, b); }, reps);
      if (!dschat::ops::skinny_linear_applies(x, w, b)) {
        std::printf("| %lld | %lldx%lld | %.3f | - | - | %.1f | - | - |\n", static_cast<long long>(rows),
                    static_cast<long long>(out), static_cast<long long>(in), aten_ms, gb / aten_ms * 1e3);
        continue;
      }
      const double skinny_ms = dschat::bench::median_call_ms([&] { dschat::ops::skinny_linear(x, w, b); }, reps);
      const double diff = (dschat::ops::skinny_linear(x, w, b) - at::linear(x, w, b)).abs().max().item<double>();
      std::printf("| %lld | %lldx%lld | %.3f | %.3f | %.2f | %.1f | %.1f | %.1e |\n", static_cast<long long>(rows),
                  static_cast<long long>(out), static_cast<long long>(in), aten_ms, skinny_ms, aten_ms / skinny_ms,
                  gb / aten_ms * 1e3, gb / skinny_ms * 1e3, diff);
    }
  }
  return 0;
}
