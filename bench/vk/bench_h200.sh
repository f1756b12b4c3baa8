#!/bin/sh
# Vulkan backend vs llama.cpp's Vulkan backend on one GPU machine, in one run:
# correctness on generated test models (the lavapipe suite, on this GPU), then
# pp512 / tg128 / tg128 after a 512-token prompt and per-kernel bandwidth on a
# Qwen3-30B-A3B-shaped Q4_K_M model generated here (~17 GB, reused if present),
# the distributed hub's per-layer overhead (bench_vk_dist) and llama.cpp on the same file.
#
# usage: bench/vk/bench_h200.sh BIN_DIR [MODEL]
#   BIN_DIR holds moex-gguf, bench_vk, test_vk_* (a build's bin/ and tests/, or
#   the unpacked carry of the device tool), and optionally llama_bench_vk with
#   llvk.tar.xz (llama.cpp's Vulkan libraries from npm @node-llama-cpp/linux-x64-vulkan).
# Loaders: when no libvulkan.so.1 is installed, <repo>/.gl/*.deb are unpacked
# (see the device tool's README). Output: "key value" lines.
# MOEX_BENCH_QUICK=1 skips the correctness checks (step 1). Step 3 first runs
# a short bench with --vk-tune profile=1: GPU timestamps per op ("vkprof" lines).
set -eu
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=$(cd "$1" && pwd)
model=${2:-/tmp/q30.gguf}
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MOEX_VK_CACHE=${MOEX_VK_CACHE:-/tmp/moex-vk-cache}

if ! ldconfig -p | grep -q 'libvulkan.so.1 '; then
    for f in "$repo"/.gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ] && ! ls /usr/share/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$nvidia_icd
fi
echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null | sed 's/^/gpu /' || true
echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"

# 1. correctness on this GPU (the same checks as the lavapipe suite)
mkdir -p /tmp/vkm
if [ "${MOEX_BENCH_QUICK:-0}" = 0 ]; then
"$bin/moex-gguf" gen --arch qwen3moe --preset test --vocab "$repo/tests/data/vocab/ggml-vocab-llama-spm.gguf" \
    --type q4_K_M --seed 1 --quiet -o /tmp/vkm/qwen3moe.gguf
"$bin/moex-gguf" gen --arch llama --preset test --vocab "$repo/tests/data/vocab/ggml-vocab-llama-spm.gguf" \
    --type mixed --seed 1 --quiet -o /tmp/vkm/llama.gguf
for t in "test_vk_layout" "test_vk_matmul" "test_vk_matmul --no-subgroup" "test_vk_ops norm" "test_vk_ops rope" \
         "test_vk_ops attention" "test_vk_ops router" "test_vk_ops experts" "test_vk_ops fused" "test_vk_ops decode" \
         "test_vk_experts_mv" "test_vk_coop" "test_vk_coop_forward /tmp/vkm/qwen3moe.gguf" \
         "test_vk_forward /tmp/vkm/qwen3moe.gguf" "test_vk_forward /tmp/vkm/llama.gguf --loose" \
         "test_vk_dist /tmp/vkm/qwen3moe.gguf" "test_vk_batch /tmp/vkm/qwen3moe.gguf" "test_vk_batch /tmp/vkm/llama.gguf" \
         "test_worker_vk /tmp/vkm/qwen3moe.gguf"; do
    if $bin/$t > /tmp/vkm/log 2>&1; then echo "test ok: $t"; else echo "test FAILED: $t"; tail -n 15 /tmp/vkm/log; fi
done
grep -h "teacher-forced\|greedy" /tmp/vkm/log || true
fi

# 2. the Qwen3-30B-A3B-shaped model
if [ ! -f "$model" ]; then
    t0=$(date +%s)
    "$bin/moex-gguf" gen --arch qwen3moe --preset qwen3-30b-a3b --vocab "$repo/tests/data/vocab/ggml-vocab-qwen2.gguf" \
        --type q4_K_M --seed 1 --quiet -o "$model"
    echo "gen_s $(( $(date +%s) - t0 ))"
fi
echo "model_bytes $(stat -c %s "$model")"

# 3. where a token's GPU time goes (timestamps slow it a little), then moex
#    (Vulkan) and llama.cpp (Vulkan), same file, same measurements
"$bin/bench_vk" "$model" --vk-tune profile=1 -p 512 -n 32 -r 1 --no-kernels 2>&1 | grep -v "^bench_vk: rep" |
    sed 's/^\([a-z]\)/profiled_\1/; s/^profiled_vkprof/vkprof/'
"$bin/bench_vk" "$model" -p 512 -n 128 -r 3
# the same decode with a 32768-token context (the decode attention runs only the splits the position needs)
"$bin/bench_vk" "$model" -p 512 -n 128 -r 3 --ctx 32768 --no-kernels 2>&1 | grep "tok_s\|fnv" | sed 's/^/ctx32768_/'
# 4. the distributed hub's per-layer GPU overhead (experts through an in-process executor)
"$bin/bench_vk_dist" "$model" -p 16 -n 64 -r 3 2>&1 | grep -v "^bench_vk_dist: rep" || echo "bench_vk_dist failed"
# 5. llama.cpp, same file
if [ -x "$bin/llama_bench_vk" ] && [ -f "$bin/llvk.tar.xz" ]; then
    mkdir -p /tmp/llvk
    tar -xJf "$bin/llvk.tar.xz" -C /tmp/llvk
    "$bin/llama_bench_vk" /tmp/llvk "$model" -p 512 -n 128 -r 3 || echo "llama_bench_vk failed"
fi
