// One rank of the multi-process HybridEngine tests (tests/hybrid/hybrid_multiproc_test.cpp).
// Each rank owns a tiny OPT actor (tests/fixtures/opt-preln, 4 layers, dropout off) in a
// HybridEngine and prompts of its own (a left-padded batch of 2 whose length depends on the rank),
// then:
//   1. generates greedily and compares with inference::generate on a plain single-process copy
//      of the same model (LoRA fused, in the generation dtype): "first_matches";
//   2. with --uneven, rank 0's second generated token becomes the EOS of every rank, so the
//      ranks finish at different lengths; compared the same way: "eos_matches";
//   3. trains one step, generates again ("after_step": compared across runs by the test);
//   4. with --continuous (continuous_batching and prefix_caching on), generates 2 prompts that
//      share their first 20 tokens on every rank: "shared_matches", and "shared_cached_tokens"
//      (the prompt tokens the prefix cache gave, which the test counts);
// and writes <out>.rank<r>.json. The self-check runs at every switch.
//
// usage: dschat_hybrid_worker --out F [--stage S] [--tp T] [--pin 0|1] [--gather N] [--lora]
//            [--bf16-generation] [--uneven] [--continuous] [--timeout-ms T]
#include <fstream>
#include <string>

#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/dist/process_group.h"
#include "dschat/hybrid/hybrid_engine.h"
#include "dschat/inference/generate.h"
#include "dschat/nn/lora.h"
#include "../worker_args.h"
#include "test_paths.h"  // DSCHAT_TEST_DATA_DIR

namespace {

using nlohmann::json;
using namespace dschat;

struct Args {
  std::string out;
  int stage = 0;
  int64_t tp = 1;
  bool pin = true;
  int64_t gather = 8;
  bool lora = false;
  bool bf16_generation = false;
  bool uneven = false;
  bool continuous = false;
  int64_t timeout_ms = 60000;
};

Args parse(int argc, char** argv) {
  Args args;
  worker::WorkerFlags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--out")) args.out = flags.value();
    else if (flags.is("--stage")) args.stage = static_cast<int>(flags.int_value());
    else if (flags.is("--tp")) args.tp = flags.int_value();
    else if (flags.is("--pin")) args.pin = flags.value() == "1";
    else if (flags.is("--gather")) args.gather = flags.int_value();
    else if (flags.is("--lora")) args.lora = true;
    else if (flags.is("--bf16-generation")) args.bf16_generation = true;
    else if (flags.is("--uneven")) args.uneven = true;
    else if (flags.is("--continuous")) args.continuous = true;
    else if (flags.is("--timeout-ms")) args.timeout_ms = flags.int_value();
    else flags.unknown();
  }
  return args;
}

// The actor every rank starts from (rank 0's seed; the engine broadcasts rank 0's values anyway).
models::CausalLM make_actor(const core::ModelConfig& config, bool lora) {
  torch::manual_seed(7);
  models::CausalLM model(config);
  if (lora) {
    nn::convert_linear_layers_to_lora(*model, {4, 1.0, 0.0, "decoder.layers."});
    torch::NoGradGuard no_grad;
    // DeepSpeed-Chat starts lora_left at zero (a no-op fuse); random values make the fuse visible.
    for (auto& item : model->named_parameters()) {
      if (item.key().find("lora_left_weight") != std::string::npos) item.value().normal_(0.0, 0.05);
    }
    nn::only_optimize_lora_parameters(*model);
  }
  return model;
}

json ids_json(const torch::Tensor& ids) {
  json rows = json::array();
  for (int64_t r = 0; r < ids.size(0); ++r) {
    torch::Tensor row = ids[r].contiguous();  // [N]
    rows.push_back(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
  }
  return rows;
}

int run(const Args& args) {
  auto communicator = worker::join_job(args.timeout_ms);
  const int64_t world = communicator->world_size(), rank = communicator->rank();

  core::ModelConfig config = core::load_model_config(std::string(DSCHAT_TEST_DATA_DIR) + "/opt-preln");
  config.num_hidden_layers = 4;
  config.dropout = 0.0;
  models::CausalLM actor = make_actor(config, args.lora);
  models::CausalLM reference = make_actor(config, args.lora);
  if (args.lora) nn::fuse_lora(*reference);
  if (args.bf16_generation) reference->to(torch::kBFloat16);
  reference->eval();

  // Rank r's prompts: 5 + 2r tokens, row 1 left-padded by 2.
  const int64_t tokens = 5 + 2 * rank;
  torch::Generator generator = at::detail::createCPUGenerator(100 + rank);
  torch::Tensor ids = torch::randint(3, config.vocab_size, {2, tokens}, generator, torch::kInt64);  // [2, T]
  torch::Tensor mask = torch::ones({2, tokens}, torch::kInt64);                                     // [2, T]
  mask[1].narrow(0, 0, 2).zero_();
  ids[1].narrow(0, 0, 2).fill_(1);

  json ds = {{"train_micro_batch_size_per_gpu", 2},
             {"gradient_accumulation_steps", 1},
             {"train_batch_size", 2 * world},
             {"steps_per_print", 0},
             {"zero_optimization",
              {{"stage", args.stage}, {"stage3_param_persistence_threshold", 64}, {"reduce_bucket_size", 3000}}},
             {"hybrid_engine",
              {{"enabled", true},
               {"max_out_tokens", 64},
               {"inference_tp_size", args.tp},
               {"release_inference_cache", true},
               {"pin_parameters", args.pin},
               {"tp_gather_partition_size", args.gather},
               {"continuous_batching", args.continuous},
               {"prefix_caching", args.continuous}}}};
  hybrid::HybridEngineOptions options;
  options.training.config = engine::DeepSpeedConfig::parse(ds, world, "hybrid_worker");
  options.training.optimizer.lr = 1e-2;
  options.training.communicator = communicator;
  if (args.bf16_generation) options.inference_dtype = torch::kBFloat16;
  options.logits_self_check = true;
  hybrid::HybridEngine engine(actor, options);

  core::GenerationConfig greedy;
  greedy.max_new_tokens = 8;
  json report = {{"rank", rank}};
  auto first = engine.generate(ids, mask, greedy);
  auto expected = inference::generate(reference, ids, mask, greedy);
  report["first"] = ids_json(first.sequences);
  report["first_matches"] = torch::equal(first.sequences, expected.sequences);
  report["self_check_max_diff"] = engine.last_stats().self_check_max_diff;

  if (args.uneven) {
    torch::Tensor eos = torch::full({1}, rank == 0 ? first.sequences[0][tokens + 1].item<int64_t>() : 0,
                                    torch::kInt64);  // [1]
    communicator->broadcast(eos, 0);
    core::GenerationConfig stopping = greedy;
    stopping.max_new_tokens = 16;
    stopping.eos_token_id = eos.item<int64_t>();
    auto stopped = engine.generate(ids, mask, stopping);
    auto stopped_expected = inference::generate(reference, ids, mask, stopping);
    report["eos"] = ids_json(stopped.sequences);
    report["eos_token"] = stopping.eos_token_id.value();
    report["eos_new_tokens"] = stopped.sequences.size(1) - tokens;  // this rank's longest row
    report["eos_matches"] = torch::equal(stopped.sequences, stopped_expected.sequences);
  }

  if (args.tp > 1) {
    // Sampling in a TP group with per-rank seeds (as step 3 passes them) draws with the group's
    // first rank's, so it gives what every rank passing that seed gives; divergent draws would not.
    core::GenerationConfig sampled = greedy;
    sampled.do_sample = true;
    sampled.top_k = 20;
    sampled.seed = 500 + static_cast<uint64_t>(rank);
    const torch::Tensor own_seeds = engine.generate(ids, mask, sampled).sequences;  // [2, T + 8]
    sampled.seed = 500 + static_cast<uint64_t>(rank / args.tp * args.tp);
    const torch::Tensor rank0_seed = engine.generate(ids, mask, sampled).sequences;  // [2, T + 8]
    report["tp_sampling_agrees"] = torch::equal(own_seeds, rank0_seed);
  }

  if (args.continuous) {
    // 20 shared tokens (the same on every rank: generator 99), then 4 of the row's own.
    torch::Generator shared_generator = at::detail::createCPUGenerator(99);
    torch::Tensor shared = torch::randint(3, config.vocab_size, {1, 20}, shared_generator, torch::kInt64);  // [1, 20]
    torch::Generator own_generator = at::detail::createCPUGenerator(200 + rank);  // leaves `generator` as it was
    torch::Tensor own = torch::randint(3, config.vocab_size, {2, 4}, own_generator, torch::kInt64);  // [2, 4]
    torch::Tensor shared_ids = torch::cat({shared.expand({2, 20}), own}, 1);                                 // [2, 24]
    torch::Tensor shared_mask = torch::ones({2, 24}, torch::kInt64);                                        // [2, 24]
    auto got = engine.generate(shared_ids, shared_mask, greedy);
    report["shared_matches"] =
        torch::equal(got.sequences, inference::generate(reference, shared_ids, shared_mask, greedy).sequences);
    report["shared_cached_tokens"] = engine.last_stats().generation.cached_prompt_tokens;
  }

  engine.train();
  report["inference_bytes_after_train"] = engine.inference_bytes();
  torch::Tensor batch = torch::randint(3, config.vocab_size, {2, 10}, generator, torch::kInt64);  // [2, 10]
  torch::Tensor logits = actor->forward(batch);                                                   // [2, 10, V]
  torch::Tensor loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, 9).reshape({-1, logits.size(2)}),
                                                            batch.narrow(1, 1, 9).reshape({-1}));
  engine.backward(loss);
  engine.step();
  report["after_step"] = ids_json(engine.generate(ids, mask, greedy).sequences);
  engine.train();
  std::ofstream(args.out + ".rank" + std::to_string(rank) + ".json") << report.dump(1);
  communicator->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("hybrid_worker", [&] { return run(parse(argc, argv)); });
}
