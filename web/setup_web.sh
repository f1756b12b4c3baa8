#!/usr/bin/env bash
# Installs what the browser worker's build and tests need on Debian 12, only
# the packages that are missing: emscripten (the WASM module), chromium
# (headless WebGPU on SwiftShader for tests/web) and node (emscripten's
# runtime). No npm packages: the page uses no third-party JavaScript.
#   web/setup_web.sh
set -euo pipefail

PKGS=(emscripten chromium nodejs python3 python3-websockets)

"$(dirname "$0")/../setup.sh" --packages "${PKGS[@]}"
