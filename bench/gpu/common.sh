# What the GPU machine's benchmark scripts share (sourced, not run): the
# environment over BIN_DIR ($bin: the unpacked carry of bench/vk/pack_carry.sh),
# the CLI's stats line parsed, and the Qwen3-30B-A3B-shaped Q4_K_M model.
# Sets: repo bin model work; reads MOEX_BENCH_MODEL, MOEX_BENCH_WORK, MOEX_BENCH_SEED.
model=${MOEX_BENCH_MODEL:-/tmp/q30.gguf}
work=${MOEX_BENCH_WORK:-/tmp/moex-gpu}
mkdir -p "$work"
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MOEX_VK_CACHE=${MOEX_VK_CACHE:-$work/vk-cache}
export MOEX_LOG=${MOEX_LOG:-warn}
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ] && ! ls /usr/share/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$nvidia_icd
fi
# "moex-hub: load ... | prompt N tokens X tok/s | decode M tokens Y tok/s ..." -> "X Y"
stats() { sed -nE 's/.*prompt [0-9]+ tokens ([0-9.]+) tok\/s \| decode [0-9]+ tokens ([0-9.]+) tok\/s.*/\1 \2/p'; }

step_gen() {
    if [ ! -f "$model" ]; then
        t0=$(date +%s)
        "$bin/moex-gguf" gen --arch qwen3moe --preset qwen3-30b-a3b --vocab "$repo/tests/data/vocab/ggml-vocab-qwen2.gguf" \
            --type q4_K_M --seed "${MOEX_BENCH_SEED:-7}" --quiet -o "$model"
        echo "gen_s $(( $(date +%s) - t0 ))"
    fi
    echo "model_bytes $(stat -c %s "$model")"
}
