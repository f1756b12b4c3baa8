#!/bin/sh
# Packs what bench/vk/bench_h200.sh needs from a build into one tarball for the
# device machine: BUILD/carry/moex.tar.xz (flat: moex-gguf, moex-hub, bench_vk,
# bench_vk_dist, bench_decode, test_vk_*, libxxhash.so.0 and, when present in
# LLAMA_DIR (default build-vkp2/carry), llama_bench_vk + llvk.tar.xz).
# usage: bench/vk/pack_carry.sh BUILD [LLAMA_DIR]
# On the device: mkdir -p /tmp/b && tar -xJf BUILD/carry/moex.tar.xz -C /tmp/b
set -eu
build=$1
llama=${2:-build-vkp2/carry}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$build"/bin/moex-gguf "$build"/bin/moex-hub "$build"/bin/bench_vk "$stage"/
for f in "$build"/bin/bench_vk_dist "$build"/bin/bench_decode "$build"/tests/test_vk_*; do
    [ -x "$f" ] && cp "$f" "$stage"/
done
cp -L "$(ldconfig -p | awk '/libxxhash.so.0 / {print $NF; exit}')" "$stage"/libxxhash.so.0
[ -f "$llama/llama_bench_vk" ] && cp "$llama/llama_bench_vk" "$llama/llvk.tar.xz" "$stage"/
mkdir -p "$build"/carry
XZ_OPT="-T0 -6" tar -cJf "$build"/carry/moex.tar.xz -C "$stage" .
ls -l "$build"/carry/moex.tar.xz
