#!/usr/bin/env bash
# Packs the device kit (docs/development/device-kit.md) from a build: the binaries a GPU machine
# runs, the shared libraries they need that such a machine lacks, and a MANIFEST.json, into one
# compressed tar that tools/gpu/run_kit.sh unpacks there.
#
#   tools/gpu/pack_kit.sh --build-dir build-gpu-kit --out build-gpu-kit/llm-gpu-kit.tar.xz
#   tools/gpu/pack_kit.sh --emu --build-dir build --out DIR/kit.tar.gz    (the rehearsal's kit)
#
# Contents: bin/ llm-worker (--emu: llm-worker-emu), llm-scheduler, llm-cluster, llm-client,
# llm-loadgen; tests/ every test binary of the label `gpu` (--emu: `cuda-emu`), as ctest lists
# them; bench/ bench_kernels_cuda and bench_gpu_model (--emu: their _emu builds); lib/ every
# shared library those load (ldd) except what the GPU machine has: the C library and loader,
# libstdc++ and libgcc_s, the driver (libcuda), the CUDA runtime, cuBLAS, cuBLASLt and NCCL
# (the CUDA toolkit's or the torch venv's nvidia-* wheels: run_kit.sh finds them).
#
# Checks, each fatal: every binary exists; the closure: under an empty environment with only
# lib/ on LD_LIBRARY_PATH, every library a binary loads resolves from lib/ or is one of the
# machine's; --max-mib: the compressed kit plus the repository's tracked files (which travel
# with it) fit in that many MiB (the device tool sends 64 MiB at most).
set -euo pipefail

BUILD="" OUT="" EMU=0 MAX_MIB=64
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --emu) EMU=1; shift ;;
    --max-mib) MAX_MIB=$2; shift 2 ;;
    *) echo "pack_kit.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$BUILD" ] && [ -n "$OUT" ] || { echo "usage: pack_kit.sh --build-dir B --out FILE" >&2; exit 2; }
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$BUILD" && pwd)
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/llm-kit-pack.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/tests" "$STAGE/bench" "$STAGE/lib"

# The machine's own libraries: never packed.
SYSTEM_LIBS='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec|libpthread|libdl\.so|librt\.so|libutil\.so|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libnvidia)'

worker=llm-worker label=gpu suffix=""
if [ $EMU = 1 ]; then worker=llm-worker-emu label=cuda-emu suffix=_emu; fi
need() {  # need FILE DEST: copies a built binary, or fails naming it
  [ -x "$1" ] || { echo "pack_kit.sh: $1 is not built (build its target first)" >&2; exit 1; }
  cp "$1" "$2/"
}
for b in "$worker" llm-scheduler llm-cluster llm-client; do need "$BUILD/bin/$b" "$STAGE/bin"; done
need "$BUILD/bench/llm-loadgen" "$STAGE/bin"
for b in bench_kernels_cuda bench_gpu_model; do need "$BUILD/bench/$b$suffix" "$STAGE/bench"; done
# The test binaries of the label, as ctest runs them (each binary once).
# (GoogleTest binaries of this build: not the benchmarks' smoke tests, nor a script's.)
tests=$(cd "$BUILD" && ctest -L "^$label\$" --show-only=json-v1 | python3 -c '
import json, sys
build = sys.argv[1] + "/"
seen = []
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command") or []
    if cmd and cmd[0].startswith(build) and "/bench/" not in cmd[0] and cmd[0] not in seen:
        seen.append(cmd[0])
print("\n".join(seen))' "$BUILD")
[ -n "$tests" ] || { echo "pack_kit.sh: ctest lists no test of label $label in $BUILD" >&2; exit 1; }
for t in $tests; do need "$t" "$STAGE/tests"; done

# The libraries: the closure of every binary's ldd, less the machine's own.
libs=$(for f in "$STAGE"/bin/* "$STAGE"/tests/* "$STAGE"/bench/*; do ldd "$f"; done |
  awk '$2 == "=>" && $3 ~ /^\// {print $1 " " $3}' | sort -u)
while read -r name path; do
  [ -n "$name" ] || continue
  if echo "$name" | grep -Eq "$SYSTEM_LIBS"; then continue; fi
  cp -L "$path" "$STAGE/lib/$name"
done <<< "$libs"
unresolved=$(for f in "$STAGE"/bin/* "$STAGE"/tests/* "$STAGE"/bench/*; do ldd "$f"; done |
  grep "not found" | awk '{print $1}' | sort -u | grep -Ev "$SYSTEM_LIBS" || true)
[ -z "$unresolved" ] || { echo "pack_kit.sh: not found here: $unresolved" >&2; exit 1; }

# The closure, as the GPU machine will see it: an empty environment, lib/ only.
bad=""
for f in "$STAGE"/bin/* "$STAGE"/tests/* "$STAGE"/bench/*; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    echo "$name" | grep -Eq "$SYSTEM_LIBS" && continue
    case "$path" in "$STAGE/lib/"*) ;; *) bad="$bad $(basename "$f"):$name->$path" ;; esac
  done < <(env -i LD_LIBRARY_PATH="$STAGE/lib" ldd "$f")
done
[ -z "$bad" ] || { echo "pack_kit.sh: resolved outside the kit:$bad" >&2; exit 1; }

commit=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)
archs=$(grep -E '^LLM_CUDA_ARCHITECTURES:' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2 || true)
python3 - "$STAGE" "$commit" "$dirty" "$EMU" "$archs" > "$STAGE/MANIFEST.json" <<'EOF'
import json, os, sys, time
stage, commit, dirty, emu, archs = sys.argv[1:]
files = {d: sorted(os.listdir(os.path.join(stage, d))) for d in ("bin", "tests", "bench", "lib")}
print(json.dumps({"mode": "emu" if emu == "1" else "cuda", "commit": commit,
                  "dirty": dirty == "true", "packed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "cuda_architectures": archs, **files}, indent=2))
EOF

mkdir -p "$(dirname "$OUT")"
case "$OUT" in
  *.tar.xz) tar -C "$STAGE" -cf - . | xz -T0 -9e > "$OUT" ;;
  *.tar.gz) tar -C "$STAGE" -czf "$OUT" . ;;
  *) echo "pack_kit.sh: --out must end in .tar.xz or .tar.gz" >&2; exit 2 ;;
esac
kit_bytes=$(stat -c %s "$OUT")
tree_bytes=$(git -C "$REPO" ls-files -z | (cd "$REPO" && xargs -0 stat -c %s 2>/dev/null) |
  awk '{s += $1} END {print s + 0}')
total=$((kit_bytes + tree_bytes))
limit="of at most $MAX_MIB"
[ "$MAX_MIB" -gt 0 ] || limit="(not checked)"
echo "pack_kit.sh: $OUT: $(du -sh "$STAGE" | cut -f1) unpacked ($(ls "$STAGE/tests" | wc -l) test" \
  "binaries, $(ls "$STAGE/lib" | wc -l) libraries), $((kit_bytes >> 20)) MiB packed; with the" \
  "tracked tree ($((tree_bytes >> 20)) MiB) $((total >> 20)) MiB $limit"
if [ "$MAX_MIB" -gt 0 ] && [ "$total" -gt $((MAX_MIB << 20)) ]; then
  echo "pack_kit.sh: the kit and the tree are $total bytes, over $MAX_MIB MiB" >&2
  exit 1
fi
