#!/bin/sh
# `moex-gguf info`: 0 and a full listing on a good file; 1 and "moex-gguf: FILE: reason"
# on bad ones; 2 on bad usage.
# usage: gguf_info_test.sh MOEX_GGUF VOCAB.gguf N_VOCAB TMPDIR
set -u
tool=$1 vocab=$2 n_vocab=$3 tmp=$4/gguf_info_test.$$
mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }

"$tool" info "$vocab" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "info on the fixture exits 0 (got $rc: $(cat "$tmp/err"))" '[ $rc -eq 0 ]'
check "version line" 'grep -q "GGUF v3, alignment 32" "$tmp/out"'
check "token array summary" 'grep -q "tokenizer.ggml.tokens *array *\[$n_vocab strings\] \"" "$tmp/out"'
check "string value" 'grep -q "tokenizer.ggml.model *string *\"" "$tmp/out"'
check "totals" 'grep -q "^totals:" "$tmp/out"'

# cut in the token count's reach, then in the middle of the strings
for cut in 1000 1500000; do
    head -c $cut "$vocab" >"$tmp/trunc.gguf"
    "$tool" info "$tmp/trunc.gguf" >"$tmp/out" 2>"$tmp/err"; rc=$?
    check "file cut at $cut exits 1 (got $rc)" '[ $rc -eq 1 ]'
    check "file cut at $cut: message: $(cat "$tmp/err")" \
        'grep -q "^moex-gguf: $tmp/trunc.gguf: .*\(truncated file\|cannot fit in the\)" "$tmp/err"'
done
check "cut strings say truncated" 'grep -q "truncated file" "$tmp/err"'

printf 'not a gguf file at all' >"$tmp/junk.gguf"
"$tool" info "$tmp/junk.gguf" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "junk file exits 1 (got $rc)" '[ $rc -eq 1 ]'
check "junk file message: $(cat "$tmp/err")" 'grep -q "not a GGUF file" "$tmp/err"'

"$tool" info "$tmp/missing.gguf" >"$tmp/out" 2>"$tmp/err"; rc=$?
check "missing file exits 1 (got $rc)" '[ $rc -eq 1 ]'
check "missing file message" 'grep -q "missing.gguf: cannot open" "$tmp/err"'

"$tool" info >"$tmp/out" 2>"$tmp/err"; rc=$?
check "no FILE exits 2 (got $rc)" '[ $rc -eq 2 ]'
check "usage on stderr" 'grep -q "usage: moex-gguf info" "$tmp/err"'

[ $fail -eq 0 ] && echo "gguf_info_test: all checks passed"
exit $fail
