#!/usr/bin/env bash
# The main job: builds MoEx, then runs the default model -- a small Qwen3-MoE
# trained on the Brown Corpus (train/model/brown-moe-q8_0.gguf, docs/MODEL.md)
# -- with three workers and a hub on loopback, then the same with --local for
# comparison (both sample with the same seed, so they print the same text).
#   ./demo.sh [PROMPT] [N_TOKENS]
#   MOEX_DEMO_MODEL=FILE ./demo.sh     another model (a missing FILE gets the
#                                      random-weight bench-moe model, as before)
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
PROMPT=${1:-The jury said}
N=${2:-48}
MODEL=${MOEX_DEMO_MODEL:-train/model/brown-moe-q8_0.gguf}
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  build/bin/moex-gguf gen --arch qwen3moe --preset bench-moe --vocab tests/data/vocab/ggml-vocab-qwen2.gguf \
    --type q4_K_M --seed 1 -o "$MODEL"
fi
SAMPLING=(--temp "${MOEX_DEMO_TEMP:-0.7}" --top-k 40 --seed "${MOEX_DEMO_SEED:-1}")
PORT=${MOEX_DEMO_PORT:-18765}
TOKEN=demo-$$
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for i in 0 1 2; do
  build/bin/moex-worker --hub "ws://127.0.0.1:$PORT/ws" --token "$TOKEN" --model "$MODEL" --threads 1 \
    --name "demo-worker-$i" 2>"build/demo-worker-$i.log" &
  pids+=($!)
done
echo "== hub + 3 workers (r=2, hedge auto)"
build/bin/moex-hub -m "$MODEL" --port "$PORT" --token "$TOKEN" --replicas 2 --hedge auto --min-workers 3 \
  -p "$PROMPT" -n "$N" "${SAMPLING[@]}" --ignore-eos
echo "== the same, --local"
build/bin/moex-hub --local -m "$MODEL" -p "$PROMPT" -n "$N" "${SAMPLING[@]}" --ignore-eos
