#include "dschat/serve/text_stream.h"

#include "core/strings.h"

#include <algorithm>

namespace dschat {
namespace serve {
namespace {

using core::ends_with;

constexpr const char* kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD in UTF-8


}  // namespace

size_t find_first_stop(const std::string& text, const std::vector<std::string>& stops) {
  size_t first = std::string::npos;
  for (const auto& stop : stops) {
    if (stop.empty()) continue;
    first = std::min(first, text.find(stop));
  }
  return first;
}

size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const auto& stop : stops) {
    for (size_t length = std::min(text.size(), stop.size() - (stop.empty() ? 0 : 1)); length > longest; --length) {
      if (text.compare(text.size() - length, length, stop, 0, length) == 0) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

TextStream::TextStream(const tokenizer::Tokenizer* tokenizer, std::vector<std::string> stops, bool trim_leading_space,
                       std::vector<int64_t> kept_special_ids)
    : tokenizer_(tokenizer), trim_leading_space_(trim_leading_space), kept_special_ids_(std::move(kept_special_ids)) {
  for (auto& stop : stops) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
}

std::string TextStream::decoded() const {
  std::string text;
  // The runs between kept special tokens decode as usual; a kept token's own text stands between.
  size_t run = 0;
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (std::find(kept_special_ids_.begin(), kept_special_ids_.end(), ids_[i]) == kept_special_ids_.end()) continue;
    const std::vector<int64_t> before(ids_.begin() + static_cast<std::ptrdiff_t>(run),
                                      ids_.begin() + static_cast<std::ptrdiff_t>(i));
    text += tokenizer_->decode(before, /*skip_special_tokens=*/true);
    text += tokenizer_->decode({ids_[i]}, /*skip_special_tokens=*/false);
    run = i + 1;
  }
  if (run == 0) {
    text += tokenizer_->decode(ids_, /*skip_special_tokens=*/true);
  } else {
    const std::vector<int64_t> rest(ids_.begin() + static_cast<std::ptrdiff_t>(run), ids_.end());
    text += tokenizer_->decode(rest, /*skip_special_tokens=*/true);
  }
  if (trim_leading_space_) text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\r\n")));
  return text;
}

std::string TextStream::emit_up_to(size_t end) {
  // A decoder whose earlier text changed with a later id (none of the supported ones does) would
  // make the handed-out text no prefix of the answer: hold everything until it is one again.
  if (end <= emitted_.size() || text_.compare(0, emitted_.size(), emitted_) != 0) return "";
  std::string piece = text_.substr(emitted_.size(), end - emitted_.size());
  emitted_ += piece;
  return piece;
}

std::string TextStream::push(int64_t id) {
  if (stopped_) return "";
  ids_.push_back(id);
  text_ = decoded();
  const size_t stop_at = find_first_stop(text_, stops_);
  if (stop_at != std::string::npos) {
    stopped_ = true;
    return emit_up_to(stop_at);
  }
  size_t final_end = text_.size() - stop_prefix_suffix(text_, stops_);
  // A trailing U+FFFD may be the first bytes of a character the next id completes.
  std::string settled = text_.substr(0, final_end);
  while (ends_with(settled, kReplacementCharacter)) settled.resize(settled.size() - 3);
  return emit_up_to(settled.size());
}

std::string TextStream::finish() {
  if (stopped_) return "";
  return emit_up_to(text_.size());
}

}  // namespace serve
}  // namespace dschat
