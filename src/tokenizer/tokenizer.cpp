#include "dschat/tokenizer/tokenizer.h"

#include <algorithm>
#include <thread>

#include "core/log.h"
#include "dschat/core/error.h"
#include "tokenizer/tokenizer_state.h"
#include "tokenizer/unicode.h"

namespace dschat {
namespace tokenizer {

void Tokenizer::State::encode_piece(std::string_view text, bool first, std::vector<int64_t>& out) const {
  // Thread-local scratch keeps concurrent encode() calls independent and allocation-light.
  thread_local std::vector<Piece> pieces;
  pieces.clear();
  pieces.push_back(Piece{std::string(text), first});
  if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
  for (const Piece& piece : pieces) model->tokenize(piece.text, out);
}

void Tokenizer::State::encode_content(std::string_view input, std::vector<int64_t>& out) const {
  std::string repaired;
  if (find_invalid_utf8(input) != std::string_view::npos) {
    core::log_warn_once("tokenizer: input is not valid UTF-8; ill-formed bytes are encoded as U+FFFD");
    repaired = to_valid_utf8(input);
    input = repaired;
  }
  std::vector<Segment> raw;
  added.split(input, false, raw);
  std::vector<Segment> normalized_segments;
  for (const Segment& segment : raw) {
    if (segment.id >= 0) {
      out.push_back(segment.id);
      continue;
    }
    std::string_view text = input.substr(segment.begin, segment.end - segment.begin);
    bool first = segment.begin == 0;
    if (!normalizer) {
      // Without a normalizer the normalized=true tokens match the same raw text.
      normalized_segments.clear();
      added.split(text, true, normalized_segments);
      for (const Segment& sub : normalized_segments) {
        if (sub.id >= 0) {
          out.push_back(sub.id);
        } else {
          encode_piece(text.substr(sub.begin, sub.end - sub.begin), first && sub.begin == 0, out);
        }
      }
      continue;
    }
    std::string normalized(text);
    normalizer->normalize(normalized);
    normalized_segments.clear();
    added.split(normalized, true, normalized_segments);
    for (const Segment& sub : normalized_segments) {
      if (sub.id >= 0) {
        out.push_back(sub.id);
      } else {
        encode_piece(std::string_view(normalized).substr(sub.begin, sub.end - sub.begin), first && sub.begin == 0,
                     out);
      }
    }
  }
}

Tokenizer::Tokenizer(std::shared_ptr<const State> state) : state_(std::move(state)) {}

Tokenizer Tokenizer::load(const std::filesystem::path& dir) { return Tokenizer(load_state(dir)); }

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  const SpecialTemplate& special = state_->special_template;
  if (add_special_tokens) ids = special.prefix;
  state_->encode_content(text, ids);
  if (add_special_tokens) ids.insert(ids.end(), special.suffix.begin(), special.suffix.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    const std::string* text = state_->added.decode_text(id);
    if (text == nullptr) text = state_->model->id_to_token(id);
    if (text == nullptr) continue;
    if (skip_special_tokens && state_->added.is_special_text(*text)) continue;
    tokens.push_back(*text);
  }
  if (!state_->decoder) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  state_->decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& token : tokens) out += token;
  return out;
}

BatchEncoding Tokenizer::encode_batch(const std::vector<std::string>& texts, const BatchOptions& options) const {
  const SpecialTemplate& special = state_->special_template;
  size_t n_special = options.add_special_tokens ? special.prefix.size() + special.suffix.size() : 0;
  size_t content_limit = SIZE_MAX;
  if (options.truncation) {
    DSCHAT_CHECK(options.max_length.has_value(), InvalidArgument,
                 "encode_batch: truncation needs BatchOptions::max_length");
    DSCHAT_CHECK(*options.max_length >= n_special, InvalidArgument, "encode_batch: max_length ", *options.max_length,
                 " cannot hold the ", n_special, " special tokens of ", state_->directory.string());
    content_limit = *options.max_length - n_special;
  }
  DSCHAT_CHECK(options.padding != Padding::kMaxLength || options.max_length.has_value(), InvalidArgument,
               "encode_batch: Padding::kMaxLength needs BatchOptions::max_length");

  BatchEncoding batch;
  batch.input_ids.resize(texts.size());
  auto encode_one = [&](size_t i) {
    std::vector<int64_t> content;
    state_->encode_content(texts[i], content);
    if (content.size() > content_limit) {
      if (options.truncation_side == Side::kRight) {
        content.resize(content_limit);
      } else {
        content.erase(content.begin(), content.end() - static_cast<std::ptrdiff_t>(content_limit));
      }
    }
    std::vector<int64_t>& row = batch.input_ids[i];
    row.reserve(content.size() + n_special);
    if (options.add_special_tokens) row = special.prefix;
    row.insert(row.end(), content.begin(), content.end());
    if (options.add_special_tokens) row.insert(row.end(), special.suffix.begin(), special.suffix.end());
  };
  size_t threads = std::min(std::max<size_t>(options.num_threads, 1), std::max<size_t>(texts.size(), 1));
  if (threads == 1) {
    for (size_t i = 0; i < texts.size(); ++i) encode_one(i);
  } else {
    std::vector<std::thread> workers;
    std::vector<std::exception_ptr> errors(threads);
    // Contiguous chunks: neighbouring rows stay on one thread.
    size_t chunk = (texts.size() + threads - 1) / threads;
    for (size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        try {
          for (size_t i = t * chunk; i < std::min(texts.size(), (t + 1) * chunk); ++i) encode_one(i);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    }
    for (auto& worker : workers) worker.join();
    for (auto& error : errors) {
      if (error) std::rethrow_exception(error);
    }
  }

  size_t longest = 0;
  for (const auto& row : batch.input_ids) longest = std::max(longest, row.size());
  size_t target = longest;
  if (options.padding == Padding::kMaxLength) target = std::max(longest, *options.max_length);
  if (options.padding != Padding::kNone && options.pad_to_multiple_of > 1) {
    size_t m = options.pad_to_multiple_of;
    target = (target + m - 1) / m * m;
  }
  batch.attention_mask.resize(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int64_t>& row = batch.input_ids[i];
    std::vector<int64_t>& mask = batch.attention_mask[i];
    mask.assign(row.size(), 1);
    if (options.padding == Padding::kNone || row.size() >= target) continue;
    std::optional<int64_t> pad = options.pad_token_id ? options.pad_token_id : state_->pad_id;
    DSCHAT_CHECK(pad.has_value(), InvalidArgument, "encode_batch: padding needs a pad token, and ",
                 state_->directory.string(), " defines none; set BatchOptions::pad_token_id");
    size_t missing = target - row.size();
    auto row_at = options.padding_side == Side::kRight ? row.end() : row.begin();
    row.insert(row_at, missing, *pad);
    auto mask_at = options.padding_side == Side::kRight ? mask.end() : mask.begin();
    mask.insert(mask_at, missing, 0);
  }
  return batch;
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = state_->added.id_of(token)) return id;
  if (auto id = state_->model->token_to_id(token)) return *id;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  const std::string* text = state_->added.decode_text(id);
  if (text == nullptr) text = state_->model->id_to_token(id);
  if (text == nullptr) return std::nullopt;
  return *text;
}

int64_t Tokenizer::vocab_size() const { return std::max(state_->model->max_id(), state_->added.max_id()) + 1; }

bool Tokenizer::is_special(int64_t id) const {
  const AddedToken* token = state_->added.token(id);
  return token != nullptr && token->special;
}

std::optional<int64_t> Tokenizer::bos_token_id() const { return state_->bos_id; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return state_->eos_id; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return state_->pad_id; }
std::optional<int64_t> Tokenizer::unk_token_id() const { return state_->unk_id; }
const std::filesystem::path& Tokenizer::directory() const { return state_->directory; }

}  // namespace tokenizer
}  // namespace dschat
