#!/usr/bin/env bash
# Checks the deploy files: Prometheus config and rules (promtool), the compose
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
[ $fail -eq 0 ] && say "ok"
exit $fail
