// format_plan / plan_to_json: what `dschat plan` prints.
#include <cstdio>
#include <map>
#include <sstream>

#include "dschat/plan/step_plan.h"
#include "plan/report_format.h"

namespace dschat {
namespace plan {
namespace {

std::string duration(double seconds) {
  if (seconds < 0) return "unknown";
  char text[48];
  if (seconds < 120) {
    std::snprintf(text, sizeof(text), "%.1f s", seconds);
  } else if (seconds < 7200) {
    std::snprintf(text, sizeof(text), "%.1f min", seconds / 60);
  } else if (seconds < 172800) {
    std::snprintf(text, sizeof(text), "%.1f h", seconds / 3600);
  } else {
    std::snprintf(text, sizeof(text), "%.1f days", seconds / 86400);
  }
  return text;
}

std::string count(int64_t n) {
  char text[32];
  if (n >= 1000000000) {
    std::snprintf(text, sizeof(text), "%.2fB", n / 1e9);
  } else if (n >= 1000000) {
    std::snprintf(text, sizeof(text), "%.1fM", n / 1e6);
  } else {
    std::snprintf(text, sizeof(text), "%lld", static_cast<long long>(n));
  }
  return text;
}

}  // namespace

std::string format_plan(const PipelinePlan& plan) {
  const Hardware& hw = plan.options.hardware;
  std::ostringstream out;
  out << "hardware: " << hw.nodes << " node(s) x " << hw.gpus_per_node << " x " << hw.device.name << " ("
      << hw.device.memory_gib << " GiB, " << hw.device.peak_tflops << " TFLOP/s, " << hw.device.bandwidth_gbs
      << " GB/s), host " << hw.host_memory_gib << " GiB per node"
      << (hw.host_memory_note.empty() ? "" : " (" + hw.host_memory_note + ")") << "\n";
  out << "margin: " << plan.options.margin * 100 << "% of device memory kept free";
  if (plan.options.efficiency) {
    out << "; efficiency: training " << plan.options.efficiency->training << ", prefill "
        << plan.options.efficiency->prefill << ", decode bandwidth " << plan.options.efficiency->bandwidth << " ("
        << plan.options.efficiency->source << ")";
  }
  out << "\n";
  for (const StepPlan& s : plan.steps) {
    out << "\nstep" << s.step << " (" << rlhf::step_kind_name(s.kind) << ", config block \"" << s.block << "\"): "
        << (s.fits ? "fits" : "DOES NOT FIT: " + s.why_not) << "\n";
    for (const ModelSummary& m : s.models) {
      out << "  " << padded(m.role, 14) << count(m.parameters) << " parameters (" << count(m.trainable)
          << " trainable), ZeRO " << m.zero_stage << ", " << m.shape << "\n";
    }
    out << "  " << padded("model", 14) << padded("what", 62) << padded("phase", 24) << "device GiB  host GiB\n";
    for (const MemoryItem& item : s.items) {
      if (item.device_bytes == 0 && item.host_bytes == 0) continue;
      out << "  " << padded(item.model, 14) << padded(item.what, 62) << padded(item.phase.empty() ? "(resident)" : item.phase, 24)
          << padded(gib_text(item.device_bytes), 12) << gib_text(item.host_bytes) << "\n";
    }
    out << "  per rank: resident " << gib_text(s.resident_bytes) << " GiB + peak phase '" << s.peak_phase << "' = peak "
        << gib_text(s.peak_bytes) << " GiB of " << gib_text(s.usable_bytes) << " GiB usable; host " << gib_text(s.host_bytes)
        << " GiB of " << gib_text(s.host_usable_bytes) << " GiB\n";
    char flops[32];
    std::snprintf(flops, sizeof(flops), "%.3g", s.flops_per_step);
    out << "  time: " << flops << " FLOP per rank and step, " << duration(s.seconds_per_step) << " per step";
    if (s.steps >= 0) out << " x " << s.steps << " steps = " << duration(s.total_seconds);
    out << " (" << s.steps_note << ")\n";
  }
  out << "\ntotal: " << duration(plan.total_seconds()) << (plan.fits() ? "; every step fits\n" : "; some steps do not fit\n");
  if (!plan.suggestions.empty()) {
    out << "\nchanges that make it fit (best first; merge the JSON into --config):\n";
    for (const Suggestion& s : plan.suggestions) {
      out << "  - " << s.change << ": peak " << gib_text(s.peak_bytes) << " GiB, " << duration(s.seconds_per_step)
          << " per step\n    " << s.config_patch.dump() << "\n";
    }
  } else if (!plan.fits()) {
    out << "\nno change dschat knows makes it fit: use more GPUs or a smaller model\n";
  }
  return out.str();
}

nlohmann::json plan_to_json(const PipelinePlan& plan) {
  const Hardware& hw = plan.options.hardware;
  nlohmann::json j;
  j["hardware"] = {{"accelerator", hw.device.name},    {"memory_gib", hw.device.memory_gib},
                   {"peak_tflops", hw.device.peak_tflops}, {"bandwidth_gbs", hw.device.bandwidth_gbs},
                   {"gpus_per_node", hw.gpus_per_node}, {"nodes", hw.nodes},
                   {"host_memory_gib", hw.host_memory_gib}, {"host_memory_note", hw.host_memory_note}, {"cpu", hw.cpu}};
  j["margin"] = plan.options.margin;
  if (plan.options.efficiency) {
    j["efficiency"] = {{"training", plan.options.efficiency->training},
                       {"prefill", plan.options.efficiency->prefill},
                       {"bandwidth", plan.options.efficiency->bandwidth},
                       {"source", plan.options.efficiency->source}};
  }
  j["fits"] = plan.fits();
  j["total_seconds"] = plan.total_seconds();
  j["steps"] = nlohmann::json::array();
  for (const StepPlan& s : plan.steps) {
    nlohmann::json step = {{"step", s.step},
                           {"kind", rlhf::step_kind_name(s.kind)},
                           {"block", s.block},
                           {"fits", s.fits},
                           {"why_not", s.why_not},
                           {"resident_bytes", s.resident_bytes},
                           {"peak_bytes", s.peak_bytes},
                           {"peak_phase", s.peak_phase},
                           {"usable_bytes", s.usable_bytes},
                           {"host_bytes", s.host_bytes},
                           {"host_usable_bytes", s.host_usable_bytes},
                           {"flops_per_step", s.flops_per_step},
                           {"seconds_per_step", s.seconds_per_step},
                           {"steps", s.steps},
                           {"total_seconds", s.total_seconds},
                           {"steps_note", s.steps_note}};
    for (const ModelSummary& m : s.models) {
      step["models"].push_back({{"role", m.role},
                                {"shape", m.shape},
                                {"parameters", m.parameters},
                                {"trainable", m.trainable},
                                {"zero_stage", m.zero_stage}});
    }
    for (const MemoryItem& item : s.items) {
      step["items"].push_back({{"model", item.model},
                               {"what", item.what},
                               {"phase", item.phase},
                               {"device_bytes", item.device_bytes},
                               {"host_bytes", item.host_bytes}});
    }
    j["steps"].push_back(std::move(step));
  }
  j["suggestions"] = nlohmann::json::array();
  for (const Suggestion& s : plan.suggestions) {
    j["suggestions"].push_back({{"change", s.change},
                                {"config_patch", s.config_patch},
                                {"peak_bytes", s.peak_bytes},
                                {"seconds_per_step", s.seconds_per_step}});
  }
  return j;
}

}  // namespace plan
}  // namespace dschat
