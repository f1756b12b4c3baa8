#!/bin/sh
# Packs what the GPU benchmarks need from a build into one tarball for the
# device machine (a bare image without this project's libraries):
# BUILD/carry/moex.tar.xz, flat: the binaries of bin/, the Vulkan test
# programs of tests/, and the shared libraries they need that are not part of
# the C runtime (libwebsockets, cJSON, lz4, xxhash, OpenSSL, ...). And, when
# present in LLAMA_DIR (default build-vkp2/carry), llama_bench_vk + llvk.tar.xz.
# MOEX_CARRY="moex-hub moex-worker ..." packs only those programs (each embeds
# ~9 MB of SPIR-V, and the device's carry is bounded).
# usage: bench/vk/pack_carry.sh BUILD [LLAMA_DIR]
# On the device: mkdir -p /tmp/b && tar -xJf BUILD/carry/moex.tar.xz -C /tmp/b
#                && export LD_LIBRARY_PATH=/tmp/b
set -eu
build=$1
llama=${2:-build-vkp2/carry}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for f in "$build"/bin/* "$build"/tests/test_vk_*; do
    [ -f "$f" ] && [ -x "$f" ] || continue
    case " ${MOEX_CARRY:-$(basename "$f")} " in *" $(basename "$f") "*) cp "$f" "$stage"/ ;; esac
done
# every library a binary needs, but the C runtime's own (the image has those)
for f in "$stage"/*; do ldd "$f" 2>/dev/null; done | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so' |
    while read -r lib; do cp -L "$lib" "$stage"/; done
[ -f "$llama/llama_bench_vk" ] && cp "$llama/llama_bench_vk" "$llama/llvk.tar.xz" "$stage"/
mkdir -p "$build"/carry
XZ_OPT="-T0 -6" tar -cJf "$build"/carry/moex.tar.xz -C "$stage" .
ls -l "$build"/carry/moex.tar.xz
