#include "serve/request_rows.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "dschat/inference/logits_processing.h"
#include "serve/json_mode.h"

namespace dschat {
namespace serve {
namespace {

// A seed for a request that brought none: different for every request.
uint64_t fresh_seed() {
  static thread_local std::mt19937_64 source{std::random_device{}()};
  return source();
}

}  // namespace

RequestRows::RequestRows(const tokenizer::Tokenizer& tokenizer)
    : tokenizer_(&tokenizer), eos_(tokenizer.eos_token_id().value_or(-1)) {}

bool RequestRows::add(const std::shared_ptr<GenerationRequest>& request, inference::ContinuousEngine& engine) {
  const SamplingParams& params = request->params();
  if (params.echo) echo_prompts(*request, engine);
  if (params.max_tokens == 0) {  // echo only: the prompts were the whole answer
    for (int64_t choice = 0; choice < request->rows(); ++choice) request->push(ChoiceEvent{choice, "", "length", {}});
    return false;
  }
  core::GenerationConfig config;
  config.max_new_tokens = params.max_tokens;
  config.do_sample = !params.greedy();
  if (config.do_sample) {
    config.temperature = params.temperature;
    config.top_k = params.top_k;
    config.top_p = params.top_p;
  }
  // Penalties and bias also shape greedy answers (vLLM applies them before its argmax).
  config.frequency_penalty = params.frequency_penalty;
  config.presence_penalty = params.presence_penalty;
  config.repetition_penalty = params.repetition_penalty;
  config.logit_bias = params.logit_bias;
  if (eos_ >= 0) config.eos_token_id = eos_;
  config.num_return_sequences = params.n;
  const uint64_t seed = params.seed.value_or(fresh_seed());
  std::shared_ptr<const inference::TokenConstraint> constraint;
  if (params.json_schema) {
    if (!token_texts_) token_texts_ = std::make_shared<const std::vector<std::string>>(token_texts(*tokenizer_));
    std::vector<int64_t> end_ids = params.stop_token_ids;
    if (eos_ >= 0) end_ids.push_back(eos_);
    constraint = std::make_shared<JsonConstraint>(params.json_schema, token_texts_, std::move(end_ids));
  }
  Live live{request, {}, 0};
  std::vector<int64_t> engine_requests;
  for (size_t p = 0; p < request->prompts().size(); ++p) {
    inference::SampleOptions samples;
    samples.logprobs = params.logprobs;
    samples.constraint = constraint;
    for (int64_t j = 0; j < params.n; ++j) {
      samples.seeds.push_back(inference::row_seed(seed, static_cast<int64_t>(p) * params.n + j));
    }
    const int64_t id = engine.submit(request->prompts()[p], config, samples);
    engine_requests.push_back(id);
    for (int64_t j = 0; j < params.n; ++j) {
      live.rows.emplace(std::make_pair(id, j), Row{static_cast<int64_t>(p) * params.n + j,
                                                   TextStream(tokenizer_, params.stop, params.trim_leading_space,
                                                              params.kept_special_ids)});
    }
  }
  live.open = static_cast<int64_t>(live.rows.size());
  open_rows_ += live.open;
  for (int64_t id : engine_requests) live_of_engine_request_[id] = live_.size();
  live_.push_back(std::move(live));
  return true;
}

void RequestRows::echo_prompts(GenerationRequest& request, inference::ContinuousEngine& engine) {
  const SamplingParams& params = request.params();
  for (size_t p = 0; p < request.prompts().size(); ++p) {
    const std::vector<int64_t>& prompt = request.prompts()[p];
    std::vector<inference::ScoredToken> scored;
    if (params.logprobs >= 0) {
      // The first token has no log-prob (NaN): nothing precedes it.
      scored.push_back(inference::ScoredToken{prompt.front(), std::nanf(""), {}});
      for (auto& token : engine.score_prompt(prompt, params.logprobs)) scored.push_back(std::move(token));
    }
    const std::string text = tokenizer_->decode(prompt, /*skip_special_tokens=*/true);
    for (int64_t j = 0; j < params.n; ++j) {
      request.push(ChoiceEvent{static_cast<int64_t>(p) * params.n + j, text, "", scored});
    }
  }
}

void RequestRows::end_row(Live& live, Row& row, std::string text, const char* reason) {
  row.ended = true;
  --live.open;
  --open_rows_;
  if (reason != nullptr) live.request->push(ChoiceEvent{row.choice, std::move(text), reason, std::move(row.logprobs)});
}

std::vector<std::pair<std::shared_ptr<GenerationRequest>, bool>> RequestRows::on_step(
    inference::ContinuousEngine& engine, bool aborting) {
  for (const inference::StepToken& step : engine.last_step_tokens()) {
    auto index = live_of_engine_request_.find(step.request);
    if (index == live_of_engine_request_.end()) continue;
    Live& live = live_[index->second];
    Row& row = live.rows.at({step.request, step.sample});
    if (row.ended) continue;
    GenerationRequest& request = *live.request;
    if (aborting || request.cancelled()) continue;  // ended below, with the request's other rows
    ++row.generated;
    ++generated_tokens_;
    request.add_completion_tokens(1);
    if (step.logprobs) row.logprobs.push_back(*step.logprobs);
    const SamplingParams& params = request.params();
    const auto& stop_ids = params.stop_token_ids;
    bool ended_here = true;
    if (step.token == eos_ || std::find(stop_ids.begin(), stop_ids.end(), step.token) != stop_ids.end()) {
      end_row(live, row, row.text.finish(), "stop");
    } else {
      std::string piece = row.text.push(step.token);
      if (row.text.stopped()) {
        end_row(live, row, std::move(piece), "stop");
      } else if (row.generated >= params.max_tokens) {
        end_row(live, row, piece + row.text.finish(), "length");
      } else {
        ended_here = false;
        if (!piece.empty()) {
          request.push(ChoiceEvent{row.choice, std::move(piece), "", std::move(row.logprobs)});
          row.logprobs.clear();  // a moved-from vector is valid but unspecified
        }
      }
    }
    // The engine ends a row itself at EOS and max_tokens; a stop id or string ends it here only.
    if (ended_here && !step.finished) engine.cancel(step.request, step.sample);
  }
  std::vector<std::pair<std::shared_ptr<GenerationRequest>, bool>> done;
  std::vector<Live> still;
  for (Live& live : live_) {
    const bool gone = aborting || live.request->cancelled();
    if (gone && live.open > 0) {  // nobody reads these rows' text any more
      for (auto& [key, row] : live.rows) {
        if (row.ended) continue;
        end_row(live, row, "", nullptr);
        engine.cancel(key.first, key.second);
      }
    }
    if (live.open == 0) {
      done.emplace_back(live.request, gone);
    } else {
      still.push_back(std::move(live));
    }
  }
  live_ = std::move(still);
  live_of_engine_request_.clear();
  for (size_t i = 0; i < live_.size(); ++i) {
    for (const auto& entry : live_[i].rows) live_of_engine_request_[entry.first.first] = i;
  }
  return done;
}

std::vector<std::shared_ptr<GenerationRequest>> RequestRows::clear() {
  std::vector<std::shared_ptr<GenerationRequest>> requests;
  for (auto& live : live_) requests.push_back(live.request);
  live_.clear();
  live_of_engine_request_.clear();
  open_rows_ = 0;
  return requests;
}

}  // namespace serve
}  // namespace dschat
