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

Usage: tools/make_fixtures.py [OUT_DIR [DEMO_DIR]]   (default tests/fixtures, assets/tiny-opt)
"""
import json
import pathlib
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, OPTConfig, OPTForCausalLM

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
}

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
    if kind == "llama":
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
    model = (OPTForCausalLM if kind == "opt" else LlamaForCausalLM)(config).eval()
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
        model_bf16 = (OPTForCausalLM if kind == "opt" else LlamaForCausalLM).from_pretrained(
            folder, dtype=torch.bfloat16).eval()
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


def write_reward(out, source_model):
    """DeepSpeed-Chat's RewardModel layout on top of the post-LN OPT backbone (350m-style)."""
    folder = out / "reward-opt-postln"
    folder.mkdir(parents=True, exist_ok=True)
    backbone = source_model.model  # OPTModel
    torch.manual_seed(SEED + 1)
    v_head = torch.nn.Linear(backbone.config.word_embed_proj_dim, 1, bias=False)
    state = {f"rwtransformer.{k}": v.contiguous() for k, v in backbone.state_dict().items()}
    state["v_head.weight"] = v_head.weight.detach().contiguous()
    save_file(state, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(backbone.config.to_dict(), indent=2, default=str))
    generator = torch.Generator().manual_seed(SEED)
    ids, mask = batch(generator)
    with torch.no_grad():
        hidden = backbone(input_ids=ids, attention_mask=mask).last_hidden_state
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
    out = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures")
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    models = {name: write_model(out, name, config) for name, config in MODELS.items()}
    write_reward(out, models["opt-postln"])
    write_demo(pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "assets/tiny-opt"))
    print(f"fixtures written to {out}")


if __name__ == "__main__":
    main()
