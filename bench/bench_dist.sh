#!/usr/bin/env bash
# Benchmark (not a test): the distributed hub on loopback.
#  1. per-layer round trip of one expert dispatch (hidden 2048, f16, 1 token) beyond the
#     worker's compute: hub-side round-trip percentiles against the worker's mean compute time;
#  2. tokens/s of hub + N workers against --local on the same generated model.
# usage: bench/bench_dist.sh BUILD_DIR [WORK_DIR]   (prints a markdown table)
# MOEX_BENCH_TCP=1: the same over the hub's --tcp-port (workers on tcp://) instead of its WebSocket
set -euo pipefail
B=${1:?build dir}/bin
W=${2:-/tmp/moex-bench-dist}
V=$(cd "$(dirname "$0")/../tests/data/vocab" && pwd)
mkdir -p "$W"
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# MOEX_BENCH_TCP=1: the workers join over the hub's --tcp-port (the TCP transport) instead of its WebSocket
url() { if [ "${MOEX_BENCH_TCP:-0}" = 1 ]; then echo "tcp://127.0.0.1:$2"; else echo "ws://127.0.0.1:$1/ws"; fi; }

# 1. one expert per token at hidden 2048: every layer is exactly one dispatch round trip
RT=$W/rt-h2048.gguf
[ -f "$RT" ] || "$B/moex-gguf" gen --arch qwen3moe --preset test --hidden 2048 --heads 16 --kv-heads 4 --head-dim 128 \
  --experts 8 --experts-used 1 --expert-ff 768 --layers 8 --vocab "$V/ggml-vocab-llama-spm.gguf" --type q4_K_M \
  --seed 7 -o "$RT" --quiet
P=$(port); TP=$(port)
"$B/moex-worker" --hub "$(url "$P" "$TP")" --token bench --model "$RT" --threads 1 --name rt0 2>"$W/rt-worker.log" &
WP=$!
"$B/moex-hub" -m "$RT" --port "$P" --tcp-port "$TP" --token bench --replicas 1 --min-workers 1 --prompt-tokens 1,2,3 -n 256 --temp 0 \
  --ignore-eos --print-tokens --threads 1 >/dev/null 2>"$W/rt-hub.log"
kill -TERM $WP; wait $WP || true
lat=$(grep -E '^  rt0 ' "$W/rt-hub.log" | awk '{print $2, $3, $4}')
comp=$(grep -o 'mean compute [0-9.]* ms' "$W/rt-worker.log" | awk '{print $3}')
read -r p50 p95 p99 <<<"$lat"
echo "| per-layer round trip, hidden 2048, f16, 1 token | p50 $p50 ms | p99 $p99 ms | worker compute (mean) $comp ms | beyond compute: p50 $(echo "$p50 - $comp" | bc -l | xargs printf %.3f) ms, p99 $(echo "$p99 - $comp" | bc -l | xargs printf %.3f) ms |"

# 2. tokens/s: hub + N workers vs --local (all processes share this machine's cores)
M=$W/bench-moe.gguf
[ -f "$M" ] || "$B/moex-gguf" gen --arch qwen3moe --preset bench-moe --vocab "$V/ggml-vocab-qwen2.gguf" \
  --type q4_K_M --seed 1 -o "$M" --quiet
stats() { grep '^moex-hub: load' | sed -E 's/.*prompt ([0-9]+) tokens ([0-9.]+) tok\/s \| decode ([0-9]+) tokens ([0-9.]+) tok\/s.*/\2 \4/'; }
read -r lp ld < <("$B/moex-hub" --local -m "$M" --prompt-tokens "$(seq -s, 1 64)" -n 64 --temp 0 --ignore-eos \
  --print-tokens 2>&1 >/dev/null | stats)
echo "| --local | prompt $lp tok/s | decode $ld tok/s |"
for n in 1 2 3; do
  P=$(port); TP=$(port); pids=()
  for i in $(seq 1 $n); do
    "$B/moex-worker" --hub "$(url "$P" "$TP")" --token bench --model "$M" --threads 1 --name "b$i" 2>/dev/null & pids+=($!)
  done
  read -r dp dd < <("$B/moex-hub" -m "$M" --port "$P" --tcp-port "$TP" --token bench --replicas 1 --min-workers $n --prompt-tokens "$(seq -s, 1 64)" \
    -n 64 --temp 0 --ignore-eos --print-tokens 2>&1 >/dev/null | stats)
  kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  echo "| hub + $n workers (r=1) | prompt $dp tok/s ($(echo "$dp / $lp" | bc -l | xargs printf %.2f)x) | decode $dd tok/s ($(echo "$dd / $ld" | bc -l | xargs printf %.2f)x) |"
done
