#include "dschat/engine/adamw.h"

#include <set>
#include <tuple>

#include "adamw_cpu.h"
#include "dschat/core/error.h"

namespace dschat {
namespace engine {
namespace {

void check_options(const AdamWOptions& options) {
  for (double beta : options.betas) {
    DSCHAT_CHECK(beta >= 0.0 && beta < 1.0, InvalidArgument, "AdamW: betas must be in [0, 1), got (", options.betas[0],
                 ", ", options.betas[1], ")");
  }
  DSCHAT_CHECK(options.eps >= 0.0, InvalidArgument, "AdamW: eps must be >= 0, got ", options.eps);
}

void check_group_hyperparameters(size_t index, double lr, double weight_decay) {
  DSCHAT_CHECK(lr >= 0.0, InvalidArgument, "AdamW: group ", index, " lr must be >= 0, got ", lr);
  DSCHAT_CHECK(weight_decay >= 0.0, InvalidArgument, "AdamW: group ", index, " weight_decay must be >= 0, got ",
               weight_decay);
}

std::string param_label(const ParamGroup& group, size_t group_index, size_t param_index) {
  const std::string& name = group.names[param_index];
  return core::detail::str_cat("group ", group_index, " parameter ", param_index,
                               name.empty() ? std::string() : " '" + name + "'");
}

std::string state_key(size_t flat_index, const char* field) {
  return core::detail::str_cat("state.", flat_index, ".", field);
}

}  // namespace

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options)
    : groups_(std::move(groups)), options_(options) {
  check_options(options_);
  std::set<const c10::TensorImpl*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    check_group_hyperparameters(g, group.lr, group.weight_decay);
    if (group.names.empty()) group.names.resize(group.params.size());
    DSCHAT_CHECK(group.names.size() == group.params.size(), InvalidArgument, "AdamW: group ", g, " has ",
                 group.names.size(), " names for ", group.params.size(), " parameters");
    for (size_t i = 0; i < group.params.size(); ++i) {
      const torch::Tensor& param = group.params[i];
      DSCHAT_CHECK(param.defined(), InvalidArgument, "AdamW: ", param_label(group, g, i), " is undefined");
      DSCHAT_CHECK(param.is_floating_point(), InvalidArgument, "AdamW: ", param_label(group, g, i), " has dtype ",
                   param.scalar_type(), "; only floating-point parameters can be optimised");
      DSCHAT_CHECK(seen.insert(param.unsafeGetTensorImpl()).second, InvalidArgument,
                   "AdamW: ", param_label(group, g, i), " appears more than once in the groups");
    }
    states_.emplace_back(group.params.size());
  }
}

AdamW::AdamW(std::vector<torch::Tensor> params, const AdamWOptions& options)
    : AdamW(std::vector<ParamGroup>{ParamGroup{{}, std::move(params), options.lr, options.weight_decay}}, options) {}

const ParamGroup& AdamW::group(size_t index) const {
  DSCHAT_CHECK(index < groups_.size(), InvalidArgument, "AdamW: group index ", index, " out of range (", groups_.size(),
               " groups)");
  return groups_[index];
}

void AdamW::set_group_lr(size_t index, double lr) {
  group(index);  // range check
  check_group_hyperparameters(index, lr, groups_[index].weight_decay);
  groups_[index].lr = lr;
}

std::vector<double> AdamW::group_lrs() const {
  std::vector<double> lrs;
  for (const auto& group : groups_) lrs.push_back(group.lr);
  return lrs;
}

int64_t AdamW::param_step(size_t group_index, size_t param_index) const {
  const ParamGroup& g = group(group_index);
  DSCHAT_CHECK(param_index < g.params.size(), InvalidArgument, "AdamW: parameter index ", param_index,
               " out of range (group ", group_index, " has ", g.params.size(), ")");
  return states_[group_index][param_index].step;
}

void AdamW::init_state(const torch::Tensor& param, ParamState& state) const {
  if (param.is_cuda()) {
    // FusedAdam keeps the moments in the parameter dtype (fp32 under ZeRO's master partitions),
    // and at::_fused_adamw_ requires every list to share one dtype.
    state.exp_avg = torch::zeros_like(param, torch::MemoryFormat::Contiguous);
    state.exp_avg_sq = torch::zeros_like(param, torch::MemoryFormat::Contiguous);
    state.device_step = torch::zeros({}, torch::dtype(torch::kFloat32).device(param.device()));
  } else {
    state.exp_avg = torch::zeros(param.sizes(), torch::kFloat32);
    state.exp_avg_sq = torch::zeros(param.sizes(), torch::kFloat32);
  }
}

void AdamW::step() {
  torch::NoGradGuard no_grad;
  // Check everything first, so a bad parameter fails the step before any parameter moves.
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    for (size_t i = 0; i < group.params.size(); ++i) {
      const torch::Tensor& param = group.params[i];
      const torch::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      const std::string label = param_label(group, g, i);
      DSCHAT_CHECK(!grad.is_sparse(), Unsupported, "AdamW: ", label, " has a sparse gradient");
      DSCHAT_CHECK(grad.sizes() == param.sizes(), InvalidArgument, "AdamW: ", label, " has shape ", param.sizes(),
                   " but its gradient has shape ", grad.sizes());
      DSCHAT_CHECK(grad.device() == param.device(), InvalidArgument, "AdamW: ", label, " is on ", param.device(),
                   " but its gradient is on ", grad.device());
      DSCHAT_CHECK(grad.scalar_type() == param.scalar_type(), InvalidArgument, "AdamW: ", label, " has dtype ",
                   param.scalar_type(), " but its gradient has dtype ", grad.scalar_type());
      if (param.is_cuda()) {
        DSCHAT_CHECK(options_.bias_correction, Unsupported, "AdamW: ", label,
                     " is on CUDA, whose fused kernel always applies bias correction (bias_correction=false)");
        continue;
      }
      DSCHAT_CHECK(param.device().is_cpu(), Unsupported, "AdamW: ", label, " is on ", param.device(),
                   "; only CPU and CUDA parameters are supported");
      const auto dtype = param.scalar_type();
      DSCHAT_CHECK(dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kFloat16, Unsupported,
                   "AdamW on CPU: ", label, " has dtype ", dtype, " (supported: float32, bfloat16, float16)");
      DSCHAT_CHECK(param.is_contiguous(), InvalidArgument, "AdamW on CPU: ", label,
                   " is not contiguous (it is updated in place through its data pointer)");
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) step_group(g);
}

void AdamW::step_group(size_t group_index) {
  const ParamGroup& group = groups_[group_index];
  std::vector<ParamState>& states = states_[group_index];
  // CUDA parameters are gathered per (device, dtype) for one multi-tensor launch each.
  struct FusedBucket {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  };
  std::map<std::tuple<int, int>, FusedBucket> fused;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const torch::Tensor& param = group.params[i];
    const torch::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    ParamState& state = states[i];
    if (!state.exp_avg.defined()) init_state(param, state);
    ++state.step;
    if (param.is_cuda()) {
      FusedBucket& bucket = fused[{param.device().index(), static_cast<int>(param.scalar_type())}];
      bucket.params.push_back(param);
      bucket.grads.push_back(grad);
      bucket.exp_avgs.push_back(state.exp_avg);
      bucket.exp_avg_sqs.push_back(state.exp_avg_sq);
      bucket.steps.push_back(state.device_step);
      continue;
    }
    const auto scalars =
        detail::adam_step_scalars(group.lr, group.weight_decay, options_.betas[0], options_.betas[1], options_.eps,
                                  state.step, options_.bias_correction, options_.adam_w_mode);
    detail::adam_step_cpu(param, grad.contiguous(), state.exp_avg, state.exp_avg_sq, scalars);
    // The kernel writes through the data pointer, which autograd cannot see; bump the version as
    // an in-place op would, so a graph that saved this parameter refuses a stale backward.
    torch::autograd::impl::bump_version(param);
  }
  // Untested on this project's CPU-only machines. torch.optim's fused path does the same: bump
  // the float step tensors, then one kernel that reads them for the bias corrections.
  for (auto& [key, bucket] : fused) {
    at::_foreach_add_(bucket.steps, 1.0);
    const std::vector<torch::Tensor> no_max_exp_avg_sqs;  // amsgrad is off
    if (options_.adam_w_mode) {
      at::_fused_adamw_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs, no_max_exp_avg_sqs,
                        bucket.steps, group.lr, options_.betas[0], options_.betas[1], group.weight_decay, options_.eps,
                        /*amsgrad=*/false, /*maximize=*/false);
    } else {
      at::_fused_adam_(bucket.params, bucket.grads, bucket.exp_avgs, bucket.exp_avg_sqs, no_max_exp_avg_sqs,
                       bucket.steps, group.lr, options_.betas[0], options_.betas[1], group.weight_decay, options_.eps,
                       /*amsgrad=*/false, /*maximize=*/false);
    }
  }
}

void AdamW::zero_grad() {
  for (auto& group : groups_) {
    for (auto& param : group.params) param.mutable_grad().reset();
  }
}

AdamWStateDict AdamW::state_dict() const {
  AdamWStateDict dict;
  dict.options = options_;
  size_t flat_index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    dict.group_lrs.push_back(groups_[g].lr);
    dict.group_weight_decays.push_back(groups_[g].weight_decay);
    dict.group_names.push_back(groups_[g].names);
    for (const ParamState& state : states_[g]) {
      if (state.step > 0) {
        dict.tensors[state_key(flat_index, "step")] = torch::tensor(state.step, torch::kInt64);
        dict.tensors[state_key(flat_index, "exp_avg")] = state.exp_avg.clone();
        dict.tensors[state_key(flat_index, "exp_avg_sq")] = state.exp_avg_sq.clone();
      }
      ++flat_index;
    }
  }
  return dict;
}

void AdamW::load_state_dict(const AdamWStateDict& dict) {
  check_options(dict.options);
  DSCHAT_CHECK(dict.group_lrs.size() == groups_.size() && dict.group_weight_decays.size() == groups_.size() &&
                   dict.group_names.size() == groups_.size(),
               InvalidArgument, "AdamW::load_state_dict: the state has ", dict.group_lrs.size(),
               " groups, this optimizer ", groups_.size());
  std::vector<std::vector<ParamState>> restored;
  std::set<std::string> used_keys;
  size_t flat_index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = groups_[g];
    check_group_hyperparameters(g, dict.group_lrs[g], dict.group_weight_decays[g]);
    const auto& names = dict.group_names[g];
    DSCHAT_CHECK(names.size() == group.params.size(), InvalidArgument, "AdamW::load_state_dict: group ", g, " has ",
                 names.size(), " parameters in the state, ", group.params.size(), " here");
    restored.emplace_back(group.params.size());
    for (size_t i = 0; i < group.params.size(); ++i, ++flat_index) {
      const std::string label = param_label(group, g, i);
      DSCHAT_CHECK(names[i].empty() || group.names[i].empty() || names[i] == group.names[i], InvalidArgument,
                   "AdamW::load_state_dict: ", label, " is named '", names[i], "' in the state");
      const auto step_it = dict.tensors.find(state_key(flat_index, "step"));
      if (step_it == dict.tensors.end()) continue;  // never stepped
      const torch::Tensor& param = group.params[i];
      torch::Tensor moments[2];
      const char* fields[2] = {"exp_avg", "exp_avg_sq"};
      for (int f = 0; f < 2; ++f) {
        const auto it = dict.tensors.find(state_key(flat_index, fields[f]));
        DSCHAT_CHECK(it != dict.tensors.end(), InvalidArgument, "AdamW::load_state_dict: ", label, " has '",
                     step_it->first, "' but no '", state_key(flat_index, fields[f]), "'");
        DSCHAT_CHECK(it->second.sizes() == param.sizes(), InvalidArgument, "AdamW::load_state_dict: '", it->first,
                     "' has shape ", it->second.sizes(), " but ", label, " has shape ", param.sizes());
        moments[f] = it->second;
        used_keys.insert(it->first);
      }
      const torch::Tensor& step = step_it->second;
      DSCHAT_CHECK(step.numel() == 1 && !step.is_floating_point() && step.item<int64_t>() >= 1, InvalidArgument,
                   "AdamW::load_state_dict: '", step_it->first, "' must be one integer >= 1");
      used_keys.insert(step_it->first);
      ParamState& state = restored[g][i];
      state.step = step.item<int64_t>();
      const auto moment_dtype = param.is_cuda() ? param.scalar_type() : torch::kFloat32;
      const auto moment_options = torch::dtype(moment_dtype).device(param.device());
      state.exp_avg = moments[0].to(moment_options, /*non_blocking=*/false, /*copy=*/true).contiguous();
      state.exp_avg_sq = moments[1].to(moment_options, /*non_blocking=*/false, /*copy=*/true).contiguous();
      if (param.is_cuda()) {
        state.device_step =
            torch::full({}, static_cast<double>(state.step), torch::dtype(torch::kFloat32).device(param.device()));
      }
    }
  }
  for (const auto& [key, tensor] : dict.tensors) {
    DSCHAT_CHECK(used_keys.count(key) > 0, InvalidArgument, "AdamW::load_state_dict: unexpected entry '", key,
                 "' (this optimizer has ", flat_index, " parameters)");
  }
  options_ = dict.options;
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = dict.group_lrs[g];
    groups_[g].weight_decay = dict.group_weight_decays[g];
  }
  states_ = std::move(restored);
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& group_states : states_) {
    for (const ParamState& state : group_states) {
      if (state.exp_avg.defined()) bytes += static_cast<int64_t>(state.exp_avg.nbytes() + state.exp_avg_sq.nbytes());
    }
  }
  return bytes;
}

}  // namespace engine
}  // namespace dschat
