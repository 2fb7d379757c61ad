#!/usr/bin/env python3
"""Writes, deterministically, the models the tests and the demo use (no model hub here).

  tests/data/models/fortune-bpe/   a byte-level BPE tokenizer in the style of Llama 3
                                   (tokenizer.json, tokenizer_config.json,
                                   generation_config.json), trained on Debian's fortunes
  tests/data/models/tiny-llama/    LlamaForCausalLM, random weights, BF16, sharded with
                                   model.safetensors.index.json, GQA, llama3 rope scaling
  tests/data/models/tiny-qwen2/    Qwen2ForCausalLM, random weights, F32, one file, qkv
                                   biases, MQA, tied embeddings
  tests/data/models/tiny-qwen3/    Qwen3ForCausalLM, F32: per-head q/k RMSNorm, head_dim 64
                                   (not hidden / heads), GQA, untied embeddings
  tests/data/models/tiny-gemma2/   Gemma2ForCausalLM, F32: sliding-window layers (window 8)
                                   alternating with global ones, attention and final logit
                                   soft-capping (small caps, so that they matter),
                                   query_pre_attn_scalar, four norms per layer, GeGLU
  tests/data/models/tiny-gemma3/   Gemma3ForCausalLM, F32: q/k norm, five local layers
                                   (window 8, own rope base) to one global (linear rope
                                   scaling), tied embeddings; query_pre_attn_scalar = head_dim,
                                   as llama.cpp assumes, so that its GGUF conversion agrees
  tests/data/models/tiny-phi3/     Phi3ForCausalLM, F32: fused qkv_proj and gate_up_proj, GQA,
                                   head_dim 64 with partial_rotary_factor 0.75 (48 rotated),
                                   longrope (short and long factors far from 1, original
                                   length 64: the goldens' sequences, shorter, use the short
                                   ones, as transformers does below that length; the long ones
                                   are checked by a unit test), sliding window 24
  tests/data/models/tiny-mixtral/  MixtralForCausalLM, F32: 8 experts, top-2 (softmax, weights
                                   renormalized), hidden 32, MQA, tied embeddings
  tests/data/models/tiny-qwen2-moe/ Qwen2MoeForCausalLM, F32: 6 experts, top-2 of the softmax
                                   (norm_topk_prob false), a shared expert with its sigmoid
                                   gate, qkv biases, layer 1 dense (mlp_only_layers)
  tests/data/models/tiny-qwen3-moe/ Qwen3MoeForCausalLM, F32: q/k norm, head_dim 16 (not
                                   hidden / heads), 8 experts, top-2, norm_topk_prob true
  tests/data/models/tiny-olmoe/    OlmoeForCausalLM, F32: q/k RMSNorm over each token's whole
                                   q (k) projection, hidden 64 (head_dim 16, which the CUDA
                                   kernels take), GQA, 8 experts, top-2, norm_topk_prob false,
                                   untied embeddings

Needs: torch, transformers, tokenizers, safetensors (pip), and Debian's `fortunes` package.
CI never runs this; it uses the committed outputs.
Usage: python3 tools/models/make_models.py [MODEL ...]   (default: all; the tokenizer is
trained only when fortune-bpe is absent or every model is made)
"""
import glob
import json
import os
import shutil
import sys

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig,
                          LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM,
                          Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM, OlmoeConfig, OlmoeForCausalLM)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "models")
VOCAB_SIZE = 2048
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
# Llama 3's pre-tokenizer split pattern.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def fortunes():
    """The fortunes as a list of texts, in a fixed order (plain-text files only)."""
    texts = []
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith((".dat", ".u8")) or os.path.islink(path) or os.path.isdir(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            texts += [t.strip() for t in f.read().split("\n%\n") if t.strip()]
    if not texts:
        sys.exit("no fortunes found: apt-get install fortunes")
    return texts


def make_tokenizer(texts, out_dir):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2,
                                  special_tokens=[BOS, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "add_bos_token": True,
                   "model_max_length": 512, "tokenizer_class": "PreTrainedTokenizerFast"},
                  f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": bos_id, "eos_token_id": eos_id}, f, indent=2)
    return bos_id, eos_id, tok.get_vocab_size()


def copy_tokenizer(src, dst):
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(os.path.join(src, name), os.path.join(dst, name))


def save(model, out_dir, dtype, max_shard_size):
    shutil.rmtree(out_dir, ignore_errors=True)
    model.to(dtype).save_pretrained(out_dir, safe_serialization=True,
                                    max_shard_size=max_shard_size)


def randomize(model, norm_mean, std=0.08):
    """Larger weights than the default init, so that logits differ. Norm weights (1-D, not
    biases) get `norm_mean` + noise: 1 for RMSNorms that multiply by w, 0 for Gemma's (1 + w).
    `std`: 0.08 for hidden size 64; scaled by sqrt(64 / hidden) for wider models, so that
    their activations (and bf16's relative error on them) are of the same size."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith("bias"):
                p.normal_(0.0, std)
            elif norm_mean is not None:
                p.normal_(norm_mean, 0.1)


def tiny_llama(ids):
    torch.manual_seed(0)
    llama = LlamaConfig(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(llama)
    randomize(model, None)
    return model, torch.bfloat16, "100KB"


def tiny_qwen2(ids):
    torch.manual_seed(1)
    qwen = Qwen2Config(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
        torch_dtype="float32")
    model = Qwen2ForCausalLM(qwen)
    randomize(model, None)
    return model, torch.float32, "10GB"


def tiny_qwen3(ids):
    torch.manual_seed(2)
    cfg = Qwen3Config(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=False,
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], torch_dtype="float32")
    model = Qwen3ForCausalLM(cfg)
    randomize(model, 1.0)
    return model, torch.float32, "10GB"


def tiny_gemma2(ids):
    torch.manual_seed(3)
    cfg = Gemma2Config(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=10000.0, query_pre_attn_scalar=48, sliding_window=8,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=None,
        torch_dtype="float32")
    model = Gemma2ForCausalLM(cfg)
    randomize(model, 0.0)
    return model, torch.float32, "10GB"


def tiny_gemma3(ids):
    torch.manual_seed(4)
    cfg = Gemma3TextConfig(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
        rms_norm_eps=1e-6, query_pre_attn_scalar=64, sliding_window=8,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0}},
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=None,
        torch_dtype="float32")
    model = Gemma3ForCausalLM(cfg)
    randomize(model, 0.0)
    return model, torch.float32, "10GB"


def tiny_phi3(ids):
    torch.manual_seed(5)
    half = 24  # rotary_dim / 2 = 64 * 0.75 / 2
    short = [round(1.0 + 0.15 * i, 4) for i in range(half)]  # 1 .. 4.45
    long = [round(1.0 + 0.9 * i, 4) for i in range(half)]  # 1 .. 21.7
    cfg = Phi3Config(
        vocab_size=ids["vocab"], hidden_size=256, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        original_max_position_embeddings=64, rms_norm_eps=1e-5, sliding_window=24,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "partial_rotary_factor": 0.75, "short_factor": short,
                         "long_factor": long, "original_max_position_embeddings": 64},
        tie_word_embeddings=False, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
        pad_token_id=None, torch_dtype="float32")
    model = Phi3ForCausalLM(cfg)
    randomize(model, 1.0, std=0.04)  # hidden 256 (head_dim 64 over 4 heads)
    return model, torch.float32, "10GB"


# The mixtures of experts: hidden 32 (std scaled as randomize says), so that with the tied
# 2048-token table each model.safetensors stays near 0.5 MB.
MOE_STD = 0.08 * (64 / 32) ** 0.5


def tiny_mixtral(ids):
    torch.manual_seed(6)
    cfg = MixtralConfig(
        vocab_size=ids["vocab"], hidden_size=32, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        num_local_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=1000000.0,
        sliding_window=None, tie_word_embeddings=True, bos_token_id=ids["bos"],
        eos_token_id=ids["eos"], pad_token_id=None, torch_dtype="float32")
    model = MixtralForCausalLM(cfg)
    randomize(model, 1.0, std=MOE_STD)
    return model, torch.float32, "10GB"


def tiny_qwen2_moe(ids):
    torch.manual_seed(7)
    cfg = Qwen2MoeConfig(
        vocab_size=ids["vocab"], hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
        num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=48, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[1], rms_norm_eps=1e-6, rope_theta=1000000.0, use_sliding_window=False,
        tie_word_embeddings=True, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
        pad_token_id=None, torch_dtype="float32")
    model = Qwen2MoeForCausalLM(cfg)
    randomize(model, 1.0, std=MOE_STD)
    return model, torch.float32, "10GB"


def tiny_qwen3_moe(ids):
    torch.manual_seed(8)
    cfg = Qwen3MoeConfig(
        vocab_size=ids["vocab"], hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
        decoder_sparse_step=1, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
        pad_token_id=None, torch_dtype="float32")
    model = Qwen3MoeForCausalLM(cfg)
    randomize(model, 1.0, std=MOE_STD)
    return model, torch.float32, "10GB"


def tiny_olmoe(ids):
    torch.manual_seed(9)
    cfg = OlmoeConfig(
        vocab_size=ids["vocab"], hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=None,
        torch_dtype="float32")
    model = OlmoeForCausalLM(cfg)
    randomize(model, 1.0)
    return model, torch.float32, "10GB"


MODELS = {"tiny-llama": tiny_llama, "tiny-qwen2": tiny_qwen2, "tiny-qwen3": tiny_qwen3,
          "tiny-gemma2": tiny_gemma2, "tiny-gemma3": tiny_gemma3, "tiny-phi3": tiny_phi3,
          "tiny-mixtral": tiny_mixtral, "tiny-qwen2-moe": tiny_qwen2_moe,
          "tiny-qwen3-moe": tiny_qwen3_moe, "tiny-olmoe": tiny_olmoe}


def main():
    names = sys.argv[1:] or list(MODELS)
    for name in names:
        if name not in MODELS:
            sys.exit(f"unknown model {name} (one of {', '.join(MODELS)})")
    tok_dir = os.path.join(OUT, "fortune-bpe")
    if len(names) == len(MODELS) or not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        bos_id, eos_id, vocab = make_tokenizer(fortunes(), tok_dir)
    else:
        tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
        bos_id, eos_id, vocab = tok.token_to_id(BOS), tok.token_to_id(EOS), tok.get_vocab_size()
    print(f"tokenizer: {vocab} tokens, bos {bos_id}, eos {eos_id}")
    ids = {"bos": bos_id, "eos": eos_id, "vocab": vocab}
    for name in names:
        model, dtype, shard = MODELS[name](ids)
        d = os.path.join(OUT, name)
        save(model, d, dtype, shard)
        copy_tokenizer(tok_dir, d)
        print(name, sorted(os.listdir(d)))


if __name__ == "__main__":
    main()
