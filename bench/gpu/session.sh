#!/bin/sh
# The GPU machine's benchmarks, in named steps, on binaries packed by
# bench/vk/pack_carry.sh. Prints "key value" lines (and copies logs to $OUT
# when set). Steps:
#   gen        the Qwen3-30B-A3B-shaped Q4_K_M model (reused when present)
#   firstrun   `moex-hub --local --backend vulkan`, 512-token prompt + 128 tokens:
#              with empty shader/pipeline caches, then twice warm
#   bench      bench_vk: pp512 and decode after a 512-token prompt (docs/PERF.md's figures)
#   dist       the same prompt through hub --backend vulkan + 4 workers (Vulkan, then CPU) against --local
#   distvk     dist without the CPU workers' run
#   probe      hub + 4, 2 and 1 Vulkan workers, and with the hub's CPU pool at one thread (where a layer goes)
#   apilocal   api's --local run alone
#   apidistonly  api's hub + 4 Vulkan workers alone (MOEX_API_STREAMS=1,8: those stream counts)
#   (the api steps take each stream count's best of MOEX_API_REPS runs, default 1, MOEX_API_SERVE_ARGS adds
#   options to apilocal's and apidistonly's `serve`; with MOEX_BENCH_TCP=1 the
#   workers of every step but table3 join over the hub's --tcp-port instead of its WebSocket)
#   apidist    the API's hub + 4 Vulkan workers at 1 stream, then at 8, each run's hub and worker timings kept
#              (what a batched decode layer costs against a one-token layer)
#   table3     per-token time through moex-relay at RTT 0.5 / 2 / 10 ms, h = 1 / 2, hub on Vulkan + 4 CPU
#              workers, with the hub's and workers' timings for moex-sim
#   api        `moex-hub serve --backend vulkan --parallel 16` through the OpenAI API (bench/bench_api.py): 1, 2,
#              4, 8, 16 streams of 128 greedy tokens after 32-token prompts, --local (one stream against the
#              Vulkan CLI's decode) and hub + 4 Vulkan workers
# usage: bench/gpu/session.sh BIN_DIR STEP...
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd)
shift
. "$repo/bench/gpu/common.sh"

local_run() { # tag
    "$bin/moex-hub" --local --backend vulkan -m "$model" --prompt-tokens "$prompt" -n 128 --temp 0 --ignore-eos \
        --print-tokens > "$work/$1.out" 2> "$work/$1.err" || { tail -5 "$work/$1.err"; return 1; }
    echo "$1 $(stats < "$work/$1.err") tokens_fnv $(cksum < "$work/$1.out" | cut -d' ' -f1)"
}

# Caches emptied: ours (the VkPipelineCache) and the driver's. The GPU is
# kept busy for a few seconds first (with other caches, deleted too), so that
# the cold run does not also pay for the clocks coming up from idle.
clear_caches() { rm -rf "$MOEX_VK_CACHE" "$work/clock-cache" "$HOME/.cache/nvidia" "$HOME/.nv" 2>/dev/null || true; }
step_firstrun() {
    for i in 1 2; do
        MOEX_VK_CACHE="$work/clock-cache" "$bin/bench_vk" "$model" --only-kernels > /dev/null 2>&1 || true
        clear_caches
        cold0=$(date +%s.%N)
        local_run "cold_run_$i"
        echo "cold_run_${i}_wall_s $(python3 -c "print(round($(date +%s.%N) - $cold0, 1))")"
    done
    local_run warm_run_1
    local_run warm_run_2
}

step_bench() {
    "$bin/bench_vk" "$model" -p 512 -n 128 -r 3 --no-kernels 2>&1 | grep -E "tok_s|fnv" || echo "bench_vk failed"
}

# MOEX_BENCH_TCP=1: the workers join over the hub's --tcp-port (the TCP transport) instead of its WebSocket
worker_url() { # hub port, tcp port
    if [ "${MOEX_BENCH_TCP:-0}" = 1 ]; then echo "tcp://127.0.0.1:$2"; else echo "ws://127.0.0.1:$1/ws"; fi
}

# hub --backend vulkan + workers; $1: tag, $2: worker backend, $3: worker threads, then optionally
# $4: workers (4), $5: replicas (2), the rest: more hub options
dist_run() {
    tag=$1 wb=$2 wt=$3 nw=${4:-4} reps=${5:-2}
    shift 3; shift $(( $# < 2 ? $# : 2 ))
    p=$(port)
    tp=$(port)
    pids=""
    for i in $(seq 0 $((nw - 1))); do
        "$bin/moex-worker" --hub "$(worker_url "$p" "$tp")" --token b --model "$model" --backend "$wb" --threads "$wt" \
            --name "w$i" 2> "$work/$tag-w$i.err" &
        pids="$pids $!"
    done
    "$bin/moex-hub" --backend vulkan -m "$model" --port "$p" --tcp-port "$tp" --token b --replicas "$reps" --min-workers "$nw" \
        --wait-s 300 "$@" --prompt-tokens "$prompt" -n 128 --temp 0 --ignore-eos --print-tokens > "$work/$tag.out" \
        2> "$work/$tag.err" || tail -5 "$work/$tag.err"
    kill -TERM $pids 2>/dev/null; wait $pids 2>/dev/null || true
    echo "$tag $(stats < "$work/$tag.err") tokens_fnv $(cksum < "$work/$tag.out" | cut -d' ' -f1)"
    grep -h "hub layer timing\|hub gpu" "$work/$tag.err" | sed "s/^/$tag /"
    for i in $(seq 0 $((nw - 1))); do grep -h "worker timing" "$work/$tag-w$i.err" | sed "s/^/$tag w$i /"; done
    grep -A6 "^  worker " "$work/$tag.err" | sed "s/^/$tag /"
    keep "$work/$tag.err"
}

step_dist() {
    local_run dist_local
    dist_run dist_vk vulkan 1
    dist_run dist_cpu cpu 3
}

# dist without its CPU workers' run
step_distvk() {
    local_run dist_local
    dist_run dist_vk vulkan 1
}

# Where a distributed layer's time goes on one GPU: the same run with fewer GPU processes (one or two Vulkan
# workers) and with the hub's CPU thread pool cut to one thread (its spinning threads against the workers')
step_probe() {
    local_run probe_local
    dist_run probe_vk4 vulkan 1
    dist_run probe_vk4_hubt1 vulkan 1 4 2 --threads 1
    dist_run probe_vk2 vulkan 1 2 1
    dist_run probe_vk1 vulkan 1 1 1
    dist_run probe_cpu4_hubt1 cpu 3 4 2 --threads 1
}

# one run through relays: $1 rtt_ms, $2 h
relay_run() {
    p=$(port)
    pids=""
    tag="t3_rtt$1_h$2"
    for i in 0 1 2 3; do
        "$bin/moex-relay" --listen 0 --to "127.0.0.1:$p" --rtt-ms "$1" > "$work/relay$i.port" &
        pids="$pids $!"
    done
    sleep 0.3
    for i in 0 1 2 3; do
        rp=$(cut -d' ' -f4 < "$work/relay$i.port")
        "$bin/moex-worker" --hub "ws://127.0.0.1:$rp/ws" --token b --model "$model" --threads 3 --name "w$i" \
            2> "$work/$tag-w$i.err" &
        pids="$pids $!"
    done
    "$bin/moex-hub" --backend vulkan -m "$model" --port "$p" --token b --replicas 2 --hedge "$2" --min-workers 4 \
        --wait-s 300 --prompt-tokens 1,2,3,4 -n 33 --temp 0 --ignore-eos --print-tokens > "$work/$tag.out" \
        2> "$work/$tag.err" || tail -5 "$work/$tag.err"
    kill -TERM $pids 2>/dev/null; wait $pids 2>/dev/null || true
    echo "$tag $(stats < "$work/$tag.err")"
    grep -h "hub layer timing\|hub gpu" "$work/$tag.err" | sed "s/^/$tag /"
    for i in 0 1 2 3; do grep -h "worker timing" "$work/$tag-w$i.err" | sed "s/^/$tag w$i /"; done
}

step_table3() {
    for rtt in 0.5 2 10; do
        for h in 1 2; do relay_run "$rtt" "$h"; done
    done
}

# bench_api.py's table rows "| streams | tok/s | x one | TTFT med | TTFT max | per-stream tok/s |" and its
# "one stream: API decode X tok/s, CLI decode Y tok/s: API/CLI = Z" as key value lines; $1: tag
api_keys() {
    awk -F'|' -v t="$1" '
        /^\| [0-9]+ \|/ { for (i = 2; i <= 7; i++) gsub(/ /, "", $i)
                           s = t "_s" $2
                           print s "_tok_s " $3; print s "_x_one " $4; print s "_ttft_med_s " $5
                           print s "_ttft_max_s " $6; print s "_stream_tok_s " $7 }
        /^one stream: API decode/ { split($0, w, " ")
                                    print t "_api_decode_tok_s " w[5]; print t "_cli_decode_tok_s " w[9]
                                    print t "_api_over_cli " w[13] }'
}

# $1: tag, then bench_api.py's arguments (MOEX_API_REPS=N: each stream count's best of N runs)
api_run() {
    tag=$1
    shift
    if python3 "$repo/bench/bench_api.py" --streams 1,2,4,8,16 --tokens 128 --prompt 32 --reps "${MOEX_API_REPS:-1}" "$@" \
        > "$work/$tag.md" \
        2> "$work/$tag.err"; then
        api_keys "$tag" < "$work/$tag.md"
    else
        echo "$tag failed"
        tail -5 "$work/$tag.err"
    fi
    keep "$work/$tag.md" "$work/$tag.err"
}

# api's hub + 4 Vulkan workers alone (MOEX_API_STREAMS: the stream counts, default 1,2,4,8,16)
step_apidistonly() {
    serve="$bin/moex-hub serve -m $model --backend vulkan --parallel 16 --ctx 512 --port {port} ${MOEX_API_SERVE_ARGS:-}"
    w() { echo "$bin/moex-worker --hub $(worker_url {port} {tcp_port}) --token b --model $model --backend vulkan --threads 1 --name w$1"; }
    api_run api_dist --hub "$serve --tcp-port {tcp_port} --token b --replicas 2 --min-workers 4 --wait-s 300" \
        --streams "${MOEX_API_STREAMS:-1,2,4,8,16}" \
        --worker "$(w 0)" --worker "$(w 1)" --worker "$(w 2)" --worker "$(w 3)"
}

step_api() {
    serve="$bin/moex-hub serve -m $model --backend vulkan --parallel 16 --ctx 512 --port {port}"
    cli="$bin/moex-hub --local --backend vulkan -m $model --prompt-tokens {prompt} -n {n} --temp 0 --ignore-eos"
    api_run api_local --hub "$serve --local" --cli "$cli"
    step_apidistonly
}

# api's --local run alone
step_apilocal() {
    api_run api_local --hub "$bin/moex-hub serve -m $model --backend vulkan --parallel 16 --ctx 512 --port {port} --local ${MOEX_API_SERVE_ARGS:-}" \
        --cli "$bin/moex-hub --local --backend vulkan -m $model --prompt-tokens {prompt} -n {n} --temp 0 --ignore-eos"
}

step_apidist() {
    w() { echo "$bin/moex-worker --hub $(worker_url {port} {tcp_port}) --token b --model $model --backend vulkan --threads 1 --name w$1"; }
    for n in ${MOEX_APIDIST_STREAMS:-1 8}; do
        python3 "$repo/bench/bench_api.py" --streams $n --tokens 64 --prompt 32 --logs "$work/apidist$n" \
            --hub "$bin/moex-hub serve -m $model --backend vulkan --parallel 16 --ctx 512 --port {port} --tcp-port {tcp_port} --token b --replicas 2 --min-workers 4 --wait-s 300" \
            --worker "$(w 0)" --worker "$(w 1)" --worker "$(w 2)" --worker "$(w 3)" \
            | grep '^| [0-9]' | sed "s/^/apidist$n /"
        grep -h "hub layer timing\|hub gpu\|hub metrics" "$work/apidist$n/hub.err" | sed "s/^/apidist$n /"
        for i in 0 1 2 3; do grep -h "worker timing" "$work/apidist$n/w$i.err" | sed "s/^/apidist$n w$i /"; done
        [ -n "${OUT:-}" ] && cp -r "$work/apidist$n" "$OUT"/ 2>/dev/null || true
    done
}

run_steps "$@"
