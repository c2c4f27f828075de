// Typed configs: unknown keys with suggestions, type and range errors, HF config.json parsing,
// presets.
#include <gtest/gtest.h>

#include "dschat/core/generation_config.h"
#include "dschat/core/model_config.h"
#include "test_util.h"

namespace dschat {
namespace {

using core::ConfigError;

TEST(GenerationConfigTest, ParsesKnownKeys) {
  auto c = core::parse_generation_config(R"({"max_new_tokens": 7, "do_sample": true, "top_p": 0.5, "seed": 3})", "g.json");
  EXPECT_EQ(c.max_new_tokens, 7);
  EXPECT_TRUE(c.do_sample);
  EXPECT_DOUBLE_EQ(c.top_p, 0.5);
  EXPECT_EQ(c.seed, 3u);
  auto penalized = core::parse_generation_config(
      R"({"frequency_penalty": 0.5, "presence_penalty": -1, "logit_bias": {"50256": -100, "7": 2.5}})", "g.json");
  EXPECT_DOUBLE_EQ(penalized.frequency_penalty, 0.5);
  EXPECT_DOUBLE_EQ(penalized.presence_penalty, -1.0);
  EXPECT_EQ(penalized.logit_bias, (std::map<int64_t, double>{{7, 2.5}, {50256, -100.0}}));
}

TEST(GenerationConfigTest, UnknownKeySuggestsNearest) {
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"max_new_token": 5})", "g.json"), ConfigError,
                    "g.json: unknown key 'max_new_token' (did you mean 'max_new_tokens'?)");
}

TEST(GenerationConfigTest, WrongTypeNamesKeyAndValue) {
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"temperature": "hot"})", "g.json"), ConfigError,
                    "g.json: key 'temperature' expects a number, got string \"hot\"");
}

TEST(GenerationConfigTest, OutOfRangeNamesKeyAndValue) {
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"top_p": 1.5})", "g.json"), ConfigError, "'top_p' must be in (0, 1]");
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"max_new_tokens": 4, "min_new_tokens": 9})", "g.json"),
                    ConfigError, "min_new_tokens");
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"presence_penalty": 2.5})", "g.json"), ConfigError,
                    "g.json: key 'presence_penalty' must be in [-2, 2]");
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"logit_bias": {"7": 150}})", "g.json"), ConfigError,
                    "g.json: key 'logit_bias.7' must be in [-100, 100]");
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"logit_bias": {"eos": 1}})", "g.json"), ConfigError,
                    "g.json: logit_bias: key 'eos' must be a token id");
  EXPECT_THROW_WITH(core::parse_generation_config(R"({"logit_bias": {"7": "up"}})", "g.json"), ConfigError,
                    "g.json: logit_bias: key '7' expects a number");
}

TEST(GenerationConfigTest, InvalidJsonNamesFileAndOffset) {
  EXPECT_THROW_WITH(core::parse_generation_config("{\"top_k\": 3,", "g.json"), ConfigError, "g.json: invalid JSON at byte");
}

const char* kOpt = R"({"model_type": "opt", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4, "ffn_dim": 64, "word_embed_proj_dim": 16, "do_layer_norm_before": false,
  "torch_dtype": "float16", "transformers_version": "4.0", "some_future_key": 1})";

TEST(ModelConfigTest, ParsesOptIncludingPostLnProjection) {
  auto c = core::parse_model_config(kOpt, "config.json");
  EXPECT_EQ(c.architecture, core::Architecture::Opt);
  EXPECT_FALSE(c.do_layer_norm_before);
  EXPECT_EQ(c.output_dim(), 16);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(ModelConfigTest, ParsesLlamaRopeInBothLayouts) {
  auto old_style = core::parse_model_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 8,
    "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0}})", "a.json");
  EXPECT_EQ(old_style.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(old_style.rope_theta, 500000.0);
  EXPECT_EQ(old_style.num_key_value_heads, 2);
  auto new_style = core::parse_model_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 8,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 5.0, "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}})", "b.json");
  EXPECT_EQ(new_style.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(new_style.rope_theta, 5.0);
  EXPECT_EQ(new_style.rope_scaling.original_max_position_embeddings, 16);
}

TEST(ModelConfigTest, RejectsBadConfigsWithNamedErrors) {
  EXPECT_THROW_WITH(core::parse_model_config(R"({"model_type": "falcon"})", "c.json"), core::Unsupported,
                    "c.json: model_type 'falcon' is not supported (supported: opt, llama, mistral");
  EXPECT_THROW_WITH(core::parse_model_config(R"({"model_type": "opt", "vocab_size": 5})", "c.json"), ConfigError,
                    "c.json: missing required key 'hidden_size'");
  std::string bad_heads = kOpt;
  bad_heads.replace(bad_heads.find("\"num_attention_heads\": 4"), 24, "\"num_attention_heads\": 5");
  EXPECT_THROW_WITH(core::parse_model_config(bad_heads, "c.json"), ConfigError, "divisible by num_attention_heads (5)");
  EXPECT_THROW_WITH(core::parse_model_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 8,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})", "c.json"), core::Unsupported, "rope type 'yarn'");
  EXPECT_THROW_WITH(core::parse_model_config(R"({"model_type": "opt", "vocab_size": -3, "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64})", "c.json"), ConfigError,
                    "key 'vocab_size' must be in [1, 16777216], got -3");
}

TEST(ModelConfigTest, JsonRoundTripKeepsEveryField) {
  for (const auto& name : core::model_preset_names()) {
    auto preset = *core::model_preset(name);
    auto reparsed = core::parse_model_config(core::model_config_to_json(preset), name);
    EXPECT_EQ(core::model_config_to_json(reparsed), core::model_config_to_json(preset)) << name;
  }
}

TEST(ModelPresetTest, KnowsEveryOptAndLlama2Size) {
  for (const char* name : {"opt-125m", "opt-350m", "opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b", "opt-30b",
                           "opt-66b", "opt-175b", "llama-2-7b", "llama-2-13b", "llama-2-70b"}) {
    EXPECT_TRUE(core::model_preset(name).has_value()) << name;
  }
  auto opt350 = *core::model_preset("facebook/opt-350m");
  EXPECT_FALSE(opt350.do_layer_norm_before);
  EXPECT_EQ(opt350.output_dim(), 512);
  auto opt13 = *core::model_preset("opt-13b");
  EXPECT_EQ(opt13.hidden_size, 5120);
  EXPECT_EQ(opt13.num_hidden_layers, 40);
  auto llama70 = *core::model_preset("meta-llama/Llama-2-70b-hf");
  EXPECT_EQ(llama70.num_key_value_heads, 8);
  EXPECT_EQ(llama70.intermediate_size, 28672);
  EXPECT_FALSE(core::model_preset("opt-7b").has_value());
}

}  // namespace
}  // namespace dschat
