#!/bin/sh
# The training path end to end on a few steps: train/train.py (tiny preset, 2
# steps, on tokens of the committed held-out text), train/export_gguf.py, and
# train/check_export.py, which requires moex-hub's logits on the f32 export to
# match PyTorch's (relative L2 < 1e-3); then moex-gguf quantize to q8_0 loads
# and runs. Skipped (77) where PyTorch is not installed.
#   test_train_export.sh REPO BUILD_BIN WORKDIR
set -eu
repo=$1 bin=$2 work=$3
py=/usr/bin/python3
$py -c "import torch" 2>/dev/null || { echo "PyTorch is not installed: skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work/data"
"$bin/moex-gguf" tokenize "$repo/tests/data/vocab/ggml-vocab-llama-spm.gguf" --add-bos < "$repo/train/brown-heldout.txt" \
    > "$work/ids.txt"
$py "$repo/train/corpus.py" ids --ids "$work/ids.txt" --out "$work/data/train.bin"
cp "$work/data/train.bin" "$work/data/heldout.bin"
$py "$repo/train/train.py" --preset tiny --out "$work/run" --data "$work/data" --max-steps 2 --eval-every 1 \
    --eval-windows 2 --final-windows 2 --batch 2
$py "$repo/train/export_gguf.py" "$work/run" "$work/model-f32.gguf"
$py "$repo/train/check_export.py" "$work/run" "$work/model-f32.gguf" --hub "$bin/moex-hub"
"$bin/moex-gguf" quantize "$work/model-f32.gguf" "$work/model-q8_0.gguf" --type q8_0 --quiet
"$bin/moex-hub" --local -m "$work/model-q8_0.gguf" -p "The jury said" -n 4 --temp 0 > "$work/gen.txt"
rm -rf "$work"
echo "train -> export -> check -> quantize: ok"
