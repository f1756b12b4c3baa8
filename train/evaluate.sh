#!/usr/bin/env bash
# Measures the shipped model for docs/MODEL.md, writing train/model/eval/:
#   ppl.txt       held-out perplexity: moex --local Q8_0 and Q4_K_M (quantized from
#                 it), llama.cpp on the same files (when the peer is set up),
#                 --backend vulkan and hub + 2 workers on Q8_0
#   routes.trace  the experts of every held-out token (moex-hub --routing-trace)
#   routing.txt / routing.json   its statistics (train/routing_stats.py)
#   sim.txt       moex-sim token: uniform routing vs the trace vs the trace with
#                 replicas placed by load
# Windows: the model's context length; CHUNKS=N scores the first N windows only.
#   train/evaluate.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BIN=$BUILD/bin
MODEL=train/model/brown-moe-q8_0.gguf
TEXT=train/brown-heldout.txt
OUTD=train/model/eval
PEER=.peer/bin/llama_peer
mkdir -p "$OUTD" "$BUILD/models"
Q4=$BUILD/models/brown-moe-q4_K_M.gguf
"$BIN/moex-gguf" quantize "$MODEL" "$Q4" --type q4_K_M
CTX=${CTX:-$("$BIN/moex-gguf" info "$MODEL" | awk '/context_length/ {print $3}')}
CH=(--ppl-chunks "${CHUNKS:-100000}")
final() { grep -o 'Final estimate: PPL = [0-9.]* +/- [0-9.]*' | sed 's/Final estimate: //'; }
{
  echo "held-out text: $TEXT, windows of $CTX tokens, ${CHUNKS:-all} windows"
  for m in "$MODEL" "$Q4"; do
    echo "moex --local $(basename "$m"): $("$BIN/moex-hub" --local -m "$m" --perplexity "$TEXT" --ctx "$CTX" "${CH[@]}" | final)"
    if [ -x "$PEER" ]; then
      echo "llama.cpp    $(basename "$m"): $("$PEER" perplexity "$m" "$TEXT" --ctx "$CTX" --chunks "${CHUNKS:-0}" | final)"
    fi
  done
  if "$BIN/moex-hub" --list-devices >/dev/null 2>&1; then
    echo "moex --local --backend vulkan $(basename "$MODEL"): $("$BIN/moex-hub" --local --backend vulkan -m "$MODEL" \
      --perplexity "$TEXT" --ctx "$CTX" "${CH[@]}" | final)"
  fi
  port=$((20000 + RANDOM % 20000))
  w=()
  for i in 0 1; do
    "$BIN/moex-worker" --hub "ws://127.0.0.1:$port/ws" --token eval --model "$MODEL" --threads 1 --name "eval-$i" \
      2>/dev/null & w+=($!)
  done
  echo "moex hub + 2 workers $(basename "$MODEL"): $("$BIN/moex-hub" -m "$MODEL" --port "$port" --token eval \
    --min-workers 2 --perplexity "$TEXT" --ctx "$CTX" "${CH[@]}" 2>/dev/null | final)"
  kill "${w[@]}" 2>/dev/null || true
} | tee "$OUTD/ppl.txt"
"$BIN/moex-hub" --local -m "$MODEL" --perplexity "$TEXT" --ctx "$CTX" "${CH[@]}" --routing-trace "$OUTD/routes.trace" \
  >/dev/null
/usr/bin/python3 train/routing_stats.py "$OUTD/routes.trace" --json "$OUTD/routing.json" | tee "$OUTD/routing.txt"
{
  for W in 4 8; do
    for mode in uniform trace place-by-load; do
      case $mode in
        uniform) args=($(awk 'NR==2 || /^layers/ {print "--layers", $2, "--experts", $4, "--k", $6; exit}' "$OUTD/routes.trace"));;
        trace) args=(--route-trace "$OUTD/routes.trace");;
        place-by-load) args=(--route-trace "$OUTD/routes.trace" --place-by-load);;
      esac
      echo "# W=$W R=2 routing: $mode"
      "$BIN/moex-sim" token "${args[@]}" --workers "$W" --replicas 2 --h 1,2 --ffn-sigma 0.3 --rtt-ms 0.5,10 \
        --tokens 2000 --format csv
    done
  done
} | tee "$OUTD/sim.txt"
echo "evaluate: wrote $OUTD"
