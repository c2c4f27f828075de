#pragma once
// One batch of requests through one InferenceEngine call: lays the rows out (prompt p's n answers
// in adjacent rows), samples every row with its own request's settings and generator (rows with
// the same temperature/top-k/top-p warped together, then one inverse-CDF draw per row), turns each
// step's ids into text (TextStream: stop strings, split characters) and streams it back, and ends
// rows that are done: EOS, a stop string, max_tokens, or a client that went away.

#include <ATen/core/Generator.h>
#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <vector>

#include "dschat/inference/inference_engine.h"
#include "dschat/serve/generation_request.h"
#include "dschat/serve/text_stream.h"

namespace dschat {
namespace serve {

class BatchRun {
 public:
  /// `abort`: when set, every row ends at the next step (the server stops).
  BatchRun(const std::vector<std::shared_ptr<GenerationRequest>>& batch, const tokenizer::Tokenizer& tokenizer,
           const torch::Device& device, const std::atomic<bool>& abort);

  /// Generates until every row has ended; events reach the requests as they happen.
  void run(inference::InferenceEngine& engine);

  int64_t generated_tokens() const { return generated_tokens_; }
  /// Requests whose rows were ended because their client went away.
  int64_t cancelled_requests() const;

 private:
  struct Row {
    GenerationRequest* request;
    size_t request_index;  // into requests_ / generators_
    int64_t choice;        // OpenAI's choice index within its request
    TextStream text;
    int64_t generated = 0;
    bool ended = false;
  };
  torch::Tensor select_next(const torch::Tensor& logits, int64_t step);       // [R, V] -> [R]
  std::vector<bool> end_rows(const torch::Tensor& next_ids);                  // [R] host ids
  void end_row(Row& row, std::string text, const char* reason);

  std::vector<std::shared_ptr<GenerationRequest>> requests_;
  std::vector<at::Generator> generators_;   // one per request: its seed, its draws
  std::vector<Row> rows_;
  torch::Tensor prompt_ids_;   // [R, T] left-padded
  torch::Tensor prompt_mask_;  // [R, T]
  int64_t max_new_tokens_ = 0;
  int64_t eos_ = 0, pad_ = 0;
  const std::atomic<bool>& abort_;
  int64_t generated_tokens_ = 0;
};

}  // namespace serve
}  // namespace dschat
