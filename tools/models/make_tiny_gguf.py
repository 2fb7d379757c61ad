#!/usr/bin/env python3
"""Writes tiny GGUF models for the tests with the `gguf` package, as llama.cpp's
convert_hf_to_gguf.py would: fortune-llama's weights (models/fortune-llama) as
tests/data/models/fortune-llama-f16.gguf (2-D weights F16, which holds fortune-llama's f16 checkpoint
exactly; norms F32) and fortune-llama-q8_0.gguf (2-D weights
Q8_0, norms F32), with its tokenizer.json in GGUF's `gpt2` form (tokens, token types, merges,
pre-tokenizer "llama-bpe") and llama.* config keys. attn_q / attn_k rows are permuted as the
converter does for ggml's RoPE (the loader undoes it).

With --families it writes instead the F32 conversions of the tiny models of each family
(tests/data/models/tiny-<family>.gguf, F32 so that their logits are the directory's):
tiny-llama (llama: its llama3 rope scaling as a rope_freqs tensor, as the converter writes
Llama 3.1's), tiny-qwen2 (qwen2: qkv biases), tiny-qwen3 (qwen3: q/k norms), tiny-gemma3
(gemma3: norms stored as 1 + w, the layer pattern and local rope base that llama.cpp assumes)
and tiny-phi3 (phi3, as Phi3MiniModel writes it: attn_qkv and ffn_up (gate and up) fused, no
q/k permutation, rope.dimension_count for the partial rotary, no key/value lengths, longrope as
rope_factors_short / rope_factors_long tensors with rope.scaling.original_context_length and
rope.scaling.attn_factor, attention.sliding_window), and the mixtures of experts, their experts
merged into [experts, rows, cols] tensors as the converter merges them: tiny-mixtral (llama
with llama.expert_count), tiny-qwen2-moe (qwen2moe: gate and up experts in one
ffn_gate_up_exps, as --fuse-gate-up-exps writes them; the shared expert's gate as [H], the
shape llama.cpp declares; a dense layer for mlp_only_layers, which llama.cpp itself would not
load), tiny-qwen3-moe (qwen3moe) and tiny-olmoe (olmoe: q/k norms over the whole
projections, [n_embd] and [n_head_kv * head_dim]); and tiny-mixtral-q8_0.gguf, tiny-mixtral's 2-D and 3-D
weights as Q8_0 blocks but the routers, which llama-quantize keeps in F32.

Usage: build/pyenv/bin/python3 tools/models/make_tiny_gguf.py [MODEL_DIR] [OUT_DIR]
       build/pyenv/bin/python3 tools/models/make_tiny_gguf.py --families [OUT_DIR]
"""
import math
import json
import os
import re
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T


def load_file(path):
    """safetensors without the safetensors package: [u64 n][n bytes JSON header][data]."""
    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": None}
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype=np.uint8)
        if info["dtype"] == "BF16":
            x = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            x = raw.view(dtypes[info["dtype"]])
        out[name] = x.reshape(info["shape"])
    return out


def permute(w, n_head, n_head_kv):
    # convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


ARCHS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
         "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3", "MixtralForCausalLM": "llama",
         "Qwen2MoeForCausalLM": "qwen2moe", "Qwen3MoeForCausalLM": "qwen3moe",
         "OlmoeForCausalLM": "olmoe"}

# An expert's projection: (layer, expert, merged GGUF tensor) for the converter's 3-D tensors.
EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:mlp|block_sparse_moe)\.experts\.(\d+)\."
                    r"(gate_proj|up_proj|down_proj|w1|w3|w2)\.weight")
EXPERT_TENSOR = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                 "w3": "ffn_up_exps", "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}


def merge_experts(weights, fuse_gate_up):
    """convert_hf_to_gguf.py's expert merging: each layer's experts stacked into one
    [experts, rows, cols] tensor per projection (blk.N.ffn_{gate,up,down}_exps), or with
    --fuse-gate-up-exps the gate rows then the up rows of each expert in blk.N.ffn_gate_up_exps.
    Returns the merged tensors and removes the experts from `weights`."""
    parts = {}
    for name in list(weights):
        m = EXPERT.fullmatch(name)
        if m:
            layer, expert, proj = int(m.group(1)), int(m.group(2)), m.group(3)
            parts.setdefault((layer, EXPERT_TENSOR[proj]), {})[expert] = weights.pop(name)
    merged = {}
    for (layer, tensor), experts in parts.items():
        merged[f"blk.{layer}.{tensor}.weight"] = np.stack([experts[e] for e in sorted(experts)])
    if fuse_gate_up:
        for name in [n for n in merged if n.endswith("ffn_gate_exps.weight")]:
            up = merged.pop(name.replace("gate_exps", "up_exps"))
            merged[name.replace("gate_exps", "gate_up_exps")] = np.concatenate(
                [merged.pop(name), up], axis=1)
    return merged


def load_weights(model_dir):
    out = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors") and name != "golden.safetensors":
            out.update(load_file(os.path.join(model_dir, name)))
    return out


def rope_freqs(cfg):
    """convert_hf_to_gguf.py's rope_freqs for llama3 rope scaling: one factor per frequency."""
    rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rp.get("rope_type") != "llama3":
        return None
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    base = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def phi3_params(cfg, rp, w):
    """convert_hf_to_gguf.py Phi3MiniModel: set_gguf_parameters and the longrope tensors."""
    n_embd, n_head = cfg["hidden_size"], cfg["num_attention_heads"]
    max_pos = cfg["max_position_embeddings"]
    orig = cfg.get("original_max_position_embeddings") or rp.get("original_max_position_embeddings")
    rot_pct = rp.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    rope_dims = int(rot_pct * n_embd) // n_head
    w.add_rope_scaling_orig_ctx_len(orig)
    w.add_rope_dimension_count(rope_dims)
    w.add_sliding_window(cfg.get("sliding_window") or 0)
    if rp.get("rope_type", rp.get("type")) not in ("longrope", "su"):
        return
    scale = max_pos / orig
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    w.add_rope_scaling_attn_factors(attn_factor)
    assert len(rp["long_factor"]) == len(rp["short_factor"]) == rope_dims // 2
    w.add_tensor("rope_factors_long.weight", np.array(rp["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(rp["short_factor"], dtype=np.float32))


def write(model_dir, out_path, qtype, fuse_gate_up=False):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    tok_cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    weights = load_weights(model_dir)
    arch = ARCHS[cfg["architectures"][0]]
    gemma = arch.startswith("gemma")

    w = gguf.GGUFWriter(out_path, arch)
    w.add_name(os.path.basename(os.path.normpath(model_dir)))
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rp = cfg.get("rope_parameters") or {}
    if gemma and "full_attention" in rp:
        rp = rp["full_attention"]
        if rp.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rp["factor"])
    rope = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
    w.add_rope_freq_base(rope)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    if arch == "phi3":
        phi3_params(cfg, rp, w)
    else:
        w.add_rope_dimension_count(head_dim)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if gemma and cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    w.add_vocab_size(cfg["vocab_size"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        # TextModel.set_gguf_parameters and Qwen2MoeModel's: Mixtral's experts are
        # feed_forward_length wide, Qwen's <arch>.expert_feed_forward_length.
        w.add_uint32(f"{arch}.expert_count", experts)
        w.add_uint32(f"{arch}.expert_used_count", cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            w.add_uint32(f"{arch}.expert_feed_forward_length", cfg["moe_intermediate_size"])
        if cfg.get("shared_expert_intermediate_size"):
            w.add_uint32(f"{arch}.expert_shared_feed_forward_length",
                         cfg["shared_expert_intermediate_size"])
    w.add_file_type({T.F16: gguf.LlamaFileType.MOSTLY_F16, T.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
                     T.F32: gguf.LlamaFileType.ALL_F32}[qtype])

    # Tokenizer, gpt2 form (convert_hf_to_gguf.py _set_vocab_gpt2).
    vocab = tok["model"]["vocab"]
    added = {t["id"]: t for t in tok["added_tokens"]}
    n = cfg["vocab_size"]
    rev = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(n):
        if i in added:
            tokens.append(added[i]["content"])
            types.append(gguf.TokenType.CONTROL if added[i]["special"] else gguf.TokenType.USER_DEFINED)
        elif i in rev:
            tokens.append(rev[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    w.add_token_merges(merges)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    w.add_bos_token_id(ids[tok_cfg["bos_token"]])
    w.add_eos_token_id(ids[tok_cfg["eos_token"]])
    w.add_add_bos_token(bool(tok_cfg.get("add_bos_token", False)))
    w.add_add_eos_token(False)

    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm.weight": "attn_norm.weight",
                 "post_attention_layernorm.weight": "ffn_norm.weight",
                 "self_attn.q_proj.weight": "attn_q.weight",
                 "self_attn.k_proj.weight": "attn_k.weight",
                 "self_attn.v_proj.weight": "attn_v.weight",
                 "self_attn.q_proj.bias": "attn_q.bias",
                 "self_attn.k_proj.bias": "attn_k.bias",
                 "self_attn.v_proj.bias": "attn_v.bias",
                 "self_attn.q_norm.weight": "attn_q_norm.weight",
                 "self_attn.k_norm.weight": "attn_k_norm.weight",
                 "self_attn.o_proj.weight": "attn_output.weight",
                 "mlp.gate_proj.weight": "ffn_gate.weight",
                 "mlp.up_proj.weight": "ffn_up.weight",
                 "mlp.down_proj.weight": "ffn_down.weight",
                 "self_attn.qkv_proj.weight": "attn_qkv.weight",
                 "mlp.gate_up_proj.weight": "ffn_up.weight",
                 "mlp.gate.weight": "ffn_gate_inp.weight",
                 "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
                 "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
                 "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
                 "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
                 "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight"}
    if gemma:
        per_layer.update({"post_attention_layernorm.weight": "post_attention_norm.weight",
                          "pre_feedforward_layernorm.weight": "ffn_norm.weight",
                          "post_feedforward_layernorm.weight": "post_ffw_norm.weight"})
    freqs = rope_freqs(cfg) if arch == "llama" else None
    if freqs is not None:
        w.add_tensor("rope_freqs.weight", freqs)
    merged = merge_experts(weights, fuse_gate_up)
    for name in sorted(weights) + sorted(merged):
        x = (weights[name] if name in weights else merged[name]).astype(np.float32)
        if name in names:
            out = names[name]
        elif name in merged:
            out = name
        else:
            parts = name.split(".")
            out = f"blk.{parts[2]}." + per_layer[".".join(parts[3:])]
        if out.endswith("ffn_gate_inp_shexp.weight"):
            x = x.reshape(-1)  # [1, H] as llama.cpp declares it, [H]
        if gemma and name.endswith("norm.weight"):
            x = x + 1  # the converter stores Gemma's (1 + w)
        if arch == "llama" and name.endswith("q_proj.weight"):
            x = permute(x, n_head, n_head)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            x = permute(x, n_head, n_kv)
        if qtype == T.F32:
            w.add_tensor(out, x)
        elif qtype == T.F16 and x.ndim >= 2:
            w.add_tensor(out, x.astype(np.float16))
        elif x.ndim >= 2 and not out.endswith("ffn_gate_inp.weight"):  # llama-quantize keeps
            w.add_tensor(out, gguf.quants.quantize(x, qtype), raw_dtype=qtype)  # routers F32
        else:
            w.add_tensor(out, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("wrote", out_path)


def main():
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    if len(sys.argv) > 1 and sys.argv[1] == "--families":
        out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "tests", "data", "models")
        models = os.path.join(root, "tests", "data", "models")
        for name in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3", "tiny-phi3",
                     "tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe", "tiny-olmoe"):
            write(os.path.join(models, name), os.path.join(out_dir, name + ".gguf"), T.F32,
                  fuse_gate_up=name == "tiny-qwen2-moe")
        # Every weight of tiny-mixtral has rows of 32: its experts kept as Q8_0 blocks.
        write(os.path.join(models, "tiny-mixtral"),
              os.path.join(out_dir, "tiny-mixtral-q8_0.gguf"), T.Q8_0)
        return
    model_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "models", "fortune-llama")
    out_dir = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "tests", "data", "models")
    write(model_dir, os.path.join(out_dir, "fortune-llama-f16.gguf"), T.F16)
    write(model_dir, os.path.join(out_dir, "fortune-llama-q8_0.gguf"), T.Q8_0)


if __name__ == "__main__":
    main()
