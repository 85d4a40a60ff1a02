#!/usr/bin/env bash
# Issue 5, Must show 3: the planner's predicted step time and communication
# share against what CPU Gloo jobs then measure, on this machine.
#
# For each case (preset, micro-batch m, bucket MB), 2 ranks x 1 thread, k = 1,
# seq 40 (train_law rows are >= 16 chars 90% of the time, so batches are full
# length like the synthetic bench batch), vocab = BERT-Chinese (21128):
#  1. measurements the planner needs (PlannerMeasurements):
#     - all-reduce points: `dgca diagnose comm --ranks 2 --device cpu --json`
#       (stored by the coordinator; fitted by the planner: latency + bytes*f/busbw)
#     - step_seconds at micro-batch m: two `dgca-bench-cpu` processes run AT
#       ONCE (the two ranks share the 2 cores and memory bandwidth, as
#       planner.h asks), 1 thread each, same preset/m/seq; the mean of their
#       median steps (forward+backward+AdamW, no communication)
#  2. prediction: `dgca-bench-plan-predict` = the real MakePlan with those
#     measurements and this node's topology probe (`dgca plan` through the
#     coordinator has no step-time measurement yet, so it predicts 0)
#  3. the job: `dgca submit --wait` on a real coordinator; measured from the
#     rank-0 log progress lines (every ~3rd step, step 1 excluded):
#     step s = m / (rank samples/s), comm share = the "exposed E%" field
#     (time the step waited on communication / step time); medians.
# Every timed phase holds /tmp/dgca-build.lock. Prints a table.
# Usage: bench/planner/run.sh        (writes bench/planner/RESULTS.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
LOCK=${DGCA_BUILD_LOCK:-/tmp/dgca-build.lock}
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
CASES=${CASES:-"tiny:8:1 tiny:16:25 small:8:1 small:16:25"}
tools/build.sh dgca dgca-coordinator dgca-worker dgca-bench-cpu dgca-bench-plan-predict >/dev/null
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
flock "$LOCK" "${DG[@]}" diagnose comm --ranks 2 --device cpu --json > "$DIR/comm.json" 2>/dev/null
POINTS=$(python3 -c "
import json,sys; d=json.load(open('$DIR/comm.json'))
print(','.join('%d:%.9f' % (r['bytes'], r['time_us']*1e-6) for r in d['rows']))")
echo "all-reduce points (bytes:seconds): $POINTS"
RES="$DIR/results.jsonl"
for c in $CASES; do
  IFS=: read -r preset m bucket <<< "$c"
  if [ "$preset" = tiny ]; then steps=60; else steps=24; fi
  spec="$DIR/$preset-$m-$bucket.yaml"
  cat > "$spec" <<YAML
name: plan-$preset-m$m-b$bucket
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
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  bsteps=$([ "$preset" = tiny ] && echo 20 || echo 8)
  flock "$LOCK" bash -c "
    $B/bench/dgca-bench-cpu --preset $preset --batch $m --seq 40 --threads 1 --steps $bsteps --warmup 2 > $DIR/b0.json 2>/dev/null &
    $B/bench/dgca-bench-cpu --preset $preset --batch $m --seq 40 --threads 1 --steps $bsteps --warmup 2 > $DIR/b1.json 2>/dev/null
    wait"
  cstep=$(python3 -c "
import json; a=[json.load(open('$DIR/b%d.json'%i))['step_seconds'] for i in (0,1)]; print(sum(a)/2)")
  pred=$("$B/bench/dgca-bench-plan-predict" "$spec" --step-seconds "$cstep" --step-micro-batch "$m" \
         --points "$POINTS" 2> "$DIR/reason.txt")
  # Submit and follow under one lock hold: the job's ranks run only while
  # nothing else that respects the lock does.
  job=$(flock "$LOCK" bash -c '
    j=$("$@" submit "'"$spec"'" 2>/dev/null | awk "{print \$NF}")
    "$@" watch "$j" > /dev/null 2>&1 || true
    echo "$j"' _ "${DG[@]}")
  "${DG[@]}" logs "$job" --rank 0 > "$DIR/rank0.log" 2>&1 || true
  python3 - "$preset" "$m" "$bucket" "$cstep" "$pred" "$DIR/rank0.log" "$load" "$job" >> "$RES" <<'PY'
import json, re, statistics, sys
preset, m, bucket, cstep, pred, log, load, job = sys.argv[1:]
m = int(m); pred = json.loads(pred)
steps, exp, comm = [], [], []
for line in open(log, encoding="utf-8", errors="replace"):
    g = re.search(r"step (\d+)/\d+ loss .* ([0-9.]+) samples/s data \d+% comm (\d+)% exposed (\d+)%", line)
    if g and int(g.group(1)) > 1:
        sps = float(g.group(2))
        if sps > 0:
            steps.append(m / sps); comm.append(float(g.group(3)) / 100); exp.append(float(g.group(4)) / 100)
meas_step = statistics.median(steps) if steps else 0
meas_exp = statistics.median(exp) if exp else 0
print(json.dumps(dict(preset=preset, m=m, bucket_mb=float(bucket), job=job, load=load,
                      measured_compute_step_s=float(cstep), pred_step_s=pred["predicted_step_seconds"],
                      pred_comm_share=pred["predicted_comm_share"],
                      pred_allreduce_s=pred["predicted_allreduce_seconds"],
                      meas_step_s=meas_step, meas_comm_share=meas_exp,
                      meas_allreduce_share=statistics.median(comm) if comm else 0,
                      points=len(steps))))
PY
  tail -n 1 "$RES"
  sed 's/^/    /' "$DIR/reason.txt"
done
python3 - "$RES" "$POINTS" <<'PY'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1])]
def err(p, m):
    return (p - m) / m * 100 if m else float("nan")
hdr = ("| preset | micro-batch | bucket MB | c(m) measured s | predicted step s | measured step s | step error % "
       "| predicted comm share | measured comm share (exposed) | share error % | load avg before |")
lines = [hdr, "|" + "---|" * 11]
for r in rows:
    lines.append(f"| {r['preset']} | {r['m']} | {r['bucket_mb']:g} | {r['measured_compute_step_s']:.4f} | "
                 f"{r['pred_step_s']:.4f} | {r['meas_step_s']:.4f} | {err(r['pred_step_s'], r['meas_step_s']):+.1f} | "
                 f"{r['pred_comm_share']:.3f} | {r['meas_comm_share']:.3f} | "
                 f"{err(r['pred_comm_share'], r['meas_comm_share']):+.1f} | {r['load']} |")
t = "\n".join(lines)
print(t)
now = datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC")
open("bench/planner/RESULTS.md", "w").write(
    f"# Planner: predicted vs measured (CPU Gloo, 2 ranks x 1 thread)\n\n"
    f"`bench/planner/run.sh` on {now}; method in the script's header.\n"
    f"All-reduce points fed to the planner (bytes:seconds, from `dgca diagnose comm`): {sys.argv[2]}\n\n{t}\n")
PY
