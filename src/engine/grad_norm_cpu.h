#pragma once
// The squared gradient norm on the CPU (internal to the engine): one pass over fp32 gradients,
// each float squared exactly in double (a 24-bit significand squared fits double's 53) and summed
// in double, without the fp64 copy of every chunk that at::linalg_vector_norm(..., kFloat64)
// makes. The order of additions is fixed by the data alone: blocks of kGradNormBlock elements,
// 8 lanes per block (element i to lane i % 8), lanes added pairwise, blocks added in order. So the
// result is the same bits at any thread count (blocks run in parallel, their sums are added on
// one thread) and on any x86-64 CPU (plain double arithmetic; the library is built without FMA).
// inf and NaN propagate, which is the engine's overflow test.

#include <cstdint>

namespace dschat {
namespace engine {
namespace detail {

constexpr int64_t kGradNormBlock = int64_t{1} << 16;

/// sum_i double(values[i])^2 over `count` floats, in the order above.
double sum_of_squares(const float* values, int64_t count);

}  // namespace detail
}  // namespace engine
}  // namespace dschat
