#!/usr/bin/env python3
"""Causal prefill attention through torch, the baseline of bench_kernels_cuda's prefill.

The shapes of BM_PagedAttentionPrefill (bench/bench_kernels_cuda.cc): Llama-3-8B heads (32
query / 8 KV heads of 128), bf16, each sequence's whole prompt from position 0 in one call, at
batch x prompt 1 x 2048, 4 x 2048, 1 x 8192 and 16 x 512, through
torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) on [batch, heads,
q_len, head_dim] tensors uniform in [-1, 1], in two GQA variants:
  enable_gqa  8 KV heads passed as they are (enable_gqa=True, torch >= 2.5);
  repeat_kv   K and V repeated to 32 heads once, outside the timing (what older torch needs).
The faster of the two is the entry's ms and tflops; both are listed under "variants".

Timing: 5 warm-up calls, then 5 bursts of 10 back-to-back calls, each burst timed with CUDA
events; ms is the mean call time. The L2 is not flushed: prefill is bound by the tensor cores,
not by memory (bench_kernels_cuda does not flush it for prefill either). FLOPs, the formula
bench_kernels_cuda uses (QK^T and PV, 2 FLOPs per multiply-add, over the key positions each
row sees, the diagonal included):
  FLOPs = 4 * heads * head_dim * sum over sequences of q_len * (q_len + 1) / 2.

Also a device-to-device copy: dst.copy_(src) of 1 GiB, best of 5 after 2 warm-ups, its
bandwidth counting the bytes read and written (as bench_kernels_cuda and bench_gpu_model count
their copies).

Writes JSON (--out, default torch_attention_bench.json):
  {"device": name, "torch": version, "tiny": bool,
   "prefill": [{"batch", "q_len", "heads", "kv_heads", "head_dim", "ms", "tflops", "gqa",
                "variants": {"enable_gqa": ms, "repeat_kv": ms}}],
   "copy_gbps": GB/s}
An entry that failed has "error" instead of ms and tflops (the script then exits 1). Without
torch or without a CUDA device it prints why, writes {"skipped": why, ...} and exits 0.

--tiny: 8 query / 2 KV heads, 1 x 64 and 2 x 40, a 16 MiB copy, 1 warm-up and 2 bursts of 2:
a smoke check of this script, not a benchmark.
"""

import argparse
import json
import sys

SHAPES = [(1, 2048), (4, 2048), (1, 8192), (16, 512)]
TINY_SHAPES = [(1, 64), (2, 40)]
HEAD_DIM = 128


def causal_prefill_flops(batch, q_len, heads, head_dim):
    """FLOPs of causal attention over `batch` prompts of q_len tokens from position 0."""
    return 4.0 * heads * head_dim * batch * q_len * (q_len + 1) / 2


def write(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")


def time_ms(torch, fn, warmup, bursts, calls):
    """Mean milliseconds per call of fn over `bursts` event-timed bursts of `calls` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    total = 0.0
    for _ in range(bursts):
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        total += start.elapsed_time(stop)
    return total / (bursts * calls)


def prefill_entry(torch, batch, q_len, heads, kv_heads, timing):
    import torch.nn.functional as F

    entry = {"batch": batch, "q_len": q_len, "heads": heads, "kv_heads": kv_heads,
             "head_dim": HEAD_DIM}
    dev, dt = "cuda", torch.bfloat16
    q = torch.rand(batch, heads, q_len, HEAD_DIM, device=dev, dtype=dt) * 2 - 1
    k = torch.rand(batch, kv_heads, q_len, HEAD_DIM, device=dev, dtype=dt) * 2 - 1
    v = torch.rand(batch, kv_heads, q_len, HEAD_DIM, device=dev, dtype=dt) * 2 - 1
    variants, errors = {}, {}
    try:
        variants["enable_gqa"] = time_ms(
            torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                          enable_gqa=True), *timing)
    except (TypeError, RuntimeError) as e:  # TypeError: torch without enable_gqa
        errors["enable_gqa"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    try:
        group = heads // kv_heads
        kr = k.repeat_interleave(group, dim=1)
        vr = v.repeat_interleave(group, dim=1)
        variants["repeat_kv"] = time_ms(
            torch, lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True), *timing)
        del kr, vr
    except RuntimeError as e:
        errors["repeat_kv"] = str(e).splitlines()[0] if str(e) else type(e).__name__
    entry["variants"] = variants
    if errors:
        entry["variant_errors"] = errors
    if not variants:
        entry["error"] = "; ".join(f"{k}: {v}" for k, v in errors.items())
        return entry
    best = min(variants, key=variants.get)
    ms = variants[best]
    entry["gqa"] = best
    entry["ms"] = ms
    entry["tflops"] = causal_prefill_flops(batch, q_len, heads, HEAD_DIM) / (ms * 1e-3) / 1e12
    return entry


def copy_gbps(torch, nbytes, tiny):
    """Best of 5 event-timed dst.copy_(src) of nbytes: (read + written) bytes per second / 1e9."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    for _ in range(1 if tiny else 2):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(2 if tiny else 5):
        start.record()
        dst.copy_(src)
        stop.record()
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return 2.0 * nbytes / (best * 1e-3) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="torch_attention_bench.json", help="the JSON to write")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes: a smoke check")
    args = parser.parse_args()
    result = {"device": None, "torch": None, "tiny": args.tiny}

    try:
        import torch
    except ImportError as e:
        result["skipped"] = f"no torch: {e}"
        print(f"torch_attention_bench: skipped: {result['skipped']}")
        write(args.out, result)
        return 0
    result["torch"] = torch.__version__
    if not torch.cuda.is_available():
        result["skipped"] = f"torch {torch.__version__} sees no CUDA device"
        print(f"torch_attention_bench: skipped: {result['skipped']}")
        write(args.out, result)
        return 0

    result["device"] = torch.cuda.get_device_name(0)
    heads, kv_heads = (8, 2) if args.tiny else (32, 8)
    shapes = TINY_SHAPES if args.tiny else SHAPES
    timing = (1, 2, 2) if args.tiny else (5, 5, 10)  # warm-ups, bursts, calls per burst
    torch.manual_seed(0)
    print(f"device: {result['device']}, torch {result['torch']}")
    result["prefill"] = []
    for batch, q_len in shapes:
        try:
            entry = prefill_entry(torch, batch, q_len, heads, kv_heads, timing)
        except RuntimeError as e:  # e.g. out of memory allocating the inputs
            entry = {"batch": batch, "q_len": q_len, "heads": heads, "kv_heads": kv_heads,
                     "head_dim": HEAD_DIM, "error": str(e).splitlines()[0]}
        torch.cuda.empty_cache()
        result["prefill"].append(entry)
        if "error" in entry:
            print(f"prefill {batch} x {q_len}: error: {entry['error']}")
        else:
            shown = ", ".join(f"{k} {v:.3f} ms" for k, v in entry["variants"].items())
            print(f"prefill {batch} x {q_len}: {entry['ms']:.3f} ms, {entry['tflops']:.1f} "
                  f"TFLOP/s ({shown})")
    try:
        result["copy_gbps"] = copy_gbps(torch, (16 << 20) if args.tiny else (1 << 30), args.tiny)
        print(f"device-to-device copy (read + write): {result['copy_gbps']:.1f} GB/s")
    except RuntimeError as e:
        result["copy_error"] = str(e).splitlines()[0]
        print(f"copy: error: {result['copy_error']}")
    write(args.out, result)
    failed = "copy_error" in result or any("error" in e for e in result["prefill"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
