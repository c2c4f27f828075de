#include "dschat/data/tokenized_dataset.h"

#include <cstring>
#include <limits>

#include "dschat/core/error.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace dschat {
namespace data {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'C', 'H', 'T', 'O', 'K', '1'};

size_t aligned8(size_t n) { return (n + 7) & ~size_t{7}; }

void write_padding(io::AtomicFileWriter& out, size_t written) {
  static const char zeros[8] = {};
  if (aligned8(written) != written) out.write(zeros, aligned8(written) - written);
}

}  // namespace

TokenizedDataset::TokenizedDataset(PhaseKind kind) : kind_(kind) {}

TokenSpan TokenizedDataset::sequence(int64_t item, int field) const {
  DSCHAT_CHECK(item >= 0 && item < items_ && field >= 0 && field < fields(), InvalidArgument,
               "tokenized dataset: item ", item, " field ", field, " out of range (", items_, " items, ", fields(),
               " fields)");
  const int64_t slot = item * fields() + field;
  const int64_t begin = offsets()[slot], end = offsets()[slot + 1];
  return TokenSpan{tokens() + begin, end - begin};
}

int32_t TokenizedDataset::prompt_length(int64_t item) const {
  DSCHAT_CHECK(item >= 0 && item < items_, InvalidArgument, "tokenized dataset: item ", item,
               " out of range (", items_, " items)");
  return prompt_lengths()[item];
}

void TokenizedDataset::append(const std::vector<const std::vector<int64_t>*>& sequences, int32_t prompt_length) {
  DSCHAT_CHECK(!mapping_, InvalidArgument, "tokenized dataset: cannot append to a loaded (mapped) dataset");
  DSCHAT_CHECK(static_cast<int>(sequences.size()) == fields(), InvalidArgument, "tokenized dataset: ",
               sequences.size(), " sequences given, this kind holds ", fields());
  DSCHAT_CHECK(prompt_length >= 0, InvalidArgument, "tokenized dataset: prompt length ", prompt_length,
               " is negative");
  for (const auto* ids : sequences) {
    for (int64_t id : *ids) {
      DSCHAT_CHECK(id >= 0 && id <= std::numeric_limits<int32_t>::max(), InvalidArgument,
                   "tokenized dataset: token id ", id, " does not fit in int32");
      tokens_vec_.push_back(static_cast<int32_t>(id));
    }
    offsets_vec_.push_back(static_cast<int64_t>(tokens_vec_.size()));
  }
  prompt_vec_.push_back(prompt_length);
  ++items_;
  num_tokens_ = static_cast<int64_t>(tokens_vec_.size());
}

TokenizedDataset TokenizedDataset::concatenate(const std::vector<const TokenizedDataset*>& parts,
                                               const std::vector<int64_t>& order) {
  DSCHAT_CHECK(!parts.empty(), InvalidArgument, "tokenized dataset: nothing to concatenate");
  TokenizedDataset out(parts.front()->kind());
  std::vector<std::pair<const TokenizedDataset*, int64_t>> items;  // concatenation order
  for (const auto* part : parts) {
    DSCHAT_CHECK(part->kind() == out.kind(), InvalidArgument, "tokenized dataset: mixed phase kinds");
    for (int64_t i = 0; i < part->size(); ++i) items.emplace_back(part, i);
  }
  std::vector<std::vector<int64_t>> ids(out.fields());
  for (int64_t index : order) {
    DSCHAT_CHECK(index >= 0 && index < static_cast<int64_t>(items.size()), InvalidArgument,
                 "tokenized dataset: order index ", index, " out of range (", items.size(), " items)");
    auto [part, item] = items[index];
    std::vector<const std::vector<int64_t>*> pointers;
    for (int field = 0; field < out.fields(); ++field) {
      TokenSpan span = part->sequence(item, field);
      ids[field].assign(span.begin(), span.end());
      pointers.push_back(&ids[field]);
    }
    out.append(pointers, part->prompt_length(item));
  }
  return out;
}

void TokenizedDataset::save(const std::filesystem::path& file) const {
  nlohmann::json header = {{"version", kTokenizedFileVersion},
                           {"kind", static_cast<int>(kind_)},
                           {"items", items_},
                           {"fields", fields()},
                           {"tokens", num_tokens_},
                           {"metadata", metadata_}};
  const std::string header_text = header.dump();
  io::AtomicFileWriter out(file);
  out.write(kMagic, sizeof(kMagic));
  const uint64_t header_bytes = header_text.size();
  out.write(&header_bytes, sizeof(header_bytes));
  out.write(header_text.data(), header_text.size());
  write_padding(out, sizeof(kMagic) + sizeof(header_bytes) + header_text.size());
  out.write(offsets(), sizeof(int64_t) * (items_ * fields() + 1));
  out.write(prompt_lengths(), sizeof(int32_t) * items_);
  write_padding(out, sizeof(int32_t) * items_);
  out.write(tokens(), sizeof(int32_t) * num_tokens_);
  out.commit();
}

TokenizedDataset TokenizedDataset::load(const std::filesystem::path& file) {
  auto mapping = io::MappedFile::open(file);
  const uint8_t* base = mapping->data();
  const size_t size = mapping->size();
  const std::string where = file.string();
  DSCHAT_CHECK(size >= 16 && std::memcmp(base, kMagic, sizeof(kMagic)) == 0, FormatError, where,
               ": not a dschat tokenized dataset (bad magic)");
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, base + 8, sizeof(header_bytes));
  DSCHAT_CHECK(header_bytes <= size - 16, FormatError, where, ": truncated header");
  nlohmann::json header = nlohmann::json::parse(base + 16, base + 16 + header_bytes, nullptr, false);
  DSCHAT_CHECK(header.is_object() && header.contains("kind") && header.contains("items") &&
                   header.contains("tokens") && header.contains("fields"),
               FormatError, where, ": malformed header");
  const int kind = header["kind"].get<int>();
  DSCHAT_CHECK(kind >= 1 && kind <= 3, FormatError, where, ": unknown phase kind ", kind);
  // Files from before the header carried a version are version 1: same layout, but the prompt
  // lengths of reward pairs were not stored (zeros), so such a file would be misread.
  int64_t version = 1;
  if (header.contains("version")) {
    DSCHAT_CHECK(header["version"].is_number_integer(), FormatError, where, ": malformed header (version)");
    version = header["version"].get<int64_t>();
  }
  DSCHAT_CHECK(version >= 1 && version <= kTokenizedFileVersion, FormatError, where, ": format version ", version,
               " (this build reads 1 to ", kTokenizedFileVersion, "; delete it and it is rebuilt)");
  DSCHAT_CHECK(version >= 2 || kind != static_cast<int>(PhaseKind::kReward), FormatError, where,
               ": a version-1 reward file, written before pairs stored their prompt lengths (delete it and it "
               "is rebuilt)");
  TokenizedDataset out(static_cast<PhaseKind>(kind));
  out.items_ = header["items"].get<int64_t>();
  out.num_tokens_ = header["tokens"].get<int64_t>();
  DSCHAT_CHECK(out.items_ >= 0 && out.num_tokens_ >= 0 && header["fields"].get<int>() == out.fields(),
               FormatError, where, ": inconsistent header");
  const size_t offsets_at = aligned8(16 + header_bytes);
  const size_t prompts_at = offsets_at + sizeof(int64_t) * (out.items_ * out.fields() + 1);
  const size_t tokens_at = prompts_at + aligned8(sizeof(int32_t) * out.items_);
  const size_t expected = tokens_at + sizeof(int32_t) * out.num_tokens_;
  DSCHAT_CHECK(size == expected, FormatError, where, ": size ", size, " bytes, the header implies ",
               expected, " (truncated or corrupt; delete it and it is rebuilt)");
  out.mapping_ = mapping;
  out.mapped_offsets_ = reinterpret_cast<const int64_t*>(base + offsets_at);
  out.mapped_prompt_lengths_ = reinterpret_cast<const int32_t*>(base + prompts_at);
  out.mapped_tokens_ = reinterpret_cast<const int32_t*>(base + tokens_at);
  const int64_t* offsets = out.mapped_offsets_;
  DSCHAT_CHECK(offsets[0] == 0, FormatError, where, ": corrupt offsets");
  for (int64_t i = 0; i < out.items_ * out.fields(); ++i) {
    DSCHAT_CHECK(offsets[i] <= offsets[i + 1], FormatError, where, ": corrupt offsets at ", i);
  }
  DSCHAT_CHECK(offsets[out.items_ * out.fields()] == out.num_tokens_, FormatError, where,
               ": offsets do not end at the token count");
  if (header.contains("metadata")) out.metadata_ = header["metadata"];
  return out;
}

}  // namespace data
}  // namespace dschat
