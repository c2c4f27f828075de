#!/usr/bin/env python3
"""Writes the tiny random checkpoints and the transformers outputs that the parity tests compare
against (tests/fixtures/<name>/). Deterministic: same seed, same files.

For each model:
  config.json, model.safetensors          save_pretrained (safetensors)
  bin/config.json, bin/pytorch_model.bin  torch.save(state_dict) (tied weights share storage)
  expected/input_ids.npy, attention_mask.npy   a left-padded batch [3, 10]
  expected/logits.npy                     fp32 logits [3, 10, V]
  expected/logits_bf16.npy                bf16 model's logits (as float32)
  expected/greedy.npy                     greedy ids [3, 10 + 8] from model.generate
  expected/grad/<param>.npy               gradient of the masked next-token loss
  expected/loss.npy                       that loss (scalar)
Plus reward-opt-postln/: DeepSpeed-Chat reward layout (rwtransformer.*, v_head.weight) and
expected/values.npy [3, 10].

Plus reward-gpt2/: the same layout over GPT-2 (fused c_attn, Conv1D weights under rwtransformer.).

Usage: tools/make_fixtures.py [OUT_DIR [DEMO_DIR]] [--only NAME,...]
       (default tests/fixtures, assets/tiny-opt; --only writes just those fixtures)
"""
import json
import pathlib
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, BloomConfig, CodeGenConfig, GPT2Config, GPTJConfig, GPTNeoConfig,
                          GPTNeoXConfig, LlamaConfig, MistralConfig, OPTConfig, OPTForCausalLM, Qwen2Config,
                          Qwen3Config)

SEED = 1234
VOCAB = 512
NEW_TOKENS = 8
GRAD_PARAMS = {
    "opt": ["model.decoder.embed_tokens.weight", "model.decoder.embed_positions.weight",
            "model.decoder.layers.0.self_attn.q_proj.weight", "model.decoder.layers.0.self_attn.k_proj.bias",
            "model.decoder.layers.1.fc2.bias", "model.decoder.layers.1.final_layer_norm.weight"],
    "llama": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
              "model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.gate_proj.weight",
              "model.layers.1.post_attention_layernorm.weight", "model.norm.weight"],
    "gpt2": ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
             "transformer.h.0.attn.c_attn.bias", "transformer.h.1.mlp.c_proj.weight", "transformer.h.1.ln_2.weight",
             "transformer.ln_f.bias"],
    "gpt_neo": ["transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.attention.q_proj.weight",
                "transformer.h.1.attn.attention.k_proj.weight", "transformer.h.1.attn.attention.out_proj.bias",
                "transformer.h.1.mlp.c_fc.weight", "transformer.ln_f.weight"],
    "gptj": ["transformer.wte.weight", "transformer.h.0.attn.q_proj.weight", "transformer.h.0.attn.k_proj.weight",
             "transformer.h.1.attn.v_proj.weight", "transformer.h.1.mlp.fc_in.bias", "lm_head.weight", "lm_head.bias"],
    "codegen": ["transformer.wte.weight", "transformer.h.0.attn.qkv_proj.weight", "transformer.h.1.attn.out_proj.weight",
                "transformer.h.1.mlp.fc_out.weight", "transformer.ln_f.weight", "lm_head.weight", "lm_head.bias"],
    "gpt_neox": ["gpt_neox.embed_in.weight", "gpt_neox.layers.0.attention.query_key_value.weight",
                 "gpt_neox.layers.0.attention.query_key_value.bias", "gpt_neox.layers.1.attention.dense.weight",
                 "gpt_neox.layers.1.mlp.dense_h_to_4h.weight", "gpt_neox.layers.1.post_attention_layernorm.weight",
                 "embed_out.weight"],
    "bloom": ["transformer.word_embeddings.weight", "transformer.word_embeddings_layernorm.weight",
              "transformer.h.0.self_attention.query_key_value.weight", "transformer.h.0.self_attention.query_key_value.bias",
              "transformer.h.1.mlp.dense_4h_to_h.weight", "transformer.h.1.input_layernorm.bias", "transformer.ln_f.weight"],
    "qwen2": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
              "model.layers.1.self_attn.v_proj.bias", "model.layers.1.mlp.up_proj.weight", "model.norm.weight"],
    "qwen3": ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_norm.weight",
              "model.layers.1.self_attn.k_norm.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight"],
    "mistral": ["model.embed_tokens.weight", "model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                "model.layers.1.mlp.gate_proj.weight", "model.norm.weight", "lm_head.weight"],
}

# Positions for the rotary and learned-position families as HF generate computes them; BLOOM's
# ALiBi reads the mask itself and takes no position ids.
POSITION_KINDS = {"llama", "gpt2", "gpt_neo", "gptj", "codegen", "gpt_neox", "qwen2", "qwen3", "mistral"}

MODELS = {
    "opt-preln": OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=32,
                           do_layer_norm_before=True, pad_token_id=1, bos_token_id=2, eos_token_id=2),
    "opt-postln": OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            ffn_dim=64, max_position_embeddings=64, word_embed_proj_dim=16,
                            do_layer_norm_before=False, pad_token_id=1, bos_token_id=2, eos_token_id=2),
    "llama-gqa": LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                             rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2),
    "llama-rope-llama3-tied": LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=48, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        pad_token_id=0, bos_token_id=1, eos_token_id=2),
    # The families of issue 37: tiny shapes that still reach each switch. Sequences run to 18
    # tokens (10 + 8 generated), so windows of 4 and 5 are shorter than the sequence.
    "gpt2": GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1,
                       eos_token_id=2, pad_token_id=0),
    "gpt-neo-local": GPTNeoConfig(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                                  attention_types=[[["global", "local"], 1]], window_size=4,
                                  max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gptj-partial-rotary": GPTJConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                      n_positions=64, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "codegen": CodeGenConfig(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, rotary_dim=8, n_positions=64,
                             n_ctx=64, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gpt-neox-parallel": GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=64, rotary_pct=0.5, use_parallel_residual=True,
                                       max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "gpt-neox-sequential": GPTNeoXConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=48, rotary_pct=0.25,
                                         use_parallel_residual=False, max_position_embeddings=64, bos_token_id=1,
                                         eos_token_id=2, pad_token_id=0),
    "bloom": BloomConfig(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=6, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0),
    "qwen2-tied": Qwen2Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                              tie_word_embeddings=True, use_sliding_window=True, sliding_window=5,
                              max_window_layers=1, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "qwen3": Qwen3Config(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, intermediate_size=64, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "mistral-window": MistralConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=1, intermediate_size=64, max_position_embeddings=64,
                                    sliding_window=4, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                    pad_token_id=0),
}


def batch(generator):
    ids = torch.randint(3, VOCAB, (3, 10), generator=generator)
    mask = torch.ones(3, 10, dtype=torch.long)
    for row, pads in enumerate((0, 3, 6)):  # left padding
        mask[row, :pads] = 0
        ids[row, :pads] = 1
    return ids, mask


def positions(mask):
    """Positions that ignore left padding (what HF generate passes to LLaMA)."""
    pos = mask.cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def model_forward(model, kind, ids, mask):
    if kind in POSITION_KINDS:
        return model(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).logits
    return model(input_ids=ids, attention_mask=mask).logits


def lm_loss(logits, ids, mask):
    """Mean next-token cross entropy over positions whose target is a real token."""
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = ids[:, 1:]
    nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    weight = (mask[:, 1:] * mask[:, :-1]).float()
    return (nll * weight).sum() / weight.sum()


def save_npy(path, array):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, array)


def write_model(out, name, config):
    kind = config.model_type
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # HF initialises small; widen so that the logits are not all ~0
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(0.05 * torch.randn_like(p))
    folder = out / name
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)
    (folder / "bin").mkdir(exist_ok=True)
    (folder / "bin" / "config.json").write_text((folder / "config.json").read_text())
    torch.save(model.state_dict(), folder / "bin" / "pytorch_model.bin")

    generator = torch.Generator().manual_seed(SEED)
    ids, mask = batch(generator)
    exp = folder / "expected"
    save_npy(exp / "input_ids.npy", ids.numpy())
    save_npy(exp / "attention_mask.npy", mask.numpy())
    with torch.no_grad():
        save_npy(exp / "logits.npy", model_forward(model, kind, ids, mask).float().numpy())
        model_bf16 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
        save_npy(exp / "logits_bf16.npy", model_forward(model_bf16, kind, ids, mask).float().numpy())
        model.generation_config.eos_token_id = None  # fixed-length continuation
        greedy = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                                pad_token_id=config.pad_token_id)
        save_npy(exp / "greedy.npy", greedy.numpy())
    loss = lm_loss(model_forward(model, kind, ids, mask), ids, mask)
    loss.backward()
    save_npy(exp / "loss.npy", np.array(loss.item(), dtype=np.float32))
    named = dict(model.named_parameters())
    for param in GRAD_PARAMS[kind]:
        if param in named:
            save_npy(exp / "grad" / f"{param}.npy", named[param].grad.numpy())
    return model


def write_reward(out, source_model, name="reward-opt-postln"):
    """DeepSpeed-Chat's RewardModel layout on top of a backbone (the post-LN OPT, 350m-style; GPT-2)."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    backbone = source_model.base_model  # OPTModel, GPT2Model
    torch.manual_seed(SEED + 1)
    width = getattr(backbone.config, "word_embed_proj_dim", None) or backbone.config.hidden_size
    v_head = torch.nn.Linear(width, 1, bias=False)
    state = {f"rwtransformer.{k}": v.contiguous() for k, v in backbone.state_dict().items()}
    state["v_head.weight"] = v_head.weight.detach().contiguous()
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(backbone.config.to_dict(), indent=2, default=str))
    generator = torch.Generator().manual_seed(SEED)
    ids, mask = batch(generator)
    extra = {"position_ids": positions(mask)} if backbone.config.model_type in POSITION_KINDS else {}
    with torch.no_grad():
        hidden = backbone(input_ids=ids, attention_mask=mask, **extra).last_hidden_state
        values = v_head(hidden).squeeze(-1)
    save_npy(folder / "expected" / "input_ids.npy", ids.numpy())
    save_npy(folder / "expected" / "attention_mask.npy", mask.numpy())
    save_npy(folder / "expected" / "values.npy", values.numpy())


def write_demo(folder):
    """assets/tiny-opt: a random OPT with GPT-2's vocabulary (assets/gpt2-bpe), fp16 on disk, for
    the README's quick start and the CLI tests (its output is noise: the weights are random)."""
    config = OPTConfig(vocab_size=50257, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, ffn_dim=32,
                       max_position_embeddings=256, word_embed_proj_dim=16, pad_token_id=50256,
                       bos_token_id=50256, eos_token_id=50256)
    torch.manual_seed(SEED)
    model = OPTForCausalLM(config).eval().to(torch.float16)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "generation_config.json").unlink(missing_ok=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--only")]
    only = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--only=")]
    only = set(only[0]) if only else None
    out = pathlib.Path(args[0] if args else "tests/fixtures")
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    models = {name: write_model(out, name, config) for name, config in MODELS.items() if only is None or name in only}
    for reward, source in (("reward-opt-postln", "opt-postln"), ("reward-gpt2", "gpt2")):
        if only is None or reward in only:
            write_reward(out, models[source] if source in models else write_model(out, source, MODELS[source]), reward)
    if only is None:
        write_demo(pathlib.Path(args[1] if len(args) > 1 else "assets/tiny-opt"))
    print(f"fixtures written to {out}")


if __name__ == "__main__":
    main()
