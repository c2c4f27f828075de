// RLVR-shaped rollouts on the CPU, side by side in one command: --prompts prompts x --samples
// answers each (GRPO's n), answer lengths drawn from a skewed distribution (with probability
// --long-share uniform in (--short-max, --long-max], else uniform in [1, --short-max]; seeded),
// through dschat's ContinuousEngine, dschat's InferenceEngine and transformers' generate on the
// same random checkpoint (a preset's shape, N(0, 0.02), saved as safetensors) and prompts.
//
// The static engines batch a call's rows until its longest answer ends (rows that ended keep
// computing). So each call of --prompts-per-call prompts (x --samples rows, one prefill per
// prompt) generates exactly the longest drawn length of its rows (min_new_tokens =
// max_new_tokens), sampling (temperature 1, no top-k/top-p); what it costs is what a run forcing
// EOS at the drawn positions would cost. The continuous engine gets every prompt at once, each
// sample stopped at its own drawn length (SampleOptions::max_new_tokens, min_new_tokens equal),
// --max-running rows per step and a --kv-memory-mib pool of --block-size blocks. Reported: wall
// time, useful tokens/s (the drawn lengths summed) and computed tokens/s (rows x steps; for the
// continuous engine the same as useful), the static KV workspace per useful token (layers x 2 x
// rows x H_kv x (prompt + --long-max) x D x 4 bytes, the engine's reservation, over a call's useful
// tokens) and the continuous engine's pool, peak blocks held and bytes per token; its steps,
// decode rows, prefills, preemptions and copy-on-write copies. One untimed short call warms
// each side up.
//
// --system S makes the first S tokens of every prompt the same (an RLVR system prompt or task
// instruction): the continuous engine then runs a second time with prefix caching, whose prompts
// after the first take the shared full blocks from the cache (prefill tokens and time compared).
// --continuous-only skips the static engines (the prefix-caching comparison alone).
//
//   dschat_rollout_bench [--preset opt-125m] [--prompts 64] [--samples 8] [--prompts-per-call 8]
//       [--prompt 32] [--short-max 16] [--long-max 256] [--long-share 0.1] [--threads 2] [--seed 1234]
//       [--kv-memory-mib 256] [--max-running 8] [--block-size 16] [--system 0] [--continuous-only]
//       [--no-batched-prefill]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "bench_util.h"
#include "random_checkpoint.h"
#include "dschat/core/error.h"
#include "dschat/core/host_memory.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"

namespace {

using namespace dschat;
using nlohmann::json;
namespace fs = std::filesystem;

struct Options {
  std::string preset = "opt-125m", work_dir;
  int64_t prompts = 64, samples = 8, prompts_per_call = 8, prompt = 32, short_max = 16, long_max = 256;
  double long_share = 0.1;
  int64_t threads = 2, seed = 1234;
  int64_t kv_memory_mib = 256, max_running = 8, block_size = 16;  // the continuous engine's
  int64_t system = 0;           // leading tokens every prompt shares
  bool continuous_only = false;  // no static engines, no transformers
  bool batched_prefill = true;   // the continuous engine's (off: a prefill forward per prompt)
  std::string python = DSCHAT_BENCH_PYTHON;
  std::string peer = DSCHAT_BENCH_PEER;
};

// The drawn answer length of every row, prompt-major (row p * samples + s).
std::vector<int64_t> draw_lengths(const Options& o) {
  std::mt19937_64 engine(static_cast<uint64_t>(o.seed));
  std::bernoulli_distribution is_long(o.long_share);
  std::uniform_int_distribution<int64_t> short_length(1, o.short_max), long_length(o.short_max + 1, o.long_max);
  std::vector<int64_t> lengths(static_cast<size_t>(o.prompts * o.samples));
  for (auto& length : lengths) length = is_long(engine) ? long_length(engine) : short_length(engine);
  return lengths;
}

// The calls: [first prompt, prompt count, steps = the longest drawn length of their rows].
std::vector<std::array<int64_t, 3>> plan_calls(const Options& o, const std::vector<int64_t>& lengths) {
  std::vector<std::array<int64_t, 3>> calls;
  for (int64_t first = 0; first < o.prompts; first += o.prompts_per_call) {
    const int64_t count = std::min(o.prompts_per_call, o.prompts - first);
    const auto begin = lengths.begin() + first * o.samples, end = begin + count * o.samples;
    calls.push_back({first, count, *std::max_element(begin, end)});
  }
  return calls;
}

// Both dschat engines sample alike: temperature 1, no top-k/top-p, n samples, the bench's seed.
core::GenerationConfig rollout_config(models::CausalLM& model, const Options& o) {
  core::GenerationConfig config;
  config.do_sample = true;
  config.top_k = 0;
  config.seed = static_cast<uint64_t>(o.seed);
  config.num_return_sequences = o.samples;
  config.eos_token_id = model->config().eos_token_id;
  config.pad_token_id = model->config().pad_token_id;
  return config;
}

json run_dschat(models::CausalLM& model, const torch::Tensor& prompts, const Options& o,
                const std::vector<std::array<int64_t, 3>>& calls) {
  inference::InferenceEngineOptions options;
  options.max_out_tokens = o.prompt + o.long_max;
  options.log_stats = false;
  inference::InferenceEngine engine(model, options);
  core::GenerationConfig config = rollout_config(model, o);
  json seconds = json::array();
  {  // untimed warm-up (the workspace, the thread pool), as the peer does
    config.max_new_tokens = config.min_new_tokens = 2;
    const torch::Tensor ids = prompts.narrow(0, 0, calls.front()[1]);  // [P, T]
    engine.generate(ids, torch::ones_like(ids), config);
  }
  for (const auto& [first, count, steps] : calls) {
    config.max_new_tokens = config.min_new_tokens = steps;
    const torch::Tensor ids = prompts.narrow(0, first, count);  // [P, T]
    const auto start = std::chrono::steady_clock::now();
    const torch::Tensor out = engine.generate(ids, torch::ones_like(ids), config).sequences;  // [P * n, T + steps]
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    DSCHAT_CHECK(out.size(0) == count * o.samples && out.size(1) == o.prompt + steps, Error,
                 "dschat generated ", out.sizes(), " for ", count, " prompts x ", o.samples, " samples x ", steps);
  }
  return seconds;
}

// The continuous engine on the same prompts and lengths: every prompt submitted at once with its
// n samples (one prefill each, blocks shared), each sample stopped at its drawn length
// (min_new_tokens = its max_new_tokens: no EOS before it), rows admitted and retired per step.
json run_continuous(models::CausalLM& model, const torch::Tensor& prompts, const Options& o,
                    const std::vector<int64_t>& lengths, bool prefix_caching) {
  inference::ContinuousEngineOptions options;
  options.prefix_caching = prefix_caching;
  options.block_size = o.block_size;
  options.kv_cache_memory = o.kv_memory_mib << 20;
  options.max_running_sequences = o.max_running;
  options.batched_prefill = o.batched_prefill;
  inference::ContinuousEngine engine(model, options);
  core::GenerationConfig config = rollout_config(model, o);
  auto prompt_of = [&](int64_t p) {
    const torch::Tensor row = prompts[p].contiguous();  // [T]
    return std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  };
  {  // untimed warm-up, as the other engines get
    core::GenerationConfig warm = config;
    warm.max_new_tokens = warm.min_new_tokens = 2;
    engine.submit(prompt_of(0), warm);
    while (engine.has_work()) engine.step();
  }
  if (prefix_caching) engine.set_model(model);  // nothing cached from the warm-up
  const inference::ContinuousStats before = engine.stats();
  config.max_new_tokens = config.min_new_tokens = o.long_max;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t p = 0; p < o.prompts; ++p) {
    inference::SampleOptions samples;
    samples.max_new_tokens.assign(lengths.begin() + p * o.samples, lengths.begin() + (p + 1) * o.samples);
    engine.submit(prompt_of(p), config, samples);
  }
  int64_t generated = 0;
  while (engine.has_work()) {
    for (const auto& done : engine.step()) generated += static_cast<int64_t>(done.generated.size());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const inference::ContinuousStats& s = engine.stats();
  const int64_t block_bytes = inference::KvBlockPool::bytes_per_block(model->config(), o.block_size, torch::kFloat32);
  return {{"seconds", seconds},
          {"generated", generated},
          {"steps", s.steps - before.steps},
          {"decode_rows", s.decode_rows - before.decode_rows},
          {"prefill_forwards", s.prefill_forwards - before.prefill_forwards},
          {"prefill_rows", s.prefill_rows - before.prefill_rows},
          {"prefill_tokens", s.prefill_tokens - before.prefill_tokens},
          {"cached_tokens", s.prefix_hit_tokens - before.prefix_hit_tokens},
          {"preemptions", s.preemptions - before.preemptions},
          {"copy_on_write", s.copy_on_write - before.copy_on_write},
          {"pool_bytes", engine.pool().bytes()},
          {"peak_bytes", s.peak_blocks_used * block_bytes},
          {"bytes_per_token", block_bytes / o.block_size}};
}

int run(const Options& o) {
  DSCHAT_CHECK(o.prompts >= 1 && o.samples >= 1 && o.prompts_per_call >= 1 && o.short_max >= 1 &&
                   o.long_max > o.short_max && o.long_share >= 0.0 && o.long_share <= 1.0 && o.system >= 0 &&
                   o.system < o.prompt,
               InvalidArgument, "rollout bench: need prompts, samples, prompts-per-call, short-max >= 1, long-max > "
               "short-max, long-share in [0, 1] and 0 <= system < prompt");
  at::set_num_threads(static_cast<int>(o.threads));
  const bench::RandomCheckpoint checkpoint =
      bench::save_random_checkpoint(o.preset, o.seed, o.work_dir, "dschat_rollout_bench");
  const fs::path& work = checkpoint.work;
  const fs::path& model_dir = checkpoint.model_dir;
  auto model = models::load_causal_lm(model_dir.string());
  const auto& mc = model->config();
  torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
  torch::Tensor prompts = torch::randint(3, mc.vocab_size, {o.prompts, o.prompt}, generator, torch::kInt64);  // [P, T]
  if (o.system > 0) prompts.narrow(1, 0, o.system).copy_(prompts[0].narrow(0, 0, o.system));  // the shared start
  const std::vector<int64_t> lengths = draw_lengths(o);
  const auto calls = plan_calls(o, lengths);
  int64_t useful = 0, computed = 0, longest_call_rows = 0, short_rows = 0;
  for (int64_t length : lengths) {
    useful += length;
    short_rows += length <= o.short_max ? 1 : 0;
  }
  for (const auto& call : calls) {
    computed += call[1] * o.samples * call[2];
    longest_call_rows = std::max(longest_call_rows, call[1] * o.samples);
  }
  std::cout << "model " << o.preset << " (random, fp32), " << o.prompts << " prompts x " << o.samples << " samples, "
            << calls.size() << " calls of " << o.prompts_per_call << " prompts, prompt " << o.prompt << ", answers: "
            << short_rows << " of " << lengths.size() << " <= " << o.short_max << " tokens, the rest up to "
            << o.long_max << "; " << useful << " useful tokens, " << computed << " computed by a static batch"
            << (o.system > 0 ? ", the first " + std::to_string(o.system) + " prompt tokens shared" : "") << "\n";

  const json continuous = run_continuous(model, prompts, o, lengths, false);
  DSCHAT_CHECK(continuous.at("generated").get<int64_t>() == useful, Error, "the continuous engine generated ",
               continuous.at("generated").get<int64_t>(), " tokens, the drawn lengths sum to ", useful);
  const double continuous_s = continuous.at("seconds").get<double>();
  auto print_continuous = [&](const char* name, const json& c) {
    std::printf("%s: %.2f s, %.1f tokens/s; %lld steps, %lld decode rows, %lld prefills (one per prompt: %lld) in "
                "%lld forwards of %lld tokens, %lld prompt tokens from the prefix cache, %lld preemptions, %lld copy-on-write blocks, "
                "peak KV %.1f MiB\n",
                name, c.at("seconds").get<double>(), useful / c.at("seconds").get<double>(),
                static_cast<long long>(c.at("steps").get<int64_t>()),
                static_cast<long long>(c.at("decode_rows").get<int64_t>()),
                static_cast<long long>(c.at("prefill_rows").get<int64_t>()), static_cast<long long>(o.prompts),
                static_cast<long long>(c.at("prefill_forwards").get<int64_t>()),
                static_cast<long long>(c.at("prefill_tokens").get<int64_t>()),
                static_cast<long long>(c.at("cached_tokens").get<int64_t>()),
                static_cast<long long>(c.at("preemptions").get<int64_t>()),
                static_cast<long long>(c.at("copy_on_write").get<int64_t>()),
                c.at("peak_bytes").get<double>() / (1 << 20));
  };
  if (o.system > 0) {
    const json cached = run_continuous(model, prompts, o, lengths, true);
    std::printf("\n");
    print_continuous("continuous", continuous);
    print_continuous("continuous + prefix caching", cached);
    std::printf("prefix caching / without: %.2fx the speed, %.2f of the prefill tokens\n",
                continuous_s / cached.at("seconds").get<double>(),
                cached.at("prefill_tokens").get<double>() / continuous.at("prefill_tokens").get<double>());
  }
  if (o.continuous_only) {
    if (o.system == 0) print_continuous("continuous", continuous);
    checkpoint.remove();
    return 0;
  }
  const json ours = run_dschat(model, prompts, o, calls);
  json call_list = json::array();
  for (const auto& call : calls) call_list.push_back({call[0], call[1], call[2]});
  const fs::path job = work / "job.json", peer_out = work / "peer.json";
  std::ofstream(job) << json{{"model_dir", model_dir.string()}, {"prompt", o.prompt}, {"samples", o.samples},
                             {"threads", o.threads}, {"seed", o.seed}, {"prompts", o.prompts}, {"calls", call_list}};
  DSCHAT_CHECK(bench::run_process({o.python, o.peer, "--job", job.string(), "--out", peer_out.string()}) == 0, Error,
               "the transformers peer failed");
  std::ifstream in(peer_out);
  const json theirs = json::parse(in).at("seconds");

  double ours_s = 0.0, theirs_s = 0.0;
  for (double s : ours) ours_s += s;
  for (double s : theirs) theirs_s += s;
  const double kv_bytes = 4.0 * static_cast<double>(mc.num_hidden_layers * 2 * longest_call_rows *
                                                    mc.num_key_value_heads * (o.prompt + o.long_max) * mc.head_dim);
  const double useful_per_call = static_cast<double>(useful) / static_cast<double>(calls.size());
  std::printf("\n| engine | wall s | useful tokens/s | computed tokens/s | KV reserved (MiB) | KV bytes per useful token |\n"
              "|---|---|---|---|---|---|\n");
  std::printf("| dschat InferenceEngine (static) | %.2f | %.1f | %.1f | %.1f | %.0f |\n", ours_s, useful / ours_s,
              computed / ours_s, kv_bytes / (1 << 20), kv_bytes / useful_per_call);
  std::printf("| dschat ContinuousEngine (paged, continuous) | %.2f | %.1f | %.1f | %.1f pool, %.1f peak | %lld |\n",
              continuous_s, useful / continuous_s, useful / continuous_s,
              continuous.at("pool_bytes").get<double>() / (1 << 20), continuous.at("peak_bytes").get<double>() / (1 << 20),
              static_cast<long long>(continuous.at("bytes_per_token").get<int64_t>()));
  std::printf("| transformers generate (static) | %.2f | %.1f | %.1f | - | - |\n", theirs_s, useful / theirs_s,
              computed / theirs_s);
  std::printf("\nuseful / computed tokens (static): %.2f; dschat static / transformers: %.2f; continuous / static: "
              "%.2f; continuous / transformers: %.2f\n",
              static_cast<double>(useful) / static_cast<double>(computed), theirs_s / ours_s, ours_s / continuous_s,
              theirs_s / continuous_s);
  print_continuous("continuous", continuous);
  checkpoint.remove();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dschat::core::retain_freed_host_memory();
  CLI::App app{"dschat RLVR-shaped rollout benchmark against transformers"};
  Options o;
  app.add_option("--preset", o.preset, "Model shape (a preset name), random weights")->capture_default_str();
  app.add_option("--prompts", o.prompts)->capture_default_str();
  app.add_option("--samples", o.samples, "Answers per prompt")->capture_default_str();
  app.add_option("--prompts-per-call", o.prompts_per_call, "Prompts per generate call")->capture_default_str();
  app.add_option("--prompt", o.prompt, "Prompt tokens")->capture_default_str();
  app.add_option("--short-max", o.short_max)->capture_default_str();
  app.add_option("--long-max", o.long_max)->capture_default_str();
  app.add_option("--long-share", o.long_share)->capture_default_str();
  app.add_option("--threads", o.threads)->capture_default_str();
  app.add_option("--kv-memory-mib", o.kv_memory_mib, "The continuous engine's KV block pool")->capture_default_str();
  app.add_option("--max-running", o.max_running, "The continuous engine's rows per decode step")->capture_default_str();
  app.add_option("--block-size", o.block_size, "The continuous engine's tokens per KV block")->capture_default_str();
  app.add_option("--system", o.system, "Leading prompt tokens every prompt shares (adds a prefix-caching run)")
      ->capture_default_str();
  app.add_flag("--continuous-only", o.continuous_only, "Only the continuous engine (no static engines, no transformers)");
  app.add_flag("--no-batched-prefill{false}", o.batched_prefill, "The continuous engine prefills each prompt in its own forward");
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "Where the checkpoint goes (default: a temporary dir, removed)");
  app.add_option("--python", o.python)->capture_default_str();
  app.add_option("--peer", o.peer)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "dschat_rollout_bench: " << e.what() << "\n";
    return 1;
  }
}
