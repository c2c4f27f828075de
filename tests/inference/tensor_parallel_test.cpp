// Tensor-parallel generation (inference/tensor_parallel.h) against one process on the tiny
// fixtures, a left-padded batch of 3 prompts and 12 greedy tokens:
//   TensorParallelThreads*   tp ranks as threads of this process, summed through shared memory;
//   TensorParallelMultiproc* tp ranks as processes (tests/inference/tp_worker.cpp) over Gloo.
// Greedy ids must be equal; prefill logits (fp32) within 1e-4 absolute at real tokens: the only
// difference is the summation order of the row-parallel GEMMs (partial sums over head / feature
// slices, then a sum over ranks; measured: at most 8.4e-7). Also: shard storage (views vs
// copies), the errors.
#include <gtest/gtest.h>

#include <thread>

#include "dschat/inference/generate.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/models/load_save.h"
#include "dschat/inference/tensor_parallel.h"
#include "dschat/io/npy.h"
#include "dschat/nn/lora.h"
#include "fake_tp_group.h"
#include "model_fixtures.h"
#include "rank_jobs.h"
#include "test_util.h"

namespace dschat {
namespace {

using inference::ShardStorage;

constexpr double kLogitTolerance = 1e-4;
constexpr int64_t kNewTokens = 12;

struct Prompts {
  torch::Tensor ids;   // [3, 7] int64, left-padded
  torch::Tensor mask;  // [3, 7] int64
};

Prompts left_padded_prompts(const core::ModelConfig& config) {
  torch::Generator generator = at::detail::createCPUGenerator(20240611);
  Prompts p;
  p.ids = torch::randint(3, config.vocab_size, {3, 7}, generator, torch::kInt64);
  p.mask = torch::ones({3, 7}, torch::kInt64);
  p.mask[1].narrow(0, 0, 3).zero_();  // 4 real tokens
  p.mask[2].narrow(0, 0, 2).zero_();  // 5 real tokens
  p.ids.masked_fill_(p.mask == 0, config.pad_token_id.value_or(0));
  return p;
}

struct Outcome {
  torch::Tensor logits;     // [B, T, V] prefill
  torch::Tensor sequences;  // [B, T + N]
};

Outcome prefill_and_generate(models::CausalLM& model, const Prompts& p) {
  torch::NoGradGuard no_grad;
  inference::ContiguousKvCache cache(model->config(), p.ids.size(0), p.ids.size(1), torch::kFloat32, torch::kCPU);
  Outcome out;
  out.logits = model->forward(p.ids, p.mask, &cache);
  core::GenerationConfig config;
  config.max_new_tokens = kNewTokens;
  out.sequences = inference::generate(model, p.ids, p.mask, config).sequences;
  return out;
}

void expect_same_as_reference(const Outcome& reference, const Outcome& tp, const Prompts& p, const std::string& what) {
  const torch::Tensor real = p.mask.to(torch::kBool);  // [B, T]
  EXPECT_LT(testing::max_abs_diff(tp.logits.index({real}), reference.logits.index({real})), kLogitTolerance) << what;
  EXPECT_TRUE(torch::equal(tp.sequences, reference.sequences))
      << what << "\nTP:\n" << tp.sequences << "\nreference:\n" << reference.sequences;
}

// ---- ranks as threads (fake_tp_group.h) ---------------------------------------------------

using testing::FakeGroup;
using testing::SharedSum;

std::vector<Outcome> run_threads(models::CausalLM& full, const Prompts& p, int64_t tp, ShardStorage storage) {
  auto sum = std::make_shared<SharedSum>(tp);
  std::vector<models::CausalLM> shards;
  for (int64_t r = 0; r < tp; ++r) {
    shards.push_back(inference::make_tensor_parallel_shard(full, std::make_shared<FakeGroup>(r, tp, sum), storage));
  }
  std::vector<Outcome> outcomes(tp);
  std::vector<std::string> errors(tp);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < tp; ++r) {
    threads.emplace_back([&, r] {
      try {
        outcomes[r] = prefill_and_generate(shards[r], p);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int64_t r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return outcomes;
}

class TensorParallelThreadsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelThreadsTest, TwoRanksMatchOneProcess) {
  auto full = models::load_causal_lm(testing::fixture(GetParam()).string());
  const Prompts p = left_padded_prompts(full->config());
  const Outcome reference = prefill_and_generate(full, p);
  for (auto storage : {ShardStorage::View, ShardStorage::Copy}) {
    const auto outcomes = run_threads(full, p, 2, storage);
    for (size_t r = 0; r < outcomes.size(); ++r) {
      if (!outcomes[r].sequences.defined()) continue;  // its error is reported already
      expect_same_as_reference(reference, outcomes[r], p, "rank " + std::to_string(r));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelThreadsTest, ::testing::ValuesIn(testing::model_fixtures()),
                         testing::FixtureName());

// ---- ranks as processes ------------------------------------------------------------------

std::vector<Outcome> run_processes(const std::string& fixture, const Prompts& p, int world,
                                   const std::string& storage) {
  testing::TempDir dir;
  io::save_npy(dir / "input_ids.npy", p.ids);
  io::save_npy(dir / "attention_mask.npy", p.mask);
  testing::JobSpec spec;
  spec.argv = {DSCHAT_TP_WORKER_PATH, "--fixture", fixture, "--dir", dir.path().string(), "--new-tokens",
               std::to_string(kNewTokens), "--storage", storage, "--timeout-ms", "60000"};
  spec.world_size = world;
  spec.deadline = std::chrono::seconds(120);  // a hung collective fails the test instead of blocking it
  const testing::JobOutcome job = testing::run_rank_job(spec);
  EXPECT_FALSE(job.deadline_hit) << job.describe();
  for (const auto& rank : job.ranks) EXPECT_EQ(rank.exit_code, 0) << job.describe();
  std::vector<Outcome> outcomes;
  for (int r = 0; r < world; ++r) {
    const std::string suffix = "_rank" + std::to_string(r) + ".npy";
    if (!std::filesystem::exists(dir / ("sequences" + suffix))) break;
    outcomes.push_back({io::load_npy(dir / ("prefill_logits" + suffix)), io::load_npy(dir / ("sequences" + suffix))});
  }
  EXPECT_EQ(outcomes.size(), static_cast<size_t>(world)) << job.describe();
  return outcomes;
}

void expect_processes_match(const std::string& fixture, int world, const std::string& storage) {
  auto full = models::load_causal_lm(testing::fixture(fixture).string());
  const Prompts p = left_padded_prompts(full->config());
  const Outcome reference = prefill_and_generate(full, p);
  const auto outcomes = run_processes(fixture, p, world, storage);
  for (size_t r = 0; r < outcomes.size(); ++r) {
    expect_same_as_reference(reference, outcomes[r], p, fixture + " tp=" + std::to_string(world) + " rank " +
                                                            std::to_string(r));
    // The ranks' all-reduced activations are identical, so every rank decides the same tokens.
    EXPECT_TRUE(torch::equal(outcomes[r].logits, outcomes[0].logits)) << "rank " << r;
  }
}

class TensorParallelMultiprocTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelMultiprocTest, TwoGlooRanksMatchOneProcess) { expect_processes_match(GetParam(), 2, "view"); }

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelMultiprocTest, ::testing::ValuesIn(testing::process_model_fixtures()),
                         testing::FixtureName());

// opt-preln: 4 heads, ffn 64. llama-gqa: 4 heads over 2 key/value heads, each replicated on 2 ranks.
TEST(TensorParallelMultiproc, FourGlooRanksMatchOneProcess) {
  expect_processes_match("opt-preln", 4, "view");
  expect_processes_match("llama-gqa", 4, "copy");
}

// ---- shard storage and errors ------------------------------------------------------------

models::CausalLM opt_preln() { return models::load_causal_lm(testing::fixture("opt-preln").string()); }

bool shares_storage(const torch::Tensor& a, const torch::Tensor& b) {
  return a.storage().data() == b.storage().data();
}

TEST(TensorParallelShard, ConfigHasPerRankCountsAndTheFullHiddenSize) {
  const core::ModelConfig full = opt_preln()->config();
  const core::ModelConfig shard = inference::tensor_parallel_shard_config(full, 2);
  EXPECT_EQ(shard.num_attention_heads, 2);
  EXPECT_EQ(shard.intermediate_size, 32);
  EXPECT_EQ(shard.hidden_size, 32);
  EXPECT_EQ(shard.head_dim, 8);
  const auto layout = inference::tensor_parallel_layout(full, 4, 3);
  EXPECT_EQ(layout.head_first, 3);
  EXPECT_EQ(layout.ffn_first, 48);
}

TEST(TensorParallelShard, ViewsAliasTheFullModelAndSeeInPlaceUpdates) {
  auto full = opt_preln();
  auto shard = inference::make_tensor_parallel_shard(full, std::make_shared<FakeGroup>(1, 2), ShardStorage::View);
  auto full_params = full->named_parameters();
  for (const auto& item : shard->named_parameters()) {
    const torch::Tensor& full_param = full_params[item.key()];
    EXPECT_TRUE(shares_storage(item.value(), full_param)) << item.key();
    const auto* begin = static_cast<const char*>(full_param.data_ptr());
    const auto* at = static_cast<const char*>(item.value().data_ptr());
    EXPECT_TRUE(at >= begin && at < begin + full_param.nbytes()) << item.key();
  }
  // Rank 1 of 2: q rows [16, 32), out_proj columns [16, 32), fc2's bias whole.
  auto& full_layer = *full->backbone().decoder_layers()[0];
  auto& shard_layer = *shard->backbone().decoder_layers()[0];
  const torch::Tensor full_q = full_layer.named_parameters()["self_attn.q_proj.weight"];     // [32, 32]
  const torch::Tensor shard_q = shard_layer.named_parameters()["self_attn.q_proj.weight"];   // [16, 32]
  const torch::Tensor full_o = full_layer.named_parameters()["self_attn.out_proj.weight"];   // [32, 32]
  const torch::Tensor shard_o = shard_layer.named_parameters()["self_attn.out_proj.weight"]; // [32, 16]
  EXPECT_EQ(shard_q.data_ptr<float>(), full_q.data_ptr<float>() + 16 * 32);
  EXPECT_EQ(shard_o.data_ptr<float>(), full_o.data_ptr<float>() + 16);
  EXPECT_EQ(shard_o.sizes(), (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(shard_layer.named_parameters()["fc2.bias"].data_ptr(),
            full_layer.named_parameters()["fc2.bias"].data_ptr());
  {
    torch::NoGradGuard no_grad;
    full_q.add_(1.0);  // an optimizer step on the full model
  }
  EXPECT_TRUE(torch::equal(shard_q, full_q.narrow(0, 16, 16)));
}

TEST(TensorParallelShard, CopiesOwnTheirStorageAndRebindInPlace) {
  auto full = opt_preln();
  inference::TensorParallelShard shard(full->config(), std::make_shared<FakeGroup>(0, 2), ShardStorage::Copy);
  shard.bind_all(full);
  auto full_params = full->named_parameters();
  for (const auto& item : shard.model()->named_parameters()) {
    EXPECT_FALSE(shares_storage(item.value(), full_params[item.key()])) << item.key();
  }
  const std::string name = "model.decoder.layers.1.fc1.weight";
  torch::Tensor shard_fc1 = shard.model()->named_parameters()[name];  // [32, 32]
  const void* buffer = shard_fc1.data_ptr();
  EXPECT_TRUE(torch::equal(shard_fc1, full_params[name].narrow(0, 0, 32)));
  {
    torch::NoGradGuard no_grad;
    full_params[name].mul_(2.0);
  }
  EXPECT_FALSE(torch::equal(shard_fc1, full_params[name].narrow(0, 0, 32)));  // a copy does not follow
  shard.bind_layers(full, 1, 1);
  EXPECT_TRUE(torch::equal(shard_fc1, full_params[name].narrow(0, 0, 32)));
  EXPECT_EQ(shard_fc1.data_ptr(), buffer);  // copied into the same buffer
}

TEST(TensorParallelShard, BindsLayerGroupsOfAModelWhoseOtherLayersAreNotResident) {
  auto full = opt_preln();
  inference::TensorParallelShard shard(full->config(), std::make_shared<FakeGroup>(1, 2), ShardStorage::Copy);
  torch::NoGradGuard no_grad;
  for (auto& parameter : full->backbone().decoder_layers()[1]->parameters()) parameter.set_data(torch::empty({0}));
  shard.bind_replicated(full);
  shard.bind_layers(full, 0, 1);
  EXPECT_THROW_WITH(shard.bind_layers(full, 1, 1), core::InvalidArgument, "not resident");
  EXPECT_THROW_WITH(shard.bind_layers(full, 1, 2), core::InvalidArgument, "outside the model's 2 layers");
}

TEST(TensorParallelShard, UnevenSplitsNameTheSizesAndTp) {
  core::ModelConfig config = opt_preln()->config();
  EXPECT_THROW_WITH(inference::tensor_parallel_layout(config, 3, 0), core::InvalidArgument,
                    "num_attention_heads (4) is not divisible by tp (3)");
  config.intermediate_size = 66;
  EXPECT_THROW_WITH(inference::tensor_parallel_layout(config, 4, 0), core::InvalidArgument,
                    "intermediate_size (66) is not divisible by tp (4)");
  config.num_attention_heads = 12;
  config.num_key_value_heads = 4;
  config.intermediate_size = 60;
  EXPECT_THROW_WITH(inference::tensor_parallel_layout(config, 6, 0), core::InvalidArgument,
                    "num_key_value_heads (4) must be divisible by tp (6)");
  auto full = opt_preln();
  EXPECT_THROW_WITH(
      inference::make_tensor_parallel_shard(full, std::make_shared<FakeGroup>(0, 3), ShardStorage::View),
      core::InvalidArgument, "not divisible by tp (3)");
}

TEST(TensorParallelShard, RefusesUnfusedLoraAndAcceptsFusedLora) {
  auto full = opt_preln();
  nn::convert_linear_layers_to_lora(*full, {4, 1.0, 0.0, "decoder.layers."});
  auto group = std::make_shared<FakeGroup>(0, 2);
  EXPECT_THROW_WITH(inference::make_tensor_parallel_shard(full, group, ShardStorage::View),
                    core::InvalidArgument, "unfused LoRA");
  nn::fuse_lora(*full);
  auto shard = inference::make_tensor_parallel_shard(full, group, ShardStorage::View);
  EXPECT_EQ(nn::count_lora_layers(*shard), 0);
}

TEST(TensorParallelShard, ForwardOutsideTheInferencePathThrows) {
  auto full = opt_preln();
  auto shard = inference::make_tensor_parallel_shard(full, std::make_shared<FakeGroup>(0, 2), ShardStorage::View);
  const Prompts p = left_padded_prompts(full->config());
  inference::ContiguousKvCache cache(shard->config(), 3, 7, torch::kFloat32, torch::kCPU);
  EXPECT_THROW_WITH(shard->forward(p.ids, p.mask, &cache), core::InvalidArgument, "runs only for generation");
  torch::NoGradGuard no_grad;
  EXPECT_THROW_WITH(shard->forward(p.ids, p.mask), core::InvalidArgument, "runs only for generation");
}

}  // namespace
}  // namespace dschat
