#pragma once
// The token sequences of one training phase, stored flat: every item holds `fields` sequences
// (1 for SFT rows, prompts and unsupervised blocks; 2 for reward pairs: chosen, rejected) plus,
// for SFT rows and reward pairs, how many leading tokens are the prompt. Unpadded: batches are
// padded when collated.
//
// save() writes a self-describing binary file atomically; load() maps it (read-only pages shared
// by every process on the node) instead of copying it into each process's memory.
//
// File layout (little endian; sections 8-byte aligned):
//   "DSCHTOK1" | u64 header bytes | header JSON (version, kind, items, fields, tokens, metadata)
//   | pad | i64 offsets[items * fields + 1] | i32 prompt_lengths[items] | pad | i32 tokens[tokens]
// Header version 2 (kTokenizedFileVersion): reward pairs carry their prompt lengths. Version 1
// files (no "version" key) have the same layout but zeros there, so load() refuses version-1
// reward files (the cache then rebuilds them) and reads the other kinds unchanged.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

namespace dschat {
namespace io {
class MappedFile;
}
namespace data {

enum class PhaseKind { kSft = 1, kReward = 2, kPrompt = 3 };

/// The "version" save() writes into the file header.
constexpr int64_t kTokenizedFileVersion = 2;

struct TokenSpan {
  const int32_t* data = nullptr;
  int64_t size = 0;
  const int32_t* begin() const { return data; }
  const int32_t* end() const { return data + size; }
};

class TokenizedDataset {
 public:
  explicit TokenizedDataset(PhaseKind kind = PhaseKind::kSft);

  PhaseKind kind() const { return kind_; }
  int fields() const { return kind_ == PhaseKind::kReward ? 2 : 1; }
  int64_t size() const { return items_; }
  int64_t num_tokens() const { return num_tokens_; }

  /// Sequence `field` of `item` (0 = chosen/the sequence, 1 = rejected). Throws
  /// core::InvalidArgument when out of range.
  TokenSpan sequence(int64_t item, int field = 0) const;
  /// The number of leading prompt tokens of `item`: real tokens, no padding (items are stored
  /// unpadded). What create_prompt_dataset stores:
  ///   SFT     where the prompt ends inside PC (common prefix of P's and PC's ids);
  ///   reward  the token count of P tokenised alone with the pair's tokenizer and max_seq_len
  ///           truncation (so at most max_seq_len), the same for the chosen and rejected row;
  ///           both rows start with exactly those tokens unless the tokenizer merges across the
  ///           prompt/answer boundary;
  ///   0 for prompts (phase 3), unsupervised blocks and records without P.
  /// Throws core::InvalidArgument when out of range.
  int32_t prompt_length(int64_t item) const;

  /// Appends one item: fields() sequences of ids (each < 2^31) and its prompt length (>= 0).
  void append(const std::vector<const std::vector<int64_t>*>& sequences, int32_t prompt_length = 0);

  /// The items of `parts` (concatenated in order) taken in `order` (indices into the concatenation):
  /// DeepSpeed-Chat's ConcatDataset + Subset(shuffle_idx) for blending.
  static TokenizedDataset concatenate(const std::vector<const TokenizedDataset*>& parts,
                                      const std::vector<int64_t>& order);

  /// Free-form facts stored with the data (how it was made, counts).
  nlohmann::json& metadata() { return metadata_; }
  const nlohmann::json& metadata() const { return metadata_; }

  /// Writes the file atomically (temp file + rename). Throws core::IoError naming it.
  void save(const std::filesystem::path& file) const;
  /// Maps a file written by save(). Throws core::IoError / core::FormatError naming it (bad magic,
  /// truncated, inconsistent offsets, a newer version, or a version-1 reward file, whose pairs
  /// have no prompt lengths).
  static TokenizedDataset load(const std::filesystem::path& file);

 private:
  PhaseKind kind_;
  int64_t items_ = 0;
  int64_t num_tokens_ = 0;
  // Owned vectors while building; after load(), views into `mapping_` (copies share the mapping).
  std::vector<int64_t> offsets_vec_{0};  // [items * fields + 1]
  std::vector<int32_t> prompt_vec_;      // [items]
  std::vector<int32_t> tokens_vec_;      // [num_tokens]
  std::shared_ptr<io::MappedFile> mapping_;
  const int64_t* mapped_offsets_ = nullptr;         // [items * fields + 1]
  const int32_t* mapped_prompt_lengths_ = nullptr;  // [items]
  const int32_t* mapped_tokens_ = nullptr;          // [num_tokens]
  nlohmann::json metadata_ = nlohmann::json::object();

  const int64_t* offsets() const { return mapping_ ? mapped_offsets_ : offsets_vec_.data(); }
  const int32_t* prompt_lengths() const { return mapping_ ? mapped_prompt_lengths_ : prompt_vec_.data(); }
  const int32_t* tokens() const { return mapping_ ? mapped_tokens_ : tokens_vec_.data(); }
};

}  // namespace data
}  // namespace dschat
