#!/usr/bin/env python3
"""Trains the demo model `make run` serves: a small Llama on Debian's fortunes.

Writes models/fortune-llama/ in Hugging Face format (config.json, model.safetensors in F16,
the fortune-bpe tokenizer from tests/data/models/fortune-bpe, generation_config.json), a few
MB, committed. PyTorch on the CPU, seeded; about ten minutes on two cores. CI never runs it.
Usage: python3 tools/models/train_demo.py [--steps N]
"""
import argparse
import math
import os
import random
import shutil
import time

import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM

from make_models import OUT as DATA_MODELS, copy_tokenizer, fortunes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "models", "fortune-llama")
SEQ_LEN = 128


def token_stream(tok, bos, eos):
    texts = fortunes()
    random.Random(0).shuffle(texts)
    ids = []
    for t in texts:
        ids += [bos] + tok.encode(t, add_special_tokens=False).ids + [eos]
    return torch.tensor(ids, dtype=torch.long)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)

    tok_dir = os.path.join(DATA_MODELS, "fortune-bpe")
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    bos, eos = tok.token_to_id("<|begin_of_text|>"), tok.token_to_id("<|end_of_text|>")
    data = token_stream(tok, bos, eos)
    n_val = SEQ_LEN * 64
    train, val = data[:-n_val], data[-n_val:]
    print(f"{len(data)} tokens ({len(train)} train)")

    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=640,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=bos, eos_token_id=eos, torch_dtype="float16")
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f}M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 50

    def lr_at(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    g = torch.Generator().manual_seed(0)
    start = time.time()
    model.train()
    for step in range(args.steps):
        idx = torch.randint(0, len(train) - SEQ_LEN - 1, (args.batch,), generator=g)
        x = torch.stack([train[i:i + SEQ_LEN] for i in idx])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} {time.time() - start:.0f}s", flush=True)
    model.eval()
    with torch.no_grad():
        xs = val[: (len(val) // SEQ_LEN) * SEQ_LEN].view(-1, SEQ_LEN)
        val_loss = model(input_ids=xs, labels=xs).loss.item()
        print(f"validation loss {val_loss:.3f} (perplexity {math.exp(val_loss):.1f})")
        prompt = torch.tensor([[bos] + tok.encode("Once upon a time", add_special_tokens=False).ids])
        out = model.generate(prompt, max_new_tokens=40, do_sample=False)
        print("greedy sample:", repr(tok.decode(out[0].tolist(), skip_special_tokens=True)))

    shutil.rmtree(OUT, ignore_errors=True)
    model.to(torch.float16).save_pretrained(OUT, safe_serialization=True)
    copy_tokenizer(tok_dir, OUT)
    print("saved", OUT, sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
