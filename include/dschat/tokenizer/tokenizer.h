#pragma once
// A Hugging Face BPE tokenizer in plain C++: ids equal those of the `tokenizers` library (and of
// `transformers`' AutoTokenizer for the directories it reads the same way).
//
// Reads a tokenizer directory:
//   tokenizer.json                 BPE model with its normalizer, pre_tokenizer, decoder,
//                                  post_processor and added_tokens (GPT-2/OPT byte-level BPE,
//                                  LLaMA-style byte-fallback BPE with Metaspace/Prepend+Replace), or
//   vocab.json + merges.txt        GPT-2's byte-level BPE (transformers' GPT2Tokenizer),
//   tokenizer_config.json,         bos/eos/unk/pad tokens, add_bos_token/add_eos_token,
//   special_tokens_map.json        added_tokens_decoder, add_prefix_space (optional).
// Components outside that set are refused with core::Unsupported naming the file and the type.
//
// Text is UTF-8. Invalid UTF-8 is not an error: each maximal ill-formed subsequence is replaced by
// U+FFFD before encoding (Python's bytes.decode("utf-8", "replace")), so a corrupt line in a
// data set costs one replacement character, not a training run. decode() turns byte sequences that
// are not valid UTF-8 into U+FFFD the same way, as `tokenizers` does.
//
// A Tokenizer is immutable after load() and safe to use from many threads at once; copies share
// one state (and one word cache).

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dschat {
namespace tokenizer {

enum class Side { kLeft, kRight };

enum class Padding {
  kLongest,    // pad every row to the longest row of the batch
  kMaxLength,  // pad every row to max_length (rows longer than it, without truncation, set T)
  kNone,       // no padding: rows keep their lengths
};

struct BatchOptions {
  bool add_special_tokens = true;
  Padding padding = Padding::kLongest;
  Side padding_side = Side::kRight;
  /// Needed by truncation and by Padding::kMaxLength; counts the special tokens.
  std::optional<size_t> max_length;
  bool truncation = false;
  /// Which end loses tokens. Special tokens are added after truncation, so they are kept.
  Side truncation_side = Side::kRight;
  /// Rounds the padded length up to a multiple of this (0 or 1: no rounding).
  size_t pad_to_multiple_of = 0;
  /// Overrides the tokenizer's pad token (GPT-2 has none; DeepSpeed-Chat pads with eos there).
  std::optional<int64_t> pad_token_id;
  /// Threads that encode the batch; 1 encodes on the calling thread.
  size_t num_threads = 1;
};

struct BatchEncoding {
  std::vector<std::vector<int64_t>> input_ids;       // [B][T]
  std::vector<std::vector<int64_t>> attention_mask;  // [B][T]: 1 for tokens, 0 for padding
};

class Tokenizer {
 public:
  /// Loads the tokenizer files of `dir`. Throws core::NotFound (no tokenizer files),
  /// core::IoError/FormatError (unreadable or malformed file) or core::Unsupported.
  static Tokenizer load(const std::filesystem::path& dir);

  /// The ids of `text`; with `add_special_tokens`, the bos/eos (or post_processor template)
  /// tokens around them. Special tokens written in the text are always recognised.
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;

  /// The text of `ids`. Ids that have no token are skipped, as `tokenizers` skips them (a model's
  /// padded embedding rows can produce such ids).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  /// Encodes every text, then truncates and pads as `options` says. Throws
  /// core::InvalidArgument when truncation has no max_length, max_length cannot hold the special
  /// tokens, or padding is needed and there is no pad token.
  BatchEncoding encode_batch(const std::vector<std::string>& texts, const BatchOptions& options = {}) const;

  std::optional<int64_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  /// 1 + the largest id of the model vocabulary and the added tokens: the embedding rows needed.
  int64_t vocab_size() const;
  /// Whether `id` is an added token marked special (what decode's skip_special_tokens drops).
  bool is_special(int64_t id) const;

  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  std::optional<int64_t> unk_token_id() const;

  /// The directory it was loaded from.
  const std::filesystem::path& directory() const;

  struct State;  // defined in src/tokenizer

 private:
  explicit Tokenizer(std::shared_ptr<const State> state);
  std::shared_ptr<const State> state_;
};

}  // namespace tokenizer
}  // namespace dschat
