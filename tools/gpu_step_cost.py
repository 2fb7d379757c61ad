#!/usr/bin/env python3
"""What a decode step of Llama-3-8B in bf16 costs on paper, on an H100 SXM and an H200.

A decode step of `batch` sequences, each with `context` tokens of context, reads every weight
once (the embedding table only for its looked-up rows, neglected here), reads the K and V of
every context token of every layer, and does 2 FLOPs per weight per token plus attention
(QK^T and PV: 4 * heads * head_dim * context per token per layer). Its lower bound on time is
max(bytes / HBM bandwidth, FLOPs / dense bf16 peak). Activations, logits (batch * vocab * 4
bytes written) and kernel launch gaps are left out: the bound is optimistic.

Paper figures only: nothing here has run on a GPU. Prints a Markdown table
(docs/performance/results.md).
Usage: tools/gpu_step_cost.py [--batches 1,8,32,128,256] [--contexts 512,2048]
"""
import argparse

# Llama-3-8B (config.json of meta-llama/Meta-Llama-3-8B).
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 4096, 32, 8, 128
INTERMEDIATE, LAYERS, VOCAB = 14336, 32, 128256
BYTES = 2  # bf16 weights and KV cache

# Peaks from NVIDIA's data sheets (H100 SXM5 80 GB; H200 141 GB): HBM bytes/s, dense bf16 FLOP/s.
DEVICES = [("H100 SXM", 3.35e12, 989e12, 80e9), ("H200", 4.8e12, 989e12, 141e9)]


def params_read():
    """Weights a step reads: the 32 layers, the final norm and the LM head (not tied)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    per_layer = HIDDEN * (q + 2 * kv) + q * HIDDEN + 3 * HIDDEN * INTERMEDIATE + 2 * HIDDEN
    return LAYERS * per_layer + VOCAB * HIDDEN + HIDDEN


def step_cost(batch, context):
    weights = params_read() * BYTES
    kv = batch * context * LAYERS * 2 * KV_HEADS * HEAD_DIM * BYTES
    flops = 2 * params_read() * batch + batch * LAYERS * 4 * HEADS * HEAD_DIM * context
    return weights, kv, flops


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32,128,256")
    ap.add_argument("--contexts", default="512,2048")
    args = ap.parse_args()
    p = params_read()
    print(f"Weights read per step: {p / 1e9:.3f} G parameters = {p * BYTES / 1e9:.2f} GB "
          f"(resident with the embedding: {(p + VOCAB * HIDDEN) * BYTES / 1e9:.2f} GB); "
          f"KV read per token of context: {LAYERS * 2 * KV_HEADS * HEAD_DIM * BYTES} bytes; "
          f"FLOPs per token: {2 * p / 1e9:.2f} G + {LAYERS * 4 * HEADS * HEAD_DIM / 1e6:.3f} M "
          f"x context.\n")
    head = ["context", "batch", "weights GB", "KV GB", "TFLOP"]
    for name, _, _, _ in DEVICES:
        head += [f"{name} ms (bound by)", f"{name} tokens/s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for context in map(int, args.contexts.split(",")):
        for batch in map(int, args.batches.split(",")):
            weights, kv, flops = step_cost(batch, context)
            row = [str(context), str(batch), f"{weights / 1e9:.2f}", f"{kv / 1e9:.2f}",
                   f"{flops / 1e12:.3f}"]
            for _, bw, peak, memory in DEVICES:
                t_mem, t_flop = (weights + kv) / bw, flops / peak
                t = max(t_mem, t_flop)
                bound = "memory" if t_mem >= t_flop else "compute"
                # Resident: every weight (the embedding table too) and the KV cache.
                resident = (params_read() + VOCAB * HIDDEN) * BYTES + kv
                fits = "" if resident < memory else ", does not fit"
                row += [f"{t * 1e3:.2f} ({bound}{fits})", f"{batch / t:,.0f}"]
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
