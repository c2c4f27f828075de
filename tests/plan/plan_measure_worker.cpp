// One rank of tests/plan/plan_measure_multiproc_test.cpp: plans step 1 (SFT) of a model for this
// world size with `dschat plan`'s planner, then trains it for two optimizer steps the way the SFT
// trainer builds it (random weights, fp32, on the CPU) and measures what the engine holds
// (memory_footprint() after the second window's backward, before its step) and the peak resident
// memory of training (VmHWM since the engine was built, less the RSS before the model existed).
// Writes {"planned": {...}, "measured": {...}} to <out>.rank<r>.json.
//
// usage: dschat_plan_measure_worker --out F --model M --stage S [--offload] [--lora-dim N]
//        [--checkpointing] [--batch B] [--seq T] [--gas G] [--cli-allocator] [--timeout-ms T]
#include <malloc.h>

#include <fstream>
#include <sstream>
#include <string>

#include "dschat/core/error.h"
#include "dschat/core/host_memory.h"
#include "dschat/dist/process_group.h"
#include "dschat/engine/zero_groups.h"
#include "dschat/plan/step_plan.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "dschat/rlhf/setup/step_setup.h"
#include "../worker_args.h"
#include "plan_test_setup.h"

namespace {

using namespace dschat;

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t status_bytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(field.size() + 1));
    int64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  DSCHAT_THROW(Error, "/proc/self/status has no ", field);
}

// Resets VmHWM to the current RSS (Linux >= 4.0).
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct Case {
  std::string model;
  int stage = 0;
  bool offload = false;
  int64_t lora_dim = 0;
  bool checkpointing = false;
  int64_t batch = 4, seq = 32, gas = 2;
  bool cli_allocator = false;  // the dschat CLI's malloc settings (core::retain_freed_host_memory)
};

nlohmann::json bytes_json(const engine::MemoryFootprint& f) {
  return {{"parameters", f.parameter_bytes}, {"gradients", f.gradient_bytes}, {"optimizer", f.optimizer_bytes}};
}

int run(const Case& c, const std::string& out, int64_t timeout_ms) {
  if (c.cli_allocator) {
    // As `dschat train` runs: tensors from core::HostBlockCache, which keeps freed blocks for
    // reuse (up to 1/8 above the live peak; the plan counts it).
    core::retain_freed_host_memory();
  } else {
    // Freed tensors go back to the OS at once, so RSS follows what is live.
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  }
  rlhf::StepContext context;
  context.communicator = worker::join_job(timeout_ms);
  context.random_init = true;
  const int64_t rank = context.communicator->rank(), world = context.communicator->world_size();

  rlhf::PipelineConfig config;
  config.steps = {1};
  rlhf::SftConfig& sft = config.step1;
  sft.model_name_or_path = c.model;
  sft.common.device = "cpu";
  sft.common.dtype = torch::kFloat32;
  sft.common.offload = c.offload;
  sft.common.gradient_accumulation_steps = c.gas;
  sft.common.only_optimize_lora = c.lora_dim > 0;
  sft.model.zero_stage = c.stage;
  sft.model.gradient_checkpointing = c.checkpointing;
  sft.model.lora_dim = c.lora_dim;
  sft.model.dropout = 0.0;
  sft.per_device_train_batch_size = sft.per_device_eval_batch_size = c.batch;
  sft.max_seq_len = c.seq;

  plan::PlanOptions options;
  options.hardware = plan::cpu_hardware(world);
  options.margin = 0;
  options.reserved_gib = 0;
  options.count_rows = false;
  options.host_block_cache = c.cli_allocator;
  const plan::StepPlan planned = plan::plan_step(config, 1, options, -1);

  const int64_t baseline = status_bytes("VmRSS");
  const torch::Device device = torch::kCPU;
  models::LoadOptions load = rlhf::step_load_options(sft.common, sft.model, context, device);
  std::shared_ptr<models::DeferredParameters> deferred = rlhf::defer_load_at_stage3(load, c.stage);
  models::CausalLM model = models::load_causal_lm(c.model, load);
  model->backbone().set_gradient_checkpointing(c.checkpointing);
  rlhf::apply_lora(*model, sft.model, sft.common.only_optimize_lora);
  model->train();
  auto engine = rlhf::make_training_engine(model.ptr(), sft.common, sft.model, c.batch, 2, context, "plan worker",
                                           std::move(deferred));
  reset_peak();
  torch::manual_seed(1234 + rank);
  const int64_t vocab = model->config().vocab_size;
  engine::MemoryFootprint at_step;
  for (int64_t micro = 0; micro < 2 * c.gas; ++micro) {
    const torch::Tensor ids = torch::randint(vocab, {c.batch, c.seq}, torch::kLong);  // [B, T]
    const torch::Tensor mask = torch::ones({c.batch, c.seq}, torch::kLong);          // [B, T]
    const torch::Tensor logits = model->forward(ids, mask);                           // [B, T, V]
    engine->backward(rlhf::causal_lm_loss(logits, ids));
    if (micro == 2 * c.gas - 1) {
      // Stage 3's layers still gathered after backward are a transient of the pass (the plan
      // counts them there); the step releases them first anyway.
      engine->release_gathered_parameters();
      at_step = engine->memory_footprint();
    }
    engine->step();
  }
  const int64_t peak = status_bytes("VmHWM") - baseline;

  // This rank's planned bytes (the plan's table shows rank 0's).
  const plan::ModelSetup setup = testing::trained_fp32_setup(model->config(), c.stage, c.lora_dim);
  const std::vector<engine::ParameterSpec> specs = plan::parameter_specs(setup);
  const engine::MemoryFootprint planned_bytes = plan::zero_footprint(setup, specs, world, rank);

  nlohmann::json report;
  report["planned"] = bytes_json(planned_bytes);
  report["planned"]["peak"] = planned.peak_bytes;
  report["planned"]["peak_phase"] = planned.peak_phase;
  for (const plan::MemoryItem& item : planned.items) {
    report["planned"]["items"].push_back({{"what", item.what}, {"phase", item.phase}, {"bytes", item.device_bytes + item.host_bytes}});
  }
  report["measured"] = bytes_json(at_step);
  report["measured"]["peak"] = peak;
  std::ofstream(out + ".rank" + std::to_string(rank) + ".json") << report.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("plan_measure_worker", [&] {
    Case c;
    std::string out;
    int64_t timeout_ms = 120000;
    dschat::worker::WorkerFlags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--out")) out = flags.value();
      else if (flags.is("--model")) c.model = flags.value();
      else if (flags.is("--stage")) c.stage = static_cast<int>(flags.int_value());
      else if (flags.is("--offload")) c.offload = true;
      else if (flags.is("--lora-dim")) c.lora_dim = flags.int_value();
      else if (flags.is("--checkpointing")) c.checkpointing = true;
      else if (flags.is("--batch")) c.batch = flags.int_value();
      else if (flags.is("--seq")) c.seq = flags.int_value();
      else if (flags.is("--gas")) c.gas = flags.int_value();
      else if (flags.is("--cli-allocator")) c.cli_allocator = true;
      else if (flags.is("--timeout-ms")) timeout_ms = flags.int_value();
      else flags.unknown();
    }
    DSCHAT_CHECK(!out.empty() && !c.model.empty(), InvalidArgument, "--out and --model are required");
    return run(c, out, timeout_ms);
  });
}
