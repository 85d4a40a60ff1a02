#!/usr/bin/env bash
# The compute prior against reality on this machine's CPU: the first plan of
# a job, made before anything ran (a fresh coordinator per case: no
# all-reduce sweep, no earlier job, no learned efficiency), against what the
# job then measured. Every number comes through the product: the prediction
# is the job's stored plan, the measurement its plan check (`dgca status
# --json`: medians over every rank's steps after its first two).
#
# Cases are RANKS:THREADS_PER_RANK:PRESET:MICRO_BATCH, accumulation 1, seq
# 40, vocab BERT-Chinese (21128 rows). With 2 ranks the all-reduce is the
# link prior's (Gloo over loopback), so the step error is the whole first
# plan's, not the compute prior's alone; the compute columns separate them
# (predicted c(m) = step x (1 - comm share) / k).
# Every job holds /tmp/dgca-build.lock while it runs, so builds (which take
# the same lock) do not run beside it; the load before each is reported.
# Then the same prior for the GPU against the steps bench/gpu/RESULTS.md
# measured on an H200 (dgca-bench-prior-gpu: the planner's code, the
# measured figures cited from that file).
# Usage: bench/planner/prior.sh   (prints the tables; writes bench/planner/RESULTS-prior.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
LOCK=${DGCA_BUILD_LOCK:-/tmp/dgca-build.lock}
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
CASES=${CASES:-"1:2:tiny:8 1:2:tiny:32 1:2:small:8 1:2:small:32 2:1:tiny:8 2:1:tiny:16 2:1:small:8 2:1:small:16"}
OUT=${OUT:-bench/planner/RESULTS-prior.md}
tools/build.sh dgca dgca-coordinator dgca-worker dgca-bench-prior-gpu >/dev/null
B=build
DIR=$(mktemp -d /tmp/dgca-prior-bench.XXXXXX)
CPID=
stop_coordinator() {
  if [ -n "$CPID" ]; then kill "$CPID" 2>/dev/null || true; wait "$CPID" 2>/dev/null || true; fi
  CPID=
}
trap 'stop_coordinator; [ -n "${KEEP:-}" ] || rm -rf "$DIR"' EXIT
RES="$DIR/results.jsonl"

run_case() {  # ranks threads preset m
  local ranks=$1 threads=$2 preset=$3 m=$4 steps state="$DIR/state-$1-$2-$3-$4"
  if [ "$preset" = tiny ]; then steps=40; else steps=16; fi
  "$B/coordinator/dgca-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --state-dir "$state" > "$state.log" 2>&1 &
  CPID=$!
  for _ in $(seq 1 300); do [ -f "$state/coordinator.json" ] && break; sleep 0.1; done
  local addr
  addr=$(sed -n 's/.*"listen": *"\([^"]*\)".*/\1/p' "$state/coordinator.json")
  local DG=("$B/cli/dgca" --coordinator "$addr" --token-file "$state/token")
  local spec="$DIR/$ranks-$threads-$preset-$m.yaml"
  cat > "$spec" <<YAML
name: prior-$ranks-$threads-$preset-m$m
model: {preset: $preset, vocab: $DATA/vocab/vocab.txt}
data:
  train: $DATA/ecspell/train_law.txt
  eval: $DATA/ecspell/test_law.txt
  max_seq_len: 40
train:
  steps: $steps
  global_batch: $((ranks * m))
  micro_batch: $m
  accumulation: 1
  eval_every: 0
  checkpoint_every: 0
resources: {ranks: $ranks, device: cpu, threads_per_rank: $threads}
tuning: {mode: model}
YAML
  # The first plan, as `dgca plan` shows it once the agent has registered
  # (and measured the CPU's GEMM rate).
  for _ in $(seq 1 100); do
    "${DG[@]}" plan "$spec" --json > "$DIR/plan-first.json" 2>/dev/null && break
    sleep 0.1
  done
  local load job
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  job=$(flock "$LOCK" bash -c '
    j=$("$@" submit "'"$spec"'" 2>/dev/null | awk "{print \$NF}")
    "$@" watch "$j" > /dev/null 2>&1 || true
    echo "$j"' _ "${DG[@]}")
  "${DG[@]}" status "$job" --json > "$DIR/status.json"
  cp "$DIR/status.json" "$state.status.json"
  "${DG[@]}" plan "$spec" --json > "$DIR/plan-after.json"
  stop_coordinator
  python3 - "$ranks" "$threads" "$preset" "$m" "$load" "$DIR/status.json" "$DIR/plan-after.json" "$DIR/plan-first.json" >> "$RES" <<'PY'
import json, sys
ranks, threads, preset, m, load, statusf, afterf, firstf = sys.argv[1:]
job = json.load(open(statusf))["job"]; pc = job.get("plan_check", {}); plan = json.load(open(firstf))
after = json.load(open(afterf))
why = next((d["reason"] for d in plan.get("decisions", []) if d["name"] == "predicted.step_seconds"), "")
k = max(1, int(plan.get("accumulation", 1)))
ps, psh = float(pc.get("predicted_step_seconds", 0)), float(pc.get("predicted_comm_share", 0))
print(json.dumps(dict(ranks=int(ranks), threads=int(threads), preset=preset, m=int(m), load=load,
    job=job["id"], state=job.get("state"), source=plan.get("compute_source", ""),
    device_class=plan.get("compute_device_class", ""),
    pred_step=ps, meas_step=float(pc.get("measured_step_seconds", 0)),
    pred_compute=ps * (1 - psh) / k, meas_compute=float(pc.get("measured_compute_seconds", 0)),
    pred_share=psh, meas_share=float(pc.get("measured_comm_share", 0)),
    samples=int(pc.get("samples", 0)), why=why,
    ideal=float(plan.get("compute_ideal_fixed_seconds", 0)) + int(m) * float(plan.get("compute_ideal_seconds_per_sample", 0)),
    after_source=after.get("compute_source", ""), after_pred_step=float(after.get("predicted_step_seconds", 0)))))
PY
  python3 -c "
import json; r=json.loads(open('$RES').read().splitlines()[-1])
e=lambda p,m: '%+.1f%%' % ((p-m)/m*100) if p and m else '-'
print('  %d rank(s) x %d thread(s) %-5s m=%-2d %s step %.4f/%.4f s (%s) compute %.4f/%.4f s (%s) [%s, %d rank-steps]' % (
  r['ranks'], r['threads'], r['preset'], r['m'], r['job'], r['pred_step'], r['meas_step'],
  e(r['pred_step'], r['meas_step']), r['pred_compute'], r['meas_compute'],
  e(r['pred_compute'], r['meas_compute']), r['source'], r['samples']))"
}

for c in $CASES; do IFS=: read -r r t p m <<< "$c"; run_case "$r" "$t" "$p" "$m"; done

python3 - "$RES" "$OUT" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1])]
def err(p, m):
    return "%+.1f" % ((p - m) / m * 100) if p and m else "-"
hdr = ("| ranks x threads | preset | micro-batch | job | c(m) from | predicted step s | measured step s "
       "| step error % | predicted compute s | measured compute s | compute error % | predicted comm share "
       "| measured comm share | rank-steps | load avg before |")
lines = [hdr, "|" + "---|" * 15]
for r in rows:
    lines.append(f"| {r['ranks']} x {r['threads']} | {r['preset']} | {r['m']} | {r['job']} | {r['source'] or 'none'} | "
                 f"{r['pred_step']:.4f} | {r['meas_step']:.4f} | {err(r['pred_step'], r['meas_step'])} | "
                 f"{r['pred_compute']:.4f} | {r['meas_compute']:.4f} | {err(r['pred_compute'], r['meas_compute'])} | "
                 f"{r['pred_share']:.3f} | {r['meas_share']:.3f} | {r['samples']} | {r['load']} |")
t = "\n".join(lines)
ok = [r for r in rows if r["pred_step"] > 0 and r["meas_step"] > 0]
within = sum(abs(r["pred_step"] - r["meas_step"]) <= 0.25 * r["meas_step"] for r in ok)
within_c = sum(abs(r["pred_compute"] - r["meas_compute"]) <= 0.25 * r["meas_compute"] for r in ok)
eff = sorted(r["ideal"] / r["meas_compute"] for r in ok if r["ideal"] > 0 and r["meas_compute"] > 0)
med = eff[len(eff) // 2] if eff else 0
summary = (f"First plans within 25% of the measured step: {within}/{len(ok)}; compute per micro-step "
           f"within 25%: {within_c}/{len(ok)}. Efficiency each job reached (ideal c(m) at the measured "
           f"GEMM rate / measured c(m)): " + ", ".join("%.2f" % x for x in eff) + f"; median {med:.2f}.")
after = "\n".join(f"- {r['ranks']} x {r['threads']} {r['preset']} m={r['m']}: next plan's c(m) from "
                  f"{r['after_source'] or 'none'}, predicted step {r['after_pred_step']:.4f} s" for r in rows)
print(t); print(summary)
now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
reasons = "\n".join(f"- {r['ranks']} x {r['threads']} {r['preset']} m={r['m']}: {r['why']}" for r in rows[:2])
open(sys.argv[2], "w").write(
    f"# The compute prior against CPU jobs on this machine\n\n"
    f"`bench/planner/prior.sh` on {now}; method in the script's header. Predicted = the first plan of\n"
    f"the job, made by a fresh coordinator with nothing measured; measured = the job's plan check.\n\n"
    f"{t}\n\n{summary}\n\n"
    f"After each job, the same spec planned again on the same coordinator (its measurements replace\n"
    f"the prior):\n\n{after}\n\n"
    f"The first plans' arithmetic (decision `predicted.step_seconds`), two of them:\n\n{reasons}\n")
PY
{
  echo
  echo "## The GPU prior against bench/gpu/RESULTS.md"
  echo
  echo '`dgca-bench-prior-gpu` (bench/planner/prior_gpu.cc):'
  echo
  "$B/bench/dgca-bench-prior-gpu"
} | tee -a "$OUT"
