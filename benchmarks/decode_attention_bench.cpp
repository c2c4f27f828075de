// A decode step's attention on the CPU, side by side in one process: ops::paged_decode_attention
// (the CPU loop, src/ops/cpu_decode_attention.*, over a block pool whose slots hold the same keys
// and values in order, in shuffled 16-token blocks) against decode_attention_reference over the
// contiguous cache (ATen's batched matmul, MKL's gemv per head: what the static engine runs),
// fp32, OPT-125m's heads (12 of 64) unless set, every key real. A figure is the median of --reps
// calls after one warm-up; GB/s = the keys' and values' bytes / time (each is read once per call).
// Also prints the largest |loop - reference|.
//
//   dschat_decode_attention_bench [--rows 8,32] [--keys 64,256] [--heads 12] [--dim 64] [--threads 2] [--reps 51]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "bench_util.h"
#include "dschat/ops/decode_attention.h"
#include "dschat/ops/paged_decode_attention.h"

using dschat::bench::median_call_ms;

int main(int argc, char** argv) {
  CLI::App app{"dschat CPU decode-attention benchmark against its ATen reference"};
  std::vector<int64_t> row_counts = {8, 32}, key_counts = {64, 256};
  int64_t heads = 12, dim = 64, threads = 2, reps = 51;
  app.add_option("--rows", row_counts, "Batch rows (comma separated)")->delimiter(',')->capture_default_str();
  app.add_option("--keys", key_counts, "Keys per row (comma separated)")->delimiter(',')->capture_default_str();
  app.add_option("--heads", heads, "Query heads = kv heads")->capture_default_str();
  app.add_option("--dim", dim, "Head dim")->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--reps", reps, "Timed calls per case")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(static_cast<int>(threads));
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  std::printf("| rows | keys | KV MB | reference ms | loop ms | reference / loop | reference GB/s | loop GB/s | "
              "max abs diff |\n"
              "|---|---|---|---|---|---|---|---|---|\n");
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  for (int64_t rows : row_counts) {
    for (int64_t keys : key_counts) {
      const torch::Tensor q = torch::randn({rows, heads, 1, dim});        // [B, H, 1, D]
      const torch::Tensor k = torch::randn({rows, heads, keys, dim});     // [B, H, S, D]
      const torch::Tensor v = torch::randn({rows, heads, keys, dim});     // [B, H, S, D]
      const torch::Tensor mask = torch::ones({rows, keys}, torch::kInt64);  // [B, S]
      const double mb = 2.0 * 4e-6 * static_cast<double>(rows * heads * keys * dim);
      torch::Tensor reference, loop;  // [B, H, 1, D]
      const auto run_reference = [&] {
        reference = dschat::ops::decode_attention_reference(q, k, v, mask, keys, scale);
      };
      // The pool: row b's key t in slot blocks[b * S / 16 + t / 16] * 16 + t % 16 ([B * S, H * D],
      // token-major as KvBlockPool's), its 16-token blocks shuffled over the pool as a long-running
      // pool's are (S rounded up to whole blocks).
      const int64_t block = 16, row_blocks = (keys + block - 1) / block;
      const torch::Tensor blocks = torch::randperm(rows * row_blocks, torch::kInt64).view({rows, row_blocks});
      const torch::Tensor token = torch::arange(keys, torch::kInt64);  // [S]
      const torch::Tensor slots =
          blocks.index_select(1, token.div(block, "floor")) * block + token.remainder(block);  // [B, S]
      torch::Tensor key_slots = torch::zeros({rows * row_blocks * block, heads * dim});    // [N, H * D]
      torch::Tensor value_slots = torch::zeros({rows * row_blocks * block, heads * dim});  // [N, H * D]
      key_slots.index_copy_(0, slots.flatten(), k.permute({0, 2, 1, 3}).reshape({rows * keys, heads * dim}));
      value_slots.index_copy_(0, slots.flatten(), v.permute({0, 2, 1, 3}).reshape({rows * keys, heads * dim}));
      const std::vector<int64_t> lengths(static_cast<size_t>(rows), keys);
      const auto run_loop = [&] {
        loop = dschat::ops::paged_decode_attention(q, key_slots, value_slots, slots, lengths, scale);
      };
      const double reference_ms = median_call_ms(run_reference, reps);
      const double loop_ms = median_call_ms(run_loop, reps);
      std::printf("| %lld | %lld | %.1f | %.3f | %.3f | %.2f | %.1f | %.1f | %.1e |\n", static_cast<long long>(rows),
                  static_cast<long long>(keys), mb, reference_ms, loop_ms, reference_ms / loop_ms,
                  mb / reference_ms, mb / loop_ms, (reference - loop).abs().max().item<double>());
    }
  }
  return 0;
}
