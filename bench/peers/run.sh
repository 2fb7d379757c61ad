#!/usr/bin/env bash
# bench/peers/run.sh SCRATCH OUR_MODEL [options]: the side-by-side of issue 18 (not run by CI).
# Runs the workload (64 requests, prompts of uniform 64-512 random token ids, 128 output tokens,
# greedy, ignore_eos, closed loop at concurrency 1, 8 and 32) against each system in turn, one
# server at a time, and prints one table (output tokens/s per concurrency; TTFT p50 and TPOT
# p50 at the lowest concurrency). SCRATCH is what bench/peers/setup.sh installed. OUR_MODEL is
# what our llm-scheduler serves: the HF directory vLLM gets (SCRATCH/model/hf) or a GGUF file.
#
#   bench/peers/run.sh /tmp/peers /tmp/peers/model/hf [--num-requests 64] [--output-len 128]
#       [--concurrency "1 8 32"] [--systems "ours-bf16 ours-fp32 vllm-fp32 vllm-bf16
#       llamacpp-f32 llamacpp-bf16 llamacpp-q4_1"] [--build build] [--threads 2] [--rounds R]
#
# --rounds R (interleaved): every system's server is started first and stays up; then, R times,
# each concurrency is measured on each system in turn (the order rotating by one system per
# round), so that the systems compared at one concurrency ran within a few minutes of each
# other. Why: this VM's memory bandwidth and CPU time drift by 10-20% over minutes, and one
# server after the other (the default) puts minutes between the systems of one comparison (our
# c=1 TPOT 6.5, 6.6 and 7.8 ms in three runs of one binary within half an hour). The idle
# servers wait on their sockets (the whole machine's idle time is logged before the rounds).
# The table gives each cell's median over the rounds and, per concurrency, ours against the
# best peer in each round.
#
# Load generator: bench/peers/loadgen.py for every system (OpenAI /v1/completions, streaming,
# the same prompts, output tokens from the server's usage), ours through its OpenAI-compatible
# HTTP API.
# Server settings: vLLM with VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1
# VLLM_USE_AOT_COMPILE=0; llama-server -np 32 -c 32768 -cb -t 2 with "cache_prompt": false;
# ours through llm-cluster, TP=1, bf16 (auto: AVX512_BF16) or fp32, --threads worker threads,
# asynchronous scheduling (the default; ours-fp32-sync and ours-bf16-sync: without it), the
# KV cache the model's dtype (ours-fp32-bf16kv: f32 weights and activations, a bf16 cache, the
# bytes of llama-server's default f16 cache),
# prefix caching off, chunked prefill on with 512 tokens per step (ours-bf16-whole: whole
# prompts, 2048 tokens per step, the scheduler's defaults; with the workload's closed loop they
# keep whole waves of requests in lockstep: at concurrency 8, 6-7 prompts arrive together, share
# one prefill step of about a second and finish in the same step, so TTFT p50 was 988 ms against
# 325 ms at 512 tokens per step for the same output tokens/s).
set -euo pipefail
S=${1:?usage: run.sh SCRATCH OUR_MODEL [options]}
OUR_MODEL=${2:?usage: run.sh SCRATCH OUR_MODEL [options]}
shift 2
S=$(cd "$S" && pwd)
OUR_MODEL=$(realpath "$OUR_MODEL")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
NUM=64 OUT=128 CONC="1 8 32" BUILD=$REPO/build THREADS=2 ROUNDS=0
SYSTEMS="ours-bf16 ours-fp32 vllm-fp32 vllm-bf16 llamacpp-f32 llamacpp-bf16 llamacpp-q4_1"
while [[ $# -gt 0 ]]; do
  case $1 in
    --num-requests) NUM=$2 ;;
    --output-len) OUT=$2 ;;
    --concurrency) CONC=$2 ;;
    --systems) SYSTEMS=$2 ;;
    --build) BUILD=$(cd "$2" && pwd) ;;
    --threads) THREADS=$2 ;;
    --rounds) ROUNDS=$2 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
VPY=$S/venv/bin/python
LOGS=$S/logs
RESULTS=$S/results.jsonl
mkdir -p "$LOGS"
: >"$RESULTS"
VOCAB=$("$VPY" -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" \
  "$S/model/hf/config.json")
log() { echo "[peers $(date -u +%H:%M:%S)] $*" >&2; }

# Resident memory (KiB) of a server: the largest process of its tree (our llm-worker, the
# llama-server or vLLM's engine core) and the whole tree (ours: llm-cluster, llm-scheduler and
# the worker).
rss_kib() {  # PID -> "LARGEST TOTAL"
  local pids=$1 frontier=$1 next p
  while [[ -n $frontier ]]; do
    next=
    for p in $frontier; do next+=" $(pgrep -P "$p" | tr '\n' ' ')"; done
    frontier=$(echo $next)
    pids+=" $frontier"
  done
  ps -o rss= -p "$(echo $pids | tr ' ' ',')" | awk '{t += $1; if ($1 > m) m = $1} END {print m, t}'
}

# The servers up, by system: their pid, the loadgen's --server flavour and base URL.
declare -A PID KIND URL
SERVER_PID=  # the one being started
stop_server() {  # SYSTEM
  local pid=${PID[$1]:-}
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  unset "PID[$1]"
}
stop_all() {
  local sys
  for sys in "${!PID[@]}"; do stop_server "$sys"; done
}
trap stop_all EXIT

free_port() { "$VPY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

wait_http() {  # URL PATH TIMEOUT_S
  for _ in $(seq "$3"); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then return 1; fi
    if curl -sf "$1$2" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  return 1
}

record() {  # SYSTEM CONCURRENCY ROUND JSON "RSS_LARGEST_KIB RSS_TOTAL_KIB"
  "$VPY" -c "import json,sys; d=json.loads(sys.argv[4]); m=sys.argv[5].split(); d.update(system=sys.argv[1], c=int(sys.argv[2]), round=int(sys.argv[3]), rss_largest_kib=int(m[0]) if m else None, rss_total_kib=int(m[1]) if len(m) > 1 else None); print(json.dumps(d))" \
    "$1" "$2" "$3" "$4" "${5:-}" >>"$RESULTS"
}

# The workload against a server that is up. Its prompts (loadgen's --seed) are the same for
# every system at one concurrency and round, and differ from one concurrency or round to the
# next: a server never sees a prompt twice, so that no prefix cache (vLLM's is on by default)
# turns a later measurement's prefills into cache hits. (Before, every concurrency sent the
# same 64 prompts: vLLM's c=8 and c=32 figures up to commit 10f4f3a had most of their prefill
# served from its prefix cache.)
load() {  # SYSTEM CONCURRENCY ROUND
  log "$1: concurrency $2${3:+ (round $3)}"
  local line
  if line=$("$VPY" "$REPO/bench/peers/loadgen.py" --url "${URL[$1]}" --server "${KIND[$1]}" \
    --model smollm2 --num-requests "$NUM" --concurrency "$2" --output-len "$OUT" \
    --vocab "$VOCAB" --seed "$((1000 * ${3:-0} + $2))" 2>>"$LOGS/$1.loadgen.log"); then
    record "$1" "$2" "${3:-0}" "$line" "$(rss_kib "${PID[$1]}")"
  else
    log "$1: concurrency $2 failed (see $LOGS/$1.loadgen.log)"
  fi
}

up() {  # SYSTEM KIND URL: the server SERVER_PID answers
  PID[$1]=$SERVER_PID
  KIND[$1]=$2
  URL[$1]=$3
  SERVER_PID=
}

not_up() {  # SYSTEM WHAT: the server SERVER_PID did not come up; stop what is left of it
  log "$1: $2 did not come up (see $LOGS/$1.server.log)"
  PID[$1]=$SERVER_PID
  SERVER_PID=
  stop_server "$1"
}

start_vllm() {  # SYSTEM DTYPE
  local port; port=$(free_port)
  log "$1: vllm serve ($2) on $port"
  VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_USE_AOT_COMPILE=0 \
    "$S/venv/bin/vllm" serve "$S/model/hf" --served-model-name smollm2 --dtype "$2" \
    --host 127.0.0.1 --port "$port" --max-model-len 2048 >"$LOGS/$1.server.log" 2>&1 &
  SERVER_PID=$!
  if wait_http "http://127.0.0.1:$port" /health 900; then
    up "$1" vllm "http://127.0.0.1:$port"
  else
    not_up "$1" "the server"
  fi
}

start_llamacpp() {  # SYSTEM GGUF
  local port; port=$(free_port)
  log "$1: llama-server $(basename "$2") on $port"
  "$S/llama.cpp/build/bin/llama-server" -m "$2" --alias smollm2 --host 127.0.0.1 --port "$port" \
    -np 32 -c 32768 -cb -t 2 >"$LOGS/$1.server.log" 2>&1 &
  SERVER_PID=$!
  if wait_http "http://127.0.0.1:$port" /health 300; then
    up "$1" llamacpp "http://127.0.0.1:$port"
  else
    not_up "$1" "the server"
  fi
}

start_ours() {  # SYSTEM DTYPE CHUNKED_PREFILL(true|false) MAX_NUM_BATCHED_TOKENS [ASYNC_SCHEDULING]
  # [KV_CACHE_DTYPE]
  local manifest=$S/$1.yaml portfile=$S/$1.port httpfile=$S/$1.http.port
  cat >"$manifest" <<YAML
model: $OUR_MODEL
tensor_parallel_size: 1
device: cpu
scheduler: {host: 127.0.0.1, port: 0}
workers: {host: 127.0.0.1, base_port: 0}
restart_workers: false
startup_timeout_s: 600
engine:
  served_model_name: smollm2
  dtype: $2
  kv_cache_dtype: ${6:-auto}
  block_size: 16
  max_num_seqs: 64
  max_model_len: 2048
  cpu_kv_cache_space: 4   # GiB, as VLLM_CPU_KVCACHE_SPACE
  enable_prefix_caching: false
  enable_chunked_prefill: $3
  max_num_batched_tokens: $4
  async_scheduling: ${5:-true}
  http_port: 0
  http_port_file: $httpfile
worker: {threads: $THREADS}
YAML
  rm -f "$portfile" "$httpfile"
  log "$1: llm-cluster ($OUR_MODEL, $2)"
  "$BUILD/bin/llm-cluster" --manifest="$manifest" --port-file="$portfile" \
    >"$LOGS/$1.server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    [[ -s $portfile && -s $httpfile ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 1
  done
  if [[ ! -s $portfile || ! -s $httpfile ]]; then
    not_up "$1" "the cluster"
    return
  fi
  # The same client as the peers': our OpenAI-compatible /v1/completions, the server's usage.
  up "$1" vllm "http://127.0.0.1:$(cat "$httpfile")"
}

start() {  # SYSTEM
  case $1 in
    ours | ours-bf16) start_ours "$1" auto true 512 ;;
    ours-fp32) start_ours "$1" float32 true 512 ;;
    ours-fp32-bf16kv) start_ours "$1" float32 true 512 true bfloat16 ;;
    ours-fp32-sync) start_ours "$1" float32 true 512 false ;;
    ours-bf16-sync) start_ours "$1" auto true 512 false ;;
    ours-bf16-whole) start_ours "$1" auto false 2048 ;;
    vllm-fp32) start_vllm "$1" float32 ;;
    vllm-bf16) start_vllm "$1" bfloat16 ;;
    llamacpp-f32) start_llamacpp "$1" "$S/model/smollm2.f32.gguf" ;;
    llamacpp-bf16) start_llamacpp "$1" "$S/model/smollm2.bf16.gguf" ;;
    llamacpp-*) start_llamacpp "$1" "$S/model/smollm2.${1#llamacpp-}.gguf" ;;
    *) log "unknown system $1" ;;
  esac
}

if ((ROUNDS == 0)); then
  # One server at a time.
  for sys in $SYSTEMS; do
    start "$sys"
    [[ -n ${PID[$sys]:-} ]] || continue
    for c in $CONC; do load "$sys" "$c"; done
    stop_server "$sys"
  done
else
  read -r -a order <<<"$SYSTEMS"
  for sys in "${order[@]}"; do start "$sys"; done
  # What the idle servers take: the machine's idle share over 10 s with every server up.
  read -r _ u1 n1 s1 i1 _ </proc/stat
  sleep 10
  read -r _ u2 n2 s2 i2 _ </proc/stat
  log "all servers up; machine idle over 10 s: $(((i2 - i1) * 100 / (u2 + n2 + s2 + i2 - u1 - n1 - s1 - i1)))%"
  for ((r = 1; r <= ROUNDS; r++)); do
    for c in $CONC; do
      for ((j = 0; j < ${#order[@]}; j++)); do
        sys=${order[$(((j + r - 1) % ${#order[@]}))]}
        [[ -n ${PID[$sys]:-} ]] && load "$sys" "$c" "$r"
      done
    done
  done
  stop_all
fi

"$VPY" - "$RESULTS" "$SYSTEMS" "$CONC" "$NUM" "$OUT" <<'PYEOF'
import json, sys
import statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
systems, conc = sys.argv[2].split(), [int(c) for c in sys.argv[3].split()]
rounds = sorted({r["round"] for r in rows})
by = {}
for r in rows:
    by.setdefault((r["system"], r["c"]), []).append(r)
lo = min(conc)
def med(s, c, key):
    rs = by.get((s, c))
    return statistics.median(r[key] for r in rs) if rs else None
print(f"\n{sys.argv[4]} requests, prompts uniform 64-512 random ids, {sys.argv[5]} output tokens,"
      " greedy, ignore_eos, closed loop. Output tokens/s"
      + (f" (median of {len(rounds)} interleaved rounds)" if rounds != [0] else "") + ":\n")
head = ["System"] + [f"c={c}" for c in conc] + [f"TTFT p50, c={c}" for c in conc] + \
    [f"TPOT p50, c={lo}", "RSS after a load, largest process (whole server)"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for s in systems:
    tok = [med(s, c, "output_tok_s") for c in conc]
    ttft = [med(s, c, "ttft_p50_ms") for c in conc]
    tpot = med(s, lo, "tpot_p50_ms")
    cells = [s] + [f"{v:.1f}" if v is not None else "—" for v in tok]
    cells += [f"{v:.0f} ms" if v is not None else "—" for v in ttft]
    cells += [f"{tpot:.1f} ms" if tpot is not None else "—"]
    mem = [(r["rss_largest_kib"], r["rss_total_kib"]) for c in conc for r in by.get((s, c), [])
           if r.get("rss_largest_kib")]
    cells += [f"{max(m[0] for m in mem) / 1024:.0f} ({max(m[1] for m in mem) / 1024:.0f}) MiB"
              if mem else "—"]
    print("| " + " | ".join(cells) + " |")
# Ours against the best peer of the same round (the same run without --rounds).
ours = [s for s in systems if s.startswith("ours")]
peers = [s for s in systems if not s.startswith("ours")]
if ours and peers:
    print()
    for s in ours:
        for c in conc:
            parts = []
            for rnd in rounds:
                mine = [r for r in by.get((s, c), []) if r["round"] == rnd]
                theirs = [(r["output_tok_s"], r["ttft_p50_ms"], p) for p in peers
                          for r in by.get((p, c), []) if r["round"] == rnd]
                if not mine or not theirs:
                    continue
                best = max(theirs)
                parts.append(f"{mine[0]['output_tok_s'] / best[0]:.2f}x {best[2]}, TTFT "
                             f"{mine[0]['ttft_p50_ms']:.0f} vs {min(t[1] for t in theirs):.0f} ms")
            if parts:
                label = "per round" if rounds != [0] else "against the best peer"
                print(f"{s} c={c}, {label}: " + "; ".join(parts))
PYEOF
