// step_overview: the start-of-step table (include/dschat/plan/step_overview.h).
#include "dschat/plan/step_overview.h"

#include <cstdio>
#include <sstream>

#include "dschat/rlhf/config/pipeline_config.h"
#include "plan/report_format.h"

namespace dschat {
namespace plan {
namespace {

std::string millions(int64_t n) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1fM", static_cast<double>(n) / 1e6);
  return text;
}

std::string cell(std::string text, size_t width) { return padded(std::move(text), width) + " "; }

// Offload means different things for trained and frozen models (docs/config.md).
std::string offload_text(const ModelSummary& m) {
  if (!m.offload) return "no";
  return m.trained ? "optimizer" : "parameters";
}

}  // namespace

StepOverview step_overview(const StepPlan& step, const Hardware& hardware, const std::string& device) {
  StepOverview overview;
  const int64_t world = hardware.world_size();
  std::ostringstream out;
  out << "step" << step.step << " (" << rlhf::step_kind_name(step.kind) << ") on " << device << ", " << world
      << (world == 1 ? " rank" : " ranks") << ":\n";
  out << "  " << cell("role", 13) << cell("parameters", 10) << cell("trainable", 10) << cell("dtype", 5)
      << cell("ZeRO", 4) << cell("offload", 10) << cell("LoRA", 5) << cell("grad-ckpt", 9)
      << cell("device", 7) << cell("GiB/rank", 9) << "model\n";
  nlohmann::json models = nlohmann::json::array();
  for (const ModelSummary& m : step.models) {
    const std::string lora = m.lora_dim > 0 ? std::to_string(m.lora_dim) : "-";
    // On the CPU the "host" and the device are the same memory.
    const int64_t rank_bytes = m.resident_device_bytes + (hardware.cpu ? m.resident_host_bytes : 0);
    std::string memory = gib_text(rank_bytes);
    if (!hardware.cpu && m.resident_host_bytes > 0) memory += " +" + gib_text(m.resident_host_bytes) + " host";
    out << "  " << cell(m.role, 13) << cell(millions(m.parameters), 10) << cell(millions(m.trainable), 10)
        << cell(rlhf::step_dtype_name(m.dtype), 5) << cell(std::to_string(m.zero_stage), 4)
        << cell(offload_text(m), 10) << cell(lora, 5) << cell(m.gradient_checkpointing ? "yes" : "no", 9)
        << cell(device, 7) << cell(memory, 9) << m.source << "\n";
    models.push_back({{"role", m.role},
                      {"model", m.source},
                      {"shape", m.shape},
                      {"parameters", m.parameters},
                      {"trainable", m.trainable},
                      {"dtype", rlhf::step_dtype_name(m.dtype)},
                      {"zero_stage", m.zero_stage},
                      {"offload", offload_text(m)},
                      {"lora_dim", m.lora_dim},
                      {"gradient_checkpointing", m.gradient_checkpointing},
                      {"device", device},
                      {"planned_resident_bytes_per_rank", rank_bytes},
                      {"planned_host_bytes_per_rank", hardware.cpu ? 0 : m.resident_host_bytes}});
  }
  out << "  planned per rank: resident " << gib_text(step.resident_bytes) << " GiB, peak " << gib_text(step.peak_bytes)
      << " GiB (in '" << step.peak_phase << "') of " << gib_text(step.usable_bytes) << " GiB usable";
  if (!hardware.cpu && step.host_bytes > 0) out << "; host " << gib_text(step.host_bytes) << " GiB";
  out << " (`dschat plan` itemises it)\n";
  overview.text = out.str();
  overview.json = {{"step", step.step},
                   {"kind", rlhf::step_kind_name(step.kind)},
                   {"device", device},
                   {"world_size", world},
                   {"models", models},
                   {"planned_resident_bytes_per_rank", step.resident_bytes},
                   {"planned_peak_bytes_per_rank", step.peak_bytes},
                   {"planned_peak_phase", step.peak_phase},
                   {"usable_bytes_per_rank", step.usable_bytes},
                   {"planned_host_bytes_per_rank", hardware.cpu ? 0 : step.host_bytes}};
  return overview;
}

}  // namespace plan
}  // namespace dschat
