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
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd)
shift
. "$repo/bench/gpu/common.sh"
threads=${MOEX_BENCH_THREADS:-$(nproc)}
reps=${MOEX_BENCH_REPS:-3}
llama_bench=$work/llama/build/bin/llama-bench
prompt=$(seq -s, 1 512)
# llama-bench's markdown rows -> "pp512 X" / "tg128 Y" (t/s without the +- part)
llama_rows() { awk -F'|' '/ pp512 | tg128 /{gsub(/ /,"",$(NF-2)); split($(NF-1),v," "); print $(NF-2), v[1]}'; }

step_llama() {
    [ -x "$llama_bench" ] && { echo "llama_build_s 0 (reused)"; return; }
    t0=$(date +%s)
    rm -rf "$work/llama" && mkdir -p "$work/llama" && tar -xJf "$LLAMA_SRC" -C "$work/llama" --strip-components=1
    (cd "$work/llama" && cmake -B build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release > "$work/llama-cmake.log" 2>&1 &&
     cmake --build build --target llama-bench > "$work/llama-build.log" 2>&1) ||
        { tail -20 "$work/llama-cmake.log" "$work/llama-build.log"; return 1; }
    echo "llama_build_s $(( $(date +%s) - t0 ))"
}

step_membw() { "$bin/bench_membw" -g 8 -r 5; }

moex_cli() { # tag prompt-tokens extra flags...
    tag=$1 p=$2
    shift 2
    "$bin/moex-hub" --local --backend vulkan -m "$model" --prompt-tokens "$p" -n 128 --temp 0 --ignore-eos \
        --print-tokens -t "$threads" "$@" > "$work/$tag.out" 2> "$work/$tag.err" || { tail -5 "$work/$tag.err"; return 1; }
    echo "$tag $(stats < "$work/$tag.err") tokens_cksum $(cksum < "$work/$tag.out" | cut -d' ' -f1)"
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

for s in "$@"; do
    echo "== $s"
    "step_$s"
done
