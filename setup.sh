#!/usr/bin/env bash
# Installs what MoEx needs on Debian 12 (only the packages that are missing),
# then configures and builds into ./build (or $MOEX_BUILD).
#   ./setup.sh                  install + build
#   ./setup.sh --deps           install only
#   ./setup.sh --packages P...  install only those Debian packages, where missing (the other setup scripts' way)
set -euo pipefail
cd "$(dirname "$0")"

# Installs the Debian packages among "$@" that are not installed (apt-get, as root or through sudo).
install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "setup: installing ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [ "${1:-}" = "--packages" ]; then
  shift
  install_missing "$@"
  exit 0
fi
web/setup_web.sh   # emscripten, chromium, node: the browser worker and its tests

PKGS=(build-essential cmake pkg-config git
      liblz4-dev libxxhash-dev libwebsockets-dev libcjson-dev libssl-dev
      libvulkan-dev glslc mesa-vulkan-drivers
      clang libclang-rt-14-dev python3 python3-numpy python3-websockets python3-jinja2 time bc)

install_missing "${PKGS[@]}"
[ "${1:-}" = "--deps" ] && exit 0

BUILD=${MOEX_BUILD:-build}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
echo "setup: built into $BUILD/bin"
