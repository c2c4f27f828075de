#pragma once
// What a tokenizer.json post_processor adds around a single sequence when special tokens are
// requested: TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel (adds nothing) and
// Sequence. Pair templates are not needed by dschat and are not read.

#include <cstdint>
#include <vector>

#include "tokenizer/json_spec.h"

namespace dschat {
namespace tokenizer {

struct SpecialTemplate {
  std::vector<int64_t> prefix;
  std::vector<int64_t> suffix;
};

SpecialTemplate make_special_template(const JsonSpec& spec);

}  // namespace tokenizer
}  // namespace dschat
