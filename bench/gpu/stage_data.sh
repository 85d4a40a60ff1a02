#!/usr/bin/env bash
# Copies the two data files bench/gpu/curve.sh needs (train_law.txt, the
# BERT-Chinese vocab) from ../shared/data into .gpu-data/, which
# .git/info/exclude ignores, so a device call can carry it (the device tool
# sends the checkout only; ../shared stays behind). Nothing is committed.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=${DGCA_SHARED_DATA:-../shared/data}
mkdir -p .gpu-data/ecspell .gpu-data/vocab .gpu-data/confusion
cp "$SRC/ecspell/train_law.txt" .gpu-data/ecspell/
cp "$SRC/vocab/vocab.txt" .gpu-data/vocab/
# The GPU machine has no Debian unicode-data (the trainer's default
# homophones): the shared confusion set instead.
cp "$SRC/confusion/pinyin_sam.json" .gpu-data/confusion/
EXCLUDE="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$EXCLUDE")"
grep -qx '.gpu-data' "$EXCLUDE" 2>/dev/null || echo '.gpu-data' >> "$EXCLUDE"
du -sh .gpu-data
