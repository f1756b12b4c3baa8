#!/bin/sh
# moex-worker's command line: bad flags exit 2 with a message, a missing model
# exits 1, an unreachable hub exits 1 once --reconnect-max-s has passed,
# SIGTERM exits 0.
# usage: test_worker_cli.sh MOEX-WORKER MODEL.gguf
W=$1 MODEL=$2
fail=0
err=$(mktemp)
trap 'rm -f "$err"' EXIT

# expect STATUS PATTERN ARGS...: exit status and a stderr line matching PATTERN.
expect() {
    want=$1 pat=$2
    shift 2
    "$W" "$@" >/dev/null 2>"$err"
    got=$?
    if [ "$got" -ne "$want" ] || ! grep -q -- "$pat" "$err"; then
        echo "FAIL: moex-worker $*: exit $got (want $want), stderr:"; cat "$err"; fail=1
    else
        echo "ok: moex-worker $* -> $got"
    fi
}

H="--hub ws://127.0.0.1:1/ws --token t"
expect 2 "hub.*required"
expect 2 "unknown option '--bogus'" $H --model "$MODEL" --bogus 1
expect 2 "--threads: 'abc'" $H --model "$MODEL" --threads abc
expect 2 "--capacity" $H --model "$MODEL" --capacity 0
expect 2 "--inject-delay-prob" $H --model "$MODEL" --inject-delay-ms 5 --inject-delay-prob 1.5
expect 2 "--backend: 'webgpu'" $H --model "$MODEL" --backend webgpu
expect 2 "tcp:// needs --model" --hub tcp://127.0.0.1:1 --token t
expect 2 "--device is for --backend vulkan" $H --model "$MODEL" --device 0
expect 2 "--vk-tune is for --backend vulkan\|without Vulkan" $H --model "$MODEL" --vk-tune spin_us=10
expect 2 "--memory-budget" $H --model "$MODEL" --memory-budget 12Q
expect 2 "not a ws://, wss:// or tcp:// URL" --hub ftp://x/ws --token t --model "$MODEL"
expect 2 "--ca is for a hub that serves TLS" $H --model "$MODEL" --ca /nonexistent.pem
expect 2 "--ca and --insecure exclude each other" --hub wss://127.0.0.1:1/ws --token t --model "$MODEL" --ca x.pem --insecure
expect 2 "token is required" --hub ws://127.0.0.1:1/ws --model "$MODEL"
expect 2 "needs a value" $H --model
expect 1 "cannot load /nonexistent/model.gguf" $H --model /nonexistent/model.gguf
expect 1 "cannot load" $H --model "$err"   # an empty file is not a GGUF

# Nothing listens on port 1: retries with backoff, then gives up.
start=$(date +%s)
expect 1 "giving up" $H --model "$MODEL" --threads 1 --reconnect-max-s 1
elapsed=$(( $(date +%s) - start ))
if [ "$elapsed" -gt 8 ]; then echo "FAIL: gave up after ${elapsed}s (want a few)"; fail=1; fi
grep -q "retrying in" "$err" || { echo "FAIL: no retry was logged"; fail=1; }

# SIGTERM while retrying: a clean exit 0 with the counters.
"$W" $H --model "$MODEL" --threads 1 2>"$err" &
pid=$!
sleep 1
kill -TERM $pid
wait $pid
st=$?
if [ $st -ne 0 ] || ! grep -q "0 dispatches" "$err"; then echo "FAIL: SIGTERM: exit $st"; cat "$err"; fail=1; else echo "ok: SIGTERM -> 0"; fi

"$W" --help | grep -q "usage: moex-worker" || { echo "FAIL: --help"; fail=1; }
exit $fail
