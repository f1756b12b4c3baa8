#!/usr/bin/env bash
# Builds and runs the whole test suite: the Release build, the CPU-only build
# (-DMOEX_VULKAN=OFF), then the suite under ASan+UBSan (MOEX_SANITIZE=ON), then
# short fuzz runs of the decoders.
#   ./test.sh             everything
#   ./test.sh --quick     Release build only
set -euo pipefail
cd "$(dirname "$0")"
./setup.sh --deps
# node, the openai npm package and chromium for the API tests (hub_api skips without them)
sh tests/hub/api/setup.sh || { echo "test.sh: tests/hub/api/setup.sh failed: the API tests will be skipped"; \
    [ "${MOEX_REQUIRE_API_TOOLS:-0}" != 1 ] || exit 1; }
J=$(nproc)
LOGS=$(mktemp -d)
# ctest, its output kept, then the five slowest tests against their TIMEOUT
run_ctest() { # run_ctest BUILD_DIR [ctest args...]
  local dir=$1; shift
  local rc=0
  if ! ctest --test-dir "$dir" --output-on-failure -j"$J" "$@" 2>&1 | tee "$LOGS/$dir.log"; then rc=1; fi
  /usr/bin/python3 tests/slowest.py "$dir" "$LOGS/$dir.log" 5 || true
  return $rc
}

echo "== release build + tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$J"
run_ctest build
[ "${1:-}" = "--quick" ] && exit 0

echo "== CPU-only build (-DMOEX_VULKAN=OFF) + tests"
cmake -S . -B build-cpu -DCMAKE_BUILD_TYPE=Release -DMOEX_VULKAN=OFF >/dev/null
cmake --build build-cpu -j"$J"
# what this pass adds is the build without Vulkan and its programs: the browser page (emscripten), the
# distributed hub's chaos and hostile-peer scenarios, the whole models against the NumPy reference and llama.cpp
# and the tokenizer against llama.cpp (models_, ppl_, ref_, peer_tokenize: the same code in both builds) do not
# depend on MOEX_VULKAN and ran in the release pass (most again under ASan); dist_end_to_end, the CLIs and the API
# run here
run_ctest build-cpu -E "^web_|^dist_chaos$|^dist_hostile$|^models_|^ppl_|^ref_|^peer_tokenize$"

echo "== sanitizer build (ASan + UBSan) + tests"
cmake -S . -B build-san -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEX_SANITIZE=ON >/dev/null
cmake --build build-san -j"$J"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-san -LE slow

echo "== fuzz build (clang libFuzzer) + short runs"
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOEX_FUZZ=ON >/dev/null
# only what the fuzz runs need: the targets, their seed makers and the tool that makes the hub's model
cmake --build build-fuzz -j"$J" --target fuzz_gguf fuzz_proto fuzz_hub gguf_fuzz_seeds test_proto moex-gguf
run_ctest build-fuzz -L fuzz
