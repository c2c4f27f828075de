#pragma once
// The schema-guided tests' check of the token mask's shortcuts: after `reply`, JsonConstraint's
// mask over GPT-2's vocabulary must equal feeding every token's text to a copy of the machine.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dschat/tokenizer/tokenizer.h"
#include "serve/json_machine.h"
#include "serve/json_mode.h"
#include "json_schema_reference.h"

namespace dschat {
namespace serve {

/// The number of tokens allowed after `reply` (end id 50256, GPT-2's eos, allowed once whole).
inline int64_t expect_mask_is_feeding_every_token(const std::shared_ptr<const JsonSchema>& schema,
                                                  const std::shared_ptr<const std::vector<std::string>>& texts,
                                                  const tokenizer::Tokenizer& tokenizer, const std::string& reply) {
  const int64_t vocab = tokenizer.vocab_size();
  const std::vector<int64_t> generated = tokenizer.encode(reply, /*add_special_tokens=*/false);
  const torch::Tensor mask = JsonConstraint(schema, texts, {50256}).allowed(generated, vocab);  // [V]
  JsonMachine machine(*schema);
  EXPECT_TRUE(machine.feed(reply)) << reply;
  int64_t allowed = 0;
  for (int64_t id = 0; id < vocab; ++id) {
    JsonMachine probe = machine;
    const std::string& text = (*texts)[static_cast<size_t>(id)];
    const bool expected = id == 50256 ? machine.complete() : !text.empty() && probe.feed(text);
    if (mask[id].item<bool>() != expected) {
      ADD_FAILURE() << reference::quoted(reply) << " then " << reference::quoted(text) << " (id " << id << ")";
      return allowed;
    }
    allowed += expected;
  }
  return allowed;
}

}  // namespace serve
}  // namespace dschat
