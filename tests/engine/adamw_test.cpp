// The engine's AdamW against torch.optim.AdamW / Adam (run at test time through the project venv),
// its determinism (threads, checkpoint round trip) and reduced-precision parameters.
// Tolerance against torch: rtol 1e-6 plus atol 1e-6 x the tensor's largest entry (the two sides
// order a few float operations differently, e.g. lerp vs b1*m + (1-b1)*g, a few ulps over 12 steps).
#include "dschat/engine/adamw.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "dschat/io/npy.h"
#include "engine/adamw_cpu.h"
#include "test_util.h"

namespace dschat {
namespace {

// The parity setup: two groups, odd sizes (1001 covers every vector tail, 90300 spans several
// parallel blocks), grads missing on some steps, and a scheduler-style lr change after step 6.
const std::vector<std::vector<int64_t>> kShapes = {{1001}, {64, 33}, {300, 301}, {7, 13}, {3}};
const std::vector<int> kGroupOf = {0, 0, 0, 1, 1};
constexpr int kSteps = 12;
constexpr int kLrChangeAfter = 6;
constexpr double kGroupLr[2] = {1e-2, 3e-3};
constexpr double kGroupWd[2] = {0.1, 0.02};
constexpr double kNewLr0 = 5e-3;
bool grad_missing(size_t param, int step) {
  return (param == 4 && (step == 3 || step == 7)) || (param == 0 && step == 5);
}

struct ParityData {
  std::vector<torch::Tensor> init;                // per param
  std::vector<std::vector<torch::Tensor>> grads;  // [step][param], undefined when missing
};

ParityData make_parity_data() {
  torch::manual_seed(20240611);
  ParityData data;
  for (const auto& shape : kShapes) data.init.push_back(torch::randn(shape));
  for (int s = 0; s < kSteps; ++s) {
    data.grads.emplace_back();
    for (size_t k = 0; k < kShapes.size(); ++k) {
      data.grads.back().push_back(grad_missing(k, s) ? torch::Tensor() : torch::randn(kShapes[k]) * (0.5 + s % 3));
    }
  }
  return data;
}

void write_parity_data(const ParityData& data, const testing::TempDir& tmp) {
  for (size_t k = 0; k < data.init.size(); ++k) io::save_npy(tmp / ("p" + std::to_string(k) + ".npy"), data.init[k]);
  for (int s = 0; s < kSteps; ++s) {
    for (size_t k = 0; k < data.init.size(); ++k) {
      const auto& g = data.grads[s][k];
      if (g.defined()) io::save_npy(tmp / ("g" + std::to_string(s) + "_" + std::to_string(k) + ".npy"), g);
    }
  }
}

// torch.optim.AdamW (or Adam with L2 when `torch_class` is "Adam") over the same data; writes the
// final params, moments and step counts.
void run_torch_reference(const testing::TempDir& tmp, const std::string& torch_class) {
  const std::string script = R"PY(
import json, os, sys
import numpy as np, torch
d, cls = sys.argv[1], sys.argv[2]
n, steps, change_after, new_lr0 = 5, 12, 6, 5e-3
group_of, lrs, wds = [0, 0, 0, 1, 1], [1e-2, 3e-3], [0.1, 0.02]
params = [torch.nn.Parameter(torch.from_numpy(np.load(f"{d}/p{k}.npy"))) for k in range(n)]
groups = [{"params": [p for p, g in zip(params, group_of) if g == i], "lr": lrs[i], "weight_decay": wds[i]}
          for i in range(2)]
opt = getattr(torch.optim, cls)(groups, betas=(0.9, 0.95), eps=1e-8, foreach=False)
for s in range(steps):
    if s == change_after:
        opt.param_groups[0]["lr"] = new_lr0
    for k, p in enumerate(params):
        f = f"{d}/g{s}_{k}.npy"
        p.grad = torch.from_numpy(np.load(f)) if os.path.exists(f) else None
    opt.step()
steps_out = []
for k, p in enumerate(params):
    st = opt.state[p]
    np.save(f"{d}/out_p{k}.npy", p.detach().numpy())
    np.save(f"{d}/out_m{k}.npy", st["exp_avg"].numpy())
    np.save(f"{d}/out_v{k}.npy", st["exp_avg_sq"].numpy())
    steps_out.append(int(st["step"].item()))
json.dump(steps_out, open(f"{d}/steps.json", "w"))
)PY";
  std::ofstream(tmp / "reference.py") << script;
  std::string out;
  ASSERT_EQ(testing::run_command(std::string(DSCHAT_PYTHON) + " " + (tmp / "reference.py").string() + " " +
                                     tmp.path().string() + " " + torch_class,
                                 &out),
            0)
      << out;
}

std::vector<engine::ParamGroup> parity_groups(const std::vector<torch::Tensor>& params) {
  std::vector<engine::ParamGroup> groups(2);
  for (size_t k = 0; k < params.size(); ++k) {
    auto& group = groups[kGroupOf[k]];
    group.names.push_back("p" + std::to_string(k));
    group.params.push_back(params[k]);
  }
  for (int g = 0; g < 2; ++g) {
    groups[g].lr = kGroupLr[g];
    groups[g].weight_decay = kGroupWd[g];
  }
  return groups;
}

engine::AdamWOptions deepspeed_chat_options(bool adam_w_mode) {
  engine::AdamWOptions options;
  options.betas = {0.9, 0.95};
  options.adam_w_mode = adam_w_mode;
  return options;
}

// Runs steps [first, last) of the parity schedule on `params` (grads from `data`).
void run_steps(engine::AdamW& optimizer, const std::vector<torch::Tensor>& params, const ParityData& data, int first,
               int last) {
  for (int s = first; s < last; ++s) {
    if (s == kLrChangeAfter) optimizer.set_group_lr(0, kNewLr0);
    for (size_t k = 0; k < params.size(); ++k) {
      auto& grad = params[k].mutable_grad();
      grad = data.grads[s][k].defined() ? data.grads[s][k].clone() : torch::Tensor();
    }
    optimizer.step();
  }
}

void expect_close_to_torch(const torch::Tensor& ours, const torch::Tensor& theirs, const std::string& what) {
  ASSERT_EQ(ours.sizes(), theirs.sizes()) << what;
  const double atol = 1e-6 * theirs.abs().max().item<double>();
  EXPECT_TRUE(torch::allclose(ours, theirs, /*rtol=*/1e-6, atol))
      << what << ": max |diff| " << testing::max_abs_diff(ours, theirs) << ", atol " << atol;
}

void expect_parity_with_torch(bool adam_w_mode) {
  testing::TempDir tmp;
  ParityData data = make_parity_data();
  write_parity_data(data, tmp);
  run_torch_reference(tmp, adam_w_mode ? "AdamW" : "Adam");
  if (::testing::Test::HasFatalFailure()) return;

  std::vector<torch::Tensor> params;
  for (const auto& init : data.init) params.push_back(init.clone().requires_grad_(true));
  engine::AdamW optimizer(parity_groups(params), deepspeed_chat_options(adam_w_mode));
  run_steps(optimizer, params, data, 0, kSteps);

  const auto torch_steps = nlohmann::json::parse(std::ifstream(tmp / "steps.json")).get<std::vector<int64_t>>();
  const auto state = optimizer.state_dict();
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string i = std::to_string(k);
    // The group-local index: groups hold params {0, 1, 2} and {3, 4}.
    const size_t local = kGroupOf[k] == 0 ? k : k - 3;
    EXPECT_EQ(optimizer.param_step(kGroupOf[k], local), torch_steps[k]) << "param " << k;
    EXPECT_FALSE(torch::equal(params[k].detach(), data.init[k])) << "param " << k << " did not move";
    expect_close_to_torch(params[k].detach(), io::load_npy(tmp / ("out_p" + i + ".npy")), "param " + i);
    expect_close_to_torch(state.tensors.at("state." + i + ".exp_avg"), io::load_npy(tmp / ("out_m" + i + ".npy")),
                          "exp_avg " + i);
    expect_close_to_torch(state.tensors.at("state." + i + ".exp_avg_sq"), io::load_npy(tmp / ("out_v" + i + ".npy")),
                          "exp_avg_sq " + i);
  }
  // Params 0 and 4 skipped steps without a gradient, so their counts lag the others.
  EXPECT_EQ(torch_steps, (std::vector<int64_t>{11, 12, 12, 12, 10}));
}

TEST(AdamW, MatchesTorchAdamWWithTwoGroupsAndSkippedGrads) { expect_parity_with_torch(/*adam_w_mode=*/true); }

TEST(AdamW, L2ModeMatchesTorchAdamWithWeightDecay) { expect_parity_with_torch(/*adam_w_mode=*/false); }

TEST(AdamW, WithoutBiasCorrectionFollowsTheFormula) {
  torch::Tensor param = torch::tensor({0.75f, -2.0f}).requires_grad_(true);  // [2]
  engine::AdamWOptions options = deepspeed_chat_options(true);
  options.bias_correction = false;
  options.lr = 0.1;
  options.weight_decay = 0.3;
  engine::AdamW optimizer(std::vector<torch::Tensor>{param}, options);
  double p[2] = {0.75, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  const double grads[3][2] = {{0.5, -1.5}, {-0.25, 2.0}, {1.0, 0.125}};
  for (const auto& g : grads) {
    param.mutable_grad() = torch::tensor({static_cast<float>(g[0]), static_cast<float>(g[1])});
    optimizer.step();
    for (int i = 0; i < 2; ++i) {
      m[i] = 0.9 * m[i] + 0.1 * g[i];
      v[i] = 0.95 * v[i] + 0.05 * g[i] * g[i];
      p[i] = p[i] * (1 - 0.1 * 0.3) - 0.1 * m[i] / (std::sqrt(v[i]) + 1e-8);
    }
  }
  EXPECT_NEAR(param[0].item<double>(), p[0], 1e-6 * std::abs(p[0]));
  EXPECT_NEAR(param[1].item<double>(), p[1], 1e-6 * std::abs(p[1]));
}

TEST(AdamW, StateRoundTripResumesBitForBit) {
  ParityData data = make_parity_data();
  std::vector<torch::Tensor> straight, resumed;
  for (const auto& init : data.init) straight.push_back(init.clone().requires_grad_(true));
  engine::AdamW uninterrupted(parity_groups(straight), deepspeed_chat_options(true));
  run_steps(uninterrupted, straight, data, 0, 5);

  for (const auto& p : straight) resumed.push_back(p.detach().clone().requires_grad_(true));
  engine::AdamWStateDict saved = uninterrupted.state_dict();
  engine::AdamW fresh(parity_groups(resumed), deepspeed_chat_options(true));
  fresh.set_group_lr(1, 0.5);  // overwritten by the load
  fresh.load_state_dict(saved);
  EXPECT_EQ(fresh.group_lrs(), uninterrupted.group_lrs());
  EXPECT_EQ(fresh.state_bytes(), uninterrupted.state_bytes());

  run_steps(uninterrupted, straight, data, 5, kSteps);
  run_steps(fresh, resumed, data, 5, kSteps);
  const auto a = uninterrupted.state_dict(), b = fresh.state_dict();
  for (size_t k = 0; k < straight.size(); ++k) {
    EXPECT_TRUE(torch::equal(straight[k].detach(), resumed[k].detach())) << "param " << k;
    for (const char* field : {"step", "exp_avg", "exp_avg_sq"}) {
      const std::string key = "state." + std::to_string(k) + "." + field;
      EXPECT_TRUE(torch::equal(a.tensors.at(key), b.tensors.at(key))) << key;
    }
  }
  // The saved copies did not follow the later steps.
  EXPECT_EQ(saved.tensors.at("state.1.step").item<int64_t>(), 5);
}

TEST(AdamW, LoadStateDictRejectsMismatchesAndChangesNothing) {
  ParityData data = make_parity_data();
  std::vector<torch::Tensor> params;
  for (const auto& init : data.init) params.push_back(init.clone().requires_grad_(true));
  engine::AdamW optimizer(parity_groups(params), deepspeed_chat_options(true));
  run_steps(optimizer, params, data, 0, 2);
  const auto good = optimizer.state_dict();

  auto bad_shape = good;
  bad_shape.tensors["state.3.exp_avg"] = torch::zeros({13, 7});
  EXPECT_THROW_WITH(optimizer.load_state_dict(bad_shape), core::InvalidArgument, "'state.3.exp_avg' has shape");
  auto extra = good;
  extra.tensors["state.9.step"] = torch::tensor(int64_t{1});
  EXPECT_THROW_WITH(optimizer.load_state_dict(extra), core::InvalidArgument, "unexpected entry 'state.9.step'");
  auto renamed = good;
  renamed.group_names[1][0] = "other";
  renamed.group_lrs[0] = 123.0;
  EXPECT_THROW_WITH(optimizer.load_state_dict(renamed), core::InvalidArgument, "named 'other'");
  auto missing_moment = good;
  missing_moment.tensors.erase("state.0.exp_avg_sq");
  EXPECT_THROW_WITH(optimizer.load_state_dict(missing_moment), core::InvalidArgument, "no 'state.0.exp_avg_sq'");
  EXPECT_EQ(optimizer.group_lrs()[0], kGroupLr[0]);
  const auto after = optimizer.state_dict();
  EXPECT_TRUE(torch::equal(after.tensors.at("state.3.exp_avg"), good.tensors.at("state.3.exp_avg")));
}

// Runs 3 steps over a 1M+13-element fp32 view at an odd offset and a bf16 tensor with `threads`.
std::vector<torch::Tensor> three_steps_with_threads(int threads) {
  const int previous = at::get_num_threads();
  at::set_num_threads(threads);
  torch::manual_seed(7);
  const int64_t n = (int64_t{1} << 20) + 13;
  torch::Tensor flat = torch::randn({n + 3});
  torch::Tensor view = flat.narrow(0, 3, n).requires_grad_(true);  // unaligned start, still contiguous
  torch::Tensor reduced = torch::randn({200003}).to(torch::kBFloat16).requires_grad_(true);
  engine::AdamW optimizer(std::vector<torch::Tensor>{view, reduced}, deepspeed_chat_options(true));
  for (int s = 0; s < 3; ++s) {
    view.mutable_grad() = torch::randn({n});
    reduced.mutable_grad() = torch::randn({200003}).to(torch::kBFloat16);
    optimizer.step();
  }
  at::set_num_threads(previous);
  const auto state = optimizer.state_dict();
  return {view.detach().clone(), reduced.detach().clone(), state.tensors.at("state.0.exp_avg"),
          state.tensors.at("state.0.exp_avg_sq"), state.tensors.at("state.1.exp_avg_sq")};
}

TEST(AdamW, MultiThreadedEqualsSingleThreadedBitForBit) {
  const auto single = three_steps_with_threads(1);
  for (int threads : {2, 3, 4}) {
    const auto multi = three_steps_with_threads(threads);
    for (size_t i = 0; i < single.size(); ++i) {
      EXPECT_TRUE(torch::equal(single[i], multi[i])) << "tensor " << i << " with " << threads << " threads";
    }
  }
}

TEST(AdamW, EveryInstructionSetMatchesTheScalarLoop) {
  using engine::detail::CpuIsa;
  torch::manual_seed(3);
  const torch::Tensor param = torch::randn({1001}), grad = torch::randn({1001});
  const torch::Tensor exp_avg = torch::randn({1001}) * 0.1, exp_avg_sq = torch::rand({1001}) * 0.1;
  auto run = [&](CpuIsa isa, bool adam_w_mode) {
    std::vector<torch::Tensor> t = {param.clone(), exp_avg.clone(), exp_avg_sq.clone()};
    const auto scalars = engine::detail::adam_step_scalars(1e-2, 0.1, 0.9, 0.95, 1e-8, 4, true, adam_w_mode);
    engine::detail::adam_step_cpu(t[0], grad, t[1], t[2], scalars, isa);
    return t;
  };
  int checked = 0;
  for (bool adam_w_mode : {true, false}) {
    const auto reference = run(CpuIsa::kScalar, adam_w_mode);
    EXPECT_FALSE(torch::equal(reference[0], param));
    for (CpuIsa isa : {CpuIsa::kSse, CpuIsa::kAvx, CpuIsa::kAvx512}) {
      if (!engine::detail::cpu_isa_supported(isa)) continue;
      const auto got = run(isa, adam_w_mode);
      for (size_t i = 0; i < got.size(); ++i) {
        // SSE and AVX do the scalar loop's operations exactly; AVX-512 contracts into FMA.
        if (isa == CpuIsa::kAvx512) {
          expect_close_to_torch(got[i], reference[i], "avx512 tensor " + std::to_string(i));
        } else {
          EXPECT_TRUE(torch::equal(got[i], reference[i])) << "isa " << static_cast<int>(isa) << " tensor " << i;
        }
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

// A bf16/fp16 parameter is updated in fp32 and rounded: equal to an fp32 optimizer whose
// parameter is rounded to the reduced dtype after every step.
void expect_reduced_precision_matches_rounded_fp32(torch::ScalarType dtype) {
  torch::manual_seed(11);
  torch::Tensor reduced = torch::randn({4099}).to(dtype).requires_grad_(true);
  torch::Tensor full = reduced.detach().to(torch::kFloat32).requires_grad_(true);
  engine::AdamW reduced_opt(std::vector<torch::Tensor>{reduced}, deepspeed_chat_options(true));
  engine::AdamW full_opt(std::vector<torch::Tensor>{full}, deepspeed_chat_options(true));
  const torch::Tensor start = reduced.detach().clone();
  for (int s = 0; s < 4; ++s) {
    torch::Tensor grad = torch::randn({4099}).to(dtype);
    reduced.mutable_grad() = grad;
    full.mutable_grad() = grad.to(torch::kFloat32);
    reduced_opt.step();
    full_opt.step();
    torch::NoGradGuard no_grad;
    full.copy_(full.to(dtype).to(torch::kFloat32));
  }
  EXPECT_FALSE(torch::equal(reduced.detach(), start));
  EXPECT_TRUE(torch::equal(reduced.detach(), full.detach().to(dtype)));
  EXPECT_TRUE(torch::equal(reduced_opt.state_dict().tensors.at("state.0.exp_avg_sq"),
                           full_opt.state_dict().tensors.at("state.0.exp_avg_sq")));
  EXPECT_EQ(reduced_opt.state_bytes(), 2 * 4099 * 4);  // fp32 moments
}

TEST(AdamW, Bf16ParamsUpdateInFp32AndRound) { expect_reduced_precision_matches_rounded_fp32(torch::kBFloat16); }
TEST(AdamW, Fp16ParamsUpdateInFp32AndRound) { expect_reduced_precision_matches_rounded_fp32(torch::kFloat16); }

TEST(AdamW, StateBytesZeroGradAndErrors) {
  torch::Tensor a = torch::randn({10, 3}).requires_grad_(true), b = torch::randn({5}).requires_grad_(true);
  engine::AdamW optimizer(std::vector<torch::Tensor>{a, b});
  EXPECT_EQ(optimizer.state_bytes(), 0);
  a.mutable_grad() = torch::ones({10, 3});
  optimizer.step();
  EXPECT_EQ(optimizer.state_bytes(), 2 * 30 * 4);  // b had no grad: no state yet
  EXPECT_EQ(optimizer.param_step(0, 1), 0);
  optimizer.zero_grad();
  EXPECT_FALSE(a.grad().defined());

  b.mutable_grad() = torch::ones({6});
  EXPECT_THROW_WITH(optimizer.step(), core::InvalidArgument, "but its gradient has shape [6]");
  EXPECT_EQ(optimizer.param_step(0, 0), 1);  // the failed step moved nothing
  torch::Tensor wide = torch::randn({4}, torch::kFloat64).requires_grad_(true);
  engine::AdamW wide_opt(std::vector<torch::Tensor>{wide});
  wide.mutable_grad() = torch::ones({4}, torch::kFloat64);
  EXPECT_THROW_WITH(wide_opt.step(), core::Unsupported, "dtype Double");
  EXPECT_THROW_WITH(engine::AdamW(std::vector<torch::Tensor>{a, a}), core::InvalidArgument, "more than once");
  EXPECT_THROW_WITH(engine::AdamW(std::vector<torch::Tensor>{torch::ones({2}, torch::kInt64)}), core::InvalidArgument,
                    "floating-point");
  engine::AdamWOptions bad;
  bad.betas = {0.9, 1.0};
  EXPECT_THROW_WITH(engine::AdamW(std::vector<torch::Tensor>{a}, bad), core::InvalidArgument, "betas");
  EXPECT_THROW_WITH(optimizer.set_group_lr(1, 0.1), core::InvalidArgument, "group index 1");
}

}  // namespace
}  // namespace dschat
