#pragma once
// The immutable state behind dschat::tokenizer::Tokenizer: the pipeline of `tokenizers`
// (added tokens -> normalizer -> pre-tokenizer -> BPE model -> special tokens) and the decoder.

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dschat/tokenizer/tokenizer.h"
#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/post_processor.h"
#include "tokenizer/pre_tokenizer.h"

namespace dschat {
namespace tokenizer {

struct Tokenizer::State {
  std::filesystem::path directory;
  std::unique_ptr<Normalizer> normalizer;      // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null: the whole piece is one word
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Decoder> decoder;            // may be null: tokens joined by spaces
  SpecialTemplate special_template;
  AddedVocabulary added;
  std::optional<int64_t> bos_id, eos_id, pad_id, unk_id;

  /// Appends the ids of `text` without the template's special tokens.
  void encode_content(std::string_view text, std::vector<int64_t>& out) const;

 private:
  void encode_piece(std::string_view text, bool first, std::vector<int64_t>& out) const;
};

/// Reads the files of `dir` into a State (tokenizer_files.cpp).
std::shared_ptr<Tokenizer::State> load_state(const std::filesystem::path& dir);

}  // namespace tokenizer
}  // namespace dschat
