#pragma once
// Private to src/inference: capturing one decode step as a CUDA graph, shared by the static
// engine's graphs (decode_graph.cpp) and the continuous engine's (paged_decode_graph.cpp).

#ifdef DSCHAT_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <torch/torch.h>

#include <functional>
#include <memory>

namespace dschat {
namespace inference {

/// Runs `step` once on a side stream of `device` (the warm-up: the stream's cuBLAS workspace and
/// lazily allocated buffers come into being outside the graph), then captures a second run of it
/// in thread-local mode (other threads' CUDA calls are not this capture's business). The caller's
/// stream waits for the side stream before and after. Returns the graph, or null when the step
/// cannot be captured (it synchronises with the host somewhere), after one warning that names
/// `engine` ("inference engine", "continuous engine") and says it decodes eagerly. `pool`: the
/// memory pool to capture into ({0, 0}: a private one; another graph's pool() to share it, safe
/// for graphs that are never replayed at the same time and whose outputs are read before the next
/// replay, as PyTorch's make_graphed_callables and vLLM do across batch sizes).
std::unique_ptr<at::cuda::CUDAGraph> capture_decode_graph(const torch::Device& device,
                                                          const std::function<void()>& step, const char* engine,
                                                          c10::MempoolId_t pool = {0, 0});

}  // namespace inference
}  // namespace dschat
#endif
