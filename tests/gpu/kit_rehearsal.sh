#!/usr/bin/env bash
# ctest gpu_kit_rehearsal: the device kit's two scripts rehearsed on this machine, as they run on
# a GPU machine but under the CUDA emulation, so that only the device itself is new there.
#
#   kit_rehearsal.sh BUILD_DIR PYTHON
#
# 1. tools/gpu/pack_kit.sh --emu packs llm-worker-emu, the cuda-emu test twins and the _emu
#    benchmarks of BUILD_DIR, checking the library closure (an empty environment, the kit's lib/
#    only); not its size (this kit never travels; `make gpu-kit` checks the real one's).
# 2. tools/gpu/run_kit.sh --emu runs the unpacked kit: a few of its test binaries, a served
#    tiny model (logits against run_kit's numpy reference, llm-loadgen at concurrency 1, 2, 4,
#    the worker's counters: every step sampled on the device, decode steps from CUDA graphs)
#    and the benchmarks with --tiny; it must pass, and its summary must say so.
# 3. The logits check can fail: the served first steps against a model of other weights (seed 1).
# 4. A broken environment must not look green: the same kit with a test that skips (the real
#    CUDA build's cuda_device_test, which skips without a GPU) must fail, naming the skip.
set -euo pipefail
BUILD=$(cd "$1" && pwd)
PY=$2
REPO=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/llm-kit-rehearsal.XXXXXX")
trap 'rm -rf "$T"' EXIT

echo "== pack_kit.sh --emu"
"$REPO/tools/gpu/pack_kit.sh" --emu --build-dir "$BUILD" --out "$T/kit.tar.gz" --max-mib 0
mkdir "$T/kit"
tar -C "$T/kit" -xzf "$T/kit.tar.gz"
for d in bin tests bench lib; do
  [ -n "$(ls "$T/kit/$d")" ] || { echo "FAIL: the kit's $d/ is empty"; exit 1; }
done

echo "== run_kit.sh --emu"
tests="cuda_emu_device_test cuda_emu_rms_norm_test cuda_emu_copy_blocks_test"
rc=0
"$REPO/tools/gpu/run_kit.sh" --emu --kit "$T/kit.tar.gz" --out "$T/out" --python "$PY" \
  --tests "$tests" --deadline-s 500 || rc=$?
[ $rc = 0 ] || { echo "FAIL: run_kit.sh --emu exited $rc"; exit 1; }
for f in summary.json summary.txt kit.log details.tar.gz; do
  [ -s "$T/out/$f" ] || { echo "FAIL: run_kit.sh wrote no $f"; exit 1; }
done
"$PY" - "$T/out/summary.json" "$tests" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
want = sys.argv[2].split()
assert s["ok"] and s["mode"] == "emu", s["phases"]
for name in ("env", "tests", "serve", "bench"):
    assert s["phases"][name]["status"] == "ok", (name, s["phases"][name])
binaries = {b["binary"]: b for b in s["tests"]["binaries"]}
assert sorted(binaries) == sorted(want), binaries.keys()
assert all(b["tests"] > 0 and not b["failed"] and not b["skipped"] for b in binaries.values())
serve = s["serve"]
assert serve["logits"]["ok"] and len(serve["logits"]["prompts"]) == 4, serve["logits"]
assert serve["logits"]["max_abs_logprob_error"] < serve["logits"]["tolerance"]
assert sorted(serve["loadgen"], key=int) == ["1", "2", "4"], serve["loadgen"]
for c, r in serve["loadgen"].items():
    assert r["failed"] == 0 and r["successful"] > 0 and r["output_tok_s"] > 0, (c, r)
w = serve["worker"]
assert w["sampler"] == "device" and w["host_sampled_steps"] == 0, w
assert w["graph_steps"] > 0 and w["graphs_captured"] > 0, w
assert w["linear_plans"] > 0 and w["linear_plan_hits"] > w["linear_plan_misses"], w
names = [e["name"] for e in s["bench"]["model"]["benchmarks"]]
assert s["bench"]["kernels"]["benchmarks"], s["bench"]
assert any("DecodeStepGraphs" in n for n in names) and any("DecodeStep/" in n for n in names), names
print("summary checked: every phase passed; logits max error %.4f; worker %s"
      % (serve["logits"]["max_abs_logprob_error"], w))
EOF

echo "== the logits check fails on other weights"
mkdir "$T/details"
tar -C "$T/details" -xzf "$T/out/details.tar.gz"
"$PY" "$REPO/tools/gpu/make_model.py" --shape tiny --seed 1 --out "$T/other"
rc=0
"$PY" "$REPO/tools/gpu/check_logits.py" --model "$T/other" --backend numpy \
  --served "$T"/details/serve/first_step_*.jsonl --out "$T/other.json" || rc=$?
[ $rc != 0 ] || { echo "FAIL: the served logits matched a model of other weights"; exit 1; }
echo "the served first step does not match other weights, as it must not"

echo "== a skipped test fails the kit"
real="$BUILD/tests/gpu/cuda_device_test"
if [ ! -x "$real" ]; then
  echo "no real CUDA build of cuda_device_test here (no nvcc): this part is not rehearsed"
  exit 0
fi
cp "$real" "$T/kit/tests/"
rc=0
"$REPO/tools/gpu/run_kit.sh" --emu --kit-dir "$T/kit" --out "$T/out2" --python "$PY" \
  --phases "tests" --tests "cuda_device_test" || rc=$?
[ $rc != 0 ] || { echo "FAIL: a kit whose test skipped passed"; exit 1; }
grep -q "skipped (counted as failures)" "$T/out2/summary.txt" ||
  { echo "FAIL: the summary does not name the skip"; cat "$T/out2/summary.txt"; exit 1; }
echo "the skipping test failed the kit, as it must"
echo "gpu_kit_rehearsal: passed"
