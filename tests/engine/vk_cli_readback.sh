#!/bin/sh
# moex-hub --local --backend vulkan, the CLI users run: a greedy decode takes
# the GPU's argmax and copies no logits back (only the prompt's last row, which
# the sampler reads for the first token); sampling reads every row. The
# stats line counts the rows (moex_vk_state_logits_rows_read). With --cpu-moe
# (the experts in RAM, computed by the CLI's own threads while few tokens run)
# a greedy run prints the CPU backend's tokens: both round the experts' inputs
# to 8 bits; a long prompt's experts run on the GPU, within 5 % of them.
# usage: vk_cli_readback.sh MOEX_HUB MODEL PYTHON ; exit 77 without a Vulkan device
set -u
hub=$1 model=$2 python=${3:-python3}
"$hub" --list-devices >/dev/null 2>&1 && [ -n "$("$hub" --list-devices 2>/dev/null)" ] || { echo "no Vulkan device"; exit 77; }
fails=0
rows() { # rows TEMP: the stats line's count
    "$hub" --local --backend vulkan -m "$model" --prompt-tokens 1,15,27,300 -n 16 --ignore-eos --temp "$1" \
        --print-tokens 2>&1 >/dev/null | sed -n 's/.*logits rows read back \([0-9]*\).*/\1/p'
}
greedy=$(rows 0) sampled=$(rows 0.8)
if [ "$greedy" = 1 ]; then echo "ok: greedy, 16 tokens: 1 logits row read back (the prompt's)"
else echo "FAIL: greedy, 16 tokens: '$greedy' logits rows read back, want 1"; fails=1; fi
if [ "$sampled" = 16 ]; then echo "ok: sampled, 16 tokens: 16 rows read back (the count counts)"
else echo "FAIL: sampled, 16 tokens: '$sampled' rows read back, want 16"; fails=1; fi
tokens() { "$hub" --local -m "$model" --prompt-tokens 1,15,27,300 -n 24 --ignore-eos --temp 0 -t 2 --print-tokens "$@" 2>/dev/null; }
cpu=$(tokens --backend cpu) tier=$(tokens --backend vulkan --cpu-moe)
if [ -n "$cpu" ] && [ "$cpu" = "$tier" ]; then echo "ok: --cpu-moe, 24 greedy tokens equal the CPU backend's"
else echo "FAIL: --cpu-moe tokens '$tier', the CPU backend's '$cpu'"; fails=1; fi
line=$("$hub" --local --backend vulkan --cpu-moe -m "$model" --prompt-tokens 1,15 -n 4 --temp 0 -t 2 2>&1 >/dev/null | grep "^moex-hub: load")
case "$line" in
*"experts on the cpu"*"logits rows read back 1"*) echo "ok: the stats line says where the experts ran: $line" ;;
*) echo "FAIL: stats line '$line'"; fails=1 ;;
esac
# A prompt of 32 tokens or more runs its experts on the GPU (their weights read from host memory): its
# logits against the CPU backend's, every prompt row and the decode's
long=$(seq -s, 3 45) dir=$(mktemp -d)
"$hub" --local -m "$model" --prompt-tokens "$long" -n 8 --ignore-eos --temp 0 -t 2 --backend cpu \
    --dump-logits "$dir/cpu.bin" >/dev/null 2>&1
"$hub" --local -m "$model" --prompt-tokens "$long" -n 8 --ignore-eos --temp 0 -t 2 --backend vulkan --cpu-moe \
    --dump-logits "$dir/tier.bin" >/dev/null 2>&1
if "$python" - "$dir/cpu.bin" "$dir/tier.bin" <<'PY'
import sys, numpy as np
a, b = (np.fromfile(p, dtype=np.float32) for p in sys.argv[1:3])
rows = 43 + 8 - 1  # the prompt's rows, then each decoded token's but the last
if a.size == 0 or a.size != b.size or a.size % rows:
    sys.exit(f"logits sizes {a.size} and {b.size}")
a, b = a.reshape(rows, -1), b.reshape(rows, -1)
rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
top1 = (a.argmax(1) == b.argmax(1)).mean()
print(f"--cpu-moe, 43-token prompt: worst row's relative error {rel.max():.2e}, top-1 agreement {top1:.3f}")
sys.exit(0 if rel.max() < 0.05 and top1 >= 0.9 else 1)
PY
then echo "ok: a long prompt's experts on the GPU: logits within 5 % of the CPU backend's"
else echo "FAIL: --cpu-moe's long prompt strays from the CPU backend"; fails=1; fi
rm -rf "$dir"
# --vk-tune reaches the backend: profile=1 prints the GPU's per-op tables; a key it does not know is refused
prof=$("$hub" --local --backend vulkan -m "$model" --prompt-tokens 1,15 -n 2 --temp 0 --vk-tune profile=1,idot=0 2>&1 >/dev/null)
if printf '%s' "$prof" | grep -q "^vkprof recording"; then echo "ok: --vk-tune profile=1 prints the per-op tables"
else echo "FAIL: --vk-tune profile=1 printed no vkprof table"; fails=1; fi
"$hub" --local --backend vulkan -m "$model" -p hi --vk-tune idot=7 >/dev/null 2>"$dir.err"
if [ $? = 2 ] && grep -q "idot=7: it takes 0..1" "$dir.err"; then echo "ok: --vk-tune idot=7 is refused (exit 2)"
else echo "FAIL: --vk-tune idot=7: $(cat "$dir.err")"; fails=1; fi
rm -f "$dir.err"
# --device picks the GPU (a multi-GPU machine runs the hub on one, workers on the others): the first device runs,
# one past the last is refused at start with the count
n_dev=$("$hub" --list-devices 2>/dev/null | grep -c .)
"$hub" --local --backend vulkan --device 0 -m "$model" --prompt-tokens 1,15 -n 2 --temp 0 >/dev/null 2>&1
if [ $? = 0 ]; then echo "ok: --device 0 runs"; else echo "FAIL: --device 0 did not run"; fails=1; fi
"$hub" --local --backend vulkan --device "$n_dev" -m "$model" --prompt-tokens 1,15 -n 2 --temp 0 >/dev/null 2>"$dir.err"
if [ $? = 1 ] && grep -q -- "--device $n_dev: only $n_dev device" "$dir.err"; then echo "ok: --device $n_dev is refused"
else echo "FAIL: --device $n_dev: $(cat "$dir.err")"; fails=1; fi
rm -f "$dir.err"
"$hub" -m "$model" --cpu-moe --token t -p hi >/dev/null 2>&1
if [ $? = 2 ]; then echo "ok: --cpu-moe without --local is refused (exit 2)"
else echo "FAIL: --cpu-moe without --local was not refused"; fails=1; fi
exit $fails
