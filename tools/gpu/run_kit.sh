#!/usr/bin/env bash
# The device kit's one command (docs/development/device-kit.md): on a GPU machine, from a kit
# that `make gpu-kit` packed on a CPU machine, it runs in order
#   env      the device, driver, toolkit, torch and library versions; every kit binary's shared
#            libraries resolved (ldd), else it stops at once;
#   tests    every test binary of the kit (the `gpu` label), a skipped test counted as a failure;
#   serve    a Llama model made here (tools/gpu/make_model.py: Llama-3.2-1B's shapes, seeded random
#            bf16 weights) served by llm-cluster with one cuda worker: the first step's top-20
#            logprobs of four prompts against transformers on the same GPU (check_logits.py),
#            llm-loadgen at concurrency 1, 16 and 64, and the workers' own counters (CUDA graph
#            replays, device sampling, cuBLASLt plans) from llm-client stats;
#   bench    bench_kernels_cuda (decode attention against a device-to-device copy, prefill
#            attention), torch's SDPA on the same prefill shapes (torch_attention_bench.py) and
#            bench_gpu_model (Llama-3-8B shapes, batch 1 to 256, eager and from CUDA graphs);
#   sanitize compute-sanitizer memcheck, racecheck and synccheck on small filters of the
#            attention, sampling, cache-copy and cp.async tests, each run in the time left
#            (last: the slowest part, which gives no figures);
# and writes OUT/summary.json, OUT/summary.txt (a short table), OUT/kit.log (everything) and
# OUT/details.tar.gz (every phase's own files). Exit 0 only when every phase passed.
#
#   tools/gpu/run_kit.sh --kit build-gpu-kit/llm-gpu-kit.tar.xz --out "$OUT"
#
# --emu rehearses the same script on a CPU machine (`make test`, ctest gpu_kit_rehearsal): a kit
# packed with `pack_kit.sh --emu` (llm-worker-emu and the cuda-emu test twins), tiny shapes, no
# sanitizer, numpy as the logits reference, concurrency 1, 2 and 4.
#
# Options: --kit FILE (a packed kit) or --kit-dir DIR (an unpacked one); --out DIR; --emu;
# --python PY (python3); --tests "NAME ..." (only these test binaries); --phases "env tests ..."
# (only these phases; env always runs); --deadline-s N (450: a phase, or a sanitizer run, that
# would start after it is left out and recorded as such, which fails the kit).
set -u -o pipefail

KIT="" KIT_DIR="" OUT="" EMU=0 PY=python3 ONLY_TESTS="" PHASES="env tests sanitize serve bench"
DEADLINE_S=450
while [ $# -gt 0 ]; do
  case "$1" in
    --kit) KIT=$2; shift 2 ;;
    --kit-dir) KIT_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --emu) EMU=1; shift ;;
    --python) PY=$2; shift 2 ;;
    --tests) ONLY_TESTS=$2; shift 2 ;;
    --phases) PHASES=$2; shift 2 ;;
    --deadline-s) DEADLINE_S=$2; shift 2 ;;
    *) echo "run_kit.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$OUT" ] || { echo "run_kit.sh: --out DIR is required" >&2; exit 2; }
[ -n "$KIT$KIT_DIR" ] || { echo "run_kit.sh: --kit FILE or --kit-dir DIR is required" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d "${TMPDIR:-/tmp}/llm-kit.XXXXXX")  # every phase's files; packed into details
START=$(date +%s)
exec > >(tee "$OUT/kit.log") 2>&1

CLUSTER_PID=""
cleanup() {
  if [ -n "$CLUSTER_PID" ] && kill -0 "$CLUSTER_PID" 2>/dev/null; then
    kill -TERM "$CLUSTER_PID" 2>/dev/null
    wait "$CLUSTER_PID" 2>/dev/null
  fi
}
trap cleanup EXIT

log() { echo "== [$(($(date +%s) - START)) s] $*"; }
# phase NAME STATUS DETAIL: one line of W/phases.tsv, which the summary reads.
phase() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$W/phases.tsv"; }
wants() { case " $PHASES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
time_left() { echo $((DEADLINE_S - ($(date +%s) - START))); }
# in_time NAME: false (and the phase recorded as skipped) when the deadline has passed.
in_time() {
  if [ "$(time_left)" -le 0 ]; then
    phase "$1" skipped "the kit's deadline (${DEADLINE_S} s) passed before it"
    return 1
  fi
}

finish() {
  cleanup
  log "summary"
  "$PY" "$HERE/kit_summary.py" --work "$W" --out "$OUT" --mode "$MODE"
  local rc=$?
  tar -C "$W" -czf "$OUT/details.tar.gz" . 2>/dev/null
  rm -rf "$W"
  # kit.log's tee ends once the script's output is closed: wait for it before exiting.
  exec > /dev/null 2>&1
  wait
  exit $rc
}

MODE=cuda
[ $EMU = 1 ] && MODE=emu
log "run_kit.sh: mode $MODE, out $OUT"
: > "$W/phases.tsv"

# ---- the kit
if [ -z "$KIT_DIR" ]; then
  KIT_DIR="$W/kit"
  mkdir -p "$KIT_DIR"
  if ! tar -C "$KIT_DIR" -xf "$KIT"; then
    phase env failed "cannot unpack $KIT"
    finish
  fi
fi
KIT_DIR=$(cd "$KIT_DIR" && pwd)
cp "$KIT_DIR/MANIFEST.json" "$W/kit_manifest.json" 2>/dev/null

# ---- env: the libraries the kit leaves to the machine (cuBLAS, cuBLASLt, NCCL, the CUDA
# runtime) from the CUDA toolkit or the torch venv's nvidia-* wheels, first found first.
LIBPATH="$KIT_DIR/lib"
CUBLAS_MISSING=""
if [ $EMU = 0 ]; then
  # The folders of the nvidia-* wheels (nvidia is a namespace package) that hold libraries.
  NVIDIA_LIB_DIRS=$("$PY" - 2>/dev/null <<'EOF'
import os
import nvidia
for root in nvidia.__path__:
    for d, _, files in os.walk(root):
        if any(f.startswith("lib") and ".so" in f for f in files):
            print(d)
EOF
)
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    found=""
    for dir in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 $NVIDIA_LIB_DIRS; do
      if [ -e "$dir/$lib" ]; then found=$dir; break; fi
    done
    if [ -n "$found" ]; then
      echo "$lib: $found"
      case ":$LIBPATH:" in *":$found:"*) ;; *) LIBPATH="$LIBPATH:$found" ;; esac
    else
      echo "$lib: not found in the toolkit or the torch venv"
      # cuBLAS and cuBLASLt are dlopen'ed at their first call: ldd below cannot see them.
      case $lib in libcublas*) CUBLAS_MISSING="$CUBLAS_MISSING $lib" ;; esac
    fi
  done
fi
export LD_LIBRARY_PATH="$LIBPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LLM_TEST_DATA_DIR="$REPO/tests/data"
export LLM_POISON_KV_CACHE=1  # as ctest: every KV cache the tests make is poisoned
log "env"
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm)"
  if [ $EMU = 0 ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
      --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    nvcc --version 2>&1 | tail -1 | sed 's/^/nvcc: /'
    "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda", torch.version.cuda)' 2>&1
    ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libcublas.so.* 2>/dev/null | head -3 | sed 's/^/lib: /'
  else
    echo "gpu: none (the CUDA emulation)"
  fi
  "$PY" --version 2>&1 | sed 's/^/python: /'
  echo "kit: $(cat "$KIT_DIR/MANIFEST.json" 2>/dev/null | tr -d '\n' | cut -c1-300)"
} | tee "$W/env.txt"
missing=""
for b in "$KIT_DIR"/bin/* "$KIT_DIR"/tests/* "$KIT_DIR"/bench/*; do
  [ -f "$b" ] && [ -x "$b" ] || continue
  nf=$(ldd "$b" 2>&1 | grep "not found" | awk '{print $1}' | sort -u | tr '\n' ' ')
  [ -n "$nf" ] && missing="$missing$(basename "$b"): $nf; "
done
[ -n "${CUBLAS_MISSING:-}" ] && missing="$missing(dlopen'ed):$CUBLAS_MISSING; "
if [ -n "$missing" ]; then
  echo "missing libraries: $missing"
  phase env failed "missing libraries: $missing"
  finish
fi
if [ $EMU = 0 ] && ! nvidia-smi > /dev/null 2>&1; then
  phase env failed "nvidia-smi fails: no usable GPU"
  finish
fi
phase env ok "every kit binary's libraries resolve"

# ---- tests
if wants tests && in_time tests; then
  log "tests"
  mkdir -p "$W/tests"
  failed=0 ran=0
  for t in "$KIT_DIR"/tests/*; do
    name=$(basename "$t")
    if [ -n "$ONLY_TESTS" ]; then
      case " $ONLY_TESTS " in *" $name "*) ;; *) continue ;; esac
    fi
    ran=$((ran + 1))
    left=$(time_left)
    limit=$(( left < 180 ? (left < 20 ? 20 : left) : 180 ))
    log "test $name (limit ${limit} s)"
    timeout "$limit" "$t" --gtest_output="json:$W/tests/$name.json" > "$W/tests/$name.log" 2>&1
    rc=$?
    echo "$name exit $rc" >> "$W/tests/exit_codes.txt"
    tail -3 "$W/tests/$name.log"
    [ $rc = 0 ] || failed=$((failed + 1))
  done
  # The summary recounts from the JSON: skips are failures there.
  if [ $ran = 0 ]; then
    phase tests failed "no test binary ran"
  else
    phase tests counted "$ran binaries, $failed exited non-zero"
  fi
fi

# ---- serve
if wants serve && in_time serve; then
  log "serve"
  S="$W/serve"
  mkdir -p "$S"
  if [ $EMU = 1 ]; then
    shape=tiny worker=llm-worker-emu loads="1:2 2:4 4:8" prompt_lens="5 17 40 90"
    max_model_len=512 max_seqs=8 batched=256 out_len=4 prompt_range="8 32"
    export LLM_CUDA_EMU_MEMORY_BYTES=$((256 << 20))
  else
    shape=llama-3.2-1b worker=llm-worker loads="1:16 16:64 64:128" prompt_lens="7 33 100 300"
    max_model_len=4096 max_seqs=256 batched=2048 out_len=128 prompt_range="128 512"
  fi
  serve_ok=1
  if ! "$PY" "$HERE/make_model.py" --shape "$shape" --seed 0 --out "$S/model"; then
    phase serve failed "make_model.py failed"
    serve_ok=0
  fi
  if [ $serve_ok = 1 ]; then
    cat > "$S/manifest.yaml" <<EOF
model: $S/model
tensor_parallel_size: 1
device: cuda
scheduler: {host: 127.0.0.1, port: 0}
workers: {host: 127.0.0.1, base_port: 0}
restart_workers: false
startup_timeout_s: 240
engine:
  dtype: bfloat16
  gpu_memory_utilization: 0.85
  block_size: 16
  max_num_seqs: $max_seqs
  max_num_batched_tokens: $batched
  max_model_len: $max_model_len
  enable_chunked_prefill: true
  enable_prefix_caching: false
  swap_space: 0.25
EOF
    "$KIT_DIR/bin/llm-cluster" --manifest="$S/manifest.yaml" --bin-dir="$KIT_DIR/bin" \
      --worker-binary="$worker" --scheduler-port=0 --worker-base-port=0 \
      --port-file="$S/port" > "$S/cluster.log" 2>&1 &
    CLUSTER_PID=$!
    for _ in $(seq 2400); do
      [ -s "$S/port" ] && break
      kill -0 "$CLUSTER_PID" 2>/dev/null || break
      sleep 0.1
    done
    if [ ! -s "$S/port" ]; then
      tail -30 "$S/cluster.log"
      phase serve failed "llm-cluster did not come up (serve/cluster.log)"
      serve_ok=0
    fi
  fi
  if [ $serve_ok = 1 ]; then
    addr=127.0.0.1:$(cat "$S/port")
    log "serving at $addr"
    # The first step of four prompts (random ids below the tokenizer's 3,000 plain tokens).
    served=""
    i=0
    for len in $prompt_lens; do
      ids=$("$PY" -c "import random; r = random.Random($len); print(','.join(str(r.randrange(3000)) for _ in range($len)))")
      f="$S/first_step_$i.jsonl"
      echo "{\"token_ids\": [$ids]}" > "$f.prompt"
      "$KIT_DIR/bin/llm-client" --address="$addr" generate --token-ids="$ids" --max-tokens=1 \
        --temperature=0 --logprobs=20 --add-special-tokens=false --json=true --timeout=120 > "$f" \
        2> "$f.err" || { cat "$f.err"; serve_ok=0; }
      served="$served $f"
      i=$((i + 1))
    done
    backend=transformers
    [ $EMU = 1 ] && backend=numpy
    if [ $serve_ok = 1 ]; then
      "$PY" "$HERE/check_logits.py" --model "$S/model" --served $served --backend $backend \
        --out "$S/logits.json" || serve_ok=0
    fi
    for load in $loads; do  # concurrency:requests
      c=${load%%:*} n=${load##*:}
      set -- $prompt_range
      log "llm-loadgen concurrency $c, $n requests"
      "$KIT_DIR/bin/llm-loadgen" --address="$addr" --num-requests=$n --concurrency=$c \
        --min-prompt-len=$1 --max-prompt-len=$2 --min-output-len=$out_len \
        --max-output-len=$out_len --temperature=0 --seed=$c > "$S/loadgen_c$c.txt" 2>&1 ||
        serve_ok=0
      grep -E "Output token throughput|P50 TTFT|P50 TPOT|Failed" "$S/loadgen_c$c.txt"
    done
    "$KIT_DIR/bin/llm-client" --address="$addr" stats > "$S/stats.txt" 2>&1 || serve_ok=0
    cat "$S/stats.txt"
    cleanup
    CLUSTER_PID=""
    if [ $serve_ok = 1 ]; then
      phase serve counted "served; the summary checks logits, loadgen and the worker's counters"
    else
      phase serve failed "a step of serving failed (serve/)"
    fi
  fi
fi

# ---- bench
if wants bench && in_time bench; then
  log "bench"
  B="$W/bench"
  mkdir -p "$B"
  bench_ok=1
  tiny=""
  [ $EMU = 1 ] && tiny="--tiny"
  k="$KIT_DIR/bench/bench_kernels_cuda"
  [ $EMU = 1 ] && k="$KIT_DIR/bench/bench_kernels_cuda_emu"
  if [ -x "$k" ]; then
    timeout $(( $(time_left) > 60 ? 150 : 60 )) "$k" $tiny --benchmark_min_time=0.1 \
      --benchmark_out="$B/kernels.json" --benchmark_out_format=json > "$B/kernels.txt" 2>&1 ||
      bench_ok=0
    tail -40 "$B/kernels.txt"
  else
    echo "no $(basename "$k") in the kit"; bench_ok=0
  fi
  timeout 120 "$PY" "$HERE/torch_attention_bench.py" $tiny --out "$B/torch.json" \
    > "$B/torch.txt" 2>&1 || bench_ok=0
  cat "$B/torch.txt"
  # Eager steps and steps from CUDA graphs, every batch size, in one process (one model).
  m="$KIT_DIR/bench/bench_gpu_model"
  [ $EMU = 1 ] && m="$KIT_DIR/bench/bench_gpu_model_emu"
  if [ -x "$m" ] && in_time bench; then
    timeout $(( $(time_left) > 120 ? 240 : 120 )) "$m" $tiny --graphs \
      --benchmark_out="$B/model.json" --benchmark_out_format=json > "$B/model.txt" 2>&1 ||
      bench_ok=0
    tail -30 "$B/model.txt"
  else
    echo "no $(basename "$m") in the kit, or no time left for it"; bench_ok=0
  fi
  if [ $bench_ok = 1 ]; then
    phase bench counted "benchmarks ran"
  else
    phase bench failed "a benchmark failed or is missing (bench/)"
  fi
fi

# ---- sanitize (a GPU only: the emulation has no compute-sanitizer)
if wants sanitize; then
  if [ $EMU = 1 ]; then
    phase sanitize skipped "the emulation has no compute-sanitizer"
  elif ! command -v compute-sanitizer > /dev/null; then
    phase sanitize failed "compute-sanitizer is not on PATH"
  elif in_time sanitize; then
    log "sanitize"
    mkdir -p "$W/sanitize"
    bad=0 runs=0 late=0
    while read -r tool bin filter; do
      [ -x "$KIT_DIR/tests/$bin" ] || continue
      left=$(time_left)
      if [ "$left" -lt 10 ]; then
        echo "$tool $bin $filter: not run, the kit's deadline" | tee -a "$W/sanitize/results.txt"
        late=$((late + 1))
        continue
      fi
      runs=$((runs + 1))
      f="$W/sanitize/$tool-$bin.log"
      timeout $((left < 90 ? left : 90)) compute-sanitizer --tool "$tool" --error-exitcode 97 \
        "$KIT_DIR/tests/$bin" --gtest_filter="$filter" > "$f" 2>&1
      rc=$?
      echo "$tool $bin $filter: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | tail -1)" |
        tee -a "$W/sanitize/results.txt"
      [ $rc = 0 ] || bad=$((bad + 1))
    done <<'EOF'
memcheck cuda_paged_attention_test CudaPagedAttention16.Bf16DecodeMatchesCpu:CudaPagedAttention.PrefillAndMixedBatchesMatchCpu
memcheck cuda_paged_attention_prefill_test CudaPrefillAttention.ChunksMatchCpu
memcheck cuda_sampling_test CudaSampling.GreedyIsTheHostsArgmaxIncludingTies:CudaSampling.PenaltiesMatchTheHostAfterOutputTokens
memcheck cuda_copy_blocks_test CudaCopyBlocks.MatchesCpuOnEveryLayer
memcheck cuda_swap_blocks_test CudaSwapBlocks.SwapOutSwapInAndDeviceToDeviceMatchCpu
memcheck cuda_reshape_and_cache_test CudaReshapeAndCache.MatchesCpuWithPaddingForEveryShape
racecheck cuda_paged_attention_test CudaPagedAttention16.Bf16DecodeMatchesCpu
racecheck cuda_paged_attention_prefill_test CudaPrefillAttention.ChunksMatchCpu
racecheck cuda_sampling_test CudaSampling.GreedyIsTheHostsArgmaxIncludingTies
synccheck cuda_paged_attention_test CudaPagedAttention16.Bf16DecodeMatchesCpu
synccheck cuda_paged_attention_prefill_test CudaPrefillAttention.ChunksMatchCpu
synccheck cuda_sampling_test CudaSampling.GreedyIsTheHostsArgmaxIncludingTies
racecheck cuda_shared_memory_test CudaAsyncCopy.*:CudaDynamicSharedMemory.*
synccheck cuda_shared_memory_test CudaAsyncCopy.*
EOF
    if [ $runs = 0 ]; then
      phase sanitize failed "none of the sanitized test binaries is in the kit, or no time"
    elif [ $late != 0 ]; then
      phase sanitize failed "$late runs left out for the deadline; $bad of $runs ran with errors"
    elif [ $bad = 0 ]; then
      phase sanitize ok "$runs runs clean"
    else
      phase sanitize failed "$bad of $runs runs reported errors (sanitize/results.txt)"
    fi
  fi
fi

finish
