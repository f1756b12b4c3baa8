#!/usr/bin/env bash
# The main job: builds MoEx, generates the default model (a random-weight
# qwen3moe with Qwen's real tokenizer) and generates text with it.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
MODEL=${MOEX_DEMO_MODEL:-build/models/demo-qwen3moe-q4_K_M.gguf}
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  build/bin/moex-gguf gen --arch qwen3moe --preset bench-moe --vocab tests/data/vocab/ggml-vocab-qwen2.gguf \
    --type q4_K_M --seed 1 -o "$MODEL"
fi
build/bin/moex-hub --local -m "$MODEL" -p "${1:-The quick brown fox}" -n "${2:-64}" --seed 42
