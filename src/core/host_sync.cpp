#include "dschat/core/host_sync.h"

#include <mutex>

#ifdef DSCHAT_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace dschat {
namespace core {
namespace {

std::mutex& counts_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, int64_t>& counts() {
  static std::map<std::string, int64_t> by_name;
  return by_name;
}

int current_mode() {
#ifdef DSCHAT_WITH_CUDA
  return static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
#else
  return 0;
#endif
}

}  // namespace

void set_sync_debug_mode(int mode) {
#ifdef DSCHAT_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode));
#else
  (void)mode;
#endif
}

HostSync::HostSync(const char* name) {
  const int mode = current_mode();
  if (mode == 0) return;
  {
    std::lock_guard<std::mutex> lock(counts_mutex());
    ++counts()[name];
  }
  suspended_mode_ = mode;
  set_sync_debug_mode(0);
}

HostSync::~HostSync() {
  if (suspended_mode_ != 0) set_sync_debug_mode(suspended_mode_);
}

std::map<std::string, int64_t> host_sync_counts() {
  std::lock_guard<std::mutex> lock(counts_mutex());
  return counts();
}

void reset_host_sync_counts() {
  std::lock_guard<std::mutex> lock(counts_mutex());
  counts().clear();
}

}  // namespace core
}  // namespace dschat
