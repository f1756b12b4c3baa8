#!/bin/sh
# moex-hub's command line: bad flags exit 2, bad files and bad tokens exit 1,
# each with a message that names the problem; a good run exits 0.
# usage: hub_cli_test.sh BIN_DIR VOCAB_DIR WORK_DIR
set -u
B=$1 V=$2 W=$3
mkdir -p "$W"
fails=0
expect() { # expect CODE PATTERN -- command...
    code=$1 pat=$2; shift 3
    out=$("$@" 2>&1 >/dev/null); rc=$?
    if [ "$rc" -ne "$code" ] || ! printf '%s' "$out" | grep -q -- "$pat"; then
        echo "FAIL: $* -> rc $rc (want $code), stderr: $out"; fails=$((fails + 1))
    else
        echo "ok: $* -> $code ($pat)"
    fi
}
M=$W/cli.gguf
"$B/moex-gguf" gen --arch qwen3 --preset test --vocab "$V/ggml-vocab-llama-spm.gguf" --type q8_0 --seed 2 -o "$M" --quiet || exit 1
head -c 200000 "$M" > "$W/truncated.gguf"
printf 'GGUF\003\000\000\000' > "$W/tiny.gguf"

expect 2 "unknown option" -- "$B/moex-hub" --bogus
expect 2 "no model" -- "$B/moex-hub" --local -p hi
expect 2 "expects an integer" -- "$B/moex-hub" --local -m "$M" -p hi -n lots
expect 2 "expects a number" -- "$B/moex-hub" --local -m "$M" -p hi --temp -1
expect 2 "needs a value" -- "$B/moex-hub" --local -m "$M" -p
expect 2 "only one of" -- "$B/moex-hub" --local -m "$M" -p hi --prompt-tokens 1,2
expect 2 "wire-dtype" -- "$B/moex-hub" --local -m "$M" -p hi --wire-dtype f8
expect 2 "backend" -- "$B/moex-hub" --local -m "$M" -p hi --backend tpu
expect 2 "no key 'nope'\|without Vulkan" -- "$B/moex-hub" --local -m "$M" -p hi --backend vulkan --vk-tune nope=1
# speculative decoding's flags (both commands parse them: hub/cli.c)
expect 2 "draft-max expects an integer in \[1, 15\]" -- "$B/moex-hub" --local -m "$M" -p hi --lookup --draft-max 0
expect 2 "draft-model expects a path" -- "$B/moex-hub" --local -m "$M" -p hi --draft-model ""
expect 2 "needs --batch of at least 9" -- "$B/moex-hub" --local -m "$M" -p hi --lookup --batch 8
expect 2 "generates; drop it with --dump-logits" -- "$B/moex-hub" --local -m "$M" -p hi --lookup --dump-logits "$W/l.bin"
expect 2 "draft-min is the CLI's" -- "$B/moex-hub" serve -m "$M" --local --draft-min 2
expect 1 "cannot load the draft model" -- "$B/moex-hub" --local -m "$M" -p hi --draft-model "$W/missing.gguf"
expect 1 "cannot load" -- "$B/moex-hub" --local -m "$W/missing.gguf" -p hi
expect 1 "truncated" -- "$B/moex-hub" --local -m "$W/truncated.gguf" -p hi
expect 1 "cannot load" -- "$B/moex-hub" --local -m "$W/tiny.gguf" -p hi
expect 1 "outside the vocabulary" -- "$B/moex-hub" --local -m "$M" --prompt-tokens 1,32000 -n 2
expect 1 "not a list of token ids" -- "$B/moex-hub" --local -m "$M" --prompt-tokens 1,x -n 2
expect 1 "raise --ctx" -- "$B/moex-hub" --local -m "$M" --prompt-tokens 1,2,3 -n 8 --ctx 4
expect 1 "dense model" -- "$B/moex-hub" -m "$M" --port 0 --token t -p hi
# the token bound (hub/auth.h HUB_TOKEN_MAX): 1025 bytes refused at start-up
ME=$W/cli-moe.gguf
[ -f "$ME" ] || "$B/moex-gguf" gen --arch qwen3moe --preset test --vocab "$V/ggml-vocab-llama-spm.gguf" --type q8_0 \
    --seed 2 -o "$ME" --quiet || exit 1
expect 1 "at most 1024" -- "$B/moex-hub" -m "$ME" --port 0 --token "$(head -c 1025 /dev/zero | tr '\0' k)" -p hi
# the flags both commands share (hub/cli.c): the same checks and messages
expect 2 "expects an integer" -- "$B/moex-hub" serve -m "$ME" --port lots
expect 2 "needs a value" -- "$B/moex-hub" serve -m "$ME" --token
expect 2 "expects a number" -- "$B/moex-hub" -m "$ME" --verify 2 -p hi
expect 2 "together" -- "$B/moex-hub" -m "$ME" --tls-cert "$W/c.pem" -p hi
expect 2 "together" -- "$B/moex-hub" serve -m "$ME" --tls-key "$W/k.pem"
expect 2 "leave it out with --tls-cert" -- "$B/moex-hub" -m "$ME" --tls-dir "$W" --tls-cert a --tls-key b -p hi
expect 2 "has no index.html" -- "$B/moex-hub" -m "$ME" --web-dir "$W/no-such-dir" -p hi
expect 2 "has no index.html" -- "$B/moex-hub" serve -m "$ME" --web-dir "$W"
expect 2 "expects a path" -- "$B/moex-hub" -m "$ME" --tls-dir "" -p hi
expect 2 "in the clear" -- "$B/moex-hub" -m "$ME" --tls --tls-dir "$W" --tcp-port 9999 -p hi
expect 2 "a port of its own" -- "$B/moex-hub" serve -m "$ME" --port 9999 --tcp-port 9999
expect 2 "tcp-port expects an integer in \[1, 65535\]" -- "$B/moex-hub" -m "$ME" --tcp-port 0 -p hi
expect 1 "cannot read the TLS certificate" -- "$B/moex-hub" -m "$ME" --port 0 --token t --tls-cert "$W/c.pem" \
    --tls-key "$W/k.pem" -p hi
# a hub that takes workers without a token could take none (moex-worker requires one): refused at start
expect 2 "needs --token" -- "$B/moex-hub" -m "$ME" --port 0 -p hi
expect 2 "needs --token" -- "$B/moex-hub" serve -m "$ME" --port 0
expect 2 "needs --token" -- "$B/moex-hub" -m "$ME" --port 0 --token "" -p hi
# both --help texts describe the shared flags
before=$fails
for cmd in "" serve; do
    h=$("$B/moex-hub" $cmd --help)
    for flag in --host --port --token --replicas --hedge --timeout-ms --verify --no-local-fallback --min-workers \
                --wait-s --web-dir --tls --tls-cert --tls-key --tls-dir; do
        if ! printf '%s' "$h" | grep -q -- "^  $flag"; then
            echo "FAIL: moex-hub $cmd --help does not describe $flag"; fails=$((fails + 1))
        fi
    done
done
[ "$fails" -eq "$before" ] && echo "ok: both --help texts describe the shared flags"
# --ctx is capped at the model's trained context (2048 here), saying so
expect 0 "above the model's trained context: using 2048" -- "$B/moex-hub" --local -m "$M" --prompt-tokens 1,2,3 -n 2 \
    --ctx 100000 --temp 0
# the token limit is the same for hub and worker: 1025 bytes refused by both (1024 joins: test_hostile.py)
expect 1 "longer than 1024 bytes" -- "$B/moex-worker" --hub ws://127.0.0.1:1/ws --model "$ME" \
    --token "$(head -c 1025 /dev/zero | tr '\0' k)"
expect 1 "cannot reach\|connect\|refused\|gave up" -- "$B/moex-worker" --hub ws://127.0.0.1:1/ws --model "$ME" \
    --reconnect-max-s 0.3 --token "$(head -c 1024 /dev/zero | tr '\0' k)"
# a good run: exactly -n ids on stdout
ids=$("$B/moex-hub" --local -m "$M" --prompt-tokens 1,2,3 -n 5 --temp 0 --print-tokens --ignore-eos 2>/dev/null)
if [ "$(printf '%s' "$ids" | wc -w)" -ne 5 ]; then echo "FAIL: good run printed '$ids'"; fails=$((fails + 1)); else echo "ok: good run"; fi
echo "$fails failed"
[ "$fails" -eq 0 ]
