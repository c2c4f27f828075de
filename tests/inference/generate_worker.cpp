// One rank of the lockstep-generation tests (tests/inference/generate_multiproc_test.cpp): every
// rank loads the same tiny model and generates its own prompts through an InferenceEngine in
// lockstep over Gloo. Rank 0 takes the fixture's row 0, rank 1 its (left-padded) rows 1 and 2.
// EOS is chosen so that rank 0 finishes after a couple of tokens while rank 1 runs all
// --new-tokens steps: the first of row 0's greedy tokens (from the second on) that rows 1 and 2
// never emit. Each rank then generates the same prompts alone (no lockstep) and compares.
// Writes <out>/rank<r>.json: {"equal", "length", "forward_steps", "eos"}; exits 3 when the
// lockstep ids differ from the ones generated alone, 1 on an error (message on stderr).
//
// usage: dschat_generate_worker --model DIR --out DIR [--new-tokens N] [--timeout-ms T]
//            [--mismatch]        rank r asks for N + r new tokens (a lockstep error)
//            [--overflow-rank R] rank R's engine is too small for its prompt (a local error)
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"
#include "dschat/inference/inference_engine.h"
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

  inference::InferenceEngineOptions options = engine_options(prompt + args.new_tokens + 1);
  if (rank == args.overflow_rank) options.max_out_tokens = prompt;
  options.lockstep = communicator;
  inference::InferenceEngine engine(model, options);
  if (args.mismatch) config.max_new_tokens += rank;
  const inference::GenerationResult result = engine.generate(ids, mask, config);

  const bool equal = torch::equal(result.sequences, reference.sequences) &&
                     torch::equal(result.attention_mask, reference.attention_mask);
  if (!equal) std::cerr << "rank " << rank << ": lockstep\n" << result.sequences << "\nalone\n" << reference.sequences << "\n";
  json report = {{"equal", equal}, {"length", result.sequences.size(1)},
                 {"forward_steps", engine.last_stats().forward_steps}, {"eos", *config.eos_token_id}};
  std::ofstream(std::filesystem::path(args.out) / ("rank" + std::to_string(rank) + ".json")) << report.dump();
  communicator->barrier();
  return equal ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("generate_worker", [&] { return run(parse(argc, argv)); });
}
