#!/usr/bin/env bash
# bench/memory/run.sh SCRATCH [options]: resident memory of our worker beside vLLM's CPU backend
# and llama-server, same model and KV budget, same run (issue 36; not run by CI). README.md here.
#
#   bench/memory/run.sh /tmp/peers [--models "smollm2-gguf smollm2-hf qwen2.5-0.5b llama-3.2-1b"]
#       [--kv-gib 2] [--systems "ours vllm llamacpp"] [--concurrency 8] [--num-requests 16]
#       [--min-prompt 256] [--max-prompt 512] [--output-len 64] [--vllm-dtype auto]
#       [--main /work/main]
#
# SCRATCH is what bench/peers/setup.sh installed (venv, llama.cpp, model/). One server at a
# time; every server is stopped at the end, on failure too. Per model and system: idle (up, one
# small request served, 5 s quiet), loaded (peak of 0.2 s samples during bench/peers/loadgen.py's
# closed loop) and after (5 s after the load) resident memory of the process tree, by process.
# The table goes to stdout, one JSON line per cell to SCRATCH/memory_results.jsonl, logs and the
# per-phase JSON to SCRATCH/memory/<run>/.
set -euo pipefail
S=${1:?usage: run.sh SCRATCH [options]}
shift
S=$(cd "$S" && pwd)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
MODELS="smollm2-gguf smollm2-hf qwen2.5-0.5b llama-3.2-1b"
SYSTEMS="ours vllm llamacpp"
KV_GIB=2 CONC=8 NUM=16 MINP=256 MAXP=512 OUT=64 MAIN=/work/main VLLM_DTYPE=auto
while [[ $# -gt 0 ]]; do
  case $1 in
    --models) MODELS=$2 ;;
    --systems) SYSTEMS=$2 ;;
    --kv-gib) KV_GIB=$2 ;;
    --concurrency) CONC=$2 ;;
    --num-requests) NUM=$2 ;;
    --min-prompt) MINP=$2 ;;
    --max-prompt) MAXP=$2 ;;
    --output-len) OUT=$2 ;;
    --vllm-dtype) VLLM_DTYPE=$2 ;;
    --main) MAIN=$(cd "$2" && pwd) ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
[[ $KV_GIB =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --kv-gib must be a whole number (VLLM_CPU_KVCACHE_SPACE is)" >&2; exit 2; }
VPY=$S/venv/bin/python
MEM=("$VPY" "$REPO/bench/memory/mem.py")
RUN=$S/memory/$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$RUN"
log() { echo "[memory $(date -u +%H:%M:%S)] $*" >&2; }
jget() { "$VPY" -c "import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print('' if v is None else v)" "$1" "$2"; }
T0=$(date +%s)

# Our binaries as they are now: /work/main/build is rebuilt underneath this run. llm-cluster
# starts llm-scheduler and llm-worker from its own directory (/proc/self/exe), the copy.
BIN=$RUN/ours-bin
if [[ " $SYSTEMS " == *" ours "* ]]; then
  cp -a "$MAIN/build/bin" "$BIN"
  for b in llm-cluster llm-scheduler llm-worker llm-client; do
    "$BIN/$b" --help >/dev/null 2>&1 || { log "$BIN/$b does not run (copied mid-build?)"; exit 1; }
  done
fi
COMMIT=$(git -C "$MAIN" rev-parse --short HEAD)
if [[ -n $(git -C "$MAIN" status --porcelain --untracked-files=no) ]]; then
  COMMIT="$COMMIT+uncommitted"
fi
BIN_TIME=$(date -u -r "$MAIN/build/bin/llm-worker" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo "?")
"${MEM[@]}" machine >"$RUN/machine.json"
FLAGS=$(jget "$RUN/machine.json" flags)
"${MEM[@]}" cell "$RUN/run.json" "machine=$(cat "$RUN/machine.json")" "commit=$COMMIT" \
  "bin_time=$BIN_TIME" "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" "kv_gib=$KV_GIB" \
  "load=c=$CONC, $NUM requests, prompts of uniform $MINP-$MAXP random ids, $OUT output tokens, greedy, ignore_eos" \
  "vllm_dtype=$VLLM_DTYPE" "models=$MODELS" "systems=$SYSTEMS" "run_dir=$RUN"
# Ours serves --dtype auto: bf16 GEMMs with AVX512_BF16 or AMX, else float32
# (docs/user-guide/serving-options.md).
if [[ $FLAGS == *avx512_bf16* || $FLAGS == *amx_bf16* ]]; then OURS_DTYPE=bfloat16; else OURS_DTYPE=float32; fi

# --- servers ----------------------------------------------------------------------------------
SERVER_PID= WATCH_PID=
stop_server() {
  if [[ -n $WATCH_PID ]]; then kill -TERM "$WATCH_PID" 2>/dev/null || true; wait "$WATCH_PID" 2>/dev/null || true; WATCH_PID=; fi
  [[ -n $SERVER_PID ]] || return 0
  local pids p
  # The tree first (vLLM's engine core, our workers), so that no child outlives its parent.
  pids=$("$VPY" -c "import sys; sys.path.insert(0, sys.argv[1]); import mem; print(' '.join(map(str, mem.tree(int(sys.argv[2])))))" \
    "$REPO/bench/memory" "$SERVER_PID" 2>/dev/null || echo "$SERVER_PID")
  kill -TERM "$SERVER_PID" 2>/dev/null || true
  for _ in $(seq 60); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
  for p in $pids; do kill -KILL "$p" 2>/dev/null || true; done
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap 'stop_server' EXIT
trap 'exit 130' INT TERM

free_port() { "$VPY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])"; }
wait_http() {  # URL TIMEOUT_S
  for _ in $(seq "$2"); do
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    curl -sf "$1" >/dev/null 2>&1 && return 0
    sleep 1
  done
  return 1
}

start_ours() {  # CELL MODEL_PATH -> URL
  local cell=$1 manifest=$1/cluster.yaml
  cat >"$manifest" <<YAML
model: $2
tensor_parallel_size: 1
device: cpu
scheduler: {host: 127.0.0.1, port: 0}
workers: {host: 127.0.0.1, base_port: 0}
restart_workers: false
startup_timeout_s: 600
engine:
  served_model_name: m
  dtype: auto
  block_size: 16
  max_num_seqs: 64
  max_model_len: 2048
  cpu_kv_cache_space: $KV_GIB   # GiB, as VLLM_CPU_KVCACHE_SPACE
  enable_prefix_caching: false
  enable_chunked_prefill: true
  max_num_batched_tokens: 512
  http_port: 0
  http_port_file: $cell/http.port
worker: {threads: 2}
YAML
  "$BIN/llm-cluster" --manifest="$manifest" --port-file="$cell/grpc.port" >"$cell/server.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 600); do
    [[ -s $cell/grpc.port && -s $cell/http.port ]] && break
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 1
  done
  [[ -s $cell/grpc.port && -s $cell/http.port ]] || return 1
  URL=http://127.0.0.1:$(cat "$cell/http.port")
}

start_vllm() {  # CELL MODEL_DIR -> URL
  local port; port=$(free_port)
  VLLM_CPU_KVCACHE_SPACE=$KV_GIB VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_USE_AOT_COMPILE=0 \
    "$S/venv/bin/vllm" serve "$2" --served-model-name m --dtype "$VLLM_DTYPE" --host 127.0.0.1 \
    --port "$port" --max-model-len 2048 --no-enable-prefix-caching >"$1/server.log" 2>&1 &
  SERVER_PID=$!
  URL=http://127.0.0.1:$port
  wait_http "$URL/health" 900
}

start_llamacpp() {  # CELL GGUF CTX -> URL
  local port; port=$(free_port)
  "$S/llama.cpp/build/bin/llama-server" -m "$2" --alias m --host 127.0.0.1 --port "$port" \
    -c "$3" -np 32 -cb -t 2 >"$1/server.log" 2>&1 &
  SERVER_PID=$!
  URL=http://127.0.0.1:$port
  wait_http "$URL/health" 300
}

loadgen() {  # KIND VOCAB OUTFILE NUM CONC MINP MAXP OUT SEED
  "$VPY" "$REPO/bench/peers/loadgen.py" --url "$URL" --server "$1" --model m --vocab "$2" \
    --num-requests "$4" --concurrency "$5" --min-prompt "$6" --max-prompt "$7" \
    --output-len "$8" --seed "$9" >"$3"
}

# --- models -----------------------------------------------------------------------------------
# Paths per model: what ours, vLLM and llama.cpp serve; the vocabulary of the prompts' ids.
ensure_random() {  # SHAPE -> SCRATCH/model/SHAPE (make_model.py, seed 0)
  local dir=$S/model/$1
  if [[ ! -f $dir/model.safetensors || ! -f $dir/tokenizer.json ]]; then
    log "$1: tools/gpu/make_model.py --seed 0 -> $dir"
    nice -n 10 "$VPY" "$REPO/tools/gpu/make_model.py" --shape "$1" --seed 0 --out "$dir" >&2
  fi
  echo "$dir"
}

ensure_gguf() {  # HF_DIR NAME -> SCRATCH/model/gguf/NAME.TYPE.gguf (llama.cpp's converter)
  local dtype type out
  dtype=$("$VPY" -c "import json,sys; c=json.load(open(sys.argv[1]+'/config.json')); print(c.get('dtype') or c.get('torch_dtype') or 'float32')" "$1")
  case $dtype in bfloat16) type=bf16 ;; float16) type=f16 ;; *) type=f32 ;; esac
  out=$S/model/gguf/$2.$type.gguf
  if [[ ! -f $out ]]; then
    mkdir -p "$S/model/gguf"
    log "$2: llama.cpp's convert_hf_to_gguf.py --outtype $type -> $out"
    if ! nice -n 10 "$VPY" "$REPO/bench/memory/hf_to_gguf.py" "$S/llama.cpp/src/convert_hf_to_gguf.py" \
      "$1" --outtype "$type" --outfile "$out.part" >"$S/model/gguf/$2.convert.log" 2>&1; then
      log "$2: the conversion failed (see $S/model/gguf/$2.convert.log)"
      rm -f "$out.part"
      return 1
    fi
    mv "$out.part" "$out"
  fi
  echo "$out"
}

# --- one cell ---------------------------------------------------------------------------------
measure() {  # MODEL SYSTEM PATH [CTX KV_BYTES]
  local model=$1 system=$2 path=$3 ctx=${4:-} kv_bytes=${5:-$((KV_GIB * 1073741824))}
  local cell=$RUN/$1.$2 kind=vllm ok=1
  mkdir -p "$cell"
  "${MEM[@]}" model-info "$path" >"$cell/info.json"
  local params; params=$(jget "$cell/info.json" params)
  log "$model / $system: $path"
  local t0; t0=$(date +%s)
  case $system in
    ours) start_ours "$cell" "$path" || ok=0 ;;
    vllm) start_vllm "$cell" "$path" || ok=0 ;;
    llamacpp) kind=llamacpp; start_llamacpp "$cell" "$path" "$ctx" || ok=0 ;;
  esac
  if ((ok == 0)); then
    log "$model / $system: the server did not come up (see $cell/server.log)"
    stop_server
    "${MEM[@]}" cell "$cell/cell.json" "model=$model" "system=$system" "path=$path" \
      "skipped=the server did not come up ($cell/server.log)"
    return
  fi
  local up_s=$(($(date +%s) - t0))
  # Idle: one small request served, then 5 s quiet.
  if ! loadgen "$kind" "$VOCAB" "$cell/first.json" 1 1 16 16 4 7 2>"$cell/loadgen.log"; then
    log "$model / $system: the first request failed (see $cell/loadgen.log)"
  fi
  sleep 5
  "${MEM[@]}" snapshot "$system" "$SERVER_PID" >"$cell/idle.json"
  # Loaded: the peak of 0.2 s samples during the closed loop.
  "${MEM[@]}" watch "$system" "$SERVER_PID" "$cell/loaded.json" --interval 0.2 &
  WATCH_PID=$!
  local load_ok=true
  if ! loadgen "$kind" "$VOCAB" "$cell/load.json" "$NUM" "$CONC" "$MINP" "$MAXP" "$OUT" 1 \
    2>>"$cell/loadgen.log"; then
    log "$model / $system: the load failed (see $cell/loadgen.log)"
    load_ok=false
  fi
  kill -TERM "$WATCH_PID" 2>/dev/null || true
  wait "$WATCH_PID" 2>/dev/null || true
  WATCH_PID=
  if [[ $system == ours ]]; then
    local addr=127.0.0.1:$(cat "$cell/grpc.port")
    "$BIN/llm-client" --address="$addr" --json=true stats >"$cell/stats.txt" 2>&1 || true
    "$BIN/llm-client" --address="$addr" stats >"$cell/stats.plain.txt" 2>&1 || true
  fi
  sleep 5
  "${MEM[@]}" snapshot "$system" "$SERVER_PID" >"$cell/after.json"
  stop_server
  # What each system served and its KV as its log states it.
  local dtype dtype_bytes weights wnote kvlog=""
  case $system in
    ours)
      dtype=$OURS_DTYPE
      kvlog=$(grep -m1 "worker group ready" "$cell/server.log" | sed 's/.*\] //' | cut -c1-200 || true) ;;
    vllm)
      dtype=$(grep -o -m1 -E "dtype=torch\.[a-z0-9]+" "$cell/server.log" | head -1 | sed 's/dtype=torch\.//' || true)
      kvlog=$(grep -m1 -E "KV cache size" "$cell/server.log" | sed 's/.*\] //' | cut -c1-200 || true) ;;
    llamacpp)
      dtype=$(jget "$cell/info.json" torch_dtype)
      kvlog=$(grep -m1 -E "n_ctx is not divisible|llama_kv_cache.*size =" "$cell/server.log" | cut -c1-200 || true) ;;
  esac
  case $dtype in float32) dtype_bytes=4 ;; bfloat16 | float16) dtype_bytes=2 ;; *) dtype_bytes=0 ;; esac
  if [[ $system == llamacpp ]]; then
    weights=$(jget "$cell/info.json" file_bytes); wnote="GGUF file bytes"
  else
    weights=$((params * dtype_bytes)); wnote="$params parameters x $dtype_bytes bytes ($dtype)"
  fi
  "${MEM[@]}" cell "$cell/cell.json" "model=$model" "system=$system" "path=$path" \
    "dtype=${dtype:-?}" "dtype_bytes=$dtype_bytes" "params=$params" "weight_bytes=$weights" \
    "weight_note=$wnote" "kv_bytes=$kv_bytes" "ctx=$ctx" "kv_log=$kvlog" \
    "up_s=$up_s" "load_ok=$load_ok" "info=$(cat "$cell/info.json")"
}

skip() {  # MODEL SYSTEM WHY
  mkdir -p "$RUN/$1.$2"
  log "$1 / $2: skipped: $3"
  "${MEM[@]}" cell "$RUN/$1.$2/cell.json" "model=$1" "system=$2" "skipped=$3"
}

for model in $MODELS; do
  case $model in
    smollm2-gguf)
      HF=$S/model/hf OURS=$S/model/smollm2.q4_1.gguf LLAMA=$S/model/smollm2.q4_1.gguf ;;
    smollm2-hf)
      HF=$S/model/hf OURS=$S/model/hf LLAMA= ;;
    qwen2.5-0.5b | llama-3.2-1b)
      HF=$(ensure_random "$model") OURS=$HF LLAMA= ;;
    *) log "unknown model $model"; continue ;;
  esac
  VOCAB=$(jget "$HF/config.json" vocab_size)
  for system in $SYSTEMS; do
    case $system in
      ours) measure "$model" ours "$OURS" ;;
      vllm) measure "$model" vllm "$HF" ;;
      llamacpp)
        if [[ ! -x $S/llama.cpp/build/bin/llama-server ]]; then
          skip "$model" llamacpp "no $S/llama.cpp/build/bin/llama-server (bench/peers/setup.sh)"
          continue
        fi
        if [[ -z $LLAMA ]] && ! LLAMA=$(ensure_gguf "$HF" "$model"); then
          skip "$model" llamacpp "convert_hf_to_gguf.py failed (see $S/model/gguf/$model.convert.log)"
          LLAMA=
          continue
        fi
        read -r ctx kv_bytes < <("${MEM[@]}" ctx "$LLAMA" "$KV_GIB" 32)
        measure "$model" llamacpp "$LLAMA" "$ctx" "$kv_bytes" ;;
      *) log "unknown system $system" ;;
    esac
  done
done

"${MEM[@]}" report "$RUN" "$S/memory_results.jsonl" | tee "$RUN/table.txt"
log "done in $(($(date +%s) - T0)) s: $RUN"
