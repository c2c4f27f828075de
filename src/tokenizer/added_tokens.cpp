#include "tokenizer/added_tokens.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {
namespace {

// The code point that ends at byte `end` of valid UTF-8 `text` (end > 0).
char32_t code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

bool is_space(char32_t cp) { return (char_class(cp) & kSpace) != 0; }
bool is_word(char32_t cp) { return (char_class(cp) & kWord) != 0; }

}  // namespace

int64_t AddedVocabulary::add(const AddedToken& token, size_t model_size, std::optional<int64_t> model_id) {
  if (token.content.empty()) return -1;  // `tokenizers` ignores empty tokens
  auto existing = by_content_.find(token.content);
  int64_t id;
  if (existing != by_content_.end()) {
    id = existing->second;
  } else if (model_id) {
    id = *model_id;
  } else {
    int64_t max = max_id();
    id = (max >= 0 && (max >= static_cast<int64_t>(model_size) || model_size == 0)) ? max + 1
                                                                                      : static_cast<int64_t>(model_size);
  }
  by_content_[token.content] = id;
  by_id_[id] = token;
  if (token.special) special_.insert(token.content);
  return id;
}

int64_t AddedVocabulary::max_id() const {
  int64_t max = -1;
  for (const auto& entry : by_id_) max = std::max(max, entry.first);
  return max;
}

void AddedVocabulary::build(const Normalizer* normalizer) {
  normalized_form_.clear();
  raw_matcher_ = Matcher();
  normalized_matcher_ = Matcher();
  raw_matcher_.nodes.emplace_back();
  normalized_matcher_.nodes.emplace_back();
  std::vector<int64_t> ids;
  for (const auto& entry : by_id_) ids.push_back(entry.first);
  std::sort(ids.begin(), ids.end());
  for (int64_t id : ids) {
    const AddedToken& token = by_id_.at(id);
    if (!token.normalized) {
      insert(raw_matcher_, token.content, id);
      continue;
    }
    std::string pattern = token.content;
    if (normalizer != nullptr) normalizer->normalize(pattern);
    if (pattern != token.content) normalized_form_[id] = pattern;
    insert(normalized_matcher_, pattern, id);
  }
}

void AddedVocabulary::insert(Matcher& matcher, const std::string& pattern, int64_t id) {
  if (pattern.empty()) return;
  matcher.first_byte[static_cast<unsigned char>(pattern[0])] = true;
  int32_t node = 0;
  for (char c : pattern) {
    auto byte = static_cast<unsigned char>(c);
    auto& children = matcher.nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
    if (it != children.end() && it->first == byte) {
      node = it->second;
      continue;
    }
    auto next = static_cast<int32_t>(matcher.nodes.size());
    children.insert(it, std::make_pair(byte, next));
    matcher.nodes.emplace_back();
    node = next;
  }
  // Two tokens normalising to one pattern: keep the first, as a trie built from pairs would.
  if (matcher.nodes[node].id < 0) matcher.nodes[node].id = id;
}

std::pair<size_t, int64_t> AddedVocabulary::longest_at(const Matcher& matcher, std::string_view text,
                                                       size_t pos) const {
  std::pair<size_t, int64_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto byte = static_cast<unsigned char>(text[i]);
    const auto& children = matcher.nodes[node].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
    if (it == children.end() || it->first != byte) break;
    node = it->second;
    if (matcher.nodes[node].id >= 0) best = {i + 1 - pos, matcher.nodes[node].id};
  }
  return best;
}

void AddedVocabulary::split(std::string_view text, bool normalized_phase, std::vector<Segment>& out) const {
  const Matcher& matcher = normalized_phase ? normalized_matcher_ : raw_matcher_;
  if (text.empty()) return;
  if (matcher.empty()) {
    out.push_back({0, text.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!matcher.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    auto [length, id] = longest_at(matcher, text, pos);
    if (length == 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + length;
    pos = stop;  // matches never overlap, whatever lstrip/rstrip do below
    const AddedToken& token = by_id_.at(id);
    if (token.single_word) {
      bool start_space = start == 0 || !is_word(code_point_before(text, start));
      size_t after = stop;
      bool stop_space = stop == text.size() || !is_word(next_code_point(text, after));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        size_t back = new_start - 1;
        while (back > 0 && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
        size_t p = back;
        if (!is_space(next_code_point(text, p))) break;
        new_start = back;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!is_space(next_code_point(text, next))) break;
        stop = next;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({start_offset, text.size(), -1});
}

std::optional<int64_t> AddedVocabulary::id_of(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

const std::string* AddedVocabulary::decode_text(int64_t id) const {
  auto normalized = normalized_form_.find(id);
  if (normalized != normalized_form_.end()) return &normalized->second;
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.content;
}

const AddedToken* AddedVocabulary::token(int64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

}  // namespace tokenizer
}  // namespace dschat
