// One CPU optimizer step over the same 16M-element fp32 parameter set (8 tensors of 2M, the shape
// of a ZeRO-Offload partition): dschat's engine::AdamW against LibTorch's torch::optim::AdamW,
// both with DeepSpeed-Chat's hyperparameters, at the same thread count (the benchmark argument).
//   dschat_adamw_bench [--benchmark_filter=...] [--benchmark_repetitions=N]
// Bytes per step: 7 x 4 B per element (read param, grad, exp_avg, exp_avg_sq; write three).
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include "dschat/engine/adamw.h"

namespace {

constexpr int64_t kTensors = 8;
constexpr int64_t kElementsPerTensor = int64_t{1} << 21;  // 8 x 2M = 16,777,216 elements
constexpr double kBytesPerElement = 7 * 4;

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(0);
  std::vector<torch::Tensor> params;
  for (int64_t i = 0; i < kTensors; ++i) {
    torch::Tensor param = torch::randn({kElementsPerTensor}).requires_grad_(true);  // [2M]
    param.mutable_grad() = torch::randn({kElementsPerTensor}) * 1e-3;
    params.push_back(param);
  }
  return params;
}

void set_counters(benchmark::State& state) {
  const double elements = static_cast<double>(kTensors * kElementsPerTensor);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * elements));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * elements * kBytesPerElement));
  state.counters["threads"] = static_cast<double>(at::get_num_threads());
}

void BM_DschatAdamW(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  auto params = make_params();
  dschat::engine::AdamWOptions options;
  options.lr = 1e-5;
  options.betas = {0.9, 0.95};
  options.weight_decay = 0.1;
  dschat::engine::AdamW optimizer(params, options);
  optimizer.step();  // allocate the moments outside the timed loop
  for (auto _ : state) optimizer.step();
  set_counters(state);
}

void BM_TorchOptimAdamW(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  auto params = make_params();
  torch::optim::AdamW optimizer(params,
                                torch::optim::AdamWOptions(1e-5).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  optimizer.step();
  for (auto _ : state) optimizer.step();
  set_counters(state);
}

}  // namespace

BENCHMARK(BM_DschatAdamW)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_TorchOptimAdamW)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_MAIN();
