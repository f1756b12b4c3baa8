#!/bin/sh
# moex-hub --local --backend vulkan, the CLI users run: a greedy decode takes
# the GPU's argmax and copies no logits back (only the prompt's last row, which
# the sampler reads for the first token); sampling reads every row. The
# stats line counts the rows (moex_vk_state_logits_rows_read). With --cpu-moe
# (the experts in RAM, computed by the CLI's own threads) a greedy run prints
# the CPU backend's tokens: both round the experts' inputs to 8 bits.
# usage: vk_cli_readback.sh MOEX_HUB MODEL ; exit 77 without a Vulkan device
set -u
hub=$1 model=$2
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
"$hub" -m "$model" --cpu-moe --token t -p hi >/dev/null 2>&1
if [ $? = 2 ]; then echo "ok: --cpu-moe without --local is refused (exit 2)"
else echo "FAIL: --cpu-moe without --local was not refused"; fails=1; fi
exit $fails
