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
#       llamacpp-f32 llamacpp-bf16 llamacpp-q4_1"] [--build build] [--threads 2]
#
# Load generator: bench/peers/loadgen.py for every system (OpenAI /v1/completions, streaming,
# the same prompts, output tokens from the server's usage), ours through its OpenAI-compatible
# HTTP API.
# Server settings: vLLM with VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1
# VLLM_USE_AOT_COMPILE=0; llama-server -np 32 -c 32768 -cb -t 2 with "cache_prompt": false;
# ours through llm-cluster, TP=1, bf16 (auto: AVX512_BF16) or fp32, --threads worker threads,
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
NUM=64 OUT=128 CONC="1 8 32" BUILD=$REPO/build THREADS=2
SYSTEMS="ours-bf16 ours-fp32 vllm-fp32 vllm-bf16 llamacpp-f32 llamacpp-bf16 llamacpp-q4_1"
while [[ $# -gt 0 ]]; do
  case $1 in
    --num-requests) NUM=$2 ;;
    --output-len) OUT=$2 ;;
    --concurrency) CONC=$2 ;;
    --systems) SYSTEMS=$2 ;;
    --build) BUILD=$(cd "$2" && pwd) ;;
    --threads) THREADS=$2 ;;
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

SERVER_PID=
stop_server() {
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=
}
trap stop_server EXIT

free_port() { "$VPY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }

wait_http() {  # URL PATH TIMEOUT_S
  for _ in $(seq "$3"); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then return 1; fi
    if curl -sf "$1$2" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  return 1
}

record() {  # SYSTEM CONCURRENCY JSON
  "$VPY" -c "import json,sys; d=json.loads(sys.argv[3]); d.update(system=sys.argv[1], c=int(sys.argv[2])); print(json.dumps(d))" \
    "$1" "$2" "$3" >>"$RESULTS"
}

run_openai() {  # SYSTEM SERVER(vllm|llamacpp) URL
  for c in $CONC; do
    log "$1: concurrency $c"
    local line
    if line=$("$VPY" "$REPO/bench/peers/loadgen.py" --url "$3" --server "$2" --model smollm2 \
      --num-requests "$NUM" --concurrency "$c" --output-len "$OUT" --vocab "$VOCAB" \
      2>>"$LOGS/$1.loadgen.log"); then
      record "$1" "$c" "$line"
    else
      log "$1: concurrency $c failed (see $LOGS/$1.loadgen.log)"
    fi
  done
}

run_vllm() {  # SYSTEM DTYPE
  local port; port=$(free_port)
  log "$1: vllm serve ($2) on $port"
  VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_USE_AOT_COMPILE=0 \
    "$S/venv/bin/vllm" serve "$S/model/hf" --served-model-name smollm2 --dtype "$2" \
    --host 127.0.0.1 --port "$port" --max-model-len 2048 >"$LOGS/$1.server.log" 2>&1 &
  SERVER_PID=$!
  if wait_http "http://127.0.0.1:$port" /health 900; then
    run_openai "$1" vllm "http://127.0.0.1:$port"
  else
    log "$1: the server did not come up (see $LOGS/$1.server.log)"
  fi
  stop_server
}

run_llamacpp() {  # SYSTEM GGUF
  local port; port=$(free_port)
  log "$1: llama-server $(basename "$2") on $port"
  "$S/llama.cpp/build/bin/llama-server" -m "$2" --alias smollm2 --host 127.0.0.1 --port "$port" \
    -np 32 -c 32768 -cb -t 2 >"$LOGS/$1.server.log" 2>&1 &
  SERVER_PID=$!
  if wait_http "http://127.0.0.1:$port" /health 300; then
    run_openai "$1" llamacpp "http://127.0.0.1:$port"
  else
    log "$1: the server did not come up (see $LOGS/$1.server.log)"
  fi
  stop_server
}

run_ours() {  # SYSTEM DTYPE CHUNKED_PREFILL(true|false) MAX_NUM_BATCHED_TOKENS
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
  block_size: 16
  max_num_seqs: 64
  max_model_len: 2048
  cpu_kv_cache_space: 4   # GiB, as VLLM_CPU_KVCACHE_SPACE
  enable_prefix_caching: false
  enable_chunked_prefill: $3
  max_num_batched_tokens: $4
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
    log "$1: the cluster did not come up (see $LOGS/$1.server.log)"
    stop_server
    return
  fi
  # The same client as the peers': our OpenAI-compatible /v1/completions, the server's usage.
  run_openai "$1" vllm "http://127.0.0.1:$(cat "$httpfile")"
  stop_server
}

for sys in $SYSTEMS; do
  case $sys in
    ours | ours-bf16) run_ours "$sys" auto true 512 ;;
    ours-fp32) run_ours "$sys" float32 true 512 ;;
    ours-bf16-whole) run_ours "$sys" auto false 2048 ;;
    vllm-fp32) run_vllm "$sys" float32 ;;
    vllm-bf16) run_vllm "$sys" bfloat16 ;;
    llamacpp-f32) run_llamacpp "$sys" "$S/model/smollm2.f32.gguf" ;;
    llamacpp-bf16) run_llamacpp "$sys" "$S/model/smollm2.bf16.gguf" ;;
    llamacpp-q4_1) run_llamacpp "$sys" "$S/model/smollm2.q4_1.gguf" ;;
    *) log "unknown system $sys" ;;
  esac
done

"$VPY" - "$RESULTS" "$SYSTEMS" "$CONC" "$NUM" "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
systems, conc = sys.argv[2].split(), [int(c) for c in sys.argv[3].split()]
by = {(r["system"], r["c"]): r for r in rows}
lo = min(conc)
print(f"\n{sys.argv[4]} requests, prompts uniform 64-512 random ids, {sys.argv[5]} output tokens,"
      " greedy, ignore_eos, closed loop. Output tokens/s:\n")
head = ["System"] + [f"c={c}" for c in conc] + [f"TTFT p50, c={lo}", f"TPOT p50, c={lo}"]
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for s in systems:
    cells = [s]
    for c in conc:
        r = by.get((s, c))
        cells.append(f"{r['output_tok_s']:.1f}" if r else "—")
    r = by.get((s, lo))
    cells += [f"{r['ttft_p50_ms']:.0f} ms", f"{r['tpot_p50_ms']:.1f} ms"] if r else ["—", "—"]
    print("| " + " | ".join(cells) + " |")
PYEOF
