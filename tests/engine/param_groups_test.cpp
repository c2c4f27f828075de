// DeepSpeed-Chat's optimizer parameter groups (get_optimizer_grouped_parameters): the name rules,
// and the groups of a real OPT model, with and without (fake) LoRA adapters.
#include "dschat/engine/param_groups.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "dschat/models/load_save.h"
#include "test_util.h"

namespace dschat {
namespace {

std::vector<std::string> names_of(const engine::ParamGroup& group) { return group.names; }

TEST(ParamGroups, DeepSpeedChatRulesOnNames) {
  auto trainable = [] { return torch::zeros({2}).requires_grad_(true); };
  const std::vector<std::pair<std::string, torch::Tensor>> named = {
      {"model.decoder.embed_tokens.weight", trainable()},
      {"model.decoder.layers.0.self_attn.q_proj.weight", torch::zeros({2})},  // frozen: left out
      {"model.decoder.layers.0.self_attn.q_proj.bias", trainable()},
      {"model.decoder.layers.0.self_attn.q_proj.lora_right_weight", trainable()},
      {"model.decoder.layers.0.self_attn.q_proj.LoRA_Left_Weight", trainable()},  // matched lower-cased
      {"model.decoder.layers.0.self_attn_layer_norm.weight", trainable()},
      {"bert.encoder.LayerNorm.weight", trainable()},
      {"model.layers.0.input_layernorm.weight", trainable()},
      {"model.norm.weight", trainable()},
      {"transformer.ln_f.weight", trainable()},
      {"v_head.weight", trainable()},
      {"adapter.bias.lora_right_weight", trainable()},  // no-decay wins over LoRA
      {"model.decoder.layers.0.fc1.weight", trainable()},
  };
  const auto groups = engine::optimizer_grouped_parameters(named, 1e-5, 0.1, 5e-4);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(names_of(groups[0]), (std::vector<std::string>{"model.decoder.embed_tokens.weight", "v_head.weight",
                                                           "model.decoder.layers.0.fc1.weight"}));
  EXPECT_EQ(names_of(groups[1]),
            (std::vector<std::string>{"model.decoder.layers.0.self_attn.q_proj.lora_right_weight",
                                      "model.decoder.layers.0.self_attn.q_proj.LoRA_Left_Weight"}));
  EXPECT_EQ(names_of(groups[2]),
            (std::vector<std::string>{
                "model.decoder.layers.0.self_attn.q_proj.bias", "model.decoder.layers.0.self_attn_layer_norm.weight",
                "bert.encoder.LayerNorm.weight", "model.layers.0.input_layernorm.weight", "model.norm.weight",
                "transformer.ln_f.weight", "adapter.bias.lora_right_weight"}));
  EXPECT_EQ(std::make_pair(groups[0].lr, groups[0].weight_decay), std::make_pair(1e-5, 0.1));
  EXPECT_EQ(std::make_pair(groups[1].lr, groups[1].weight_decay), std::make_pair(5e-4, 0.1));
  EXPECT_EQ(std::make_pair(groups[2].lr, groups[2].weight_decay), std::make_pair(1e-5, 0.0));
  for (const auto& group : groups) {
    ASSERT_EQ(group.params.size(), group.names.size());
    for (size_t i = 0; i < group.names.size(); ++i) {
      const auto it =
          std::find_if(named.begin(), named.end(), [&](const auto& item) { return item.first == group.names[i]; });
      EXPECT_TRUE(group.params[i].is_same(it->second)) << group.names[i];
    }
  }
}

TEST(ParamGroups, EmptyGroupsAreDropped) {
  const auto t = [] { return torch::zeros({1}).requires_grad_(true); };
  auto only_no_decay = engine::optimizer_grouped_parameters({{"a.bias", t()}, {"ln_f.weight", t()}}, 1e-3, 0.1);
  ASSERT_EQ(only_no_decay.size(), 1u);
  EXPECT_EQ(only_no_decay[0].weight_decay, 0.0);
  auto no_lora = engine::optimizer_grouped_parameters({{"a.bias", t()}, {"a.weight", t()}}, 1e-3, 0.1);
  ASSERT_EQ(no_lora.size(), 2u);
  EXPECT_EQ(names_of(no_lora[0]), std::vector<std::string>{"a.weight"});
  EXPECT_EQ(names_of(no_lora[1]), std::vector<std::string>{"a.bias"});
  EXPECT_TRUE(engine::optimizer_grouped_parameters({{"a.weight", torch::zeros({1})}}, 1e-3, 0.1).empty());
  EXPECT_THROW_WITH(
      engine::optimizer_grouped_parameters(std::vector<std::pair<std::string, torch::Tensor>>{}, -1.0, 0.1),
      core::InvalidArgument, "lr -1");
}

// A ZeRO rank groups the pieces it owns by the whole model's groups: one it owns nothing of stays,
// empty, so every rank has the same groups (found by a two-rank resume whose rank 0 owned no
// no-decay piece: its LR schedule had one group fewer than rank 1's).
TEST(ParamGroups, ARanksPiecesKeepTheWholeModelsGroups) {
  const auto t = [] { return torch::zeros({1}).requires_grad_(true); };
  const std::vector<std::string> model = {"a.weight", "a.lora_right_weight", "a.bias"};
  auto groups = engine::optimizer_grouped_parameters({{"a.weight", t()}}, 1e-3, 0.1, 5e-4, &model);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(names_of(groups[0]), std::vector<std::string>{"a.weight"});
  EXPECT_TRUE(groups[1].params.empty());
  EXPECT_EQ(groups[1].lr, 5e-4);
  EXPECT_TRUE(groups[2].params.empty());
  EXPECT_EQ(groups[2].weight_decay, 0.0);
  const std::vector<std::string> no_lora = {"a.weight", "a.bias"};
  EXPECT_EQ(engine::optimizer_grouped_parameters({{"a.bias", t()}}, 1e-3, 0.1, 5e-4, &no_lora).size(), 2u);
  EXPECT_EQ(engine::optimizer_group_index("x.LayerNorm.weight"), 2);
  EXPECT_EQ(engine::optimizer_group_index("x.lora_left_weight"), 1);
  EXPECT_EQ(engine::optimizer_group_index("x.fc1.weight"), 0);
}

TEST(ParamGroups, OptCausalLmGroupsAndFakeLora) {
  auto model = models::load_causal_lm(testing::fixture("opt-preln").string());
  const auto groups = engine::optimizer_grouped_parameters(*model, 1e-5, 0.1);
  ASSERT_EQ(groups.size(), 2u);  // no LoRA
  const auto& decay = groups[0].names;
  const auto& no_decay = groups[1].names;
  auto has = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  EXPECT_TRUE(has(decay, "model.decoder.embed_tokens.weight"));
  EXPECT_TRUE(has(decay, "model.decoder.embed_positions.weight"));
  EXPECT_TRUE(has(decay, "model.decoder.layers.1.fc2.weight"));
  EXPECT_TRUE(has(no_decay, "model.decoder.layers.0.self_attn_layer_norm.weight"));
  EXPECT_TRUE(has(no_decay, "model.decoder.final_layer_norm.weight"));
  EXPECT_TRUE(has(no_decay, "model.decoder.layers.1.fc2.bias"));
  for (const auto& name : decay) {
    EXPECT_EQ(name.find("bias"), std::string::npos) << name;
    EXPECT_EQ(name.find("layer_norm"), std::string::npos) << name;
  }
  for (const auto& name : no_decay) {
    const bool is_bias_or_norm = name.find("bias") != std::string::npos || name.find("layer_norm") != std::string::npos;
    EXPECT_TRUE(is_bias_or_norm) << name;
  }
  EXPECT_EQ(decay.size() + no_decay.size(), model->named_parameters().size());
  // 2 layers x (q, k, v, out_proj, fc1, fc2 biases + 2 norms x 2) + the final norm's 2 = 22.
  EXPECT_EQ(no_decay.size(), 22u);

  // LoRA as DeepSpeed-Chat applies it: the wrapped weight frozen, two adapters added.
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& item : model->named_parameters()) {
    torch::Tensor param = item.value();
    if (item.key().find("q_proj.weight") != std::string::npos) param = param.detach();  // frozen
    named.emplace_back(item.key(), param);
  }
  named.emplace_back("model.decoder.layers.0.self_attn.q_proj.lora_right_weight",
                     torch::zeros({32, 4}).requires_grad_(true));
  named.emplace_back("model.decoder.layers.0.self_attn.q_proj.lora_left_weight",
                     torch::zeros({4, 32}).requires_grad_(true));
  const auto lora_groups = engine::optimizer_grouped_parameters(named, 1e-5, 0.1, 5e-4);
  ASSERT_EQ(lora_groups.size(), 3u);
  EXPECT_EQ(names_of(lora_groups[1]),
            (std::vector<std::string>{"model.decoder.layers.0.self_attn.q_proj.lora_right_weight",
                                      "model.decoder.layers.0.self_attn.q_proj.lora_left_weight"}));
  EXPECT_EQ(lora_groups[1].lr, 5e-4);
  EXPECT_FALSE(has(lora_groups[0].names, "model.decoder.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(lora_groups[0].names.size(), decay.size() - 2);  // both layers' q_proj.weight frozen
}

}  // namespace
}  // namespace dschat
