#!/usr/bin/env bash
# Installs what the browser worker's build and tests need on Debian 12, only
# the packages that are missing: emscripten (the WASM module), chromium
# (headless WebGPU on SwiftShader for tests/web) and node (emscripten's
# runtime). No npm packages: the page uses no third-party JavaScript.
#   web/setup_web.sh
set -euo pipefail

PKGS=(emscripten chromium nodejs python3 python3-websockets)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup_web: everything is installed"
  exit 0
fi
echo "setup_web: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup_web: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
