#!/usr/bin/env python3
"""Trains the small tokenizers the C++ tests use, with the Hugging Face `tokenizers` library.

Writes, under tests/data/tokenizer/:
  llama3_style/   byte-level BPE, Llama 3's Split regex, ignore_merges, <|begin_of_text|>
                  added by a TemplateProcessing post-processor, tokenizer_config.json and
                  generation_config.json (eos_token_id is a list, as Llama 3.1 ships it).
  llama2_style/   BPE with byte_fallback and <0x00>..<0xFF> byte tokens, normalizer
                  Sequence[Prepend("▁"), Replace(" ", "▁")], no pre-tokenizer, decoder
                  Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0)].
  mistral_style/  the llama2_style vocabulary and decoder with a Metaspace pre-tokenizer
                  (prepend_scheme "first", no split) instead of the normalizer, as Mistral
                  7B v0.3 ships it; merges in the older "a b" string form.
  metaspace_style/ the same with Metaspace (prepend_scheme "always", split) as
                  pre-tokenizer and decoder.
  qwen2_style/    NFC normalizer, Qwen2's split regex, byte-level BPE, no bos token,
                  ChatML special tokens; eos_token_id a list.
  english_sample.txt  English text for bench/bench_tokenizer (the GPL-3 license, verbatim).

Deterministic: the corpus is Debian's license texts (/usr/share/common-licenses) plus the
multilingual lines below. Usage: pip install tokenizers && python3 make_tokenizers.py
"""
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from tokenizers import processors, trainers

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data",
                   "tokenizer")
LICENSES = "/usr/share/common-licenses"

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

MULTILINGUAL = [
    "The quick brown fox jumps over the lazy dog. It's 2024; we've got 1,234,567 items.",
    "Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci !",
    "Der Fluß ist schön, die Straße ist lang. Größe, Übung, Ärger.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "我们今天去公园散步，天气很好。中文分词是一个有趣的问题。",
    "日本語のテキストも少し入れます。東京は大きな都市です。",
    "한국어 문장도 조금 있습니다. 안녕하세요!",
    "Emoji: 😀 😃 😄 👍🏽 👨‍👩‍👧‍👦 ❤️ 🇫🇷 — done.",
    "Combining marks: e\u0301 a\u0300 n\u0303 o\u0308 (decomposed) vs é à ñ ö (composed).",
    "def f(x):\n    return x ** 2  # square\n\n\tindented\ttabs\r\nwindows line",
    "Numbers 3.14159 and 2.71828, dates 2023-10-05, phone +1-555-0100.",
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया. สวัสดีชาวโลก",
]


def corpus():
    lines = []
    for name in sorted(os.listdir(LICENSES)):
        path = os.path.join(LICENSES, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.extend(line.rstrip("\n") for line in f)
    # The multilingual lines are short; repeat them so that their merges are learned.
    for _ in range(20):
        lines.extend(MULTILINGUAL)
    return [line for line in lines if line.strip()]


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=2)
        f.write("\n")


def llama3_style(lines):
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(4)]
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + reserved + ["<|eot_id|>"]
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    # Llama 3 puts its special tokens after the learned vocabulary.
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", bos)]),
    ])
    # Added tokens with each matching option: a plain one (as fine-tunes add), lstrip (as
    # RoBERTa's <mask>), rstrip, and a single_word one matched in normalized text.
    tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    tok.add_special_tokens([AddedToken("<|mask|>", special=True, lstrip=True, normalized=False),
                            AddedToken("[SEP]", special=True, rstrip=True, normalized=False)])
    tok.add_tokens([AddedToken("hello_world", special=False, single_word=True,
                               normalized=True)])
    spec = json.loads(tok.to_str())
    spec["model"]["ignore_merges"] = True
    d = os.path.join(OUT, "llama3_style")
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "tokenizer.json"), spec)
    eos = tok.token_to_id("<|end_of_text|>")
    eot = tok.token_to_id("<|eot_id|>")
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>",
        "add_bos_token": True,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 131072,
    })
    write_json(os.path.join(d, "generation_config.json"), {
        "bos_token_id": bos,
        "eos_token_id": [eos, eot],
        "do_sample": True,
    })


QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2_style(lines):
    """NFC normalizer, Qwen2's split pattern (single digits), byte-level BPE without
    ignore_merges, no bos token (the ByteLevel post-processor adds nothing)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    tok.add_special_tokens(specials)
    d = os.path.join(OUT, "qwen2_style")
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "tokenizer.json"), json.loads(tok.to_str()))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_prefix_space": False,
        "tokenizer_class": "Qwen2Tokenizer",
    })
    write_json(os.path.join(d, "generation_config.json"), {
        "eos_token_id": [tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")],
        "pad_token_id": tok.token_to_id("<|endoftext|>"),
    })


def llama2_spec(lines):
    """Trains with a Metaspace split (so merges stay inside words, as SentencePiece's do),
    then rebuilds the vocabulary in Llama 2's layout: <unk>, <s>, </s>, 256 byte tokens,
    then the learned pieces."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=2500, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(lines, trainer)
    spec = json.loads(tok.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                               for m in spec["model"]["merges"]]
    spec["added_tokens"] = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for t in ["<unk>", "<s>", "</s>"]
    ]
    spec["pre_tokenizer"] = None
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return spec


def llama2_style(lines):
    spec = llama2_spec(lines)
    # Round trip through the library so that the file is exactly what it writes.
    tok = Tokenizer.from_str(json.dumps(spec))
    d = os.path.join(OUT, "llama2_style")
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "tokenizer.json"), json.loads(tok.to_str()))
    write_json(os.path.join(d, "tokenizer_config.json"), {
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "__type": "AddedToken"},
        "eos_token": {"content": "</s>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "__type": "AddedToken"},
        "unk_token": "<unk>",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": False,
        "tokenizer_class": "LlamaTokenizer",
    })
    write_json(os.path.join(d, "generation_config.json"),
               {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})
    # Mistral style (as Mistral 7B v0.3 ships it): the same vocabulary, a Metaspace
    # pre-tokenizer instead of the normalizer, the Llama 2 decoder.
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                             "split": False}
    write_variant(spec, "mistral_style", merges_as_strings=True)
    # Metaspace style: Metaspace on both sides (prepend_scheme "always", split), with
    # ByteFallback before the Metaspace decoder.
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁",
                             "prepend_scheme": "always", "split": True}
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True},
    ]}
    write_variant(spec, "metaspace_style", merges_as_strings=False)


def write_variant(spec, name, merges_as_strings):
    tok = Tokenizer.from_str(json.dumps(spec))
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    out = json.loads(tok.to_str())
    if merges_as_strings:
        # Older files write merges as "a b" strings; keep that form here so both are covered.
        out["model"]["merges"] = [" ".join(m) for m in out["model"]["merges"]]
    write_json(os.path.join(d, "tokenizer.json"), out)
    write_json(os.path.join(d, "tokenizer_config.json"),
               {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                "add_bos_token": True, "add_eos_token": False})


def main():
    lines = corpus()
    os.makedirs(OUT, exist_ok=True)
    llama3_style(lines)
    llama2_style(lines)
    qwen2_style(lines)
    with open(os.path.join(LICENSES, "GPL-3"), encoding="utf-8") as f:
        text = f.read()
    with open(os.path.join(OUT, "english_sample.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
