#!/usr/bin/env bash
# Checks the deploy files: Prometheus config, rules and alert tests
# (promtool), the systemd units (systemd-analyze, their flags), `cmake
# --install`, the compose
# file (docker-compose config; no Docker engine runs here, so containers are
# never started), and that each Dockerfile builds the programs `make` builds
# and copies them from where the build puts them.
# Usage: check_deploy.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1
build=$2
fail=0
say() { echo "check_deploy: $*"; }

# `check config` also checks the rule files the config names, resolved
# against the config's directory (as Prometheus does; in docker-compose both
# files are mounted into /etc/prometheus). A rule_files entry is a glob, and
# a glob that matches nothing passes silently, so require that the config
# check actually reached rules.yml.
config_out=$(promtool check config "$src/deploy/prometheus/prometheus.yml" 2>&1) || {
  echo "$config_out"; say "FAIL promtool check config"; exit 1; }
echo "$config_out"
rules_path=$(cd "$src/deploy/prometheus" && pwd)/rules.yml
if ! grep -qF "Checking $rules_path" <<<"$config_out" &&
   ! grep -qF "Checking $src/deploy/prometheus/rules.yml" <<<"$config_out"; then
  say "FAIL prometheus.yml's rule_files does not resolve to $rules_path"; fail=1
fi
promtool check rules "$src/deploy/prometheus/rules.yml"
# The alerts' unit tests: each fires when and where it should, and not on
# the series beside it that should not.
promtool test rules "$src/tests/deploy/rules_test.yml" || { say "FAIL promtool test rules"; fail=1; }

if command -v docker-compose >/dev/null; then
  (cd "$src" && docker-compose -f docker-compose.yml config -q) && say "docker-compose config: ok"
else
  say "SKIP docker-compose config: docker-compose not installed (apt-get install docker-compose)"
fi

# Programs the project builds: every add_executable outside model/tools and
# tests, less the CUDA-emulator builds (*-emu: test programs, never deployed).
programs=$(grep -ho 'add_executable(dgca[a-z-]*' "$src"/coordinator/CMakeLists.txt \
  "$src"/worker/CMakeLists.txt "$src"/cli/CMakeLists.txt | sed 's/add_executable(//' \
  | grep -v -- '-emu$' | sort -u)
say "programs built by make: $(echo $programs)"
for df in "$src"/deploy/docker/*.Dockerfile; do
  built=$(grep -o 'tools/build.sh .*' "$df" | head -1 | sed 's#tools/build.sh ##' | tr ' ' '\n' | sort -u)
  if [ "$(echo $built)" != "$(echo $programs)" ]; then
    say "FAIL $df builds [$(echo $built)], make builds [$(echo $programs)]"; fail=1
  fi
  # Every binary a runtime stage copies must be where the build writes it.
  for p in $(grep -o '/src/build/[^ ]*' "$df"); do
    rel=${p#/src/build/}
    if [ ! -x "$build/$rel" ]; then say "FAIL $df copies build/$rel, which the build does not produce"; fail=1; fi
  done
done
# `cmake --install` into a temporary prefix: the programs, the units (their
# /usr/local/bin rewritten to PREFIX/bin) and the sysusers.d entry.
inst=$(mktemp -d)
trap 'rm -rf "$inst" "$inst.log"' EXIT
if cmake --install "$build" --prefix "$inst" > "$inst.log" 2>&1; then
  for f in bin/dgca-coordinator bin/dgca-worker bin/dgca lib/systemd/system/dgca-coordinator.service \
           lib/systemd/system/dgca-agent.service lib/sysusers.d/dgca.conf; do
    [ -e "$inst/$f" ] || { say "FAIL cmake --install did not install $f"; fail=1; }
  done
  if grep -q '/usr/local/bin' "$inst"/lib/systemd/system/*.service; then
    say "FAIL installed units still name /usr/local/bin under prefix $inst"; fail=1
  fi
  say "cmake --install: programs, units and the sysusers.d entry in place"
else
  cat "$inst.log"; say "FAIL cmake --install"; fail=1
fi

# The installed units: `systemd-analyze verify` (it reports unknown keys,
# bad values and a missing program, some only as warnings: any output
# fails), then each unit's ExecStart run for 3 s with its state paths moved
# into the temp dir: a program still running then has accepted every flag
# (a wrong flag is exit 2 at once).
if ! command -v systemd-analyze >/dev/null; then
  say "SKIP systemd units: systemd-analyze not installed (apt-get install systemd)"
elif [ -e "$inst/lib/systemd/system/dgca-coordinator.service" ]; then
  echo "check-token" > "$inst/agent-token"
  for unit in "$inst"/lib/systemd/system/*.service; do
    name=$(basename "$unit")
    rc=0
    out=$(cd "$inst" && systemd-analyze verify "$unit" 2>&1) || rc=$?
    if [ $rc -ne 0 ] || [ -n "$out" ]; then
      echo "$out"; say "FAIL systemd-analyze verify $name (exit $rc)"; fail=1
    else
      say "systemd-analyze verify $name: ok"
    fi
    exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
    cmd=$(sed -e "s#\${DGCA_COORDINATOR}#127.0.0.1:1#g" -e "s#%d/agent-token#$inst/agent-token#g" \
              -e "s#/var/lib/dgca-agent#$inst/agent-state#g" -e "s#/var/lib/dgca#$inst/state#g" \
              -e "s#\(--listen\|--metrics-listen\) [0-9.]*:[0-9]*#\1 127.0.0.1:0#g" <<<"$exec_start")
    if grep -q '[$%]' <<<"$cmd"; then
      say "FAIL $name: ExecStart has a variable or specifier this check does not know: $cmd"; fail=1
      continue
    fi
    rc=0
    # shellcheck disable=SC2086  # the unit's command line, split as systemd splits it (no quotes in it)
    (cd "$inst" && exec timeout -k 10 3 $cmd) > "$inst/run.log" 2>&1 || rc=$?
    if [ $rc -eq 124 ]; then
      say "$name: ExecStart ran 3 s (flags accepted)"
    else
      cat "$inst/run.log"; say "FAIL $name: ExecStart exited $rc within 3 s: $cmd"; fail=1
    fi
  done
fi

[ $fail -eq 0 ] && say "ok"
exit $fail
