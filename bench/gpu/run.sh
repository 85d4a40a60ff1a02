#!/usr/bin/env bash
# The one call for a session with a GPU machine (device tool `run`):
#   bash bench/gpu/run.sh
# Builds model/ alone (-DDGCA_MODEL_ONLY=ON: the GPU machine has CUDA, cmake,
# ninja, PyTorch and transformers but none of the Debian packages) with the
# CUDA backend for sm_90, then:
#   1. PyTorch's own bf16/fp16 errors against fp32, per op and for the
#      whole model (bench/gpu/torch_reference.py --mode op-errors, which
#      uses bench/gpu/model_errors.py: seconds);
#   2. dgca-model-check: every CUDA op, CudaBert, the heads and the whole
#      training step against the CPU reference; the low-precision
#      tolerances are 2x PyTorch's error where step 1 measured it (issue
#      6's rule: 468 of the 802 rows), the built-in ones elsewhere;
#      cuda_ops_test when GoogleTest was found;
#   3. dgca-bench --profile (bert-base, seq 128, batch 128, bf16): samples/s,
#      memory, MFU and where the step's time goes; then without CUDA graphs
#      and with --gemm-attention (the GEMM attention instead of the fused);
#   4. the trainer check (dgca-train cuda vs cpu, fp32) when the data is here;
#   5. the PyTorch peer (torch_reference.py): the same model and batch, bf16
#      autocast, eager and torch.compile.
# Everything goes under $OUT (at most 8 files come back: env.txt build.log
# model_check.txt (with cuda_ops_test and dgca-bench stderr appended)
# dgca_bench.json torch_eager.json torch_compile.json torch_op_errors.json
# torch.log); a summary table is printed last.
#
# Every step runs under `timeout`, within BUDGET_S seconds in all (default
# 540, the device call's 600 s limit less the summary's time), most
# important first (build, model check, dgca's main row, PyTorch eager and
# compile, then the extra rows); each prints one "[run.sh] ..." status line,
# so a call cut short still says how far it got, and intermediate files
# live outside $OUT (never more than the 8 that come back).
#
# Environment: OUT (default: a new temp dir), BUILD_DIR (default
# build-gpu), STEPS/WARMUP for the PyTorch runs (default 20/5), ARCH
# (default 90), SKIP_TORCH=1 to run only the checks, BUDGET_S.
#
# EMULATE=1: a dry run of this whole script on a machine without a GPU
# (the development VM): builds the emulated programs (model/cuda_emu:
# dgca-model-check-emu, dgca-bench-emu, dgca-train-emu) instead of the CUDA
# ones and runs every step at small sizes (tiny preset; PyTorch on the CPU
# with --device cpu when torch is importable, else skipped). The numbers
# mean nothing; the point is that the script, the programs and the summary
# work before a GPU session spends its time on them.
# Exit status: 1 if the build or dgca-model-check failed, else 0.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
W=$(mktemp -d)  # intermediate files: only the final 8 go under $OUT
trap 'rm -rf "$W"' EXIT
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-540} ))
exec 3>&1  # status lines go to the call's output even where a step's stdout is redirected
# shellcheck source=bench/gpu/step.sh
source bench/gpu/step.sh  # step NAME CAP CMD...
BUILD=${BUILD_DIR:-build-gpu}
ARCH=${ARCH:-90}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-5}
PY=${PYTHON:-python3}
JOBS=$(nproc 2>/dev/null || echo 8)
EMULATE=${EMULATE:-0}
if [ "$EMULATE" = 1 ]; then
  BUILD=${BUILD_DIR:-build-gpu-emu}
  SFX=-emu  # program names of the emulated builds
  CMAKE_CUDA="-DDGCA_WITH_CUDA=OFF -DDGCA_CUDA_EMULATOR=ON"
  BENCH_ARGS="--preset tiny --batch 8 --seq 64 --steps 2 --warmup 1"
  TORCH_DEV="--device cpu"
  TORCH_ARGS="$TORCH_DEV --preset tiny --batch 8 --seq 64"
  TRAIN_STEPS=3
  STEPS=2 WARMUP=1
  "$PY" -c 'import torch' 2>/dev/null || SKIP_TORCH=1
else
  SFX=
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  CMAKE_CUDA="-DDGCA_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DCMAKE_CUDA_COMPILER=$NVCC"
  BENCH_ARGS="--preset bert-base --batch 128 --seq 128"
  TORCH_DEV=
  TORCH_ARGS="--preset bert-base --seq 128 --batch 128"
  TRAIN_STEPS=20
fi

{
  date -u
  nvidia-smi 2>&1 | head -20
  "${NVCC:-nvcc}" --version 2>&1 | tail -2
  ls "$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")"/../lib64/libcublasLt.so* 2>&1 | head -3
  cmake --version 2>&1 | head -1
  ninja --version 2>&1 | sed 's/^/ninja /'
  gcc --version 2>&1 | head -1
  "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.version.cuda)' 2>&1
  git log --oneline -1 2>/dev/null
} > "$OUT/env.txt"

t0=$(date +%s)
build_ok=1
# shellcheck disable=SC2086  # CMAKE_CUDA is several flags
step cmake 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDGCA_MODEL_ONLY=ON $CMAKE_CUDA \
  > "$OUT/build.log" 2>&1 || build_ok=0
targets="dgca-model-check$SFX dgca-bench$SFX dgca-train${SFX:+ dgca-train$SFX}"
# (The target list to a file first: grep -q closing the pipe early would fail it under pipefail.)
if [ $build_ok = 1 ] && ninja -C "$BUILD" -t targets all > "$W/targets" 2>/dev/null &&
   grep -q "^cuda_ops_test$SFX:" "$W/targets"; then
  targets="$targets cuda_ops_test$SFX"
fi
# shellcheck disable=SC2086
[ $build_ok = 1 ] && { step build 360 ninja -C "$BUILD" -j "$JOBS" $targets >> "$OUT/build.log" 2>&1 || build_ok=0; }
build_s=$(( $(date +%s) - t0 ))
if [ $build_ok = 0 ]; then
  echo "BUILD FAILED after ${build_s}s; last lines of build.log:"
  tail -40 "$OUT/build.log"
  exit 1
fi

# PyTorch's own low-precision errors first (seconds): the ops', and the
# whole model's (BERT and the training step at the checks' configs,
# bench/gpu/model_errors.py); dgca-model-check's bf16/fp16 tolerances are
# 2x these where measured (the accuracy rule, docs/benchmarks.md).
TOL_ARGS=
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  echo "== op-errors" > "$OUT/torch.log"
  # At most what leaves dgca-model-check (the pass/fail of the call) 200 s.
  cap=$(( DEADLINE - $(date +%s) - 200 ))
  [ $cap -gt 120 ] && cap=120
  # shellcheck disable=SC2086
  step torch-op-errors $cap "$PY" bench/gpu/torch_reference.py --mode op-errors $TORCH_DEV \
    > "$OUT/torch_op_errors.json" 2>> "$OUT/torch.log"
  # Three draws per check: a 2xPT row is its median draw, as PyTorch's side
  # is the median of three draws of its inputs (dgca_model_check.cc).
  grep -q '"errors"' "$OUT/torch_op_errors.json" && TOL_ARGS="--torch-errors $OUT/torch_op_errors.json --draws 3"
fi
# (3 s a draw on an H200; about 40 s a draw on the emulator.)
# shellcheck disable=SC2086
step dgca-model-check "$([ -n "$SFX" ] && echo 400 || echo 150)" "$BUILD/model/dgca-model-check$SFX" $TOL_ARGS \
  > "$OUT/model_check.txt" 2>&1
check_rc=$?
tests_line="cuda_ops_test: not built (no GoogleTest on this machine)"
if [ -x "$BUILD/model/cuda_ops_test$SFX" ]; then
  echo "==================== cuda_ops_test$SFX" >> "$OUT/model_check.txt"
  step cuda_ops_test 90 "$BUILD/model/cuda_ops_test$SFX" > "$W/cuda_ops_test.out" 2>&1
  tests_line="cuda_ops_test: rc=$? ($(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test' "$W/cuda_ops_test.out" | tr '\n' ' '))"
  cat "$W/cuda_ops_test.out" >> "$OUT/model_check.txt"
fi
# dgca's own throughput rows (the same shape as the PyTorch runs): first
# the main one, with CUDA graphs (the encoder segments replay, as in
# training) and the step profile; one JSON object per line.
# shellcheck disable=SC2086
step dgca-bench 90 "$BUILD/model/dgca-bench$SFX" $BENCH_ARGS --precision bf16 --profile --json \
  > "$OUT/dgca_bench.json" 2> "$W/dgca_bench.err"
bench_rc=$?
# The PyTorch peer, eager and torch.compile (its warm-up is the long part).
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  for mode in eager compile; do
    echo "== $mode" >> "$OUT/torch.log"
    cap=90
    [ $mode = compile ] && cap=240
    # shellcheck disable=SC2086
    step "torch-$mode" $cap "$PY" bench/gpu/torch_reference.py --mode $mode $TORCH_ARGS \
      --steps "$STEPS" --warmup "$WARMUP" > "$OUT/torch_$mode.json" 2>> "$OUT/torch.log"
  done
fi
# Then the extra rows: without CUDA graphs (data-parallel overlap, which
# keeps per-layer callbacks, runs so), and with the GEMM attention instead
# of the fused kernels (which to keep as the default is decided by this row).
# shellcheck disable=SC2086
step dgca-bench-no-graphs 60 "$BUILD/model/dgca-bench$SFX" $BENCH_ARGS --precision bf16 --no-cuda-graphs --json \
  >> "$OUT/dgca_bench.json" 2>> "$W/dgca_bench.err" || bench_rc=1
# shellcheck disable=SC2086
step dgca-bench-gemm-attention 60 "$BUILD/model/dgca-bench$SFX" $BENCH_ARGS --precision bf16 --gemm-attention \
  --json >> "$OUT/dgca_bench.json" 2>> "$W/dgca_bench.err" || bench_rc=1
# The attention kernels alone at that shape, fused against GEMM, forward and
# backward (TFLOP/s say how far each is from the tensor cores). Printed in
# the summary, then kept at the end of model_check.txt.
# shellcheck disable=SC2086
step dgca-bench-attention-only 45 "$BUILD/model/dgca-bench$SFX" $BENCH_ARGS --precision bf16 --attention-only \
  --json > "$W/attention.json" 2>> "$W/dgca_bench.err" || bench_rc=1

# The trainer on the GPU (model/cuda/cuda_train_device.h) against the CPU
# trainer: same flags, seed and data, fp32 on both, 20 steps of the tiny
# preset; their step losses must agree (1e-3 relative; the GPU's reductions
# run in another order). Needs train_law.txt and the vocab: ../shared/data,
# or .gpu-data/ carried by the call (bench/gpu/stage_data.sh).
trainer_line="trainer check: skipped (no data: run bench/gpu/stage_data.sh and carry .gpu-data)"
for d in ../shared/data shared/data .gpu-data; do [ -f "$d/ecspell/train_law.txt" ] && DATA=$d && break; done
if [ -n "${DATA:-}" ]; then
  tw="$W/trainer"
  mkdir -p "$tw"
  # The shared confusion set: the GPU machine has no Debian unicode-data
  # for the trainer's built-in homophones.
  confusion=
  [ -f "$DATA/confusion/pinyin_sam.json" ] && confusion="--confusion $DATA/confusion/pinyin_sam.json"
  for dev in cpu cuda; do
    bin="$BUILD/model/dgca-train"
    [ $dev = cuda ] && bin="$BUILD/model/dgca-train$SFX"
    step "dgca-train-$dev" 60 "$bin" --device $dev --precision fp32 --preset tiny --seq 64 --micro-batch 16 \
      --steps $TRAIN_STEPS --lr 1e-3 --train "$DATA/ecspell/train_law.txt" --vocab "$DATA/vocab/vocab.txt" \
      $confusion --json "$tw/$dev.json" > "$tw/$dev.log" 2>&1
    echo "dgca-train --device $dev exit $?" >> "$tw/summary"
  done
  trainer_line=$("$PY" - "$tw" "$TRAIN_STEPS" <<'PYEOF'
import json, os, sys
w, n = sys.argv[1], int(sys.argv[2])
try:
    c = json.load(open(os.path.join(w, "cpu.json")))["steps"]
    g = json.load(open(os.path.join(w, "cuda.json")))["steps"]
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(c, g))
    ok = len(c) == len(g) == n and worst <= 1e-3
    print(f"trainer check: {'PASS' if ok else 'FAIL'}: {n} steps tiny fp32, worst step-loss relative "
          f"difference cuda vs cpu {worst:.2e} (limit 1e-3); step 1 {c[0]['loss']:.6f} vs {g[0]['loss']:.6f}, "
          f"step {n} {c[-1]['loss']:.6f} vs {g[-1]['loss']:.6f}")
except Exception as e:  # noqa: BLE001
    print(f"trainer check: FAIL: {e}")
PYEOF
)
  { echo "==================== trainer check (dgca-train cpu vs cuda)"; cat "$tw/summary"; echo "$trainer_line";
    echo "--- cuda log"; tail -25 "$tw/cuda.log"; } >> "$OUT/model_check.txt"
fi

# Last, with dropout 0.1 on hidden states and probabilities (HF BERT's
# default, a job spec's default): what fine-tuning really runs, beside
# PyTorch eager with the same dropout (not compile: its warm-up is long).
# shellcheck disable=SC2086
step dgca-bench-dropout 60 "$BUILD/model/dgca-bench$SFX" $BENCH_ARGS --precision bf16 --dropout 0.1 --json \
  >> "$OUT/dgca_bench.json" 2>> "$W/dgca_bench.err" || bench_rc=1
if [ "${SKIP_TORCH:-0}" != 1 ]; then
  echo "== eager --dropout 0.1" >> "$OUT/torch.log"
  # shellcheck disable=SC2086
  step torch-eager-dropout 90 "$PY" bench/gpu/torch_reference.py --mode eager --dropout 0.1 $TORCH_ARGS \
    --steps "$STEPS" --warmup "$WARMUP" > "$W/torch_eager_dropout.json" 2>> "$OUT/torch.log"
fi
{ echo "==================== dgca-bench stderr (rc=$bench_rc)"; cat "$W/dgca_bench.err"; } >> "$OUT/model_check.txt"

echo "==================== summary (files under $OUT)"
if [ "$EMULATE" = 1 ]; then
  echo "build: ${build_s}s, CUDA EMULATOR dry run (numbers mean nothing)"
else
  echo "build: ${build_s}s, sm_$ARCH"
fi
cat "$OUT/model_check.txt"
echo "dgca-model-check exit: $check_rc (0 pass, 1 fail, 2 no GPU, 124 timed out, 125 skipped: no time left)"
echo "$tests_line"
echo "$trainer_line"
# The table (PyTorch rows say why they are missing when SKIP_TORCH is set).
"$PY" - "$OUT" "$W" <<'PYEOF'
import json, sys, os
out, work = sys.argv[1], sys.argv[2]
# Precision: dgca keeps activations in bf16 (fp32 master weights); PyTorch
# runs bf16 autocast (LayerNorm and the residual stream stay fp32), as the
# issue prescribes. Peak memory on both: device memory in use after the
# timed steps less the CUDA context's (cudaMemGetInfo).
print("| impl | samples/s | dgca / this | step s (median) | peak GiB (device, less context) | TFLOP/s | MFU |")
print("|---|---|---|---|---|---|---|")
dgca_sps = None
prof = None
fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # CPU runs have no peak memory or MFU
dgca_rows = []  # (label, samples/s), without dropout
dgca_dropout = None  # (label, samples/s) of the dropout row
try:
    lines = [l for l in open(os.path.join(out, "dgca_bench.json")).read().splitlines() if l.strip()]
    if not lines:
        raise RuntimeError("no output")
    for line in lines:
        d = json.loads(line)
        if "samples_per_second" not in d:
            raise RuntimeError(d.get("error", "no samples_per_second"))
        graphs = d.get("cuda_graphs")
        label = (f"dgca {d['precision']} activations" + (" CUDA graphs" if graphs else " no graphs") +
                 f", {d.get('attention', '?')} attention" + (f", dropout {d['dropout']:g}" if d.get("dropout") else ""))
        if dgca_sps is None:
            dgca_sps = d["samples_per_second"]
        if d.get("dropout"):
            dgca_dropout = (label, d["samples_per_second"])
        else:
            dgca_rows.append((label, d["samples_per_second"]))
        print(f"| {label} | {d['samples_per_second']:.1f} | {dgca_sps / d['samples_per_second']:.2f} | "
              f"{d['step_seconds_median']:.4f} | {fmt(d['peak_memory_bytes'] / 2**30, '.2f')} | "
              f"{d['achieved_tflops']:.1f} | {fmt(d.get('mfu'), '.3f')} |")
        if d.get("gemm_fallback_plans"):
            print(f"({label}: {d['gemm_fallback_plans']} GEMM shapes ran the slow fallback kernel)")
        if d.get("gemm_underaligned_plans"):
            print(f"({label}: {d['gemm_underaligned_plans']} GEMM shapes had an operand under 16 bytes aligned: "
                  f"{'; '.join(d.get('gemm_underaligned', []))})")
        if graphs:
            print(f"({label}: {d.get('graph_replays')} passes replayed, {d.get('graph_captures')} captured, "
                  f"{d.get('graph_failures')} failed captures)")
        if d.get("predicted_memory_bytes") and d.get("peak_memory_bytes"):
            print(f"({label}: the planner's memory model predicted {d['predicted_memory_bytes'] / 2**30:.2f} GiB, "
                  f"measured {d['peak_memory_bytes'] / 2**30:.2f} GiB, "
                  f"{d['predicted_memory_bytes'] / d['peak_memory_bytes']:.3f}x)")
        prof = prof or d.get("profile")
except Exception as e:  # noqa: BLE001
    print(f"| dgca bf16 | failed: {e} (see the end of model_check.txt) ||||||")
torch_sps = {}
for mode in ("eager", "compile"):
    try:
        d = json.load(open(os.path.join(out, f"torch_{mode}.json")))
    except Exception as e:  # noqa: BLE001
        print(f"| pytorch {mode} | failed: {e} (see torch.log) ||||||")
        continue
    if "error" in d and "samples_per_second" not in d:
        print(f"| pytorch {mode} | {d['error']} ||||||")
        continue
    torch_sps[mode] = d["samples_per_second"]
    ratio = f"{dgca_sps / d['samples_per_second']:.2f}" if dgca_sps else "-"
    print(f"| pytorch {mode}, bf16 autocast | {d['samples_per_second']:.1f} | {ratio} | {d['step_seconds_median']:.4f} | "
          f"{fmt(d['peak_memory_bytes'] and d['peak_memory_bytes'] / 2**30, '.2f')} | {d['achieved_tflops']:.1f} | "
          f"{fmt(d.get('mfu'), '.3f')} |")
    if d.get("max_memory_allocated_bytes"):
        print(f"(pytorch {mode}: max_memory_allocated {d['max_memory_allocated_bytes'] / 2**30:.2f} GiB, "
              f"reserved {d['max_memory_reserved_bytes'] / 2**30:.2f} GiB; attention {d.get('attention')}"
              + (f"; torch.compile mode {d.get('compile_mode')}" if mode == "compile" else "") + ")")
try:
    d = json.load(open(os.path.join(work, "torch_eager_dropout.json")))
    if "samples_per_second" not in d:
        raise RuntimeError(d.get("error", "no samples_per_second"))
    ratio = f"{dgca_dropout[1] / d['samples_per_second']:.2f}" if dgca_dropout else "-"
    print(f"| pytorch eager, bf16 autocast, dropout {d.get('dropout', 0.1):g} (vs dgca's dropout row) | "
          f"{d['samples_per_second']:.1f} | {ratio} | {d['step_seconds_median']:.4f} | "
          f"{fmt(d['peak_memory_bytes'] and d['peak_memory_bytes'] / 2**30, '.2f')} | {d['achieved_tflops']:.1f} | "
          f"{fmt(d.get('mfu'), '.3f')} |")
except Exception as e:  # noqa: BLE001
    print(f"| pytorch eager, dropout 0.1 | failed: {e} (see torch.log) ||||||")
print("Goal: dgca / eager >= 1.3, dgca / compile >= 1.0.")
for m in ("eager", "compile"):
    if m not in torch_sps:
        print(f"  pytorch {m}: MISSING (see torch.log): that part of the goal is unverified")
for label, sps in dgca_rows:
    ratios = ", ".join(f"{sps / v:.2f}x {m}" for m, v in torch_sps.items())
    if ratios:
        print(f"  {label}: {ratios}")
if prof:
    step = prof["step_ms"] or 1e-9
    print(f"dgca step profile ({prof['steps']} steps without graphs, cudaEvents): {prof['step_ms']:.2f} ms/step, GEMMs "
          f"{prof['gemm_ms']:.2f} ms ({100 * prof['gemm_ms'] / step:.0f}%, {prof['gemms_per_step']} per step)")
    for k, v in prof["phase_ms"].items():
        print(f"  {k:18s} {v:8.2f} ms {100 * v / step:5.1f}%")
auto = {}  # PyTorch autocast's whole-model errors, by dtype (information)
try:
    d = json.load(open(os.path.join(out, "torch_op_errors.json")))
    if "errors" not in d:
        raise RuntimeError(d.get("error", "no errors in the output"))
    auto = d.get("autocast_model_errors", {})
    for dt, e in d["errors"].items():
        print(f"PyTorch {dt} errors vs fp32, ops and whole model run in {dt} (dgca {dt} tolerance = 2x; "
              f"autocast's whole-model error for information):")
        for k, v in e.items():
            a = auto.get(dt, {}).get(k)
            print(f"  {k:38s} " + ("n/a (no kernel)" if v is None else f"{v:.3e}  -> 2x = {2 * v:.3e}") +
                  (f"   autocast {a:.3e}" if a is not None else ""))
except Exception as ex:  # noqa: BLE001
    print(f"op errors: failed: {ex}")
# The accuracy check in one line: the rows held to 2x PyTorch's error and
# the closest of them to its limit.
try:
    peer = []
    against_autocast = []  # whole-model rows against 2x autocast's error (information)
    for line in open(os.path.join(out, "model_check.txt")):
        f = line.split()
        if len(f) >= 5 and f[-2] == "2xPT" and f[-1] in ("PASS", "FAIL"):
            err, tol, dt = float(f[-4]), float(f[-3]), f[-5]
            # A zero tolerance (PyTorch exact, e.g. the embedding gather) met by a zero error is 0 of it.
            peer.append((err / tol if tol > 0 else (0.0 if err == 0 else float("inf")), line.rstrip(), f[-1]))
            keys = [k for k in auto.get(dt, {}) if line.startswith(k)]
            if keys:
                a = auto[dt][max(keys, key=len)]
                against_autocast.append((err / (2 * a) if a > 0 else (0.0 if err == 0 else float("inf")), line.rstrip()))
    if peer:
        worst = max(peer)
        fails = sum(1 for p in peer if p[2] == "FAIL")
        print(f"2x PyTorch rule: {len(peer)} rows, {fails} over 2x PyTorch's error; closest to its limit "
              f"({worst[0]:.2f} of it): {worst[1]}")
    if against_autocast:
        worst = max(against_autocast)
        over = sum(1 for r, _ in against_autocast if r > 1)
        print(f"  (information) the {len(against_autocast)} whole-model rows against 2x autocast's error "
              f"instead: {over} over; worst {worst[0]:.2f}x of it: {worst[1]}")
except Exception as ex:  # noqa: BLE001
    print(f"2x PyTorch rule: failed to read model_check.txt: {ex}")
try:
    d = json.load(open(os.path.join(work, "attention.json")))
    if "rows" not in d:
        raise RuntimeError(d.get("error", "no rows"))
    print(f"attention alone (dgca-bench --attention-only: {d['precision']}, batch {d['batch']}, seq {d['seq']}, "
          f"hidden {d['hidden']}, {d['heads']} heads; TFLOP/s as FlashAttention counts, bwd = 2.5x fwd):")
    print("| kernels | fwd ms | bwd ms | fwd TFLOP/s | bwd TFLOP/s | MiB kept |")
    print("|---|---|---|---|---|---|")
    for r in d["rows"]:
        print(f"| {r['kernel']} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} | {r['fwd_tflops']:.1f} | "
              f"{r['bwd_tflops']:.1f} | {r['bytes'] / 2**20:.1f} |")
    # Which attention to keep as the default (CudaBert: fused): the kernels
    # alone and the whole step, side by side.
    k = {r["kernel"]: r["fwd_ms"] + r["bwd_ms"] for r in d["rows"]}
    step = {label.split(", ")[-1].split()[0]: v for label, v in dgca_rows if "CUDA graphs" in label}
    if "fused" in k and "gemm" in k and k["fused"] > 0:
        verdict = "faster" if k["fused"] < k["gemm"] else "SLOWER"
        line = (f"fused attention is {verdict} than GEMM alone: fwd+bwd {k['fused']:.3f} vs {k['gemm']:.3f} ms "
                f"({k['gemm'] / k['fused']:.2f}x)")
        if "fused" in step and "gemm" in step:
            line += f"; whole step {step['fused']:.1f} vs {step['gemm']:.1f} samples/s ({step['fused'] / step['gemm']:.2f}x)"
        print(line)
    if "auto_keeps" in d:
        print(f"train.attention: auto (the default) would keep the {d['auto_keeps']} kernels at this shape "
              f"(each rank times both at startup; fused unless GEMM is 5% faster)")
except Exception as ex:  # noqa: BLE001
    print(f"attention bench: failed: {ex}")
PYEOF
{ echo "==================== dgca-bench --attention-only"; cat "$W/attention.json"; } >> "$OUT/model_check.txt" 2>/dev/null
{ echo "== eager --dropout 0.1 result"; cat "$W/torch_eager_dropout.json"; } >> "$OUT/torch.log" 2>/dev/null
echo "dgca-bench exit: $bench_rc (main row: 0 ok, 1 fail, 2 no GPU, 124 timed out, 125 skipped; 1 if another row failed): $(head -c 1500 "$OUT/dgca_bench.json")"
[ $check_rc = 0 ] || exit 1
exit 0
