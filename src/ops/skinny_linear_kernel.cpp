#include "ops/skinny_linear_kernel.h"

#include <algorithm>

// The library is built for baseline x86-64, so the AVX and AVX-512 loops are compiled in
// `#pragma GCC target` regions and chosen at run time (as engine/adamw_cpu.cpp does). Compiled alone (no unity build):
// the target region must not spread to other sources.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSCHAT_SKINNY_X86 1
#else
#define DSCHAT_SKINNY_X86 0
#endif

namespace dschat {
namespace ops {
namespace detail {

#define SKINNY_ROWS_PER_PASS 4
namespace isa_baseline {
#include "skinny_linear_loop.inc"
}  // namespace isa_baseline

#if DSCHAT_SKINNY_X86
#pragma GCC push_options
#pragma GCC target("avx")
namespace isa_avx {
#include "skinny_linear_loop.inc"
}  // namespace isa_avx
#pragma GCC pop_options

// AVX-512F brings FMA instructions: this file is compiled with -ffp-contract=off (CMakeLists.txt)
// so that `acc += w * x` stays a multiply and an add, as on the other instruction sets.
#pragma GCC push_options
#pragma GCC target("avx512f")
#undef SKINNY_ROWS_PER_PASS
#define SKINNY_ROWS_PER_PASS 8
namespace isa_avx512 {
#include "skinny_linear_loop.inc"
}  // namespace isa_avx512
#pragma GCC pop_options
#endif
#undef SKINNY_ROWS_PER_PASS

bool skinny_isa_supported(SkinnyIsa isa) {
#if DSCHAT_SKINNY_X86
  switch (isa) {
    case SkinnyIsa::kAvx512: return __builtin_cpu_supports("avx512f");
    case SkinnyIsa::kAvx: return __builtin_cpu_supports("avx");
    case SkinnyIsa::kBaseline: return true;
  }
  return false;
#else
  return isa == SkinnyIsa::kBaseline;
#endif
}

bool cpu_is_amd() {
#if DSCHAT_SKINNY_X86
  __builtin_cpu_init();  // a no-op after the first call; needed if this runs in a static initializer
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

SkinnyIsa best_skinny_isa() {
  static const SkinnyIsa best = skinny_isa_supported(SkinnyIsa::kAvx512) ? SkinnyIsa::kAvx512
                                : skinny_isa_supported(SkinnyIsa::kAvx)  ? SkinnyIsa::kAvx
                                                                         : SkinnyIsa::kBaseline;
  return best;
}

void skinny_linear_range(SkinnyIsa isa, const float* x, const float* w, const float* bias, float* y, int64_t rows,
                         int64_t k, int64_t n, int64_t n_begin, int64_t n_end) {
#if DSCHAT_SKINNY_X86
  if (isa == SkinnyIsa::kAvx512) {
    isa_avx512::skinny_loop(x, w, bias, y, rows, k, n, n_begin, n_end);
    return;
  }
  if (isa == SkinnyIsa::kAvx) {
    isa_avx::skinny_loop(x, w, bias, y, rows, k, n, n_begin, n_end);
    return;
  }
#endif
  (void)isa;
  isa_baseline::skinny_loop(x, w, bias, y, rows, k, n, n_begin, n_end);
}

}  // namespace detail
}  // namespace ops
}  // namespace dschat
