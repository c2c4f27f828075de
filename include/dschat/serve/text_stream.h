#pragma once
// One answer's text as its tokens arrive: decodes the ids so far, hands out only text that can no
// longer change, and finds stop strings. Text is held back while
//   - it ends in U+FFFD (a UTF-8 character whose bytes are split across tokens), or
//   - its tail could still grow into a stop string (" Hum" may become " Human:").
// A stop string ends the answer just before it; the stop string itself is never handed out.
// Token by token, the handed-out pieces add up to exactly the text finish() returns in total.

#include <cstdint>
#include <string>
#include <vector>

#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

class TextStream {
 public:
  /// `stops`: strings that end the answer (empty ones are ignored). `trim_leading_space`: drop
  /// the answer's leading whitespace (a chat reply after "Assistant: "). `kept_special_ids`:
  /// special tokens whose text stays in the answer (Mistral's [TOOL_CALLS], which the tool-call
  /// parser looks for); the others are dropped, as decode's skip_special_tokens drops them.
  TextStream(const tokenizer::Tokenizer* tokenizer, std::vector<std::string> stops, bool trim_leading_space,
             std::vector<int64_t> kept_special_ids = {});

  /// Adds one generated id; returns the newly final text (often empty). After a stop string
  /// matched, stopped() is true and further ids are ignored.
  std::string push(int64_t id);
  /// The rest of the text (held-back text that turned out final) at the end of the answer.
  std::string finish();

  bool stopped() const { return stopped_; }
  /// Ids pushed (including those after which a stop string matched).
  int64_t tokens() const { return static_cast<int64_t>(ids_.size()); }
  /// Everything handed out so far.
  const std::string& emitted() const { return emitted_; }

 private:
  // The decoded answer after the leading-space trim.
  std::string decoded() const;
  std::string emit_up_to(size_t end);

  const tokenizer::Tokenizer* tokenizer_;
  std::vector<std::string> stops_;
  bool trim_leading_space_;
  std::vector<int64_t> kept_special_ids_;
  std::vector<int64_t> ids_;
  std::string text_;     // decoded() as of the last push
  std::string emitted_;  // the prefix of text_ handed out
  bool stopped_ = false;
};

/// The first position in `text` where any of `stops` begins, or npos.
size_t find_first_stop(const std::string& text, const std::vector<std::string>& stops);

/// The length of the longest suffix of `text` that is a proper prefix of some stop string.
size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stops);

}  // namespace serve
}  // namespace dschat
