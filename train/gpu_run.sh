#!/usr/bin/env bash
# The real training run, on a CUDA machine (one H100: about 6 minutes in all).
# Needs python3 with PyTorch (CUDA) and numpy, and train/data/{train,heldout}.bin
# and split.json from train/prepare.sh (carry train/data: ~11 MB; no network is
# used). Trains the full preset for at most 330 s / 3000 steps, printing
# progress, then copies the run (3 weight shards of <= 15 MB, run.json,
# log.csv, loss.svg) to $OUT when set. Afterwards, here:
#   train/finish.sh RUN_DIR      (export, quantize, install the model, check it)
#   train/gpu_run.sh [RUN_DIR]   (default train/runs/full)
# PRESET=draft: the draft model for speculative decoding instead (distilled
# from train/model/brown-moe-q8_0.gguf, ~3 minutes; default run dir
# train/runs/draft; train/finish.sh RUN_DIR BUILD draft installs it).
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${PRESET:-full}
RUN=${1:-train/runs/$PRESET}
for f in train.bin heldout.bin split.json; do
  [ -f "train/data/$f" ] || { echo "gpu_run: train/data/$f is missing: run train/prepare.sh and carry train/data" >&2; exit 1; }
done
python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("torch", torch.__version__, torch.cuda.get_device_name(0))'
PYTHONUNBUFFERED=1 python3 train/train.py --preset "$PRESET" --out "$RUN"
if [ -n "${OUT:-}" ]; then
  cp "$RUN"/weights-*.pt "$RUN"/run.json "$RUN"/log.csv "$RUN"/loss.svg "$OUT"/
  echo "gpu_run: copied the run to $OUT"
fi
