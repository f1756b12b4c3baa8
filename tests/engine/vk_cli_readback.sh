#!/bin/sh
# moex-hub --local --backend vulkan, the CLI users run: a greedy decode takes
# the GPU's argmax and copies no logits back (only the prompt's last row, which
# the sampler reads for the first token); sampling reads every row. The
# stats line counts the rows (moex_vk_state_logits_rows_read).
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
exit $fails
