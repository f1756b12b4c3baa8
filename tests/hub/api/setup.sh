#!/bin/sh
# Installs what tests/hub/test_api.py needs beyond the build: Node.js with npm
# and Chromium (Debian packages, when missing), then the official openai
# client from the npm registry into tests/hub/api/node_modules (git-ignored),
# at the version package.json pins.
set -eu
cd "$(dirname "$0")"
# Debian's names; where node, npm or chromium come from elsewhere they are used as they are
pkgs=""
command -v node >/dev/null 2>&1 || pkgs="$pkgs nodejs"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs npm"
command -v chromium >/dev/null 2>&1 || pkgs="$pkgs chromium"
# shellcheck disable=SC2086
[ -z "$pkgs" ] || ../../../setup.sh --packages $pkgs
npm install --no-audit --no-fund --loglevel=error
node -e "import('openai').then(() => console.log('setup: openai ' + require('./node_modules/openai/package.json').version + ' ready'))"
