#!/usr/bin/env python3
"""Writes the fixtures the C++ tokenizer tests compare against, from the Hugging Face
`tokenizers` library (run make_tokenizers.py first).

For each tokenizer in tests/data/tokenizer/<name>/ writes fixtures.json:
  encode: for each test text (stored as hex bytes: some are invalid UTF-8, which Python
          callers hand to the library after lossy decoding, one U+FFFD per invalid
          sequence) the ids with and without add_special_tokens, and the decode of the
          ids with and without skip_special_tokens.
  decode: hand-made id lists (byte tokens that form broken UTF-8, special tokens in the
          middle) and their decodes.
And tests/data/tokenizer/pretokenize_fixtures.json: the pieces `pre_tokenize_str` gives
for the GPT-2, Llama 3 and Qwen2 split patterns, Metaspace, Split behaviors and Digits; and
normalize_fixtures.json: what `normalize_str` gives for Prepend/Replace/Strip normalizers.
"""
import json
import os
import sys

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data",
                    "tokenizer")

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world",
    "Hello, world! It's a test: we'll see; they're 'quoted' and THEY'RE SHOUTING. I'M.",
    "  leading spaces and   runs of    spaces  ",
    "line one\nline two\n\n\nline five\r\nwindows\ttab\t\t end",
    "1234567890 3.14159 12,345 2023-10-05",
    "我们今天去公园散步，天气很好。日本語のテキスト。한국어 문장",
    "Emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 heart ❤️ rare 🦩🪐",
    "e\u0301 n\u0303 Zalgo: Z\u0351\u0352\u0353a\u0357l\u0300g\u0301o \u0915\u094d\u0937",
    "Привет мир! مرحبا بالعالم. שלום",
    "a\u00a0b\u3000c\u2003d \u200bzero-width",
    "def f(x):\n    return x ** 2  # square\n",
    "supercalifragilisticexpialidocious " + "a" * 300,
    "",
    " ",
    "\n",
    "  ",
    "ends with space ",
    "<|begin_of_text|>Hello<|eot_id|> world <|end_of_text|>",
    "<s>Hello</s> world <unk> <s>",
    "call <tool_call>{\"name\": \"f\"}</tool_call> done",
    "<|reserved_special_token_0|><|reserved_special_token_1|>x",
    "▁already▁has▁metaspace",
    "a <|mask|> b and x  \t<|mask|>y <|mask|>",
    "[SEP]  next [SEP]\nline [SEP]",
    "say hello_world now; sayhello_world, hello_world_x, (hello_world).",
    "<|im_start|>user\nCafe\u0301 and \u1100\u1161\u11a8?<|im_end|>\n<|im_start|>assistant\n",
]
# Canonical equivalence cases for NFC / NFD: combining sequences in both orders, Hangul
# syllables and conjoining jamo, singletons (Ohm, Angstrom, CJK compatibility ideographs),
# composition exclusions, a string that starts with a combining mark, Vietnamese.
UNICODE_FORMS = [
    "e\u0301 \u00e9 e\u0323\u0302 e\u0302\u0323 \u1ec7 a\u0308\u0304 \u01df",
    "\u1100\u1161\u11a8 \uac01 \ud55c\uad6d\uc5b4 \u1112\u1161\u11ab",
    "\u2126 \u212b \uf900 \u0958 \u0344 \u0340 \u1e9b\u0323",
    "\u0301abc \u0316\u0301 q\u0307\u0323 Ti\u1ebfng Vi\u1ec7t c\u00f3 d\u1ea5u",
    "\u05d1\u05bc\u05b8 \u0e01\u0e33 \u0915\u093c \u2000 \u00c5 A\u030a",
]
# Invalid UTF-8, as bytes: the library sees bytes.decode("utf-8", "replace").
BAD_BYTES = [
    b"abc\xff\xfedef",
    b"\xe4\xbd",
    b"x\xf0\x9f\x98 y",
    b"\xc0\xaf overlong",
    b"\xed\xa0\x80 surrogate",
    b"\x80\x80\x80",
]


def long_text():
    """About 6 KB: English prose with code-like indentation and the multilingual texts."""
    with open(os.path.join(DATA, "english_sample.txt"), encoding="utf-8") as f:
        english = f.read()[:5000]
    return english + "\n".join(TEXTS[:12] + UNICODE_FORMS) + "\n    indented = {\n        'k': [1, 2],\n    }\n"


def encode_cases(tok):
    cases = []
    for raw in [t.encode("utf-8") for t in TEXTS + [long_text()]] + BAD_BYTES:
        text = raw.decode("utf-8", "replace")
        with_special = tok.encode(text, add_special_tokens=True).ids
        without = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "bytes_hex": raw.hex(),
            "ids_with_special": with_special,
            "ids_without_special": without,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip": tok.decode(with_special, skip_special_tokens=True),
        })
    return cases


def byte_level_token(tok, b):
    # GPT-2's bytes_to_unicode.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for x in range(256):
        if x not in bs:
            bs.append(x)
            cs.append(256 + n)
            n += 1
    return tok.token_to_id(chr(dict(zip(bs, cs))[b]))


def decode_id_lists(name, tok):
    if name in ("llama3_style", "qwen2_style"):
        byte = lambda b: byte_level_token(tok, b)
        t = lambda s: tok.token_to_id(s)
        hello = tok.encode("Hello", add_special_tokens=False).ids
        world = tok.encode(" world", add_special_tokens=False).ids
        return [
            [byte(0xE4), byte(0xBD), byte(0xA0)],   # 你 from three byte tokens
            [byte(0xE4), byte(0xBD)],               # truncated: one U+FFFD
            [byte(0xFF), byte(0x41), byte(0xFE)],   # invalid bytes around 'A'
            [byte(0xF0), byte(0x9F)] + hello + [byte(0x98), byte(0x80)],
            [t(s) for s in ("<|begin_of_text|>", "<|im_start|>") if t(s) is not None] + hello +
            [t(s) for s in ("<|eot_id|>", "<|im_end|>") if t(s) is not None] + world,
            hello + [t(s) for s in ("<tool_call>", "<|endoftext|>") if t(s) is not None] + world,
            [123456, 99999999] + hello,            # out of range ids are skipped
        ]
    byte = lambda b: tok.token_to_id(f"<0x{b:02X}>")
    t = lambda s: tok.token_to_id(s)
    hello = tok.encode("Hello", add_special_tokens=False).ids
    world = tok.encode("world", add_special_tokens=False).ids
    return [
        [byte(0xE4), byte(0xBD), byte(0xA0)],
        [byte(0xE4), byte(0xBD)],
        [byte(0xE4), byte(0xBD)] + hello,
        [byte(0xFF), byte(0x41), byte(0xFE)],
        [t("<s>")] + hello + world,
        hello + [t("</s>")] + world + [t("<s>")] + hello,
        [t("<unk>")] + hello,
        [byte(0x20), byte(0x20)] + hello,
        [t("▁"), t("▁")] + hello if t("▁") is not None else hello,
        [123456] + hello,
    ]


def pretokenize_fixtures():
    pts = {
        "gpt2": pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        "gpt2_prefix_space": pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
        "llama3": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        "qwen2": pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        "metaspace_first_split": pre_tokenizers.Metaspace(replacement="▁",
                                                          prepend_scheme="first", split=True),
        "metaspace_always_nosplit": pre_tokenizers.Metaspace(replacement="▁",
                                                             prepend_scheme="always",
                                                             split=False),
        "split_removed": pre_tokenizers.Split(" ", behavior="removed"),
        "split_merged_prev": pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_previous"),
        "split_merged_next": pre_tokenizers.Split(Regex(r"\s+"), behavior="merged_with_next"),
        "split_contiguous": pre_tokenizers.Split(Regex(r"[,;]"), behavior="contiguous"),
        "split_invert": pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="isolated", invert=True),
        "digits_individual": pre_tokenizers.Digits(individual_digits=True),
        "digits_runs": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                                pre_tokenizers.ByteLevel(use_regex=False)]),
    }
    out = {}
    for name, pt in pts.items():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pt
        spec = json.loads(tok.to_str())["pre_tokenizer"]
        cases = []
        for text in TEXTS:
            cases.append({"text": text, "pieces": [p for p, _ in pt.pre_tokenize_str(text)]})
        cases.append({"text": "a,,b;c ,;, d", "pieces": [
            p for p, _ in pt.pre_tokenize_str("a,,b;c ,;, d")]})
        out[name] = {"pre_tokenizer": spec, "cases": cases}
    return out


def normalize_fixtures():
    norms = {
        "llama2": normalizers.Sequence([normalizers.Prepend("▁"),
                                        normalizers.Replace(" ", "▁")]),
        "strip_both": normalizers.Strip(left=True, right=True),
        "strip_right": normalizers.Strip(left=False, right=True),
        "replace_regex": normalizers.Replace(Regex(r"\s+"), " "),
        "replace_string_longer": normalizers.Replace("ab", "xyz"),
        "nfc": normalizers.NFC(),
        "nfd": normalizers.NFD(),
        "qwen2_nfc_in_sequence": normalizers.Sequence([normalizers.NFC()]),
    }
    out = {}
    for name, norm in norms.items():
        tok = Tokenizer(models.BPE())
        tok.normalizer = norm
        spec = json.loads(tok.to_str())["normalizer"]
        cases = [{"text": t, "normalized": norm.normalize_str(t)}
                 for t in TEXTS + ["abab cab"] + UNICODE_FORMS]
        out[name] = {"normalizer": spec, "cases": cases}
    return out


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main():
    import tokenizers
    for name in ["llama3_style", "llama2_style", "mistral_style", "metaspace_style",
                 "qwen2_style"]:
        tok = Tokenizer.from_file(os.path.join(DATA, name, "tokenizer.json"))
        decodes = []
        for ids in decode_id_lists(name, tok):
            decodes.append({"ids": ids,
                            "text": tok.decode(ids, skip_special_tokens=False),
                            "text_skip": tok.decode(ids, skip_special_tokens=True)})
        write_json(os.path.join(DATA, name, "fixtures.json"),
                   {"tokenizers_version": tokenizers.__version__,
                    "encode": encode_cases(tok), "decode": decodes})
    write_json(os.path.join(DATA, "pretokenize_fixtures.json"),
               {"tokenizers_version": tokenizers.__version__, **pretokenize_fixtures()})
    write_json(os.path.join(DATA, "normalize_fixtures.json"),
               {"tokenizers_version": tokenizers.__version__, **normalize_fixtures()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
