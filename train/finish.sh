#!/usr/bin/env bash
# Turns a training run into the shipped model:
#   BUILD_DIR/models/brown-moe-f32.gguf   train/export_gguf.py (tokenizer copied from the llama-spm vocab)
#   train/model/brown-moe-q8_0.gguf   moex-gguf quantize --type q8_0 (the file the repository ships)
#   train/model/run.json, loss.svg, log.csv   the run's record, for docs/MODEL.md
# then checks the export against PyTorch (train/check_export.py; skipped without torch).
# RUN_DIR may be read-only (e.g. the files a remote run sent back).
# With PRESET draft: the draft model, train/model/brown-moe-draft-q8_0.gguf and
# train/model/draft/{run.json,loss.svg,log.csv}.
#   train/finish.sh RUN_DIR [BUILD_DIR] [PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:?usage: train/finish.sh RUN_DIR [BUILD_DIR]}
BUILD=${2:-build}
PRESET=${3:-full}
PY=${PYTHON:-/usr/bin/python3}
NAME=brown-moe RECORD=train/model
[ "$PRESET" = full ] || NAME=brown-moe-$PRESET RECORD=train/model/$PRESET
F32=$BUILD/models/$NAME-f32.gguf
mkdir -p "$BUILD/models" "$RECORD"
$PY train/export_gguf.py "$RUN" "$F32"
"$BUILD/bin/moex-gguf" quantize "$F32" "train/model/$NAME-q8_0.gguf" --type q8_0
cp "$RUN/run.json" "$RUN/loss.svg" "$RUN/log.csv" "$RECORD"/
rc=0
$PY train/check_export.py "$RUN" "$F32" --hub "$BUILD/bin/moex-hub" || rc=$?
[ $rc -eq 0 ] || [ $rc -eq 77 ] || { echo "finish: the export does not match PyTorch" >&2; exit 1; }
echo "finish: installed train/model/$NAME-q8_0.gguf; train/evaluate.sh measures it"
