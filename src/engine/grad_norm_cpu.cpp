#include "engine/grad_norm_cpu.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace dschat {
namespace engine {
namespace detail {
namespace {

// One block: 8 independent double accumulators (the additions of consecutive elements do not
// wait for each other), then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)).
double block_sum_of_squares(const float* values, int64_t count) {
  double lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    for (int lane = 0; lane < 8; ++lane) {
      const double value = values[i + lane];
      lanes[lane] += value * value;
    }
  }
  for (int lane = 0; i < count; ++i, ++lane) {
    const double value = values[i];
    lanes[lane] += value * value;
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

}  // namespace

double sum_of_squares(const float* values, int64_t count) {
  if (count <= 0) return 0.0;
  const int64_t blocks = (count + kGradNormBlock - 1) / kGradNormBlock;
  std::vector<double> block_sums(static_cast<size_t>(blocks));  // [blocks]
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first = b * kGradNormBlock;
      block_sums[b] = block_sum_of_squares(values + first, std::min(kGradNormBlock, count - first));
    }
  });
  double total = 0.0;
  for (double block : block_sums) total += block;
  return total;
}

}  // namespace detail
}  // namespace engine
}  // namespace dschat
