// Step-3 (PPO) throughput: dschat's trainer pieces against the same iteration written with
// transformers + PyTorch (benchmarks/step3_bench_peer.py), on the same random models and prompts,
// in one command. DeepSpeed-Chat's benchmark setting (BenckmarkSetting.md): prompt and answer of
// fixed lengths (min_new_tokens = max_new_tokens), generation batch = training batch,
// ppo_epochs = generation_batches = 1. One iteration = generate (actor, greedy, KV cache) ->
// experience (actor, reference, reward and critic forwards) -> actor PPO step -> critic step.
//
// The binary saves a random actor (CausalLM) and critic (value model) of the given presets, then
// alternates --rounds times: --iters timed iterations here (after --warmup), then the peer in a
// fresh process doing the same. Reports sequences/s, the generation / experience / training split,
// generation tokens/s and DeepSpeed-Chat's effective TFLOPs (perf.py: generation + training
// FLOPs of actor and critic over the iteration's time).
//
//   dschat_step3_bench [--actor opt-125m] [--critic opt-125m] [--batch 4] [--prompt 32]
//       [--answer 32] [--threads 2] [--rounds 2] [--iters 2] [--warmup 1] [--device cpu] [--out F]
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
#include "dschat/core/host_memory.h"
#include "dschat/core/error.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/pipeline_config.h"
#include "io/atomic_file.h"
#include "dschat/rlhf/experience.h"
#include "dschat/rlhf/ppo_step.h"
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
  int64_t batch = 4, prompt = 32, answer = 32, threads = 2, rounds = 2, iters = 2, warmup = 1, seed = 1234;
  std::string python = DSCHAT_BENCH_PYTHON;
  std::string peer = DSCHAT_BENCH_PEER;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A GPU runs ahead of the host: its work is only timed once it has finished.
void wait_for(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Per iteration: {generate, experience, train} seconds.
json dschat_round(const Options& o, const fs::path& work) {
  nlohmann::json cfg = {{"actor_model_name_or_path", (work / "actor").string()},
                        {"critic_model_name_or_path", (work / "critic").string()},
                        {"dtype", o.dtype},
                        {"device", o.device},
                        {"per_device_generation_batch_size", o.batch},
                        {"per_device_training_batch_size", o.batch},
                        {"max_prompt_seq_len", o.prompt},
                        {"max_answer_seq_len", o.answer},
                        {"min_answer_tokens", 1},
                        {"enable_hybrid_engine", true},
                        {"num_warmup_steps", 0}};
  rlhf::PpoConfig config = rlhf::parse_ppo_config(cfg, "step3 bench");
  rlhf::StepContext context;
  rlhf::RlhfModels models = rlhf::build_rlhf_models(config, 1000, 1, context);
  const int64_t vocab = models.actor->actor()->config().vocab_size;
  const int64_t pad = models.actor->actor()->config().pad_token_id.value_or(1);
  torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
  const torch::Device device = models.actor->actor()->parameters().front().device();
  const torch::Tensor prompts =
      torch::randint(3, vocab, {o.batch, o.prompt}, generator, torch::kInt64).to(device);  // [B, P]
  const torch::Tensor mask = torch::ones_like(prompts);                                                    // [B, P]
  core::GenerationConfig generation = rlhf::experience_generation_config(config, pad, pad, 1);
  generation.min_new_tokens = o.answer;  // exactly `answer` tokens, as the benchmark setting
  json gen = json::array(), exp_s = json::array(), train = json::array();
  for (int64_t i = 0; i < o.warmup + o.iters; ++i) {
    wait_for(device);
    auto start = Clock::now();
    std::optional<rlhf::Experience> exp = rlhf::make_experience(models, prompts, mask, generation, pad, 1);
    wait_for(device);
    const double experience_total = seconds_since(start);
    DSCHAT_CHECK(exp.has_value() && exp->rows() == o.batch, Error, "the benchmark lost rows to the answer filter");
    start = Clock::now();
    rlhf::train_rlhf(models, *exp, config.constants, false, false);
    wait_for(device);
    const double train_seconds = seconds_since(start);
    if (i < o.warmup) continue;
    gen.push_back(exp->generate_seconds);
    exp_s.push_back(experience_total - exp->generate_seconds);
    train.push_back(train_seconds);
  }
  return {{"generate", gen}, {"experience", exp_s}, {"train", train}};
}

void save_models(const Options& o, const fs::path& work) {
  models::LoadOptions random;
  random.random_init = true;
  torch::manual_seed(static_cast<uint64_t>(o.seed));
  auto actor = models::load_causal_lm(o.actor, random);
  models::save_causal_lm(actor, work / "actor");
  torch::manual_seed(static_cast<uint64_t>(o.seed) + 1);
  auto critic = models::load_value_model(o.critic, random);
  models::save_value_model(critic, work / "critic");
}

void print_row(const char* name, double gen, double exp, double train, const Options& o, double flops) {
  const double total = gen + exp + train;
  std::printf("| %s | %.2f | %.3f | %.3f | %.3f | %.3f | %.1f | %.4f |\n", name, static_cast<double>(o.batch) / total,
              total, gen, exp, train, static_cast<double>(o.batch * o.answer) / gen, flops / total / 1e12);
}

int run(const Options& o) {
  at::set_num_threads(static_cast<int>(o.threads));
  fs::path work = o.work_dir;
  if (work.empty()) {
    std::string pattern = (fs::temp_directory_path() / "dschat_step3_bench_XXXXXX").string();
    DSCHAT_CHECK(::mkdtemp(pattern.data()) != nullptr, IoError, "mkdtemp failed");
    work = pattern;
  }
  save_models(o, work);
  std::cout << "actor " << o.actor << ", critic/reward " << o.critic << " (random, " << o.dtype << ", " << o.device
            << "), batch "
            << o.batch << ", prompt " << o.prompt << ", answer " << o.answer << ", threads " << o.threads << "\n";
  std::vector<double> ours[3], theirs[3];
  const char* parts[3] = {"generate", "experience", "train"};
  for (int64_t round = 0; round < o.rounds; ++round) {
    std::cout << "round " << round + 1 << "/" << o.rounds << "\n";
    const json mine = dschat_round(o, work);
    const fs::path peer_out = work / "peer.json";
    const std::vector<std::string> argv = {o.python, o.peer, "--work-dir", work.string(), "--out", peer_out.string(),
                                           "--batch", std::to_string(o.batch), "--prompt", std::to_string(o.prompt),
                                           "--answer", std::to_string(o.answer), "--threads", std::to_string(o.threads),
                                           "--iters", std::to_string(o.iters), "--warmup", std::to_string(o.warmup),
                                           "--seed", std::to_string(o.seed), "--device", o.device};
    DSCHAT_CHECK(run_process(argv) == 0, Error, "the transformers peer failed");
    std::ifstream in(peer_out);
    const json peer = json::parse(in);
    for (int p = 0; p < 3; ++p) {
      for (double s : mine[parts[p]]) ours[p].push_back(s);
      for (double s : peer[parts[p]]) theirs[p].push_back(s);
    }
  }
  auto actor_config = core::load_model_config((work / "actor").string());
  auto critic_config = core::load_model_config((work / "critic").string());
  const int64_t seq = o.prompt + o.answer;
  // perf.py's step-3 estimate: actor generation + actor and critic training passes.
  const double flops = monitor::training_flops(actor_config, o.batch, seq, false, 0) +
                       monitor::training_flops(critic_config, o.batch, seq, false, 0) +
                       monitor::training_flops(actor_config, o.batch, seq, false, 0) / 3.0;
  std::cout << "\n| implementation | seqs/s | iteration (s) | generate (s) | experience (s) | train (s) | gen tokens/s "
               "| effective TFLOPs |\n|---|---|---|---|---|---|---|---|\n";
  print_row("dschat", median(ours[0]), median(ours[1]), median(ours[2]), o, flops);
  print_row("transformers + PyTorch", median(theirs[0]), median(theirs[1]), median(theirs[2]), o, flops);
  const double ours_total = median(ours[0]) + median(ours[1]) + median(ours[2]);
  const double theirs_total = median(theirs[0]) + median(theirs[1]) + median(theirs[2]);
  std::printf("\ndschat / transformers sequences/s: %.2f (generate %.2f, experience %.2f, train %.2f)\n",
              theirs_total / ours_total, median(theirs[0]) / median(ours[0]), median(theirs[1]) / median(ours[1]),
              median(theirs[2]) / median(ours[2]));
  if (!o.out.empty()) {
    json report = {{"ratio", theirs_total / ours_total}, {"dschat_seqs_per_s", o.batch / ours_total},
                   {"transformers_seqs_per_s", o.batch / theirs_total}};
    for (int p = 0; p < 3; ++p) {
      report[std::string("dschat_") + parts[p]] = ours[p];
      report[std::string("transformers_") + parts[p]] = theirs[p];
    }
    std::ofstream(o.out) << report.dump(1);
  }
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
  app.add_option("--dtype", o.dtype, "fp32 | bf16 | fp16")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda | cuda:N (both sides)")->capture_default_str();
  app.add_option("--batch", o.batch, "Generation = training batch")->capture_default_str();
  app.add_option("--prompt", o.prompt)->capture_default_str();
  app.add_option("--answer", o.answer, "Answer tokens (exactly)")->capture_default_str();
  app.add_option("--threads", o.threads, "Intra-op threads of both sides")->capture_default_str();
  app.add_option("--rounds", o.rounds)->capture_default_str();
  app.add_option("--iters", o.iters, "Timed iterations per round and side")->capture_default_str();
  app.add_option("--warmup", o.warmup)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--out", o.out, "JSON report");
  app.add_option("--work-dir", o.work_dir, "Where the checkpoints go (default: a temporary dir)");
  app.add_option("--python", o.python)->capture_default_str();
  app.add_option("--peer", o.peer)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "dschat_step3_bench: " << e.what() << "\n";
    return 1;
  }
}
