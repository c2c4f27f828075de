#include "ops/cpu_decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

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

// A task's scratch, reused across the tasks one thread runs.
struct AttendScratch {
  std::vector<float> scores;  // [task heads, L]: scores, then softmax weights
  std::vector<float> acc;     // [task heads, D]: the value sums
};

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

// kv heads per task: a whole row's where the rows share out evenly over the threads (a task then
// reads its keys' and values' token rows end to end: 1.7-2.9x a task per head at 8 x 1024 and
// 32 x 256-1024 keys, docs/benchmarks.md), else the rows split into the fewest runs of heads that
// do (one row on two threads: two halves). The split changes no bit: each element's arithmetic is
// the same in any task.
int64_t kv_heads_per_task(const CpuDecodeAttentionArgs& args) {
  if (args.kv_heads_per_task > 0) return std::min(args.kv_heads_per_task, args.kv_heads);
  const int64_t threads = std::max(1, at::get_num_threads());
  int64_t splits = 1;
  while (splits < args.kv_heads && (args.batch * splits) % threads != 0 && args.batch * splits < 4 * threads) ++splits;
  return (args.kv_heads + splits - 1) / splits;
}

void cpu_decode_attention(const CpuDecodeAttentionArgs& args, SkinnyIsa isa) {
  const int64_t per_task = kv_heads_per_task(args), tasks_per_row = (args.kv_heads + per_task - 1) / per_task;
  at::parallel_for(0, args.batch * tasks_per_row, 1, [&](int64_t begin, int64_t end) {
    AttendScratch scratch;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / tasks_per_row, j_begin = task % tasks_per_row * per_task;
      const int64_t j_end = std::min(j_begin + per_task, args.kv_heads);
#if DSCHAT_ATTENTION_X86
      if (isa == SkinnyIsa::kAvx512) {
        attention_avx512::attend_task(args, b, j_begin, j_end, scratch);
        continue;
      }
      if (isa == SkinnyIsa::kAvx) {
        attention_avx::attend_task(args, b, j_begin, j_end, scratch);
        continue;
      }
#endif
      attention_baseline::attend_task(args, b, j_begin, j_end, scratch);
    }
  });
}

}  // namespace detail
}  // namespace ops
}  // namespace dschat
