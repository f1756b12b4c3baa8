#!/usr/bin/env bash
# Benchmark (not a test): one MoE layer's round trip through the distributed
# hub on loopback, and where its time goes. One decode token, hidden 2048,
# f16 on the wire, k = 8 experts over 4 CPU workers (r = 1), expert FFNs kept
# tiny (ff 32) so that what is left of the round trip is the pipeline itself.
# The hub's "hub layer timing" line gives each layer's phases (plan+encode,
# send, wait for the results, decode, combine) and the round trip send+wait
# (what "beyond compute" is taken from: on TCP the executor writes the
# sockets itself, so "send" holds the writes); each worker's "worker timing"
# line its queue, compute, encode and outbox times.
# usage: bench/bench_dist_layer.sh BUILD_DIR [WORK_DIR] [TOKENS]
# MOEX_BENCH_TCP=1: the same over the hub's --tcp-port (workers on tcp://) instead of its WebSocket
set -euo pipefail
B=${1:?build dir}/bin
W=${2:-/tmp/moex-bench-layer}
N=${3:-400}
V=$(cd "$(dirname "$0")/../tests/data/vocab" && pwd)
mkdir -p "$W"
port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# MOEX_BENCH_TCP=1: the workers join over the hub's --tcp-port (the TCP transport) instead of its WebSocket
url() { if [ "${MOEX_BENCH_TCP:-0}" = 1 ]; then echo "tcp://127.0.0.1:$2"; else echo "ws://127.0.0.1:$1/ws"; fi; }
M=$W/layer-h2048.gguf
[ -f "$M" ] || "$B/moex-gguf" gen --arch qwen3moe --preset test --hidden 2048 --heads 16 --kv-heads 4 --head-dim 128 \
  --experts 8 --experts-used 8 --expert-ff 32 --layers 8 --vocab "$V/ggml-vocab-llama-spm.gguf" --type q8_0 \
  --seed 7 -o "$M" --quiet
P=$(port); TP=$(port)
pids=()
for i in 0 1 2 3; do
  "$B/moex-worker" --hub "$(url "$P" "$TP")" --token bench --model "$M" --threads 1 --name "l$i" \
    2>"$W/worker-$i.log" &
  pids+=($!)
done
"$B/moex-hub" -m "$M" --port "$P" --tcp-port "$TP" --token bench --replicas 1 --min-workers 4 --prompt-tokens 1 -n "$N" --temp 0 \
  --ignore-eos --print-tokens --threads 1 >/dev/null 2>"$W/hub.log"
kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc), load $(cut -d' ' -f1 /proc/loadavg), $(date -u +%Y-%m-%dT%H:%MZ)"
grep -E "^moex-hub: load|hub layer timing" "$W/hub.log"
for i in 0 1 2 3; do echo "l$i: $(grep -o 'worker timing:.*' "$W/worker-$i.log")"; done
/usr/bin/python3 - "$W" <<'PY'
import re, sys
w = sys.argv[1]
hub = open(f"{w}/hub.log").read()
m = re.search(r"send\+wait (\d+)/(\d+)", hub)  # the round trip: sockets written (on TCP by the executor) to the last result
rt50, rt99 = int(m.group(1)), int(m.group(2))
comp = []
for i in range(4):
    t = open(f"{w}/worker-{i}.log").read()
    c = re.search(r"compute p50 ([\d.]+) p99 ([\d.]+) ms", t)
    comp.append(float(c.group(1)) * 1000 if c else 0.0)
c50 = max(comp)
print(f"| per-layer round trip (1 token, 8 experts over 4 workers) | send+wait p50 {rt50} us, p99 {rt99} us "
      f"| slowest worker's compute p50 {c50:.0f} us | beyond compute: p50 {rt50 - c50:.0f} us, p99 {rt99 - c50:.0f} us |")
PY
