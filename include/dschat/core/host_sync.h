#pragma once
// Deliberate device -> host synchronisations, named. LibTorch's CUDA sync-debug mode
// (torch.cuda.set_sync_debug_mode: warn or error on every synchronising call) finds the
// accidental ones; the few a loop needs (one read of the gradient norm per optimizer step, one
// read of the statistics per progress line, the stop test of generation...) are marked:
//
//   core::HostSync sync("grad norm (once per optimizer step)");
//   double norm = norm_tensor.item<double>();
//
// Inside the scope the sync-debug mode is suspended, and the name is counted while a mode is set
// (host_sync_counts), so a test that runs under mode "error" fails on any unmarked sync and
// checks the marked ones against its allow-list (tests/cuda/sync_debug_cuda_test.cpp). Without
// CUDA, or with the mode off, a HostSync costs a branch.
#include <cstdint>
#include <map>
#include <string>

namespace dschat {
namespace core {

class HostSync {
 public:
  /// `name`: a string literal saying what is read and how often (it keys the counts).
  explicit HostSync(const char* name);
  ~HostSync();
  HostSync(const HostSync&) = delete;
  HostSync& operator=(const HostSync&) = delete;

 private:
  int suspended_mode_ = 0;  // the sync-debug mode to restore (0: none was set)
};

/// Sets LibTorch's CUDA sync-debug mode: 0 off, 1 warn, 2 error (no-op without CUDA).
void set_sync_debug_mode(int mode);

/// How often each HostSync name was entered while a sync-debug mode was set.
std::map<std::string, int64_t> host_sync_counts();
void reset_host_sync_counts();

}  // namespace core
}  // namespace dschat
