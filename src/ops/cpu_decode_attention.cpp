#include "ops/cpu_decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

// The library is built for baseline x86-64, so the AVX and AVX-512 loops are compiled in
// `#pragma GCC target` regions and chosen at run time (as skinny_linear_kernel.cpp does); compiled
// alone (no unity build) so the regions do not spread to other sources.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSCHAT_ATTENTION_X86 1
#else
#define DSCHAT_ATTENTION_X86 0
#endif

namespace dschat {
namespace ops {
namespace detail {

namespace attention_baseline {
#include "cpu_decode_attention_loop.inc"
}  // namespace attention_baseline

#if DSCHAT_ATTENTION_X86
#pragma GCC push_options
#pragma GCC target("avx")
namespace attention_avx {
#include "cpu_decode_attention_loop.inc"
}  // namespace attention_avx
#pragma GCC pop_options

// AVX-512F brings FMA instructions: this file is compiled with -ffp-contract=off (CMakeLists.txt),
// so `acc += w * v` stays a multiply and an add, as on the other instruction sets.
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace attention_avx512 {
#include "cpu_decode_attention_loop.inc"
}  // namespace attention_avx512
#pragma GCC pop_options
#endif

void cpu_decode_attention(const CpuDecodeAttentionArgs& args, SkinnyIsa isa) {
  // One task per (row, kv head): its G query heads read each of the row's keys and values once.
  at::parallel_for(0, args.batch * args.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / args.kv_heads, j = task % args.kv_heads;
#if DSCHAT_ATTENTION_X86
      if (isa == SkinnyIsa::kAvx512) {
        attention_avx512::attend_task(args, b, j, scores);
        continue;
      }
      if (isa == SkinnyIsa::kAvx) {
        attention_avx::attend_task(args, b, j, scores);
        continue;
      }
#endif
      attention_baseline::attend_task(args, b, j, scores);
    }
  });
}

}  // namespace detail
}  // namespace ops
}  // namespace dschat
