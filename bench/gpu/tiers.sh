#!/bin/sh
# Experts off the GPU (issue 33): MoEx and llama.cpp CUDA on the same file, in
# one call of the GPU machine. Prints "key value" lines.
# usage: bench/gpu/tiers.sh BIN_DIR STEP...
#   BIN_DIR: the unpacked carry of bench/vk/pack_carry.sh (moex-hub, moex-gguf, bench_vk, bench_membw)
# steps:
#   llama   builds llama.cpp's CUDA llama-bench from $LLAMA_SRC (a tarball of the source in the npm package
#           node-llama-cpp's llama/gitRelease.bundle) into $work/llama (reused when built)
#   gen     the Qwen3-30B-A3B-shaped Q4_K_M model (reused when present)
#   membw   the RAM's read bandwidth over every core (bench_membw): the floor of experts kept in RAM
#   cpumoe  every expert in RAM: llama-bench --n-cpu-moe 48 against moex-hub --local --backend vulkan --cpu-moe
#   gpu     the whole model on the GPU: llama-bench -ngl 99 -fa 1 against the CLI and bench_vk
#   clocks  the GPU's SM clock through --cpu-moe and distributed runs (cold, polling, warmed up)
#   spinab  --cpu-moe blocking on the fence against polling it first, paired
#   gpuspin the whole model on the GPU (CLI, bench_vk) blocking against polling, paired
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd)
shift
. "$repo/bench/gpu/common.sh"
threads=${MOEX_BENCH_THREADS:-$(nproc)}
reps=${MOEX_BENCH_REPS:-3}
step_membw() { "$bin/bench_membw" -g 8 -r 5; }

moex_cli() { # tag prompt-tokens extra flags...
    tag=$1 p=$2
    shift 2
    "$bin/moex-hub" --local --backend vulkan -m "$model" --prompt-tokens "$p" -n 128 --temp 0 --ignore-eos \
        --print-tokens -t "$threads" "$@" > "$work/$tag.out" 2> "$work/$tag.err" || { tail -5 "$work/$tag.err"; return 1; }
    echo "$tag $(stats < "$work/$tag.err") tokens_cksum $(cksum < "$work/$tag.out" | cut -d' ' -f1)"
    grep -h "^hub gpu" "$work/$tag.err" | sed "s/^/$tag /"
}

step_cpumoe() {
    echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
    [ -x "$llama_bench" ] && "$llama_bench" -m "$model" -ngl 99 -fa 1 --n-cpu-moe 48 -t "$threads" -p 512 -n 128 \
        -r "$reps" 2>/dev/null | llama_rows | sed 's/^/llama_cpumoe48 /'
    for i in $(seq "$reps"); do
        moex_cli "moex_cpumoe_p512_$i" "$prompt" --cpu-moe
        moex_cli "moex_cpumoe_p1_$i" 1 --cpu-moe
    done
}

step_gpu() {
    [ -x "$llama_bench" ] && "$llama_bench" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -r "$reps" 2>/dev/null |
        llama_rows | sed 's/^/llama_gpu /'
    for i in $(seq "$reps"); do
        moex_cli "moex_gpu_p512_$i" "$prompt"
        moex_cli "moex_gpu_p1_$i" 1
    done
    "$bin/bench_vk" "$model" -p 512 -n 128 -r "$reps" --no-kernels 2>/dev/null | grep -E '^(pp|tg)' || true
}

# Whether the GPU's clocks explain a slow per-layer segment: the SM clock sampled every 100 ms (nvidia-smi)
# through --cpu-moe runs after a 1-token prompt: blocking on fences (spin_us=0), polling 2 ms, right
# after bench_vk's kernels in another process, and after a 512-token prompt; then hub + one Vulkan worker on
# the same GPU, as is and polling. Prints each run's median SM clock while it ran.
step_clocks() {
    nvidia-smi --query-gpu=clocks.sm,utilization.gpu --format=csv,noheader,nounits -lms 100 > "$work/clocks.log" 2>&1 &
    smi=$!
    during() { # tag command...: the run, then its median clock
        tag=$1
        shift
        t0=$(wc -l < "$work/clocks.log")
        "$@"
        t1=$(wc -l < "$work/clocks.log")
        sed -n "$((t0 + 1)),${t1}p" "$work/clocks.log" | cut -d, -f1 | sort -n |
            awk -v t="$tag" '{v[NR] = $1} END {if (NR) print t "_sm_mhz_median " v[int((NR + 1) / 2)] " min " v[1] " max " v[NR] " samples " NR}'
    }
    during cold moex_cli clk_p1 1 --cpu-moe --vk-tune spin_us=0
    during spin moex_cli clk_p1_spin 1 --cpu-moe --vk-tune spin_us=2000
    "$bin/bench_vk" "$model" --only-kernels > /dev/null 2>&1 || true
    during after_kernels moex_cli clk_p1_warm 1 --cpu-moe --vk-tune spin_us=0
    during p512 moex_cli clk_p512 "$prompt" --cpu-moe --vk-tune spin_us=0
    for spin in 0 2000; do
        hp=$(port)
        "$bin/moex-worker" --hub "ws://127.0.0.1:$hp/ws" --token b --model "$model" --backend vulkan --threads 1 \
            --vk-tune "spin_us=$spin" --name w0 2> "$work/clk_w$spin.err" &
        w=$!
        during "dist_spin$spin" "$bin/moex-hub" --backend vulkan -m "$model" --port "$hp" --token b --replicas 1 \
            --vk-tune "spin_us=$spin" --min-workers 1 --wait-s 300 --prompt-tokens 1 -n 64 --temp 0 --ignore-eos \
            > /dev/null 2> "$work/clk_d$spin.err"
        kill -TERM $w; wait $w 2>/dev/null || true
        echo "dist_spin$spin $(stats < "$work/clk_d$spin.err")"
        grep -h "hub layer timing\|^hub gpu" "$work/clk_d$spin.err" | sed "s/^/dist_spin$spin /"
        grep -h "worker timing" "$work/clk_w$spin.err" | sed "s/^/dist_spin$spin w0 /"
    done
    kill $smi 2>/dev/null || true
}

# The fence's wait in the CPU tier, paired: --cpu-moe after a 512-token and a 1-token prompt, blocking at
# once (--vk-tune spin_us=0) against polling 1000 us first (spin_us=1000), alternating, $reps times
step_spinab() {
    for i in $(seq "$reps"); do
        for len in 512 1; do   # (moex_cli sets $p)
            tokens=$prompt
            [ "$len" = 1 ] && tokens=1
            moex_cli "ab_p${len}_block_$i" "$tokens" --cpu-moe --vk-tune spin_us=0
            moex_cli "ab_p${len}_spin_$i" "$tokens" --cpu-moe --vk-tune spin_us=1000
        done
    done
}

# The whole model on the GPU, the fence's wait paired: the CLI (512-token prompt + 128) blocking at once
# (spin_us=0) against polling 5 ms first (the default), alternating, $reps times; then bench_vk both ways
step_gpuspin() {
    for i in $(seq "$reps"); do
        moex_cli "gs_block_$i" "$prompt" --vk-tune spin_us=0
        moex_cli "gs_spin_$i" "$prompt" --vk-tune spin_us=5000
    done
    for t in spin_us=0 spin_us=5000; do
        "$bin/bench_vk" "$model" -p 512 -n 128 -r 2 --no-kernels --vk-tune "$t" 2>/dev/null | grep -E '^(pp|tg)' |
            sed "s/^/bench_vk_$t /"
    done
}

run_steps "$@"
