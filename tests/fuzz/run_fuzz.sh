#!/bin/sh
# Runs a libFuzzer binary from a MOEX_FUZZ build for a fixed time; builds nothing.
# Fails (nonzero) when the fuzzer finds a crash, leak, timeout or sanitizer error;
# the input that did it is left in BUILD_DIR/fuzz-artifacts/TARGET/.
#
# usage: run_fuzz.sh BUILD_DIR TARGET SECONDS [SEED_DIR...]
#   TARGET    a binary in BUILD_DIR/bin (fuzz_gguf, fuzz_proto, ...)
#   SEED_DIR  read-only seed corpora; default tests/fuzz/<TARGET without "fuzz_"> when it exists
# New inputs the fuzzer finds go to BUILD_DIR/fuzz-corpus/TARGET (kept between runs).
set -u
if [ $# -lt 3 ]; then
    echo "usage: $0 BUILD_DIR TARGET SECONDS [SEED_DIR...]" >&2
    exit 2
fi
build=$1 target=$2 seconds=$3
shift 3
bin=$build/bin/$target
if [ ! -x "$bin" ]; then
    echo "run_fuzz: $bin not found (configure with CC=clang -DMOEX_FUZZ=ON and build $target)" >&2
    exit 2
fi
if [ $# -eq 0 ]; then
    default=$(dirname "$0")/${target#fuzz_}
    [ -d "$default" ] && set -- "$default"
fi
for d in "$@"; do
    [ -d "$d" ] || { echo "run_fuzz: seed dir $d not found" >&2; exit 2; }
done
work=$build/fuzz-corpus/$target
artifacts=$build/fuzz-artifacts/$target
mkdir -p "$work" "$artifacts" || exit 2

echo "run_fuzz: $target for ${seconds}s, corpus $work, seeds: ${*:-none}"
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$work" "$@"
rc=$?
if [ $rc -ne 0 ]; then
    echo "run_fuzz: $target FAILED (exit $rc); reproducer(s):" >&2
    ls -1 "$artifacts" >&2
fi
exit $rc
