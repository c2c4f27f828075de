#include "dschat/core/host_memory.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace dschat {
namespace core {

bool retain_freed_host_memory() {
#if defined(__GLIBC__)
  constexpr int kMiB = 1 << 20;
  // glibc refuses a threshold above its heap limit's half (32 MiB on 64-bit): try 1 GiB, then that.
  const bool threshold = mallopt(M_MMAP_THRESHOLD, 1024 * kMiB) == 1 || mallopt(M_MMAP_THRESHOLD, 32 * kMiB) == 1;
  const bool trim = mallopt(M_TRIM_THRESHOLD, 2047 * kMiB) == 1;  // an int: about 2 GiB, in practice never
  const bool pad = mallopt(M_TOP_PAD, 256 * kMiB) == 1;
  return threshold && trim && pad;
#else
  return false;
#endif
}

}  // namespace core
}  // namespace dschat
