#!/usr/bin/env python3
"""Writes, deterministically, the models the tests and the demo use (no model hub here).

  tests/data/models/fortune-bpe/   a byte-level BPE tokenizer in the style of Llama 3
                                   (tokenizer.json, tokenizer_config.json,
                                   generation_config.json), trained on Debian's fortunes
  tests/data/models/tiny-llama/    LlamaForCausalLM, random weights, BF16, sharded with
                                   model.safetensors.index.json, GQA, llama3 rope scaling
  tests/data/models/tiny-qwen2/    Qwen2ForCausalLM, random weights, F32, one file, qkv
                                   biases, MQA, tied embeddings

Needs: torch, transformers, tokenizers, safetensors (pip), and Debian's `fortunes` package.
CI never runs this; it uses the committed outputs. Usage: python3 tools/models/make_models.py
"""
import glob
import json
import os
import shutil
import sys

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

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


def main():
    tok_dir = os.path.join(OUT, "fortune-bpe")
    bos_id, eos_id, vocab = make_tokenizer(fortunes(), tok_dir)
    print(f"tokenizer: {vocab} tokens, bos {bos_id}, eos {eos_id}")

    torch.manual_seed(0)
    llama = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=bos_id, eos_token_id=eos_id,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        tie_word_embeddings=False, torch_dtype="bfloat16")
    model = LlamaForCausalLM(llama)
    with torch.no_grad():  # larger weights than the default init, so that logits differ
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    d = os.path.join(OUT, "tiny-llama")
    save(model, d, torch.bfloat16, "100KB")
    copy_tokenizer(tok_dir, d)

    torch.manual_seed(1)
    qwen = Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
        use_sliding_window=False, bos_token_id=bos_id, eos_token_id=eos_id,
        torch_dtype="float32")
    model = Qwen2ForCausalLM(qwen)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith("bias"):
                p.normal_(0.0, 0.08)
    d = os.path.join(OUT, "tiny-qwen2")
    save(model, d, torch.float32, "10GB")
    copy_tokenizer(tok_dir, d)
    for name in ("tiny-llama", "tiny-qwen2"):
        files = sorted(os.listdir(os.path.join(OUT, name)))
        print(name, files)


if __name__ == "__main__":
    main()
