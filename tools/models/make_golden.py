#!/usr/bin/env python3
"""Golden fixtures from Hugging Face transformers for our models (run after make_models.py).

For each model directory it writes, beside the weights:
  golden.safetensors     for prompts p0, p1, ...: "pN.ids" (I32: the prompt followed by
                         greedy continuation tokens) and "pN.logits" (F32 [len(ids), vocab]:
                         the logits at every position of that sequence). The prompt lengths
                         and the library versions are in the metadata.
  weights_checksum.json  per tensor: shape, dtype, sum and sum of |x| in float64 as torch
                         reads them, so the C++ reader can be checked against torch.

transformers runs in float32 with eager attention. CI never runs this.
Usage: python3 tools/models/make_golden.py [model_dir ...]
"""
import json
import os
import sys

import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_DIRS = [os.path.join(ROOT, "tests", "data", "models", m)
                for m in ("tiny-llama", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3",
                          "tiny-phi3", "tiny-mixtral", "tiny-qwen2-moe", "tiny-qwen3-moe",
                          "tiny-olmoe")]
TEXTS = [
    "Once upon a time",
    "The best way to predict the future is to invent it. Computers are useless;",
    "A journey of a thousand miles begins with a single step, and a fortune cookie "
    "says that you will be hungry again in one hour.",
]
NUM_GREEDY = 6


def weights_checksum(model_dir):
    files = sorted(f for f in os.listdir(model_dir)
                   if f.endswith(".safetensors") and f != "golden.safetensors")
    out = {}
    for name in files:
        for key, t in safetensors.torch.load_file(os.path.join(model_dir, name)).items():
            x = t.to(torch.float64)
            out[key] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                        "sum": x.sum().item(), "abs_sum": x.abs().sum().item()}
    return out


def main():
    dirs = sys.argv[1:] or DEFAULT_DIRS
    torch.manual_seed(0)
    for d in dirs:
        tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                     attn_implementation="eager")
        model.eval()
        vocab = model.config.vocab_size
        prompts = [tok(t, add_special_tokens=True)["input_ids"] for t in TEXTS]
        g = torch.Generator().manual_seed(1234)
        prompts.append(torch.randint(2, vocab, (33,), generator=g).tolist())  # no text at all
        tensors, lens = {}, []
        with torch.no_grad():
            for i, prompt in enumerate(prompts):
                ids = list(prompt)
                for _ in range(NUM_GREEDY):  # greedy, recomputing the whole sequence
                    logits = model(torch.tensor([ids])).logits[0, -1]
                    ids.append(int(torch.argmax(logits)))
                logits = model(torch.tensor([ids])).logits[0]
                tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
                tensors[f"p{i}.logits"] = logits.to(torch.float32).contiguous()
                lens.append(len(prompt))
        meta = {"prompt_lens": ",".join(map(str, lens)), "num_greedy": str(NUM_GREEDY),
                "torch": torch.__version__, "transformers": transformers.__version__}
        safetensors.torch.save_file(tensors, os.path.join(d, "golden.safetensors"), metadata=meta)
        with open(os.path.join(d, "weights_checksum.json"), "w") as f:
            json.dump(weights_checksum(d), f, indent=1, sort_keys=True)
        print(d, "prompt lengths", lens)


if __name__ == "__main__":
    main()
