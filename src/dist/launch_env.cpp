#include "dschat/dist/launch_env.h"

#include <vector>

#include "core/env.h"
#include "dschat/core/error.h"

namespace dschat {
namespace dist {
namespace {

constexpr int kDefaultMasterPort = 29500;  // DeepSpeed's (and torchrun's) default

// The variable names one launcher uses; error messages quote them so the user knows which export
// to fix.
struct LauncherVariables {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr LauncherVariables kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr LauncherVariables kOpenMpi{"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr LauncherVariables kSlurm{"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                   "SLURM_NTASKS_PER_NODE"};

int64_t parse_integer(const char* name, const std::string& text) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DSCHAT_CHECK(used == text.size() && used > 0, ConfigError, "environment variable ", name, "='", text,
               "' is not an integer");
  return value;
}

class VariableReader {
 public:
  explicit VariableReader(const LaunchEnv::Lookup& lookup) : lookup_(lookup) {}

  bool has(const char* name) const { return lookup_(name).has_value(); }
  std::optional<std::string> text(const char* name) const { return lookup_(name); }
  std::optional<int64_t> integer(const char* name) const {
    auto value = lookup_(name);
    if (!value) return std::nullopt;
    return parse_integer(name, *value);
  }

 private:
  const LaunchEnv::Lookup& lookup_;
};

// SLURM_TASKS_PER_NODE lists task counts per node in run-length form, "2(x3),1" = 2,2,2,1; the
// entry of node `node_id` is the local world size there.
int64_t slurm_tasks_on_node(const std::string& spec, int64_t node_id) {
  int64_t node = 0;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    std::string item = spec.substr(pos, end - pos);
    int64_t repeats = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      DSCHAT_CHECK(item.back() == ')', ConfigError, "environment variable SLURM_TASKS_PER_NODE='", spec,
                   "' is malformed: expected counts like '4(x2),3'");
      repeats = parse_integer("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    int64_t count = parse_integer("SLURM_TASKS_PER_NODE", item);
    if (node_id < node + repeats) return count;
    node += repeats;
    pos = end + 1;
  }
  DSCHAT_THROW(ConfigError, "environment variable SLURM_TASKS_PER_NODE='", spec, "' lists ", node,
               " nodes but SLURM_NODEID is ", node_id);
}

// First host of a Slurm node list: "gpu[07-09,12],cpu1" -> "gpu07". Rank 0 runs there under
// Slurm's default block distribution.
std::string first_slurm_host(const std::string& nodelist) {
  std::string host;
  int depth = 0;
  bool took_range_start = false;
  for (char c : nodelist) {
    if (depth == 0 && c == ',') break;
    if (c == '[') {
      ++depth;
      took_range_start = false;
    } else if (c == ']') {
      --depth;
    } else if (depth == 0) {
      host += c;
    } else if (!took_range_start) {
      if (c == '-' || c == ',') {
        took_range_start = true;
      } else {
        host += c;
      }
    }
  }
  return host;
}

bool is_single_node(const LaunchEnv& env) { return env.local_world_size == env.world_size; }

void read_ranks(const VariableReader& vars, const LauncherVariables& names, LaunchEnv& env) {
  auto rank = vars.integer(names.rank);
  auto world_size = vars.integer(names.world_size);
  if (!world_size && std::string(names.source) == "slurm") world_size = vars.integer("SLURM_NPROCS");
  DSCHAT_CHECK(rank.has_value(), ConfigError, "environment variable ", names.world_size, "='",
               vars.text(names.world_size).value_or(""), "' is set but ", names.rank, " is not");
  DSCHAT_CHECK(world_size.has_value(), ConfigError, "environment variable ", names.rank, "='", *rank,
               "' is set but ", names.world_size, " is not");
  DSCHAT_CHECK(*world_size >= 1, ConfigError, "environment variable ", names.world_size, "='", *world_size,
               "' must be at least 1");
  DSCHAT_CHECK(*rank >= 0 && *rank < *world_size, ConfigError, "environment variable ", names.rank, "='", *rank,
               "' is out of range for ", names.world_size, "=", *world_size, " (expected 0..", *world_size - 1,
               ")");
  env.rank = *rank;
  env.world_size = *world_size;
  env.source = names.source;
}

// Per-node size: the launcher's own variable, else a launcher-specific fallback, else one node.
void read_local_ranks(const VariableReader& vars, const LauncherVariables& names, LaunchEnv& env) {
  const char* local_world_name = names.local_world_size;
  std::optional<int64_t> local_world_size = vars.integer(names.local_world_size);
  if (!local_world_size && env.source == "torchrun" && vars.has("LOCAL_SIZE")) {
    local_world_name = "LOCAL_SIZE";  // DeepSpeed's own launcher
    local_world_size = vars.integer("LOCAL_SIZE");
  }
  if (!local_world_size && env.source == "slurm" && vars.has("SLURM_TASKS_PER_NODE")) {
    local_world_name = "SLURM_TASKS_PER_NODE";
    local_world_size = slurm_tasks_on_node(*vars.text("SLURM_TASKS_PER_NODE"),
                                           vars.integer("SLURM_NODEID").value_or(0));
  }
  if (!local_world_size) local_world_size = env.world_size;
  DSCHAT_CHECK(*local_world_size >= 1 && *local_world_size <= env.world_size, ConfigError,
               "environment variable ", local_world_name, "='", *local_world_size, "' is out of range for ",
               names.world_size, "=", env.world_size, " (expected 1..", env.world_size, ")");
  env.local_world_size = *local_world_size;

  auto local_rank = vars.integer(names.local_rank);
  env.local_rank = local_rank.value_or(env.rank % env.local_world_size);
  DSCHAT_CHECK(env.local_rank >= 0 && env.local_rank < env.local_world_size, ConfigError,
               "environment variable ", names.local_rank, "='", env.local_rank, "' is out of range for ",
               local_world_name, "=", env.local_world_size, " (expected 0..", env.local_world_size - 1, ")");
}

void read_master(const VariableReader& vars, LaunchEnv& env) {
  if (auto addr = vars.text("MASTER_ADDR")) {
    env.master_addr = *addr;
  } else if (is_single_node(env)) {
    env.master_addr = "127.0.0.1";
  } else if (env.source == "slurm" &&
             (vars.has("SLURM_STEP_NODELIST") || vars.has("SLURM_JOB_NODELIST"))) {
    auto nodelist = vars.text("SLURM_STEP_NODELIST");
    if (!nodelist) nodelist = vars.text("SLURM_JOB_NODELIST");
    env.master_addr = first_slurm_host(*nodelist);
  } else {
    DSCHAT_THROW(ConfigError, "environment variable MASTER_ADDR is not set, but the ", env.source,
                 " job spans several nodes (world size ", env.world_size, ", ", env.local_world_size,
                 " on this node): export MASTER_ADDR=<host of rank 0>");
  }
  auto port = vars.integer("MASTER_PORT").value_or(kDefaultMasterPort);
  DSCHAT_CHECK(port >= 1 && port <= 65535, ConfigError, "environment variable MASTER_PORT='", port,
               "' is out of range (expected 1..65535)");
  env.master_port = static_cast<int>(port);
  env.socket_ifname = vars.text("GLOO_SOCKET_IFNAME").value_or("");
}

}  // namespace

LaunchEnv LaunchEnv::from_lookup(const Lookup& lookup) {
  VariableReader vars(lookup);
  LaunchEnv env;
  const LauncherVariables* launcher = nullptr;
  if (vars.has(kTorchrun.rank) || vars.has(kTorchrun.world_size)) {
    launcher = &kTorchrun;
  } else if (vars.has(kOpenMpi.rank) || vars.has(kOpenMpi.world_size)) {
    launcher = &kOpenMpi;
  } else if (vars.has(kSlurm.rank)) {
    // srun exports SLURM_PROCID per task; SLURM_NTASKS alone only describes the allocation.
    launcher = &kSlurm;
  }
  if (launcher != nullptr) {
    read_ranks(vars, *launcher, env);
    read_local_ranks(vars, *launcher, env);
    env.store_served_by_agent =
        launcher == &kTorchrun && vars.text("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  }
  read_master(vars, env);
  return env;
}

LaunchEnv LaunchEnv::from_environment() {
  return from_lookup([](const char* name) { return core::read_string_from_env(name); });
}

}  // namespace dist
}  // namespace dschat
