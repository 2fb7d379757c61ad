#!/usr/bin/env python3
"""The served model's first step against a reference on the same weights (the device kit).

    check_logits.py --model DIR --served FILE [FILE ...] --out RESULT.json
                    [--backend auto|transformers|numpy] [--tolerance 0.1]

Each FILE is what `llm-client generate --token-ids=... --max-tokens=1 --temperature=0
--logprobs=K --json` printed for one prompt: the served top-K logprobs of the first generated
token (the log_softmax of the first step's logits, the model's raw distribution). The reference
computes the same prompt's last-position logits from DIR's safetensors:

  transformers  LlamaForCausalLM in float32 on cuda when torch sees a GPU (else on the CPU);
                the device kit's reference;
  numpy         this file's own Llama forward in float64 (embedding, RMSNorm, rotary with Llama
                3's scaling, grouped-query causal attention, SwiGLU MLP, tied or untied head):
                the rehearsal's reference, where torch is not installed;
  auto          transformers when it imports, else numpy.

For every prompt: the greatest |served - reference| over the top-K tokens' logprobs, and whether
the served greedy token is the reference's argmax (required only where the reference's top-2
margin exceeds twice the tolerance). RESULT.json gets each prompt's figures, the maximum error,
the backend and `ok`; the exit status is 0 when ok.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """name -> float64 array (bf16, f16 or f32 tensors)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        raw = data[base + begin:base + end]
        if t["dtype"] == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            a = raw.view("<f2")
        elif t["dtype"] == "F32":
            a = raw.view("<f4")
        else:
            raise ValueError(f"{name}: dtype {t['dtype']} is not read here")
        out[name] = a.astype(np.float64).reshape(t["shape"])
    return out


def rope_inv_freq(cfg):
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = cfg.get("rope_theta", 10000.0)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    theta = scaling.get("rope_theta", theta)
    inv = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv = np.where(medium, smoothed, scaled)
    return inv


def numpy_last_logits(cfg, w, ids):
    """float64 logits of the last position of `ids`."""
    h = cfg["hidden_size"]
    nq, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // nq
    eps = cfg.get("rms_norm_eps", 1e-6)
    t = len(ids)

    def rms(x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight

    angles = np.outer(np.arange(t, dtype=np.float64), rope_inv_freq(cfg))  # [t, d/2]
    cos, sin = np.cos(angles), np.sin(angles)

    def rotate(x):  # x [t, heads, d], NeoX halves
        a, b = x[..., : d // 2], x[..., d // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    x = w["model.embed_tokens.weight"][ids]
    causal = np.triu(np.full((t, t), -np.inf), 1)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        y = rms(x, w[p + "input_layernorm.weight"])
        q = rotate((y @ w[p + "self_attn.q_proj.weight"].T).reshape(t, nq, d))
        k = rotate((y @ w[p + "self_attn.k_proj.weight"].T).reshape(t, nkv, d))
        v = (y @ w[p + "self_attn.v_proj.weight"].T).reshape(t, nkv, d)
        group = nq // nkv
        out = np.empty((t, nq, d))
        for head in range(nq):
            s = q[:, head, :] @ k[:, head // group, :].T / math.sqrt(d) + causal
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            out[:, head, :] = (s / s.sum(axis=-1, keepdims=True)) @ v[:, head // group, :]
        x = x + out.reshape(t, nq * d) @ w[p + "self_attn.o_proj.weight"].T
        y = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = y @ w[p + "mlp.gate_proj.weight"].T
        up = y @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x[-1], w["model.norm.weight"])
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return head @ x


class NumpyReference:
    name = "numpy (float64)"

    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            self.cfg = json.load(f)
        self.w = read_safetensors(os.path.join(model_dir, "model.safetensors"))

    def last_logits(self, ids):
        return numpy_last_logits(self.cfg, self.w, ids)


class TransformersReference:
    def __init__(self, model_dir):
        import torch
        import transformers

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        load = transformers.AutoModelForCausalLM.from_pretrained
        try:
            model = load(model_dir, dtype=torch.float32)  # transformers 5
        except TypeError:
            model = load(model_dir, torch_dtype=torch.float32)
        self.model = model.to(self.device).eval()
        where = torch.cuda.get_device_name() if self.device == "cuda" else "cpu"
        self.name = (f"transformers {transformers.__version__} (torch {torch.__version__}), "
                     f"float32 on {where}")

    def last_logits(self, ids):
        with self.torch.no_grad():
            x = self.torch.tensor([ids], device=self.device)
            return self.model(x).logits[0, -1].double().cpu().numpy()


def make_reference(backend, model_dir):
    if backend in ("auto", "transformers"):
        try:
            return TransformersReference(model_dir)
        except ImportError as e:
            if backend == "transformers":
                raise
            print(f"check_logits.py: transformers unavailable ({e}); numpy reference",
                  file=sys.stderr)
    return NumpyReference(model_dir)


def served_first_token(path):
    """(prompt ids, sampled id, {token id: logprob}) from llm-client --json output."""
    sampled, top = None, {}
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    meta = json.loads(open(path + ".prompt").read())
    prompt = meta["token_ids"]
    for resp in lines:
        for seq in resp.get("outputs", []):
            if seq.get("token_ids") and sampled is None:
                sampled = int(seq["token_ids"][0])
                first = seq["logprobs"][0]
                top = {int(t.get("token_id", 0)): float(t.get("logprob", 0.0))
                       for t in first.get("top", [])}
    if sampled is None:
        raise ValueError(f"{path}: no sampled token in the served output")
    return prompt, sampled, top


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--served", nargs="+", required=True)
    ap.add_argument("--backend", choices=["auto", "transformers", "numpy"], default="auto")
    ap.add_argument("--tolerance", type=float, default=0.1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ref = make_reference(args.backend, args.model)
    prompts, worst, ok = [], 0.0, True
    for path in args.served:
        ids, sampled, top = served_first_token(path)
        logits = ref.last_logits(ids)
        m = logits.max()
        logprobs = logits - (m + np.log(np.exp(logits - m).sum()))
        order = np.argsort(-logprobs)
        margin = float(logprobs[order[0]] - logprobs[order[1]])
        err = max((abs(lp - logprobs[t]) for t, lp in top.items()), default=float("inf"))
        greedy_ok = sampled == int(order[0]) or margin <= 2 * args.tolerance
        good = bool(top) and bool(err <= args.tolerance) and bool(greedy_ok)
        ok &= good
        worst = max(worst, err)
        prompts.append({"prompt_tokens": len(ids), "served_token": sampled,
                        "reference_token": int(order[0]), "reference_margin": margin,
                        "top_compared": len(top), "max_abs_logprob_error": float(err),
                        "ok": good})
        print(f"check_logits.py: {len(ids)} prompt tokens: served {sampled}, reference "
              f"{int(order[0])} (margin {margin:.3f}); top-{len(top)} max |error| {err:.4f}"
              f"{'' if good else '  FAILED'}")
    result = {"reference": ref.name, "tolerance": args.tolerance, "prompts": prompts,
              "max_abs_logprob_error": worst, "ok": ok}
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"check_logits.py: {ref.name}: max |served - reference| logprob {worst:.4f} "
          f"(tolerance {args.tolerance}): {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
