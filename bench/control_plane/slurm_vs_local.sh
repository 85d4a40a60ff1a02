#!/usr/bin/env bash
# Submit-to-first-step of one 2-rank CPU job on a local agent and through
# Slurm (resources.launcher: slurm, one node), side by side on one
# coordinator in one run (docs/slurm.md, bench/control_plane/README.md).
#
# Starts a real Slurm (tools/slurm-local.sh, needs root), a coordinator
# without its embedded agent, and one `dgca-worker agent` joined to it (the
# local case, already running as local agents are). Runs are interleaved
# local, slurm, local, slurm, ... so that load drifts hit both alike.
# Usage: bench/control_plane/slurm_vs_local.sh [runs=5]
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5}
PY=${PYTHON:-python3}
DATA=${DGCA_SHARED_DATA:-/work/shared/data}
tools/build.sh dgca dgca-coordinator dgca-worker >/dev/null
B=$PWD/build
DIR=$(mktemp -d /tmp/dgca-slurm-bench.XXXXXX)
chmod 755 "$DIR"  # munged runs as user munge (tools/slurm-local.sh)
cleanup() {
  [ -z "${APID:-}" ] || kill "$APID" 2>/dev/null || true
  [ -z "${CPID:-}" ] || kill "$CPID" 2>/dev/null || true
  wait 2>/dev/null || true
  tools/slurm-local.sh stop "$DIR/slurm" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
out=$(tools/slurm-local.sh start "$DIR/slurm")
eval "export $(grep -E '^(SLURM_CONF|SLURM_NODES|DGCA_ADVERTISE_HOST|DGCA_GLOO_IFACE)=' <<<"$out" | tr '\n' ' ')"
echo "slurm: $SLURM_NODES node(s), $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ADDR="$DGCA_ADVERTISE_HOST:$PORT"
mkdir -p "$DIR/state"
"$B/coordinator/dgca-coordinator" --listen "$ADDR" --metrics-listen 127.0.0.1:0 \
  --state-dir "$DIR/state" --no-local-agent --worker-binary "$B/worker/dgca-worker" \
  > "$DIR/coordinator.log" 2>&1 &
CPID=$!
for _ in $(seq 1 300); do [ -f "$DIR/state/coordinator.json" ] && break; sleep 0.1; done
TOK="$DIR/state/token"
"$B/worker/dgca-worker" agent --coordinator "$ADDR" --token-file "$DIR/state/agent-token" --node-name local \
  --state-dir "$DIR/agent" > "$DIR/agent.log" 2>&1 &
APID=$!
for _ in $(seq 1 100); do
  "$B/cli/dgca" --coordinator "$ADDR" --token-file "$TOK" nodes 2>/dev/null | grep -q '^local ' && break
  sleep 0.1
done
. bench/control_plane/tiny_spec.sh
LOCAL=$(tiny_spec "$DIR" local 100000)
SLURM=$(tiny_spec "$DIR" slurm 100000 ", launcher: slurm, slurm: {nodes: 1}")
echo "== submit-to-first-step, $RUNS runs each, load $(cut -d' ' -f1-3 /proc/loadavg)"
: > "$DIR/runs.jsonl"
for i in $(seq 1 "$RUNS"); do
  "$PY" bench/control_plane/latency.py "$B/cli/dgca" "$ADDR" "$TOK" "$LOCAL" 1 local |
    grep -v summary | tee -a "$DIR/runs.jsonl"
  "$PY" bench/control_plane/latency.py "$B/cli/dgca" "$ADDR" "$TOK" "$SLURM" 1 slurm |
    grep -v summary | tee -a "$DIR/runs.jsonl"
done
echo "   load after $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$DIR/runs.jsonl" "$DIR/coordinator.log" "$DIR/slurm/log/slurmctld.log" <<'PYEOF'
import datetime, json, re, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def med(label, key):
    xs = [r[key] for r in runs if r["label"] == label and r.get(key) is not None]
    return statistics.median(xs) if xs else None
def first_all(r):
    v = list(r["first_step_s"].values())
    return max(v) if len(v) == 2 else None
for r in runs:
    r["first_all"] = first_all(r)
fmt = lambda x: "-" if x is None else f"{x:.2f}"
print("| launcher | runs | submit returned (s) | Slurm job id seen (s) | Slurm RUNNING seen (s) | dgca RUNNING (s) | both ranks' first step (s) |")
print("|---|---|---|---|---|---|---|")
for label in ("local", "slurm"):
    n = sum(1 for r in runs if r["label"] == label and r["first_all"] is not None)
    print(f"| {label} | {n} | {fmt(med(label, 'submit_returned_s'))} | {fmt(med(label, 'slurm_job_seen_s'))} "
          f"| {fmt(med(label, 'slurm_running_seen_s'))} | {fmt(med(label, 'running_s'))} | {fmt(med(label, 'first_all'))} |")
l, s = med("local", "first_all"), med("slurm", "first_all")
if l and s:
    print(f"\nSlurm / local first step: {s / l:.2f}x; the Slurm overhead is {s - l:.2f} s (median)")

# Where the Slurm jobs' time went, from the coordinator's and slurmctld's
# logs (one clock): sbatch -> slurmctld allocates -> the agent registers ->
# the ranks are launched.
def ts(text):
    return datetime.datetime.fromisoformat(text.replace("T", " ")).timestamp()
submitted, allocated, registered, running, slurm_of = {}, {}, {}, {}, {}
for line in open(sys.argv[2], errors="replace"):
    m = re.match(r"\[([\d-]+ [\d:.]+)\] \[info\] job (\S+): attempt \d+ submitted to Slurm as job (\d+)", line)
    if m:
        slurm_of[m.group(2)] = m.group(3)
        continue
    m = re.match(r"\[([\d-]+ [\d:.]+)\] \[info\] node \S+-slurm(\d+) registered", line)
    if m:
        registered.setdefault(m.group(2), ts(m.group(1)))
        continue
    m = re.match(r"\[([\d-]+ [\d:.]+)\] \[info\] job (\S+): \[state\] RUNNING running", line)
    if m:
        running.setdefault(m.group(2), ts(m.group(1)))
for line in open(sys.argv[3], errors="replace"):
    m = re.match(r"\[([\dT:.-]+)\] _slurm_rpc_submit_batch_job: JobId=(\d+)", line)
    if m:
        submitted[m.group(2)] = ts(m.group(1))
        continue
    m = re.match(r"\[([\dT:.-]+)\] (?:sched: Allocate|backfill: Started) JobId=(\d+)", line)
    if m:
        allocated.setdefault(m.group(2), ts(m.group(1)))
queue, launch, dgca = [], [], []
for job, sid in slurm_of.items():
    if sid in submitted and sid in allocated:
        queue.append(allocated[sid] - submitted[sid])
    if sid in allocated and sid in registered:
        launch.append(registered[sid] - allocated[sid])
    if sid in registered and job in running:
        dgca.append(running[job] - registered[sid])
if queue and launch and dgca:
    print("\n| Slurm job's stage (median of %d) | seconds |" % len(queue))
    print("|---|---|")
    print(f"| sbatch accepted -> slurmctld allocates the node | {statistics.median(queue):.3f} |")
    print(f"| allocated -> batch script, srun, agent started and registered | {statistics.median(launch):.3f} |")
    print(f"| agent registered -> plan made and ranks launched (dgca) | {statistics.median(dgca):.3f} |")
PYEOF
