#pragma once
// The requests a BatchScheduler has handed to its ContinuousEngine, row by row: each choice of a
// request is one engine sequence (prompt p's n choices are the n samples of one engine request).
// Every token the engine draws goes through its row's TextStream (stop strings, split
// characters) and streams back; a row ends on EOS or a stop id ("stop"), a stop string ("stop"),
// max_tokens ("length"), or when its client went away or the server stops (nothing sent).
// Rows the engine would otherwise continue are named back to the caller to cancel there.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dschat/core/generation_config.h"
#include "dschat/inference/continuous_engine.h"
#include "dschat/serve/generation_request.h"
#include "dschat/serve/text_stream.h"
#include "dschat/tokenizer/tokenizer.h"

namespace dschat {
namespace serve {

class RequestRows {
 public:
  explicit RequestRows(const tokenizer::Tokenizer& tokenizer);

  /// Submits every prompt of `request` to `engine` (its n choices as one engine request's
  /// samples, choice c seeded with row_seed(seed, c): a seeded request's answers depend on its
  /// seed alone, not on what else runs). With echo each choice first receives its prompt's text
  /// (and log-probs, engine.score_prompt). Returns false when nothing was submitted: max_tokens 0
  /// (echo only), the request already answered in full.
  bool add(const std::shared_ptr<GenerationRequest>& request, inference::ContinuousEngine& engine);

  /// After engine.step(): streams its tokens and ends rows; cancels in `engine` the rows that
  /// ended for the server's reasons (stop string or id, client gone, `aborting`). Returns the
  /// requests whose every row has now ended, with whether their client had gone.
  std::vector<std::pair<std::shared_ptr<GenerationRequest>, bool>> on_step(inference::ContinuousEngine& engine,
                                                                           bool aborting);
  /// Rows still open (the scheduler's running gauge).
  int64_t open_rows() const { return open_rows_; }
  int64_t generated_tokens() const { return generated_tokens_; }
  /// Forgets every request (after their failure was reported to them).
  std::vector<std::shared_ptr<GenerationRequest>> clear();

 private:
  struct Row {
    int64_t choice;  // OpenAI's choice index within its request
    TextStream text;
    int64_t generated = 0;
    bool ended = false;
    std::vector<inference::ScoredToken> logprobs;  // drawn since the row's last event
  };
  struct Live {
    std::shared_ptr<GenerationRequest> request;
    std::map<std::pair<int64_t, int64_t>, Row> rows;  // (engine request, sample) -> row
    int64_t open = 0;
  };
  void end_row(Live& live, Row& row, std::string text, const char* reason);
  void echo_prompts(GenerationRequest& request, inference::ContinuousEngine& engine);

  const tokenizer::Tokenizer* tokenizer_;
  int64_t eos_ = -1;
  std::shared_ptr<const std::vector<std::string>> token_texts_;  // JSON mode's, made at its first request
  std::vector<Live> live_;                          // in arrival order
  std::map<int64_t, size_t> live_of_engine_request_;  // engine request -> index into live_
  int64_t open_rows_ = 0;
  int64_t generated_tokens_ = 0;
};

}  // namespace serve
}  // namespace dschat
