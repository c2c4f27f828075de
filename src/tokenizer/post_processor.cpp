#include "tokenizer/post_processor.h"

#include "dschat/core/error.h"

namespace dschat {
namespace tokenizer {
namespace {

int64_t pair_id(const JsonSpec& spec, const char* key) {
  // "cls": ["<s>", 0]
  const nlohmann::json& pair = spec.array(key);
  DSCHAT_CHECK(pair.size() == 2 && pair[1].is_number_integer(), FormatError, spec.where(), ": key '", key,
               "' expects [token, id], got ", pair.dump());
  return pair[1].get<int64_t>();
}

SpecialTemplate template_processing(const JsonSpec& spec) {
  SpecialTemplate out;
  const nlohmann::json& specials = spec.object("special_tokens");
  bool seen_sequence = false;
  std::vector<JsonSpec> pieces = spec.children("single");
  for (const JsonSpec& piece : pieces) {
    if (piece.has("Sequence")) {
      DSCHAT_CHECK(!seen_sequence, FormatError, piece.where(), ": a single template has one sequence");
      seen_sequence = true;
      continue;
    }
    DSCHAT_CHECK(piece.has("SpecialToken"), FormatError, piece.where(), ": expected SpecialToken or Sequence");
    JsonSpec special(piece.object("SpecialToken"), piece.where() + ".SpecialToken");
    std::string name = special.string("id");
    auto it = specials.find(name);
    DSCHAT_CHECK(it != specials.end(), FormatError, spec.where(), ": special token '", name,
                 "' of the template is missing from special_tokens");
    JsonSpec entry(*it, spec.where() + ".special_tokens." + name);
    std::vector<int64_t>& target = seen_sequence ? out.suffix : out.prefix;
    for (const auto& id : entry.array("ids")) {
      DSCHAT_CHECK(id.is_number_integer(), FormatError, entry.where(), ": ids must be integers, got ", id.dump());
      target.push_back(id.get<int64_t>());
    }
  }
  DSCHAT_CHECK(seen_sequence, FormatError, spec.where(), ": the single template has no Sequence");
  return out;
}

}  // namespace

SpecialTemplate make_special_template(const JsonSpec& spec) {
  std::string type = spec.type();
  if (type == "TemplateProcessing") return template_processing(spec);
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    return SpecialTemplate{{pair_id(spec, "cls")}, {pair_id(spec, "sep")}};
  }
  if (type == "ByteLevel") return SpecialTemplate{};
  if (type == "Sequence") {
    SpecialTemplate out;
    for (const JsonSpec& child : spec.children("processors")) {
      // Each processor wraps the output of the previous one.
      SpecialTemplate inner = make_special_template(child);
      inner.prefix.insert(inner.prefix.end(), out.prefix.begin(), out.prefix.end());
      out.prefix = std::move(inner.prefix);
      out.suffix.insert(out.suffix.end(), inner.suffix.begin(), inner.suffix.end());
    }
    return out;
  }
  spec.unsupported("post_processor type '" + type + "'",
                   "TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence");
}

}  // namespace tokenizer
}  // namespace dschat
