# shellcheck shell=bash
# Sourced by bench/gpu/run.sh and curve.sh: run each step of a device call
# under a time limit within the call's budget, with one status line each,
# so a call cut short still says how far it got.
#   DEADLINE=$(( $(date +%s) + BUDGET )); exec 3>&1; source bench/gpu/step.sh
# step NAME CAP CMD...: CMD under `timeout` of CAP seconds or what is left
# until DEADLINE, whichever is less; prints "[NAME_OF_SCRIPT] NAME: exit RC
# after Ns (limit Ts)" on fd 3 (the call's output, even where the step's
# stdout is redirected). Returns CMD's exit status: 124 when it ran out of
# time, 125 when skipped for lack of time (under 10 s left).
step() {
  local name=$1 cap=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  local t=$(( cap < left ? cap : left ))
  local who
  who=$(basename "$0")
  if [ "$t" -lt 10 ]; then
    echo "[$who] $name: SKIPPED, ${left}s of the budget left" >&3
    return 125
  fi
  local s0 rc
  s0=$(date +%s)
  timeout --kill-after=10 "$t" "$@"
  rc=$?
  echo "[$who] $name: exit $rc after $(( $(date +%s) - s0 ))s (limit ${t}s)$([ $rc = 124 ] && echo ', TIMED OUT')" >&3
  return $rc
}
