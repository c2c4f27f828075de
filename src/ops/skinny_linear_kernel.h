#pragma once
// Private to src/ops (and its tests): the skinny-linear kernel per instruction set, so a test can
// check that the baseline, AVX and AVX-512 loops give the same bits.

#include <cstdint>

namespace dschat {
namespace ops {
namespace detail {

enum class SkinnyIsa { kBaseline, kAvx, kAvx512 };

/// Whether this CPU runs `isa`'s loop.
bool skinny_isa_supported(SkinnyIsa isa);

/// Whether this CPU is AMD's (CPUID's vendor string): its FP adds run on pipes of their own, so
/// the loop's separate multiply and add cost what an FMA does.
bool cpu_is_amd();

/// The widest loop this CPU runs.
SkinnyIsa best_skinny_isa();

/// y[r, n] = sum_k x[r, k] w[n, k] + bias[n] for n in [n_begin, n_end), every row r < rows.
/// x: [rows, k] float32, row-major; w: [n, k] float32, row-major; bias: [n] or null;
/// y: [rows, n] float32, row-major. The arithmetic per element is the same for every isa.
void skinny_linear_range(SkinnyIsa isa, const float* x, const float* w, const float* bias, float* y, int64_t rows,
                         int64_t k, int64_t n, int64_t n_begin, int64_t n_end);

}  // namespace detail
}  // namespace ops
}  // namespace dschat
