#include "serve/batch_run.h"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "dschat/inference/logits_processing.h"

namespace dschat {
namespace serve {
namespace {

// A seed for a request that brought none: different for every request.
uint64_t fresh_seed() {
  static thread_local std::mt19937_64 source{std::random_device{}()};
  return source();
}

}  // namespace

BatchRun::BatchRun(const std::vector<std::shared_ptr<GenerationRequest>>& batch, const tokenizer::Tokenizer& tokenizer,
                   const torch::Device& device, const std::atomic<bool>& abort)
    : requests_(batch), abort_(abort) {
  eos_ = tokenizer.eos_token_id().value_or(-1);
  pad_ = tokenizer.pad_token_id().value_or(eos_ >= 0 ? eos_ : 0);
  int64_t width = 0;
  for (size_t i = 0; i < requests_.size(); ++i) {
    const GenerationRequest& request = *requests_[i];
    const SamplingParams& params = request.params();
    generators_.push_back(inference::make_sampling_generator(device, params.seed.value_or(fresh_seed())));
    max_new_tokens_ = std::max(max_new_tokens_, params.max_tokens);
    width = std::max(width, request.longest_prompt());
    int64_t choice = 0;
    for (size_t p = 0; p < request.prompts().size(); ++p) {
      for (int64_t j = 0; j < params.n; ++j) {
        rows_.push_back(Row{requests_[i].get(), i, choice++, TextStream(&tokenizer, params.stop, params.trim_leading_space)});
      }
    }
  }
  const int64_t total_rows = static_cast<int64_t>(rows_.size());
  prompt_ids_ = torch::full({total_rows, width}, pad_, torch::kInt64);  // [R, T]
  prompt_mask_ = torch::zeros({total_rows, width}, torch::kInt64);      // [R, T]
  for (int64_t r = 0; r < total_rows; ++r) {
    const Row& row = rows_[r];
    const auto& prompt = row.request->prompts()[row.choice / row.request->params().n];
    const int64_t length = static_cast<int64_t>(prompt.size()), offset = width - length;  // left padding
    std::copy(prompt.begin(), prompt.end(), prompt_ids_[r].data_ptr<int64_t>() + offset);
    prompt_mask_[r].narrow(0, offset, length).fill_(1);
  }
  prompt_ids_ = prompt_ids_.to(device);
  prompt_mask_ = prompt_mask_.to(device);
}

void BatchRun::run(inference::InferenceEngine& engine) {
  core::GenerationConfig config;
  config.max_new_tokens = max_new_tokens_;
  if (eos_ >= 0) config.eos_token_id = eos_;
  config.pad_token_id = pad_;
  inference::StepHooks hooks;
  hooks.select_next = [this](const torch::Tensor& logits, const torch::Tensor&, int64_t step) {
    return select_next(logits, step);
  };
  hooks.end_rows = [this](const torch::Tensor& next_ids, int64_t) { return end_rows(next_ids); };
  engine.generate(prompt_ids_, prompt_mask_, config, hooks);
  // max_new_tokens is the longest request's; every row has ended by then (end_rows ends a row at
  // its own max_tokens). A row still open here would be a bookkeeping bug: end it, not hang it.
  for (auto& row : rows_) {
    if (!row.ended) end_row(row, row.text.finish(), "length");
  }
}

torch::Tensor BatchRun::select_next(const torch::Tensor& logits, int64_t step) {
  torch::Tensor next = logits.argmax(1);  // [R]: greedy rows' tokens; sampled rows overwritten below
  // Sampled rows still decoding, grouped by their warpers: one process_logits call per group.
  std::map<std::tuple<double, int64_t, double>, std::vector<int64_t>> groups;
  std::vector<std::vector<int64_t>> rows_of_request(requests_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    const SamplingParams& params = rows_[r].request->params();
    if (rows_[r].ended || params.greedy()) continue;
    groups[{params.temperature, params.top_k, params.top_p}].push_back(static_cast<int64_t>(r));
    rows_of_request[rows_[r].request_index].push_back(static_cast<int64_t>(r));
  }
  if (groups.empty()) return next;
  const torch::Device device = logits.device();
  std::vector<torch::Tensor> probabilities;  // [G_i, V] per group
  std::vector<int64_t> order;                // their rows, in that order
  for (const auto& [key, rows] : groups) {
    core::GenerationConfig sampling;
    sampling.do_sample = true;
    std::tie(sampling.temperature, sampling.top_k, sampling.top_p) = key;
    torch::Tensor index = torch::tensor(rows, torch::kInt64).to(device);  // [G_i]
    probabilities.push_back(
        inference::process_logits(logits.index_select(0, index), torch::Tensor(), sampling, step).softmax(1));
    order.insert(order.end(), rows.begin(), rows.end());
  }
  // One uniform per live row from its request's own generator, drawn in row order: a request's
  // draws depend on its seed and its rows only, never on what else is in the batch.
  torch::Tensor uniform = torch::zeros({static_cast<int64_t>(rows_.size())}, torch::dtype(torch::kFloat64).device(device));  // [R]
  for (size_t i = 0; i < requests_.size(); ++i) {
    const auto& rows = rows_of_request[i];
    if (rows.empty()) continue;  // its generator draws nothing more
    at::Generator& generator = generators_[i];
    torch::Tensor draws = torch::rand({static_cast<int64_t>(rows.size())}, generator,
                                      torch::dtype(torch::kFloat64).device(generator.device()));  // [L_i]
    uniform.index_copy_(0, torch::tensor(rows, torch::kInt64).to(device), draws.to(device));
  }
  // Inverse-CDF sampling: one uniform per row instead of multinomial's draw per vocabulary entry.
  torch::Tensor sampled_rows = torch::tensor(order, torch::kInt64).to(device);  // [S]
  torch::Tensor picked =
      inference::draw_by_inverse_cdf(torch::cat(probabilities, 0), uniform.index_select(0, sampled_rows));  // [S]
  next.index_copy_(0, sampled_rows, picked);
  return next;
}

void BatchRun::end_row(Row& row, std::string text, const char* reason) {
  row.ended = true;
  row.request->push(ChoiceEvent{row.choice, std::move(text), reason});
}

std::vector<bool> BatchRun::end_rows(const torch::Tensor& next_ids) {
  const int64_t* ids = next_ids.data_ptr<int64_t>();  // [R] on the host
  std::vector<bool> end(rows_.size(), false);
  const bool aborting = abort_.load();
  for (size_t r = 0; r < rows_.size(); ++r) {
    Row& row = rows_[r];
    if (row.ended) {
      end[r] = true;
      continue;
    }
    if (aborting || row.request->cancelled()) {  // nobody reads this row's text any more
      row.ended = end[r] = true;
      continue;
    }
    ++row.generated;
    ++generated_tokens_;
    row.request->add_completion_tokens(1);
    const SamplingParams& params = row.request->params();
    const auto& stop_ids = params.stop_token_ids;
    if (ids[r] == eos_ || std::find(stop_ids.begin(), stop_ids.end(), ids[r]) != stop_ids.end()) {
      end_row(row, row.text.finish(), "stop");
    } else {
      std::string piece = row.text.push(ids[r]);
      if (row.text.stopped()) {
        end_row(row, std::move(piece), "stop");
      } else if (row.generated >= params.max_tokens) {
        end_row(row, piece + row.text.finish(), "length");
      } else if (!piece.empty()) {
        row.request->push(ChoiceEvent{row.choice, std::move(piece), ""});
      }
    }
    end[r] = row.ended;
  }
  return end;
}

int64_t BatchRun::cancelled_requests() const {
  int64_t cancelled = 0;
  for (const auto& request : requests_) cancelled += request->cancelled() ? 1 : 0;
  return cancelled;
}

}  // namespace serve
}  // namespace dschat
