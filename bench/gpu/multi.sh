#!/bin/sh
# A GPU per worker (issue 38): the hub on GPU 0, Vulkan workers on the other
# GPUs (--device i), against --local on GPU 0 of the same machine, in one call.
# Prints "key value" lines; logs go to $OUT when set.
# usage: bench/gpu/multi.sh BIN_DIR STEP...
#   BIN_DIR: the unpacked carry of bench/vk/pack_carry.sh (moex-hub, moex-worker, moex-gguf)
# steps:
#   gen      the Qwen3-30B-A3B-shaped Q4_K_M model (reused when present)
#   local    `moex-hub --local --backend vulkan --device 0`: the 512-token prompt + 128 greedy tokens
#   dist     hub --device 0 + one Vulkan worker on each other GPU: r:h = 1:1 2:1 2:2 (WebSocket), r = 1 h = 1
#            over the TCP transport, and two workers a GPU (r = 2); tokens set against local's.
#            MOEX_BENCH_RH="1:1": those r:h pairs only
#   api      `serve` at 1 and 8 streams: --local on GPU 0, then hub + one worker on each other GPU (r = 1)
#   block    local, dist's r = 1 h = 1 (WebSocket and TCP) and api with --vk-tune spin_us=0: every wait
#            blocks in the driver at once (the default polls 5 ms first)
# MOEX_BENCH_VK_TUNE: --vk-tune for every hub and worker of the other steps
#   llama    llama.cpp's CUDA llama-bench from $LLAMA_SRC (common.sh)
#   gen235   the Qwen3-235B-A22B-shaped Q4_K_M model ($MOEX_BENCH_BIG, default /dev/shm/q235.gguf, 142 GB)
#   big      the 235B model: hub + one worker on each other GPU (r = 1): its first tokens against the CPU
#            engine's on a short prompt, then the 512-token prompt + 32 tokens; llama-bench -sm layer over
#            every GPU on the same file
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd)
shift
. "$repo/bench/gpu/common.sh"
ngpu=${MOEX_BENCH_GPUS:-$(nvidia-smi -L | wc -l)}
big=${MOEX_BENCH_BIG:-/dev/shm/q235.gguf}
vk_tune=${MOEX_BENCH_VK_TUNE:-}

# How many leading tokens two --print-tokens outputs share, of how many: "17/128"
agree() {
    python3 -c 'import sys
a, b = (open(f).read().split() for f in sys.argv[1:3])
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
print(f"{n}/{len(a)}")' "$1" "$2"
}

# $1 tag, $2 model, $3 prompt, $4 tokens, then more hub options
local_on0() {
    tag=$1 m=$2 p=$3 n=$4
    shift 4
    "$bin/moex-hub" --local --backend vulkan --device 0 -m "$m" --prompt-tokens "$p" -n "$n" --temp 0 --ignore-eos \
        --print-tokens --vk-tune "$vk_tune" "$@" > "$work/$tag.out" 2> "$work/$tag.err" || { tail -5 "$work/$tag.err"; return 1; }
    echo "$tag $(stats < "$work/$tag.err")"
    keep "$work/$tag.err"
}

# hub on GPU 0 + $per workers on each other GPU; $1 tag, $2 model, $3 prompt, $4 tokens, $5 replicas,
# $6 hedge, $7 workers a GPU, then more hub options. MOEX_BENCH_TCP=1: the workers join over --tcp-port.
dist_gpus() {
    tag=$1 m=$2 p=$3 n=$4 reps=$5 hedge=$6 per=$7
    shift 7
    hp=$(port)
    tp=$(port)
    url="ws://127.0.0.1:$hp/ws"
    [ "${MOEX_BENCH_TCP:-0}" = 1 ] && url="tcp://127.0.0.1:$tp"
    pids="" nw=0
    for g in $(seq 1 $((ngpu - 1))); do
        for k in $(seq "$per"); do
            "$bin/moex-worker" --hub "$url" --token b --model "$m" --backend vulkan --device "$g" --threads 1 \
                --vk-tune "$vk_tune" --name "g${g}w$k" 2> "$work/$tag-g${g}w$k.err" &
            pids="$pids $!" nw=$((nw + 1))
        done
    done
    "$bin/moex-hub" --backend vulkan --device 0 -m "$m" --port "$hp" --tcp-port "$tp" --token b --replicas "$reps" \
        --vk-tune "$vk_tune" --hedge "$hedge" --min-workers "$nw" --wait-s 600 "$@" --prompt-tokens "$p" -n "$n" --temp 0 --ignore-eos \
        --print-tokens > "$work/$tag.out" 2> "$work/$tag.err" || tail -5 "$work/$tag.err"
    kill -TERM $pids 2>/dev/null
    wait $pids 2>/dev/null || true
    echo "$tag $(stats < "$work/$tag.err") workers $nw"
    grep -h "hub layer timing\|hub gpu" "$work/$tag.err" | sed "s/^/$tag /"
    for f in "$work/$tag"-g*.err; do grep -h "worker timing" "$f" | sed "s/^/$tag $(basename "$f" .err) /"; done
    keep "$work/$tag.err" "$work/$tag"-g*.err
}

step_local() { local_on0 local "$model" "$prompt" 128; }

step_dist() {
    [ -f "$work/local.out" ] || step_local
    for rh in ${MOEX_BENCH_RH:-1:1 2:1 2:2}; do
        r=${rh%:*} h=${rh#*:}
        dist_gpus "dist_r${r}_h$h" "$model" "$prompt" 128 "$r" "$h" 1
        echo "dist_r${r}_h$h tokens_agree_with_local $(agree "$work/local.out" "$work/dist_r${r}_h$h.out")"
    done
    [ -n "${MOEX_BENCH_RH:-}" ] && return
    (MOEX_BENCH_TCP=1; export MOEX_BENCH_TCP; dist_gpus dist_tcp_r1_h1 "$model" "$prompt" 128 1 1 1)
    dist_gpus dist_2pergpu_r2_h1 "$model" "$prompt" 128 2 1 2
}

# bench_api.py's rows as "tag_sN_tok_s X tag_sN_stream_tok_s Y"
api_rows() { awk -F'|' -v t="$1" '/^\| [0-9]+ \|/ { gsub(/ /, ""); print t "_s" $2 "_tok_s " $3 " ttft_med_s " $5 " stream_tok_s " $7 }'; }

# $1: the tag (api)
step_api() {
    tag=${1:-api}
    serve="$bin/moex-hub serve -m $model --backend vulkan --device 0 --parallel 16 --ctx 512 --port {port} ${vk_tune:+--vk-tune $vk_tune}"
    python3 "$repo/bench/bench_api.py" --streams 1,8 --tokens 128 --prompt 32 --hub "$serve --local" \
        --logs "$work/${tag}_local" > "$work/${tag}_local.md" 2> "$work/${tag}_local.err" || tail -5 "$work/${tag}_local.err"
    api_rows "${tag}_local" < "$work/${tag}_local.md"
    workers=""
    for g in $(seq 1 $((ngpu - 1))); do
        workers="$workers --worker"
        workers="$workers '$bin/moex-worker --hub ws://127.0.0.1:{port}/ws --token b --model $model --backend vulkan --device $g --threads 1 ${vk_tune:+--vk-tune $vk_tune} --name g$g'"
    done
    eval python3 "$repo/bench/bench_api.py" --streams 1,8 --tokens 128 --prompt 32 --logs "$work/${tag}_dist" \
        --hub "'$serve --token b --replicas 1 --min-workers $((ngpu - 1)) --wait-s 600'" $workers \
        > "$work/${tag}_dist.md" 2> "$work/${tag}_dist.err" || tail -5 "$work/${tag}_dist.err"
    api_rows "${tag}_dist" < "$work/${tag}_dist.md"
    grep -h "hub layer timing" "$work/${tag}_dist/hub.err" | sed "s/^/${tag}_dist /"
    [ -n "${OUT:-}" ] && cp -r "$work/${tag}_local" "$work/${tag}_dist" "$work/${tag}"_*.md "$OUT"/ 2>/dev/null || true
}

# local, dist's r = 1 h = 1 (WebSocket and TCP) and api with every Vulkan wait blocking in the driver at
# once (--vk-tune spin_us=0), as before the 5 ms poll became the default: the pair to the other steps
step_block() {
    (
        vk_tune=spin_us=0
        local_on0 block_local "$model" "$prompt" 128
        dist_gpus block_r1_h1 "$model" "$prompt" 128 1 1 1
        echo "block_r1_h1 tokens_agree_with_local $(agree "$work/block_local.out" "$work/block_r1_h1.out")"
        (MOEX_BENCH_TCP=1; export MOEX_BENCH_TCP; dist_gpus block_tcp_r1_h1 "$model" "$prompt" 128 1 1 1)
        step_api apiblock
    )
}

step_gen235() {
    if [ ! -f "$big" ]; then
        t0=$(date +%s)
        "$bin/moex-gguf" gen --preset qwen3-235b-a22b --vocab "$repo/tests/data/vocab/ggml-vocab-qwen2.gguf" \
            --type q4_K_M --seed "${MOEX_BENCH_SEED:-7}" --quiet -o "$big"
        echo "gen235_s $(( $(date +%s) - t0 ))"
    fi
    echo "big_bytes $(stat -c %s "$big")"
}

step_big() {
    short=1,2,3,4,5,6,7,8
    "$bin/moex-hub" --local --backend cpu -m "$big" --prompt-tokens "$short" -n 8 --temp 0 --ignore-eos --print-tokens \
        > "$work/big_cpu.out" 2> "$work/big_cpu.err" || tail -5 "$work/big_cpu.err"
    echo "big_cpu $(stats < "$work/big_cpu.err")"
    dist_gpus big_short "$big" "$short" 8 1 1 1
    echo "big_short tokens_agree_with_cpu $(agree "$work/big_cpu.out" "$work/big_short.out")"
    dist_gpus big_dist "$big" "$prompt" 32 1 1 1
    [ -x "$llama_bench" ] && "$llama_bench" -m "$big" -ngl 99 -fa 1 -sm layer -p 512 -n 32 -r 1 2> "$work/big_llama.err" |
        llama_rows | sed 's/^/big_llama_sm_layer /'
    keep "$work/big_cpu.err"
}

run_steps "$@"
