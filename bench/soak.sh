#!/usr/bin/env bash
# Soak: saturation load with random client cancels and deadlines against a local cluster, for
# --duration seconds (600 by default), sampling the RSS of llm-scheduler and every llm-worker
# every 10 s. A bench, not a CI test. Passes (exit 0) when:
#   - llm-loadgen reports no failure other than the requests it cancelled or whose deadline
#     passed (it exits 1 otherwise);
#   - at the end, once idle, every device KV block is free (GetStats num_free_gpu_blocks equals
#     GetModelInfo num_gpu_blocks) and nothing runs, waits or is swapped;
#   - no process's RSS grew by more than --max-rss-growth-mib between the first sample after
#     the warm-up (--warmup seconds) and the last one.
#
#   bench/soak.sh [--duration=600] [--concurrency=48] [--manifest=bench/soak.yaml]
#                 [--cancel-fraction=0.1] [--deadline-fraction=0.1] [--deadline-ms=3000]
#                 [--warmup=60] [--max-rss-growth-mib=64] [--out=DIR]
# Run from the repository root after `ninja -C build llm-cluster llm-loadgen llm-client`.
# The RSS samples go to DIR/rss.csv (seconds,pid,name,rss_kib), the load generator's report to
# DIR/loadgen.txt, the cluster's log to DIR/cluster.log.
set -u -o pipefail

duration=600
concurrency=48
manifest=bench/soak.yaml
cancel_fraction=0.1
deadline_fraction=0.1
deadline_ms=3000
warmup=60
max_growth_mib=64
out=""
for arg in "$@"; do
  case "$arg" in
    --duration=*) duration="${arg#*=}" ;;
    --concurrency=*) concurrency="${arg#*=}" ;;
    --manifest=*) manifest="${arg#*=}" ;;
    --cancel-fraction=*) cancel_fraction="${arg#*=}" ;;
    --deadline-fraction=*) deadline_fraction="${arg#*=}" ;;
    --deadline-ms=*) deadline_ms="${arg#*=}" ;;
    --warmup=*) warmup="${arg#*=}" ;;
    --max-rss-growth-mib=*) max_growth_mib="${arg#*=}" ;;
    --out=*) out="${arg#*=}" ;;
    *)
      sed -n '2,19p' "$0" >&2
      exit 2
      ;;
  esac
done
bin=build/bin
loadgen_bin=build/bench/llm-loadgen
for b in "$bin/llm-cluster" "$bin/llm-client" "$loadgen_bin"; do
  [[ -x "$b" ]] || { echo "soak: $b is missing (ninja -C build ${b##*/})" >&2; exit 2; }
done
[[ -n "$out" ]] || out=$(mktemp -d /tmp/llm-soak.XXXXXX)
mkdir -p "$out"
echo "soak: ${duration}s, $concurrency clients, manifest $manifest; output in $out"

"$bin/llm-cluster" --manifest="$manifest" --scheduler-port=0 --worker-base-port=0 \
  --port-file="$out/port" >"$out/cluster.log" 2>&1 &
cluster=$!
cleanup() {
  kill -TERM "$cluster" 2>/dev/null
  wait "$cluster" 2>/dev/null
}
trap cleanup EXIT
for _ in $(seq 240); do
  [[ -s "$out/port" ]] && break
  kill -0 "$cluster" 2>/dev/null || { echo "soak: llm-cluster exited" >&2; tail "$out/cluster.log" >&2; exit 1; }
  sleep 0.5
done
[[ -s "$out/port" ]] || { echo "soak: the cluster did not start" >&2; exit 1; }
address="127.0.0.1:$(cat "$out/port")"

# The cluster's processes: llm-cluster's children.
children() { pgrep -P "$cluster"; }
sample() {  # seconds-since-start
  for pid in $(children); do
    local name rss
    name=$(cat "/proc/$pid/comm" 2>/dev/null) || continue
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || continue
    echo "$1,$pid,$name,$rss" >>"$out/rss.csv"
  done
}

echo "seconds,pid,name,rss_kib" >"$out/rss.csv"
start=$(date +%s)
sample 0
"$loadgen_bin" --address="$address" --duration="$duration" --concurrency="$concurrency" \
  --cancel-fraction="$cancel_fraction" --deadline-fraction="$deadline_fraction" \
  --deadline-ms="$deadline_ms" --seed=1 >"$out/loadgen.txt" 2>&1 &
loadgen=$!
while kill -0 "$loadgen" 2>/dev/null; do
  sleep 10
  sample $(($(date +%s) - start))
done
wait "$loadgen"
loadgen_rc=$?
cat "$out/loadgen.txt"

# Idle: every block back.
ok=1
for _ in $(seq 60); do
  "$bin/llm-client" --address="$address" stats >"$out/stats.txt" 2>&1
  grep -q "^requests: *0 running, 0 waiting, 0 swapped" "$out/stats.txt" && break
  sleep 1
done
"$bin/llm-client" --address="$address" info >"$out/info.txt" 2>&1
echo "--- llm-client stats at the end"
cat "$out/stats.txt"
total=$(awk '/^num_gpu_blocks:/ {print $2}' "$out/info.txt")
free=$(sed -n 's/^gpu kv usage:.*(\([0-9]*\) blocks free)/\1/p' "$out/stats.txt")
echo "device KV blocks: $free free of $total"
[[ -n "$total" && "$free" == "$total" ]] || { echo "soak: FAIL: blocks not all free" >&2; ok=0; }
grep -q "^requests: *0 running, 0 waiting, 0 swapped" "$out/stats.txt" ||
  { echo "soak: FAIL: requests left in the scheduler" >&2; ok=0; }
[[ $loadgen_rc -eq 0 ]] || { echo "soak: FAIL: llm-loadgen reported failures" >&2; ok=0; }

# RSS: per process, first sample at or after the warm-up, the last one, and the largest.
echo "--- RSS (MiB): after ${warmup}s warm-up -> end (max)"
if ! awk -F, -v warmup="$warmup" -v limit="$max_growth_mib" '
  NR > 1 && $1 >= warmup {
    key = $3 " " $2
    if (!(key in first)) first[key] = $4
    last[key] = $4
    if ($4 > max[key]) max[key] = $4
  }
  END {
    bad = 0
    for (k in first) {
      growth = (last[k] - first[k]) / 1024
      printf "  %-24s %8.1f -> %8.1f (max %8.1f), growth %+.1f\n", k, first[k] / 1024,
             last[k] / 1024, max[k] / 1024, growth
      if (growth > limit) bad = 1
    }
    exit bad
  }' "$out/rss.csv"; then
  echo "soak: FAIL: RSS grew by more than ${max_growth_mib} MiB after the warm-up" >&2
  ok=0
fi
[[ $ok -eq 1 ]] && echo "soak: PASS" || { echo "soak: FAIL"; exit 1; }
