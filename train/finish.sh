#!/usr/bin/env bash
# Turns a training run into the shipped model:
#   RUN_DIR/model-f32.gguf      train/export_gguf.py (tokenizer copied from the llama-spm vocab)
#   train/model/brown-moe-q8_0.gguf   moex-gguf quantize --type q8_0 (the file the repository ships)
#   train/model/run.json, loss.svg, log.csv   the run's record, for docs/MODEL.md
# then checks the export against PyTorch (train/check_export.py; skipped without torch).
#   train/finish.sh RUN_DIR [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: train/finish.sh RUN_DIR [BUILD_DIR]}
BUILD=${2:-build}
PY=${PYTHON:-/usr/bin/python3}
$PY train/export_gguf.py "$RUN" "$RUN/model-f32.gguf"
"$BUILD/bin/moex-gguf" quantize "$RUN/model-f32.gguf" train/model/brown-moe-q8_0.gguf --type q8_0
cp "$RUN/run.json" "$RUN/loss.svg" "$RUN/log.csv" train/model/
rc=0
$PY train/check_export.py "$RUN" "$RUN/model-f32.gguf" --hub "$BUILD/bin/moex-hub" || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 77 ] || { echo "finish: the export does not match PyTorch" >&2; exit 1; }
echo "finish: installed train/model/brown-moe-q8_0.gguf; train/evaluate.sh measures it"
