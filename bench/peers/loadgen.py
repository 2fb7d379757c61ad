"""Closed-loop load against an OpenAI-compatible /v1/completions server (vLLM, llama-server).

The workload of issue 18: --num-requests prompts of uniform --min-prompt..--max-prompt random
token ids in [3, --vocab), --output-len tokens each, greedy, ignore_eos, --concurrency clients
back to back, streaming. Output tokens are counted by the server (the stream's usage, or
llama-server's timings.predicted_n), never by re-tokenizing text. Metrics as vLLM's serving
benchmark: TTFT = send to first streamed token; TPOT = (E2E - TTFT) / (output tokens - 1) per
request; output tokens/s = all output tokens / wall time. Prints one JSON line.
"""

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx


async def one(client, args, prompt):
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.output_len,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.server == "llamacpp":
        body["cache_prompt"] = False
        body["n_predict"] = args.output_len
    t0 = time.perf_counter()
    ttft = last = None
    tokens = None
    async with client.stream("POST", args.url + "/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                now = time.perf_counter() - t0
                if ttft is None:
                    ttft = now
                last = now
            usage = chunk.get("usage") or {}
            if usage.get("completion_tokens") is not None:
                tokens = usage["completion_tokens"]
            timings = chunk.get("timings") or {}
            if tokens is None and timings.get("predicted_n") is not None:
                tokens = timings["predicted_n"]
    if tokens is None:
        raise RuntimeError("the server reported no output token count (usage)")
    if ttft is None:
        raise RuntimeError("no token streamed")
    return ttft, last, tokens


async def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="http://HOST:PORT")
    p.add_argument("--server", choices=["vllm", "llamacpp"], required=True)
    p.add_argument("--model", default="model")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--min-prompt", type=int, default=64)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(3, args.vocab) for _ in range(rng.randint(args.min_prompt, args.max_prompt))]
        for _ in range(args.num_requests)
    ]
    queue = list(reversed(prompts))
    results = []
    timeout = httpx.Timeout(600.0, connect=30.0)
    limits = httpx.Limits(max_connections=args.concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:

        async def worker():
            while queue:
                results.append(await one(client, args, queue.pop()))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        duration = time.perf_counter() - start
    out_tokens = sum(r[2] for r in results)
    ttft = [r[0] for r in results]
    tpot = [(r[1] - r[0]) / (r[2] - 1) for r in results if r[2] > 1]
    print(
        json.dumps(
            {
                "requests": len(results),
                "output_tokens": out_tokens,
                "duration_s": duration,
                "output_tok_s": out_tokens / duration,
                "ttft_p50_ms": statistics.median(ttft) * 1e3,
                "tpot_p50_ms": statistics.median(tpot) * 1e3 if tpot else float("nan"),
            }
        )
    )


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as e:  # one line for the driver
        print(f"loadgen: {e}", file=sys.stderr)
        sys.exit(1)
