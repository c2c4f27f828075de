#pragma once
// A profile of one phase of a benchmark, through LibTorch's Kineto profiler: on a GPU, the device's
// kernels and copies summed by name, the time the device was busy (the union of their intervals)
// against the phase's wall time, so a host-bound phase shows as idle GPU time; on the CPU, the
// operators' inclusive times (nested operators each count, so they do not add up to the wall).
//   KernelProfile profile(device);   // starts profiling
//   run_phase();
//   nlohmann::json summary = profile.finish(20);   // stops; the 20 largest entries
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "bench_device.h"

namespace dschat {
namespace bench {

class KernelProfile {
 public:
  explicit KernelProfile(const torch::Device& device) : device_(device) {
    namespace impl = torch::profiler::impl;
    std::set<impl::ActivityType> activities = {impl::ActivityType::CPU};
    if (device_.is_cuda()) activities.insert(impl::ActivityType::CUDA);
    const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    sync();
    start_ = std::chrono::steady_clock::now();
    torch::autograd::profiler::enableProfiler(config, activities);
  }

  nlohmann::json finish(size_t top) {
    synchronize(device_);
    const double wall_ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start_).count();
    const std::unique_ptr<torch::autograd::profiler::ProfilerResult> result = torch::autograd::profiler::disableProfiler();
    const c10::DeviceType wanted = device_.is_cuda() ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
    std::map<std::string, std::pair<double, int64_t>> by_name;  // name -> (ns, count)
    std::vector<std::pair<uint64_t, uint64_t>> intervals;
    for (const auto& event : result->events()) {
      if (event.deviceType() != wanted || event.durationNs() == 0) continue;
      auto& entry = by_name[event.name()];
      entry.first += static_cast<double>(event.durationNs());
      entry.second += 1;
      intervals.emplace_back(event.startNs(), event.endNs());
    }
    std::vector<std::pair<std::string, std::pair<double, int64_t>>> sorted(by_name.begin(), by_name.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    nlohmann::json entries = nlohmann::json::array();
    for (size_t i = 0; i < sorted.size() && i < top; ++i) {
      entries.push_back({{"name", sorted[i].first}, {"ms", sorted[i].second.first / 1e6}, {"count", sorted[i].second.second}});
    }
    const double busy_ns = union_ns(intervals);
    return {{"wall_ms", wall_ns / 1e6},
            {"device_busy_ms", device_.is_cuda() ? busy_ns / 1e6 : -1.0},
            {"device_idle_fraction", device_.is_cuda() && wall_ns > 0 ? 1.0 - busy_ns / wall_ns : -1.0},
            {"what", device_.is_cuda() ? "device kernels and copies" : "CPU operators, inclusive"},
            {"top", entries}};
  }

 private:
  // Length of the union of [start, end) intervals.
  static double union_ns(std::vector<std::pair<uint64_t, uint64_t>> intervals) {
    std::sort(intervals.begin(), intervals.end());
    double total = 0;
    uint64_t start = 0, end = 0;
    bool open = false;
    for (const auto& [s, e] : intervals) {
      if (open && s <= end) {
        end = std::max(end, e);
        continue;
      }
      if (open) total += static_cast<double>(end - start);
      start = s, end = e, open = true;
    }
    if (open) total += static_cast<double>(end - start);
    return total;
  }

  torch::Device device_;
  std::chrono::steady_clock::time_point start_;
};

/// Prints a profile's largest entries as a markdown table.
inline void print_profile(const std::string& phase, const nlohmann::json& p) {
  std::printf("\nprofile of %s: wall %.1f ms", phase.c_str(), p["wall_ms"].get<double>());
  if (p["device_busy_ms"].get<double>() >= 0) {
    std::printf(", device busy %.1f ms (idle %.1f%%)", p["device_busy_ms"].get<double>(),
                100.0 * p["device_idle_fraction"].get<double>());
  }
  std::printf(" (%s)\n| name | ms | count |\n|---|---|---|\n", p["what"].get<std::string>().c_str());
  for (const auto& e : p["top"]) {
    std::string name = e["name"].get<std::string>();
    if (name.size() > 90) name = name.substr(0, 87) + "...";
    std::printf("| %s | %.2f | %lld |\n", name.c_str(), e["ms"].get<double>(), static_cast<long long>(e["count"].get<int64_t>()));
  }
}

}  // namespace bench
}  // namespace dschat
