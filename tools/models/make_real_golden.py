#!/usr/bin/env python3
"""Golden fixtures for a real GGUF model from Hugging Face transformers, which loads the file
itself (dequantized to float32, eager attention): for each prompt, transformers' token ids, its
greedy continuation, and at the prompt's last position and at each continuation step the top
logits (id and value). The C++ real-model tests compare our tokenizer, logits and greedy tokens
with them. Prompts: short texts and one long enough to pass the model's sliding window.

Needs: torch, transformers, accelerate, gguf (pip). CI never runs this; it uses the committed
output. Usage: python3 tools/models/make_real_golden.py MODEL.gguf OUT.json
"""
import hashlib
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

NUM_GREEDY = 6
TOP = 16
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]


def long_text():
    """About 700 tokens of plain English, so that local layers see past their window."""
    words = ("the quick brown fox jumps over the lazy dog while a patient cat watches from "
             "the old stone wall and counts the birds that fly south for the winter").split()
    out, i = [], 0
    while len(out) < 640:
        out.append(words[i % len(words)] if i % 37 else f"number {i // 37}.")
        i += 1
    return " ".join(out) + ". In summary, the story was about"


def main():
    path, out_path = sys.argv[1], sys.argv[2]
    folder, name = path.rsplit("/", 1)
    sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    prompts = []
    with torch.no_grad():
        for text in TEXTS + [long_text()]:
            ids = tok(text)["input_ids"]
            seq, greedy, top = list(ids), [], []
            steps = NUM_GREEDY if len(ids) < 200 else 3
            for _ in range(steps + 1):
                logits = model(torch.tensor([seq])).logits[0, -1]
                v, i = torch.topk(logits, TOP)
                top.append([[int(a), float(b)] for a, b in zip(i, v)])
                nxt = int(torch.argmax(logits))
                if len(greedy) == steps:
                    break
                greedy.append(nxt)
                seq.append(nxt)
            prompts.append({"text": text, "ids": ids, "greedy": greedy, "top": top})
            print(len(ids), repr(tok.decode(greedy)))
    json.dump({"file": name, "sha256": sha, "torch": torch.__version__,
               "transformers": transformers.__version__, "top": TOP, "prompts": prompts},
              open(out_path, "w"), indent=None, separators=(",", ":"))


if __name__ == "__main__":
    main()
