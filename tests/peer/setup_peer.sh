#!/bin/sh
# Sets up llama.cpp as a peer in <repo>/.peer (gitignored):
#   - the prebuilt CPU llama.cpp of the node-llama-cpp npm package
#     (@node-llama-cpp/linux-x64: libllama + libggml*, one CPU backend per ISA),
#   - its headers, from the llama.cpp source bundle node-llama-cpp ships,
#   - its chat templates (models/templates/*.jinja, for tests/hub/test_templates.py)
#     in .peer/templates/models/templates, from the same bundle,
#   - .peer/bin/llama_peer (tests/peer/llama_peer.c) linked against them,
#   - .peer/VERSION: the package and llama.cpp release it reports,
#   - .peer/templates: the bundle's chat templates (tests/hub/test_templates.py),
#   - .peer/vocab/ggml-vocab-gpt-oss.gguf: gpt-oss's tokenizer, made by tools/make_o200k_vocab.py from the
#     o200k ranks of the npm package js-tiktoken (8 MB of derived data, so not in the repository).
# Idempotent: does nothing when llama_peer is newer than its source.
# Exit 0 when ready, 77 when the peer cannot be set up here (no npm, no
# registry, not x86-64 Linux): callers treat that as "skip".
# Env: MOEX_PEER_DIR (default <repo>/.peer), NODE_LLAMA_CPP_VERSION (3.22.1).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
peer=${MOEX_PEER_DIR:-$repo/.peer}
version=${NODE_LLAMA_CPP_VERSION:-3.22.1}
bin=$peer/bin/llama_peer
src=$here/llama_peer.c

# MOEX_REQUIRE_PEER=1 (CI) makes an unavailable peer a failure, not a skip.
skip() {
    echo "setup_peer: $*; llama.cpp peer unavailable" >&2
    [ "${MOEX_REQUIRE_PEER:-0}" = 1 ] && exit 1
    exit 77
}

vocab=$peer/vocab/ggml-vocab-gpt-oss.gguf
tiktoken=${JS_TIKTOKEN_VERSION:-1.0.21}
if [ -x "$bin" ] && [ "$bin" -nt "$src" ] && [ -f "$peer/VERSION" ] && [ -d "$peer/templates" ] && [ -f "$vocab" ]; then
    exit 0
fi

[ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] || skip "only x86-64 Linux binaries are used"
command -v npm >/dev/null 2>&1 || skip "npm not found"
command -v git >/dev/null 2>&1 || skip "git not found (needed to read llama.cpp headers from the bundle)"
cc=${CC:-cc}
command -v "$cc" >/dev/null 2>&1 || skip "no C compiler"

mkdir -p "$peer/bin"
mods=$peer/node_modules
bins=$mods/@node-llama-cpp/linux-x64/bins/linux-x64
if [ ! -d "$bins" ] || [ ! -f "$mods/node-llama-cpp/llama/gitRelease.bundle" ]; then
    echo "setup_peer: npm install node-llama-cpp@$version (prebuilt llama.cpp, CPU)" >&2
    # --ignore-scripts: no postinstall downloads or builds; --omit=optional:
    # none of the CUDA/Vulkan/other-OS binaries, only the one named here.
    timeout 600 npm install --prefix "$peer" --ignore-scripts --omit=optional --no-audit --no-fund \
        "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version" >&2 || skip "npm install failed (registry unreachable?)"
fi
[ -d "$bins" ] || skip "the package has no linux-x64 binaries"

# gpt-oss's vocabulary (o200k_base + the harmony tokens), as llama.cpp's converter writes it
ranks=$mods/js-tiktoken/dist/ranks/o200k_base.js
if [ ! -f "$vocab" ]; then
    if [ ! -f "$ranks" ]; then
        echo "setup_peer: npm install js-tiktoken@$tiktoken (the o200k ranks)" >&2
        timeout 300 npm install --prefix "$peer" --ignore-scripts --omit=optional --no-audit --no-fund \
            "js-tiktoken@$tiktoken" >&2 ||
            skip "npm install js-tiktoken failed (registry unreachable?)"
    fi
    mkdir -p "$peer/vocab"
    python3 "$repo/tools/make_o200k_vocab.py" "$ranks" "$vocab.tmp" >&2 && mv "$vocab.tmp" "$vocab" ||
        skip "making gpt-oss's vocabulary failed"
fi

# Headers and chat templates: exactly the llama.cpp revision the binaries were built from.
inc=$peer/llama.cpp
tpl=$peer/templates
if [ ! -f "$inc/include/llama.h" ] || [ ! -d "$tpl" ]; then
    tmp=$peer/bundle.git
    rm -rf "$tmp"
    git init -q --bare "$tmp"
    git -C "$tmp" fetch -q "$mods/node-llama-cpp/llama/gitRelease.bundle" HEAD
    if [ ! -f "$inc/include/llama.h" ]; then
        rm -rf "$inc"
        mkdir -p "$inc"
        git -C "$tmp" archive FETCH_HEAD include ggml/include | tar -x -C "$inc"
        git -C "$tmp" rev-parse FETCH_HEAD > "$inc/COMMIT"
    fi
    if [ ! -d "$tpl" ]; then
        # a bundle without models/templates leaves the folder empty: test_templates.py then skips
        rm -rf "$tpl.tmp"
        mkdir -p "$tpl.tmp"
        git -C "$tmp" archive FETCH_HEAD models/templates 2>/dev/null | tar -x -C "$tpl.tmp" ||
            echo "setup_peer: no chat templates in the llama.cpp bundle" >&2
        mv "$tpl.tmp" "$tpl"
    fi
    rm -rf "$tmp"
fi

libllama=$(cd "$bins" && ls libllama.*so* 2>/dev/null | grep -v common | head -n 1)
libggml=$(cd "$bins" && ls libggml.*so* 2>/dev/null | head -n 1)
[ -n "$libllama" ] && [ -n "$libggml" ] || skip "libllama/libggml not found in $bins"

"$cc" -O2 -std=c11 -Wall -I"$inc/include" -I"$inc/ggml/include" -DPEER_BACKEND_DIR="\"$bins\"" \
    "$src" -o "$bin.tmp" -L"$bins" "-l:$libllama" "-l:$libggml" -l:libggml-base.so -Wl,-rpath,"$bins" -lm \
    || skip "compiling llama_peer.c failed"
mv "$bin.tmp" "$bin"

release=$(sed -n 's/.*"tag": *"\([^"]*\)".*/\1/p' "$mods/node-llama-cpp/llama/llama.cpp.info.json" 2>/dev/null || true)
pkg=$(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$mods/node-llama-cpp/package.json" | head -n 1)
{
    echo "node-llama-cpp $pkg"
    echo "llama.cpp release ${release:-unknown} (ggml-org/llama.cpp, as packaged by node-llama-cpp)"
    echo "llama.cpp bundle commit $(cat "$inc/COMMIT")"
    echo "libraries $bins"
} > "$peer/VERSION"
cat "$peer/VERSION" >&2
