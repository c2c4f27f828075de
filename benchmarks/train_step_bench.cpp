// Training-step benchmark on the CPU: dschat's TrainingEngine against eager PyTorch on the same
// job, in one command. The binary saves one random OPT checkpoint, then runs, one after another:
//   single  one process, --threads intra-op threads: TrainingEngine (ZeRO stage 0) here, then
//           benchmarks/train_step_peer.py (transformers OPTForCausalLM + torch.optim.AdamW)
//   dp      --dp-world ranks over Gloo, one thread each, the global batch split over them: this
//           binary's own ranks started through dist::launch (the code of `dschat launch`) at
//           ZeRO stages 0 and 2, then the peer under torchrun with DistributedDataParallel
//   memory  --mem-world ranks at ZeRO stages 0-3: TrainingEngine::memory_footprint() per rank
//           (gradients after the last backward, parameters and optimizer state after the step)
//           against engine::theoretical_footprint()
// Both sides load the same weights, train on the same token rows (checked by a checksum) with the
// same loss and AdamW settings, and report every step's loss, so the runs can be seen to be the
// same job. Each implementation runs --rounds times, alternating with its peers (a fresh model each
// time, in a fresh process except dschat's one-process runs, which run here); a figure is the median
// of all its timed steps (--steps per round, after --warmup untimed ones), per phase, in wall time
// and in the process's CPU time. Prints markdown tables; --out writes everything as JSON.
//
//   dschat_train_step_bench [--out F] [--parts single,dp,memory] [--rounds 2] [--steps 5] [--warmup 2]
//       [--batch 8] [--seq 128] [--threads 2] [--hidden 256 --layers 4 --heads 4 --ffn 1024 --vocab 8192]
//
// The --rank-job options are internal: they make this binary one rank of a dp or memory job.
#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <sstream>

#include "bench_util.h"
#include "dschat/core/error.h"
#include "dschat/core/model_config.h"
#include "dschat/dist/launch_env.h"
#include "dschat/dist/launcher.h"
#include "dschat/dist/process_group.h"
#include "dschat/engine/training_engine.h"
#include "dschat/models/load_save.h"
#include "dschat/models/causal_lm.h"

namespace {

using dschat::bench::median;
using dschat::bench::run_process;

using nlohmann::json;
using namespace dschat;
namespace fs = std::filesystem;

struct Options {
  std::string out;
  std::string parts = "single,dp,memory";
  int64_t batch = 8, seq = 128, steps = 5, warmup = 2, rounds = 2, threads = 2, seed = 1234;
  int64_t vocab = 8192, hidden = 256, layers = 4, heads = 4, ffn = 1024;
  int64_t dp_world = 2;
  int64_t mem_world = 4, mem_seq = 32, mem_steps = 2;
  double lr = 1e-4;
  std::string python = DSCHAT_BENCH_PYTHON;
  std::string peer = DSCHAT_BENCH_PEER;
  std::string torch_adamw = "default";
  std::string work_dir;
  bool keep_work_dir = false;
  // One rank of a job started by the driver.
  std::string rank_job;  // "dp" | "memory"
  std::string model_dir, rank_out;
  int stage = 0;
};

// ---- helpers ------------------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// CPU time of this process, all threads (on a shared machine, less disturbed than wall time).
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The global batch: the same rows as torch.randint(3, vocab, (B, T), generator=Generator().manual_seed(seed)).
torch::Tensor make_batch(int64_t seed, int64_t batch, int64_t seq, int64_t vocab) {
  torch::Generator generator = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  return torch::randint(3, vocab, {batch, seq}, generator, torch::kInt64);  // [B, T]
}

// sum(ids * (1 + flat index)): the peer prints the same figure for its rows.
int64_t batch_checksum(const torch::Tensor& ids) {
  torch::Tensor weights = torch::arange(1, ids.numel() + 1, torch::kInt64).view_as(ids);  // [B, T]
  return (ids * weights).sum().item<int64_t>();
}

// Cross entropy of logits[:, :-1] against ids[:, 1:], as the peer computes it.
torch::Tensor lm_loss(models::CausalLM& model, const torch::Tensor& ids) {
  const int64_t tokens = ids.size(1);
  torch::Tensor logits = model->forward(ids);  // [b, T, V]
  torch::Tensor shifted = logits.narrow(1, 0, tokens - 1).reshape({-1, logits.size(2)});  // [b * (T-1), V]
  torch::Tensor targets = ids.narrow(1, 1, tokens - 1).reshape({-1});                      // [b * (T-1)]
  return torch::nn::functional::cross_entropy(shifted, targets);
}

engine::TrainingEngineOptions engine_options(const Options& o, int stage, int64_t micro,
                                             std::shared_ptr<dist::Communicator> communicator) {
  const int64_t world = communicator ? communicator->world_size() : 1;
  json ds = {{"train_micro_batch_size_per_gpu", micro},
             {"gradient_accumulation_steps", 1},
             {"train_batch_size", micro * world},
             {"steps_per_print", 0},
             // DeepSpeed-Chat's ds_utils.get_train_ds_config value: biases and norms stay resident.
             {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 10000}}}};
  engine::TrainingEngineOptions options;
  options.config = engine::DeepSpeedConfig::parse(ds, world, "train_step_bench");
  options.optimizer.lr = o.lr;
  options.optimizer.beta1 = 0.9;
  options.optimizer.beta2 = 0.95;
  options.optimizer.eps = 1e-8;
  options.optimizer.weight_decay = 0.0;
  options.communicator = std::move(communicator);
  return options;
}

models::CausalLM load_for_training(const std::string& model_dir) {
  models::CausalLM model = models::load_causal_lm(model_dir);
  model->train();
  return model;
}

struct StepTimes {
  std::vector<double> step, forward, backward, optimizer;  // wall seconds, timed steps only
  std::vector<double> cpu;                                 // CPU seconds of the process (all its threads) per step
  std::vector<double> losses;                              // every step, warmup included
};

// warmup + steps training steps on `ids`: forward and loss, engine.backward, engine.step.
StepTimes train_loop(models::CausalLM& model, engine::TrainingEngine& trainer, const torch::Tensor& ids,
                     int64_t warmup, int64_t steps) {
  StepTimes times;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    const double cpu_start = process_cpu_seconds();
    const auto start = std::chrono::steady_clock::now();
    torch::Tensor loss = lm_loss(model, ids);
    const double forward = seconds_since(start);
    trainer.backward(loss);
    const double backward = seconds_since(start);
    trainer.step();
    const double step = seconds_since(start);
    const double cpu = process_cpu_seconds() - cpu_start;
    times.losses.push_back(loss.item<double>());
    if (i < warmup) continue;
    times.step.push_back(step);
    times.forward.push_back(forward);
    times.backward.push_back(backward - forward);
    times.optimizer.push_back(step - backward);
    times.cpu.push_back(cpu);
  }
  return times;
}

const char* const kPhases[] = {"step", "forward", "backward", "optimizer", "cpu"};

// Medians of the per-phase lists in report["ms"] (milliseconds), and tokens/s of the step median.
void add_medians(json& report, int64_t tokens) {
  for (const char* phase : kPhases) report["median_ms"][phase] = median(report["ms"][phase].get<std::vector<double>>());
  report["tokens_per_s"] = static_cast<double>(tokens) / (report["median_ms"]["step"].get<double>() / 1e3);
}

json times_json(const StepTimes& t, int64_t tokens) {
  auto ms = [](const std::vector<double>& seconds) {
    std::vector<double> out;
    for (double s : seconds) out.push_back(1e3 * s);
    return out;
  };
  json report = {{"ms", {{"step", ms(t.step)}, {"forward", ms(t.forward)}, {"backward", ms(t.backward)},
                         {"optimizer", ms(t.optimizer)}, {"cpu", ms(t.cpu)}}},
                 {"losses", t.losses}};
  add_medians(report, tokens);
  return report;
}

// One report from the rounds of one implementation: every round's timed steps pooled (the rounds
// alternate with the other implementations, so slow spells of a shared machine hit all of them).
json pool_rounds(const std::vector<json>& rounds, int64_t tokens) {
  json pooled = rounds.front();
  pooled["round_median_step_ms"] = json::array();
  for (const char* phase : kPhases) pooled["ms"][phase] = json::array();
  for (const json& round : rounds) {
    pooled["round_median_step_ms"].push_back(round["median_ms"]["step"]);
    for (const char* phase : kPhases) {
      for (const json& value : round["ms"][phase]) pooled["ms"][phase].push_back(value);
    }
  }
  add_medians(pooled, tokens);
  return pooled;
}

json footprint_json(const engine::MemoryFootprint& bytes) {
  return {{"parameters", bytes.parameter_bytes}, {"gradients", bytes.gradient_bytes},
          {"optimizer", bytes.optimizer_bytes}, {"total", bytes.total()}};
}

// VmHWM of /proc/self/status: this process image's peak resident set (getrusage's ru_maxrss would
// also count the forked parent's, which exec does not reset).
int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  123456 kB"
  }
  return -1;
}

json read_json(const fs::path& file) {
  std::ifstream in(file);
  DSCHAT_CHECK(in.good(), IoError, file.string(), ": no report (did the run fail?)");
  return json::parse(in);
}

void write_json(const fs::path& file, const json& value) {
  std::ofstream out(file);
  out << value.dump(1) << "\n";
  DSCHAT_CHECK(out.good(), IoError, file.string(), ": write failed");
}

std::string own_executable() {
  std::vector<char> path(4096);
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  DSCHAT_CHECK(n > 0, Error, "cannot read /proc/self/exe");
  return std::string(path.data(), static_cast<size_t>(n));
}

// A TCP port that was free a moment ago (for the rendezvous store of the next job).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  DSCHAT_CHECK(fd >= 0, Error, "socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t length = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0;
  ::close(fd);
  DSCHAT_CHECK(ok, Error, "cannot find a free port on 127.0.0.1");
  return ntohs(addr.sin_port);
}

// Runs argv (PATH lookup) with this process's stdout/stderr and returns its exit status.
// Starts `world` ranks of this binary with `rank_args`, the way `dschat launch` does.
void launch_ranks(int64_t world, const std::vector<std::string>& rank_args) {
  dist::LaunchPlan plan;
  plan.command = {own_executable()};
  plan.command.insert(plan.command.end(), rank_args.begin(), rank_args.end());
  plan.node_slots = {world};
  plan.master_port = free_port();
  plan.stop_grace = std::chrono::seconds(5);
  std::cout.flush();
  const int status = dist::launch(plan);
  DSCHAT_CHECK(status == 0, Error, "rank job failed with status ", status);
}

// Deletes a directory tree without std::filesystem::remove_all (docs/architecture.md).
void remove_tree(const fs::path& path) {
  std::error_code error;
  if (fs::is_directory(fs::symlink_status(path, error))) {
    std::vector<fs::path> children;
    for (const auto& entry : fs::directory_iterator(path, error)) children.push_back(entry.path());
    for (const auto& child : children) remove_tree(child);
  }
  fs::remove(path, error);
}

// ---- the ranks ----------------------------------------------------------------------------------

// One rank of the data-parallel job: micro-batch rows [rank * B / W, (rank + 1) * B / W).
int run_dp_rank(const Options& o) {
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  auto communicator = std::make_shared<dist::Communicator>(
      dist::Communicator::create(env, dist::Backend::Gloo, std::chrono::minutes(5)));
  at::set_num_threads(static_cast<int>(o.threads));
  const int64_t world = communicator->world_size(), rank = communicator->rank();
  DSCHAT_CHECK(o.batch % world == 0, InvalidArgument, "--batch ", o.batch, " does not split over ", world, " ranks");
  const int64_t micro = o.batch / world;
  models::CausalLM model = load_for_training(o.model_dir);
  engine::TrainingEngine trainer(model.ptr(), engine_options(o, o.stage, micro, communicator));
  const torch::Tensor batch = make_batch(o.seed, o.batch, o.seq, model->config().vocab_size);  // [B, T]
  const torch::Tensor ids = batch.narrow(0, rank * micro, micro).contiguous();                  // [B / W, T]
  const StepTimes times = train_loop(model, trainer, ids, o.warmup, o.steps);
  torch::Tensor losses = torch::tensor(times.losses, torch::kFloat64);  // [steps]: the global batch's loss
  communicator->all_reduce(losses, dist::ReduceOp::Avg);
  if (rank == 0) {
    StepTimes global = times;
    global.losses.assign(losses.data_ptr<double>(), losses.data_ptr<double>() + losses.numel());
    json report = times_json(global, o.batch * o.seq);
    report["impl"] = "dschat";
    report["stage"] = o.stage;
    report["world_size"] = world;
    report["threads_per_rank"] = at::get_num_threads();
    report["batch_checksum"] = batch_checksum(batch);
    write_json(o.rank_out, report);
  }
  communicator->barrier();
  return 0;
}

// One rank of the memory job: --mem-steps steps on one row per rank, then the byte counts.
int run_memory_rank(const Options& o) {
  const dist::LaunchEnv env = dist::LaunchEnv::from_environment();
  auto communicator = std::make_shared<dist::Communicator>(
      dist::Communicator::create(env, dist::Backend::Gloo, std::chrono::minutes(5)));
  at::set_num_threads(1);
  const int64_t world = communicator->world_size(), rank = communicator->rank();
  models::CausalLM model = load_for_training(o.model_dir);
  engine::TrainingEngine trainer(model.ptr(), engine_options(o, o.stage, 1, communicator));
  const torch::Tensor ids =
      make_batch(o.seed, world, o.mem_seq, model->config().vocab_size).narrow(0, rank, 1).contiguous();  // [1, T]
  engine::MemoryFootprint after_backward, after_step;
  for (int64_t i = 0; i < o.mem_steps; ++i) {
    torch::Tensor loss = lm_loss(model, ids);
    trainer.backward(loss);
    after_backward = trainer.memory_footprint();
    trainer.step();
    after_step = trainer.memory_footprint();
  }
  int64_t num_params = 0;
  for (const auto& [name, value] : trainer.consolidated_parameters()) num_params += value.numel();

  const std::vector<int64_t> fields = {after_backward.parameter_bytes, after_backward.gradient_bytes,
                                       after_backward.optimizer_bytes, after_step.parameter_bytes,
                                       after_step.gradient_bytes,       after_step.optimizer_bytes,
                                       peak_rss_bytes()};
  const auto n = static_cast<int64_t>(fields.size());
  torch::Tensor mine = torch::tensor(fields, torch::kInt64);       // [n]
  torch::Tensor all = torch::empty({world * n}, torch::kInt64);  // [world * n]
  communicator->all_gather_into(all, mine);
  if (rank == 0) {
    json per_rank = json::array();
    for (int64_t r = 0; r < world; ++r) {
      auto at = [&](int64_t i) { return all[r * n + i].item<int64_t>(); };
      engine::MemoryFootprint backward_bytes{at(0), at(1), at(2)}, step_bytes{at(3), at(4), at(5)};
      per_rank.push_back({{"after_backward", footprint_json(backward_bytes)},
                          {"after_step", footprint_json(step_bytes)},
                          {"peak_rss", at(6)}});
    }
    const engine::MemoryFootprint theory = engine::theoretical_footprint(o.stage, num_params, 4, world);
    write_json(o.rank_out, {{"stage", o.stage}, {"world_size", world}, {"num_params", num_params},
                            {"per_rank", per_rank}, {"theoretical", footprint_json(theory)}});
  }
  communicator->barrier();
  return 0;
}

// ---- the driver ---------------------------------------------------------------------------------

std::vector<std::string> model_args(const Options& o, const fs::path& model_dir) {
  return {"--model-dir", model_dir.string(), "--seq", std::to_string(o.seq), "--steps", std::to_string(o.steps),
          "--warmup", std::to_string(o.warmup), "--seed", std::to_string(o.seed)};
}

// Writes a random OPT checkpoint of the requested shape (transformers' init: N(0, 0.02)).
fs::path save_model(const Options& o, const fs::path& work) {
  core::ModelConfig config = *core::model_preset("opt-125m");
  config.vocab_size = o.vocab;
  config.hidden_size = o.hidden;
  config.num_hidden_layers = o.layers;
  config.num_attention_heads = config.num_key_value_heads = o.heads;
  config.head_dim = o.hidden / o.heads;
  config.intermediate_size = o.ffn;
  config.word_embed_proj_dim = o.hidden;
  config.dropout = config.attention_dropout = config.activation_dropout = 0.0;
  config.torch_dtype = "float32";
  const fs::path dir = work / "model";
  fs::create_directories(dir);
  {
    std::ofstream file(dir / "config.json");
    file << core::model_config_to_json(config);
  }
  torch::manual_seed(o.seed);
  models::LoadOptions random;
  random.random_init = true;
  models::CausalLM model = models::load_causal_lm(dir.string(), random);
  models::save_causal_lm(model, dir);
  return dir;
}

json run_single(const Options& o, const fs::path& model_dir, const fs::path& work) {
  std::vector<json> dschat_rounds, torch_rounds;
  for (int64_t round = 0; round < o.rounds; ++round) {
    std::cerr << "[single] round " << round << ": dschat TrainingEngine, " << o.threads << " threads\n";
    at::set_num_threads(static_cast<int>(o.threads));
    {
      models::CausalLM model = load_for_training(model_dir.string());
      engine::TrainingEngine trainer(model.ptr(), engine_options(o, 0, o.batch, nullptr));
      const torch::Tensor ids = make_batch(o.seed, o.batch, o.seq, model->config().vocab_size);  // [B, T]
      json report = times_json(train_loop(model, trainer, ids, o.warmup, o.steps), o.batch * o.seq);
      report["impl"] = "dschat";
      report["stage"] = 0;
      report["threads_per_rank"] = at::get_num_threads();
      report["batch_checksum"] = batch_checksum(ids);
      dschat_rounds.push_back(report);
    }
    std::cerr << "[single] round " << round << ": PyTorch eager, " << o.threads << " threads\n";
    const fs::path peer_out = work / "peer_single.json";
    std::vector<std::string> argv = {o.python,    o.peer,   "--out",  peer_out.string(), "--batch",
                                     std::to_string(o.batch), "--threads", std::to_string(o.threads),
                                     "--adamw-impl", o.torch_adamw};
    for (const auto& arg : model_args(o, model_dir)) argv.push_back(arg);
    DSCHAT_CHECK(run_process(argv) == 0, Error, "the PyTorch peer failed");
    torch_rounds.push_back(read_json(peer_out));
  }
  const int64_t tokens = o.batch * o.seq;
  return {{"dschat", pool_rounds(dschat_rounds, tokens)}, {"pytorch", pool_rounds(torch_rounds, tokens)}};
}

json run_dp(const Options& o, const fs::path& model_dir, const fs::path& work) {
  std::map<std::string, std::vector<json>> rounds;
  for (int64_t round = 0; round < o.rounds; ++round) {
    for (int stage : {0, 2}) {
      std::cerr << "[dp] round " << round << ": dschat stage " << stage << ", " << o.dp_world << " ranks x 1 thread\n";
      const fs::path out = work / ("dschat_dp_stage" + std::to_string(stage) + ".json");
      std::vector<std::string> args = {"--rank-job", "dp", "--stage", std::to_string(stage), "--rank-out",
                                       out.string(), "--batch", std::to_string(o.batch), "--threads", "1"};
      for (const auto& arg : model_args(o, model_dir)) args.push_back(arg);
      launch_ranks(o.dp_world, args);
      rounds["dschat_stage" + std::to_string(stage)].push_back(read_json(out));
    }
    std::cerr << "[dp] round " << round << ": PyTorch DDP, " << o.dp_world << " ranks x 1 thread\n";
    const fs::path out = work / "peer_ddp.json";
    std::vector<std::string> argv = {o.python, "-m", "torch.distributed.run", "--nproc-per-node",
                                     std::to_string(o.dp_world), "--master-port", std::to_string(free_port()),
                                     o.peer, "--ddp", "--out", out.string(), "--batch", std::to_string(o.batch),
                                     "--threads", "1", "--adamw-impl", o.torch_adamw};
    for (const auto& arg : model_args(o, model_dir)) argv.push_back(arg);
    DSCHAT_CHECK(run_process(argv) == 0, Error, "torchrun (PyTorch DDP peer) failed");
    rounds["pytorch_ddp"].push_back(read_json(out));
  }
  json result = json::object();
  for (const auto& [name, runs] : rounds) result[name] = pool_rounds(runs, o.batch * o.seq);
  return result;
}

json run_memory(const Options& o, const fs::path& model_dir, const fs::path& work) {
  json result = json::array();
  for (int stage = 0; stage <= 3; ++stage) {
    std::cerr << "[memory] stage " << stage << ", " << o.mem_world << " ranks\n";
    const fs::path out = work / ("memory_stage" + std::to_string(stage) + ".json");
    launch_ranks(o.mem_world, {"--rank-job", "memory", "--stage", std::to_string(stage), "--rank-out", out.string(),
                               "--model-dir", model_dir.string(), "--mem-seq", std::to_string(o.mem_seq),
                               "--mem-steps", std::to_string(o.mem_steps), "--seed", std::to_string(o.seed)});
    result.push_back(read_json(out));
  }
  return result;
}

// ---- tables -------------------------------------------------------------------------------------

std::string fixed(double value, int digits) {
  std::ostringstream text;
  text << std::fixed << std::setprecision(digits) << value;
  return text.str();
}

std::string mib(int64_t bytes) { return fixed(static_cast<double>(bytes) / (1 << 20), 2); }

// "| name | step | forward | backward | optimizer | tokens/s | ratio |" for one report.
std::string timing_row(const std::string& name, const json& r, double reference_ms) {
  const json& m = r["median_ms"];
  const double step = m["step"].get<double>();
  return "| " + name + " | " + fixed(step, 1) + " | " + fixed(m["forward"].get<double>(), 1) + " | " +
         fixed(m["backward"].get<double>(), 1) + " | " + fixed(m["optimizer"].get<double>(), 1) + " | " +
         fixed(r["tokens_per_s"].get<double>(), 0) + " | " + fixed(reference_ms / step, 2) + " | " +
         fixed(m["cpu"].get<double>(), 0) + " |\n";
}

// Largest |a_i - b_i| over the steps both ran.
double max_loss_gap(const json& a, const json& b) {
  double gap = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    gap = std::max(gap, std::abs(a[i].get<double>() - b[i].get<double>()));
  }
  return gap;
}

std::string loss_line(const std::string& what, const json& a, const json& b) {
  const json& la = a["losses"];
  const json& lb = b["losses"];
  return what + ": loss at step 0 " + fixed(la.front().get<double>(), 5) + " vs " + fixed(lb.front().get<double>(), 5) +
         ", at step " + std::to_string(la.size() - 1) + " " + fixed(la.back().get<double>(), 5) + " vs " +
         fixed(lb.back().get<double>(), 5) + " (largest gap " + fixed(max_loss_gap(la, lb), 6) +
         "); batch checksums " + (a["batch_checksum"] == b["batch_checksum"] ? "equal" : "DIFFER") + "\n";
}

std::string markdown(const Options& o, const json& report) {
  std::ostringstream md;
  auto header = [](const std::string& reference) {
    return "| | ms / step | forward + loss | backward | optimizer step | tokens/s | vs " + reference +
           " | CPU ms / step |\n|---|---|---|---|---|---|---|---|\n";
  };
  md << "OPT, hidden " << o.hidden << ", " << o.layers << " layers, " << o.heads << " heads, ffn " << o.ffn
     << ", vocab " << o.vocab << " (" << report["num_params"].get<int64_t>() << " parameters, fp32, dropout 0); batch "
     << o.batch << " x " << o.seq << " tokens; AdamW lr " << o.lr << ", betas (0.9, 0.95), weight decay 0. Medians "
     << "(ms) of " << o.rounds * o.steps << " timed steps: " << o.rounds << " alternating rounds of " << o.steps
     << " steps after " << o.warmup << " warmup steps.\n\n";
  if (report.contains("single")) {
    const json& s = report["single"];
    const double torch_ms = s["pytorch"]["median_ms"]["step"].get<double>();
    md << "### One process, " << o.threads << " threads\n\n" << header("PyTorch");
    md << timing_row("dschat TrainingEngine (stage 0)", s["dschat"], torch_ms);
    md << timing_row("PyTorch eager (transformers + torch.optim.AdamW, " + s["pytorch"]["adamw"].get<std::string>() + ")",
                     s["pytorch"], torch_ms);
    md << "\n" << loss_line("dschat vs PyTorch", s["dschat"], s["pytorch"]) << "\n";
  }
  if (report.contains("dp")) {
    const json& d = report["dp"];
    const double ddp_ms = d["pytorch_ddp"]["median_ms"]["step"].get<double>();
    md << "### " << o.dp_world << " ranks over Gloo, 1 thread each, global batch " << o.batch << "\n\n"
       << header("DDP");
    md << timing_row("dschat stage 0 (dist::launch ranks)", d["dschat_stage0"], ddp_ms);
    md << timing_row("dschat stage 2 (dist::launch ranks)", d["dschat_stage2"], ddp_ms);
    md << timing_row("PyTorch DDP (torchrun, gloo)", d["pytorch_ddp"], ddp_ms);
    md << "\n" << loss_line("dschat stage 0 vs DDP", d["dschat_stage0"], d["pytorch_ddp"]);
    md << loss_line("dschat stage 2 vs DDP", d["dschat_stage2"], d["pytorch_ddp"]) << "\n";
  }
  if (report.contains("memory")) {
    const json& mem = report["memory"];
    md << "### Per-rank bytes, " << o.mem_world << " ranks (MiB; measured / theoretical_footprint)\n\n"
       << "| stage | parameters (after step) | gradients (after backward) | optimizer (after step) | total | "
          "ranks equal | peak RSS, rank 0 |\n|---|---|---|---|---|---|---|\n";
    for (const json& s : mem) {
      const json& theory = s["theoretical"];
      const json& r0 = s["per_rank"][0];
      bool equal = true;
      for (const json& r : s["per_rank"]) {
        equal = equal && r["after_step"]["parameters"] == r0["after_step"]["parameters"] &&
                r["after_backward"]["gradients"] == r0["after_backward"]["gradients"] &&
                r["after_step"]["optimizer"] == r0["after_step"]["optimizer"];
      }
      auto bytes = [](const json& value) { return value.get<int64_t>(); };
      const int64_t params = bytes(r0["after_step"]["parameters"]), grads = bytes(r0["after_backward"]["gradients"]),
                    optim = bytes(r0["after_step"]["optimizer"]);
      md << "| " << s["stage"].get<int>() << " | " << mib(params) << " / " << mib(bytes(theory["parameters"]))
         << " | " << mib(grads) << " / " << mib(bytes(theory["gradients"])) << " | " << mib(optim) << " / "
         << mib(bytes(theory["optimizer"])) << " | " << mib(params + grads + optim) << " / "
         << mib(bytes(theory["total"])) << " | " << (equal ? "yes" : "no") << " | " << mib(bytes(r0["peak_rss"]))
         << " |\n";
    }
    md << "\n";
  }
  return md.str();
}

int run_driver(const Options& o) {
  std::vector<std::string> parts;
  {
    std::stringstream list(o.parts);
    for (std::string part; std::getline(list, part, ',');) {
      DSCHAT_CHECK(part == "single" || part == "dp" || part == "memory", InvalidArgument, "--parts: unknown part '",
                   part, "' (single, dp, memory)");
      parts.push_back(part);
    }
  }
  auto wanted = [&](const std::string& part) { return std::find(parts.begin(), parts.end(), part) != parts.end(); };
  fs::path work = o.work_dir;
  if (work.empty()) {
    std::string pattern = (fs::temp_directory_path() / "dschat_train_step_XXXXXX").string();
    DSCHAT_CHECK(::mkdtemp(pattern.data()) != nullptr, IoError, "mkdtemp failed");
    work = pattern;
  }
  fs::create_directories(work);
  const fs::path model_dir = save_model(o, work);
  int64_t num_params = 0;
  for (const auto& param : load_for_training(model_dir.string())->parameters()) num_params += param.numel();

  json report = {{"model",
                  {{"architecture", "opt"}, {"hidden", o.hidden}, {"layers", o.layers}, {"heads", o.heads},
                   {"ffn", o.ffn}, {"vocab", o.vocab}, {"dtype", "fp32"}, {"dropout", 0.0}, {"init", "normal(0, 0.02)"}}},
                 {"num_params", num_params},
                 {"batch", o.batch}, {"seq", o.seq}, {"steps", o.steps}, {"warmup", o.warmup}, {"rounds", o.rounds},
                 {"threads", o.threads}, {"dp_world", o.dp_world}, {"mem_world", o.mem_world},
                 {"mem_seq", o.mem_seq}, {"optimizer", {{"lr", o.lr}, {"betas", {0.9, 0.95}}, {"eps", 1e-8},
                                                        {"weight_decay", 0.0}}}};
  if (wanted("single")) report["single"] = run_single(o, model_dir, work);
  if (wanted("dp")) report["dp"] = run_dp(o, model_dir, work);
  if (wanted("memory")) report["memory"] = run_memory(o, model_dir, work);
  if (!o.out.empty()) write_json(o.out, report);
  std::cout << markdown(o, report);
  if (!o.keep_work_dir && o.work_dir.empty()) remove_tree(work);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dschat training-step benchmark (dschat TrainingEngine vs PyTorch eager / DDP, CPU)"};
  Options o;
  app.add_option("--out", o.out, "Write the results as JSON here");
  app.add_option("--parts", o.parts, "Comma-separated: single, dp, memory")->capture_default_str();
  app.add_option("--batch", o.batch, "Global batch (rows)")->capture_default_str();
  app.add_option("--seq", o.seq, "Tokens per row")->capture_default_str();
  app.add_option("--steps", o.steps, "Timed steps per round")->capture_default_str();
  app.add_option("--warmup", o.warmup, "Untimed steps first (every round)")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Alternating runs of every implementation; the timed steps are pooled")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "Intra-op threads of the one-process runs")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the weights and the batch")->capture_default_str();
  app.add_option("--vocab", o.vocab)->capture_default_str();
  app.add_option("--hidden", o.hidden)->capture_default_str();
  app.add_option("--layers", o.layers)->capture_default_str();
  app.add_option("--heads", o.heads)->capture_default_str();
  app.add_option("--ffn", o.ffn)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--dp-world", o.dp_world, "Ranks of the data-parallel runs")->capture_default_str();
  app.add_option("--mem-world", o.mem_world, "Ranks of the memory runs")->capture_default_str();
  app.add_option("--mem-seq", o.mem_seq, "Tokens per row in the memory runs (one row per rank)")->capture_default_str();
  app.add_option("--mem-steps", o.mem_steps, "Steps of each memory run")->capture_default_str();
  app.add_option("--python", o.python, "Python with torch and transformers")->capture_default_str();
  app.add_option("--peer", o.peer, "benchmarks/train_step_peer.py")->capture_default_str();
  app.add_option("--torch-adamw", o.torch_adamw, "Peer's AdamW: default, foreach, fused, for-loop")->capture_default_str();
  app.add_option("--work-dir", o.work_dir, "Where the checkpoint and the reports go (default: a temporary dir)");
  app.add_flag("--keep-work-dir", o.keep_work_dir);
  app.add_option("--rank-job", o.rank_job, "internal: dp | memory")->group("");
  app.add_option("--model-dir", o.model_dir)->group("");
  app.add_option("--rank-out", o.rank_out)->group("");
  app.add_option("--stage", o.stage)->group("");
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.rank_job == "dp") return run_dp_rank(o);
    if (o.rank_job == "memory") return run_memory_rank(o);
    DSCHAT_CHECK(o.rank_job.empty(), InvalidArgument, "--rank-job: dp or memory, got '", o.rank_job, "'");
    return run_driver(o);
  } catch (const std::exception& e) {
    std::cerr << "dschat_train_step_bench: " << e.what() << "\n";
    return 1;
  }
}
