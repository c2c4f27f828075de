#include "dschat/core/host_sync.h"
#include "dschat/hybrid/hybrid_engine.h"

#include <cstdio>

#include "core/log.h"
#include "dschat/core/error.h"
#include "hybrid/generation_model.h"
#include "hybrid/inference_weights.h"
#include "hybrid/logits_self_check.h"

namespace dschat {
namespace hybrid {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

bool self_check_by_default() {
#ifdef NDEBUG
  return false;
#else
  return true;
#endif
}

}  // namespace

HybridEngine::HybridEngine(models::CausalLM actor, HybridEngineOptions options)
    : actor_(std::move(actor)), options_(std::move(options)) {
  DSCHAT_CHECK(!actor_.is_empty(), InvalidArgument, "HybridEngine: no actor model");
  const engine::HybridEngineConfig& he = options_.training.config.hybrid_engine;
  training_ = std::make_unique<engine::TrainingEngine>(actor_.ptr(), options_.training);
  options_.training.deferred.reset();  // a deferred load's checkpoint mapping: the engine has what it keeps
  const int64_t world = training_->world_size();
  DSCHAT_CHECK(he.inference_tp_size >= 1 && world % he.inference_tp_size == 0, ConfigError,
               "hybrid_engine.inference_tp_size ", he.inference_tp_size, " does not divide the ", world,
               " ranks (they form world / inference_tp_size tensor-parallel groups)");
  if (he.inference_tp_size > 1) {
    // DeepSpeed's groups: ranks [g * t, (g + 1) * t). Every member makes its group here, in step.
    if (he.inference_tp_size == world) {
      tp_group_ = training_->communicator();
    } else {
      const int64_t first = training_->communicator()->rank() / he.inference_tp_size * he.inference_tp_size;
      std::vector<int64_t> ranks(he.inference_tp_size);
      for (int64_t i = 0; i < he.inference_tp_size; ++i) ranks[i] = first + i;
      tp_group_ = std::make_shared<dist::Communicator>(training_->communicator()->subgroup(ranks));
    }
  }
  if (!options_.logits_self_check) options_.logits_self_check = self_check_by_default();

  inference::InferenceEngineOptions inference_options;
  inference_options.max_out_tokens = he.max_out_tokens;
  inference_options.release_workspace_after_generate = he.release_inference_cache;
  inference_options.enable_cuda_graph = he.enable_cuda_graph;
  // Data-parallel ranks generate their own prompts; under ZeRO-3 every forward is collective,
  // so a rank that finished early keeps stepping (either engine). A TP group shares one batch and
  // one schedule: no lockstep.
  DSCHAT_CHECK(!he.prefix_caching || he.continuous_batching, ConfigError,
               "hybrid_engine.prefix_caching needs continuous_batching (the static engine shares no KV blocks)");
  if (world > 1 && he.inference_tp_size == 1) inference_options.lockstep = training_->communicator();
  inference_ = std::make_unique<inference::InferenceEngine>(actor_, inference_options);
  training_start_ = Clock::now();
}

HybridEngine::~HybridEngine() = default;

void HybridEngine::require_training_mode(const char* call) const {
  DSCHAT_CHECK(!generating(), InvalidArgument, "HybridEngine::", call,
               " in generation mode: call train() after generating");
}

void HybridEngine::log_iteration_line() {
  const auto now = Clock::now();
  if (iteration_start_) {
    const double latency = seconds_between(*iteration_start_, now);
    total_latency_ += latency;
    ++iterations_;
    const double gather = stats_.gather_seconds, others = latency - generate_seconds_ - training_seconds_;
    auto pct = [&](double part) { return latency > 0 ? 100.0 * part / latency : 0.0; };
    char line[512];
    std::snprintf(line, sizeof(line),
                  "|E2E latency=%.2fs |Gather latency=%.2fs (%.2f%%) |Generate time=%.2fs (%.2f%%) |Training "
                  "time=%.2fs (%.2f%%) |Others=%.2f (%.2f%%)|CurSamplesPerSec=%.2f |AvgSamplesPerSec=%.2f",
                  latency, gather, pct(gather), generate_seconds_, pct(generate_seconds_), training_seconds_,
                  pct(training_seconds_), others, pct(others), latency > 0 ? samples_ / latency : 0.0,
                  samples_ / (total_latency_ / static_cast<double>(iterations_)));
    core::log_info_rank0(line);
  }
  iteration_start_ = now;
  generate_seconds_ = 0.0;
  training_seconds_ = 0.0;
}

void HybridEngine::eval() {
  if (generating()) return;
  log_iteration_line();
  training_parameter_bytes_ = training_->memory_footprint().parameter_bytes;
  actor_->eval();
  models::Backbone& backbone = actor_->backbone();
  saved_checkpointing_ = backbone.gradient_checkpointing();
  backbone.set_gradient_checkpointing(false);  // generation keeps no activations anyway

  const engine::HybridEngineConfig& he = options_.training.config.hybrid_engine;
  InferenceWeightsOptions weights_options;
  weights_options.pin_parameters = he.pin_parameters;
  weights_options.layers_per_gather = he.tp_gather_partition_size;
  weights_options.lora_fuse_backup = options_.lora_fuse_backup;
  nn::LayerParameterHooks* hooks = training_->layer_parameter_hooks();
  const auto model_dtype = actor_->parameters().front().scalar_type();
  const auto dtype = options_.inference_dtype.value_or(model_dtype);
  if (dtype == model_dtype && he.inference_tp_size == 1) {
    weights_ = std::make_unique<InferenceWeights>(actor_, hooks, weights_options);
  } else {
    if (!generation_model_) {
      const bool views_allowed = dtype == model_dtype && hooks == nullptr;  // resident and in the right dtype
      generation_model_ = std::make_unique<GenerationModel>(actor_, dtype, tp_group_, he.inference_tp_size,
                                                            views_allowed);
    }
    weights_ = std::make_unique<InferenceWeights>(actor_, hooks, weights_options, *generation_model_);
  }
  inference_->set_model(weights_->model());
  stats_.gather_seconds = weights_->gather_seconds();
  self_check_pending_ = *options_.logits_self_check;
}

void HybridEngine::train() {
  if (!generating()) {
    actor_->train();
    return;
  }
  weights_->restore();
  weights_.reset();
  inference_->set_model(actor_);
  // The parameters gathered for generation outside the layers go too (ZeRO-3), so the memory is
  // back where the training step left it.
  training_->release_gathered_parameters();
  const engine::HybridEngineConfig& he = options_.training.config.hybrid_engine;
  const int64_t parameter_bytes = training_->memory_footprint().parameter_bytes;
  DSCHAT_CHECK(parameter_bytes <= training_parameter_bytes_, Error, "hybrid engine: after generation the engine holds ",
               parameter_bytes, " parameter bytes, more than the ", training_parameter_bytes_,
               " it held before (a gathered partition was not released)");
  DSCHAT_CHECK(!he.release_inference_cache || inference_->workspace_bytes() == 0, Error,
               "hybrid engine: release_inference_cache is set but the KV workspace still holds ",
               inference_->workspace_bytes(), " bytes");
  actor_->train();
  actor_->backbone().set_gradient_checkpointing(saved_checkpointing_);
  training_start_ = Clock::now();
}

void HybridEngine::backward(const torch::Tensor& loss) {
  require_training_mode("backward()");
  training_->backward(loss);
}

bool HybridEngine::step() {
  require_training_mode("step()");
  const bool stepped = training_->step();
  const auto now = Clock::now();
  training_seconds_ += seconds_between(training_start_, now);
  training_start_ = now;
  return stepped;
}

models::CausalLM HybridEngine::inference_model() {
  DSCHAT_CHECK(generating(), InvalidArgument, "HybridEngine::inference_model() outside generation mode: call eval()");
  return weights_->model();
}

int64_t HybridEngine::inference_bytes() const {
  return inference_->workspace_bytes() + (continuous_ ? continuous_->pool().bytes() : 0) +
         (weights_ ? weights_->copied_bytes() : 0);
}

void HybridEngine::run_self_check(const torch::Tensor& input_ids, const torch::Tensor& attention_mask) {
  self_check_pending_ = false;
  // Row 0's real tokens (left padding removed); one token at least, so that every rank runs the
  // same forwards (they are collective under ZeRO-3 and tensor parallelism).
  torch::Tensor real = attention_mask[0].to(torch::kBool);               // [T]
  torch::Tensor prompt = input_ids[0].masked_select(real).unsqueeze(0);  // [1, t]
  if (prompt.size(1) == 0) prompt = input_ids[0].narrow(0, input_ids.size(1) - 1, 1).unsqueeze(0);
  models::CausalLM generation = weights_->model();
  SelfCheckResult result = check_inference_logits(actor_, generation, prompt);
  stats_.self_check_max_diff = result.max_abs_diff;
  core::log_debug("hybrid engine self-check: max |logit difference| ", result.max_abs_diff, " <= ", result.tolerance);
}

inference::GenerationResult HybridEngine::generate(const torch::Tensor& prompt_ids, const torch::Tensor& prompt_mask,
                                                   const core::GenerationConfig& requested) {
  eval();
  const auto start = Clock::now();
  const int64_t n = requested.num_return_sequences;
  samples_ = prompt_ids.size(0) * n * training_->world_size();  // B * n rows per rank
  inference::GenerationResult result;
  if (options_.training.config.hybrid_engine.inference_tp_size > 1) {
    result = generate_tensor_parallel(prompt_ids, prompt_mask, requested);  // [B * n, T + N]
  } else {
    // n answers per prompt from one prefill of each prompt (either engine shares its KV).
    if (self_check_pending_) run_self_check(prompt_ids, prompt_mask);
    if (he_config().continuous_batching) {
      result = generate_continuous(prompt_ids, prompt_mask, requested);  // [B * n, T + N]
      generate_seconds_ += seconds_between(start, Clock::now());
      return result;
    }
    result = inference_->generate(prompt_ids, prompt_mask, requested);  // [B * n, T + N]
    stats_.generation = inference_->last_stats();
  }
  generate_seconds_ += seconds_between(start, Clock::now());
  return result;
}

inference::GenerationResult HybridEngine::generate_continuous(const torch::Tensor& prompt_ids,
                                                              const torch::Tensor& prompt_mask,
                                                              const core::GenerationConfig& config) {
  const engine::HybridEngineConfig& he = he_config();
  models::CausalLM model = weights_->model();  // the generation weights (borrowed, cast or fused)
  if (!continuous_) {
    inference::ContinuousEngineOptions options;
    options.max_running_sequences = he.max_running_sequences;
    options.prefix_caching = he.prefix_caching;  // set_model() empties it after every weight update
    options.enable_cuda_graph = he.enable_cuda_graph;  // set_model() drops the graphs too
    options.size_pool(he.kv_cache_memory_mib << 20, he.max_running_sequences, he.max_out_tokens);
    if (training_->world_size() > 1 && he.inference_tp_size == 1) options.lockstep = training_->communicator();
    continuous_ = std::make_unique<inference::ContinuousEngine>(model, options);
  } else {
    continuous_->set_model(model);
  }
  inference::GenerationResult result = continuous_->generate(prompt_ids, prompt_mask, config);  // [B * n, T + N]
  stats_.generation = continuous_->last_stats();
  if (he.release_inference_cache) continuous_.reset();  // its pool goes; the next call takes it again
  return result;
}

inference::GenerationResult HybridEngine::generate_tensor_parallel(const torch::Tensor& input_ids,
                                                                   const torch::Tensor& attention_mask,
                                                                   const core::GenerationConfig& config) {
  // The TP group works on one batch: its ranks' prompts are concatenated (left-padded to the
  // longest), generated together, and each rank keeps its own rows. Sampling draws for the joint
  // batch, so every rank must draw the same tokens: the group samples with its rank 0's seed (each
  // rank's own, e.g. step 3's per-rank seeds, would make the ranks' sequences, and so their
  // shards' inputs, diverge). Other groups generate their own batches meanwhile: nothing of a
  // group's generation is collective over the world (ZeRO-3 gathered its weights at eval()).
  dist::Communicator& group = *tp_group_;
  const int64_t world = group.world_size(), rank = group.rank();
  const int64_t batch = input_ids.size(0), tokens = input_ids.size(1);
  torch::Tensor shape = torch::tensor({batch, tokens, static_cast<int64_t>(config.seed)}, torch::kInt64);  // [3]
  torch::Tensor shapes = torch::empty({world * 3}, torch::kInt64);  // [world * 3]
  group.all_gather_into(shapes, shape);
  torch::Tensor per_rank = shapes.view({world, 3});  // [world, 3]: (batch, tokens, seed) of each rank
  core::GenerationConfig joint_config = config;
  joint_config.seed = static_cast<uint64_t>(per_rank[0][2].item<int64_t>());
  DSCHAT_CHECK((per_rank.select(1, 0) == batch).all().item<bool>(), InvalidArgument,
               "hybrid engine: with inference_tp_size > 1 every rank must generate the same number of prompts; "
               "the ranks have ",
               per_rank.select(1, 0), " prompts");
  const int64_t longest = per_rank.select(1, 1).max().item<int64_t>();
  const int64_t pad = config.pad_token_id.value_or(config.eos_token_id.value_or(0));
  auto device = input_ids.device();
  torch::Tensor ids =
      torch::cat({torch::full({batch, longest - tokens}, pad, input_ids.options()), input_ids}, 1);  // [B, T*]
  torch::Tensor mask = torch::cat({torch::zeros({batch, longest - tokens}, torch::dtype(torch::kInt64).device(device)),
                                   attention_mask.to(torch::kInt64)},
                                  1);                                                // [B, T*]
  torch::Tensor all_ids = torch::empty({world * batch * longest}, ids.options());    // [world * B * T*]
  torch::Tensor all_mask = torch::empty({world * batch * longest}, mask.options());  // [world * B * T*]
  group.all_gather_into(all_ids, ids.contiguous().view({-1}));
  group.all_gather_into(all_mask, mask.contiguous().view({-1}));
  all_ids = all_ids.view({world * batch, longest});
  all_mask = all_mask.view({world * batch, longest});
  if (self_check_pending_) run_self_check(all_ids, all_mask);
  // Joint row r * B * n + b * n + j is sample j of rank r's prompt b, seeded as row_seed(seed, that
  // row) by either engine. The continuous engine shares each prompt's prefill among its n samples;
  // the static one is given the prompts repeated n times (the same rows and seeds).
  const int64_t n = config.num_return_sequences, rows = batch * n;
  inference::GenerationResult joint;
  if (he_config().continuous_batching) {
    joint = generate_continuous(all_ids, all_mask, joint_config);  // [world * B * n, T* + N]
  } else {
    const inference::GenerationResult repeated = inference::repeat_for_return_sequences(all_ids, all_mask, n);
    joint_config.num_return_sequences = 1;
    joint = inference_->generate(repeated.sequences, repeated.attention_mask, joint_config);  // [world * B * n, T* + N]
    stats_.generation = inference_->last_stats();
  }
  // This rank's rows without its extra left padding, and without the columns the other ranks'
  // rows went on generating after all of these had stopped (as a generation of its own would).
  const int64_t offset = longest - tokens;
  torch::Tensor sequences = joint.sequences.narrow(0, rank * rows, rows);      // [B * n, T* + N]
  torch::Tensor own_mask = joint.attention_mask.narrow(0, rank * rows, rows);  // [B * n, T* + N]
  const int64_t generated = joint.sequences.size(1) - longest;
  torch::Tensor produced = own_mask.narrow(1, longest, generated).sum(1);  // [B * n] tokens up to and with EOS
  core::HostSync sync("generation (tensor-parallel answer length, once per call)");
  const int64_t width = tokens + (generated == 0 ? 0 : produced.max().item<int64_t>());
  return {sequences.narrow(1, offset, width).contiguous(), own_mask.narrow(1, offset, width).contiguous()};
}

}  // namespace hybrid
}  // namespace dschat
