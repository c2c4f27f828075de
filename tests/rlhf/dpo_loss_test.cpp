// DPO math against a Python transcription of DeepSpeed-Chat's step2_dpo_finetuning/main.py (the
// label-mask loop of the train loop, get_batch_logps, the loss and the rewards), run by
// transformers on the same tiny checkpoints: the policy is tests/fixtures/opt-preln, the frozen
// reference opt-postln (same vocabulary), so the reference term is not zero. Pairs cover a shared
// prompt, identical rows, one answer a prefix of the other (the divergence falls in the shorter
// row's padding) and a pad id inside a row's text; beta/label smoothing 0.1/0 and 0.5/0.1.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

#include "dschat/core/error.h"
#include "dschat/models/load_save.h"
#include "dschat/rlhf/math/dpo_loss.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

constexpr int64_t kPad = 1;  // the fixtures' pad id (BOS = EOS = 2)

// [2B, T]: chosen rows, then rejected rows; `lengths` are the attention masks' real lengths.
struct Pairs {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> lengths;
};

Pairs pairs() {
  return {{{2, 5, 6, 7, 10, 11, 12, 2, 1, 1},  // shared prompt, differs at 4
           {2, 8, 9, 13, 14, 2, 1, 1, 1, 1},   // identical pair: the whole row is scored
           {2, 5, 6, 30, 1, 1, 1, 1, 1, 1},    // a prefix of its rejected row: scores nothing
           {2, 5, 1, 7, 8, 2, 1, 1, 1, 1},     // a pad id inside the text (attended, never a label)
           // rejected
           {2, 5, 6, 7, 20, 21, 2, 1, 1, 1},
           {2, 8, 9, 13, 14, 2, 1, 1, 1, 1},
           {2, 5, 6, 30, 31, 32, 2, 1, 1, 1},
           {2, 5, 1, 9, 2, 1, 1, 1, 1, 1}},
          {8, 6, 4, 6, 7, 6, 7, 5}};
}

const std::vector<std::string> kGradParams = {"model.decoder.embed_tokens.weight",
                                              "model.decoder.layers.0.self_attn.q_proj.weight",
                                              "model.decoder.layers.1.fc2.bias",
                                              "model.decoder.layers.1.final_layer_norm.weight"};
const std::vector<std::pair<double, double>> kSettings = {{0.1, 0.0}, {0.5, 0.1}};  // beta, label_smoothing

const char* kOracle = R"PY(
import json, sys
import torch
import torch.nn.functional as F
from transformers import OPTForCausalLM

IN = json.loads(IN_TEXT)

# DeepSpeed-Chat step2_dpo_finetuning/main.py, get_batch_logps
def get_batch_logps(logits, input_ids, label_mask):
    labels = input_ids.clone() * label_mask
    assert logits.shape[:-1] == labels.shape
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
    return (per_token_logps * label_mask[:, 1:]).sum(-1)

ids = torch.tensor(IN["ids"])
attention_mask = torch.zeros_like(ids)
for r, n in enumerate(IN["lengths"]):
    attention_mask[r, :n] = 1
out = []
for beta, label_smoothing in IN["settings"]:
    model = OPTForCausalLM.from_pretrained(IN["policy"]).eval()
    ref_model = OPTForCausalLM.from_pretrained(IN["reference"]).eval()
    # main.py's train loop
    batch_size = ids.shape[0] // 2
    chosen_input_ids = ids[:batch_size]
    rejected_input_ids = ids[batch_size:]
    label_mask = (ids != IN["pad"]).int()
    for i in range(batch_size):
        divergence_ind = (chosen_input_ids[i] != rejected_input_ids[i]).nonzero().squeeze(-1)
        if len(divergence_ind) > 0:
            divergence_ind = divergence_ind[0]
        else:
            divergence_ind = 0
        label_mask[i][:divergence_ind] = 0
        label_mask[i + batch_size][:divergence_ind] = 0
    outputs = model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
    with torch.no_grad():
        ref_outputs = ref_model(input_ids=ids, attention_mask=attention_mask)
    logps = get_batch_logps(outputs.logits, ids, label_mask)
    ref_logps = get_batch_logps(ref_outputs.logits, ids, label_mask)
    chosen_logps, rejected_logps = logps[:batch_size], logps[batch_size:]
    ref_chosen_logps, ref_rejected_logps = ref_logps[:batch_size], ref_logps[batch_size:]
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)
    loss = (-F.logsigmoid(beta * logits) * (1 - label_smoothing) -
            F.logsigmoid(-beta * logits) * label_smoothing).mean(0)
    loss.backward()
    chosen_rewards = beta * (chosen_logps - ref_chosen_logps).detach()
    rejected_rewards = beta * (rejected_logps - ref_rejected_logps).detach()
    params = dict(model.named_parameters())
    out.append({"label_mask": label_mask.tolist(), "logps": logps.tolist(), "ref_logps": ref_logps.tolist(),
                "loss": loss.item(), "chosen_rewards": chosen_rewards.tolist(),
                "rejected_rewards": rejected_rewards.tolist(),
                "grads": {n: params[n].grad.flatten().tolist() for n in IN["grad_params"]}})
json.dump(out, open(sys.argv[1], "w"))
)PY";

const json& oracle() {
  static const json result = [] {
    const Pairs p = pairs();
    json settings = json::array();
    for (const auto& [beta, smoothing] : kSettings) settings.push_back({beta, smoothing});
    const json input = {{"ids", p.ids}, {"lengths", p.lengths}, {"pad", kPad}, {"settings", settings},
                        {"grad_params", kGradParams},
                        {"policy", testing::fixture("opt-preln").string()},
                        {"reference", testing::fixture("opt-postln").string()}};
    return testing::run_python_json("IN_TEXT = r'''" + input.dump() + "'''\n" + kOracle);
  }();
  return result;
}

torch::Tensor as_tensor(const json& values) {
  return torch::tensor(values.get<std::vector<double>>(), torch::kDouble);  // [n]
}

TEST(DpoLoss, MatchesDeepSpeedChatsStepTwoDpoOnTheSameModels) {
  const json& want = oracle();
  ASSERT_EQ(want.size(), kSettings.size());
  const Pairs p = pairs();
  const int64_t rows = static_cast<int64_t>(p.ids.size()), length = static_cast<int64_t>(p.ids[0].size());
  torch::Tensor ids = torch::empty({rows, length}, torch::kInt64);       // [2B, T]
  torch::Tensor attention = torch::zeros({rows, length}, torch::kInt64);  // [2B, T]
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < length; ++t) ids[r][t] = p.ids[r][t];
    attention[r].narrow(0, 0, p.lengths[r]).fill_(1);
  }
  const torch::Tensor mask = rlhf::dpo_label_mask(ids, kPad);  // [2B, T]
  for (size_t k = 0; k < kSettings.size(); ++k) {
    const auto [beta, smoothing] = kSettings[k];
    const json& w = want[k];
    SCOPED_TRACE("beta " + std::to_string(beta) + ", label_smoothing " + std::to_string(smoothing));
    for (int64_t r = 0; r < rows; ++r) {
      const auto expected_row = w["label_mask"][r].get<std::vector<int64_t>>();
      EXPECT_TRUE(torch::equal(mask[r], torch::tensor(expected_row, torch::kInt64))) << "label mask row " << r;
    }
    models::CausalLM policy = models::load_causal_lm(testing::fixture("opt-preln").string());
    models::CausalLM reference = models::load_causal_lm(testing::fixture("opt-postln").string());
    policy->eval();
    reference->eval();
    torch::Tensor logps = rlhf::dpo_sequence_log_probs(policy->forward(ids, attention, nn::MaskLayout::kRightPadded),
                                                       ids, mask);  // [2B]
    torch::Tensor ref_logps;  // [2B]
    {
      torch::NoGradGuard no_grad;
      ref_logps = rlhf::dpo_sequence_log_probs(reference->forward(ids, attention, nn::MaskLayout::kRightPadded), ids,
                                               mask);
    }
    EXPECT_LE(testing::max_abs_diff(logps.detach(), as_tensor(w["logps"])), 1e-4);
    EXPECT_LE(testing::max_abs_diff(ref_logps, as_tensor(w["ref_logps"])), 1e-4);
    EXPECT_EQ(logps[2].item<double>(), 0.0);  // the prefix row scores nothing
    rlhf::DpoLossOutput out = rlhf::dpo_loss(logps, ref_logps, beta, smoothing);
    EXPECT_NEAR(out.loss.item<double>(), w["loss"].get<double>(), 1e-5);
    EXPECT_LE(testing::max_abs_diff(out.chosen_rewards, as_tensor(w["chosen_rewards"])), 1e-5);
    EXPECT_LE(testing::max_abs_diff(out.rejected_rewards, as_tensor(w["rejected_rewards"])), 1e-5);
    out.loss.backward();
    std::map<std::string, torch::Tensor> params;
    for (const auto& item : policy->named_parameters()) params[item.key()] = item.value();
    for (const std::string& name : kGradParams) {
      ASSERT_TRUE(params.count(name)) << name;
      const torch::Tensor expected = as_tensor(w["grads"][name]);  // [numel]
      const torch::Tensor got = params.at(name).grad().reshape({-1});
      const double scale = expected.abs().max().item<double>();
      EXPECT_LE(testing::max_abs_diff(got, expected), 1e-6 + 1e-4 * scale) << name;
    }
  }
}

TEST(DpoLoss, RefusesBadShapesAndSettings) {
  EXPECT_THROW_WITH(rlhf::dpo_label_mask(torch::zeros({3, 4}, torch::kInt64), 1), core::InvalidArgument, "[2B, T]");
  const torch::Tensor logps = torch::zeros({4});
  EXPECT_THROW_WITH(rlhf::dpo_loss(logps, logps, -0.1, 0.0), core::InvalidArgument, "beta must be >= 0");
  EXPECT_THROW_WITH(rlhf::dpo_loss(logps, logps, 0.1, 0.7), core::InvalidArgument, "label_smoothing");
  EXPECT_THROW_WITH(rlhf::dpo_loss(logps, torch::zeros({2}), 0.1, 0.0), core::InvalidArgument, "[2B]");
  // Equal policy and reference: h = 0, the loss is log 2 whatever the smoothing.
  EXPECT_NEAR(rlhf::dpo_loss(logps, logps, 0.1, 0.2).loss.item<double>(), std::log(2.0), 1e-7);
}

}  // namespace
}  // namespace dschat
