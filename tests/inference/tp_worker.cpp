// One rank of the tensor-parallel generation tests (tests/inference/tensor_parallel_test.cpp):
// loads a fixture checkpoint, builds this rank's shard over a Gloo communicator whose ranks are
// the TP group, and runs on the prompts the test wrote (input_ids.npy, attention_mask.npy in
// --dir) a cached prefill and inference::generate. Every rank writes what it computed, so the
// test also checks that the ranks agree:
//   <dir>/prefill_logits_rank<r>.npy  [B, T, V] fp32
//   <dir>/sequences_rank<r>.npy       [B, T + N] int64
//
// usage: dschat_tp_worker --fixture NAME --dir D [--new-tokens N] [--storage view|copy] [--timeout-ms T]
#include <ATen/Parallel.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <string>

#include "dschat/core/error.h"
#include "dschat/dist/launch_env.h"
#include "dschat/dist/process_group.h"
#include "dschat/inference/generate.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/inference/model_loader.h"
#include "dschat/inference/tensor_parallel.h"
#include "dschat/io/npy.h"

namespace {

using namespace dschat;

struct Args {
  std::string fixture;
  std::filesystem::path dir;
  int64_t new_tokens = 12;
  inference::ShardStorage storage = inference::ShardStorage::View;
  int64_t timeout_ms = 60000;
};

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      DSCHAT_CHECK(i + 1 < argc, InvalidArgument, flag, " needs a value");
      return argv[++i];
    };
    if (flag == "--fixture") args.fixture = value();
    else if (flag == "--dir") args.dir = value();
    else if (flag == "--new-tokens") args.new_tokens = std::stoll(value());
    else if (flag == "--storage")
      args.storage = value() == "copy" ? inference::ShardStorage::Copy : inference::ShardStorage::View;
    else if (flag == "--timeout-ms") args.timeout_ms = std::stoll(value());
    else DSCHAT_THROW(InvalidArgument, "unknown flag ", flag);
  }
  DSCHAT_CHECK(!args.fixture.empty() && !args.dir.empty(), InvalidArgument, "--fixture and --dir are required");
  return args;
}

int run(const Args& args) {
  at::set_num_threads(1);  // several ranks share two cores
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  auto communicator = std::make_shared<dist::Communicator>(
      dist::Communicator::create(env, dist::Backend::Gloo, std::chrono::milliseconds(args.timeout_ms)));
  const int64_t rank = communicator->rank();

  models::CausalLM full = inference::load_causal_lm(std::string(DSCHAT_TEST_DATA_DIR) + "/" + args.fixture);
  models::CausalLM shard =
      inference::make_tensor_parallel_shard(full, inference::make_tensor_parallel_group(communicator), args.storage);
  if (args.storage == inference::ShardStorage::Copy) full = models::CausalLM(nullptr);  // the shard owns its weights

  const torch::Tensor ids = io::load_npy(args.dir / "input_ids.npy");        // [B, T]
  const torch::Tensor mask = io::load_npy(args.dir / "attention_mask.npy");  // [B, T]
  torch::NoGradGuard no_grad;
  inference::ContiguousKvCache cache(shard->config(), ids.size(0), ids.size(1), torch::kFloat32, torch::kCPU);
  const torch::Tensor logits = shard->forward(ids, mask, &cache);  // [B, T, V]

  core::GenerationConfig config;
  config.max_new_tokens = args.new_tokens;
  const inference::GenerationResult result = inference::generate(shard, ids, mask, config);

  const std::string suffix = "_rank" + std::to_string(rank) + ".npy";
  io::save_npy(args.dir / ("prefill_logits" + suffix), logits);
  io::save_npy(args.dir / ("sequences" + suffix), result.sequences);
  communicator->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "tp_worker: error: " << e.what() << "\n";
    return 1;
  }
}
