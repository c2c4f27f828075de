#pragma once
// Precompiled header for libdschat, the CLI and the tests: the LibTorch frontend dominates
// compile time, so it is parsed once per target.
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>
