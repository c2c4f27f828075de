// Step-1 loss against transformers' own ForCausalLMLoss (what OPT/LLaMA's forward returns as
// `loss`) on DeepSpeed-Chat's labels (ids where attention_mask is 1, -100 on padding), and the
// evaluation's perplexity against torch.exp on a float32 tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/rlhf/math/sft_loss.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;

json to_json(const torch::Tensor& t) {
  torch::Tensor flat = t.detach().to(torch::kCPU).to(t.is_floating_point() ? torch::kDouble : torch::kLong)
                           .contiguous().reshape({-1});  // [numel]
  json data = json::array();
  for (int64_t i = 0; i < flat.numel(); ++i) {
    if (t.is_floating_point()) data.push_back(flat[i].item<double>());
    else data.push_back(flat[i].item<int64_t>());
  }
  return {{"shape", t.sizes().vec()}, {"data", data}};
}

void expect_close(const torch::Tensor& got, const json& want, double tol, const std::string& what) {
  std::vector<double> data = want["data"].get<std::vector<double>>();
  torch::Tensor expected =
      torch::tensor(data, torch::kDouble).reshape(want["shape"].get<std::vector<int64_t>>());  // shape of got
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_LE(testing::max_abs_diff(got, expected), tol) << what;
}

// OPT-style rows (pad = eos = bos = 2), right padded: a full row, an EOS (id 2, mask 1) inside the
// counted span followed by padding, and a short row.
struct SftBatch {
  torch::Tensor input_ids;       // [B, T]
  torch::Tensor attention_mask;  // [B, T]
  torch::Tensor logits;          // [B, T, V]
};
constexpr int64_t kVocab = 11;

SftBatch make_batch(uint64_t seed) {
  torch::manual_seed(seed);
  SftBatch b;
  b.input_ids = torch::tensor({{2, 5, 6, 7, 8, 9, 10},
                               {2, 4, 3, 2, 2, 2, 2},
                               {2, 7, 2, 2, 2, 2, 2}}, torch::kLong);
  b.attention_mask = torch::tensor({{1, 1, 1, 1, 1, 1, 1},
                                    {1, 1, 1, 1, 0, 0, 0},
                                    {1, 1, 0, 0, 0, 0, 0}}, torch::kLong);
  b.logits = torch::randn({3, 7, kVocab}) * 2;
  return b;
}

const std::vector<float> kMeanLosses = {0.0f, 0.6931472f, 2.5f, 88.0f, 88.8f, 1000.0f};

const char* kOracle = R"PY(
import json, math, sys, torch
from transformers.loss.loss_utils import ForCausalLMLoss
IN = json.loads(IN_TEXT)
def T(d, dtype=torch.float32): return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).to(dtype)
def J(t): return {"shape": list(t.shape), "data": t.detach().double().flatten().tolist()}
out = {"cases": []}
for c in IN["cases"]:
    ids, mask = T(c["ids"], torch.long), T(c["mask"], torch.long)
    labels = torch.where(mask == 1, ids, -100)  # DS-Chat phase 1 since #819
    logits = T(c["logits"], torch.bfloat16 if c["bf16"] else torch.float32).requires_grad_(True)
    loss = ForCausalLMLoss(logits, labels, vocab_size=logits.shape[-1])
    loss.backward()
    out["cases"].append({"loss": loss.item(), "grad": J(logits.grad), "labels": labels.flatten().tolist()})
ppl = [torch.exp(torch.tensor(x, dtype=torch.float32)).item() for x in IN["mean_losses"]]
out["ppl"] = [p if math.isfinite(p) else None for p in ppl]  # JSON has no inf
json.dump(out, open(sys.argv[1], "w"))
)PY";

const json& oracle() {
  static const json result = [] {
    json input = {{"cases", json::array()}, {"mean_losses", kMeanLosses}};
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      SftBatch b = make_batch(41 + bf16);
      torch::Tensor logits = bf16 ? b.logits.to(torch::kBFloat16) : b.logits;  // [B, T, V]
      input["cases"].push_back({{"ids", to_json(b.input_ids)}, {"mask", to_json(b.attention_mask)},
                                {"logits", to_json(logits)}, {"bf16", bf16 == 1}});
    }
    return testing::run_python_json("IN_TEXT = r'''" + input.dump() + "'''\n" + kOracle);
  }();
  return result;
}

TEST(SftLoss, MatchesTransformersCausalLmLossOnDeepSpeedChatLabels) {
  const json& want = oracle();
  ASSERT_TRUE(want.contains("cases"));
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    const json& w = want["cases"][bf16];
    const std::string tag = bf16 ? "bf16 logits" : "fp32 logits";
    SftBatch b = make_batch(41 + bf16);
    torch::Tensor logits = (bf16 ? b.logits.to(torch::kBFloat16) : b.logits).requires_grad_(true);  // [B, T, V]
    torch::Tensor loss = rlhf::sft_loss(logits, b.input_ids, b.attention_mask);  // []
    EXPECT_EQ(loss.scalar_type(), torch::kFloat) << tag;
    EXPECT_NEAR(loss.item<double>(), w["loss"].get<double>(), 1e-6) << tag;
    loss.backward();
    expect_close(logits.grad(), w["grad"], 1e-6, tag + " gradient");
    // The EOS inside row 1 (id 2 = pad, but mask 1) is a target; padding is not.
    torch::Tensor labels = b.input_ids.masked_fill(b.attention_mask.eq(0), rlhf::kIgnoreIndex).reshape({-1});  // [B*T]
    EXPECT_EQ(std::vector<int64_t>(labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel()),
              w["labels"].get<std::vector<int64_t>>());
  }
}

TEST(SftLoss, PromptTokensCountAndPaddingDoesNot) {
  SftBatch b = make_batch(41);
  // Changing a logit at a padded target position (row 2, position 3 predicts padding) leaves the
  // loss unchanged; changing a prompt position (row 0, position 1) changes it.
  torch::Tensor base = rlhf::sft_loss(b.logits, b.input_ids, b.attention_mask);  // []
  torch::Tensor padded = b.logits.clone();  // [B, T, V]
  padded[2][3][0] += 5;
  EXPECT_TRUE(torch::equal(rlhf::sft_loss(padded, b.input_ids, b.attention_mask), base));
  torch::Tensor prompt = b.logits.clone();  // [B, T, V]
  prompt[0][1][0] += 5;
  EXPECT_FALSE(torch::equal(rlhf::sft_loss(prompt, b.input_ids, b.attention_mask), base));
  // No target at all: 0 / 0 as in transformers.
  EXPECT_TRUE(std::isnan(rlhf::sft_loss(b.logits, b.input_ids, torch::zeros_like(b.attention_mask)).item<float>()));
  EXPECT_THROW_WITH(rlhf::causal_lm_loss(b.logits, b.input_ids.slice(1, 1)), core::InvalidArgument,
                    "must be [B, T] of logits");
}

TEST(SftLoss, PerplexityIsFloat32Exp) {
  const json& want = oracle()["ppl"];
  ASSERT_EQ(want.size(), kMeanLosses.size());
  for (size_t i = 0; i < kMeanLosses.size(); ++i) {
    const float ppl = rlhf::perplexity(kMeanLosses[i]);
    if (want[i].is_number()) {
      EXPECT_EQ(ppl, want[i].get<float>()) << kMeanLosses[i];
    } else {
      EXPECT_TRUE(std::isinf(ppl)) << kMeanLosses[i];  // None: overflowed to inf
    }
  }
  EXPECT_TRUE(std::isinf(rlhf::perplexity(88.8f)));  // float32 exp overflows past ~88.72
  EXPECT_FALSE(std::isinf(rlhf::perplexity(88.0f)));
}

}  // namespace
}  // namespace dschat
