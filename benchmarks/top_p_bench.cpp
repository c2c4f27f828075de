// Top-p masking per decode step: outside_top_p (topk of a growing k, no sort) against Hugging
// Face's rule as transformers computes it (sort the vocabulary, cumulative softmax), on the same
// logits. Logits are drawn N(0, scale^2): scale 3 gives a nucleus of tens of tokens (a trained
// model's usual case), scale 0.3 a flat one of thousands (k grows to the vocabulary).
//   dschat_top_p_bench [--rows 8] [--vocab 50272] [--top-p 0.9] [--scale 3] [--iters 50] [--threads 2]
#include <CLI/CLI.hpp>

#include <chrono>
#include <iostream>

#include "dschat/inference/logits_processing.h"

int main(int argc, char** argv) {
  CLI::App app{"top-p masking: no sort vs sorted"};
  int64_t rows = 8, vocab = 50272, iters = 50, threads = 0;
  double top_p = 0.9, scale = 3.0;
  app.add_option("--rows", rows);
  app.add_option("--vocab", vocab);
  app.add_option("--top-p", top_p);
  app.add_option("--scale", scale);
  app.add_option("--iters", iters);
  app.add_option("--threads", threads, "intra-op threads (0: torch's default)");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
  torch::manual_seed(1);
  torch::NoGradGuard no_grad;
  const torch::Tensor logits = torch::randn({rows, vocab}) * scale;  // [R, V]
  const auto sorted_rule = [&] {
    auto [sorted, order] = logits.sort(1, /*descending=*/false);  // [R, V] each
    torch::Tensor drop = sorted.softmax(1).cumsum(1) <= (1.0 - top_p);
    drop.select(1, vocab - 1).fill_(false);
    return drop.scatter(1, order, drop);
  };
  const auto time = [&](auto&& fn) {
    fn();
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / iters;
  };
  const double sorted_ms = time(sorted_rule);
  const double topk_ms = time([&] { return dschat::inference::outside_top_p(logits, top_p); });
  const int64_t kept = dschat::inference::outside_top_p(logits, top_p).logical_not().sum().item<int64_t>();
  const int64_t differ = dschat::inference::outside_top_p(logits, top_p).ne(sorted_rule()).sum().item<int64_t>();
  std::cout << "{\"rows\": " << rows << ", \"vocab\": " << vocab << ", \"top_p\": " << top_p << ", \"scale\": " << scale
            << ", \"threads\": " << torch::get_num_threads() << ", \"kept_per_row\": " << double(kept) / rows
            << ", \"sorted_ms\": " << sorted_ms << ", \"without_sort_ms\": " << topk_ms
            << ", \"speedup\": " << sorted_ms / topk_ms << ", \"tokens_that_differ\": " << differ << "}" << std::endl;
  return 0;
}
