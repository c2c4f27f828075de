#pragma once
// Where fusing LoRA for generation keeps the exact unfused weights it restores at train()
// (HybridEngineOptions::lora_fuse_backup; "lora_fuse_backup" in a step-3 or critic-free block).
#include <optional>
#include <string>

namespace dschat {
namespace hybrid {

enum class LoraFuseBackup {
  kAuto,    // the device when its free memory holds the backups twice over, else the host (a CPU model: the CPU)
  kDevice,  // the weights' own device: no host round trip per switch
  kHost,    // the CPU: frees device memory for the KV cache
};

/// The config name: auto | device | host.
const char* lora_fuse_backup_name(LoraFuseBackup backup);
/// The value a config name stands for, or nullopt.
std::optional<LoraFuseBackup> lora_fuse_backup_named(const std::string& name);

}  // namespace hybrid
}  // namespace dschat
