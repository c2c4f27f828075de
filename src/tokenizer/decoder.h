#pragma once
// tokenizer.json decoders: ByteLevel, Metaspace, Replace (string pattern), ByteFallback, Fuse,
// Strip and Sequence. Each maps the list of token strings to a new list; the text is their
// concatenation, as in `tokenizers`.

#include <memory>
#include <string>
#include <vector>

#include "tokenizer/json_spec.h"

namespace dschat {
namespace tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> make_decoder(const JsonSpec& spec);
std::unique_ptr<Decoder> make_byte_level_decoder();

}  // namespace tokenizer
}  // namespace dschat
