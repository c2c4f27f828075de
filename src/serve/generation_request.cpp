#include "dschat/serve/generation_request.h"

#include <algorithm>

namespace dschat {
namespace serve {

GenerationRequest::GenerationRequest(std::vector<std::vector<int64_t>> prompts, SamplingParams params)
    : prompts_(std::move(prompts)), params_(std::move(params)) {}

int64_t GenerationRequest::prompt_tokens() const {
  int64_t total = 0;
  for (const auto& prompt : prompts_) total += static_cast<int64_t>(prompt.size());
  return total;
}

int64_t GenerationRequest::longest_prompt() const {
  size_t longest = 0;
  for (const auto& prompt : prompts_) longest = std::max(longest, prompt.size());
  return static_cast<int64_t>(longest);
}

void GenerationRequest::push(ChoiceEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!event.finish_reason.empty()) ++finished_choices_;
    pending_.push_back(std::move(event));
  }
  changed_.notify_all();
}

void GenerationRequest::fail(std::string message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) error_ = std::move(message);
  }
  changed_.notify_all();
}

bool GenerationRequest::wait(std::vector<ChoiceEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto done = [&] { return !error_.empty() || finished_choices_ == rows(); };
  changed_.wait_for(lock, timeout, [&] { return !pending_.empty() || done(); });
  for (auto& event : pending_) out.push_back(std::move(event));
  pending_.clear();
  return done();
}

std::string GenerationRequest::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

}  // namespace serve
}  // namespace dschat
