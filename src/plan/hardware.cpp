#include "dschat/plan/hardware.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>
#include <thread>

#include "dschat/core/error.h"

namespace dschat {
namespace plan {
namespace {

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

void check_counts(int64_t gpus_per_node, int64_t nodes, double host_memory_gib) {
  DSCHAT_CHECK(gpus_per_node >= 1, InvalidArgument, "--gpus must be at least 1, got ", gpus_per_node);
  DSCHAT_CHECK(nodes >= 1, InvalidArgument, "--nodes must be at least 1, got ", nodes);
  DSCHAT_CHECK(host_memory_gib >= 0, InvalidArgument, "--host-memory must not be negative, got ", host_memory_gib);
}

}  // namespace

const std::vector<Accelerator>& accelerator_table() {
  // Vendor data sheets: dense tensor-core peak without sparsity; memory as the driver reports it.
  static const std::vector<Accelerator> table = {
      {"v100-16g", 16, 125, 900, "NVIDIA V100 SXM2 16 GB (fp16 tensor cores, no bf16)"},
      {"v100-32g", 32, 125, 900, "NVIDIA V100 SXM2 32 GB (fp16 tensor cores, no bf16)"},
      {"a6000", 48, 155, 768, "NVIDIA RTX A6000 48 GB"},
      {"a10g", 24, 125, 600, "NVIDIA A10G 24 GB"},
      {"l40s", 48, 362, 864, "NVIDIA L40S 48 GB"},
      {"rtx4090", 24, 165, 1008, "NVIDIA GeForce RTX 4090 24 GB (fp32 accumulation)"},
      {"a100-40g", 40, 312, 1555, "NVIDIA A100 SXM4 40 GB"},
      {"a100-80g", 80, 312, 2039, "NVIDIA A100 SXM4 80 GB"},
      {"h100-80g", 80, 989, 3350, "NVIDIA H100 SXM5 80 GB"},
      {"h200", 140, 989, 4800, "NVIDIA H200 SXM 141 GB (143,771 MiB reported)"},
      {"b200", 180, 2250, 8000, "NVIDIA B200 180 GB"},
  };
  return table;
}

Accelerator find_accelerator(const std::string& name) {
  const std::string key = lowercase(name);
  std::string known;
  for (const Accelerator& a : accelerator_table()) {
    if (a.name == key) return a;
    known += (known.empty() ? "" : ", ") + a.name;
  }
  DSCHAT_THROW(InvalidArgument, "--gpu: unknown accelerator '", name, "'; known: ", known,
               " (or give --gpu-memory GiB)");
}

double machine_memory_gib() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::istringstream fields(line.substr(9));
    double kib = 0;
    fields >> kib;
    return kib / (1024.0 * 1024.0);
  }
  return 0;
}

Accelerator accelerator_for_product(const std::string& product_name, double memory_gib) {
  const std::string product = lowercase(product_name);
  Accelerator match = find_accelerator("h100-80g");
  match.description = "assumed H100-class peak and bandwidth";
  for (const Accelerator& a : accelerator_table()) {
    const std::string family = a.name.substr(0, a.name.find('-'));
    if (!family.empty() && product.find(family) != std::string::npos) match = a;
  }
  match.name = product_name;
  match.memory_gib = memory_gib;
  return match;
}

Hardware hardware_for(const std::string& accelerator, int64_t gpus_per_node, int64_t nodes, double host_memory_gib) {
  check_counts(gpus_per_node, nodes, host_memory_gib);
  Hardware hardware;
  hardware.device = find_accelerator(accelerator);
  hardware.gpus_per_node = gpus_per_node;
  hardware.nodes = nodes;
  hardware.host_memory_gib = host_memory_gib > 0 ? host_memory_gib : machine_memory_gib();
  return hardware;
}

Hardware cpu_hardware(int64_t processes, double host_memory_gib) {
  check_counts(processes, 1, host_memory_gib);
  Hardware hardware;
  hardware.cpu = true;
  hardware.gpus_per_node = processes;
  hardware.host_memory_gib = host_memory_gib > 0 ? host_memory_gib : machine_memory_gib();
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  // An AVX2 core: two 8-wide fp32 FMA units at ~2.5 GHz; ~10 GB/s of DRAM bandwidth per core.
  // The ranks share the cores and the memory bus: each gets its share of both (a "device" is a rank).
  const double share = 1.0 / static_cast<double>(processes);
  hardware.device = {"cpu", hardware.host_memory_gib * share, cores * 0.08 * share, cores * 10.0 * share,
                     "this machine's CPU (cores, bandwidth and host memory shared by the ranks)"};
  return hardware;
}

}  // namespace plan
}  // namespace dschat
