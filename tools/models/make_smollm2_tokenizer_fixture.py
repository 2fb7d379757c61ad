#!/usr/bin/env python3
"""Writes tests/data/gguf/smollm2_tokenizer_ids.json: Hugging Face `tokenizers` ids for ~50
varied texts with SmolLM2-135M-Instruct's tokenizer, built by the tokenizers library from the
GGUF's vocabulary, merges and control tokens in the shape of SmolLM2's published
tokenizer.json (BPE; pre-tokenizer: single digits, then byte-level with GPT-2's regex, which
llama.cpp's "smollm" pre-tokenizer also is; ByteLevel decoder; control tokens special).
(transformers' AutoTokenizer(gguf_file=...) needs torch to read a GGUF.)

Needs tokenizers and gguf: python3 -m venv /tmp/hf && /tmp/hf/bin/pip install tokenizers gguf
Usage: /tmp/hf/bin/python3 tools/models/make_smollm2_tokenizer_fixture.py GGUF [OUT_JSON]
"""
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


def load(path):
    r = gguf.GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.tokens"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8")
              for i in f["tokenizer.ggml.merges"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0])
             for i in f["tokenizer.ggml.token_type"].data]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, ty in zip(tokens, types) if ty == 3])
    return tok


TEXTS = [
    "The capital of France is",
    "Hello, world!",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\r\n\n\nmixed",
    "1234567890 and 3.14159 and 1,000,000",
    "I'm sure they'll say it's what we've done, didn't we?",
    "UPPER lower MiXeD CaSe",
    "naïve café résumé coöperate",
    "日本語のテキストです。",
    "中文文本，标点符号！",
    "Русский текст с пунктуацией.",
    "العربية من اليمين إلى اليسار",
    "emoji 😀🎉👍🏽 and flags 🇫🇷",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text with <|im_end|> inside",
    "def foo(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "https://example.com/path?query=1&b=2#frag",
    "email: someone@example.org",
    "$100.00 €50 £20 ¥1000",
    "a",
    " ",
    "",
    "\n",
    "....!!!???",
    "---===***",
    "CamelCaseIdentifierName",
    "snake_case_identifier_name",
    "Mr. O'Neil's dog's bone",
    "Zürich, Göteborg, Kraków, Þingvellir",
    "ß ẞ ﬁ ﬂ Ω ≈ ∑ ∫",
    "x² + y² = z²",
    "1st 2nd 3rd 4th",
    "2024-06-01T12:34:56Z",
    "0x1F 0b1010 1e-5",
    "\u00a0non-breaking\u00a0space",
    "zero\u200bwidth",
    "Ünïcödé wïth dïäcrïtïcs",
    "The quick brown fox jumps over the lazy dog.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "   \t  \n  ",
    "'''quoted''' \"double\" `back`",
    "a\u0301 e\u0300 (combining)",
    "한국어 텍스트",
    "ไทย ภาษา",
    "Ελληνικά κείμενο",
    "עברית טקסט",
    "हिन्दी पाठ",
    "12345678901234567890",
]


def main():
    path = os.path.abspath(sys.argv[1])
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "data", "gguf", "smollm2_tokenizer_ids.json")
    tok = load(path)
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
              "decoded": tok.decode(tok.encode(t, add_special_tokens=False).ids,
                                    skip_special_tokens=False)} for t in TEXTS]
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"model": os.path.basename(path), "cases": cases}, f, ensure_ascii=False, indent=0)
    print("wrote", out, len(cases), "cases")


if __name__ == "__main__":
    main()
