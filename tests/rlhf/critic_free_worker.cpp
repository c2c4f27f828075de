// One rank of tests/rlhf/critic_free_multiproc_test.cpp: computes the critic-free step's
// advantages (rlhf::compute_advantages, collective) for each estimator on this rank's answers
// (tests/rlhf/critic_free_batches.h, at this rank's own answer width) and writes them as
// {"<estimator>": [[row values]...]} to <out>.rank<r>.json.
//
// usage: dschat_critic_free_worker --out F [--timeout-ms T]
#include <fstream>
#include <string>

#include "critic_free_batches.h"
#include "dschat/core/error.h"
#include "dschat/dist/process_group.h"
#include "../worker_args.h"

namespace {

using namespace dschat;

int run(const std::string& out, int64_t timeout_ms) {
  rlhf::StepContext context;
  context.communicator = worker::join_job(timeout_ms);
  const int64_t rank = context.communicator->rank();
  nlohmann::json result = nlohmann::json::object();
  for (const std::string& estimator : testing::estimators()) {
    rlhf::CriticFreeBatch batch = testing::rank_answers(rank);
    rlhf::compute_advantages(testing::estimator_config(estimator), testing::source_weights(), batch, context);
    const torch::Tensor a = batch.advantages.to(torch::kFloat64).reshape({batch.exp.rows(), -1}).contiguous();  // [N, 1 or T]
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t i = 0; i < a.size(0); ++i) {
      rows.push_back(std::vector<double>(a[i].data_ptr<double>(), a[i].data_ptr<double>() + a.size(1)));
    }
    result[estimator] = rows;
  }
  std::ofstream(out + ".rank" + std::to_string(rank) + ".json") << result.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("critic_free_worker", [&] {
    std::string out;
    int64_t timeout_ms = 60000;
    dschat::worker::WorkerFlags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--out")) out = flags.value();
      else if (flags.is("--timeout-ms")) timeout_ms = flags.int_value();
      else flags.unknown();
    }
    DSCHAT_CHECK(!out.empty(), InvalidArgument, "--out is required");
    return run(out, timeout_ms);
  });
}
