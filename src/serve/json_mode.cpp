#include "serve/json_mode.h"

#include <array>

#include "serve/json_machine.h"

namespace dschat {
namespace serve {
namespace {

// Bytes that leave a JSON string open and change nothing in it: no quote, backslash or control;
// with `ascii_only`, each also one code point (what a length-bounded string counts per byte).
bool plain_string_bytes(const char* bytes, size_t size, bool ascii_only) {
  const unsigned limit = ascii_only ? 0x80 : 0x100;
  for (size_t i = 0; i < size; ++i) {
    const auto byte = static_cast<unsigned char>(bytes[i]);
    if (byte == '"' || byte == '\\' || byte < 0x20 || byte >= limit) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> token_texts(const tokenizer::Tokenizer& tokenizer) {
  const int64_t vocab = tokenizer.vocab_size();
  const std::vector<int64_t> anchor_ids = tokenizer.encode("a", /*add_special_tokens=*/false);
  const int64_t anchor = anchor_ids.empty() ? -1 : anchor_ids.front();
  const std::string anchor_text = anchor >= 0 ? tokenizer.decode({anchor}, /*skip_special_tokens=*/false) : "";
  std::vector<std::string> texts(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < vocab; ++id) {
    if (tokenizer.is_special(id)) continue;
    if (anchor < 0) {
      texts[id] = tokenizer.decode({id}, false);
      continue;
    }
    const std::string both = tokenizer.decode({anchor, id}, /*skip_special_tokens=*/false);
    texts[id] = both.compare(0, anchor_text.size(), anchor_text) == 0 ? both.substr(anchor_text.size())
                                                                        : tokenizer.decode({id}, false);
  }
  return texts;
}

std::shared_ptr<const JsonSchema> json_object_schema() {
  static const std::shared_ptr<const JsonSchema> schema =
      compile_json_schema(nlohmann::ordered_json{{"type", "object"}}, "response_format");
  return schema;
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonSchema> schema,
                               std::shared_ptr<const std::vector<std::string>> texts, std::vector<int64_t> end_ids)
    : schema_(std::move(schema)), texts_(std::move(texts)), end_ids_(std::move(end_ids)) {}

torch::Tensor JsonConstraint::allowed(const std::vector<int64_t>& generated, int64_t vocab) const {
  const std::vector<std::string>& texts = *texts_;
  const auto text_of = [&](int64_t id) -> const std::string* {
    return id >= 0 && id < static_cast<int64_t>(texts.size()) ? &texts[static_cast<size_t>(id)] : nullptr;
  };
  JsonMachine machine(*schema_);
  bool valid = true;
  for (int64_t id : generated) {
    const std::string* text = text_of(id);
    valid = valid && text != nullptr && machine.feed(*text);
  }
  torch::Tensor allowed = torch::zeros({vocab}, torch::kBool);  // [V]
  bool* allow = allowed.data_ptr<bool>();
  bool any = false;
  if (valid && !machine.closed()) {
    // Most states refuse most tokens by their first bytes: whether k spaces (a byte-level BPE's
    // word prefix) then byte b may come next is probed once per (k, b) and refuses every token
    // starting so without feeding it.
    constexpr size_t kSpaces = 16;
    const bool in_string = machine.reading_string();
    const int64_t room = machine.length_only_string_room();
    std::array<std::array<int8_t, 256>, kSpaces + 1> opening;  // -1: not probed yet
    for (auto& row : opening) row.fill(-1);
    for (int64_t id = 0; id < vocab; ++id) {
      const std::string* text = text_of(id);
      if (text == nullptr || text->empty()) continue;  // special or beyond the tokenizer: never JSON
      const char* bytes = text->data();
      const size_t size = text->size();
      size_t spaces = 0;
      while (spaces < size && bytes[spaces] == ' ') ++spaces;
      if (spaces < size && spaces <= kSpaces) {
        const auto byte = static_cast<unsigned char>(bytes[spaces]);
        int8_t& verdict = opening[spaces][byte];
        if (verdict < 0) {
          JsonMachine probe = machine;
          verdict = static_cast<int8_t>(probe.feed(text->substr(0, spaces + 1)));
        }
        if (verdict == 0) continue;
        if (size == spaces + 1) {
          allow[id] = any = true;
          continue;
        }
      }
      // Stays inside the string: no probe needed.
      if (in_string && plain_string_bytes(bytes, size, /*ascii_only=*/false)) {
        allow[id] = any = true;
        continue;
      }
      if (room >= 0 && plain_string_bytes(bytes, size, /*ascii_only=*/true)) {  // one code point per byte, if they fit
        allow[id] = static_cast<int64_t>(size) <= room;
        any = any || allow[id];
        continue;
      }
      JsonMachine probe = machine;
      allow[id] = probe.feed(*text);
      any = any || allow[id];
    }
  }
  // Whole (or, defensively, nothing can continue it): an end token.
  for (int64_t id : end_ids_) {
    if (id >= 0 && id < vocab && (machine.complete() || !any || !valid)) allow[id] = true;
  }
  return allowed;
}

}  // namespace serve
}  // namespace dschat
