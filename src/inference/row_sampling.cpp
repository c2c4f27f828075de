#include "inference/row_sampling.h"

#include <limits>
#include <map>
#include <tuple>

#include "dschat/core/host_sync.h"
#include "dschat/inference/logits_processing.h"

namespace dschat {
namespace inference {

namespace {

// A penalty makes a row's logits depend on its own tokens.
bool reads_own_tokens(const core::GenerationConfig& c) {
  return c.repetition_penalty != 1.0 || c.frequency_penalty != 0.0 || c.presence_penalty != 0.0;
}

}  // namespace

std::vector<int64_t> sample_rows(const torch::Tensor& logits, const std::vector<RowSampling>& rows) {
  const int64_t count = static_cast<int64_t>(rows.size());
  // (do_sample, temperature, top_k, top_p, EOS suppressed, EOS id) -> rows; -1 - r keys a row alone.
  using Key = std::tuple<int64_t, bool, double, int64_t, double, bool, int64_t>;
  std::map<Key, std::vector<int64_t>> groups;
  for (int64_t r = 0; r < count; ++r) {
    const core::GenerationConfig& c = *rows[r].config;
    const bool suppress_eos = c.eos_token_id && rows[r].generated < c.min_new_tokens;
    const int64_t alone = reads_own_tokens(c) || !c.logit_bias.empty() || rows[r].constraint ? r : -1;
    groups[Key{alone, c.do_sample, c.do_sample ? c.temperature : 1.0, c.do_sample ? c.top_k : 0,
               c.do_sample ? c.top_p : 1.0, suppress_eos, suppress_eos ? *c.eos_token_id : -1}]
        .push_back(r);
  }
  torch::Tensor next = torch::empty({count}, torch::dtype(torch::kInt64).device(logits.device()));  // [R]
  for (const auto& [key, members] : groups) {
    const RowSampling& first = rows[members.front()];
    torch::Tensor index = torch::tensor(members, torch::kInt64).to(logits.device());  // [G]
    torch::Tensor group = logits.index_select(0, index);                               // [G, V], a copy
    torch::Tensor seen;  // [1, S], the penalties' (such a row is alone in its group)
    if (reads_own_tokens(*first.config)) {
      seen = torch::tensor(*first.tokens, torch::kInt64).to(logits.device()).unsqueeze(0);
    }
    if (first.constraint) {  // before anything else, as vLLM applies a grammar's bitmask
      const std::vector<int64_t> generated(first.tokens->end() - first.generated, first.tokens->end());
      torch::Tensor allowed = first.constraint->allowed(generated, group.size(1)).to(logits.device());  // [V]
      group.masked_fill_(allowed.logical_not().unsqueeze(0), -std::numeric_limits<float>::infinity());
    }
    group = process_logits(group, seen, *first.config, first.generated);
    std::vector<at::Generator> generators;
    if (first.config->do_sample) {
      for (int64_t r : members) generators.push_back(rows[r].generator);
    }
    next.index_copy_(0, index, select_next_tokens(group, *first.config, generators));
  }
  core::HostSync sync("continuous engine (the step's ids)");
  torch::Tensor host = next.cpu();  // [R]
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + count);
}

}  // namespace inference
}  // namespace dschat
