#!/bin/sh
# Installs what tests/hub/test_api.py needs beyond the build: Node.js with npm
# and Chromium (Debian packages, when missing), then the official openai
# client from the npm registry into tests/hub/api/node_modules (git-ignored),
# at the version package.json pins.
set -eu
cd "$(dirname "$0")"
missing=""
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
if [ -n "$missing" ]; then
  echo "setup: installing$missing"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root (or sudo) to install:$missing" >&2; exit 1; }
    SUDO=sudo
  fi
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
npm install --no-audit --no-fund --loglevel=error
node -e "import('openai').then(() => console.log('setup: openai ' + require('./node_modules/openai/package.json').version + ' ready'))"
