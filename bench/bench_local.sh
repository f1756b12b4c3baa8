#!/bin/sh
# Speed of our engine against llama.cpp on the same model file, same threads.
#   bench_local.sh BUILD_DIR [--smoke]
# Generates (or reuses) the bench-moe model at q4_K_M with the qwen2 vocab,
# then measures, with 2 threads:
#   moex-hub --local: prompt tok/s (a 512-token prompt) and decode tok/s (128
#     tokens) from its stats line, median of 3 runs;
#   llama.cpp (tests/peer/llama_peer bench): the same as llama-bench's pp512/tg128;
#   the peak RSS of each (/usr/bin/time -v) and the file size;
# and prints a markdown table with ratios (moex / llama.cpp).
# --smoke: a tiny model and short runs, to test the script itself.
# Env: BENCH_THREADS (2), BENCH_P (512), BENCH_N (128), BENCH_REPS (3), BENCH_MODEL (a file to use as is).
# Exit 0, 1 on a failure, 77 when llama.cpp cannot be set up here.
set -eu

build=${1:?usage: bench_local.sh BUILD_DIR [--smoke]}
smoke=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
fixtures=${MOEX_FIXTURES:-$repo/tests/data}
hub=$build/bin/moex-hub
gguf=$build/bin/moex-gguf
threads=${BENCH_THREADS:-2}
P=${BENCH_P:-512} N=${BENCH_N:-128} reps=${BENCH_REPS:-3}
work=$build/bench
preset=bench-moe vocab=$fixtures/vocab/ggml-vocab-qwen2.gguf arch=qwen3moe
if [ "$smoke" = --smoke ]; then
    P=32 N=8 reps=1 work=$build/tests/bench_smoke preset=test vocab=$fixtures/vocab/ggml-vocab-llama-spm.gguf
fi
die() { echo "bench_local: $*" >&2; exit 1; }

for b in "$hub" "$gguf"; do [ -x "$b" ] || die "$b not built"; done
# Peak RSS comes from GNU time; without it the table says n/a.
timer() { /usr/bin/time -v -o "$@"; }
if [ ! -x /usr/bin/time ]; then
    echo "bench_local: /usr/bin/time missing (apt-get install time): no peak RSS" >&2
    timer() { out=$1; shift; echo "Maximum resident set size (kbytes): 0" > "$out"; "$@"; }
fi
peer_dir=${MOEX_PEER_DIR:-$repo/.peer}
rc=0
MOEX_PEER_DIR=$peer_dir "$repo/tests/peer/setup_peer.sh" || rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || die "setup_peer.sh failed"
peer=$peer_dir/bin/llama_peer

mkdir -p "$work"
model=${BENCH_MODEL:-$work/$preset-q4_K_M.gguf}
if [ ! -f "$model" ]; then
    "$gguf" gen --arch $arch --preset $preset --vocab "$vocab" --type q4_K_M --seed 1 -o "$model" || die "gen failed"
fi

# A fixed prompt of ordinary token ids (valid in both vocabularies).
prompt=$(awk -v n="$P" 'BEGIN { for (i = 0; i < n; i++) printf "%s%d", (i ? "," : ""), (i * 7919 + 13) % 30000 + 100 }')

# peak RSS in MB from a /usr/bin/time -v report
rss_mb() { awk -F: '/Maximum resident set size/ { printf "%.0f", $2 / 1024 }' "$1"; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# Ours: reps runs; each prints "... prompt P tokens X tok/s | decode N tokens Y tok/s ..." on stderr.
: > "$work/ours.pp"
: > "$work/ours.tg"
ours_rss=0
i=0
while [ $i -lt "$reps" ]; do
    timer "$work/ours.time" "$hub" --local -m "$model" --prompt-tokens "$prompt" -n "$N" --temp 0 \
        --ignore-eos --print-tokens --threads "$threads" > "$work/ours.out" 2> "$work/ours.err" \
        || { cat "$work/ours.err" >&2; die "moex-hub failed"; }
    stats=$(grep 'tok/s' "$work/ours.err" | tail -n 1)
    echo "$stats" | sed -n 's/.*prompt *[0-9]* tokens *\([0-9.]*\) tok\/s.*/\1/p' >> "$work/ours.pp"
    echo "$stats" | sed -n 's/.*decode *[0-9]* tokens *\([0-9.]*\) tok\/s.*/\1/p' >> "$work/ours.tg"
    r=$(rss_mb "$work/ours.time")
    [ "$r" -gt "$ours_rss" ] && ours_rss=$r
    echo "moex-hub run $((i + 1)): $stats" >&2
    i=$((i + 1))
done
ours_pp=$(median < "$work/ours.pp") || die "no prompt tok/s in moex-hub's stats line: $(tail -n 3 "$work/ours.err")"
ours_tg=$(median < "$work/ours.tg") || die "no decode tok/s in moex-hub's stats line: $(tail -n 3 "$work/ours.err")"

# llama.cpp: one process, a warm-up and reps repetitions, median.
timer "$work/llama.time" "$peer" bench "$model" --threads "$threads" -p "$P" -n "$N" -r "$reps" \
    > "$work/llama.out" 2> "$work/llama.err" || { cat "$work/llama.err" >&2; die "llama_peer bench failed"; }
llama_pp=$(sed -n "s/^pp${P}_tok_s //p" "$work/llama.out")
llama_tg=$(sed -n "s/^tg${N}_tok_s //p" "$work/llama.out")
llama_rss=$(rss_mb "$work/llama.time")
[ -n "$llama_pp" ] && [ -n "$llama_tg" ] || die "no numbers from llama_peer bench: $(cat "$work/llama.out")"

size_mb=$(awk -v b="$(wc -c < "$model")" 'BEGIN { printf "%.0f", b / 1e6 }')
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)

echo
echo "Model: \`$(basename "$model")\` ($preset, q4_K_M, ${size_mb} MB), $threads threads, $cpu"
echo "llama.cpp: $(sed -n '1,2p' "$peer_dir/VERSION" | tr '\n' ';' | sed 's/;$//;s/;/; /g')"
echo
echo "| metric | moex | llama.cpp | moex / llama.cpp |"
echo "|---|---:|---:|---:|"
echo "| prompt tok/s (pp$P) | $ours_pp | $llama_pp | $(ratio "$ours_pp" "$llama_pp") |"
echo "| decode tok/s (tg$N) | $ours_tg | $llama_tg | $(ratio "$ours_tg" "$llama_tg") |"
if [ "$llama_rss" -gt 0 ]; then
    echo "| peak RSS MB | $ours_rss | $llama_rss | $(ratio "$ours_rss" "$llama_rss") |"
else
    echo "| peak RSS MB | n/a | n/a | - |"
fi
echo "| file MB | $size_mb | $size_mb | 1.00 |"

# The numbers must be numbers (the smoke test's point).
for v in "$ours_pp" "$ours_tg" "$llama_pp" "$llama_tg"; do
    awk -v x="$v" 'BEGIN { exit !(x + 0 > 0) }' || die "a speed is not a positive number: '$v'"
done
