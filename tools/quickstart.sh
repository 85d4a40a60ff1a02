#!/usr/bin/env bash
# The quickstart (`make quickstart`, after the Makefile installed the Debian
# packages and built): starts a coordinator with its embedded agent and its
# state under .dgca/, builds the synthetic corpus once, submits
# configs/quickstart.yaml (hidden-64 model from scratch, 2 CPU ranks), follows it to the end,
# prints the evaluation metrics, exports the trained model to .dgca/model
# (`dgca export`) and corrects two sentences of the test set with it (`dgca
# correct`), and prints the /metrics URL.
#
# The coordinator is LEFT RUNNING afterwards so that `build/cli/dgca list`,
# `dgca status JOB`, `dgca logs JOB` and the /metrics endpoint can be explored;
# `tools/quickstart.sh stop` stops it (so does the next quickstart run).
# Exit code: that of `dgca submit --wait` (0 only when the job SUCCEEDED),
# or 1 when the job succeeded but exporting or correcting with its model failed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
STATE=.dgca
COORD="$BUILD_DIR/coordinator/dgca-coordinator"
DGCA="$BUILD_DIR/cli/dgca"
LISTEN=${DGCA_QUICKSTART_LISTEN:-127.0.0.1:7600}
METRICS=${DGCA_QUICKSTART_METRICS:-127.0.0.1:7601}

json_field() {  # json_field FILE NAME -> value of "NAME": "..." or number
  sed -n "s/.*\"$2\": *\"\{0,1\}\([^\",}]*\)\"\{0,1\}.*/\1/p" "$1" | head -n1
}

stop_previous() {
  local f="$STATE/coordinator.json" pid
  [ -f "$f" ] || return 0
  pid=$(json_field "$f" pid)
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] &&
     tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q dgca-coordinator; then
    echo "quickstart: stopping the previous coordinator (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do
      [ -e "/proc/$pid" ] || break
      sleep 0.1
    done
    if [ -e "/proc/$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

if [ "${1:-}" = "stop" ]; then
  stop_previous
  exit 0
fi

for p in "$COORD" "$DGCA" "$BUILD_DIR/worker/dgca-worker"; do
  if [ ! -x "$p" ]; then
    echo "quickstart: $p is missing; build first (make build)" >&2
    exit 2
  fi
done

# 0700 as the coordinator makes it: job store, token and rank logs are this
# user's (a state dir open to others draws a warning at every start).
mkdir -p -m 700 "$STATE"
stop_previous

start_coordinator() {  # start_coordinator LISTEN METRICS -> 0 when up
  echo "quickstart: starting dgca-coordinator on $1 (state in $STATE/, log $STATE/coordinator.log)"
  $SETSID "$COORD" --listen "$1" --metrics-listen "$2" --state-dir "$STATE" \
    >>"$STATE/coordinator.log" 2>&1 </dev/null &
  COORD_PID=$!
  for _ in $(seq 1 300); do
    if [ -f "$STATE/coordinator.json" ] &&
       [ "$(json_field "$STATE/coordinator.json" pid)" = "$COORD_PID" ]; then
      return 0
    fi
    if ! kill -0 "$COORD_PID" 2>/dev/null; then
      echo "quickstart: the coordinator exited; the end of its log:" >&2
      tail -n 5 "$STATE/coordinator.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "quickstart: the coordinator did not come up within 30 s; see $STATE/coordinator.log" >&2
  kill "$COORD_PID" 2>/dev/null || true
  return 1
}

if command -v setsid >/dev/null; then SETSID=setsid; else SETSID=; fi
if ! start_coordinator "$LISTEN" "$METRICS"; then
  # Most often the default ports are taken: any free port will do, since the
  # address is passed on below.
  echo "quickstart: retrying on free ports (127.0.0.1:0)"
  start_coordinator 127.0.0.1:0 127.0.0.1:0 || exit 3
fi
ADDR=$(json_field "$STATE/coordinator.json" listen)
METRICS_ADDR=$(json_field "$STATE/coordinator.json" metrics)
export DGCA_COORDINATOR="$ADDR" DGCA_TOKEN_FILE="$STATE/token"

if [ ! -s "$STATE/data/train.txt" ] || [ ! -s "$STATE/data/test.txt" ]; then
  echo "quickstart: building the synthetic corpus (dgca data synth --out $STATE/data)"
  "$DGCA" data synth --out "$STATE/data"
fi

echo "quickstart: submitting configs/quickstart.yaml (DGCA-ReLM, hidden 64, 2 CPU ranks)"
START=$(date +%s)
set +e
# stdout's first line is the job id; the rest is shown as it comes.
"$DGCA" submit configs/quickstart.yaml --wait | tee "$STATE/quickstart-submit.out"
RC=${PIPESTATUS[0]}
set -e
END=$(date +%s)
JOB=$(head -n 1 "$STATE/quickstart-submit.out")

echo
echo "quickstart: submit --wait exited $RC after $((END - START)) s"
if [ -n "$JOB" ]; then
  # Where the step time went and what limits it (data, compute, comm, a
  # straggling rank): what the system measured, with the fix.
  echo "quickstart: dgca diagnose $JOB"
  "$DGCA" diagnose "$JOB" || true
  echo
fi
if [ "$RC" = 0 ] && [ -n "$JOB" ]; then
  # Use the model: export the job's best checkpoint as a Hugging Face BERT
  # directory plus the DGCA heads, then correct two sentences with errors
  # from the test set the job evaluated on (each side of a line is its
  # characters, space-separated; at most 28 fit max_seq_len 64).
  MODEL="$STATE/model"
  echo "quickstart: dgca export $JOB --out $MODEL"
  if "$DGCA" export "$JOB" --out "$MODEL"; then
    PAIRS=$(awk -F'\t' '$1 != $2 && split($1, c, " ") <= 28 { print; if (++n == 2) exit }' "$STATE/data/test.txt")
    SRC1=$(printf '%s\n' "$PAIRS" | sed -n 1p | cut -f1 | tr -d ' ')
    SRC2=$(printf '%s\n' "$PAIRS" | sed -n 2p | cut -f1 | tr -d ' ')
    echo
    echo "quickstart: dgca correct --model $MODEL \"$SRC1\" \"$SRC2\""
    if "$DGCA" correct --model "$MODEL" "$SRC1" "$SRC2"; then
      echo "  (the test set's answers: $(printf '%s\n' "$PAIRS" | cut -f2 | tr -d ' ' | paste -sd ' '))"
    else
      RC=1
    fi
  else
    RC=1
  fi
  echo
fi
if [ -n "$METRICS_ADDR" ]; then
  echo "quickstart: Prometheus metrics at http://$METRICS_ADDR/metrics"
fi
echo "quickstart: the coordinator keeps running (pid $COORD_PID) for you to explore:"
echo "    export DGCA_COORDINATOR=$ADDR DGCA_TOKEN_FILE=$STATE/token"
echo "    $DGCA list; $DGCA status ${JOB:-JOB}; $DGCA diagnose ${JOB:-JOB}; $DGCA logs ${JOB:-JOB} --rank 1"
echo "    $DGCA correct --model $STATE/model \"SENTENCE\"   # the trained model, on the CPU"
echo "  stop it with: tools/quickstart.sh stop   (or: kill $COORD_PID)"
exit $RC
