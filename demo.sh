#!/usr/bin/env bash
# The main job: builds MoEx, generates the default model (a random-weight
# qwen3moe with Qwen's real tokenizer), starts three workers and a hub on
# loopback and generates text; then the same with --local for comparison.
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh
PROMPT=${1:-The quick brown fox}
N=${2:-48}
MODEL=${MOEX_DEMO_MODEL:-build/models/demo-qwen3moe-q4_K_M.gguf}
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  build/bin/moex-gguf gen --arch qwen3moe --preset bench-moe --vocab tests/data/vocab/ggml-vocab-qwen2.gguf \
    --type q4_K_M --seed 1 -o "$MODEL"
fi
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
  -p "$PROMPT" -n "$N" --temp 0 --ignore-eos
echo "== the same, --local"
build/bin/moex-hub --local -m "$MODEL" -p "$PROMPT" -n "$N" --temp 0 --ignore-eos
