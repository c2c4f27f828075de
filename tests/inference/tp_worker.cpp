// One rank of the tensor-parallel generation tests (tests/inference/tensor_parallel_test.cpp):
// loads a fixture checkpoint, builds this rank's shard over a Gloo communicator whose ranks are
// the TP group, and runs on the prompts the test wrote (input_ids.npy, attention_mask.npy in
// --dir) a cached prefill and inference::generate. Every rank writes what it computed, so the
// test also checks that the ranks agree:
//   <dir>/prefill_logits_rank<r>.npy  [B, T, V] fp32
//   <dir>/sequences_rank<r>.npy       [B, T + N] int64
//
// usage: dschat_tp_worker --fixture NAME --dir D [--new-tokens N] [--storage view|copy] [--timeout-ms T]
#include <filesystem>
#include <string>

#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"
#include "dschat/inference/generate.h"
#include "dschat/inference/kv_cache.h"
#include "dschat/models/load_save.h"
#include "dschat/inference/tensor_parallel.h"
#include "dschat/io/npy.h"
#include "../worker_args.h"
#include "test_paths.h"  // DSCHAT_TEST_DATA_DIR

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
  worker::WorkerFlags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--fixture")) args.fixture = flags.value();
    else if (flags.is("--dir")) args.dir = flags.value();
    else if (flags.is("--new-tokens")) args.new_tokens = flags.int_value();
    else if (flags.is("--storage"))
      args.storage = flags.value() == "copy" ? inference::ShardStorage::Copy : inference::ShardStorage::View;
    else if (flags.is("--timeout-ms")) args.timeout_ms = flags.int_value();
    else flags.unknown();
  }
  DSCHAT_CHECK(!args.fixture.empty() && !args.dir.empty(), InvalidArgument, "--fixture and --dir are required");
  return args;
}

int run(const Args& args) {
  auto communicator = worker::join_job(args.timeout_ms);
  const int64_t rank = communicator->rank();

  models::CausalLM full = models::load_causal_lm(std::string(DSCHAT_TEST_DATA_DIR) + "/" + args.fixture);
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
  return dschat::worker::run_worker("tp_worker", [&] { return run(parse(argc, argv)); });
}
