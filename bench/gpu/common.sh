# What the GPU machine's benchmark scripts share (sourced, not run): the
# environment over BIN_DIR ($bin: the unpacked carry of bench/vk/pack_carry.sh),
# the CLI's stats line parsed, and the Qwen3-30B-A3B-shaped Q4_K_M model.
# Sets: repo bin model work; reads MOEX_BENCH_MODEL, MOEX_BENCH_WORK, MOEX_BENCH_SEED.
model=${MOEX_BENCH_MODEL:-/tmp/q30.gguf}
work=${MOEX_BENCH_WORK:-/tmp/moex-gpu}
mkdir -p "$work"
# the prompt of every step: token ids 1..N
prompt=$(seq -s, 1 ${MOEX_BENCH_PROMPT:-512})
export LD_LIBRARY_PATH="$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export MOEX_VK_CACHE=${MOEX_VK_CACHE:-$work/vk-cache}
export MOEX_LOG=${MOEX_LOG:-warn}
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ] && ! ls /usr/share/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$nvidia_icd
fi
# "moex-hub: load ... | prompt N tokens X tok/s | decode M tokens Y tok/s ..." -> "X Y"
stats() { sed -nE 's/.*prompt [0-9]+ tokens ([0-9.]+) tok\/s \| decode [0-9]+ tokens ([0-9.]+) tok\/s.*/\1 \2/p'; }

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# copies files to $OUT, when set (the device tool brings them back)
keep() { [ -n "${OUT:-}" ] && cp "$@" "$OUT"/ 2>/dev/null || true; }

step_gen() {
    if [ ! -f "$model" ]; then
        t0=$(date +%s)
        "$bin/moex-gguf" gen --arch qwen3moe --preset qwen3-30b-a3b --vocab "$repo/tests/data/vocab/ggml-vocab-qwen2.gguf" \
            --type q4_K_M --seed "${MOEX_BENCH_SEED:-7}" --quiet -o "$model"
        echo "gen_s $(( $(date +%s) - t0 ))"
    fi
    echo "model_bytes $(stat -c %s "$model")"
}

# llama.cpp's CUDA llama-bench, built by step_llama
llama_bench=$work/llama/build/bin/llama-bench
# llama-bench's markdown rows -> "pp512 X" / "tg128 Y" (t/s without the +- part)
llama_rows() { awk -F'|' '/ (pp|tg)[0-9]+ \|/{gsub(/ /,"",$(NF-2)); split($(NF-1),v," "); print $(NF-2), v[1]}'; }

# builds llama.cpp's CUDA llama-bench from $LLAMA_SRC (a tarball of the source in the npm package
# node-llama-cpp's llama/gitRelease.bundle) into $work/llama (reused when built)
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

# The machine (date, GPUs and how they are linked, CPU), then each named step_* with its time in seconds.
run_steps() {
    echo "date $(date -u +%Y-%m-%dT%H:%MZ)"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu /' || true
    [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -gt 1 ] && nvidia-smi topo -m 2>/dev/null | sed 's/^/topo /'
    echo "cpu $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //') x $(nproc)"
    for s in "$@"; do
        t0=$(date +%s)
        "step_$s"
        echo "step_${s}_s $(( $(date +%s) - t0 ))"
    done
}
