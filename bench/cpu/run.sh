#!/usr/bin/env bash
# CPU training throughput of DGCA-ReLM `small`: dgca (build/bench/dgca-bench-cpu)
# vs PyTorch (bench/cpu/torch_cpu_bench.py, same model from bench/torch_dgca.py),
# micro-batch 16, seq 128, all heads on, 1 and 2 threads, in one run.
# Every timed run holds the build lock (/tmp/dgca-build.lock) so no build
# runs meanwhile; the load average is recorded beside each number.
# Usage: bench/cpu/run.sh [steps] [warmup]   (PYTHON=/path/to/venv/python)
# Writes bench/cpu/RESULTS.md; with DROPOUT=P (hidden and attention dropout
# on both sides) bench/cpu/RESULTS-dropout.md instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${1:-8}
WARMUP=${2:-2}
PY=${PYTHON:-/tmp/m2a-venv/bin/python}
LOCK=${DGCA_BUILD_LOCK:-/tmp/dgca-build.lock}
DROPOUT=${DROPOUT:-0}
RESULTS=bench/cpu/RESULTS.md
[ "$DROPOUT" = 0 ] || RESULTS=bench/cpu/RESULTS-dropout.md
tools/build.sh dgca-bench-cpu >/dev/null
OUT=$(mktemp -d)
for t in 1 2; do
  for impl in dgca pytorch; do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    if [ $impl = dgca ]; then
      flock "$LOCK" build/bench/dgca-bench-cpu --preset small --batch 16 --seq 128 \
        --threads $t --steps "$STEPS" --warmup "$WARMUP" --dropout "$DROPOUT" 2>/dev/null > "$OUT/$impl.$t.json"
    else
      OMP_NUM_THREADS=$t MKL_NUM_THREADS=$t flock "$LOCK" "$PY" bench/cpu/torch_cpu_bench.py \
        --preset small --batch 16 --seq 128 --threads $t --steps "$STEPS" --warmup "$WARMUP" \
        --dropout "$DROPOUT" 2>/dev/null > "$OUT/$impl.$t.json"
    fi
    echo "$load" > "$OUT/$impl.$t.load"
  done
done
"$PY" - "$OUT" "$STEPS" "$WARMUP" "$DROPOUT" "$RESULTS" <<'PYEOF'
import json, sys, datetime, platform, subprocess
out, steps, warmup, dropout, results = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
import torch, transformers
rows = []
for t in (1, 2):
    d = json.load(open(f"{out}/dgca.{t}.json"))
    p = json.load(open(f"{out}/pytorch.{t}.json"))
    ld, lp = open(f"{out}/dgca.{t}.load").read().strip(), open(f"{out}/pytorch.{t}.load").read().strip()
    rows.append(("dgca", t, d["samples_per_second"], d["step_seconds"], d["samples_per_second"] / p["samples_per_second"], ld))
    rows.append(("pytorch", t, p["samples_per_second"], p["step_seconds"], 1.0, lp))
hdr = "| impl | threads | samples/s | step s (median) | ratio dgca/pytorch | load avg (1/5/15 min) before run |"
lines = [hdr, "|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.3f} | {r[4]:.2f} | {r[5]} |")
table = "\n".join(lines)
print(table)
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][0]
blas = subprocess.run("dpkg-query -W -f='${Version}' libopenblas0-pthread libopenblas0 2>/dev/null | head -c 40",
                      shell=True, capture_output=True, text=True).stdout
now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
drop = f", dropout {dropout:g}" if dropout else ""
with open(results, "w") as f:
    f.write(f"""# CPU training throughput: dgca vs PyTorch (DGCA-ReLM `small`{drop})

Produced by `{"DROPOUT=%g " % dropout if dropout else ""}bench/cpu/run.sh {steps} {warmup}` on {now}.
Model: `small` preset (4 layers, H 256, 4 heads, FFN 1024, vocab 21128), all
heads on (LSTM prompt P=3, detector, candidate K=8, gated fusion), 11,682,443
parameters on both sides (dgca ParamStore::parameter_count = CountParameters = PyTorch
sum of numel). Batch: micro-batch 16, seq 128, 60 characters per row (no
padding), synthetic layout of `bench/torch_dgca.py make_batch` (dgca builds
the same layout in `bench/cpu/cpu_train_bench.cc`). Dropout on hidden
states and attention probabilities: {dropout:g} on both sides (dgca's masks
are a hash per element, model/core/dropout.h; PyTorch's its RNG).
Timed: zero grads +
forward + backward + AdamW; {warmup} warmup steps excluded; median of {steps}.
Each run held `/tmp/dgca-build.lock` (no build in parallel); other
engineers' tests may still have been running, hence the load column.

Machine: {cpu}, {platform.machine()}, 2 cores. PyTorch {torch.__version__}
(MKL/oneDNN), transformers {transformers.__version__}; dgca with OpenBLAS
{blas or '(version unknown)'} (Release build).

{table}
""")
PYEOF
rm -rf "$OUT"
