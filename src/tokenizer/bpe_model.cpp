#include "tokenizer/bpe_model.h"

#include <cstdio>
#include <limits>
#include <queue>

#include "dschat/core/error.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes of the word it covers; 0 marks a symbol merged into its left neighbour
};

struct QueuedMerge {
  int32_t rank;
  int32_t pos;
  int32_t new_id;
  // std::priority_queue pops the largest: invert so the lowest (rank, pos) comes first.
  bool operator<(const QueuedMerge& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

void add_symbol(std::vector<Symbol>& symbols, int32_t id, size_t len) {
  auto n = static_cast<int32_t>(symbols.size());
  if (n > 0) symbols.back().next = n;
  symbols.push_back(Symbol{id, n - 1, -1, static_cast<uint32_t>(len)});
}

// Word::merge_all of `tokenizers`: a min-heap on (rank, position); an entry whose pair has since
// changed is skipped when the merge it names no longer applies.
void merge_all(std::vector<Symbol>& symbols, const MergeMap& merges) {
  std::priority_queue<QueuedMerge> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    auto it = merges.find(pair_key(symbols[i].id, symbols[i + 1].id));
    if (it != merges.end()) queue.push({it->second.rank, static_cast<int32_t>(i), it->second.new_id});
  }
  while (!queue.empty()) {
    QueuedMerge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next == -1) continue;
    Symbol right = symbols[left.next];
    auto it = merges.find(pair_key(left.id, right.id));
    if (it == merges.end() || it->second.new_id != top.new_id) continue;

    symbols[left.next].len = 0;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    if (right.next >= 0 && static_cast<size_t>(right.next) < symbols.size()) symbols[right.next].prev = top.pos;

    if (left.prev >= 0) {
      auto prev_it = merges.find(pair_key(symbols[left.prev].id, left.id));
      if (prev_it != merges.end()) queue.push({prev_it->second.rank, left.prev, prev_it->second.new_id});
    }
    if (left.next >= 0) {
      auto next_it = merges.find(pair_key(left.id, symbols[left.next].id));
      if (next_it != merges.end()) queue.push({next_it->second.rank, top.pos, next_it->second.new_id});
    }
  }
}

}  // namespace

BpeModel::BpeModel(Vocab vocab, const Merges& merges, BpeOptions options, const std::string& where)
    : vocab_(std::move(vocab)), options_(std::move(options)), where_(where),
      cache_(std::make_unique<WordCache>()) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    DSCHAT_CHECK(id >= 0, FormatError, where_, ": vocab token '", token, "' has negative id ", id);
    max_id = std::max(max_id, id);
  }
  tokens_.resize(static_cast<size_t>(max_id + 1));
  has_token_.assign(tokens_.size(), false);
  bool plain_pieces = options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty();
  if (plain_pieces) bmp_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : vocab_) {
    tokens_[id] = token;
    has_token_[id] = true;
    if (plain_pieces && !token.empty() && utf8_length(static_cast<unsigned char>(token[0])) == token.size()) {
      size_t pos = 0;
      char32_t cp = next_code_point(token, pos);
      if (cp < 0x10000) bmp_ids_[cp] = id;
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }

  const std::string& prefix = options_.continuing_subword_prefix;
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto a_it = vocab_.find(a);
    auto b_it = vocab_.find(b);
    DSCHAT_CHECK(a_it != vocab_.end(), FormatError, where_, ": merge ", rank, " '", a, " ", b, "': token '", a,
                 "' is not in the vocabulary");
    DSCHAT_CHECK(b_it != vocab_.end(), FormatError, where_, ": merge ", rank, " '", a, " ", b, "': token '", b,
                 "' is not in the vocabulary");
    DSCHAT_CHECK(b.compare(0, prefix.size(), prefix) == 0, FormatError, where_, ": merge ", rank, " '", a, " ", b,
                 "': '", b, "' lacks the continuing_subword_prefix '", prefix, "'");
    std::string merged = a + b.substr(prefix.size());
    auto merged_it = vocab_.find(merged);
    DSCHAT_CHECK(merged_it != vocab_.end(), FormatError, where_, ": merge ", rank, " '", a, " ", b,
                 "': merged token '", merged, "' is not in the vocabulary");
    DSCHAT_CHECK(rank < static_cast<size_t>(std::numeric_limits<int32_t>::max()), FormatError, where_,
                 ": too many merges (", merges.size(), ")");
    // A repeated pair keeps its last rank, as `tokenizers` builds its map.
    merges_[pair_key(a_it->second, b_it->second)] = BpeMerge{static_cast<int32_t>(rank), merged_it->second};
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int64_t id) const {
  if (id < 0 || id >= static_cast<int64_t>(tokens_.size()) || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

std::optional<int32_t> BpeModel::lookup_piece(std::string_view piece, bool first, bool last) const {
  if (!bmp_ids_.empty()) {
    size_t pos = 0;
    char32_t cp = next_code_point(piece, pos);
    if (cp < 0x10000) {
      int32_t id = bmp_ids_[cp];
      if (id < 0) return std::nullopt;
      return id;
    }
    return token_to_id(piece);
  }
  std::string s;
  if (!first) s += options_.continuing_subword_prefix;
  s.append(piece);
  if (last) s += options_.end_of_word_suffix;
  return token_to_id(s);
}

std::vector<int32_t> BpeModel::merge_word(std::string_view word) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  // A pending unknown token (id, byte length), held back so that consecutive ones can be fused.
  int32_t unk = -1;
  size_t unk_len = 0;
  auto unk_id = [&]() -> int32_t {
    auto id = token_to_id(*options_.unk_token);
    DSCHAT_CHECK(id.has_value(), FormatError, where_, ": unk_token '", *options_.unk_token,
                 "' is not in the vocabulary");
    return *id;
  };
  size_t pos = 0;
  while (pos < word.size()) {
    size_t start = pos;
    pos += utf8_length(static_cast<unsigned char>(word[pos]));
    std::string_view piece = word.substr(start, pos - start);
    bool first = start == 0, last = pos == word.size();
    if (auto id = lookup_piece(piece, first, last)) {
      if (unk >= 0) add_symbol(symbols, unk, unk_len);
      unk = -1;
      add_symbol(symbols, *id, piece.size());
      continue;
    }
    if (options_.byte_fallback) {
      // The bytes of the piece as looked up, prefix and suffix included, as `tokenizers` does.
      std::string full;
      if (!first) full += options_.continuing_subword_prefix;
      full.append(piece);
      if (last) full += options_.end_of_word_suffix;
      bool all = true;
      for (char c : full) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : full) add_symbol(symbols, byte_ids_[static_cast<uint8_t>(c)], 1);
        continue;
      }
    }
    if (options_.unk_token) {
      if (unk >= 0 && options_.fuse_unk) {
        unk_len += piece.size();
      } else {
        if (unk >= 0) add_symbol(symbols, unk, unk_len);
        unk = unk_id();
        unk_len = piece.size();
      }
    }
    // Without byte fallback or an unknown token the character is dropped, as in `tokenizers`.
  }
  if (unk >= 0) add_symbol(symbols, unk, unk_len);

  merge_all(symbols, merges_);
  std::vector<int32_t> ids;
  ids.reserve(symbols.size());
  for (const Symbol& s : symbols) {
    if (s.len != 0) ids.push_back(s.id);
  }
  return ids;
}

void BpeModel::tokenize(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (auto id = token_to_id(word)) {
      out.push_back(*id);
      return;
    }
  }
  if (cache_->get(word, out)) return;
  std::vector<int32_t> ids = merge_word(word);
  out.insert(out.end(), ids.begin(), ids.end());
  cache_->put(word, ids);
}

}  // namespace tokenizer
}  // namespace dschat
