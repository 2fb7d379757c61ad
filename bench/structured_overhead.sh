#!/usr/bin/env bash
# bench/structured_overhead.sh [ROUNDS] [BUILD]: what structured outputs cost served (issue 33),
# not run by CI. Serves SmolLM2 (deploy/local/tp1-smollm2.yaml, fetched as `make run` does) and
# runs llm-loadgen's workload (32 requests, concurrency 8, prompts of 8-96 random token ids, 64
# output tokens each, temperature 1, ignore_eos) ROUNDS times (default 3) each way, alternating:
# free text, then every request under a JSON schema no output of that length can complete (an
# array of at least 100 strings: 64 tokens cannot write them), so that every sampled token is
# masked. Prints output tokens/s per round and the constrained/free ratio of the medians, and
# the worker's own count of masked samples and mask time (llm-client stats).
set -euo pipefail
ROUNDS=${1:-3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "${2:-$REPO/build}" && pwd)
RUN=$(mktemp -d)
model=$("$REPO/tools/models/fetch_smollm2.sh" "$BUILD/models")
"$BUILD/bin/llm-cluster" --manifest="$REPO/deploy/local/tp1-smollm2.yaml" --model="$model" \
  --scheduler-port=0 --worker-base-port=0 --port-file="$RUN/port" > "$RUN/cluster.log" 2>&1 &
cluster=$!
trap 'kill -TERM $cluster 2>/dev/null || true; wait $cluster 2>/dev/null || true; rm -rf "$RUN"' EXIT
for _ in $(seq 1200); do
  [ -s "$RUN/port" ] && break
  kill -0 $cluster 2>/dev/null || { cat "$RUN/cluster.log"; exit 1; }
  sleep 0.1
done
addr=127.0.0.1:$(cat "$RUN/port")
schema='{"type": "array", "items": {"type": "string"}, "minItems": 100}'
load() {
  "$BUILD/bench/llm-loadgen" --address="$addr" --num-requests=32 --concurrency=8 \
    --max-prompt-len=96 --min-output-len=64 --max-output-len=64 --seed=1 "$@" |
    awk "/Output token throughput/ {print \$NF}"
}
load > /dev/null  # warm-up
free=() constrained=()
for r in $(seq "$ROUNDS"); do
  free+=("$(load)")
  constrained+=("$(load --json-schema="$schema")")
  echo "round $r: free ${free[-1]} tok/s, json schema ${constrained[-1]} tok/s"
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR + 1) / 2)]}'; }
f=$(median "${free[@]}") c=$(median "${constrained[@]}")
echo "median: free $f tok/s, json schema $c tok/s, ratio $(awk -v c="$c" -v f="$f" 'BEGIN {printf "%.3f", c / f}')"
"$BUILD/bin/llm-client" --address="$addr" stats | grep -E "structured|worker sampler"
