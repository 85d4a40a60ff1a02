#!/usr/bin/env bash
# ctest dgca_train_cuda_emu: the trainer on the CUDA device
# (model/cuda/cuda_train_device.h) through dgca-train --device cuda, run by
# the CUDA emulator (model/cuda/emu/emulator.h), against the CPU trainer:
#   1. fp32, 4 steps of micro-batch 8 x accumulation 2 with clipping and
#      weight decay: every step's loss and gradient norm within 1e-4
#      relative of the CPU's (reduction order differs);
#   2. bf16: every step's loss within 2e-2 relative of the CPU's fp32;
#   3. resume: 2 steps, checkpoint, 2 more (a second process) give the
#      uninterrupted run's steps 3 and 4 (the moments and the data position
#      round-trip through the host).
# Usage: dgca_train_cuda_emu_test.sh DGCA_TRAIN DGCA_TRAIN_EMU
set -uo pipefail
CPU=$1
EMU=$2
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
if [ ! -f "$DATA/ecspell/train_law.txt" ]; then
  echo "SKIP: no ECSpell data under $DATA"
  exit 77
fi
W=$(mktemp -d /tmp/dgca_train_cuda_emu.XXXXXX)
trap 'rm -rf "$W"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
COMMON=(--train "$DATA/ecspell/train_law.txt" --vocab "$DATA/vocab/vocab.txt" --preset tiny --seq 48
        --micro-batch 8 --accumulation 2 --lr 1e-3 --clip 1.0 --weight-decay 0.01 --seed 7)

"$CPU" "${COMMON[@]}" --steps 4 --json "$W/cpu.json" > /dev/null 2> "$W/cpu.log" || { cat "$W/cpu.log"; fail "cpu run"; }
"$EMU" "${COMMON[@]}" --steps 4 --device cuda --precision fp32 --json "$W/fp32.json" > /dev/null 2> "$W/fp32.log" ||
  { tail -30 "$W/fp32.log"; fail "cuda fp32 run"; }
grep -q "^device: cuda:0 dgca CUDA emulator" "$W/fp32.log" || fail "no emulated device line: $(head -5 "$W/fp32.log")"
"$EMU" "${COMMON[@]}" --steps 4 --device cuda --precision bf16 --json "$W/bf16.json" > /dev/null 2> "$W/bf16.log" ||
  { tail -30 "$W/bf16.log"; fail "cuda bf16 run"; }
"$EMU" "${COMMON[@]}" --steps 2 --device cuda --precision fp32 --checkpoint-dir "$W/ck" --json "$W/part1.json" \
  > /dev/null 2> "$W/part1.log" || { tail -30 "$W/part1.log"; fail "cuda run to step 2"; }
"$EMU" "${COMMON[@]}" --steps 4 --device cuda --precision fp32 --checkpoint-dir "$W/ck" --json "$W/part2.json" \
  > /dev/null 2> "$W/part2.log" || { tail -30 "$W/part2.log"; fail "cuda resume to step 4"; }

python3 - "$W" <<'PY' || fail "the CUDA trainer does not match"
import json, os, sys
w = sys.argv[1]
steps = lambda f: json.load(open(os.path.join(w, f)))["steps"]
cpu, fp32, bf16, part2 = steps("cpu.json"), steps("fp32.json"), steps("bf16.json"), steps("part2.json")
assert [s["step"] for s in cpu] == [1, 2, 3, 4] == [s["step"] for s in fp32] == [s["step"] for s in bf16], (cpu, fp32)
rel = lambda a, b: abs(a - b) / abs(b)
worst = 0.0
for c, g in zip(cpu, fp32):
    for k in ("loss", "fusion", "mft", "detector", "candidate", "grad_norm"):
        worst = max(worst, rel(g[k], c[k]))
        assert rel(g[k], c[k]) <= 1e-4, ("fp32", c["step"], k, g[k], c[k])
worst_bf16 = max(rel(g["loss"], c["loss"]) for c, g in zip(cpu, bf16))
assert worst_bf16 <= 2e-2, ("bf16", [(g["loss"], c["loss"]) for c, g in zip(cpu, bf16)])
assert [s["step"] for s in part2] == [3, 4], part2
for a, b in zip(fp32[2:], part2):
    assert rel(b["loss"], a["loss"]) <= 1e-6, ("resume", a["step"], b["loss"], a["loss"])
print(f"fp32 worst relative difference {worst:.2e}; bf16 worst loss difference {worst_bf16:.2e}; "
      f"resumed steps 3-4 {[round(s['loss'], 6) for s in part2]} vs {[round(s['loss'], 6) for s in fp32[2:]]}")
PY
echo "PASS"
