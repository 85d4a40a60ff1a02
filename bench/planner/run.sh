#!/usr/bin/env bash
# The coordinator's own plan (`dgca plan`) against what
# CPU Gloo jobs then measure, on this machine. Nothing here feeds the planner
# by hand: every number comes through the product.
#
#  1. `dgca diagnose comm --ranks 2 --device cpu`: the coordinator stores the
#     all-reduce sweep; plans for 2 CPU ranks cite it.
#  2. Calibration jobs (per preset, micro-batches 4 and 12): the coordinator
#     records each finished job's plan check (medians over every rank's
#     steady-state steps, from the step metrics the ranks stream): compute
#     per micro-step c(m) (step minus exposed communication) for the next plan
#     of the same model on the same nodes, and the in-job all-reduce time
#     against the probe's prediction.
#  3. Test cases (micro-batches 8 and 16, buckets 1 and 25 MB, none of them a
#     calibrated micro-batch... except that each finished test job is itself
#     stored, as it is in normal use): `dgca plan SPEC --json` for the
#     prediction, then `dgca submit` + `dgca watch`, then `dgca status --json`
#     for the job's plan check (predicted = the plan the job ran with).
# 2 ranks x 1 thread, k = 1, seq 40, vocab BERT-Chinese (21128 rows).
# Every job holds /tmp/dgca-build.lock while it runs, so builds (which take
# the same lock) do not run beside it; other load is reported per row.
# Usage: bench/planner/run.sh   (prints a table; writes bench/planner/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
LOCK=${DGCA_BUILD_LOCK:-/tmp/dgca-build.lock}
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
CALIBRATION=${CALIBRATION:-"tiny:4:25 tiny:12:25 small:4:25 small:12:25"}
CASES=${CASES:-"tiny:8:1 tiny:16:25 small:8:1 small:16:25"}
tools/build.sh dgca dgca-coordinator dgca-worker >/dev/null
B=build
DIR=$(mktemp -d /tmp/dgca-plan-bench.XXXXXX)
"$B/coordinator/dgca-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --state-dir "$DIR/state" > "$DIR/coordinator.log" 2>&1 &
CPID=$!
trap 'kill $CPID 2>/dev/null; wait $CPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 300); do [ -f "$DIR/state/coordinator.json" ] && break; sleep 0.1; done
ADDR=$(sed -n 's/.*"listen": *"\([^"]*\)".*/\1/p' "$DIR/state/coordinator.json")
DG=("$B/cli/dgca" --coordinator "$ADDR" --token-file "$DIR/state/token")
echo "load $(cut -d' ' -f1-3 /proc/loadavg): dgca diagnose comm"
flock "$LOCK" "${DG[@]}" diagnose comm --ranks 2 --device cpu > "$DIR/comm.txt" 2>&1
sed 's/^/  /' "$DIR/comm.txt" | tail -n 12
RES="$DIR/results.jsonl"

run_case() {  # role preset m bucket
  local role=$1 preset=$2 m=$3 bucket=$4 steps
  if [ "$preset" = tiny ]; then steps=50; else steps=20; fi
  local spec="$DIR/$role-$preset-$m-$bucket.yaml"
  cat > "$spec" <<YAML
name: plan-$role-$preset-m$m-b$bucket
model: {preset: $preset, vocab: $DATA/vocab/vocab.txt}
data:
  train: $DATA/ecspell/train_law.txt
  eval: $DATA/ecspell/test_law.txt
  max_seq_len: 40
train:
  steps: $steps
  global_batch: $((2 * m))
  micro_batch: $m
  accumulation: 1
  eval_every: 0
  checkpoint_every: 0
resources: {ranks: 2, device: cpu, threads_per_rank: 1}
comm: {backend: gloo, bucket_mb: $bucket}
tuning: {mode: model}
YAML
  "${DG[@]}" plan "$spec" --json > "$DIR/plan.json"
  "${DG[@]}" plan "$spec" | grep -E "predicted" | head -n 1 | sed 's/^/    /' || true
  local load job
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  # Submit and follow under one lock hold: the job's ranks run only while
  # nothing else that respects the lock does.
  job=$(flock "$LOCK" bash -c '
    j=$("$@" submit "'"$spec"'" 2>/dev/null | awk "{print \$NF}")
    "$@" watch "$j" > /dev/null 2>&1 || true
    echo "$j"' _ "${DG[@]}")
  "${DG[@]}" status "$job" --json > "$DIR/status.json"
  python3 - "$role" "$preset" "$m" "$bucket" "$load" "$DIR/plan.json" "$DIR/status.json" >> "$RES" <<'PY'
import json, sys
role, preset, m, bucket, load, planf, statusf = sys.argv[1:]
plan = json.load(open(planf)); st = json.load(open(statusf))
job = st["job"]; pc = job.get("plan_check", {})
why = next((d["reason"] for d in plan.get("decisions", []) if d["name"] == "predicted.step_seconds"), "")
print(json.dumps(dict(role=role, preset=preset, m=int(m), bucket_mb=float(bucket), load=load,
    job=job["id"], state=job.get("state"),
    plan_pred_step=plan.get("predicted_step_seconds", 0), plan_pred_share=plan.get("predicted_comm_share", 0),
    pred_step=pc.get("predicted_step_seconds", 0), meas_step=pc.get("measured_step_seconds", 0),
    pred_share=pc.get("predicted_comm_share", 0), meas_share=pc.get("measured_comm_share", 0),
    pred_ar=pc.get("predicted_allreduce_seconds", 0), meas_ar=pc.get("measured_allreduce_seconds", 0),
    compute=pc.get("measured_compute_seconds", 0), samples=int(pc.get("samples", 0)),
    factor=plan.get("allreduce_skew_per_compute", 0), why=why)))
PY
  python3 -c "
import json,sys; r=json.loads(open('$RES').read().splitlines()[-1])
e=lambda p,m: '%+.1f%%' % ((p-m)/m*100) if p and m else '-'
print('  %-5s %-5s m=%-2d bucket=%-4g %s step %.4f/%.4f s (%s) share %.3f/%.3f (%s) [%d rank-steps]' % (
  r['role'], r['preset'], r['m'], r['bucket_mb'], r['job'], r['pred_step'], r['meas_step'],
  e(r['pred_step'], r['meas_step']), r['pred_share'], r['meas_share'], e(r['pred_share'], r['meas_share']),
  r['samples']))"
}

for c in $CALIBRATION; do IFS=: read -r p m b <<< "$c"; run_case calib "$p" "$m" "$b"; done
for c in $CASES; do IFS=: read -r p m b <<< "$c"; run_case test "$p" "$m" "$b"; done

python3 - "$RES" "$DIR/comm.txt" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1])]
def err(p, m):
    return "%+.1f" % ((p - m) / m * 100) if p and m else "-"
hdr = ("| role | preset | micro-batch | bucket MB | job | predicted step s | measured step s | step error % "
       "| predicted comm share | measured comm share | share error % | predicted all-reduce s | measured all-reduce s "
       "| peer-wait skew | rank-steps | load avg before |")
lines = [hdr, "|" + "---|" * 16]
for r in rows:
    lines.append(f"| {r['role']} | {r['preset']} | {r['m']} | {r['bucket_mb']:g} | {r['job']} | "
                 f"{r['pred_step']:.4f} | {r['meas_step']:.4f} | {err(r['pred_step'], r['meas_step'])} | "
                 f"{r['pred_share']:.3f} | {r['meas_share']:.3f} | {err(r['pred_share'], r['meas_share'])} | "
                 f"{r['pred_ar']:.4f} | {r['meas_ar']:.4f} | {r['factor']:.3f} | {r['samples']} | {r['load']} |")
t = "\n".join(lines)
print(t)
tests = [r for r in rows if r["role"] == "test" and r["pred_step"] > 0]
ok_step = sum(abs(r["pred_step"] - r["meas_step"]) <= 0.25 * r["meas_step"] for r in tests)
ok_share = sum(abs(r["pred_share"] - r["meas_share"]) <= 0.25 * r["meas_share"] for r in tests)
summary = (f"Test cases within 25%: step time {ok_step}/{len(tests)}, communication share "
           f"{ok_share}/{len(tests)}.")
print(summary)
now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
comm = open(sys.argv[2]).read().strip()
reasons = "\n".join(f"- {r['role']} {r['preset']} m={r['m']} bucket {r['bucket_mb']:g}: {r['why']}"
                    for r in rows if r["why"])
open("bench/planner/RESULTS.md", "w").write(
    f"# Planner: predicted vs measured (CPU Gloo, 2 ranks x 1 thread)\n\n"
    f"`bench/planner/run.sh` on {now}; method in the script's header. Predicted = the plan\n"
    f"the coordinator made for the job (`dgca plan` / the job's stored plan); measured = the\n"
    f"job's plan check (`dgca status JOB`): medians over every rank's steps after its first two.\n\n"
    f"{t}\n\n{summary}\n\n"
    f"The all-reduce sweep the plans cite (`dgca diagnose comm --ranks 2 --device cpu`):\n\n"
    f"```\n{comm}\n```\n\nThe plans' own arithmetic (decision `predicted.step_seconds`):\n\n{reasons}\n")
PY
