#include "dschat/inference/inference_engine.h"

#include <chrono>

#include "core/stopwatch.h"
#include "core/log.h"
#include "dschat/core/error.h"
#include "dschat/core/host_sync.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/inference/logits_processing.h"
#include "inference/decode_graph.h"

namespace dschat {
namespace inference {
namespace {

using Clock = core::SteadyClock;
using core::seconds_since;

// Steps between the loop's host reads of "have all rows finished" on a device; every read waits
// for the device to drain, so the host can no longer queue the next step ahead of it.
constexpr int64_t kDeviceFinishedCheckInterval = 8;

int64_t finished_check_interval(const InferenceEngineOptions& options, const torch::Device& device) {
  if (options.finished_check_interval > 0) return options.finished_check_interval;
  return device.is_cpu() ? 1 : kDeviceFinishedCheckInterval;  // a CPU read costs nothing
}

// The length (prompt + generated columns) at which every row had finished, or -1 while some row
// has not: one host read. A row's generated mask is 1 up to and with its EOS, so the longest
// such run is the step at which the last row finished, however many steps ran since.
int64_t length_when_all_finished(const torch::Tensor& finished, const torch::Tensor& mask, int64_t prompt) {
  const int64_t generated = mask.size(1) - prompt;
  torch::Tensor produced = mask.narrow(1, prompt, generated).sum(1).max();  // []
  torch::Tensor facts = torch::stack({finished.all().to(torch::kInt64), produced});  // [2]
  core::HostSync sync("generation (all rows finished?)");
  facts = facts.cpu();
  return facts[0].item<int64_t>() != 0 ? prompt + facts[1].item<int64_t>() : -1;
}

// The prefill's masking as the prompts need it: SDPA's causal path for unpadded prompts (the ids
// of before), the explicit mask otherwise. The one read of the prompt mask per call.
nn::MaskLayout prompt_mask_layout(const torch::Tensor& attention_mask) {
  core::HostSync sync("generation (prompt padding, once per call)");
  return nn::detect_mask_layout(attention_mask);
}

// The caller's row endings of this step as a [R] bool mask on next's device: one host read.
torch::Tensor rows_to_end(const StepHooks& hooks, const torch::Tensor& next, int64_t step) {
  torch::Tensor host_next;  // [R]
  {
    core::HostSync sync("generation (step hooks read the step's ids)");
    host_next = next.to(torch::kCPU);
  }
  const std::vector<bool> end = hooks.end_rows(host_next, step);
  DSCHAT_CHECK(static_cast<int64_t>(end.size()) == next.size(0), InvalidArgument, "generate: step hook end_rows gave ",
               end.size(), " flags for ", next.size(0), " rows");
  std::vector<uint8_t> bytes(end.begin(), end.end());
  torch::Tensor flags = torch::from_blob(bytes.data(), {next.size(0)}, torch::kUInt8);  // [R] view of bytes
  return flags.to(torch::kBool).to(next.device());  // a copy: bytes dies here
}

}  // namespace

InferenceEngine::InferenceEngine(models::CausalLM model, InferenceEngineOptions options)
    : options_(std::move(options)) {
  DSCHAT_CHECK(options_.max_out_tokens >= 2, InvalidArgument, "inference engine: max_out_tokens must be at least 2, got ",
               options_.max_out_tokens);
  DSCHAT_CHECK(options_.finished_check_interval >= 0, InvalidArgument,
               "inference engine: finished_check_interval must be >= 0 (0 = automatic), got ",
               options_.finished_check_interval);
  if (options_.enable_cuda_graph || options_.full_capacity_decode) graphs_ = std::make_unique<DecodeGraphs>();
  set_model(std::move(model));
}

InferenceEngine::~InferenceEngine() = default;

void InferenceEngine::set_model(models::CausalLM model) {
  DSCHAT_CHECK(!model.is_empty(), InvalidArgument, "inference engine: no model given");
  model_ = std::move(model);
  parameters_ = 0;
  bytes_per_parameter_ = 0;
  for (const auto& p : model_->parameters()) {
    parameters_ += p.numel();
    bytes_per_parameter_ = static_cast<int64_t>(p.element_size());
  }
  if (graphs_) graphs_->reset();  // the graphs read the old model's parameters by address
}

void InferenceEngine::release_workspace() {
  if (graphs_) graphs_->reset();  // they point into the workspace (and hold their own memory pools)
  workspace_.release();
}

// One all-reduce before the first forward: every rank must run the same number of steps, and a
// rank that rejects its input must not leave the others waiting in the first collective.
void InferenceEngine::agree_across_ranks(int64_t max_new_tokens, const std::string& local_error) {
  torch::Tensor facts = torch::tensor({max_new_tokens, -max_new_tokens, local_error.empty() ? int64_t{0} : int64_t{1}},
                                      torch::kInt64);  // [3]: max N, -min N, any error
  options_.lockstep->all_reduce(facts, dist::ReduceOp::Max);
  const int64_t most = facts[0].item<int64_t>(), least = -facts[1].item<int64_t>();
  DSCHAT_CHECK(facts[2].item<int64_t>() == 0 || !local_error.empty(), InvalidArgument,
               "lockstep generate: another rank rejected its generate call (see its error); this rank stops too");
  DSCHAT_CHECK(local_error.empty(), InvalidArgument, local_error);
  DSCHAT_CHECK(most == least, InvalidArgument,
               "lockstep generate: max_new_tokens must be the same on every rank, got ", least, " to ", most,
               " (this rank: ", max_new_tokens, ")");
}

bool InferenceEngine::any_rank_unfinished(bool unfinished_here) {
  torch::Tensor flag = torch::tensor({unfinished_here ? int64_t{1} : int64_t{0}}, torch::kInt64);  // [1]
  options_.lockstep->all_reduce(flag, dist::ReduceOp::Max);
  return flag.item<int64_t>() != 0;
}

torch::Tensor InferenceEngine::decode_step(const torch::Tensor& step_input, const torch::Tensor& mask,
                                           nn::KvCache& cache, nn::MaskLayout layout) {
  // The LM head only where the next token is read: for the prefill that is 1 of T positions (as
  // transformers' logits_to_keep=1), the largest GEMM of the step otherwise.
  torch::Tensor last = model_->hidden_states(step_input, mask, &cache, layout).select(1, -1);  // [B, E]
  return model_->lm_logits(last).to(torch::kFloat32);                                          // [B, V]
}

GenerationResult InferenceEngine::generate(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                           const core::GenerationConfig& config) {
  return run(prompt_ids, prompt_mask, config, nullptr);
}

GenerationResult InferenceEngine::generate(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                           const core::GenerationConfig& config, const StepHooks& hooks) {
  DSCHAT_CHECK(!options_.lockstep, InvalidArgument,
               "generate: step hooks end rows on one rank's host and cannot run in lockstep");
  DSCHAT_CHECK(config.num_return_sequences == 1, InvalidArgument,
               "generate: with step hooks repeat the prompts instead of num_return_sequences (got ",
               config.num_return_sequences, ")");
  return run(prompt_ids, prompt_mask, config, &hooks);
}

GenerationResult InferenceEngine::run(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                      const core::GenerationConfig& config, const StepHooks* hooks) {
  const auto start = Clock::now();
  core::validate_generation_config(config, "generation config");
  DSCHAT_CHECK(prompt_ids.dim() == 2 && prompt_ids.sizes() == prompt_mask.sizes() && prompt_ids.size(0) > 0 &&
                   prompt_ids.size(1) > 0,
               InvalidArgument, "generate: input_ids ", prompt_ids.sizes(), " and attention_mask ",
               prompt_mask.sizes(), " must both be [batch, tokens] with batch and tokens > 0");
  // n answers per prompt from ONE prefill per prompt: the prefill runs on the B prompts, then
  // its cache rows and logits are repeated (row b to rows [b * n, (b + 1) * n)) and the n
  // samples decode on as B * n rows. The KV workspace is reserved for B * n rows up front.
  const int64_t n = config.num_return_sequences;
  const int64_t prompts = prompt_ids.size(0), batch = prompts * n, prompt = prompt_ids.size(1);
  const int64_t max_new = config.max_new_tokens;
  std::string error;
  if (prompt + max_new > options_.max_out_tokens) {
    error = core::detail::str_cat("generate: prompt (", prompt, " tokens) + max_new_tokens (", max_new, ") = ",
                                  prompt + max_new, " exceeds max_out_tokens (", options_.max_out_tokens,
                                  "), the tokens per row the KV workspace holds");
  }
  if (options_.lockstep) agree_across_ranks(max_new, error);
  DSCHAT_CHECK(error.empty(), InvalidArgument, error);

  torch::NoGradGuard no_grad;
  const torch::Device device = prompt_ids.device();
  const torch::ScalarType weight_dtype = model_->parameters().front().scalar_type();
  if (workspace_.reserve(model_->config(), batch, options_.max_out_tokens, weight_dtype, device) && graphs_) {
    graphs_->reset();  // the old graphs point into the freed allocation
  }
  // Graph replay needs a CUDA device, and no host-side collectives inside the step (ZeRO-3 layer
  // hooks, a tensor-parallel shard's all-reduces) or between steps (lockstep).
  const models::Backbone& backbone = model_->backbone();
  const bool use_graphs = options_.enable_cuda_graph && device.is_cuda() && DecodeGraphs::compiled() &&
                          !options_.lockstep && backbone.layer_parameter_hooks() == nullptr &&
                          backbone.tensor_parallel_group() == nullptr;
  const bool full_capacity = use_graphs || options_.full_capacity_decode;
  if (options_.enable_cuda_graph && !use_graphs && !graph_skip_logged_) {
    graph_skip_logged_ = true;
    core::log_debug("inference engine: enable_cuda_graph has no effect here (device ", device,
                    options_.lockstep ? ", lockstep" : "", ")");
  }
  const int64_t replays_before = graphs_ ? graphs_->replays() : 0;
  ContiguousKvCache cache(workspace_, prompts);  // B rows for the prefill, B * n after it
  const int64_t pad = config.pad_token_id.value_or(config.eos_token_id.value_or(0));
  // One generator per row (row r of the B * n seeded with row_seed(config.seed, r)): a row's draws
  // do not depend on the other rows, so a continuous-batching engine can reproduce them.
  std::vector<at::Generator> generators =
      config.do_sample ? make_row_generators(device, config.seed, batch) : std::vector<at::Generator>{};
  const nn::MaskLayout prompt_layout = prompt_mask_layout(prompt_mask);
  // Decode steps take the explicit key mask always: for an all-ones mask the decode-attention op
  // gives bitwise the same result as without one, and no step reads the mask on the host.
  const nn::MaskLayout step_layout = nn::MaskLayout::kLeftPadded;
  const int64_t check_every = finished_check_interval(options_, device);

  // The bookkeeping covers the B * n rows from the start (the prompt's copies are identical);
  // only the prefill's input is the B unrepeated prompts.
  // The ids and the mask are written in place, one column per step, into buffers of the longest
  // answer's width (a torch::cat per step copied both whole: quadratic in the answer length);
  // `sequences` and `mask` are the filled columns [0, T + s), views into them.
  const GenerationResult repeated = repeat_for_return_sequences(prompt_ids, prompt_mask, n);
  const torch::TensorOptions id_options = torch::dtype(torch::kInt64).device(device);
  torch::Tensor sequence_buffer = torch::full({batch, prompt + max_new}, pad, id_options);  // [B * n, T + N]
  torch::Tensor mask_buffer = torch::zeros({batch, prompt + max_new}, id_options);          // [B * n, T + N]
  sequence_buffer.narrow(1, 0, prompt).copy_(repeated.sequences);
  mask_buffer.narrow(1, 0, prompt).copy_(repeated.attention_mask);
  int64_t length = prompt;
  torch::Tensor sequences = sequence_buffer.narrow(1, 0, length);  // [B * n, T + s]
  torch::Tensor mask = mask_buffer.narrow(1, 0, length);          // [B * n, T + s]
  torch::Tensor finished = torch::zeros({batch}, torch::dtype(torch::kBool).device(device));  // [B * n]
  const torch::Tensor prefill_mask = prompt_mask.to(torch::kInt64);  // [B, T]
  torch::Tensor step_input = prompt_ids;  // [B, T] (the prefill), then [B * n, 1]
  // The length at which this rank's rows had all finished (-1: not yet seen). Lockstep keeps
  // stepping after it; a read every `check_every` steps may see it late. Either way the result
  // is trimmed to it: steps after a row finished only append pad (mask 0) to it.
  int64_t own_length = -1;
  GenerationStats stats;
  for (int64_t step = 0; step < max_new; ++step) {
    torch::Tensor logits;  // [B * n, V] float32
    if (step > 0 && full_capacity) logits = graphs_->step(model_, workspace_, step_input, mask, use_graphs);
    if (logits.defined()) {
      cache.commit(1);  // the graph wrote the same slot; an eager step after it must append after it
    } else if (step == 0) {
      logits = decode_step(step_input, prefill_mask, cache, prompt_layout);  // [B, V]
      if (n > 1) {
        // Each prompt's cache and next-token logits go to its n rows; each row then draws from
        // its own generator exactly as after a prefill over repeated prompts.
        cache.repeat_rows(n);
        logits = logits.repeat_interleave(n, 0);  // [B * n, V]
      }
    } else {
      logits = decode_step(step_input, mask, cache, step_layout);
    }
    ++stats.forward_steps;
    torch::Tensor next;  // [B * n]
    if (own_length < 0) {
      if (hooks && hooks->select_next) {
        next = hooks->select_next(logits, sequences, step);
      } else {
        logits = process_logits(logits, sequences, config, step);
        next = select_next_tokens(logits, config, generators);
      }
      next = torch::where(finished, torch::full_like(next, pad), next);
    } else {
      next = torch::full({batch}, pad, torch::dtype(torch::kInt64).device(device));  // idle lockstep step
    }
    sequence_buffer.select(1, length).copy_(next);
    mask_buffer.select(1, length).copy_(finished.logical_not());
    ++length;
    sequences = sequence_buffer.narrow(1, 0, length);
    mask = mask_buffer.narrow(1, 0, length);
    if (config.eos_token_id) finished = finished.logical_or(next == *config.eos_token_id);
    if (hooks && hooks->end_rows) finished = finished.logical_or(rows_to_end(*hooks, next, step));
    // Host reads (device syncs) only at step 0 (the prefill timer), every `check_every` steps and
    // at the last; every rank of a lockstep group reads (and all-reduces) at the same steps.
    // Step hooks read every step anyway.
    if (step == 0 || (step + 1) % check_every == 0 || step + 1 == max_new || (hooks && hooks->end_rows)) {
      const int64_t done_length = length_when_all_finished(finished, mask, prompt);
      if (step == 0) stats.prefill_s = seconds_since(start);
      const bool unfinished_here = done_length < 0;
      if (!unfinished_here && own_length < 0) own_length = done_length;
      if (!(options_.lockstep ? any_rank_unfinished(unfinished_here) : unfinished_here)) break;
    }
    step_input = next.unsqueeze(1);
  }
  if (own_length >= 0 && own_length < length) length = own_length;  // drop the steps after every row finished
  // Copies unless every column was filled: the result owns its memory, as before.
  sequences = sequence_buffer.narrow(1, 0, length).contiguous();  // [B * n, T + s]
  mask = mask_buffer.narrow(1, 0, length).contiguous();          // [B * n, T + s]

  stats.batch = batch;
  stats.prefill_rows = prompts;
  stats.prompt_tokens = prompt;
  stats.new_tokens = sequences.size(1) - prompt;
  stats.latency_s = seconds_since(start);
  stats.parameters = parameters_;
  stats.bytes_per_parameter = bytes_per_parameter_;
  stats.cuda_graph_replays = graphs_ ? graphs_->replays() - replays_before : 0;
  const auto& model_config = model_->config();
  finish_generation_stats(stats, model_config.num_hidden_layers, model_config.hidden_size, model_config.vocab_size);
  stats_ = stats;
  if (options_.log_stats) core::log_info(format_generation_stats(stats_));
  if (options_.release_workspace_after_generate) release_workspace();
  return {sequences, mask};
}

}  // namespace inference
}  // namespace dschat
