#!/usr/bin/env bash
# ctest dgca_train_cuda_emu: the trainer on the CUDA device
# (model/cuda/cuda_train_device.h) through dgca-train --device cuda, run by
# the CUDA emulator (model/cuda_emu/emulator.h), against the CPU trainer:
#   1. fp32, 4 steps of micro-batch 8 x accumulation 2 with clipping and
#      weight decay: every step's loss and gradient norm within 1e-4
#      relative of the CPU's (reduction order differs);
#   2. bf16 and fp16 (loss scale 65536): every step's loss within 2e-2
#      relative of the CPU's fp32 (bf16 with --attention fused, which the
#      device line names); bf16 again with --gemm-attention (the GEMM +
#      softmax attention): the same bound; bf16 with --attention auto (the
#      default): both versions timed when the device is built, the device
#      line says which was kept and both times, step 1 within the same
#      bound; with --deterministic, auto keeps the fused without timing;
#      --attention flash is refused naming the valid values;
#   3. fp16 from loss scale 4e6, where the scaled fp16 gradients overflow:
#      step 1 is skipped and the scale halves, as torch's GradScaler;
#   4. resume: the same fp16 run stopped after step 1 (checkpoint, loss
#      scale halved to 2e6 by its overflow) and resumed by a second process
#      gives the uninterrupted run's steps 2-4 exactly (weights, moments,
#      data position and the loss scale round-trip through the checkpoint:
#      a resumed backward scaled by the flag's 4e6 would overflow at step 2);
#      the checkpoint names the attention kernels its run ran, and the
#      resumed run, under --attention auto, keeps them untimed (here the GEMM
#      version, which the first runs were told to run: a timing could pick
#      either);
#   5. dropout 0.1 (hidden and attention): the CUDA fp32 run's losses and
#      gradient norms within 1e-4 of the CPU's with the same dropout (the
#      masks are the same hash on both, model/core/dropout.h), bf16 (fused
#      attention) within 2e-2, and not the losses without dropout; the CPU
#      run stopped at step 2 and resumed gives steps 3-4 exactly (the
#      resumed batches carry the same keys).
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
for p in bf16 fp16; do
  "$EMU" "${COMMON[@]}" --steps 4 --device cuda --precision $p --attention fused --json "$W/$p.json" \
    > /dev/null 2> "$W/$p.log" || { tail -30 "$W/$p.log"; fail "cuda $p run"; }
done
grep -q "^device: cuda:0 .*, bf16, fused attention" "$W/bf16.log" || fail "bf16 without the fused attention: $(grep -m1 ^device "$W/bf16.log")"
"$EMU" "${COMMON[@]}" --steps 4 --device cuda --precision bf16 --gemm-attention --json "$W/bf16_gemm.json" \
  > /dev/null 2> "$W/bf16_gemm.log" || { tail -30 "$W/bf16_gemm.log"; fail "cuda bf16 --gemm-attention run"; }
if grep -q "^device: .*fused attention" "$W/bf16_gemm.log"; then fail "--gemm-attention still fused"; fi
"$EMU" "${COMMON[@]}" --steps 1 --device cuda --precision bf16 --json "$W/bf16_auto.json" \
  > /dev/null 2> "$W/bf16_auto.log" || { tail -30 "$W/bf16_auto.log"; fail "cuda bf16 --attention auto run"; }
grep -Eq "^device: .*; attention auto: (fused kept|GEMM chosen) \(fused [0-9.]+ ms vs GEMM [0-9.]+ ms" "$W/bf16_auto.log" ||
  fail "auto attention did not time both: $(grep -m1 ^device "$W/bf16_auto.log")"
"$EMU" "${COMMON[@]}" --steps 1 --device cuda --precision bf16 --deterministic --json "$W/bf16_det.json" \
  > /dev/null 2> "$W/bf16_det.log" || { tail -30 "$W/bf16_det.log"; fail "cuda bf16 deterministic run"; }
grep -q "^device: .*fused attention, deterministic; attention auto: fused, not timed" "$W/bf16_det.log" ||
  fail "deterministic auto attention: $(grep -m1 ^device "$W/bf16_det.log")"
"$EMU" "${COMMON[@]}" --steps 1 --device cuda --precision bf16 --attention flash > /dev/null 2> "$W/flash.log"
rc=$?
[ $rc = 2 ] && grep -q "is not one of auto, fused, gemm" "$W/flash.log" || fail "--attention flash: rc $rc, $(cat "$W/flash.log")"
F16=(--device cuda --precision fp16 --loss-scale 4e6)
"$EMU" "${COMMON[@]}" "${F16[@]}" --attention gemm --steps 4 --json "$W/overflow.json" > /dev/null \
  2> "$W/overflow.log" || { tail -30 "$W/overflow.log"; fail "cuda fp16 overflow run"; }
grep -q "step 1: fp16 gradients overflowed: update skipped, loss scale now 2e+06" "$W/overflow.log" ||
  fail "no overflow line: $(grep -m3 step "$W/overflow.log")"
"$EMU" "${COMMON[@]}" "${F16[@]}" --attention gemm --steps 1 --checkpoint-dir "$W/ck" \
  > /dev/null 2> "$W/part1.log" || { tail -30 "$W/part1.log"; fail "cuda fp16 run to step 1"; }
grep -q '"loss_scale": 2000000' "$W"/ck/step-00000001/state.json || fail "no loss scale in the checkpoint: $(cat "$W"/ck/step-00000001/state.json)"
grep -q '"attention": "gemm"' "$W"/ck/step-00000001/state.json || fail "no attention kernels in the checkpoint: $(cat "$W"/ck/step-00000001/state.json)"
"$EMU" "${COMMON[@]}" "${F16[@]}" --steps 4 --checkpoint-dir "$W/ck" --json "$W/part2.json" \
  > /dev/null 2> "$W/part2.log" || { tail -30 "$W/part2.log"; fail "cuda fp16 resume to step 4"; }
grep -q "^device: .*; attention auto: GEMM, as the resumed checkpoint's run (not timed)" "$W/part2.log" ||
  fail "the resumed auto run did not keep the checkpoint's kernels: $(grep -m1 ^device "$W/part2.log")"
DROP=(--hidden-dropout 0.1 --attention-dropout 0.1)
"$CPU" "${COMMON[@]}" "${DROP[@]}" --steps 4 --json "$W/cpu_drop.json" > /dev/null 2> "$W/cpu_drop.log" ||
  { cat "$W/cpu_drop.log"; fail "cpu dropout run"; }
"$EMU" "${COMMON[@]}" "${DROP[@]}" --steps 4 --device cuda --precision fp32 --json "$W/fp32_drop.json" \
  > /dev/null 2> "$W/fp32_drop.log" || { tail -30 "$W/fp32_drop.log"; fail "cuda fp32 dropout run"; }
"$EMU" "${COMMON[@]}" "${DROP[@]}" --steps 4 --device cuda --precision bf16 --attention fused \
  --json "$W/bf16_drop.json" > /dev/null 2> "$W/bf16_drop.log" || { tail -30 "$W/bf16_drop.log"; fail "cuda bf16 dropout run"; }
"$CPU" "${COMMON[@]}" "${DROP[@]}" --steps 2 --checkpoint-dir "$W/ckd" > /dev/null 2> "$W/drop1.log" ||
  { cat "$W/drop1.log"; fail "cpu dropout run to step 2"; }
"$CPU" "${COMMON[@]}" "${DROP[@]}" --steps 4 --checkpoint-dir "$W/ckd" --json "$W/drop2.json" > /dev/null \
  2> "$W/drop2.log" || { cat "$W/drop2.log"; fail "cpu dropout resume to step 4"; }

python3 - "$W" <<'PY' || fail "the CUDA trainer does not match"
import json, os, sys
w = sys.argv[1]
steps = lambda f: json.load(open(os.path.join(w, f)))["steps"]
cpu, fp32, bf16, fp16 = steps("cpu.json"), steps("fp32.json"), steps("bf16.json"), steps("fp16.json")
bf16_gemm = steps("bf16_gemm.json")
bf16_auto, bf16_det = steps("bf16_auto.json"), steps("bf16_det.json")
over, part2 = steps("overflow.json"), steps("part2.json")
for run in (fp32, bf16, fp16, over):
    assert [s["step"] for s in run] == [1, 2, 3, 4], run
rel = lambda a, b: abs(a - b) / abs(b)
worst = 0.0
for c, g in zip(cpu, fp32):
    for k in ("loss", "fusion", "mft", "detector", "candidate", "grad_norm"):
        worst = max(worst, rel(g[k], c[k]))
        assert rel(g[k], c[k]) <= 1e-4, ("fp32", c["step"], k, g[k], c[k])
half = {}
for name, run in (("bf16", bf16), ("fp16", fp16), ("bf16 GEMM attention", bf16_gemm),
                  ("bf16 auto attention", bf16_auto), ("bf16 deterministic", bf16_det)):
    half[name] = max(rel(g["loss"], c["loss"]) for c, g in zip(cpu, run))
    assert half[name] <= 2e-2, (name, [(g["loss"], c["loss"]) for c, g in zip(cpu, run)])
assert all(s["loss_scale"] == 65536 and not s["skipped"] for s in fp16), fp16
assert over[0]["skipped"] and over[0]["grad_norm"] is None and over[0]["loss_scale"] == 2e6, over[0]
assert not all(s["skipped"] for s in over), over
assert [s["step"] for s in part2] == [2, 3, 4], part2
for a, b in zip(over[1:], part2):
    for k in ("loss", "loss_scale", "skipped", "grad_norm"):
        assert a[k] == b[k], ("resume", a["step"], k, b[k], a[k])
cpu_drop, fp32_drop, bf16_drop, drop2 = (steps("cpu_drop.json"), steps("fp32_drop.json"), steps("bf16_drop.json"),
                                         steps("drop2.json"))
drop_worst = 0.0
for c, g in zip(cpu_drop, fp32_drop):
    for k in ("loss", "fusion", "mft", "detector", "candidate", "grad_norm"):
        drop_worst = max(drop_worst, rel(g[k], c[k]))
        assert rel(g[k], c[k]) <= 1e-4, ("fp32 dropout", c["step"], k, g[k], c[k])
drop_half = max(rel(g["loss"], c["loss"]) for c, g in zip(cpu_drop, bf16_drop))
assert drop_half <= 2e-2, ("bf16 dropout", [(g["loss"], c["loss"]) for c, g in zip(cpu_drop, bf16_drop)])
assert all(rel(d["loss"], c["loss"]) > 1e-4 for c, d in zip(cpu, cpu_drop)), ("dropout did not change the losses",
                                                                            cpu, cpu_drop)
assert [s["step"] for s in drop2] == [3, 4], drop2
for a, b in zip(cpu_drop[2:], drop2):
    for k in ("loss", "grad_norm"):
        assert a[k] == b[k], ("dropout resume", a["step"], k, b[k], a[k])
print(f"dropout 0.1: fp32 worst relative difference {drop_worst:.2e}, bf16 loss {drop_half:.2e}, "
      f"resumed steps 3-4 {[round(s['loss'], 6) for s in drop2]}")
print(f"fp32 worst relative difference {worst:.2e}; bf16 worst loss difference {half['bf16']:.2e} "
      f"(GEMM attention {half['bf16 GEMM attention']:.2e}), "
      f"fp16 {half['fp16']:.2e}; fp16 from scale 4e6: skipped {[s['step'] for s in over if s['skipped']]}, "
      f"scales {[s['loss_scale'] for s in over]}; resumed steps 2-4 {[round(s['loss'], 6) for s in part2]} "
      f"vs {[round(s['loss'], 6) for s in over[1:]]}")
PY
echo "PASS"
