#include "inference/graph_capture.h"

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <string>

#include "core/log.h"

namespace dschat {
namespace inference {

std::unique_ptr<at::cuda::CUDAGraph> capture_decode_graph(const torch::Device& device,
                                                          const std::function<void()>& step, const char* engine,
                                                          c10::MempoolId_t pool) {
  c10::cuda::CUDAGuard device_guard(device);
  c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(current);
  inputs_ready.block(side);
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  bool captured = false;
  try {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    step();
    graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      step();
    } catch (...) {
      try {
        graph->capture_end();  // ends the (invalidated) capture; its own error is the same failure
      } catch (...) {
      }
      throw;
    }
    graph->capture_end();
    captured = true;
  } catch (const std::exception& error) {
    (void)cudaGetLastError();  // a failed capture leaves its status behind
    std::string what = error.what();
    core::log_warn_once(engine, ": the decode step of this model cannot be captured as a CUDA graph (",
                        what.substr(0, what.find('\n')), "); it decodes eagerly");
  }
  at::cuda::CUDAEvent side_done;
  side_done.record(side);
  side_done.block(current);
  return captured ? std::move(graph) : nullptr;
}

}  // namespace inference
}  // namespace dschat
#endif
