// Generation benchmark on the CPU: dschat's InferenceEngine and ContinuousEngine (--engines)
// against transformers' generate() on the same model, prompts and decoding, in one command. The
// binary saves a random model of a preset's shape (transformers' init, N(0, 0.02); default
// opt-125m) as a safetensors checkpoint, then alternates --rounds times: --iters timed generate
// calls here (after --warmup untimed ones), then benchmarks/generate_bench_peer.py
// (OPTForCausalLM / LlamaForCausalLM from the same checkpoint, SDPA attention, model.generate)
// doing the same in a fresh process. Both decode greedily with min_new_tokens = max_new_tokens, so
// every call generates exactly --new-tokens tokens per row, from the same prompt rows
// (torch.randint(3, vocab, (batch, prompt)) seeded with --seed, checked by a checksum). A figure is
// the median over all timed calls of all rounds; tokens/s = batch x new tokens / latency; the CPU
// time of each call (all threads of the process) is reported too. Prints a markdown table and
// whether both generated the same ids.
// dschat's decode is also set against this machine's memory bandwidth: decode GB/s = the weight
// bytes read per decode step (every parameter once) x (new tokens - 1) / (latency - prefill), as
// a fraction of a read-only stream over a buffer 4x the last-level cache at the same thread count
// (memory_bandwidth_gb_s, before and after the rounds: the higher), the ceiling for a step that
// reads each weight once from memory, and of a copy's rate (bytes copied per second: the measure
// issue 40 set its targets in). The continuous engine gets every row submitted at once and is
// stepped to the end; its prefill time is the time until every prompt has been prefilled (its
// steps then decode only when the prompts fit one step's prefill budget, 512 tokens).
//
//   dschat_generate_bench [--preset opt-125m] [--batch 4] [--prompt 32] [--new-tokens 32] [--threads 2]
//       [--rounds 3] [--iters 3] [--warmup 1] [--engines static,continuous[,continuous-per-prompt]] [--out F]
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>

#include "bench_util.h"
#include "random_checkpoint.h"
#include "dschat/core/host_memory.h"
#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/inference/inference_engine.h"
#include "dschat/models/load_save.h"

namespace {

using dschat::bench::median;
using dschat::bench::run_process;

using nlohmann::json;
using namespace dschat;
namespace fs = std::filesystem;

struct Options {
  std::string preset = "opt-125m", out, work_dir;
  int64_t batch = 4, prompt = 32, new_tokens = 32, threads = 2, rounds = 3, iters = 3, warmup = 1, seed = 1234;
  std::vector<std::string> engines = {"static", "continuous"};
  std::string python = DSCHAT_BENCH_PYTHON;
  std::string peer = DSCHAT_BENCH_PEER;
};

// The prompt rows: the same as torch.randint(3, vocab, (B, T), generator=Generator().manual_seed(seed)).
torch::Tensor make_prompts(const Options& o, int64_t vocab) {
  torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(o.seed));
  return torch::randint(3, vocab, {o.batch, o.prompt}, generator, torch::kInt64);  // [B, T]
}

// sum(ids * (1 + flat index)): the peer prints the same figure for its rows.
int64_t checksum(const torch::Tensor& ids) {
  torch::Tensor weights = torch::arange(1, ids.numel() + 1, torch::kInt64).view_as(ids);  // [B, T]
  return (ids * weights).sum().item<int64_t>();
}

// CPU time of this process, all threads (on a shared machine, less disturbed than wall time).
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// One generate call's ids [B, T + N], and its prefill seconds.
using GenerateCall = std::function<std::pair<torch::Tensor, double>()>;

// One round of dschat: a fresh engine (its first call takes the workspace or pool), warm-up, timed calls.
json dschat_round(const GenerateCall& call, const Options& o) {
  json seconds = json::array(), cpu_seconds = json::array(), decode_seconds = json::array();
  torch::Tensor ids;  // [B, T + N]
  for (int64_t i = 0; i < o.warmup + o.iters; ++i) {
    const double cpu_start = process_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    auto [sequences, prefill_s] = call();
    ids = sequences;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i >= o.warmup) {
      seconds.push_back(elapsed);
      cpu_seconds.push_back(process_cpu_seconds() - cpu_start);
      decode_seconds.push_back(elapsed - prefill_s);
    }
  }
  std::vector<int64_t> flat(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel());
  return {{"seconds", seconds}, {"cpu_seconds", cpu_seconds}, {"decode_seconds", decode_seconds}, {"ids", flat}};
}

core::GenerationConfig greedy_fixed_length(const models::CausalLM& model, const Options& o) {
  core::GenerationConfig config;
  config.max_new_tokens = config.min_new_tokens = o.new_tokens;
  config.eos_token_id = model->config().eos_token_id;
  config.pad_token_id = model->config().pad_token_id;
  return config;
}

json static_round(models::CausalLM& model, const torch::Tensor& prompts, const Options& o) {
  inference::InferenceEngineOptions options;
  options.max_out_tokens = o.prompt + o.new_tokens;
  options.log_stats = false;
  inference::InferenceEngine engine(model, options);
  const core::GenerationConfig config = greedy_fixed_length(model, o);
  const torch::Tensor mask = torch::ones_like(prompts);  // [B, T]
  json round = dschat_round(
      [&] {
        torch::Tensor ids = engine.generate(prompts, mask, config).sequences;  // [B, T + N]
        return std::make_pair(ids, engine.last_stats().prefill_s);
      },
      o);
  std::cout << "  dschat static: " << inference::format_generation_stats(engine.last_stats()) << "\n";
  return round;
}

json continuous_round(models::CausalLM& model, const torch::Tensor& prompts, const Options& o, bool batched_prefill) {
  inference::ContinuousEngineOptions options;
  options.batched_prefill = batched_prefill;
  options.size_pool(0, o.batch, o.prompt + o.new_tokens);
  options.max_running_sequences = o.batch;
  inference::ContinuousEngine engine(model, options);
  const core::GenerationConfig config = greedy_fixed_length(model, o);
  return dschat_round(
      [&] {
        const auto start = std::chrono::steady_clock::now();
        std::vector<int64_t> requests;
        for (int64_t b = 0; b < o.batch; ++b) {
          const torch::Tensor row = prompts[b].contiguous();  // [T]
          requests.push_back(engine.submit(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + o.prompt),
                                           config));
        }
        const int64_t prefills_before = engine.stats().prefill_rows;
        double prefill_s = 0.0;
        torch::Tensor ids = torch::empty({o.batch, o.prompt + o.new_tokens}, torch::kInt64);  // [B, T + N]
        while (engine.has_work()) {
          for (const auto& done : engine.step()) {
            std::vector<int64_t> row = done.prompt;
            row.insert(row.end(), done.generated.begin(), done.generated.end());
            ids[done.request - requests.front()].copy_(torch::tensor(row, torch::kInt64));
          }
          if (prefill_s == 0.0 && engine.stats().prefill_rows - prefills_before == o.batch) {
            prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          }
        }
        return std::make_pair(ids, prefill_s);
      },
      o);
}

// This machine's memory bandwidth at the bench's thread count, the median of 5 passes each over a
// buffer 4x the last-level cache (1 GiB at least, so the cache cannot hold it): a read-only
// stream (the faster of torch::sum and MKL's gemv over the same floats: neither writes) and a
// copy (bytes copied per second).
std::pair<double, double> memory_bandwidth_gb_s() {
  const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  const int64_t bytes = std::max<int64_t>(int64_t{1} << 30, 4 * static_cast<int64_t>(std::max(l3, 0L)));
  const int64_t cols = 1024, floats = bytes / 4 / cols * cols;
  torch::Tensor source = torch::ones({floats / cols, cols});  // [F / 1024, 1024]
  torch::Tensor target = torch::empty_like(source);          // [F / 1024, 1024]
  const torch::Tensor ones = torch::ones({cols});            // [1024]
  const auto seconds_of = [](const std::function<void()>& pass) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> read, copy;
  for (int pass = 0; pass < 6; ++pass) {
    double total = 0.0;
    const double sum_s = seconds_of([&] { total = source.sum().item<double>(); });
    const double gemv_s = seconds_of([&] { total += torch::mv(source, ones)[0].item<double>(); });
    const double copy_s = seconds_of([&] { target.copy_(source); });
    DSCHAT_CHECK(total == static_cast<double>(floats + cols), Error, "the bandwidth probe summed ", total);
    if (pass == 0) continue;  // first touch of the pages
    read.push_back(4.0 * static_cast<double>(floats) / std::min(sum_s, gemv_s) / 1e9);
    copy.push_back(4.0 * static_cast<double>(floats) / copy_s / 1e9);
  }
  return {median(read), median(copy)};
}

int run(const Options& o) {
  at::set_num_threads(static_cast<int>(o.threads));
  const bench::RandomCheckpoint checkpoint =
      bench::save_random_checkpoint(o.preset, o.seed, o.work_dir, "dschat_generate_bench");
  const fs::path& work = checkpoint.work;
  const fs::path& model_dir = checkpoint.model_dir;
  auto model = models::load_causal_lm(model_dir.string());
  const torch::Tensor prompts = make_prompts(o, model->config().vocab_size);  // [B, T]
  std::cout << "model " << o.preset << " (random, fp32, " << model_dir.string() << "), batch " << o.batch
            << ", prompt " << o.prompt << ", new tokens " << o.new_tokens << ", threads " << o.threads
            << ", prompt checksum " << checksum(prompts) << "\n";

  struct Side {
    std::vector<double> seconds, cpu, decode;
    json ids;
  };
  const auto [read_before, copy_before] = memory_bandwidth_gb_s();
  std::map<std::string, Side> ours;  // engine -> its figures
  std::vector<double> theirs, theirs_cpu;
  json peer_ids;
  for (int64_t round = 0; round < o.rounds; ++round) {
    std::cout << "round " << round + 1 << "/" << o.rounds << "\n";
    for (const std::string& engine : o.engines) {
      json mine = engine == "static" ? static_round(model, prompts, o)
                                     : continuous_round(model, prompts, o, engine == "continuous");
      Side& side = ours[engine];
      for (double s : mine["seconds"]) side.seconds.push_back(s);
      for (double s : mine["cpu_seconds"]) side.cpu.push_back(s);
      for (double s : mine["decode_seconds"]) side.decode.push_back(s);
      side.ids = mine["ids"];
    }
    const fs::path peer_out = work / "peer.json";
    const std::vector<std::string> argv = {
        o.python, o.peer, "--model-dir", model_dir.string(), "--out", peer_out.string(), "--batch",
        std::to_string(o.batch), "--prompt", std::to_string(o.prompt), "--new-tokens", std::to_string(o.new_tokens),
        "--threads", std::to_string(o.threads), "--iters", std::to_string(o.iters), "--warmup",
        std::to_string(o.warmup), "--seed", std::to_string(o.seed)};
    DSCHAT_CHECK(run_process(argv) == 0, Error, "the transformers peer failed");
    std::ifstream in(peer_out);
    const json peer = json::parse(in);
    DSCHAT_CHECK(peer["prompt_checksum"].get<int64_t>() == checksum(prompts), Error,
                 "the peer generated from other prompt rows");
    for (double s : peer["seconds"]) theirs.push_back(s);
    for (double s : peer["cpu_seconds"]) theirs_cpu.push_back(s);
    peer_ids = peer["ids"];
  }

  const double tokens = static_cast<double>(o.batch * o.new_tokens);
  const double theirs_s = median(theirs), theirs_cpu_s = median(theirs_cpu);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  const double weight_gb = 4e-9 * static_cast<double>(parameters);  // fp32
  // Probed before and after the rounds, the higher kept: this VM's figure moved between 35 and 55
  // GB/s from run to run, and a fraction of a low probe would flatter the engines.
  const auto [read_after, copy_after] = memory_bandwidth_gb_s();
  const double read_gb_s = std::max(read_before, read_after), copy_gb_s = std::max(copy_before, copy_after);
  std::cout << "\n| implementation | median latency (s) | per-token latency (ms) | tokens/s | CPU s / call | x transformers "
               "| decode ms / step | decode GB/s | % of read stream | % of copy | identical ids |\n"
               "|---|---|---|---|---|---|---|---|---|---|---|\n";
  json report = {{"transformers_seconds", theirs}, {"transformers_cpu_seconds", theirs_cpu},
                 {"transformers_tokens_per_s", tokens / theirs_s}, {"read_gb_s", read_gb_s}, {"copy_gb_s", copy_gb_s}};
  for (const std::string& engine : o.engines) {
    const Side& side = ours[engine];
    const double ours_s = median(side.seconds), ours_cpu_s = median(side.cpu), decode_s = median(side.decode);
    const double decode_gb_s = o.new_tokens > 1 && decode_s > 0 ? weight_gb * (o.new_tokens - 1) / decode_s : 0.0;
    int64_t same = 0;
    for (size_t i = 0; i < side.ids.size() && i < peer_ids.size(); ++i) same += side.ids[i] == peer_ids[i] ? 1 : 0;
    std::printf("| dschat %s | %.3f | %.1f | %.1f | %.2f | %.2f | %.1f | %.1f | %.0f%% | %.0f%% | %lld of %zu |\n",
                engine == "static"       ? "InferenceEngine"
                : engine == "continuous" ? "ContinuousEngine"
                                         : "ContinuousEngine, a prefill forward per prompt",
                ours_s, 1e3 * ours_s / o.new_tokens,
                tokens / ours_s, ours_cpu_s, theirs_s / ours_s,
                o.new_tokens > 1 ? 1e3 * decode_s / (o.new_tokens - 1) : 0.0, decode_gb_s,
                100.0 * decode_gb_s / read_gb_s, 100.0 * decode_gb_s / copy_gb_s, static_cast<long long>(same),
                side.ids.size());
    report[engine] = {{"seconds", side.seconds}, {"cpu_seconds", side.cpu}, {"tokens_per_s", tokens / ours_s},
                      {"ratio", theirs_s / ours_s}, {"identical_ids", same}, {"decode_gb_s", decode_gb_s}};
  }
  std::printf("| transformers generate | %.3f | %.1f | %.1f | %.2f | 1.00 | | | | | |\n", theirs_s,
              1e3 * theirs_s / o.new_tokens, tokens / theirs_s, theirs_cpu_s);
  std::printf("\nread stream %.1f GB/s, copy %.1f GB/s (this machine, %lld threads)\n", read_gb_s, copy_gb_s,
              static_cast<long long>(o.threads));
  if (!o.out.empty()) std::ofstream(o.out) << report.dump(1);
  checkpoint.remove();  // the checkpoint (~0.5 GB for opt-125m) goes with the temporary dir
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dschat::core::retain_freed_host_memory();  // as the dschat CLI runs
  CLI::App app{"dschat generation benchmark against transformers"};
  Options o;
  app.add_option("--preset", o.preset, "Model shape (a preset name), random weights")->capture_default_str();
  app.add_option("--batch", o.batch)->capture_default_str();
  app.add_option("--prompt", o.prompt, "Prompt tokens per row")->capture_default_str();
  app.add_option("--new-tokens", o.new_tokens)->capture_default_str();
  app.add_option("--threads", o.threads, "Intra-op threads of both sides")->capture_default_str();
  app.add_option("--rounds", o.rounds)->capture_default_str();
  app.add_option("--iters", o.iters, "Timed generate calls per round and side")->capture_default_str();
  app.add_option("--warmup", o.warmup)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--engines", o.engines,
                  "dschat engines to time: static, continuous, continuous-per-prompt (batched_prefill off)")
      ->delimiter(',')
      ->check(CLI::IsMember({"static", "continuous", "continuous-per-prompt"}))
      ->capture_default_str();
  app.add_option("--out", o.out, "JSON report");
  app.add_option("--work-dir", o.work_dir, "Where the checkpoint goes (default: a temporary dir, removed)");
  app.add_option("--python", o.python)->capture_default_str();
  app.add_option("--peer", o.peer)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "dschat_generate_bench: " << e.what() << "\n";
    return 1;
  }
}
