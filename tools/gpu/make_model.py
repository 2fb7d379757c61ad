#!/usr/bin/env python3
"""Writes a Llama or Qwen2 model directory with seeded random bf16 weights, for the device kit
and bench/memory.

    make_model.py --shape llama-3.2-1b|qwen2.5-0.5b|tiny --seed 0 --out DIR

DIR gets config.json (the shape's sizes: llama-3.2-1b and tiny are LlamaForCausalLM with Llama
3's rope scaling; qwen2.5-0.5b is Qwen2ForCausalLM, model_type qwen2, rope_theta 1e6, no rope
scaling, full attention), model.safetensors (bf16), tokenizer.json / tokenizer_config.json /
generation_config.json. Qwen2 has biases on the q, k and v projections
(self_attn.{q,k,v}_proj.bias): random bf16 of the matrices' distribution below; the Llama
shapes have none.

The weights are the same bits on every machine for a shape and seed (numpy's PCG64, no torch):
each tensor's generator is seeded by (seed, tensor index), the index counting the tensors in
tensor_shapes' order (norms included; a Qwen2 layer's three biases follow their projections).
A matrix or bias element is a bf16 with a random sign, a random 7-bit mantissa and an exponent
of 2^-7, 2^-6 (twice as often) or 2^-5, so |w| is in [0.0078, 0.0625) (RMS 0.030;
transformers initializes with 0.02); norm weights are 1. Made from raw generator words, 2.5 GB of Llama-3.2-1B weights take a few
seconds, which matters on a machine lent for minutes.

The tokenizer is tests/data/tokenizer/llama3_style's (a byte-level BPE of 3,000 tokens and 11
special ones, <|begin_of_text|> = 3000, <|end_of_text|> = 3001) with plain tokens "tok<ID>"
added up to the shape's vocabulary, so that every id the model can sample decodes to text.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

SHAPES = {
    # Llama-3.2-1B's sizes (meta-llama/Llama-3.2-1B config.json).
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         vocab_size=128256, max_position_embeddings=131072,
                         tie_word_embeddings=True,
                         rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                                           original_max_position_embeddings=8192,
                                           rope_type="llama3")),
    # Qwen2.5-0.5B's sizes (Qwen/Qwen2.5-0.5B config.json; head_dim = 896 / 14), q/k/v biases.
    "qwen2.5-0.5b": dict(family="qwen2", hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         head_dim=64, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # The kit's rehearsal under the CUDA emulation: the same structure, tiny.
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=3072,
                 max_position_embeddings=4096, tie_word_embeddings=True,
                 rope_scaling=dict(factor=8.0, high_freq_factor=4.0, low_freq_factor=1.0,
                                   original_max_position_embeddings=256, rope_type="llama3")),
}
ROPE_THETA = 500000.0
BOS, EOS = 3000, 3001
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_TOKENIZER = os.path.join(REPO, "tests", "data", "tokenizer", "llama3_style")


def config_json(shape):
    s = SHAPES[shape]
    qwen = s.get("family") == "qwen2"
    if qwen:
        head = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                "attention_bias": True}
    else:
        head = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "attention_bias": False, "mlp_bias": False}
    sizes = {k: s[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "head_dim",
                               "vocab_size", "max_position_embeddings")}
    if qwen:
        rest = {"max_window_layers": s["num_hidden_layers"], "use_sliding_window": False,
                "sliding_window": s["max_position_embeddings"],
                "rms_norm_eps": s["rms_norm_eps"], "rope_theta": s["rope_theta"]}
    else:
        rest = {"rms_norm_eps": 1e-5, "rope_theta": ROPE_THETA,
                "rope_scaling": dict(s["rope_scaling"])}
    return {**head, "hidden_act": "silu", **sizes, **rest,
            "tie_word_embeddings": s["tie_word_embeddings"], "bos_token_id": BOS,
            "eos_token_id": EOS, "torch_dtype": "bfloat16"}


def tensor_shapes(cfg):
    """(name, shape, kind) in the order their seeds are numbered; kind 'w' (matrices and
    biases) or 'norm'. Without attention_bias (the Llama shapes) the list is what it was before
    Qwen2 was added, so those shapes' bytes did not change."""
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    d, q, kv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("model.embed_tokens.weight", (cfg["vocab_size"], h), "w")]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.append((p + "input_layernorm.weight", (h,), "norm"))
        for proj, rows in (("q_proj", q * d), ("k_proj", kv * d), ("v_proj", kv * d)):
            out.append((p + f"self_attn.{proj}.weight", (rows, h), "w"))
            if cfg["attention_bias"]:
                out.append((p + f"self_attn.{proj}.bias", (rows,), "w"))
        out += [
            (p + "self_attn.o_proj.weight", (h, q * d), "w"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate_proj.weight", (i, h), "w"),
            (p + "mlp.up_proj.weight", (i, h), "w"),
            (p + "mlp.down_proj.weight", (h, i), "w"),
        ]
    out.append(("model.norm.weight", (h,), "norm"))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (cfg["vocab_size"], h), "w"))
    return out


def random_bf16(seed, index, shape):
    """bf16 bits (uint16) of the documented distribution, from generator (seed, index)."""
    n = int(np.prod(shape))
    # Four bf16 lanes per 64-bit word, worked on in place (a few passes over the words, not
    # over the elements): bit 15 of a lane is the sign, bits 0..6 the mantissa, and its bits 7
    # and 8 pick the exponent 120 + b7 + b8 (no carry leaves a lane: at most 122 << 7).
    words = np.random.PCG64([seed, index]).random_raw((n + 3) // 4)
    lanes = np.uint64(0x0001000100010001)
    exponent = (words >> np.uint64(7)) & lanes
    exponent += (words >> np.uint64(8)) & lanes
    exponent += np.uint64(120) * lanes
    words &= np.uint64(0x807F807F807F807F)
    exponent <<= np.uint64(7)
    words |= exponent
    return words.view(np.uint16)[:n].reshape(shape)


def write_safetensors(path, tensors):
    """tensors: list of (name, uint16 array of bf16 bits)."""
    header, offset = {}, 0
    for name, a in tensors:
        header[name] = {"dtype": "BF16", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, a in tensors:
            f.write(np.ascontiguousarray(a).astype("<u2", copy=False).tobytes())


def write_tokenizer(out, vocab_size):
    with open(os.path.join(BASE_TOKENIZER, "tokenizer.json")) as f:
        tok = json.load(f)
    taken = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
    for i in range(vocab_size):
        if i not in taken:
            tok["model"]["vocab"][f"tok{i}"] = i
    if max(taken) >= vocab_size:
        sys.exit(f"make_model.py: the tokenizer has ids up to {max(taken)}; "
                 f"vocab_size {vocab_size} is too small")
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open(os.path.join(BASE_TOKENIZER, "tokenizer_config.json")) as f:
        tok_cfg = json.load(f)
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS, "eos_token_id": EOS}, f, indent=2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.2-1b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    cfg = config_json(args.shape)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tensors = []
    for index, (name, shape, kind) in enumerate(tensor_shapes(cfg)):
        if kind == "norm":
            tensors.append((name, np.full(shape, 0x3F80, dtype=np.uint16)))  # 1.0
        else:
            tensors.append((name, random_bf16(args.seed, index, shape)))
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors)
    write_tokenizer(args.out, cfg["vocab_size"])
    params = sum(int(np.prod(a.shape)) for _, a in tensors)
    print(f"make_model.py: {args.shape}, seed {args.seed}: {params / 1e6:.1f} M parameters "
          f"({2 * params / 2**30:.2f} GiB bf16) in {args.out}")


if __name__ == "__main__":
    main()
