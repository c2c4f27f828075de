// One rank of the multi-process training-engine tests (tests/engine/zero_multiproc_test.cpp and the
// launcher tests start these). Trains a tiny OPT causal LM (tests/fixtures/opt-preln with 4
// layers, dropout off) with TrainingEngine on synthetic token batches that depend only on the
// step, so any world size and accumulation that covers the same global batch sees the same rows:
// for global step s, rank r's micro-step m takes rows [(r * G + m) * M, + M) of the step's batch.
// Rank 0 writes a JSON report: the per-step loss averaged over all micro-batches of all ranks,
// the engine's byte counts after the last backward and after the last step, the theoretical
// figures, and a checksum of the final parameters.
// With --checkpoint the model is loaded from that directory instead (--deferred: a partitioned
// load, DeepSpeed's zero.Init), and --inference-check also scores a fixed batch with a frozen
// partitioned copy under a ZeRO-3 inference engine, against an eager replicated copy.
// --ema keeps an engine::PartitionedEma beside a replicated EMA (DeepSpeed-Chat's moving_average
// over consolidated_parameters() after every step) and reports whether they agree bit for bit,
// whether a partitioned EMA loaded from the replicated one consolidates to it, and each rank's
// EMA bytes ("ema").
// --wide W makes the model W wide (ffn 4W) for memory probes; --bucket N sets reduce_bucket_size.
// --rss-probe measures each rank's peak resident set over the second step (forward, backward and
// optimizer step): /proc/self/clear_refs resets the high-water mark, VmHWM reads it; glibc's mmap
// threshold is fixed first so freed large tensors leave the resident set at once.
// --async saves in the background (an AsyncCheckpointWriter, waited for before the next save and
// at the end); --hang-in-write TAG --marker F makes the write of TAG create F and then stall, so
// a test can kill the ranks while that write is under way.
//
// usage: dschat_train_worker --out F [--stage S] [--micro M] [--gas G] [--steps N] [--offload]
//            [--overlap-comm] [--stop-at K] [--bf16] [--layers L] [--save-dir D] [--save-every K] [--load]
//            [--timeout-ms T] [--checkpoint DIR [--deferred] [--inference-check]] [--async]
//            [--hang-in-write TAG --marker F] [--ema] [--wide W] [--bucket N] [--rss-probe]
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <chrono>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/dist/process_group.h"
#include "dschat/engine/partitioned_ema.h"
#include "dschat/engine/training_engine.h"
#include "dschat/engine/zero_inference_engine.h"
#include "dschat/models/causal_lm.h"
#include "dschat/models/load_save.h"
#include "engine/checkpoint_testing.h"
#include "../worker_args.h"
#include "test_paths.h"  // DSCHAT_TEST_DATA_DIR

namespace {

using nlohmann::json;
using namespace dschat;

struct Args {
  std::string out;
  int stage = 0;
  int64_t micro = 2;
  int64_t gas = 1;
  int64_t steps = 20;    // the schedule's length
  int64_t stop_at = -1;  // stop after this many steps (an "interrupted" run); -1: run all
  int64_t layers = 4;
  bool offload = false;
  bool overlap_comm = false;  // zero_optimization.overlap_comm
  bool bf16 = false;
  std::string save_dir;
  int64_t save_every = 0;
  bool load = false;
  int64_t timeout_ms = 60000;
  std::string checkpoint;
  bool deferred = false;
  bool inference_check = false;
  bool async = false;
  bool ema = false;
  int64_t wide = 0;  // 0: the fixture's width
  int64_t bucket = 3000;
  bool rss_probe = false;
  std::string hang_in_write, marker;
};

Args parse(int argc, char** argv) {
  Args args;
  worker::WorkerFlags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--out")) args.out = flags.value();
    else if (flags.is("--stage")) args.stage = static_cast<int>(flags.int_value());
    else if (flags.is("--micro")) args.micro = flags.int_value();
    else if (flags.is("--gas")) args.gas = flags.int_value();
    else if (flags.is("--steps")) args.steps = flags.int_value();
    else if (flags.is("--stop-at")) args.stop_at = flags.int_value();
    else if (flags.is("--layers")) args.layers = flags.int_value();
    else if (flags.is("--offload")) args.offload = true;
    else if (flags.is("--overlap-comm")) args.overlap_comm = true;
    else if (flags.is("--bf16")) args.bf16 = true;
    else if (flags.is("--save-dir")) args.save_dir = flags.value();
    else if (flags.is("--save-every")) args.save_every = flags.int_value();
    else if (flags.is("--load")) args.load = true;
    else if (flags.is("--timeout-ms")) args.timeout_ms = flags.int_value();
    else if (flags.is("--checkpoint")) args.checkpoint = flags.value();
    else if (flags.is("--deferred")) args.deferred = true;
    else if (flags.is("--inference-check")) args.inference_check = true;
    else if (flags.is("--async")) args.async = true;
    else if (flags.is("--ema")) args.ema = true;
    else if (flags.is("--wide")) args.wide = flags.int_value();
    else if (flags.is("--bucket")) args.bucket = flags.int_value();
    else if (flags.is("--rss-probe")) args.rss_probe = true;
    else if (flags.is("--hang-in-write")) args.hang_in_write = flags.value();
    else if (flags.is("--marker")) args.marker = flags.value();
    else flags.unknown();
  }
  return args;
}

constexpr int64_t kTokens = 12;
constexpr int64_t kGlobalRows = 16;  // rows generated per step; a run uses the first M * G * W

torch::Tensor step_batch(int64_t step, int64_t vocab) {
  torch::Generator generator = at::detail::createCPUGenerator(1000 + step);
  return torch::randint(3, vocab, {kGlobalRows, kTokens}, generator, torch::kInt64);  // [rows, T]
}

torch::Tensor lm_loss(models::CausalLM& model, const torch::Tensor& ids) {
  torch::Tensor logits = model->forward(ids).to(torch::kFloat32);  // [B, T, V]
  torch::Tensor shifted = logits.narrow(1, 0, kTokens - 1).reshape({-1, logits.size(2)});
  torch::Tensor targets = ids.narrow(1, 1, kTokens - 1).reshape({-1});
  return torch::nn::functional::cross_entropy(shifted, targets);
}

// --inference-check: logits of a fixed batch from a frozen, partitioned (deferred) copy under a
// ZeRO-3 inference engine, and from an eager replicated copy; the parameter bytes the engine
// keeps once the forward's gathers are released.
json inference_check(const Args& args, const std::shared_ptr<dist::Communicator>& communicator, int64_t vocab) {
  models::LoadOptions load;
  load.dtype = args.bf16 ? torch::kBFloat16 : torch::kFloat32;
  models::CausalLM eager = models::load_causal_lm(args.checkpoint, load);
  auto deferred = std::make_shared<models::DeferredParameters>();
  load.deferred = deferred.get();
  models::CausalLM partitioned = models::load_causal_lm(args.checkpoint, load);
  for (auto& p : partitioned->parameters()) p.set_requires_grad(false);
  engine::ZeroInferenceOptions options;
  options.zero.stage = 3;
  options.zero.stage3_param_persistence_threshold = 64;
  options.zero.allgather_bucket_size = 5000;
  if (args.offload) options.zero.offload_param.device = "cpu";
  options.communicator = communicator;
  options.deferred = std::move(deferred);
  engine::ZeroInferenceEngine engine(partitioned.ptr(), std::move(options));
  const torch::Tensor ids = step_batch(99, vocab).narrow(0, 0, 4);  // [4, T]
  torch::NoGradGuard no_grad;
  const torch::Tensor expected = eager->forward(ids);  // [4, T, V]
  const torch::Tensor got = partitioned->forward(ids);  // [4, T, V]
  engine.release_gathered_parameters();
  int64_t eager_bytes = 0;
  for (const auto& p : eager->parameters()) eager_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return {{"max_abs_diff", (got - expected).abs().max().item<double>()},
          {"parameters_after_release", engine.memory_footprint().parameter_bytes},
          {"replicated_parameters", eager_bytes}};
}

json footprint_json(const engine::MemoryFootprint& bytes) {
  return {{"parameters", bytes.parameter_bytes}, {"gradients", bytes.gradient_bytes},
          {"optimizer", bytes.optimizer_bytes}, {"peak_staging", bytes.peak_staging_bytes}};
}

// A /proc/self/status figure in bytes (VmRSS, VmHWM).
int64_t status_bytes(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoll(line.substr(key.size() + 1)) * 1024;  // "  1234 kB"
  }
  throw std::runtime_error("/proc/self/status has no " + key);
}

// Resets the peak resident set to the current one (Linux >= 4.0).
void reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  DSCHAT_CHECK(clear.flush().good(), Error, "cannot write /proc/self/clear_refs");
}

int run(const Args& args) {
#ifdef __GLIBC__
  if (args.rss_probe) {
    mallopt(M_MMAP_THRESHOLD, 64 * 1024);  // fixed: large blocks are mmapped and unmapped when freed
    mallopt(M_TRIM_THRESHOLD, 64 * 1024);
  }
#endif
  auto communicator = worker::join_job(args.timeout_ms);
  const int64_t world = communicator->world_size();
  const int64_t rank = communicator->rank();
  DSCHAT_CHECK(args.micro * args.gas * world <= kGlobalRows, InvalidArgument, "global batch too large");

  core::ModelConfig config = core::load_model_config(std::string(DSCHAT_TEST_DATA_DIR) + "/opt-preln");
  config.num_hidden_layers = args.layers;
  config.dropout = 0.0;
  if (args.wide > 0) {
    config.hidden_size = config.word_embed_proj_dim = args.wide;
    config.intermediate_size = 4 * args.wide;
    config.head_dim = args.wide / config.num_attention_heads;
  }
  torch::manual_seed(rank == 0 ? 7 : 1000 + rank);  // other ranks start elsewhere: the broadcast must fix it
  std::shared_ptr<models::DeferredParameters> deferred;
  models::CausalLM model = [&] {
    if (args.checkpoint.empty()) return models::CausalLM(config);
    models::LoadOptions load;
    load.dropout = 0.0;
    if (args.deferred) {
      deferred = std::make_shared<models::DeferredParameters>();
      load.deferred = deferred.get();
    }
    return models::load_causal_lm(args.checkpoint, load);
  }();
  model->train();
  bool meta_before_engine = true;
  for (const auto& p : model->parameters()) meta_before_engine = meta_before_engine && p.is_meta();
  if (args.bf16) model->to(torch::kBFloat16);

  json ds = {{"train_micro_batch_size_per_gpu", args.micro},
             {"gradient_accumulation_steps", args.gas},
             {"train_batch_size", args.micro * args.gas * world},
             {"gradient_clipping", 1.0},
             {"steps_per_print", 0},
             {"zero_optimization",
              {{"stage", args.stage},
               {"reduce_bucket_size", args.bucket},  // small by default: several rounds per collective
               {"allgather_bucket_size", 5000},
               {"stage3_param_persistence_threshold", 64},
               {"stage3_prefetch_bucket_size", 20000}}}};
  if (args.offload) {
    ds["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
    if (args.stage == 3) ds["zero_optimization"]["offload_param"] = {{"device", "cpu"}};
  }
  if (args.overlap_comm) ds["zero_optimization"]["overlap_comm"] = true;
  if (args.bf16) ds["bf16"] = {{"enabled", true}};
  engine::TrainingEngineOptions options;
  options.config = engine::DeepSpeedConfig::parse(ds, world, "train_worker");
  options.optimizer.lr = 3e-3;
  options.optimizer.weight_decay = 0.1;
  options.optimizer.beta2 = 0.95;
  engine::LrScheduleOptions schedule;
  schedule.type = "cosine";
  schedule.num_warmup_steps = 2;
  schedule.num_training_steps = args.steps;
  options.lr_schedule = schedule;
  options.communicator = communicator;
  options.deferred = std::move(deferred);
  engine::TrainingEngine trainer(model.ptr(), options);
  const int64_t parameters_after_build = trainer.memory_footprint().parameter_bytes;

  if (!args.hang_in_write.empty()) {
    engine::testing::set_checkpoint_write_hook([&args](const std::filesystem::path& staging) {
      if (staging.filename() != ".tmp-" + args.hang_in_write) return;
      std::ofstream(args.marker) << "writing\n";
      std::this_thread::sleep_for(std::chrono::minutes(10));  // until the test kills us
    });
  }
  constexpr double kBeta = 0.9;  // a fast average: every step moves it visibly
  std::optional<engine::PartitionedEma> ema;
  std::map<std::string, torch::Tensor> replicated_ema;  // name -> full value
  if (args.ema) {
    ema.emplace(trainer, torch::kCPU);
    replicated_ema = trainer.consolidated_parameters();
  }
  engine::AsyncCheckpointWriter writer;
  int64_t first_step = 0;
  if (args.load) first_step = trainer.load_checkpoint(args.save_dir)["next_step"].get<int64_t>();
  json losses = json::array();
  json after_backward;
  const int64_t last_step = args.stop_at >= 0 ? args.stop_at : args.steps;
  int64_t rss_before = -1, rss_peak = -1;
  for (int64_t step = first_step; step < last_step; ++step) {
    const bool probed = args.rss_probe && step == first_step + 1;
    if (probed) {
      reset_peak_rss();
      rss_before = status_bytes("VmRSS");
    }
    const torch::Tensor rows = step_batch(step, config.vocab_size);  // [16, T]
    double loss_sum = 0.0;
    for (int64_t m = 0; m < args.gas; ++m) {
      torch::Tensor ids = rows.narrow(0, (rank * args.gas + m) * args.micro, args.micro);  // [M, T]
      torch::Tensor loss = lm_loss(model, ids);
      loss_sum += loss.item<double>();
      trainer.backward(loss);
      if (m + 1 == args.gas) after_backward = footprint_json(trainer.memory_footprint());
      trainer.step();
    }
    if (probed) rss_peak = status_bytes("VmHWM");
    if (args.ema) {
      ema->update(kBeta);
      torch::NoGradGuard no_grad;
      for (auto& [name, value] : trainer.consolidated_parameters()) {
        replicated_ema[name] = torch::lerp(value.to(torch::kCPU), replicated_ema.at(name).to(torch::kCPU), kBeta);
      }
    }
    torch::Tensor total = torch::full({1}, loss_sum, torch::kFloat64);  // [1]
    communicator->all_reduce(total, dist::ReduceOp::Sum);
    losses.push_back(total.item<double>() / static_cast<double>(args.gas * world));
    if (args.save_every > 0 && (step + 1) % args.save_every == 0) {
      if (args.async) engine::wait_for_checkpoint_writes(writer, communicator.get());
      trainer.save_checkpoint(args.save_dir, "", {{"next_step", step + 1}}, args.async ? &writer : nullptr);
    }
  }
  engine::wait_for_checkpoint_writes(writer, communicator.get());
  const json after_step = footprint_json(trainer.memory_footprint());
  double checksum = 0.0;
  int64_t num_params = 0;
  for (const auto& [name, value] : trainer.consolidated_parameters()) {
    checksum += value.to(torch::kFloat64).abs().sum().item<double>();
    num_params += value.numel();
  }

  json ema_report;
  if (args.ema) {
    auto agrees = [&](const std::map<std::string, torch::Tensor>& got) {
      if (got.size() != replicated_ema.size()) return false;
      for (const auto& [name, value] : replicated_ema) {
        if (!torch::equal(got.at(name), value.to(torch::kCPU))) return false;
      }
      return true;
    };
    const bool equal = agrees(ema->consolidated());
    engine::PartitionedEma loaded(trainer, torch::kCPU);
    loaded.load(replicated_ema);
    const bool roundtrip = agrees(loaded.consolidated());
    int64_t full_bytes = 0;
    for (const auto& [name, value] : replicated_ema) full_bytes += value.numel() * value.element_size();
    torch::Tensor flags = torch::tensor({equal ? int64_t{1} : 0, roundtrip ? int64_t{1} : 0}, torch::kInt64);  // [2]
    communicator->all_reduce(flags, dist::ReduceOp::Sum);
    torch::Tensor bytes = torch::tensor({ema->bytes()}, torch::kInt64);  // [1]
    torch::Tensor all_bytes = torch::empty({world}, torch::kInt64);     // [world]
    communicator->all_gather_into(all_bytes, bytes);
    ema_report = {{"equal_on_all_ranks", flags[0].item<int64_t>() == world},
                  {"load_roundtrip_on_all_ranks", flags[1].item<int64_t>() == world},
                  {"bytes_per_rank", std::vector<int64_t>(all_bytes.data_ptr<int64_t>(), all_bytes.data_ptr<int64_t>() + world)},
                  {"full_bytes", full_bytes}};
  }

  // Every rank's byte counts, gathered to rank 0.
  const json inference = args.inference_check ? inference_check(args, communicator, config.vocab_size) : json();
  const int64_t inference_bytes = args.inference_check ? inference["parameters_after_release"].get<int64_t>() : 0;
  constexpr int64_t kFigures = 8;
  torch::Tensor mine = torch::tensor({after_backward["gradients"].get<int64_t>(), after_step["parameters"].get<int64_t>(),
                                      after_step["optimizer"].get<int64_t>(), parameters_after_build,
                                      inference_bytes, after_backward["peak_staging"].get<int64_t>(), rss_before,
                                      rss_peak},
                                     torch::kInt64);  // [kFigures]
  torch::Tensor all = torch::empty({world * kFigures}, torch::kInt64);  // [world * kFigures]
  communicator->all_gather_into(all, mine);
  if (rank == 0) {
    json per_rank = json::array();
    for (int64_t r = 0; r < world; ++r) {
      per_rank.push_back({{"gradients_after_backward", all[r * kFigures].item<int64_t>()},
                          {"parameters_after_step", all[r * kFigures + 1].item<int64_t>()},
                          {"optimizer_after_step", all[r * kFigures + 2].item<int64_t>()},
                          {"parameters_after_build", all[r * kFigures + 3].item<int64_t>()},
                          {"inference_parameters_after_release", all[r * kFigures + 4].item<int64_t>()},
                          {"peak_staging_after_backward", all[r * kFigures + 5].item<int64_t>()},
                          {"rss_before_probed_step", all[r * kFigures + 6].item<int64_t>()},
                          {"rss_peak_in_probed_step", all[r * kFigures + 7].item<int64_t>()}});
    }
    const engine::MemoryFootprint theory =
        engine::theoretical_footprint(args.stage, num_params, args.bf16 ? 2 : 4, world);
    json report = {{"losses", losses}, {"checksum", checksum}, {"num_params", num_params},
                   {"per_rank", per_rank}, {"theoretical", footprint_json(theory)},
                   {"global_steps", trainer.global_steps()}, {"meta_before_engine", meta_before_engine},
                   {"inference", inference}, {"ema", ema_report}};
    std::ofstream(args.out) << report.dump(1);
  }
  communicator->barrier();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dschat::worker::run_worker("train_worker", [&] { return run(parse(argc, argv)); });
}
