#!/usr/bin/env bash
# dgca's loss curve on the GPU against PyTorch's, from
# the same initial weights and the same data order. The second device call
# of a GPU session, after bench/gpu/run.sh (it reuses run.sh's build dir
# when the machine is still warm; else it builds dgca-train first):
#   bash bench/gpu/curve.sh
#  1. bench/gpu/loss_curve.py init: the PyTorch model (bench/torch_dgca.py)
#     at a seed, saved under dgca's parameter names;
#  2. dgca-train --device cuda --precision bf16 --init-from that file on
#     train_law.txt, writing every micro-batch it trains on
#     (--dump-batches, model/core/batch_io.h) and its per-step losses;
#  3. loss_curve.py train on exactly those batches, bf16 autocast and fp32
#     (the fp32 run measures what "bf16 noise" is);
#  4. loss_curve.py compare: the table, the bf16-noise verdict.
# Returned files (under $OUT, at most 8): curve.md dgca_curve.json
# torch_bf16.json torch_fp32.json curve.log (+ build.log when it built).
# CPU smoke test of the script (no GPU): DEVICE=cpu DGCA_PRECISION=fp32
#   PRESET=tiny SEQ=64 BATCH=8 STEPS=5 LR=1e-3 BUILD_DIR=build PYTHON=<venv python>
# Dry run of the GPU path on the CUDA emulator (model/cuda_emu):
#   DGCA_TRAIN=build/model/dgca-train-emu TORCH_DEVICE=cpu PRESET=tiny SEQ=64
#   BATCH=8 STEPS=5 LR=1e-3 PYTHON=<venv python>   (dgca bf16 on the emulated
#   GPU, PyTorch on the CPU)
# Each step runs under a time limit within BUDGET_S (default 540 s, the
# device call's 600 s less the table's time; bench/gpu/step.sh) and prints
# one "[curve.sh] ..." status line.
# Environment: OUT, BUILD_DIR (build-gpu), ARCH (90), PRESET (bert-base),
# SEQ (128), BATCH (32), STEPS (300), LR (5e-5), DATA (../shared/data, or
# .gpu-data: the device call does not send ../shared, so
# bench/gpu/stage_data.sh copies the two files it needs into the ignored
# .gpu-data/ and the call carries it: run with carry [".gpu-data"]).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-540} ))
exec 3>&1
# shellcheck source=bench/gpu/step.sh
source bench/gpu/step.sh  # step NAME CAP CMD...
BUILD=${BUILD_DIR:-build-gpu}
ARCH=${ARCH:-90}
PRESET=${PRESET:-bert-base}
SEQ=${SEQ:-128}
BATCH=${BATCH:-32}
STEPS=${STEPS:-300}
LR=${LR:-5e-5}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}          # cpu: a smoke test of this script without a GPU
TORCH_DEVICE=${TORCH_DEVICE:-$DEVICE}
DGCA_TRAIN=${DGCA_TRAIN:-$BUILD/model/dgca-train}
DGCA_PRECISION=${DGCA_PRECISION:-bf16}  # the CPU trainer is fp32 only
DATA=${DATA:-}
if [ -z "$DATA" ]; then
  for d in ../shared/data shared/data .gpu-data; do [ -f "$d/ecspell/train_law.txt" ] && DATA=$d && break; done
fi
if [ -z "$DATA" ] || [ ! -f "$DATA/ecspell/train_law.txt" ]; then
  echo "curve.sh: no ECSpell data (set DATA=DIR holding ecspell/train_law.txt and vocab/vocab.txt)"
  exit 2
fi
# The confusion set: the shared data's (the GPU machine has no Debian
# unicode-data for the built-in Unihan homophones).
CONFUSION_ARGS=
[ -f "$DATA/confusion/pinyin_sam.json" ] && CONFUSION_ARGS="--confusion $DATA/confusion/pinyin_sam.json"
W=$(mktemp -d)
LOG="$OUT/curve.log"
: > "$LOG"

if [ ! -x "$DGCA_TRAIN" ] && [ "$DGCA_TRAIN" != "$BUILD/model/dgca-train" ]; then
  echo "curve.sh: DGCA_TRAIN=$DGCA_TRAIN is not an executable (this script builds only $BUILD/model/dgca-train)"
  exit 2
fi
if [ ! -x "$DGCA_TRAIN" ]; then
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  { step cmake 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDGCA_MODEL_ONLY=ON \
      -DDGCA_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DCMAKE_CUDA_COMPILER="$NVCC" > "$OUT/build.log" 2>&1 &&
    step build 300 ninja -C "$BUILD" -j "$(nproc)" dgca-train >> "$OUT/build.log" 2>&1; } ||
    { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
fi

echo "== init ($PRESET)" >> "$LOG"
step init 60 "$PY" bench/gpu/loss_curve.py init --preset "$PRESET" --out "$W/init.safetensors" >> "$LOG" 2>&1 ||
  { tail -20 "$LOG"; exit 1; }
echo "== dgca-train $DEVICE $DGCA_PRECISION, $STEPS steps x $BATCH, seq $SEQ" >> "$LOG"
step dgca-train 200 "$DGCA_TRAIN" --device "$DEVICE" --precision "$DGCA_PRECISION" --preset "$PRESET" \
  --train "$DATA/ecspell/train_law.txt" --vocab "$DATA/vocab/vocab.txt" \
  --seq "$SEQ" --micro-batch "$BATCH" --steps "$STEPS" --lr "$LR" \
  --init-from "$W/init.safetensors" --dump-batches "$W/batches.bin" $CONFUSION_ARGS \
  --json "$OUT/dgca_curve.json" >> "$LOG" 2>&1
dgca_rc=$?
echo "dgca-train exit $dgca_rc" >> "$LOG"
for prec in bf16 fp32; do
  echo "== torch $prec" >> "$LOG"
  step "torch-$prec" 150 "$PY" bench/gpu/loss_curve.py train --preset "$PRESET" --init "$W/init.safetensors" \
    --batches "$W/batches.bin" --precision $prec --lr "$LR" --device "$TORCH_DEVICE" \
    --json "$OUT/torch_$prec.json" >> "$LOG" 2>&1 || echo "torch $prec failed" | tee -a "$LOG"
done
echo "== compare" >> "$LOG"
step compare 30 "$PY" bench/gpu/loss_curve.py compare "$OUT/dgca_curve.json" "$OUT/torch_bf16.json" \
  "$OUT/torch_fp32.json" --out "$OUT/curve.md" 2>&1 | tee -a "$LOG"
rm -rf "$W"
[ $dgca_rc = 0 ] || { echo "dgca-train failed; last lines:"; grep -v '^step ' "$LOG" | tail -15; exit 1; }
