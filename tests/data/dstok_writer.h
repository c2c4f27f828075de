#pragma once
// Writes .dstok files the way older builds did, for tests that check they are read or refused.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "dschat/data/tokenized_dataset.h"

namespace dschat {
namespace testing {

/// `d` as a file of header version `version` (no "version" key for 1, as version-1 builds wrote
/// it); reward pairs of a version-1 file hold zeros where the prompt lengths are. Written beside
/// `file` and renamed over it, so a mapping of the file it replaces stays valid.
inline void write_dstok(const std::filesystem::path& file, const data::TokenizedDataset& d, int64_t version) {
  nlohmann::json header = {{"kind", static_cast<int>(d.kind())}, {"items", d.size()}, {"fields", d.fields()},
                           {"tokens", d.num_tokens()},           {"metadata", d.metadata()}};
  if (version > 1) header["version"] = version;
  const std::string header_text = header.dump();
  std::string bytes = "DSCHTOK1";
  auto put = [&](const void* data, size_t n) { bytes.append(static_cast<const char*>(data), n); };
  auto pad = [&] { bytes.append((8 - bytes.size() % 8) % 8, '\0'); };  // sections are 8-byte aligned
  const uint64_t header_bytes = header_text.size();
  put(&header_bytes, sizeof(header_bytes));
  bytes += header_text;
  pad();
  int64_t offset = 0;
  put(&offset, sizeof(offset));
  for (int64_t i = 0; i < d.size(); ++i) {
    for (int field = 0; field < d.fields(); ++field) {
      offset += d.sequence(i, field).size;
      put(&offset, sizeof(offset));
    }
  }
  for (int64_t i = 0; i < d.size(); ++i) {
    const int32_t length = version == 1 && d.kind() == data::PhaseKind::kReward ? 0 : d.prompt_length(i);
    put(&length, sizeof(length));
  }
  pad();
  for (int64_t i = 0; i < d.size(); ++i) {
    for (int field = 0; field < d.fields(); ++field) {
      const data::TokenSpan span = d.sequence(i, field);
      put(span.data, sizeof(int32_t) * static_cast<size_t>(span.size));
    }
  }
  const std::filesystem::path temp = file.string() + ".old";
  std::ofstream(temp, std::ios::binary) << bytes;
  std::filesystem::rename(temp, file);
}

}  // namespace testing
}  // namespace dschat
