#!/usr/bin/env python3
"""The device kit's summary: run_kit.sh's phases judged and tabulated.

    kit_summary.py --work W --out OUT --mode cuda|emu

Reads what run_kit.sh left in W (phases.tsv, env.txt, kit_manifest.json, tests/*.json,
sanitize/results.txt, serve/, bench/) and writes OUT/summary.json and OUT/summary.txt. A phase
passes when:
  env       run_kit.sh found every library (it stops before anything else otherwise);
  tests     every binary wrote its GoogleTest JSON, exited 0, and no test failed or was
            SKIPPED (a skip means the environment is broken: counted as a failure);
  sanitize  every compute-sanitizer run was clean (skipped in the emulated mode);
  serve     the logits check passed, every llm-loadgen request succeeded, and the worker's own
            counters say it sampled on the device, replayed CUDA graphs for decode steps and
            found its cuBLASLt plans cached more often than it made them;
  bench     every benchmark ran (no benchmark reported an error).
The exit status is 0 when every phase that ran passed and none was skipped for the deadline.
"""
import argparse
import glob
import json
import os
import re
import sys


def read(path, default=""):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return default


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def phases(work):
    out = {}
    for line in read(os.path.join(work, "phases.tsv")).splitlines():
        name, status, detail = (line.split("\t") + ["", ""])[:3]
        out[name] = {"status": status, "detail": detail}
    return out


def judge_tests(work):
    exit_codes = {}
    for line in read(os.path.join(work, "tests", "exit_codes.txt")).splitlines():
        name, _, rc = line.partition(" exit ")
        exit_codes[name] = int(rc) if rc.strip().lstrip("-").isdigit() else -1
    binaries, problems = [], []
    totals = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0}
    for name in sorted(exit_codes):
        j = read_json(os.path.join(work, "tests", name + ".json"))
        entry = {"binary": name, "exit": exit_codes[name]}
        if j is None:
            entry["error"] = "no GoogleTest JSON (crashed or timed out)"
            problems.append(f"{name}: {entry['error']}, exit {exit_codes[name]}")
            binaries.append(entry)
            continue
        failed, skipped = [], []
        count = 0
        for suite in j.get("testsuites", []):
            for case in suite.get("testsuite", []):
                count += 1
                full = f"{suite.get('name')}.{case.get('name')}"
                if case.get("failures"):
                    failed.append(full)
                elif case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                    skipped.append(full)
        entry.update(tests=count, failed=failed, skipped=skipped)
        totals["tests"] += count
        totals["failed"] += len(failed)
        totals["skipped"] += len(skipped)
        totals["passed"] += count - len(failed) - len(skipped)
        if failed:
            problems.append(f"{name}: failed {', '.join(failed[:5])}")
        if skipped:
            problems.append(f"{name}: skipped (counted as failures) {', '.join(skipped[:5])}")
        if exit_codes[name] != 0 and not failed:
            problems.append(f"{name}: exit {exit_codes[name]}")
        if count == 0:
            problems.append(f"{name}: no test ran")
        binaries.append(entry)
    ok = bool(binaries) and not problems
    return {"ok": ok, "totals": totals, "binaries": binaries, "problems": problems}


def loadgen(path):
    text = read(path)
    fields = {
        "successful": r"Successful requests:\s+(\d+)",
        "failed": r"Failed requests:\s+(\d+)",
        "output_tok_s": r"Output token throughput \(tok/s\):\s+([\d.]+)",
        "ttft_median_ms": r"P50 TTFT \(ms\):\s+([\d.]+)",
        "ttft_p99_ms": r"P99 TTFT \(ms\):\s+([\d.]+)",
        "tpot_median_ms": r"P50 TPOT \(ms\):\s+([\d.]+)",
        "tpot_p99_ms": r"P99 TPOT \(ms\):\s+([\d.]+)",
        "itl_median_ms": r"P50 ITL \(ms\):\s+([\d.]+)",
    }
    out = {}
    for key, pattern in fields.items():
        m = re.search(pattern, text)
        if m:
            out[key] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    return out


def worker_stats(text):
    out = {}
    m = re.search(r"worker sampler:\s+(\w+) \((\d+) steps sampled on the device, (\d+) on the host",
                  text)
    if m:
        out.update(sampler=m.group(1), device_sampled_steps=int(m.group(2)),
                   host_sampled_steps=int(m.group(3)))
    m = re.search(r"cuda graphs:\s+(\w+), (\d+) captured, (\d+) of (\d+) steps", text)
    if m:
        out.update(cuda_graphs=m.group(1), graphs_captured=int(m.group(2)),
                   graph_steps=int(m.group(3)), steps=int(m.group(4)))
    m = re.search(r"cuBLASLt plans:\s+(\d+) cached, (\d+) hits, (\d+) misses", text)
    if m:
        out.update(linear_plans=int(m.group(1)), linear_plan_hits=int(m.group(2)),
                   linear_plan_misses=int(m.group(3)))
    return out


def judge_serve(work):
    s = os.path.join(work, "serve")
    if not os.path.isdir(s):
        return None
    logits = read_json(os.path.join(s, "logits.json"))
    loads = {}
    for path in sorted(glob.glob(os.path.join(s, "loadgen_c*.txt")),
                       key=lambda p: int(re.search(r"_c(\d+)", p).group(1))):
        loads[re.search(r"_c(\d+)", path).group(1)] = loadgen(path)
    stats = worker_stats(read(os.path.join(s, "stats.txt")))
    problems = []
    if not logits:
        problems.append("no logits check")
    elif not logits.get("ok"):
        problems.append(f"logits: max error {logits.get('max_abs_logprob_error')} "
                        f"over the tolerance {logits.get('tolerance')}")
    if not loads:
        problems.append("no llm-loadgen run")
    for c, r in loads.items():
        if r.get("failed", 1) != 0 or not r.get("successful"):
            problems.append(f"llm-loadgen at concurrency {c}: {r.get('failed', '?')} failed")
    if stats.get("sampler") != "device" or stats.get("host_sampled_steps", 1) != 0:
        problems.append(f"the worker did not sample every step on the device: {stats}")
    if not stats.get("graph_steps"):
        problems.append(f"no decode step replayed a CUDA graph: {stats}")
    if not stats.get("linear_plans") or stats.get("linear_plan_hits", 0) <= stats.get(
            "linear_plan_misses", 0):
        problems.append(f"cuBLASLt plans not cached and reused: {stats}")
    return {"ok": not problems, "logits": logits, "loadgen": loads, "worker": stats,
            "problems": problems}


def bench_entries(path):
    j = read_json(path)
    if j is None:
        return None, []
    entries, errors = [], []
    for b in j.get("benchmarks", []):
        if b.get("error_occurred"):
            errors.append(f"{b.get('name')}: {b.get('error_message')}")
            continue
        entry = {"name": b.get("name")}
        for k, v in b.items():
            if isinstance(v, (int, float)) and k not in ("iterations", "repetitions",
                                                          "repetition_index", "threads",
                                                          "family_index",
                                                          "per_family_instance_index"):
                entry[k] = v
        entries.append(entry)
    return {"context": j.get("context", {}), "benchmarks": entries}, errors


def judge_bench(work, mode):
    b = os.path.join(work, "bench")
    if not os.path.isdir(b):
        return None
    out, problems = {}, []
    for key, name in (("kernels", "kernels.json"), ("model", "model.json")):
        data, errors = bench_entries(os.path.join(b, name))
        if data is None:
            problems.append(f"{name}: missing or not JSON (the benchmark skipped or failed)")
        out[key] = data
        problems += errors
    model = out.get("model") or {}
    if model and not any("Graphs" in e["name"] for e in model.get("benchmarks", [])):
        problems.append("model.json: no step from CUDA graphs")
    torch = read_json(os.path.join(b, "torch.json"))
    out["torch"] = torch
    if torch is None:
        problems.append("torch.json: missing")
    elif torch.get("skipped") and mode == "cuda":
        problems.append(f"torch baseline skipped on the GPU machine: {torch['skipped']}")
    elif any("error" in e for e in torch.get("prefill", [])):
        problems.append("torch baseline: an entry failed")
    out["problems"] = problems
    out["ok"] = not problems
    return out


def fmt(v, spec=".1f"):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def table(summary):
    lines = [f"device kit summary ({summary['mode']}): {'PASSED' if summary['ok'] else 'FAILED'}"]
    for name, p in summary["phases"].items():
        lines.append(f"  {name:9} {p['status']:8} {p.get('detail', '')}")
    env = summary.get("env", "")
    lines += ["", "environment:"] + ["  " + l for l in env.splitlines()[:10]]
    t = summary.get("tests")
    if t:
        tt = t["totals"]
        lines += ["", f"tests: {tt['passed']} passed, {tt['failed']} failed, "
                      f"{tt['skipped']} skipped of {tt['tests']} in {len(t['binaries'])} binaries"]
        lines += ["  " + p for p in t["problems"][:20]]
    s = summary.get("serve")
    if s:
        lg = s.get("logits") or {}
        lines += ["", f"served model: first-step logprobs vs {lg.get('reference', '?')}: max "
                      f"|error| {fmt(lg.get('max_abs_logprob_error'), '.4f')} (tolerance "
                      f"{lg.get('tolerance', '?')})"]
        lines.append("  concurrency  output tok/s  TTFT p50 ms  TPOT p50 ms  failed")
        for c, r in s["loadgen"].items():
            lines.append(f"  {c:>11}  {fmt(r.get('output_tok_s')):>12}  "
                         f"{fmt(r.get('ttft_median_ms')):>11}  {fmt(r.get('tpot_median_ms'), '.2f'):>11}"
                         f"  {r.get('failed', '?'):>6}")
        lines.append(f"  worker: {s['worker']}")
        lines += ["  " + p for p in s["problems"]]
    b = summary.get("bench")
    if b:
        lines += ["", "benchmarks:"]
        for key in ("kernels", "model"):
            data = b.get(key) or {}
            for e in data.get("benchmarks", []):
                counters = ", ".join(f"{k} {fmt(v, '.3g')}" for k, v in e.items()
                                     if k not in ("name", "real_time", "cpu_time"))
                lines.append(f"  {e['name']}: {fmt(e.get('real_time'), '.4g')} "
                             f"{counters}"[:180])
        torch = b.get("torch") or {}
        if torch.get("skipped"):
            lines.append(f"  torch: skipped ({torch['skipped']})")
        for e in torch.get("prefill", []):
            lines.append(f"  torch sdpa {e}"[:180])
        if "copy_gbps" in torch:
            lines.append(f"  torch copy: {fmt(torch['copy_gbps'])} GB/s")
        lines += ["  " + p for p in b["problems"]]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=["cuda", "emu"], required=True)
    args = ap.parse_args()
    ph = phases(args.work)
    summary = {"mode": args.mode, "phases": ph, "env": read(os.path.join(args.work, "env.txt")),
               "kit": read_json(os.path.join(args.work, "kit_manifest.json"))}
    if "tests" in ph:
        summary["tests"] = judge_tests(args.work)
        ph["tests"]["status"] = "ok" if summary["tests"]["ok"] else "failed"
    if ph.get("serve", {}).get("status") == "counted":
        summary["serve"] = judge_serve(args.work)
        ph["serve"]["status"] = "ok" if summary["serve"]["ok"] else "failed"
    if ph.get("bench", {}).get("status") in ("counted", "failed"):
        summary["bench"] = judge_bench(args.work, args.mode)
        if ph["bench"]["status"] == "counted":
            ph["bench"]["status"] = "ok" if summary["bench"]["ok"] else "failed"
    sanitize = read(os.path.join(args.work, "sanitize", "results.txt"))
    if sanitize:
        summary["sanitize"] = sanitize.splitlines()
    # Only the emulation may skip a phase, and only the sanitizer (it has none).
    summary["ok"] = bool(ph) and all(
        p["status"] == "ok" or (name == "sanitize" and args.mode == "emu" and
                                p["status"] == "skipped")
        for name, p in ph.items())
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    text = table(summary)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
