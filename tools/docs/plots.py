#!/usr/bin/env python3
"""Draws the performance plots of docs/performance/plots/ from measured data.

  tools/docs/plots.py                                the committed data, into docs/performance/plots
  tools/docs/plots.py --peers SCRATCH/results.jsonl  a fresh bench/peers run instead
  tools/docs/plots.py --out DIR                      somewhere else

Inputs:
  --peers FILE   bench/peers results: either run.sh's results.jsonl (one loadgen measurement
                 per line: system, c, round, output_tok_s, ttft_p50_ms, tpot_p50_ms) or a
                 committed data file (docs/performance/data/peers-DATE.json: the same rows under
                 "rows", with the machine, commit, date and source beside them). Default: the
                 newest docs/performance/data/peers-*.json.
  --steps FILE   the phases of an engine step (docs/performance/data/step-phases-DATE.json).
                 Default: the newest committed one.

Outputs (PNG, about 100 dpi): peers-throughput-ttft.png (output tokens/s and TTFT p50 against
concurrency, one line per system: the median over its rounds, bars from the lowest to the
highest round) and step-phases.png (a step's time by phase, per number of streams). `make plots`
runs it with the build's Python (make pyenv installs matplotlib).
"""
import argparse
import glob
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = os.path.join(REPO, "docs", "performance", "data")
DPI = 100

# Legend names and colours by the system's prefix in bench/peers (ours-bf16, vllm-fp32, ...).
SYSTEMS = {
    "ours": ("ours", "tab:blue"),
    "vllm": ("vLLM CPU backend", "tab:orange"),
    "llamacpp": ("llama.cpp", "tab:green"),
}


def newest(pattern):
    files = sorted(glob.glob(os.path.join(DATA, pattern)))
    if not files:
        sys.exit(f"plots.py: no {pattern} in {DATA}")
    return files[-1]


def load_peers(path):
    """Returns (rows, caption). Accepts run.sh's results.jsonl or a committed data file."""
    with open(path) as f:
        text = f.read()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict) and "rows" in doc:
        caption = (f"{doc.get('machine', '?')}, commit {doc.get('commit', '?')}, "
                   f"{doc.get('date', '?')}")
        return doc["rows"], caption
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows, f"bench/peers run: {os.path.basename(path)}"


def label(system):
    prefix, _, variant = system.partition("-")
    name, colour = SYSTEMS.get(prefix, (prefix, None))
    return (f"{name} {variant}" if variant else name), colour


def plot_peers(rows, caption, out):
    by = {}
    for r in rows:
        by.setdefault(r["system"], {}).setdefault(int(r["c"]), []).append(r)
    fig, (tok_ax, ttft_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for system in sorted(by, key=lambda s: (not s.startswith("ours"), s)):
        conc = sorted(by[system])
        name, colour = label(system)
        for ax, key in ((tok_ax, "output_tok_s"), (ttft_ax, "ttft_p50_ms")):
            values = [[r[key] for r in by[system][c]] for c in conc]
            mid = [statistics.median(v) for v in values]
            err = [[m - min(v) for m, v in zip(mid, values)],
                   [max(v) - m for m, v in zip(mid, values)]]
            ax.errorbar(conc, mid, yerr=err, marker="o", capsize=3, label=name, color=colour)
    for ax in (tok_ax, ttft_ax):
        ax.set_xscale("log", base=2)
        concs = sorted({int(r["c"]) for r in rows})
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set_xlabel("concurrency (closed loop)")
        ax.grid(True, alpha=0.3)
    tok_ax.set_ylabel("output tokens/s")
    tok_ax.set_ylim(bottom=0)
    tok_ax.set_title("throughput (higher is better)")
    ttft_ax.set_ylabel("TTFT p50, ms")
    ttft_ax.set_yscale("log")
    ttft_ax.set_title("time to first token (lower is better)")
    tok_ax.legend()
    fig.suptitle(f"bench/peers, SmolLM2-135M: {caption}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def plot_steps(path, out):
    with open(path) as f:
        doc = json.load(f)
    rows = doc["rows"]
    labels = [r["streams"] for r in rows]
    phases = (("round_trip_ms", "round trip", "tab:orange"), ("update_ms", "update", "tab:green"),
              ("streams_ms", "streams", "tab:red"))
    fig, (all_ax, over_ax) = plt.subplots(1, 2, figsize=(10, 4))
    y = range(len(rows))
    # Left: the whole step, the worker's model step and what the scheduler adds.
    left = [r["worker_step_ms"] for r in rows]
    all_ax.barh(y, left, color="tab:blue", label="worker step")
    overhead = [sum(r[k] for k, _, _ in phases) for r in rows]
    all_ax.barh(y, overhead, left=left, color="tab:gray",
                label="scheduler (round trip, update, streams)")
    for i, (w, o) in enumerate(zip(left, overhead)):
        all_ax.text(w + o, i, f" {o / (w + o):.1%}", va="center", fontsize=8)
    all_ax.set_yticks(list(y), labels)
    all_ax.set_ylabel("streams in the step")
    all_ax.set_xlabel("ms per step")
    all_ax.set_title("a decode step")
    all_ax.legend(fontsize=8, loc="lower right")
    # Right: the scheduler's part alone, by phase.
    left = [0.0] * len(rows)
    for key, name, colour in phases:
        widths = [r[key] for r in rows]
        over_ax.barh(y, widths, left=left, color=colour, label=name)
        left = [a + b for a, b in zip(left, widths)]
    over_ax.set_yticks(list(y), labels)
    over_ax.set_xlabel("ms per step")
    over_ax.set_title("the scheduler's part, by phase")
    over_ax.legend(fontsize=8, loc="lower right")
    for ax in (all_ax, over_ax):
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"SmolLM2-135M f32, 1 CPU worker: {doc.get('machine', '?')}, "
                 f"commit {doc.get('commit', '?').split()[0]}, {doc.get('date', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=DPI)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", help="bench/peers results.jsonl or a data file")
    ap.add_argument("--steps", help="a step-phases data file")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "performance", "plots"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    peers = args.peers or newest("peers-*.json")
    steps = args.steps or newest("step-phases-*.json")
    rows, caption = load_peers(peers)
    written = [os.path.join(args.out, "peers-throughput-ttft.png"),
               os.path.join(args.out, "step-phases.png")]
    plot_peers(rows, caption, written[0])
    plot_steps(steps, written[1])
    for path in written:
        print(f"{path}: {os.path.getsize(path) // 1024} KiB")


if __name__ == "__main__":
    main()
