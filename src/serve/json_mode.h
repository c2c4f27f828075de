#pragma once
// Structured output for `dschat serve`: OpenAI's JSON mode (response_format json_object: the
// reply is a JSON object), json_schema (the reply is a JSON text the schema allows) and forced
// tool calls. A TokenConstraint reads the reply so far through a schema's byte machine
// (json_machine.h) and lets through only the tokens whose text keeps it a prefix of an allowed
// text, and an end token (eos, the template's end of turn) only once the value is whole.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dschat/inference/token_constraint.h"
#include "dschat/tokenizer/tokenizer.h"
#include "serve/json_schema.h"

namespace dschat {
namespace serve {

/// Each token id's text as it reads inside a reply (decoded after an anchor token and with the
/// anchor's text removed, so a SentencePiece token keeps its leading space); empty for special
/// tokens, which never belong to JSON.
std::vector<std::string> token_texts(const tokenizer::Tokenizer& tokenizer);

/// JSON mode's schema, {"type": "object"}: one object, anything inside.
std::shared_ptr<const JsonSchema> json_object_schema();

class JsonConstraint : public inference::TokenConstraint {
 public:
  /// `texts`: token_texts() of the model's tokenizer; `end_ids`: the ids that end a reply.
  JsonConstraint(std::shared_ptr<const JsonSchema> schema, std::shared_ptr<const std::vector<std::string>> texts,
                 std::vector<int64_t> end_ids);
  torch::Tensor allowed(const std::vector<int64_t>& generated, int64_t vocab) const override;

 private:
  std::shared_ptr<const JsonSchema> schema_;
  std::shared_ptr<const std::vector<std::string>> texts_;
  std::vector<int64_t> end_ids_;
};

}  // namespace serve
}  // namespace dschat
