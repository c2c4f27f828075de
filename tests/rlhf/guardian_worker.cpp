// One rank of tests/rlhf/guardian_multiproc_test.cpp: tests/rlhf/guardian_toy_run.h's guarded run
// over the job's ranks at a ZeRO stage, optionally with a NaN gradient in rank 0's micro-batch 2
// of epoch 1 (optimizer step 9 of 12). Writes <out>.rank<r>.json: the run's global steps, the
// guardian's rollback rows (rank 0's metrics), whether it stopped, and per parameter the sum and
// the sum of squares of the consolidated values (float64), which a test compares across runs.
//
// usage: dschat_guardian_worker --out F --dir D [--stage S] [--fault] [--timeout-ms T]
#include <fstream>
#include <string>

#include "guardian_toy_run.h"
#include "../worker_args.h"

namespace {

using namespace dschat;

int run(const std::string& out, const std::string& dir, int stage, bool fault, int64_t timeout_ms) {
  dschat::testing::ToyRunOptions o;
  o.communicator = worker::join_job(timeout_ms);
  o.dir = dir;
  o.stage = stage;
  o.epochs = 2;
  o.guardian = dschat::testing::exact_rollback_guardian("retry");
  if (fault) o.fault = {"nan_grad", /*epoch=*/1, /*batch=*/2};
  const dschat::testing::ToyRunResult r = dschat::testing::run_toy_guarded(o);
  nlohmann::json report = {{"global_steps", r.global_steps}, {"stopped", r.stopped}, {"faults", r.faults_fired}};
  for (const auto& [name, value] : r.parameters) {
    const torch::Tensor v = value.to(torch::kFloat64);  // [...]
    report["parameters"][name] = {v.sum().item<double>(), (v * v).sum().item<double>()};
  }
  const int64_t rank = o.communicator->rank();
  if (rank == 0) {
    for (const monitor::MetricsRow& row : dschat::testing::guardian_rows(o.dir)) {
      if (row.values.count("rollback_to")) report["rollback_to"].push_back(row.values.at("rollback_to"));
    }
  }
  std::ofstream(out + ".rank" + std::to_string(rank) + ".json") << report.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("guardian_worker", [&] {
    std::string out, dir;
    int stage = 0;
    bool fault = false;
    int64_t timeout_ms = 60000;
    dschat::worker::WorkerFlags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--out")) out = flags.value();
      else if (flags.is("--dir")) dir = flags.value();
      else if (flags.is("--stage")) stage = static_cast<int>(flags.int_value());
      else if (flags.is("--fault")) fault = true;
      else if (flags.is("--timeout-ms")) timeout_ms = flags.int_value();
      else flags.unknown();
    }
    DSCHAT_CHECK(!out.empty() && !dir.empty(), InvalidArgument, "--out and --dir are required");
    return run(out, dir, stage, fault, timeout_ms);
  });
}
