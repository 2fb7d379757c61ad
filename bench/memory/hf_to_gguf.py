"""Runs llama.cpp's own convert_hf_to_gguf.py on a tools/gpu/make_model.py directory.

    SCRATCH/venv/bin/python bench/memory/hf_to_gguf.py SCRATCH/llama.cpp/src/convert_hf_to_gguf.py \
        MODEL_DIR --outtype bf16 --outfile OUT.gguf

Everything after the converter's path is the converter's own arguments. The converter runs
unchanged but for two patches, both about make_model.py's tokenizer (a padded copy of
tests/data/tokenizer/llama3_style), none about the weights:
- the converter loads the tokenizer with AutoTokenizer, which under transformers 5 picks the
  config's model type's class (Qwen2Tokenizer for qwen2) and that class adds a token
  ("<|endoftext|>") past vocab_size, failing the converter's check that every id is below it;
  here it loads tokenizer.json as it is (PreTrainedTokenizerFast);
- the converter names the pre-tokenizer from a hash of known tokenizers' output and refuses
  unknown ones; an unknown hash is named "llama-bpe" here (the fixture's split pattern is Llama
  3's). The prompts of bench/memory are token ids, so the text side matters only for decoding.
"""
import os
import runpy
import sys

converter = os.path.abspath(sys.argv[1])
sys.path.insert(0, os.path.dirname(converter))
sys.path.insert(1, os.path.join(os.path.dirname(converter), "gguf-py"))

import transformers  # noqa: E402
from conversion import base  # noqa: E402  (llama.cpp's converter package beside the script)

transformers.AutoTokenizer = transformers.PreTrainedTokenizerFast

_vocab_base_pre = base.TextModel.get_vocab_base_pre


def get_vocab_base_pre(self, tokenizer):
    try:
        return _vocab_base_pre(self, tokenizer)
    except NotImplementedError:
        print("hf_to_gguf.py: unknown pre-tokenizer hash, named llama-bpe", file=sys.stderr)
        return "llama-bpe"


base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [converter] + sys.argv[2:]
runpy.run_path(converter, run_name="__main__")
