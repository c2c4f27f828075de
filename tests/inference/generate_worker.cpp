// One rank of the lockstep-generation tests (tests/inference/generate_multiproc_test.cpp): every
// rank loads the same tiny model and generates its own prompts through an InferenceEngine in
// lockstep over Gloo. Rank 0 takes the fixture's row 0, rank 1 its (left-padded) rows 1 and 2.
// EOS is chosen so that rank 0 finishes after a couple of tokens while rank 1 runs all
// --new-tokens steps: the first of row 0's greedy tokens (from the second on) that rows 1 and 2
// never emit. Each rank then generates the same prompts alone (no lockstep) and compares.
// With --continuous the lockstep engine is a ContinuousEngine (2 decode rows, one prefill forward
// per prompt: rank 1 runs two prefill forwards in its first step where rank 0 runs one) and
// every forward is collective the way ZeRO-3 makes it: layer hooks all-reduce (forward index,
// layer) and throw when the ranks disagree, so a forward one rank runs alone fails instead of
// pairing with another.
// Writes <out>/rank<r>.json: {"equal", "length", "forward_steps", "eos", "idle_forwards"}; exits 3
// when the lockstep ids differ from the ones generated alone, 1 on an error (message on stderr).
//
// usage: dschat_generate_worker --model DIR --out DIR [--new-tokens N] [--timeout-ms T]
//            [--mismatch]        rank r asks for N + r new tokens (a lockstep error)
//            [--overflow-rank R] rank R's engine is too small for its prompt (a local error)
//            [--continuous]      the continuous engine under collective layer hooks
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/nn/layer_hooks.h"
#include "dschat/models/load_save.h"
#include "dschat/io/npy.h"
#include "../worker_args.h"

namespace {

using nlohmann::json;
using namespace dschat;

struct Args {
  std::string model, out;
  int64_t new_tokens = 12;
  int64_t timeout_ms = 20000;
  bool mismatch = false;
  int64_t overflow_rank = -1;
  bool continuous = false;
};

Args parse(int argc, char** argv) {
  Args args;
  worker::WorkerFlags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--model")) args.model = flags.value();
    else if (flags.is("--out")) args.out = flags.value();
    else if (flags.is("--new-tokens")) args.new_tokens = flags.int_value();
    else if (flags.is("--timeout-ms")) args.timeout_ms = flags.int_value();
    else if (flags.is("--mismatch")) args.mismatch = true;
    else if (flags.is("--overflow-rank")) args.overflow_rank = flags.int_value();
    else if (flags.is("--continuous")) args.continuous = true;
    else flags.unknown();
  }
  return args;
}

inference::InferenceEngineOptions engine_options(int64_t max_out_tokens) {
  inference::InferenceEngineOptions options;
  options.max_out_tokens = max_out_tokens;
  options.log_stats = false;
  return options;
}

// ZeRO-3's shape of collectives without its partitions: every forward and every layer of it
// all-reduces its index, and the ranks must agree.
class CollectiveLayerCheck : public nn::LayerParameterHooks {
 public:
  explicit CollectiveLayerCheck(std::shared_ptr<dist::Communicator> communicator)
      : communicator_(std::move(communicator)) {}
  void begin_forward() override { agree("forward", forwards_++); }
  void acquire_layer(int64_t layer) override { agree("layer", layer); }
  void release_layer(int64_t) override {}
  void layer_gradients_ready(int64_t) override {}

 private:
  void agree(const char* what, int64_t index) {
    torch::Tensor range = torch::tensor({index, -index}, torch::kInt64);  // [2]: max, -min over ranks
    communicator_->all_reduce(range, dist::ReduceOp::Max);
    DSCHAT_CHECK(range[0].item<int64_t>() == -range[1].item<int64_t>(), Error, "ranks out of step: ", what, " ",
                 index, " here, ", -range[1].item<int64_t>(), " to ", range[0].item<int64_t>(), " over the ranks");
  }
  std::shared_ptr<dist::Communicator> communicator_;
  int64_t forwards_ = 0;
};

// The first of row 0's generated tokens (from the second on) that rows 1 and 2 never generate.
int64_t choose_eos(const torch::Tensor& greedy, int64_t prompt) {
  torch::Tensor others = greedy.narrow(0, 1, 2).narrow(1, prompt, greedy.size(1) - prompt);  // [2, N]
  for (int64_t t = prompt + 1; t < greedy.size(1); ++t) {
    const int64_t candidate = greedy[0][t].item<int64_t>();
    if (!others.eq(candidate).any().item<bool>()) return candidate;
  }
  DSCHAT_THROW(Error, "no token of row 0's greedy continuation is absent from rows 1 and 2: ", greedy);
}

int run(const Args& args) {
  auto communicator = worker::join_job(args.timeout_ms);
  const int64_t rank = communicator->rank();
  DSCHAT_CHECK(communicator->world_size() == 2, InvalidArgument, "run with 2 ranks");
  auto model = models::load_causal_lm(args.model);
  const torch::Tensor all_ids = io::load_npy(std::filesystem::path(args.model) / "expected" / "input_ids.npy");  // [3, T]
  const torch::Tensor all_mask =
      io::load_npy(std::filesystem::path(args.model) / "expected" / "attention_mask.npy").to(torch::kInt64);  // [3, T]
  const int64_t prompt = all_ids.size(1);

  core::GenerationConfig config;
  config.max_new_tokens = args.new_tokens;
  inference::InferenceEngine alone(model, engine_options(prompt + args.new_tokens + 1));
  config.eos_token_id = choose_eos(alone.generate(all_ids, all_mask, config).sequences, prompt);
  config.pad_token_id = model->config().pad_token_id.value_or(0);

  const int64_t first = rank == 0 ? 0 : 1, rows = rank == 0 ? 1 : 2;
  const torch::Tensor ids = all_ids.narrow(0, first, rows);    // [rows, T]
  const torch::Tensor mask = all_mask.narrow(0, first, rows);  // [rows, T]
  const inference::GenerationResult reference = alone.generate(ids, mask, config);

  if (args.mismatch) config.max_new_tokens += rank;
  inference::GenerationResult result;
  int64_t forward_steps = 0, idle_forwards = 0;
  if (args.continuous) {
    inference::ContinuousEngineOptions options;
    options.block_size = 4;
    options.max_running_sequences = 2;
    options.batched_prefill = false;  // ranks with different forward counts within a step
    options.num_blocks = rank == args.overflow_rank ? 2 : 16;
    options.lockstep = communicator;
    CollectiveLayerCheck check(communicator);
    model->backbone().set_layer_parameter_hooks(&check);
    inference::ContinuousEngine engine(model, options);
    result = engine.generate(ids, mask, config);
    model->backbone().set_layer_parameter_hooks(nullptr);
    forward_steps = engine.last_stats().forward_steps;
    idle_forwards = engine.stats().idle_forwards;
  } else {
    inference::InferenceEngineOptions options = engine_options(prompt + args.new_tokens + 1);
    if (rank == args.overflow_rank) options.max_out_tokens = prompt;
    options.lockstep = communicator;
    inference::InferenceEngine engine(model, options);
    result = engine.generate(ids, mask, config);
    forward_steps = engine.last_stats().forward_steps;
  }

  const bool equal = torch::equal(result.sequences, reference.sequences) &&
                     torch::equal(result.attention_mask, reference.attention_mask);
  if (!equal) std::cerr << "rank " << rank << ": lockstep\n" << result.sequences << "\nalone\n" << reference.sequences << "\n";
  json report = {{"equal", equal}, {"length", result.sequences.size(1)},
                 {"forward_steps", forward_steps}, {"eos", *config.eos_token_id}, {"idle_forwards", idle_forwards}};
  std::ofstream(std::filesystem::path(args.out) / ("rank" + std::to_string(rank) + ".json")) << report.dump();
  communicator->barrier();
  return equal ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("generate_worker", [&] { return run(parse(argc, argv)); });
}
