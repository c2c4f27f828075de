#pragma once
// The inference engine: autoregressive generation over ONE key/value workspace that the engine
// owns (kv_workspace.h) and reuses across calls, the way DeepSpeed's inference context does
// (runtime reference §1.6, §1.10, §2.3):
//
//   InferenceEngineOptions options;
//   options.max_out_tokens = 256;                  // prompt + generated tokens the cache holds
//   InferenceEngine engine(model, options);
//   GenerationResult out = engine.generate(ids, mask, config);   // [B, T] left-padded
//   core::log_info(format_generation_stats(engine.last_stats()));
//
// - The workspace is sized [L, 2, B, H_kv, max_out_tokens, D] on the first call, kept while the
//   batch fits, grown (freed, then taken again larger) when a larger batch arrives, and freed by
//   release_workspace() (or after every call with release_workspace_after_generate); the next
//   call takes it again.
// - Decoding keeps inference::generate's behaviour: one prefill over the left-padded prompts, then
//   one token per step; a row that emits EOS gets pad (and attention-mask 0) afterwards; the loop
//   ends when every row has finished or after max_new_tokens.
// - num_return_sequences = n: each prompt is prefilled ONCE (a prefill over the B prompts, not
//   B * n rows); its cached keys/values and next-token logits are then copied to its n rows
//   (ContiguousKvCache::repeat_rows), which sample and decode on independently. The workspace
//   holds B * n rows; the ids equal those of generating the explicitly repeated prompts
//   (repeat_for_return_sequences, n = 1) with the same seed.
// - Host syncs: the hot loop reads the device only to learn whether every row has finished, at
//   step 0 and then every finished_check_interval steps (every step on the CPU, every 8 on a GPU);
//   steps run after the last row finished are trimmed off, so the ids do not depend on it. The
//   prompt mask is read once per call (unpadded prompts take SDPA's causal prefill); sampling
//   draws on the logits' device (make_sampling_generator), the decode steps read no mask.
// - Lockstep (options.lockstep): data-parallel ranks with different prompts, where every forward
//   runs collectives (ZeRO-3 gathers), must run the same number of forwards. Each rank checks once
//   that max_new_tokens agrees, then all-reduces (MAX) an "unfinished rows left" flag at each of
//   those reads (the same steps on every rank); a rank whose rows have all finished keeps stepping
//   on pad tokens until every rank is done. Its result is trimmed to its own length: exactly what
//   it would have returned alone.
// - enable_cuda_graph (CUDA only): the decode step is captured once per batch size as a CUDA graph
//   over static inputs and the full-capacity workspace, then replayed (docs/inference.md). A model
//   whose step cannot be captured (a host sync inside it) decodes eagerly, with one warning. Not
//   used with lockstep, layer-parameter hooks or a tensor-parallel shard (host-side collectives
//   in or between steps). On CPU the option has no effect.
//
// The engine holds the model (a shared module handle) but no copy of its weights. Not thread-safe.

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "dschat/core/generation_config.h"
#include "dschat/dist/process_group.h"
#include "dschat/inference/generate.h"
#include "dschat/inference/generation_stats.h"
#include "dschat/inference/kv_workspace.h"
#include "dschat/models/causal_lm.h"

namespace dschat {
namespace inference {

struct InferenceEngineOptions {
  /// Prompt + generated tokens per row that the workspace holds (DeepSpeed's max_out_tokens);
  /// a call with prompt + max_new_tokens above it throws core::InvalidArgument.
  int64_t max_out_tokens = 512;
  /// Free the workspace at the end of every generate (DeepSpeed's release_inference_cache).
  bool release_workspace_after_generate = false;
  /// Capture the decode step as a CUDA graph (CUDA devices only; ignored on CPU).
  bool enable_cuda_graph = false;
  /// Run the CUDA-graph step's full-capacity layout (src/inference/decode_graph.h) eagerly, on
  /// any device and without capturing: checks that layout's arithmetic where no GPU is present.
  bool full_capacity_decode = false;
  /// Decode steps between the host reads of "every row has finished" (each one a device sync).
  /// 0 = automatic: every step on the CPU, every 8 steps on other devices. Results do not depend
  /// on it: steps run after the last row finished are trimmed off (they count in forward_steps).
  int64_t finished_check_interval = 0;
  /// Log format_generation_stats() at info level after every generate.
  bool log_stats = true;
  /// When set, generate() is collective over these ranks (see above).
  std::shared_ptr<dist::Communicator> lockstep;
};

/// Lets a caller choose each step's tokens and end rows itself: the server's batches, where every
/// row has its own sampling setup, seed, length and stop strings, and a client may go away.
/// With hooks the engine reads each step's ids on the host (a device sync per step).
struct StepHooks {
  /// The step's logits [R, V] float32, the ids so far [R, T + s] and the step -> the next ids [R]
  /// on the logits' device. Replaces process_logits and select_next_tokens (the config's sampling
  /// keys are then unused). Rows that have finished get pad whatever this returns.
  std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& sequences, int64_t step)> select_next;
  /// After every step: the step's ids [R] on the host (pad in finished rows) -> per row, whether
  /// to end it now (its token of this step is kept, as an EOS is). All rows ended ends the call.
  std::function<std::vector<bool>(const torch::Tensor& next_ids, int64_t step)> end_rows;
};

class DecodeGraphs;  // private (src/inference/decode_graph.h)

class InferenceEngine {
 public:
  InferenceEngine(models::CausalLM model, InferenceEngineOptions options = {});
  ~InferenceEngine();
  InferenceEngine(const InferenceEngine&) = delete;
  InferenceEngine& operator=(const InferenceEngine&) = delete;

  /// input_ids, attention_mask: [B, T] on the model's device (left padding: zeros at the start
  /// of short rows) -> sequences and mask [B * n, T + N] (n = config.num_return_sequences; prompt
  /// i's answers in rows [i * n, (i + 1) * n), all from one prefill of prompt i). Collective with
  /// options.lockstep.
  GenerationResult generate(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                            const core::GenerationConfig& config);
  /// The same with the caller's token choice and row endings (StepHooks; not with lockstep).
  GenerationResult generate(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                            const core::GenerationConfig& config, const StepHooks& hooks);

  /// Frees the KV workspace (and any captured CUDA graphs, which point into it).
  void release_workspace();
  /// Bytes the KV workspace holds now (0 when released or not yet taken).
  int64_t workspace_bytes() const { return workspace_.bytes(); }
  const KvWorkspace& workspace() const { return workspace_; }

  /// Figures of the last generate call.
  const GenerationStats& last_stats() const { return stats_; }

  /// Swaps in another model (the hybrid engine's tensor-parallel shard or re-bound weights).
  /// Captured CUDA graphs are dropped; the workspace is kept and resized on the next call if the
  /// new model's shape needs it. Call it too after parameters were re-allocated in place of the
  /// old ones (graphs read parameters by address).
  void set_model(models::CausalLM model);
  models::CausalLM& model() { return model_; }
  const InferenceEngineOptions& options() const { return options_; }

 private:
  torch::Tensor decode_step(const torch::Tensor& step_input, const torch::Tensor& mask, nn::KvCache& cache,
                            nn::MaskLayout layout);
  void agree_across_ranks(int64_t max_new_tokens, const std::string& local_error);
  bool any_rank_unfinished(bool unfinished_here);
  GenerationResult run(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                       const core::GenerationConfig& config, const StepHooks* hooks);

  models::CausalLM model_{nullptr};
  InferenceEngineOptions options_;
  KvWorkspace workspace_;
  std::unique_ptr<DecodeGraphs> graphs_;  // null unless CUDA graphs may be used
  GenerationStats stats_;
  int64_t parameters_ = 0;            // elements of model_'s parameters
  int64_t bytes_per_parameter_ = 0;   // their element size
  bool graph_skip_logged_ = false;    // enable_cuda_graph without effect is logged once
};

}  // namespace inference
}  // namespace dschat
