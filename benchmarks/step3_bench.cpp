// Step-3 (PPO) throughput: dschat's trainer pieces against the same iteration written with
// transformers + PyTorch (benchmarks/step3_bench_peer.py), on the same random models and prompts,
// in one command. DeepSpeed-Chat's benchmark setting (BenckmarkSetting.md): prompt and answer of
// fixed lengths (min_new_tokens = max_new_tokens), generation batch = training batch,
// ppo_epochs = generation_batches = 1. One iteration = generate (actor, greedy, KV cache) ->
// experience (actor, reference, reward and critic forwards) -> actor PPO step -> critic step.
//
// The binary saves a random actor (CausalLM) and critic (value model) of the given presets (once
// per --work-dir: a stamp file names the shapes and seed), then alternates --rounds times: --iters
// timed iterations here (after --warmup), then the peer in a fresh process doing the same.
// Reports sequences/s, the generation / experience / training split, generation tokens/s,
// DeepSpeed-Chat's effective TFLOPs (perf.py's print_throughput_step3: generation + actor and
// critic training FLOPs, with its gradient-checkpointing and LoRA factors, over the iteration),
// the training phase's TFLOP/s as a fraction of --peak-tflops, and the device's peak memory.
// --profile adds one untimed iteration under LibTorch's profiler (kernel_profile.h): per phase,
// the largest kernels and the device's idle fraction.
//
// --deployment single_gpu [--preset-actor opt-1.3b] takes step 3's options from that compiled-in
// preset (batch sizes, lengths, LoRA, gradient checkpointing, hybrid engine); --batch, --prompt and
// --answer, when given, override it, and gradient_accumulation_steps is 1 on both sides so that
// every iteration ends in an optimizer step of each model. The peer mirrors dtype, LoRA (DS-Chat's
// LinearLayer_LoRA) and gradient checkpointing. --no-peer times dschat alone and builds its models
// from the presets directly (no checkpoint written: how the largest models are tried).
//
//   dschat_step3_bench [--actor opt-125m] [--critic opt-125m] [--deployment D] [--batch 4]
//       [--prompt 32] [--answer 32] [--dtype fp32] [--device cpu] [--set KEY=JSON ...] [--cuda-graph] [--no-peer]
//       [--threads 2] [--rounds 2] [--iters 2] [--warmup 1] [--out F]
// On a GPU (--device cuda) both sides time after synchronising the device; the generation time
// dschat reports is taken inside make_experience without a sync, so only the iteration and the
// experience + generation sum are exact there.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "bench_util.h"
#include "bench_device.h"
#include "kernel_profile.h"
#include "dschat/core/host_memory.h"
#include "dschat/core/error.h"
#include "dschat/core/json_file.h"
#include "dschat/core/model_config.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/config/pipeline_config.h"
#include "io/atomic_file.h"
#include "dschat/rlhf/setup/experience.h"
#include "dschat/rlhf/loop/ppo_step.h"
#include "dschat/monitor/throughput.h"

namespace {

using dschat::bench::median;
using dschat::bench::run_process;

using nlohmann::json;
using namespace dschat;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string actor = "opt-125m", critic = "opt-125m", dtype = "fp32", device = "cpu", out, work_dir;
  std::string deployment, preset_actor;  // step 3's options from a compiled-in preset
  std::vector<std::string> set;          // KEY=JSON overrides of the step-3 block, applied last
  int64_t batch = 4, prompt = 32, answer = 32, threads = 2, rounds = 2, iters = 2, warmup = 1, seed = 1234;
  bool batch_given = false, prompt_given = false, answer_given = false;
  bool cuda_graph = false, no_peer = false, profile = false;
  double peak_tflops = 790.0;  // H200 dense bf16
  std::string python = DSCHAT_BENCH_PYTHON;
  std::string peer = DSCHAT_BENCH_PEER;
};

// The step-3 block both sides run: the preset's (or the bench's own defaults), with the models,
// dtype and device of this run and the lengths given on the command line.
nlohmann::json bench_config(const Options& o, const fs::path& work) {
  const bool preset = !o.deployment.empty();
  nlohmann::json cfg = {{"enable_hybrid_engine", true}};
  if (preset) {
    cfg = rlhf::preset_config(o.deployment, o.preset_actor.empty() ? o.actor : o.preset_actor, "opt-350m")["step3"];
  }
  if (!preset || o.batch_given) {
    cfg["per_device_generation_batch_size"] = o.batch;
    cfg["per_device_training_batch_size"] = o.batch;
  }
  if (!preset || o.prompt_given) cfg["max_prompt_seq_len"] = o.prompt;
  if (!preset || o.answer_given) cfg["max_answer_seq_len"] = o.answer;
  cfg["actor_model_name_or_path"] = o.no_peer ? o.actor : (work / "actor").string();
  cfg["critic_model_name_or_path"] = o.no_peer ? o.critic : (work / "critic").string();
  cfg["dtype"] = o.dtype;
  cfg["device"] = o.device;
  cfg["min_answer_tokens"] = 1;
  cfg["num_warmup_steps"] = 0;
  cfg["gradient_accumulation_steps"] = 1;
  cfg["enable_cuda_graph"] = o.cuda_graph;
  for (const std::string& item : o.set) {
    const size_t eq = item.find('=');
    DSCHAT_CHECK(eq != std::string::npos && eq > 0, InvalidArgument, "--set expects KEY=JSON, got '", item, "'");
    cfg[item.substr(0, eq)] = core::parse_json_text(item.substr(eq + 1), "--set " + item.substr(0, eq));
  }
  return cfg;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}


// Per iteration: {generate, experience, train} seconds, and the device's peak memory.
json dschat_round(const rlhf::PpoConfig& config, const Options& o) {
  rlhf::StepContext context;
  context.random_init = o.no_peer;  // --no-peer: the presets' shapes, no checkpoint
  rlhf::RlhfModels models = rlhf::build_rlhf_models(config, 1000, 1, context);
  const int64_t batch = config.per_device_generation_batch_size;
  const int64_t prompt = config.max_prompt_seq_len, answer = config.max_answer_seq_len;
  const int64_t vocab = models.actor->actor()->config().vocab_size;
  const int64_t pad = models.actor->actor()->config().pad_token_id.value_or(1);
  torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
  const torch::Device device = models.actor->actor()->parameters().front().device();
  const torch::Tensor prompts =
      torch::randint(3, vocab, {batch, prompt}, generator, torch::kInt64).to(device);  // [B, P]
  const torch::Tensor mask = torch::ones_like(prompts);                                                    // [B, P]
  core::GenerationConfig generation = rlhf::experience_generation_config(config, pad, pad, 1);
  generation.min_new_tokens = answer;  // exactly `answer` tokens, as the benchmark setting
  json gen = json::array(), exp_s = json::array(), train = json::array();
  bench::reset_peak_device_memory(device);
  for (int64_t i = 0; i < o.warmup + o.iters; ++i) {
    bench::synchronize(device);
    auto start = Clock::now();
    std::optional<rlhf::Experience> exp = rlhf::make_experience(models, prompts, mask, generation, pad, 1);
    bench::synchronize(device);
    const double experience_total = seconds_since(start);
    DSCHAT_CHECK(exp.has_value() && exp->rows() == batch, Error, "the benchmark lost rows to the answer filter");
    start = Clock::now();
    rlhf::train_rlhf(models, *exp, config.constants, false, false);
    bench::synchronize(device);
    const double train_seconds = seconds_since(start);
    if (i < o.warmup) continue;
    gen.push_back(exp->generate_seconds);
    exp_s.push_back(experience_total - exp->generate_seconds);
    train.push_back(train_seconds);
  }
  json out = {{"generate", gen}, {"experience", exp_s}, {"train", train},
              {"peak_device_bytes", bench::peak_device_memory(device)}};
  if (o.profile) {  // one more, untimed iteration under the profiler, phase by phase
    bench::KernelProfile experience_profile(device);
    std::optional<rlhf::Experience> exp = rlhf::make_experience(models, prompts, mask, generation, pad, 1);
    out["profile"]["generate_and_experience"] = experience_profile.finish(20);
    DSCHAT_CHECK(exp.has_value(), Error, "the benchmark lost rows to the answer filter");
    bench::KernelProfile train_profile(device);
    rlhf::train_rlhf(models, *exp, config.constants, false, false);
    out["profile"]["train"] = train_profile.finish(20);
  }
  return out;
}

// Random actor and critic checkpoints for both sides, written once per work dir: a stamp names
// what is there (a 1.3B actor is 5 GB in fp32; the gpu_check rows share one directory).
void save_models(const Options& o, const fs::path& work) {
  const json stamp = {{"actor", o.actor}, {"critic", o.critic}, {"seed", o.seed}};
  const fs::path stamp_file = work / "models.json";
  if (fs::exists(stamp_file)) {
    std::ifstream in(stamp_file);
    if (json::parse(in, nullptr, false) == stamp) return;
  }
  fs::remove(stamp_file);
  models::LoadOptions random;
  random.random_init = true;
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  auto actor = models::load_causal_lm(o.actor, random);
  models::save_causal_lm(actor, work / "actor");
  torch::manual_seed(static_cast<uint64_t>(o.seed) + 1);
  auto critic = models::load_value_model(o.critic, random);
  models::save_value_model(critic, work / "critic");
  std::ofstream(stamp_file) << stamp.dump();
}

// perf.py's print_throughput_step3 for one iteration: generation = the actor's forward FLOPs
// (factor 1) over prompt + answer; training = actor and critic with their checkpointing/LoRA factors.
struct Step3Flops {
  double generation = 0, training = 0;
  double total() const { return generation + training; }
};

Step3Flops step3_flops(const rlhf::PpoConfig& config, const core::ModelConfig& actor, const core::ModelConfig& critic) {
  const int64_t batch = config.per_device_generation_batch_size;
  const int64_t seq = config.max_prompt_seq_len + config.max_answer_seq_len;
  Step3Flops f;
  f.generation = monitor::training_flops(actor, batch, seq, false, 0) / 3.0;
  f.training = monitor::training_flops(actor, batch, seq, config.actor.gradient_checkpointing, config.actor.lora_dim) +
               monitor::training_flops(critic, batch, seq, config.critic.gradient_checkpointing, config.critic.lora_dim);
  return f;
}

struct Timing {
  double gen = 0, exp = 0, train = 0;
  double total() const { return gen + exp + train; }
};

void print_row(const char* name, const Timing& t, const rlhf::PpoConfig& config, const Step3Flops& flops,
               double peak_tflops, double peak_gib) {
  const double batch = static_cast<double>(config.per_device_generation_batch_size);
  const double train_tflops = flops.training / t.train / 1e12;
  char peak[32] = "-";  // the peer's peak is not measured
  if (peak_gib >= 0) std::snprintf(peak, sizeof peak, "%.1f", peak_gib);
  std::printf("| %s | %.2f | %.3f | %.3f | %.3f | %.3f | %.1f | %.2f | %.1f (%.1f%%) | %s |\n", name,
              batch / t.total(), t.total(), t.gen, t.exp, t.train,
              batch * static_cast<double>(config.max_answer_seq_len) / t.gen, flops.total() / t.total() / 1e12,
              train_tflops, 100.0 * train_tflops / peak_tflops, peak);
}

Timing medians(const std::vector<double> (&parts)[3]) {
  return {median(parts[0]), median(parts[1]), median(parts[2])};
}

std::vector<std::string> peer_argv(const Options& o, const rlhf::PpoConfig& config, const fs::path& work,
                                   const fs::path& out) {
  auto str = [](auto v) { return std::to_string(v); };
  return {o.python, o.peer, "--work-dir", work.string(), "--out", out.string(),
          "--batch", str(config.per_device_generation_batch_size), "--prompt", str(config.max_prompt_seq_len),
          "--answer", str(config.max_answer_seq_len), "--threads", str(o.threads), "--iters", str(o.iters),
          "--warmup", str(o.warmup), "--seed", str(o.seed), "--device", o.device, "--dtype", o.dtype,
          "--actor-lora-dim", str(config.actor.lora_dim), "--actor-lora-module-name", config.actor.lora_module_name,
          "--critic-lora-dim", str(config.critic.lora_dim), "--critic-lora-module-name", config.critic.lora_module_name,
          "--actor-gradient-checkpointing", str(config.actor.gradient_checkpointing ? 1 : 0),
          "--critic-gradient-checkpointing", str(config.critic.gradient_checkpointing ? 1 : 0)};
}

int run(const Options& o) {
  at::set_num_threads(static_cast<int>(o.threads));
  fs::path work = o.work_dir;
  if (work.empty()) {
    std::string pattern = (fs::temp_directory_path() / "dschat_step3_bench_XXXXXX").string();
    DSCHAT_CHECK(::mkdtemp(pattern.data()) != nullptr, IoError, "mkdtemp failed");
    work = pattern;
  }
  fs::create_directories(work);
  const rlhf::PpoConfig config = rlhf::parse_ppo_config(bench_config(o, work), "step3 bench");
  if (!o.no_peer) save_models(o, work);
  std::cout << "actor " << o.actor << ", critic/reward " << o.critic << " (random, " << o.dtype << ", " << o.device
            << (o.deployment.empty() ? "" : ", " + o.deployment + " preset") << "), batch "
            << config.per_device_generation_batch_size << ", prompt " << config.max_prompt_seq_len << ", answer "
            << config.max_answer_seq_len << ", actor LoRA " << config.actor.lora_dim << ", actor gradient checkpointing "
            << config.actor.gradient_checkpointing << ", hybrid engine " << config.enable_hybrid_engine
            << ", CUDA-graph decode " << config.enable_cuda_graph << ", threads " << o.threads << "\n";
  std::vector<double> ours[3], theirs[3];
  double peak_bytes = -1;
  json profile;  // the last round's, with --profile
  const char* parts[3] = {"generate", "experience", "train"};
  for (int64_t round = 0; round < o.rounds; ++round) {
    std::cout << "round " << round + 1 << "/" << o.rounds << "\n";
    const json mine = dschat_round(config, o);
    peak_bytes = std::max(peak_bytes, mine["peak_device_bytes"].get<double>());
    if (mine.contains("profile")) profile = mine["profile"];
    for (int p = 0; p < 3; ++p) {
      for (double s : mine[parts[p]]) ours[p].push_back(s);
    }
    if (o.no_peer) continue;
    const fs::path peer_out = work / "peer.json";
    DSCHAT_CHECK(run_process(peer_argv(o, config, work, peer_out)) == 0, Error, "the transformers peer failed");
    std::ifstream in(peer_out);
    const json peer = json::parse(in);
    for (int p = 0; p < 3; ++p) {
      for (double s : peer[parts[p]]) theirs[p].push_back(s);
    }
  }
  // The shapes trained: the presets' with --no-peer, else the checkpoints' the peer read too.
  auto shape = [&](const std::string& preset, const std::string& saved) {
    return o.no_peer ? core::model_preset(preset).value() : core::load_model_config((work / saved).string());
  };
  const Step3Flops flops = step3_flops(config, shape(o.actor, "actor"), shape(o.critic, "critic"));
  const double batch = static_cast<double>(config.per_device_generation_batch_size);
  std::cout << "\n| implementation | seqs/s | iteration (s) | generate (s) | experience (s) | train (s) | gen tokens/s "
               "| effective TFLOPs | train TFLOP/s (of " << o.peak_tflops << ") | peak GiB |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n";
  const Timing mine = medians(ours);
  print_row("dschat", mine, config, flops, o.peak_tflops, peak_bytes < 0 ? -1.0 : peak_bytes / (1 << 30));
  json report = {{"dschat_seqs_per_s", batch / mine.total()},
                 {"dschat_effective_tflops", flops.total() / mine.total() / 1e12},
                 {"dschat_train_tflops", flops.training / mine.train / 1e12},
                 {"dschat_generate_tokens_per_s", batch * static_cast<double>(config.max_answer_seq_len) / mine.gen},
                 {"dschat_peak_device_bytes", peak_bytes},
                 {"batch", config.per_device_generation_batch_size},
                 {"prompt", config.max_prompt_seq_len},
                 {"answer", config.max_answer_seq_len},
                 {"actor_lora_dim", config.actor.lora_dim},
                 {"actor_gradient_checkpointing", config.actor.gradient_checkpointing},
                 {"cuda_graph", config.enable_cuda_graph}};
  for (int p = 0; p < 3; ++p) report[std::string("dschat_") + parts[p]] = ours[p];
  if (!o.no_peer) {
    const Timing peer = medians(theirs);
    print_row("transformers + PyTorch", peer, config, flops, o.peak_tflops, -1.0);
    std::printf("\ndschat / transformers sequences/s: %.2f (generate %.2f, experience %.2f, train %.2f)\n",
                peer.total() / mine.total(), peer.gen / mine.gen, peer.exp / mine.exp, peer.train / mine.train);
    report["ratio"] = peer.total() / mine.total();
    report["transformers_seqs_per_s"] = batch / peer.total();
    for (int p = 0; p < 3; ++p) report[std::string("transformers_") + parts[p]] = theirs[p];
  }
  if (!profile.is_null()) {
    for (const auto& [phase, summary] : profile.items()) bench::print_profile(phase, summary);
    report["dschat_profile"] = profile;
  }
  if (!o.out.empty()) std::ofstream(o.out) << report.dump(1);
  if (o.work_dir.empty()) io::remove_directory_tree(work);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dschat::core::retain_freed_host_memory();  // as the dschat CLI runs
  CLI::App app{"dschat step-3 (PPO) benchmark against transformers + PyTorch"};
  Options o;
  app.add_option("--actor", o.actor, "Actor / reference shape (a preset), random weights")->capture_default_str();
  app.add_option("--critic", o.critic, "Critic / reward shape (a preset)")->capture_default_str();
  app.add_option("--deployment", o.deployment, "Take step 3's options from this deployment's preset (single_gpu ...)");
  app.add_option("--preset-actor", o.preset_actor, "The actor size that picks that preset (default: --actor)");
  app.add_option("--dtype", o.dtype, "fp32 | bf16 | fp16")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda | cuda:N (both sides)")->capture_default_str();
  app.add_option("--batch", o.batch, "Generation = training batch")->capture_default_str();
  app.add_option("--prompt", o.prompt)->capture_default_str();
  app.add_option("--answer", o.answer, "Answer tokens (exactly)")->capture_default_str();
  app.add_option("--set", o.set, "KEY=JSON: a step-3 key over the preset (e.g. inference_tp_size=1)");
  app.add_flag("--cuda-graph", o.cuda_graph, "dschat decodes with CUDA graphs (enable_cuda_graph)");
  app.add_flag("--profile", o.profile, "Profile one more dschat iteration (kernels by name, device idle time)");
  app.add_flag("--no-peer", o.no_peer, "Time dschat alone, models built from the presets (no checkpoint)");
  app.add_option("--peak-tflops", o.peak_tflops, "The device's dense peak, for the training fraction")->capture_default_str();
  app.add_option("--threads", o.threads, "Intra-op threads of both sides")->capture_default_str();
  app.add_option("--rounds", o.rounds)->capture_default_str();
  app.add_option("--iters", o.iters, "Timed iterations per round and side")->capture_default_str();
  app.add_option("--warmup", o.warmup)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--out", o.out, "JSON report");
  app.add_option("--work-dir", o.work_dir, "Where the checkpoints go (kept; default: a temporary dir, removed)");
  app.add_option("--python", o.python)->capture_default_str();
  app.add_option("--peer", o.peer)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.batch_given = app.count("--batch") > 0;
  o.prompt_given = app.count("--prompt") > 0;
  o.answer_given = app.count("--answer") > 0;
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "dschat_step3_bench: " << e.what() << "\n";
    return 1;
  }
}
