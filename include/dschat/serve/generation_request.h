#pragma once
// One HTTP request's generation as the batch scheduler sees it: its prompts, how to sample, and
// the channel its answers flow back through. The HTTP thread creates it and waits on it; the
// model's worker thread (batch_scheduler.h) fills it. Thread-safe.
//
// Rows: prompt p's n answers are choices p * n .. p * n + n - 1 (OpenAI's choice indices).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dschat/inference/token_logprobs.h"

namespace dschat {
namespace serve {

struct JsonSchema;  // src/serve/json_schema.h

struct SamplingParams {
  int64_t max_tokens = 16;
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0: off (an extension to OpenAI's API)
  double frequency_penalty = 0.0;   // [-2, 2], OpenAI's: per time a token was generated
  double presence_penalty = 0.0;    // [-2, 2], OpenAI's: once if a token was generated
  double repetition_penalty = 1.0;  // [1, 2], Hugging Face's over prompt and answer (an extension, vLLM's)
  std::map<int64_t, double> logit_bias;  // token id -> added to its logit, [-100, 100]
  std::optional<uint64_t> seed;  // none: a fresh random seed
  int64_t n = 1;             // answers per prompt
  std::vector<std::string> stop;  // the client's stop strings and the chat template's
  bool trim_leading_space = false;  // chat replies drop the space after "Assistant:"
  std::vector<int64_t> stop_token_ids;  // ids that end an answer besides eos (a chat template's end of turn)
  std::vector<int64_t> kept_special_ids;  // special tokens whose text stays in the answer (TextStream)
  int64_t logprobs = -1;     // >= 0: each token's log-prob and this many most likely ones; -1: none
  bool echo = false;         // completions: each choice starts with its prompt (and its log-probs)
  // The answer is a JSON text this schema allows (response_format json_object / json_schema, a
  // forced tool call; src/serve/json_mode.h); null: free text.
  std::shared_ptr<const JsonSchema> json_schema;

  bool greedy() const { return temperature == 0.0; }
};

/// A piece of one choice's answer: new text, and at the end why it ended.
struct ChoiceEvent {
  int64_t index = 0;
  std::string text;
  std::string finish_reason;  // "" while it goes on, then "stop" or "length"
  /// With SamplingParams::logprobs: the tokens this piece covers (drawn since the previous event;
  /// echoed prompt tokens first, the very first with a NaN log-prob: nothing precedes it).
  std::vector<inference::ScoredToken> logprobs;
};

class GenerationRequest {
 public:
  GenerationRequest(std::vector<std::vector<int64_t>> prompts, SamplingParams params);

  const std::vector<std::vector<int64_t>>& prompts() const { return prompts_; }
  const SamplingParams& params() const { return params_; }
  int64_t rows() const { return static_cast<int64_t>(prompts_.size()) * params_.n; }
  int64_t prompt_tokens() const;  // over all prompts (each counted once, whatever n)
  int64_t longest_prompt() const;

  // ---- the worker's side
  void push(ChoiceEvent event);
  /// The generation failed (the engine threw, or the server stops): the waiter sees `message`.
  void fail(std::string message);
  void add_completion_tokens(int64_t tokens) { completion_tokens_ += tokens; }

  // ---- the HTTP side
  /// Waits up to `timeout` for events and moves them into `out`; returns true once every choice
  /// has finished or the request failed (then no more events come).
  bool wait(std::vector<ChoiceEvent>& out, std::chrono::milliseconds timeout);
  /// The client went away or the server stops: the worker ends the rows at its next step.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  /// Empty unless fail() was called.
  std::string error() const;
  int64_t completion_tokens() const { return completion_tokens_; }

 private:
  const std::vector<std::vector<int64_t>> prompts_;
  const SamplingParams params_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<ChoiceEvent> pending_;  // guarded by mutex_
  int64_t finished_choices_ = 0;      // guarded by mutex_
  std::string error_;                 // guarded by mutex_
  std::atomic<bool> cancelled_{false};
  std::atomic<int64_t> completion_tokens_{0};
};

}  // namespace serve
}  // namespace dschat
