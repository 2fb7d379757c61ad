#!/usr/bin/env python3
"""Writes a SentencePiece-style ("llama") GGUF tokenizer and Hugging Face `tokenizers`' ids for
it, for tests/unit/scheduler_service/tokenizer/gguf_tokenizer_test.cc:

  tests/data/gguf/llama2-style-tokenizer.gguf: tests/data/tokenizer/llama2_style's vocabulary
    as GGUF writes a Llama 2 tokenizer: tokenizer.ggml.model "llama", tokens, scores (0 for
    control and byte tokens, -id for the others, as SentencePiece BPE models order their
    pieces), token types (UNKNOWN, CONTROL, BYTE, NORMAL), bos/eos/unk ids; no merges.
  tests/data/gguf/llama2_style_gguf_ids.json: ids (with and without special tokens) and decodes
    of varied texts by the tokenizer transformers builds from such a file: BPE with byte
    fallback and merges from transformers' generate_merges(vocab, scores), Prepend/Replace "▁"
    normalizer, Replace/ByteFallback/Fuse/Strip decoder, "<s> $A" template.

Needs gguf, tokenizers and transformers (no torch).
Usage: /tmp/hf/bin/python3 tools/models/make_spm_gguf_tokenizer.py
"""
import json
import os

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
from transformers.tokenization_utils_base import generate_merges

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TEXTS = [
    "The capital of France is",
    "Hello, world!",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\n\nmixed",
    "1234567890 and 3.14159",
    "I'm sure they'll say it's what we've done",
    "UPPER lower MiXeD CaSe",
    "naïve café résumé",
    "日本語のテキスト",
    "emoji 😀🎉",
    "<s>special</s> tokens </s>",
    "def foo(x):\n    return x ** 2\n",
    "",
    " ",
    "a",
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, there was a little girl.",
    "zero\u200bwidth and\u00a0nbsp",
]


def main():
    src = json.load(open(os.path.join(ROOT, "tests/data/tokenizer/llama2_style/tokenizer.json")))
    vocab = src["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    special = {t["content"] for t in src["added_tokens"]}
    types, scores = [], []
    for i, t in enumerate(tokens):
        if t == "<unk>":
            types.append(gguf.TokenType.UNKNOWN); scores.append(0.0)
        elif t in special:
            types.append(gguf.TokenType.CONTROL); scores.append(0.0)
        elif t.startswith("<0x") and len(t) == 6:
            types.append(gguf.TokenType.BYTE); scores.append(0.0)
        else:
            types.append(gguf.TokenType.NORMAL); scores.append(-float(i))

    out = os.path.join(ROOT, "tests/data/gguf/llama2-style-tokenizer.gguf")
    w = gguf.GGUFWriter(out, "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(vocab["<s>"])
    w.add_eos_token_id(vocab["</s>"])
    w.add_unk_token_id(vocab["<unk>"])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # gguf stores scores as f32: the reference sorts by the same rounded values.
    import numpy as np
    f32 = [float(np.float32(s)) for s in scores]
    merges = generate_merges({t: i for i, t in enumerate(tokens)}, dict(zip(tokens, f32)))
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty in (2, 3)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    cases = []
    for text in TEXTS:
        with_special = tok.encode(text).ids
        plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": plain, "ids_special": with_special,
                      "decoded": tok.decode(plain, skip_special_tokens=False)})
    fixture = os.path.join(ROOT, "tests/data/gguf/llama2_style_gguf_ids.json")
    with open(fixture, "w", encoding="utf-8") as f:
        json.dump({"cases": cases}, f, ensure_ascii=False, indent=0)
    print("wrote", out, fixture, len(merges), "merges")


if __name__ == "__main__":
    main()
