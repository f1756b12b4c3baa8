#!/usr/bin/env bash
# Installs what MoEx needs on Debian 12 (only the packages that are missing),
# then configures and builds into ./build (or $MOEX_BUILD).
#   ./setup.sh            install + build
#   ./setup.sh --deps     install only
set -euo pipefail
cd "$(dirname "$0")"
web/setup_web.sh   # emscripten, chromium, node: the browser worker and its tests

PKGS=(build-essential cmake pkg-config git
      liblz4-dev libxxhash-dev libwebsockets-dev libcjson-dev libssl-dev
      libvulkan-dev glslc mesa-vulkan-drivers
      clang libclang-rt-14-dev python3 python3-numpy python3-websockets time bc)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" = "--deps" ] && exit 0

BUILD=${MOEX_BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
echo "setup: built into $BUILD/bin"
