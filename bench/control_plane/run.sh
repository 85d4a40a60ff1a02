#!/usr/bin/env bash
# Control-plane benchmarks: (a) submit-to-first-step latency of a
# 2-rank CPU job, (b) coordinator CPU time per 1,000 metric samples ingested.
# Starts its own coordinator (ports 0, state in a temp dir, embedded agent);
# each measurement holds /tmp/dgca-build.lock so no build runs meanwhile.
# Usage: bench/control_plane/run.sh [latency_runs=5] [samples=20000]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5}
SAMPLES=${2:-200000}
PY=${PYTHON:-python3}
LOCK=${DGCA_BUILD_LOCK:-/tmp/dgca-build.lock}
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
tools/build.sh dgca dgca-coordinator dgca-worker dgca-bench-metrics-ingest >/dev/null
B=build
DIR=$(mktemp -d /tmp/dgca-cp-bench.XXXXXX)
"$B/coordinator/dgca-coordinator" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
  --state-dir "$DIR/state" > "$DIR/coordinator.log" 2>&1 &
CPID=$!
trap 'kill $CPID 2>/dev/null; wait $CPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 1 300); do
  [ -f "$DIR/state/coordinator.json" ] && break
  sleep 0.1
done
field() { sed -n "s/.*\"$1\": *\"\{0,1\}\([^\",}]*\)\"\{0,1\}.*/\1/p" "$DIR/state/coordinator.json" | head -n1; }
ADDR=$(field listen)
TOK="$DIR/state/token"
echo "coordinator pid $CPID at $ADDR"
. bench/control_plane/tiny_spec.sh
if [ "${SKIP_LATENCY:-0}" != 1 ]; then
echo "== (a) submit-to-first-step latency, load $(cut -d' ' -f1-3 /proc/loadavg)"
flock "$LOCK" "$PY" bench/control_plane/latency.py "$B/cli/dgca" "$ADDR" "$TOK" \
  "$(tiny_spec "$DIR" lat 100000)" "$RUNS" | tee "$DIR/latency.jsonl"
echo "   load after $(cut -d' ' -f1-3 /proc/loadavg)"
fi
echo "== (b) coordinator CPU per 1,000 metric samples"
JOB=$("$B/cli/dgca" --coordinator "$ADDR" --token-file "$TOK" submit "$(tiny_spec "$DIR" ingest 1000000)" | awk '{print $NF}')
for _ in $(seq 1 300); do
  "$B/cli/dgca" --coordinator "$ADDR" --token-file "$TOK" status --json "$JOB" 2>/dev/null |
    grep -q '"state": *"[A-Z_]*RUNNING' && break
  sleep 0.1
done
sleep 3  # let both ranks reach their first steps
echo "   job $JOB: $("$B/cli/dgca" --coordinator "$ADDR" --token-file "$TOK" status "$JOB" 2>&1 | head -n 3 | tr '\n' ' ')"
# Samples go in as the job's rank 0 would send them, with its own token
# (a rank token speaks for its job and attempt only; tuning is off, so the
# job runs attempt 0).
RTOK="$DIR/state/jobs/$JOB/rank-0.0.token"
for i in 1 2 3; do
  echo "   run $i, load $(cut -d' ' -f1-3 /proc/loadavg)"
  flock "$LOCK" "$B/bench/dgca-bench-metrics-ingest" --coordinator "$ADDR" --token-file "$RTOK" \
    --job "$JOB" --pid "$CPID" --samples "$SAMPLES"
done
echo "   after: $("$B/cli/dgca" --coordinator "$ADDR" --token-file "$TOK" status "$JOB" 2>&1 | head -n 3 | tr '\n' ' ')"
"$B/cli/dgca" --coordinator "$ADDR" --token-file "$TOK" cancel "$JOB" >/dev/null || true
