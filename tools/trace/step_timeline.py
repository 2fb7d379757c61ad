#!/usr/bin/env python3
"""The step timeline of a served run, from the --v=1 logs of llm-scheduler and llm-worker.

    tools/trace/step_timeline.py --cluster-log llm-cluster.log [--trace out.json]
        [--from-step N] [--to-step M]
    tools/trace/step_timeline.py --scheduler sched.log --worker worker0.log [--worker ...] ...

The logs are llm-cluster's output (its children's lines, "[scheduler] ..." and "[worker R] ...",
run with GLOG_v=1 in its environment) or each process's own stderr.

Reads each engine step line of the scheduler ("engine step N: schedule A ms, execute B ms,
outputs C ms ...") and each model step line of the workers ("step N: ... D ms"); glog stamps a
line when its step ends, so each span is [stamp - duration, stamp]. Prints, over the steps
from --from-step to --to-step (say, the steps of one load), the median model step of each
worker and the median gap between one model step's end and the next one's start (the time the
worker waits for the scheduler); with --trace, writes the spans as a Chrome trace (load it in
chrome://tracing or https://ui.perfetto.dev) to see whether the scheduler's planning and
outputs overlap the workers' steps.
"""
import argparse
import datetime
import json
import re
import statistics
import sys

# glog's prefix: severity, date (MMDD, or YYYYMMDD in newer glog), time, thread id, file:line.
PREFIX = re.compile(r"^[IWEF](\d{4}|\d{8}) (\d\d):(\d\d):(\d\d)\.(\d{6})\s+\d+ \S+\] (.*)$")
ENGINE = re.compile(r"engine step (\d+): schedule ([\d.e+-]+) ms, execute ([\d.e+-]+) ms, "
                    r"outputs ([\d.e+-]+) ms")
MODEL = re.compile(r"^step (\d+): .*, ([\d.e+-]+) ms(, failed)?$")


def stamp_us(m):
    h, mi, s, us = (int(m.group(i)) for i in range(2, 6))
    return ((h * 60 + mi) * 60 + s) * 1_000_000 + us


SOURCE = re.compile(r"^\[(scheduler|worker \d+)\] ")


def read(path, pattern, source=None):
    """(end time in us, match) for each line of `path` that `pattern` finds; with `source`
    ("scheduler", "worker 0"), only llm-cluster's lines of that child."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            src = SOURCE.match(line)
            if source is not None:
                if not src or src.group(1) != source:
                    continue
            if src:
                line = line[src.end():]
            m = PREFIX.match(line)
            if not m:
                continue
            found = pattern.search(m.group(6))
            if found:
                out.append((stamp_us(m), found))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster-log")
    ap.add_argument("--scheduler")
    ap.add_argument("--worker", action="append", default=[])
    ap.add_argument("--trace")
    ap.add_argument("--from-step", type=int, default=0)
    ap.add_argument("--to-step", type=int, default=1 << 62, help="last step counted")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="workers in --cluster-log (1)")
    a = ap.parse_args()
    if a.cluster_log:
        sources = [(a.cluster_log, f"worker {r}") for r in range(a.tensor_parallel_size)]
        sched = (a.cluster_log, "scheduler")
    elif a.scheduler:
        sources = [(w, None) for w in a.worker]
        sched = (a.scheduler, None)
    else:
        ap.error("give --cluster-log, or --scheduler and --worker")
    events = []
    engine = read(sched[0], ENGINE, sched[1])
    for end, m in engine:
        step = int(m.group(1))
        sched, execute, outputs = (float(m.group(i)) * 1000 for i in (2, 3, 4))
        t = end - outputs
        events += [
            {"name": f"outputs {step}", "ph": "X", "pid": 0, "tid": 0, "ts": t, "dur": outputs},
            {"name": f"execute {step}", "ph": "X", "pid": 0, "tid": 1, "ts": t - execute,
             "dur": execute},
            {"name": f"schedule {step}", "ph": "X", "pid": 0, "tid": 2,
             "ts": t - execute - sched, "dur": sched},
        ]
    print(f"scheduler: {len(engine)} engine steps")
    for rank, (path, source) in enumerate(sources):
        spans = []
        for end, m in read(path, MODEL, source):
            step, ms = int(m.group(1)), float(m.group(2))
            spans.append((step, end - ms * 1000, end))
            events.append({"name": f"step {step}", "ph": "X", "pid": 1 + rank, "tid": 0,
                           "ts": end - ms * 1000, "dur": ms * 1000})
        spans = [s for s in spans if a.from_step <= s[0] <= a.to_step]
        steps = [(e - b) / 1000 for _, b, e in spans]
        gaps = [(spans[i + 1][1] - spans[i][2]) / 1000 for i in range(len(spans) - 1)
                if spans[i + 1][0] == spans[i][0] + 1]
        if steps and gaps:
            print(f"worker {rank}: {len(steps)} model steps, median {statistics.median(steps):.2f}"
                  f" ms; gap to the next step median {statistics.median(gaps):.3f} ms"
                  f" (p90 {sorted(gaps)[int(0.9 * (len(gaps) - 1))]:.3f} ms)")
        else:
            print(f"worker {rank}: no model steps from step {a.from_step} on", file=sys.stderr)
    if a.trace:
        meta = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "llm-scheduler"}}]
        meta += [{"name": "process_name", "ph": "M", "pid": 1 + r,
                  "args": {"name": f"llm-worker rank {r}"}} for r in range(len(a.worker))]
        meta += [{"name": "thread_name", "ph": "M", "pid": 0, "tid": t, "args": {"name": n}}
                 for t, n in ((0, "outputs"), (1, "execute (submit to result)"),
                              (2, "schedule"))]
        with open(a.trace, "w") as f:
            json.dump({"traceEvents": meta + events, "displayTimeUnit": "ms"}, f)
        print(f"wrote {a.trace} ({len(events)} spans)")


if __name__ == "__main__":
    main()
