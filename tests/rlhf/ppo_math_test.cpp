// PPO math against a Python transcription of DeepSpeed-Chat's DeepSpeedPPOTrainer methods
// (compute_rewards, the train_rlhf zeroing, get_advantages_and_returns, actor_loss_fn,
// critic_loss_fn), _generate_sequence's answer filter and utils.moving_average, run once through
// the project venv on seeded batches with left-padded prompts, EOS-terminated answers, a full-length
// answer and rows the filter drops; plus hand-computed cases.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dschat/core/error.h"
#include "dschat/rlhf/math/ppo_math.h"
#include "test_util.h"

namespace dschat {
namespace {

using nlohmann::json;
constexpr int64_t kPad = 2;  // OPT: pad = eos = bos

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

torch::Tensor from_json(const json& j, torch::ScalarType dtype = torch::kFloat) {
  std::vector<double> data = j["data"].get<std::vector<double>>();
  return torch::tensor(data, torch::kDouble).reshape(j["shape"].get<std::vector<int64_t>>()).to(dtype);
}

void expect_close(const torch::Tensor& got, const json& want, double tol, const std::string& what) {
  torch::Tensor expected = from_json(want, torch::kDouble);  // shape of got: Python's values
  ASSERT_EQ(got.sizes(), expected.sizes()) << what;
  EXPECT_LE(testing::max_abs_diff(got, expected), tol) << what;
}

// One experience batch: row r has prompt_pads[r] left pads, a BOS (= pad), random prompt tokens,
// answer_lens[r] random answer tokens, then EOS (= pad) and padding up to max_answer.
struct Scenario {
  int64_t prompt_length = 0;
  torch::Tensor seq;            // [B, L] int64, L = P + max_answer
  torch::Tensor log_probs;      // [B, L-1] the actor's old log-probs
  torch::Tensor ref_log_probs;  // [B, L-1]
  torch::Tensor values;         // [B, L-1] the critic's old values
  torch::Tensor reward_score;   // [B] reward-model end scores (some beyond +-5)
  torch::Tensor new_log_probs;  // [B, L-1] the actor's log-probs in training
  torch::Tensor new_values;     // [B, L-1] the critic's values in training
};

Scenario make_scenario(uint64_t seed, int64_t prompt_length, const std::vector<int64_t>& prompt_pads,
                       const std::vector<int64_t>& answer_lens, int64_t max_answer) {
  torch::manual_seed(seed);
  const int64_t rows = static_cast<int64_t>(answer_lens.size());
  const int64_t length = prompt_length + max_answer;
  Scenario s;
  s.prompt_length = prompt_length;
  s.seq = torch::randint(3, 60, {rows, length}, torch::kLong);  // [B, L]
  for (int64_t r = 0; r < rows; ++r) {
    s.seq[r].slice(0, 0, prompt_pads[r] + 1).fill_(kPad);                  // left padding + BOS
    s.seq[r].slice(0, prompt_length + answer_lens[r]).fill_(kPad);         // EOS + right padding
  }
  s.log_probs = -torch::rand({rows, length - 1}) * 3;
  s.ref_log_probs = s.log_probs + torch::randn({rows, length - 1}) * 0.5;
  s.values = torch::randn({rows, length - 1});
  s.reward_score = torch::randn({rows}) * 6;
  s.new_log_probs = s.log_probs + torch::randn({rows, length - 1}) * 0.3;
  s.new_values = s.values + torch::randn({rows, length - 1}) * 0.3;
  return s;
}

json scenario_json(const Scenario& s) {
  return {{"prompt_length", s.prompt_length}, {"seq", to_json(s.seq)},
          {"log_probs", to_json(s.log_probs)}, {"ref_log_probs", to_json(s.ref_log_probs)},
          {"values", to_json(s.values)}, {"reward_score", to_json(s.reward_score)},
          {"new_log_probs", to_json(s.new_log_probs)}, {"new_values", to_json(s.new_values)}};
}

std::vector<Scenario> scenarios() {
  // Rows: answers of 7 (the full row), 4, 1 (dropped), 0 (dropped), 2 (the shortest kept) and 6
  // tokens, under various left paddings; the second batch has a longer prompt and answer.
  return {make_scenario(11, 6, {0, 3, 1, 2, 0, 4}, {7, 4, 1, 0, 2, 6}, 7),
          make_scenario(12, 9, {5, 0, 2}, {11, 3, 9}, 11),
          make_scenario(13, 4, {1, 2}, {1, 0}, 5)};  // every row dropped
}

// The oracle: DS-Chat's functions as published (ppo_trainer.py, utils.moving_average), verbatim
// apart from `self` becoming a constants holder; clip fractions computed as trl does.
const char* kOracle = R"PY(
import json, sys, torch
IN = json.loads(IN_TEXT)
def T(d, dtype=torch.float32): return torch.tensor(d["data"], dtype=torch.float64).reshape(d["shape"]).to(dtype)
def J(t): return {"shape": list(t.shape), "data": t.detach().double().flatten().tolist()}

class PPO:
    kl_ctl = 0.1; clip_reward_value = 5; cliprange = 0.2; cliprange_value = 0.2; gamma = 1.0; lam = 0.95
    compute_fp32_loss = False
    def compute_rewards(self, prompts, log_probs, ref_log_probs, reward_score, action_mask):
        kl_divergence_estimate = -self.kl_ctl * (log_probs - ref_log_probs)
        rewards = kl_divergence_estimate
        start = prompts.shape[1] - 1
        ends = start + action_mask[:, start:].sum(1) + 1
        reward_clip = torch.clamp(reward_score, -self.clip_reward_value, self.clip_reward_value)
        batch_size = log_probs.shape[0]
        for j in range(batch_size):
            rewards[j, start:ends[j]][-1] += reward_clip[j]
        return rewards
    def actor_loss_fn(self, logprobs, old_logprobs, advantages, mask):
        log_ratio = (logprobs - old_logprobs) * mask
        ratio = torch.exp(log_ratio)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - self.cliprange, 1.0 + self.cliprange)
        pg_loss = torch.sum(torch.max(pg_loss1, pg_loss2) * mask) / mask.sum()
        clipfrac = torch.sum((pg_loss2 > pg_loss1).float() * mask) / mask.sum()
        return pg_loss, clipfrac
    def critic_loss_fn(self, values, old_values, returns, mask):
        values_clipped = torch.clamp(values, old_values - self.cliprange_value, old_values + self.cliprange_value)
        if self.compute_fp32_loss:
            values = values.float()
            values_clipped = values_clipped.float()
        vf_loss1 = (values - returns)**2
        vf_loss2 = (values_clipped - returns)**2
        vf_loss = 0.5 * torch.sum(torch.max(vf_loss1, vf_loss2) * mask) / mask.sum()
        clipfrac = torch.sum((vf_loss2 > vf_loss1).float() * mask) / mask.sum()
        return vf_loss, clipfrac
    def get_advantages_and_returns(self, values, rewards, start):
        lastgaelam = 0
        advantages_reversed = []
        length = rewards.size()[-1]
        for t in reversed(range(start, length)):
            nextvalues = values[:, t + 1] if t < length - 1 else 0.0
            delta = rewards[:, t] + self.gamma * nextvalues - values[:, t]
            lastgaelam = delta + self.gamma * self.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values[:, start:]
        return advantages.detach(), returns

ppo = PPO()
out = {"cases": []}
for c in IN["cases"]:
    seq = T(c["seq"], torch.long); P = c["prompt_length"]; pad = IN["pad"]
    ans = seq[:, P:]
    valid_ans_len = (ans != pad).sum(dim=-1)
    keep = [i for i in range(seq.shape[0]) if not valid_ans_len[i] <= 1]
    prompts = seq[:, :P]
    log_probs, ref, values = T(c["log_probs"]), T(c["ref_log_probs"]), T(c["values"])
    score, new_lp, new_v = T(c["reward_score"]), T(c["new_log_probs"]), T(c["new_values"])
    attention_mask = seq.not_equal(pad).long()
    start = prompts.size()[-1] - 1
    action_mask = attention_mask[:, 1:]
    raw = ppo.compute_rewards(prompts, log_probs, ref, score, action_mask).clone()
    old_values = values.clone()
    with torch.no_grad():
        old_rewards = ppo.compute_rewards(prompts, log_probs, ref, score, action_mask)
        ends = start + action_mask[:, start:].sum(1) + 1
        for i in range(old_rewards.shape[0]):
            old_rewards[i, ends[i]:] = 0
            old_values[i, ends[i]:] = 0
        advantages, returns = ppo.get_advantages_and_returns(old_values, old_rewards, start)
    new_lp = new_lp.requires_grad_(True); new_v = new_v.requires_grad_(True)
    actor, actor_clip = ppo.actor_loss_fn(new_lp[:, start:], log_probs[:, start:], advantages, action_mask[:, start:])
    critic, critic_clip = ppo.critic_loss_fn(new_v[:, start:], old_values[:, start:], returns, action_mask[:, start:])
    (actor + critic).backward()
    out["cases"].append({"keep": keep, "lengths": valid_ans_len.tolist(), "ends": ends.tolist(),
        "raw_rewards": J(raw), "rewards": J(old_rewards), "old_values": J(old_values),
        "advantages": J(advantages), "returns": J(returns), "actor_loss": actor.item(),
        "actor_clip": actor_clip.item(), "critic_loss": critic.item(), "critic_clip": critic_clip.item(),
        "actor_grad": J(new_lp.grad), "critic_grad": J(new_v.grad)})

b = IN["bf16_critic"]
ppo.compute_fp32_loss = True
loss, clip = ppo.critic_loss_fn(T(b["values"], torch.bfloat16), T(b["old_values"], torch.bfloat16),
                                T(b["returns"]), T(b["mask"], torch.long))
out["bf16_critic"] = {"loss": loss.item(), "clip": clip.item(), "dtype": str(loss.dtype)}

class M(torch.nn.Module):
    def __init__(self, params):
        super().__init__()
        self.p = torch.nn.ParameterList([torch.nn.Parameter(p) for p in params])
model = M([T(p) for p in IN["ema"]["model"]]); ema = M([T(p) for p in IN["ema"]["ema"]])
with torch.no_grad():
    for param, param_ema in zip(model.parameters(), ema.parameters()):
        param_ema.data.copy_(torch.lerp(param.data, param_ema.data, 0.992))
out["ema"] = [J(p) for p in ema.parameters()]
json.dump(out, open(sys.argv[1], "w"))
)PY";

// Two-level module so that named_parameters() has nested names ("inner.weight").
struct Net : torch::nn::Module {
  Net() {
    inner = register_module("inner", torch::nn::Linear(3, 4));
    scale = register_parameter("scale", torch::randn({2}));
  }
  torch::nn::Linear inner{nullptr};
  torch::Tensor scale;  // [2]
};

// bf16 critic values with float32 returns, for the --compute_fp32_loss path.
struct CriticInputs {
  torch::Tensor values;      // [B, A] bf16
  torch::Tensor old_values;  // [B, A] bf16
  torch::Tensor returns;     // [B, A] float32
  torch::Tensor mask;        // [B, A] 0/1
};

CriticInputs bf16_critic_inputs() {
  torch::manual_seed(21);
  CriticInputs c;
  c.values = torch::randn({3, 5}).to(torch::kBFloat16);
  c.old_values = (c.values.to(torch::kFloat) + torch::randn({3, 5}) * 0.3).to(torch::kBFloat16);
  c.returns = torch::randn({3, 5});
  c.mask = torch::tensor({1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1}, torch::kLong).reshape({3, 5});
  return c;
}

const json& oracle() {
  static const json result = [] {
    json input = {{"pad", kPad}, {"cases", json::array()}};
    for (const Scenario& s : scenarios()) input["cases"].push_back(scenario_json(s));
    const CriticInputs critic = bf16_critic_inputs();
    input["bf16_critic"] = {{"values", to_json(critic.values)}, {"old_values", to_json(critic.old_values)},
                            {"returns", to_json(critic.returns)}, {"mask", to_json(critic.mask)}};
    torch::manual_seed(22);
    Net model, ema;
    json params = json::array(), ema_params = json::array();
    for (const auto& p : model.parameters()) params.push_back(to_json(p));
    for (const auto& p : ema.parameters()) ema_params.push_back(to_json(p));
    input["ema"] = {{"model", params}, {"ema", ema_params}};
    // The inputs travel inside the script (run_python_json passes only the output path).
    const std::string script = "IN_TEXT = r'''" + input.dump() + "'''\n" + kOracle;
    return testing::run_python_json(script);
  }();
  return result;
}

TEST(PpoMath, MatchesDeepSpeedChatOnSeededBatches) {
  const json& want = oracle();
  ASSERT_TRUE(want.contains("cases"));
  const std::vector<Scenario> batches = scenarios();
  for (size_t k = 0; k < batches.size(); ++k) {
    const Scenario& s = batches[k];
    const json& w = want["cases"][k];
    const std::string tag = "batch " + std::to_string(k);
    const int64_t start = rlhf::action_start(s.prompt_length);
    torch::Tensor action_mask = s.seq.ne(kPad).to(torch::kLong).slice(1, 1);  // [B, L-1]

    torch::Tensor lengths = rlhf::answer_lengths(s.seq, s.prompt_length, kPad);  // [B]
    EXPECT_EQ(std::vector<int64_t>(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel()),
              w["lengths"].get<std::vector<int64_t>>()) << tag;
    torch::Tensor keep = rlhf::answer_keep_rows(s.seq, s.prompt_length, kPad);  // [K]
    EXPECT_EQ(std::vector<int64_t>(keep.data_ptr<int64_t>(), keep.data_ptr<int64_t>() + keep.numel()),
              w["keep"].get<std::vector<int64_t>>()) << tag;
    torch::Tensor ends = rlhf::reward_end_indices(start, action_mask);  // [B]
    EXPECT_EQ(std::vector<int64_t>(ends.data_ptr<int64_t>(), ends.data_ptr<int64_t>() + ends.numel()),
              w["ends"].get<std::vector<int64_t>>()) << tag;

    expect_close(rlhf::compute_rewards(start, s.log_probs, s.ref_log_probs, s.reward_score, action_mask),
                 w["raw_rewards"], 1e-6, tag + " compute_rewards");
    rlhf::PpoTargets targets =
        rlhf::compute_ppo_targets(start, s.log_probs, s.ref_log_probs, s.reward_score, s.values, action_mask);
    expect_close(targets.rewards, w["rewards"], 1e-6, tag + " rewards zeroed after ends");
    expect_close(targets.old_values, w["old_values"], 1e-6, tag + " old values zeroed after ends");
    expect_close(targets.advantages, w["advantages"], 1e-6, tag + " advantages");
    expect_close(targets.returns, w["returns"], 1e-6, tag + " returns");
    EXPECT_FALSE(targets.advantages.requires_grad());

    torch::Tensor new_lp = s.new_log_probs.clone().requires_grad_(true);  // [B, L-1]
    torch::Tensor new_v = s.new_values.clone().requires_grad_(true);      // [B, L-1]
    torch::Tensor mask = action_mask.slice(1, start);                     // [B, L-1-start]
    rlhf::PpoLoss actor =
        rlhf::actor_loss(new_lp.slice(1, start), s.log_probs.slice(1, start), targets.advantages, mask);
    rlhf::PpoLoss critic =
        rlhf::critic_loss(new_v.slice(1, start), targets.old_values.slice(1, start), targets.returns, mask);
    EXPECT_NEAR(actor.loss.item<double>(), w["actor_loss"].get<double>(), 1e-6) << tag;
    EXPECT_NEAR(actor.clip_fraction.item<double>(), w["actor_clip"].get<double>(), 1e-6) << tag;
    EXPECT_NEAR(critic.loss.item<double>(), w["critic_loss"].get<double>(), 1e-6) << tag;
    EXPECT_NEAR(critic.clip_fraction.item<double>(), w["critic_clip"].get<double>(), 1e-6) << tag;
    (actor.loss + critic.loss).backward();
    expect_close(new_lp.grad(), w["actor_grad"], 1e-6, tag + " actor gradient");
    expect_close(new_v.grad(), w["critic_grad"], 1e-6, tag + " critic gradient");
  }
  // The clip branches were exercised, not just the unclipped path.
  EXPECT_GT(want["cases"][0]["actor_clip"].get<double>(), 0.0);
  EXPECT_GT(want["cases"][0]["critic_clip"].get<double>(), 0.0);
}

TEST(PpoMath, AllRowsDroppedGivesAnEmptyKeepSet) {
  const Scenario s = scenarios()[2];
  torch::Tensor keep = rlhf::answer_keep_rows(s.seq, s.prompt_length, kPad);  // [0]
  EXPECT_EQ(keep.numel(), 0);
  EXPECT_EQ(keep.dim(), 1);
  EXPECT_EQ(keep.scalar_type(), torch::kLong);
  EXPECT_TRUE(oracle()["cases"][2]["keep"].empty());
  // Selecting with the empty set gives an empty batch that the rest of the math accepts.
  torch::Tensor none = s.seq.index_select(0, keep);  // [0, L]
  EXPECT_EQ(rlhf::answer_keep_rows(none, s.prompt_length, kPad).numel(), 0);
  torch::Tensor lp = s.log_probs.index_select(0, keep);  // [0, L-1]
  rlhf::PpoTargets t = rlhf::compute_ppo_targets(s.prompt_length - 1, lp, lp, torch::zeros({0}), lp,
                                                 torch::zeros_like(lp, torch::kLong));
  EXPECT_EQ(t.advantages.size(0), 0);
}

TEST(PpoMath, CriticLossInFloat32FromBf16Values) {
  const json& b = oracle()["bf16_critic"];
  const CriticInputs c = bf16_critic_inputs();
  rlhf::PpoLoss loss = rlhf::critic_loss(c.values, c.old_values, c.returns, c.mask, {}, /*compute_fp32=*/true);
  EXPECT_EQ(loss.loss.scalar_type(), torch::kFloat);
  EXPECT_EQ(b["dtype"].get<std::string>(), "torch.float32");
  EXPECT_NEAR(loss.loss.item<double>(), b["loss"].get<double>(), 1e-6);
  EXPECT_NEAR(loss.clip_fraction.item<double>(), b["clip"].get<double>(), 1e-6);
}

TEST(PpoMath, EmaUpdateMatchesMovingAverage) {
  torch::manual_seed(22);
  Net model, ema;
  rlhf::ema_update(model, ema);
  const json& want = oracle()["ema"];
  std::vector<torch::Tensor> params = ema.parameters();
  ASSERT_EQ(params.size(), want.size());
  for (size_t i = 0; i < params.size(); ++i) {
    expect_close(params[i], want[i], 1e-7, "ema parameter " + std::to_string(i));
  }
}

TEST(PpoMath, EmaUpdateRejectsMismatchedModules) {
  torch::nn::Linear a(3, 4), b(4, 3);
  EXPECT_THROW_WITH(rlhf::ema_update(*a, *b), core::InvalidArgument, "'weight' is [4, 3] in the model but [3, 4]");
  Net net;
  EXPECT_THROW_WITH(rlhf::ema_update(*a, net), core::InvalidArgument, "the model has 2 parameters, the EMA model 3");
}

TEST(PpoMath, HandComputedGaeOneRow) {
  // start 1, actions 1 and 2; gamma 1, lam 0.95:
  //   t=2: delta = 1.0 - 0.4 = 0.6, A = 0.6;  t=1: delta = 0.5 + 0.4 - 0.2 = 0.7, A = 0.7 + 0.95 * 0.6
  torch::Tensor values = torch::tensor({{0.3f, 0.2f, 0.4f}});   // [1, 3]
  torch::Tensor rewards = torch::tensor({{0.0f, 0.5f, 1.0f}});  // [1, 3]
  rlhf::AdvantagesAndReturns gae = rlhf::get_advantages_and_returns(values, rewards, 1);
  EXPECT_LE(testing::max_abs_diff(gae.advantages, torch::tensor({{1.27, 0.6}})), 1e-6);
  EXPECT_LE(testing::max_abs_diff(gae.returns, torch::tensor({{1.47, 1.0}})), 1e-6);
  // gamma 0.5, lam 0.5: t=1: delta = 0.5 + 0.5 * 0.4 - 0.2 = 0.5, A = 0.5 + 0.25 * 0.6 = 0.65
  rlhf::PpoConstants c;
  c.gamma = 0.5;
  c.lam = 0.5;
  gae = rlhf::get_advantages_and_returns(values, rewards, 1, c);
  EXPECT_LE(testing::max_abs_diff(gae.advantages, torch::tensor({{0.65, 0.6}})), 1e-6);
}

TEST(PpoMath, HandComputedRewardSlot) {
  // P = 3 (start 2), seq [BOS, p, p, a, a, EOS, pad]: two answer tokens, ends = 2 + 2 + 1 = 5, so
  // the clipped score (7 -> 5) lands on action 4, the one that produces the EOS.
  torch::Tensor seq = torch::tensor({{2, 5, 6, 7, 8, 2, 2}});          // [1, 7]
  torch::Tensor action_mask = seq.ne(kPad).to(torch::kLong).slice(1, 1);  // [1, 6]
  torch::Tensor lp = torch::full({1, 6}, -1.0f);                          // [1, 6]
  torch::Tensor rewards = rlhf::compute_rewards(2, lp, lp, torch::tensor({7.0f}), action_mask);  // [1, 6]
  EXPECT_TRUE(torch::equal(rewards, torch::tensor({{0.0f, 0.0f, 0.0f, 0.0f, 5.0f, 0.0f}})));
  EXPECT_EQ(rlhf::reward_end_indices(2, action_mask).item<int64_t>(), 5);
  // A full-length answer (ends = L = 7) takes the score on the last action, 5.
  torch::Tensor full = torch::tensor({{2, 5, 6, 7, 8, 9, 10}});  // [1, 7]
  rewards = rlhf::compute_rewards(2, lp, lp, torch::tensor({-9.0f}), full.ne(kPad).to(torch::kLong).slice(1, 1));
  EXPECT_TRUE(torch::equal(rewards, torch::tensor({{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -5.0f}})));
}

TEST(PpoMath, RejectsBadShapesAndStart) {
  torch::Tensor lp = torch::zeros({2, 4});  // [B, L-1]
  torch::Tensor mask = torch::ones({2, 4}, torch::kLong);  // [B, L-1]
  EXPECT_THROW_WITH(rlhf::compute_rewards(4, lp, lp, torch::zeros({2}), mask), core::InvalidArgument,
                    "start 4 must index an action column in [0, 4)");
  EXPECT_THROW_WITH(rlhf::compute_rewards(1, lp, lp, torch::zeros({3}), mask), core::InvalidArgument,
                    "does not match the batch");
  EXPECT_THROW_WITH(rlhf::actor_loss(lp, lp, lp, torch::ones({2, 3})), core::InvalidArgument, "mask [2, 3]");
  EXPECT_THROW_WITH(rlhf::action_start(0), core::InvalidArgument, "prompt_length must be >= 1");
}

}  // namespace
}  // namespace dschat
